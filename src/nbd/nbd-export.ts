/**
 * NbdExport: one NBD server serving an {@link Engine} (created by `Engine.exportNbd` or
 * `Volume.export`).
 */
import { EventEmitter } from 'node:events';
import { chmod, chown } from 'node:fs/promises';
import type * as TE from 'typed-emitter';

import { checkTls, type DataEngineTlsOptions } from '../data-engine/addresses.js';
import { MooringError, callNative, callNativeSync, toMooringError } from '../errors.js';
import type { NativeEngine, NativeNbdHandOffRecord, NativeNbdHandOffServer, NativeNbdIoStats, NativeNbdOptions, NativeNbdServer, NativeNbdStats } from '../native/binding.js';
import { safeEmit } from '../util/emit.js';
import { describe } from '../util/validate.js';
import { checkExportName, formatNbdAddress, nbdUri, parseNbdAddress, type NbdAddress } from './nbd-address.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** Bounds of the NBD server's tunables (request size, I/O threads, connections) of an engine's export. */
export const NBD_LIMITS = {
  /** Smallest `maxRequestBytes`. */
  maxRequestBytesMin: 4096,
  /** Largest `maxRequestBytes` (the native server's cap, 32 MiB). */
  maxRequestBytesMax: 32 * 1024 * 1024,
  /** Largest `ioThreads`. */
  ioThreadsMax: 64,
  /** Largest `maxConnections`. */
  maxConnectionsMax: 1024,
  /** Longest description. */
  descriptionLengthMax: 1024,
  /** Smallest `bufferBytesMax` (one largest request). */
  bufferBytesMaxMin: 32 * 1024 * 1024,
  /** Largest `bufferBytesMax` (16 GiB). */
  bufferBytesMaxMax: 16 * 1024 * 1024 * 1024,
  /** Largest `socketGroup` (a gid below (gid_t)-1). */
  groupIdMax: 0xfffffffe,
} as const;

/**
 * How to export a volume over NBD: where to listen, plus the native server's tunables
 * (bounded by {@link NBD_LIMITS}).
 */
export interface NbdExportOptions
  extends Pick<NativeNbdOptions, 'exportName' | 'description' | 'readOnly' | 'maxRequestBytes' | 'ioThreads' | 'maxConnections' | 'bufferBytesMax'> {
  /**
   * Where to listen: `unix:PATH`, `tcp:HOST:PORT` (PORT 0 = ephemeral) or a parsed
   * {@link NbdAddress}. `Volume.export` defaults to `unix:DIR/nbd.sock`.
   */
  nbd?: string | NbdAddress;
  /**
   * A unix socket is created mode 0600: only this process's user may connect. With a group
   * id here it is given to that group and made 0660, so QEMU running as another user of that
   * group (libvirt's `libvirt-qemu`, say) can connect. Ignored for TCP.
   */
  socketGroup?: number;
  /**
   * Mutual TLS (PEM text; the data engine's material fits): clients must negotiate
   * STARTTLS before anything else and present a certificate signed by `ca`, as QEMU does
   * with a `tls-creds-x509` object and nbdinfo with `nbds://...?tls-certificates=DIR`
   * (docs/nbd-frontend.md, "TLS"). Such an export is never handed to another process.
   */
  tls?: DataEngineTlsOptions;
}

/**
 * Counters of an NBD export since it started.
 *
 * @interface
 */
export type NbdExportStats = NativeNbdStats;

/** Events of an {@link NbdExport}. */
export type NbdExportEvents = {
  /** The export stopped: it no longer accepts clients and every request was answered. */
  closed: () => void;
  /** The export was detached for a hand-off: its engine no longer owns it (it may close). */
  detached: () => void;
};

function checkIntIn(name: string, value: unknown, min: number, max: number): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new MooringError('INVALID_ARGUMENT', `${name} must be an integer in ${min}..${max} (got ${describe(value)})`);
  }
  return value;
}

/**
 * Validates export options and converts them to the native form.
 *
 * @internal
 */
