// How EtcdStateStore reaches etcd: its options checked, the etcd3 client built from them
// (loaded only when an etcd store is opened), the key layout, and etcd3's errors turned into
// MooringError codes.
import type { Etcd3, IOptions } from 'etcd3';

import { MooringError, type MooringErrorCode } from '../errors.js';
import { checkIntIn, describe } from '../util/validate.js';

/** Default {@link EtcdStateStoreOptions.prefix}. */
export const ETCD_PREFIX_DEFAULT = '/mooring/';
/** Default {@link EtcdStateStoreOptions.timeoutMs}. */
export const ETCD_TIMEOUT_MS_DEFAULT = 5_000;
/** Largest {@link EtcdStateStoreOptions.timeoutMs}. */
export const ETCD_TIMEOUT_MS_MAX = 600_000;
// Longest key prefix accepted (etcd keys are bytes; ours stay short and printable).
const PREFIX_LENGTH_MAX = 256;
// Largest gRPC message read from etcd: a page of a list (ETCD_LIST_PAGE documents of at
// most 1 MiB each, plus their keys).
export const ETCD_LIST_PAGE = 16;
const RECEIVE_BYTES_MAX = (ETCD_LIST_PAGE + 2) * 1024 * 1024;

/** TLS towards etcd (PEM text or bytes). */
export interface EtcdTlsOptions {
  /** CA certificate(s) that signed etcd's server certificates. */
  ca: string | Buffer;
  /** Client certificate, when etcd asks for one (`--client-cert-auth`); with `key`. */
  cert?: string | Buffer;
  /** Private key of `cert`. */
  key?: string | Buffer;
}

/** etcd user and password (etcd's `auth enable`). */
export interface EtcdAuthOptions {
  /** The etcd user; it needs read-write on the store's prefix. */
  username: string;
  /** Its password. */
  password: string;
}

/** Options of {@link EtcdStateStore.open}. */
export interface EtcdStateStoreOptions {
  /**
   * etcd client URLs of the cluster's members: `http://host:port` (or `https://` with
   * `tls`), or `host:port`. Calls go to any member that answers.
   */
  endpoints: string[];
  /** Every key the store writes starts with this (default `/mooring/`): `PREFIX<kind>/<key>`. */
  prefix?: string;
  /** Connect with TLS: the CA to trust, and a client certificate when etcd requires one. */
  tls?: EtcdTlsOptions;
  /** etcd user and password (etcd's `auth enable`); the user needs read-write on the prefix. */
  auth?: EtcdAuthOptions;
  /**
   * How long one store call may take, retries while no member answers included
   * (default 5000 ms, at most 600000); past it the call rejects with UNAVAILABLE.
   */
  timeoutMs?: number;
}

/** Options of an EtcdStateStore, checked and filled in. */
export interface EtcdSettings {
  endpoints: string[];
  prefix: string;
  timeoutMs: number;
  clientOptions: IOptions;
}

const ENDPOINT_PATTERN = /^(?:(https?):\/\/)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]{1,253}):(\d{1,5})\/?$/;

function pem(what: string, value: unknown): Buffer {
  if (Buffer.isBuffer(value)) return value;
  if (typeof value === 'string' && value.length > 0) return Buffer.from(value);
  throw new MooringError('INVALID_ARGUMENT', `etcd ${what} must be PEM text or a Buffer (got ${describe(value)})`);
}

// A policy that runs the call once: the store retries itself, within its own timeout.
const once = {
  execute: <T>(fn: (context: { signal: AbortSignal }) => T | Promise<T>): Promise<T> => Promise.resolve().then(() => fn({ signal: new AbortController().signal })),
};

// How long the client waits before reconnecting a broken watch stream: 100 ms, doubling up to
// 2 s (etcd3's default grows to 30 s, a long blind spot after etcd restarts).
class WatchBackoff {
  constructor(readonly duration: number) {}
  next(): WatchBackoff {
    return new WatchBackoff(Math.min(Math.max(this.duration * 2, 100), 2_000));
  }
}

