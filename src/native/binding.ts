/**
 * The one typed description of what the C++ addon exports (native/src/binding/addon.cc).
 * Everything above this file talks to the addon through these types only, so tests can
 * inject a fake that satisfies the same interface.
 *
 * Conventions:
 * - Byte offsets and lengths are plain numbers (volumes up to 2^53 bytes).
 * - Every method that touches a disk or socket returns a Promise and runs on a native
 *   thread; the JS thread only validates and marshals (invariant 6).
 * - Rejections are `Error`s with `code` (a MooringErrorCode string, see src/errors.ts),
 *   optional `errno` (the OS errno) and a message naming the object concerned.
 * - Buffers handed to `write` are pinned by the native side until the promise settles.
 */

/** Replica mode as the engine sees it. */
export type NativeReplicaMode = 'RW' | 'WO' | 'ERR';

export interface NativeReplicaState {
  id: string;
  mode: NativeReplicaMode;
  epoch: number;
  allocatedBytes: number;
  /** Negative errno of the failure that made it ERR, else 0. */
  lastError: number;
}

/** One layer of a replica's chain: a snapshot, or the head (the writable top). */
export interface NativeLayerInfo {
  /** Stable layer id, never reused. */
  id: string;
  /** Layer file name inside the replica directory. */
  file: string;
  /** Parent layer id, '' for the bottom layer. */
  parent: string;
  /** Snapshot name, '' for the head. */
  name: string;
  /** Whether this is the writable head. */
  head: boolean;
  /** Deleted by the user but kept because the head depends on it. */
  removed: boolean;
  /** Created by a user (false: taken by Mooring itself). */
  userCreated: boolean;
  /** Creation time, ms since the epoch. */
  createdMs: number;
  /** User labels. */
  labels: Record<string, string>;
  /** Volume size when the layer was created. */
  sizeBytes: number;
  /** Real disk usage of the layer file. */
  allocatedBytes: number;
}

/** NBD base:allocation flags: 1 = hole, 2 = reads as zero. */
export interface NativeExtent {
  length: number;
  flags: number;
}

/** Progress figures carried by every rebuild event. */
export interface NativeRebuildFigures {
  replicaId: string;
  /** Data bytes written to the target so far. */
  sentBytes: number;
  /** Allocated bytes compared so far (source and target, per layer). */
  scannedBytes: number;
  /** Allocated bytes to compare in all. */
  totalBytes: number;
}

export type NativeEngineEvent =
  | { type: 'replica-error'; replicaId: string; errno: number; message: string }
  | { type: 'epoch-claimed'; epoch: number }
  | { type: 'reconciled'; bytes: number; message: string }
  | ({ type: 'rebuild-started' } & NativeRebuildFigures)
  | ({ type: 'rebuild-progress' } & NativeRebuildFigures)
  | ({ type: 'rebuild-completed' } & NativeRebuildFigures)
  | ({ type: 'rebuild-failed'; errno: number; message: string } & NativeRebuildFigures);

/** Mutual TLS material, PEM text. Enabled when all three are given. */
export interface NativeTlsOptions {
  /** Our certificate (chain). */
  cert: string;
  /** Our private key. */
  key: string;
  /** CA certificate(s) the peer's certificate must chain to. */
  ca: string;
  /** Client side: the name the server's certificate must carry ('' = CA check only). */
  serverName?: string;
}

/** A replica on another host, served by a replica server. */
export interface NativeRemoteReplica {
  /** Replica server host (IP literal or name). */
  host: string;
  port: number;
  /** Replica name on that server ([A-Za-z0-9._-]{1,63}). */
  name: string;
  tls?: NativeTlsOptions;
  /** Engine-to-replica I/O timeout (default 8000 ms). */
  ioTimeoutMs?: number;
}

/** How an engine reaches a replica: a local replica directory, or a remote replica. */
export type NativeReplicaEndpoint = string | NativeRemoteReplica;

export interface NativeRebuildResult {
  scannedBytes: number;
  sentBytes: number;
  unmappedBytes: number;
  durationMs: number;
}

export interface NativeReplicaServerOptions {
  /** Directory whose subdirectories are the replicas served, by name. */
  root: string;
  /** Address to listen on (default 127.0.0.1). */
  host?: string;
  /** Port (default 0: any free port). */
  port?: number;
  /** Mutual TLS: clients must present a certificate signed by `ca`. */
  tls?: NativeTlsOptions;
  /** Simultaneous connections (default 256). */
  maxConnections?: number;
}

export interface NativeReplicaServerStats {
  connectionsTotal: number;
  connectionsOpen: number;
  requests: number;
  /** Requests refused because they carried an older writer epoch. */
  staleEpochRefusals: number;
  protocolErrors: number;
  bytesRead: number;
  bytesWritten: number;
}

export interface NativeReplicaServer {
  /** Bound TCP port. */
  readonly port: number;
  stats(): NativeReplicaServerStats;
  /** Stop accepting, close connections, release the replicas it opened. Idempotent. */
  close(): Promise<void>;
}

/** A replica's metadata, read without opening it for I/O. */
export interface NativeReplicaInfo {
  sizeBytes: number;
  epoch: number;
  clean: boolean;
  rebuilding: boolean;
  allocatedBytes: number;
  /** Handles open on it in this process (engines, replica server connections). */
  users: number;
}