export function toNativeNbdOptions(
  options: NbdExportOptions,
  defaultAddress?: string,
): { address: NbdAddress; exportName: string; native: NativeNbdOptions; socketGroup: number | undefined } {
  if (typeof options !== 'object' || options === null) {
    throw new MooringError('INVALID_ARGUMENT', `export options must be an object (got ${describe(options)})`);
  }
  const spec = options.nbd ?? defaultAddress;
  if (spec === undefined) throw new MooringError('INVALID_ARGUMENT', 'an NBD address is required (unix:PATH or tcp:HOST:PORT)');
  const address = typeof spec === 'string' ? parseNbdAddress(spec) : parseNbdAddress(formatNbdAddress(spec));
  const exportName = checkExportName(options.exportName ?? '');
  if (options.description !== undefined && (typeof options.description !== 'string' || options.description.length > NBD_LIMITS.descriptionLengthMax)) {
    throw new MooringError('INVALID_ARGUMENT', `description must be a string of at most ${NBD_LIMITS.descriptionLengthMax} characters`);
  }
  if (options.readOnly !== undefined && typeof options.readOnly !== 'boolean') {
    throw new MooringError('INVALID_ARGUMENT', `readOnly must be a boolean (got ${describe(options.readOnly)})`);
  }
  const native: NativeNbdOptions = { exportName };
  if (address.kind === 'unix') native.unixPath = address.path;
  else {
    native.tcpHost = address.host;
    native.tcpPort = address.port;
  }
  if (options.description !== undefined) native.description = options.description;
  if (options.readOnly !== undefined) native.readOnly = options.readOnly;
  const maxRequestBytes = checkIntIn('maxRequestBytes', options.maxRequestBytes, NBD_LIMITS.maxRequestBytesMin, NBD_LIMITS.maxRequestBytesMax);
  if (maxRequestBytes !== undefined) native.maxRequestBytes = maxRequestBytes;
  const ioThreads = checkIntIn('ioThreads', options.ioThreads, 1, NBD_LIMITS.ioThreadsMax);
  if (ioThreads !== undefined) native.ioThreads = ioThreads;
  const maxConnections = checkIntIn('maxConnections', options.maxConnections, 1, NBD_LIMITS.maxConnectionsMax);
  if (maxConnections !== undefined) native.maxConnections = maxConnections;
  const bufferBytesMax = checkIntIn('bufferBytesMax', options.bufferBytesMax, NBD_LIMITS.bufferBytesMaxMin, NBD_LIMITS.bufferBytesMaxMax);
  if (bufferBytesMax !== undefined) native.bufferBytesMax = bufferBytesMax;
  const socketGroup = checkIntIn('socketGroup', options.socketGroup, 0, NBD_LIMITS.groupIdMax);
  const tls = checkTls(options.tls);
  if (tls) native.tls = tls;
  return { address, exportName, native, socketGroup };
}

/**
 * Gives an export's unix socket to group `gid` with mode 0660 (see
 * {@link NbdExportOptions.socketGroup}).
 *
 * @throws MooringError PERMISSION_DENIED (this process may not give the socket to that group), NOT_FOUND, IO_ERROR
 * @internal
 */
export async function shareSocketWithGroup(path: string, gid: number): Promise<void> {
  try {
    await chown(path, -1, gid);
    await chmod(path, 0o660);
  } catch (err) {
    // chown answers EPERM (not EACCES) for a group the process is not in.
    if ((err as { code?: string }).code === 'EPERM') {
      throw new MooringError('PERMISSION_DENIED', `giving NBD socket ${path} to group ${gid}: not permitted for this user`, { cause: err });
    }
    throw toMooringError(err, `giving NBD socket ${path} to group ${gid}`);
  }
}

/**
 * A running NBD export. Clients connect with {@link NbdExport.uri}. Close it with
 * {@link NbdExport.close}; closing its engine or volume closes it too.
 */
export class NbdExport extends (EventEmitter as new () => TypedEmitter<NbdExportEvents>) {
  /** Where the export listens; for TCP with port 0 this holds the bound port. */
  readonly address: NbdAddress;
  /** The export name ('' = default export). */
  readonly exportName: string;
  /** Whether the export is read-only. */
  readonly readOnly: boolean;
  /** Whether clients must use TLS. */
  readonly tls: boolean;
  readonly #server: NativeNbdServer;
  #closing: Promise<void> | undefined;
  #closed = false;
  #detached = false;

  /** @internal Created by `Engine.exportNbd`. */
  constructor(server: NativeNbdServer, requested: NbdAddress, exportName: string, readOnly: boolean, tls = false) {
    super();
    this.#server = server;
    this.address = requested.kind === 'tcp' && requested.port === 0 ? { ...requested, port: server.port } : requested;
    this.exportName = exportName;
    this.readOnly = readOnly;
    this.tls = tls;
  }

