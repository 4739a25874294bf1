// Host-to-host addresses of the data engine (`tcp:HOST:PORT`) and the loopback rule: with
// no TLS, a data engine talks over loopback only unless the embedder says otherwise.
import { isIP } from 'node:net';

import { MooringError } from '../errors.js';
import { parseNbdAddress } from '../nbd/nbd-address.js';
import { describe } from '../util/validate.js';

/** Largest PEM bundle accepted for a certificate, key or CA (the native side's limit too). */
export const TLS_PEM_BYTES_MAX = 64 * 1024;

/** Mutual TLS material of a data engine, PEM text. */
export interface DataEngineTlsOptions {
  /** This host's certificate (chain). */
  cert: string;
  /** Its private key. */
  key: string;
  /** CA certificate(s) that peers' certificates must chain to. */
  ca: string;
}

/** A TCP address split into host and port. */
export interface TcpAddress {
  host: string;
  port: number;
}

/**
 * Parses `tcp:HOST:PORT` (IPv6 as `tcp:[::1]:PORT`).
 *
 * @param what - names the value in errors
 * @param portZeroOk - whether port 0 (ephemeral, for listening) is allowed
 * @throws MooringError INVALID_ARGUMENT
 */
export function parseTcpAddress(text: unknown, what: string, portZeroOk: boolean): TcpAddress {
  if (typeof text !== 'string' || !text.startsWith('tcp:')) {
    throw new MooringError('INVALID_ARGUMENT', `${what} must be tcp:HOST:PORT (got ${describe(text)})`);
  }
  const a = parseNbdAddress(text);
  if (a.kind !== 'tcp') throw new MooringError('INVALID_ARGUMENT', `${what} must be tcp:HOST:PORT (got ${describe(text)})`);
  if (a.port === 0 && !portZeroOk) throw new MooringError('INVALID_ARGUMENT', `${what} needs a port in 1..65535 (got ${describe(text)})`);
  return { host: a.host, port: a.port };
}

/** `tcp:HOST:PORT` with IPv6 hosts in brackets. */
export function formatTcpAddress(a: TcpAddress): string {
  return `tcp:${isIP(a.host) === 6 ? `[${a.host}]` : a.host}:${a.port}`;
}

/** Whether `host` is a loopback address or `localhost`. */
export function isLoopbackHost(host: string): boolean {
  if (host === 'localhost' || host === '::1') return true;
  return isIP(host) === 4 && host.startsWith('127.');
}

/**
 * Refuses to listen beyond loopback without TLS unless explicitly allowed: traffic between
 * hosts carries volume data and engine control, so it is either authenticated (mutual TLS)
 * or a deliberate choice.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function checkLoopbackRule(what: string, host: string, tls: boolean, allowInsecureRemote: boolean): void {
  if (tls || allowInsecureRemote || isLoopbackHost(host)) return;
  throw new MooringError(
    'INVALID_ARGUMENT',
    `${what} ${host} is not a loopback address: without TLS a data engine binds loopback only. ` +
      'Give tls {cert, key, ca} (--tls-cert/--tls-key/--tls-ca), or allowInsecureRemote (--allow-insecure-remote) on a trusted network',
    { details: { host } },
  );
}

/** Checks TLS material: three non-empty PEM strings of bounded size, or undefined. */
export function checkTls(value: unknown, what = 'tls'): DataEngineTlsOptions | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object') throw new MooringError('INVALID_ARGUMENT', `${what} must be {cert, key, ca} (got ${describe(value)})`);
  const t = value as Partial<DataEngineTlsOptions>;
  for (const k of ['cert', 'key', 'ca'] as const) {
    const v = t[k];
    if (typeof v !== 'string' || v.length === 0 || Buffer.byteLength(v) > TLS_PEM_BYTES_MAX || !v.includes('-----BEGIN ')) {
      throw new MooringError('INVALID_ARGUMENT', `${what}.${k} must be PEM text of at most ${TLS_PEM_BYTES_MAX} bytes`);
    }
  }
  return { cert: t.cert!, key: t.key!, ca: t.ca! };
}