export interface NativeEngineOptions {
  /** The replicas: directories (local) or remote replicas. A remote replica that cannot be reached opens as ERR. */
  replicas: NativeReplicaEndpoint[];
  /** Receives engine events in batches, on the JS thread. */
  onEvents?: (events: NativeEngineEvent[]) => void;
}

export interface NativeNbdOptions {
  /** Unix socket path; exclusive with tcpHost/tcpPort. */
  unixPath?: string;
  tcpHost?: string;
  tcpPort?: number;
  /** Export name clients ask for; '' (default) is the default export. */
  exportName?: string;
  /** Free text shown by `nbdinfo`. */
  description?: string;
  /** Serve read-only (writes, trims and zeroes are refused with EPERM). */
  readOnly?: boolean;
  /** Largest request accepted and advertised as the maximum block size (default 32 MiB). */
  maxRequestBytes?: number;
  /** Worker threads serving requests (default 4). */
  ioThreads?: number;
  /** Simultaneous client connections (default 64). */
  maxConnections?: number;
}

export interface NativeNbdStats {
  connectionsTotal: number;
  connectionsOpen: number;
  requests: number;
  bytesRead: number;
  bytesWritten: number;
  protocolErrors: number;
}

export interface NativeNbdServer {
  /** Bound TCP port; 0 for a unix socket. */
  readonly port: number;
  stats(): NativeNbdStats;
  /** Stop accepting, drain in-flight requests, flush, close connections. Idempotent. */
  close(): Promise<void>;
}

export interface NativeWriteZeroesOptions {
  /** Storage may be released (default true). */
  mayTrim?: boolean;
  /** Fail with UNSUPPORTED rather than write zeros the slow way. */
  fastOnly?: boolean;
  /** Durable when the call resolves. */
  fua?: boolean;
}

export interface NativeEngine {
  readonly sizeBytes: number;
  epoch(): number;
  replicas(): NativeReplicaState[];
  read(offset: number, length: number): Promise<Buffer>;
  write(offset: number, data: Uint8Array, fua?: boolean): Promise<void>;
  flush(): Promise<void>;
  trim(offset: number, length: number): Promise<void>;
  writeZeroes(offset: number, length: number, options?: NativeWriteZeroesOptions): Promise<void>;
  blockStatus(offset: number, length: number): Promise<NativeExtent[]>;
  snapshot(name: string, labels: Record<string, string>, userCreated: boolean): Promise<void>;
  listSnapshots(): Promise<NativeLayerInfo[]>;
  deleteSnapshot(name: string): Promise<void>;
  revert(name: string): Promise<void>;
  /**
   * Rebuild: add a replica write-only, copy what it lacks, make it RW (see engine.h
   * AddReplica). Progress arrives as rebuild-* events. Resolves when it is RW.
   */
  addReplica(endpoint: NativeReplicaEndpoint): Promise<NativeRebuildResult>;
  /** Remove a replica that is not RW (aborting its rebuild if WO) and close it. */
  removeReplica(id: string): Promise<void>;
  /** Serve this engine over NBD. The engine must stay open while the server runs. */
  exportNbd(options: NativeNbdOptions): Promise<NativeNbdServer>;
  /** Drain, flush, mark replicas clean, close. Idempotent. Close NBD servers first. */
  close(): Promise<void>;
}

/**
 * A single replica opened directly, without an engine: for inspection, verification
 * (are all replicas identical?), and, later, the replica server. Holds the replica's
 * directory lock, so it cannot be open in an engine at the same time.
 */
export interface NativeReplica {
  readonly id: string;
  readonly sizeBytes: number;
  epoch(): number;
  clean(): boolean;
  claimEpoch(epoch: number): Promise<void>;
  read(offset: number, length: number): Promise<Buffer>;
  /** Write as the writer of `epoch`; rejects with STALE_EPOCH if older than epoch(). */
  write(epoch: number, offset: number, data: Uint8Array): Promise<void>;
  flush(): Promise<void>;
  blockStatus(offset: number, length: number): Promise<NativeExtent[]>;
  listLayers(): Promise<NativeLayerInfo[]>;
  /** Allocated [offset, length] ranges of one layer. */
  layerExtents(layerId: string): Promise<Array<[number, number]>>;
  allocatedBytes(): Promise<number>;
  close(): Promise<void>;
}

export interface NativeAddon {
  /** Addon build version (package version it was built for). */
  readonly version: string;
  /** Create an empty replica directory of the given size. */
  createReplica(dir: string, sizeBytes: number): Promise<void>;
  /** Open an engine over local replicas; claims a new epoch, reconciles if needed. */
  openEngine(options: NativeEngineOptions): Promise<NativeEngine>;
  /** Open one replica directly (see NativeReplica). */
  openReplica(dir: string): Promise<NativeReplica>;
  /** Read a replica's metadata (works while it is open in an engine or served). */
  inspectReplica(dir: string): Promise<NativeReplicaInfo>;
  /** Serve the replicas under `root` to engines on other hosts (replica protocol). */
  startReplicaServer(options: NativeReplicaServerOptions): Promise<NativeReplicaServer>;
}