/**
 * Checks the options of EtcdStateStore.open.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function etcdSettings(options: EtcdStateStoreOptions): EtcdSettings {
  if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `etcd store options must be an object (got ${describe(options)})`);
  const { endpoints, tls, auth } = options;
  if (!Array.isArray(endpoints) || endpoints.length === 0 || endpoints.length > 64) {
    throw new MooringError('INVALID_ARGUMENT', `etcd endpoints must be a list of 1 to 64 URLs (got ${describe(endpoints)})`);
  }
  const hosts = endpoints.map((e: unknown) => {
    const m = typeof e === 'string' ? ENDPOINT_PATTERN.exec(e) : null;
    if (!m || Number(m[3]) < 1 || Number(m[3]) > 65535) {
      throw new MooringError('INVALID_ARGUMENT', `etcd endpoint must be http(s)://host:port or host:port (got ${describe(e)})`);
    }
    if (m[1] === 'https' && tls === undefined) throw new MooringError('INVALID_ARGUMENT', `etcd endpoint ${e} is https: give the tls option (its CA)`);
    if (m[1] === 'http' && tls !== undefined) throw new MooringError('INVALID_ARGUMENT', `etcd endpoint ${e} is http but the tls option is given`);
    return `${m[2]}:${m[3]}`;
  });
  const prefix = options.prefix ?? ETCD_PREFIX_DEFAULT;
  if (typeof prefix !== 'string' || prefix.length === 0 || prefix.length > PREFIX_LENGTH_MAX || !/^[\x21-\x7e]+$/.test(prefix)) {
    throw new MooringError('INVALID_ARGUMENT', `etcd prefix must be 1 to ${PREFIX_LENGTH_MAX} printable ASCII characters without spaces (got ${describe(prefix)})`);
  }
  const timeoutMs = checkIntIn('etcd timeoutMs', options.timeoutMs, 100, ETCD_TIMEOUT_MS_MAX, ETCD_TIMEOUT_MS_DEFAULT);
  const clientOptions: IOptions = {
    hosts,
    dialTimeout: timeoutMs,
    faultHandling: { host: () => once as never, global: once as never, watchBackoff: new WatchBackoff(50) as never },
    grpcOptions: {
      'grpc.max_receive_message_length': RECEIVE_BYTES_MAX,
      // Reconnect soon after etcd comes back (grpc's default backoff grows to two minutes).
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': 1_000,
      // Notice a member that vanished without closing the connection (etcd's default
      // minimum ping interval is 5 s).
      'grpc.keepalive_time_ms': 10_000,
      'grpc.keepalive_timeout_ms': 5_000,
    },
  };
  if (tls !== undefined) {
    if (typeof tls !== 'object' || tls === null) throw new MooringError('INVALID_ARGUMENT', `etcd tls must be an object (got ${describe(tls)})`);
    if ((tls.cert === undefined) !== (tls.key === undefined)) throw new MooringError('INVALID_ARGUMENT', 'etcd tls: give cert and key together');
    clientOptions.credentials = {
      rootCertificate: pem('tls.ca', tls.ca),
      ...(tls.cert === undefined ? {} : { certChain: pem('tls.cert', tls.cert), privateKey: pem('tls.key', tls.key) }),
    };
  }
  if (auth !== undefined) {
    if (typeof auth !== 'object' || auth === null || typeof auth.username !== 'string' || auth.username.length === 0 || typeof auth.password !== 'string') {
      throw new MooringError('INVALID_ARGUMENT', 'etcd auth must be { username, password } with a non-empty username');
    }
    clientOptions.auth = { username: auth.username, password: auth.password, callOptions: () => ({ deadline: Date.now() + timeoutMs }) };
  }
  return { endpoints: endpoints as string[], prefix, timeoutMs, clientOptions };
}

/** The etcd3 module, loaded on first use (embedders on the file store never load it). */
export type Etcd3Module = typeof import('etcd3');

let loaded: Promise<Etcd3Module> | undefined;
/** Loads etcd3 once. */
export function loadEtcd3(): Promise<Etcd3Module> {
  loaded ??= import('etcd3');
  return loaded;
}

/** A new client (it connects on first call). */
export function newClient(mod: Etcd3Module, settings: EtcdSettings): Etcd3 {
  return new mod.Etcd3(settings.clientOptions);
}

/** The first key after every key that starts with `prefix` (etcd's range end of a prefix). */
export function prefixEnd(prefix: Buffer): Buffer {
  const end = Buffer.from(prefix);
  for (let i = end.length - 1; i >= 0; i--) {
    if (end[i]! < 0xff) {
      end[i]! += 1;
      return end.subarray(0, i + 1);
    }
  }
  return Buffer.from([0]);
}

/** Whether a failed call may be sent again: no member was reachable (the request was not taken). */
export function isRetryable(mod: Etcd3Module, err: unknown): boolean {
  return err instanceof mod.GRPCUnavailableError;
}

/** An etcd3 error as a MooringError whose message names `what` and the endpoints. */
export function etcdError(mod: Etcd3Module, err: unknown, what: string, settings: EtcdSettings, write: boolean): MooringError {
  if (err instanceof MooringError) return err;
  const message = (err as Error)?.message ?? String(err);
  let code: MooringErrorCode = 'PROTOCOL_ERROR';
  let hint = '';
  if (err instanceof mod.ClientClosedError) code = 'CLOSED';
  else if (err instanceof mod.GRPCUnavailableError || err instanceof mod.GRPCDeadlineExceededError || err instanceof mod.GRPCCancelledError) {
    code = 'UNAVAILABLE';
    hint = ` (no answer within ${settings.timeoutMs} ms${write ? '; the write may or may not have happened: read it back' : ''})`;
  } else if (err instanceof mod.EtcdAuthenticationFailedError || err instanceof mod.EtcdInvalidAuthTokenError || err instanceof mod.GRPCUnauthenticatedError) {
    code = 'UNAUTHENTICATED';
  } else if (err instanceof mod.EtcdPermissionDeniedError) {
    code = 'PERMISSION_DENIED';
  } else if (err instanceof mod.GRPCResourceExhastedError) {
    code = /space exceeded/i.test(message) ? 'NO_SPACE' : 'INVALID_STATE';
  } else if (/authentication|auth token|user name/i.test(message)) {
    code = 'UNAUTHENTICATED';
  }
  return new MooringError(code, `${what} on etcd ${settings.endpoints.join(',')}: ${message}${hint}`, {
    cause: err,
    details: { endpoints: settings.endpoints },
  });
}