  /** The address in `unix:PATH` / `tcp:HOST:PORT` form. */
  get addressString(): string {
    return formatNbdAddress(this.address);
  }

  /** The NBD URI for clients: `nbd+unix:///?socket=PATH` or `nbd://HOST:PORT/` (`nbds`, `nbds+unix` with TLS). */
  get uri(): string {
    return nbdUri(this.address, this.exportName, this.tls);
  }

  /** Whether {@link NbdExport.close} has completed. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Connection and traffic counters. */
  stats(): NbdExportStats {
    if (this.#closed) throw new MooringError('CLOSED', `NBD export ${this.addressString} is closed`);
    return callNativeSync(() => this.#server.stats(), `NBD export ${this.addressString}`);
  }

  /**
   * Per request kind counts and latency buckets, and the export's memory budget (for
   * metrics), or null when the addon does not count them.
   */
  ioStats(): NativeNbdIoStats | null {
    if (this.#closed) throw new MooringError('CLOSED', `NBD export ${this.addressString} is closed`);
    const server = this.#server;
    if (typeof server.ioStats !== 'function') return null;
    return callNativeSync(() => server.ioStats!(), `NBD export ${this.addressString}`);
  }

  /** Ids of the open connections (a connection keeps its id across a hand-off). */
  connectionIds(): number[] {
    return callNativeSync(() => this.#handOffServer().connectionIds(), `NBD export ${this.addressString}`);
  }

  /**
   * Hand-off, step 1: stops accepting (new clients wait in the listen backlog) and brings
   * every connection to a request boundary with nothing in flight. BUSY if one does not
   * get there in `timeoutMs`; then it carries on as before. (docs/nbd-frontend.md,
   * "Hand-off of an export between processes".) `hold`: frozen, each connection still
   * answers the FLUSHes at the head of its stream, for an export whose engine stays open
   * (src/data-engine/export-hold.ts); never before a {@link detach}.
   *
   * @throws MooringError BUSY, INVALID_STATE, CLOSED, UNSUPPORTED (an addon without hand-off)
   */
  freeze(timeoutMs: number, options: { hold?: boolean } = {}): Promise<void> {
    return callNative(() => this.#handOffServer().freeze(timeoutMs, options.hold === true), `freezing NBD export ${this.addressString}`);
  }

  /**
   * Hand-off, step 2 (frozen only): the record another engine (in this process or, sent
   * over a hand-off channel, in another) adopts. This export stays frozen with its own
   * sockets and no longer belongs to its engine, which may now close; {@link unfreeze}
   * rolls back, {@link close} then only releases its sockets.
   *
   * @throws MooringError INVALID_STATE (not frozen), CLOSED
   */
  async detach(): Promise<NativeNbdHandOffRecord> {
    const record = await callNative(() => this.#handOffServer().detach(), `detaching NBD export ${this.addressString}`);
    this.#detached = true;
    safeEmit(this, 'detached');
    return record;
  }

  /**
   * Serves again where the freeze stopped: the start of an adopted export, or a rollback
   * (with `engine`, the engine that serves from now on, required once the old one was
   * closed: `LocalEngine.resumeExport` passes it).
   */
  unfreeze(engine?: NativeEngine): Promise<void> {
    return callNative(() => this.#handOffServer().unfreeze(engine), `unfreezing NBD export ${this.addressString}`);
  }

  /** Whether {@link detach} handed it over (its engine no longer owns it). */
  get detached(): boolean {
    return this.#detached;
  }

  #handOffServer(): NativeNbdHandOffServer {
    if (this.#closed) throw new MooringError('CLOSED', `NBD export ${this.addressString} is closed`);
    const s = this.#server as Partial<NativeNbdHandOffServer>;
    if (typeof s.freeze !== 'function') throw new MooringError('UNSUPPORTED', 'this addon cannot hand an NBD export over');
    return this.#server as NativeNbdHandOffServer;
  }

  /**
   * Stops accepting clients, answers every request already read, flushes the volume, closes
   * the connections and (unix) removes the socket file. Idempotent: later calls return the
   * same promise.
   */
  close(): Promise<void> {
    this.#closing ??= callNative(() => this.#server.close(), `closing NBD export ${this.addressString}`).finally(() => {
      this.#closed = true;
      safeEmit(this, 'closed');
    });
    return this.#closing;
  }
}
