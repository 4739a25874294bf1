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

import type { ReplicaServerStats } from './replica-server-stats.js';

/**
 * Replica mode as the engine sees it.
 *
 * @inline
 */
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
  /** A replica set was committed (docs/single-writer.md); `rwMembers` are member names. */
  | { type: 'replica-set-changed'; epoch: number; generation: number; rwMembers: string[] }
  | { type: 'reconciled'; bytes: number; message: string }
  | ({ type: 'rebuild-started' } & NativeRebuildFigures)
  | ({ type: 'rebuild-progress' } & NativeRebuildFigures)
  | ({ type: 'rebuild-completed' } & NativeRebuildFigures)
  | ({ type: 'rebuild-failed'; errno: number; message: string } & NativeRebuildFigures)
  /** exportSnapshot/copySnapshotTo: data bytes of the snapshot handled so far, of totalBytes (every 64 MiB). */
  | { type: 'snapshot-copy-progress'; snapshot: string; copiedBytes: number; totalBytes: number }
  /**
   * A salvage start (NativeEngineOptions.salvage) serves from replica `replicaId`, last RW in
   * `lastRw` (null: none recorded); `complete`: every acknowledged write is known to be on it.
   */
  | { type: 'salvaged'; replicaId: string; lastRw: { epoch: number; generation: number } | null; complete: boolean; message: string };

/**
 * Mutual TLS material, PEM text. Enabled when all three are given.
 *
 * @inline
 */
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

/**
 * A replica on another host, served by a replica server.
 *
 * @inline
 */
export interface NativeRemoteReplica {
  /** Replica server host (IP literal or name). */
  host: string;
  /** Replica server port. */
  port: number;
  /** Replica name on that server ([A-Za-z0-9._-]{1,63}). */
  name: string;
  /** Mutual TLS towards the replica server. */
  tls?: NativeTlsOptions;
  /**
   * The cluster secret (16 to 1024 bytes): authenticate with it before HELLO and require the
   * server to prove it too (docs/replica-protocol.md, "Authentication").
   */
  clusterSecret?: Uint8Array;
  /** Engine-to-replica I/O timeout (default 8000 ms). */
  ioTimeoutMs?: number;
}

/** How an engine reaches a replica: a local replica directory, or a remote replica. */
export type NativeReplicaEndpoint = string | NativeRemoteReplica;

/**
 * A ready backing image file on another data engine's replica server
 * ({@link NativeReplicaServerOptions.backingFilesRoot}), opened read-only with
 * {@link NativeAddon.openReplica}: `name` is the file's key `<name>-<uuid>`
 * ([A-Za-z0-9._-]{1,255}). Its `read` calls go over the replica protocol.
 *
 * @inline
 */
export interface NativeRemoteBackingFile extends Omit<NativeRemoteReplica, 'name'> {
  /** The backing image file's key on that server (`<name>-<uuid>`). */
  name: string;
  backingFile: true;
}

/**
 * What a rebuild did.
 *
 * @inline
 */
export interface NativeRebuildResult {
  /** Bytes walked: the union of what the source and the target hold allocated, layer by layer. */
  scannedBytes: number;
  /** Bytes written to the target (the blocks whose digests differed). */
  sentBytes: number;
  /** Bytes unmapped on the target: blocks it held that the source does not. */
  unmappedBytes: number;
  /** How long the rebuild took. */
  durationMs: number;
}

/**
 * What exportSnapshot/copySnapshotTo did.
 *
 * @inline
 */
export interface NativeSnapshotCopyResult {
  /** Volume size: the length of the image written. */
  sizeBytes: number;
  /** Bytes written as data (holes and blocks of zeros are not written). */
  copiedBytes: number;
  /** How long it took. */
  durationMs: number;
}

export interface NativeReplicaServerOptions {
  /** Directory whose subdirectories are the replicas served, by name. */
  root: string;
  /**
   * Also serve the ready backing image files under this directory (`<key>/image`),
   * read-only, to clients that ask for one ({@link NativeRemoteBackingFile}).
   */
  backingFilesRoot?: string;
  /** Address to listen on (default 127.0.0.1). */
  host?: string;
  /** Port (default 0: any free port). */
  port?: number;
  /** Mutual TLS: clients must present a certificate signed by `ca`. */
  tls?: NativeTlsOptions;
  /**
   * The cluster secret (16 to 1024 bytes): every client must prove it before HELLO, and the
   * server proves it back; without it clients are not authenticated.
   */
  clusterSecret?: Uint8Array;
  /** Simultaneous connections (default 256). */
  maxConnections?: number;
  /**
   * A peer's (IP address's) share of connections still before their HELLO reply (default
   * 64): on a full server, the oldest connection of a peer over its share is dropped for a
   * new one first (docs/hardening.md, "Connections").
   */
  handshakingPerPeerMax?: number;
  /**
   * Request and reply bytes held at once across all connections (default 256 MiB, 8 MiB to
   * 64 GiB): past it a connection's reader waits, unless it has nothing in flight.
   */
  bufferBytesMax?: number;
}

/** The replica server's counters (one definition with the public API's). */
export type NativeReplicaServerStats = ReplicaServerStats;

export interface NativeReplicaServer {
  /** Bound TCP port. */
  readonly port: number;
  stats(): NativeReplicaServerStats;
  /** Stop accepting, close connections, release the replicas it opened. Idempotent. */
  close(): Promise<void>;
  /**
   * Hands its clients over gracefully (docs/replica-protocol.md, "GOAWAY"): stops accepting
   * (the listening socket stays open until close(), connects wait in its backlog), sends
   * GOAWAY to every client that announced it and answers all it receives until that client
   * half-closes; other connections are closed as by close(). After `timeoutMs` (at most
   * 3600000) the connections still open are closed. Resolves once every connection has
   * closed and released its replica; the server accepts nothing more: close() it next.
   */
  goAway(timeoutMs: number): Promise<NativeReplicaServerGoAway>;
}

/** What NativeReplicaServer.goAway() did, by connection. */
export interface NativeReplicaServerGoAway {
  /** Sent GOAWAY; the client drained and half-closed within the timeout. */
  goaway: number;
  /** Sent GOAWAY; still open when the timeout passed, closed by the server. */
  timedOut: number;
  /** Clients that did not announce GOAWAY (older releases), closed as by close(). */
  closed: number;
}

/**
 * The backing image beneath a replica's chain: the file `DISK/backing-images/<dir>/image`,
 * DISK being the directory two levels above the replica's (docs/replica-format.md).
 */
export interface NativeReplicaBackingImage {
  /** [A-Za-z0-9._-]{1,127}, not `.` or `..`. */
  dir: string;
  /** Read with this format (never probed). */
  format: 'raw' | 'qcow2';
  /** The image's virtual size: a positive multiple of 512, at most the replica's size. */
  virtualSizeBytes: number;
}

/** Options of {@link NativeAddon.createReplica}. */
export interface NativeReplicaCreateOptions {
  /** Read this image beneath the new replica's bottom layer; it must open with that format and size. */
  backingImage?: NativeReplicaBackingImage;
}

/** A replica's metadata, read without opening it for I/O. */
export interface NativeReplicaInfo {
  sizeBytes: number;
  epoch: number;
  clean: boolean;
  rebuilding: boolean;
  allocatedBytes: number;
  /** The backing image its chain reads beneath the bottom layer, or null. */
  backingImage: NativeReplicaBackingImage | null;
  /** Handles open on it in this process (engines, replica server connections). */
  users: number;
}

export interface NativeEngineOptions {
  /** The replicas: directories (local) or remote replicas. A remote replica that cannot be reached opens as ERR. */
  replicas: NativeReplicaEndpoint[];
  /** Receives engine events in batches, on the JS thread. */
  onEvents?: (events: NativeEngineEvent[]) => void;
  /**
   * Open as a migration standby (default false): claims no epoch, changes no replica and
   * serves nothing (data-path calls reject with INVALID_STATE, errno EPERM) until activate().
   */
  standby?: boolean;
  /**
   * Salvage (docs/salvage.md; not with standby): the caller asserts that the volume's
   * replicas not given are gone for good. No majority of the latest replica set is needed
   * to start; with no claimed RW replica of it, the replica whose last RW set is newest
   * serves. A 'salvaged' event names the source and whether data may be missing.
   */
  salvage?: boolean;
  /**
   * The writer epoch to claim (required unless standby): allocated by the caller, unique to
   * this engine, above every epoch a replica promised (else STALE_EPOCH). docs/single-writer.md.
   */
  epoch?: number;
  /** The members' names (control-plane replica ids), one per replica, in the same order. */
  members?: string[];
  /** How long a request waits for a replica-set commit that lacks a majority (default 15000). */
  quorumHoldMs?: number;
}

/** What an engine hands to the next writer (deactivate() returns it, activate() takes it). */
export interface NativeHandOver {
  /** The writer epoch the deactivated engine held. */
  epoch: number;
  /** The generation of its last committed replica set. */
  generation: number;
  /** Native ids (directory, or host:port/name) of its RW replicas: identical and flushed. */
  rwReplicaIds: string[];
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
  /**
   * READ and WRITE data held at once across all connections (default 128 MiB): past it a
   * connection stops reading until its own requests are answered (one always goes through).
   */
  bufferBytesMax?: number;
  /**
   * Mutual TLS: clients must negotiate STARTTLS and present a certificate signed by `ca`
   * (`serverName` is not used). Such an export cannot be detached for a hand-off.
   */
  tls?: NativeTlsOptions;
}

/**
 * Counters of an NBD server since it started.
 *
 * @inline
 */
export interface NativeNbdStats {
  /** Client connections accepted. */
  connectionsTotal: number;
  /** Client connections open now. */
  connectionsOpen: number;
  /** Requests executed (every command after the handshake). */
  requests: number;
  /** Bytes sent to clients by reads. */
  bytesRead: number;
  /** Bytes received from clients by writes. */
  bytesWritten: number;
  /** Protocol violations and timeouts of clients (each ends or refuses what the client sent). */
  protocolErrors: number;
}

/** Requests of one kind on an NBD export (native/src/nbd/nbd-server.h, NbdOpStats). */
export interface NativeNbdOpStats {
  /** Requests executed (replied to, successfully or not). */
  count: number;
  /** Of which answered with an NBD error. */
  errors: number;
  /** Their device time in all, in nanoseconds: a worker taking the request to its reply being queued. */
  sumNs: number;
  /**
   * That time in log2 buckets, not cumulative: `buckets[i]` counts requests that took at most
   * 2^i microseconds and more than 2^(i-1) (i < length - 1); the last bucket holds the rest.
   */
  buckets: number[];
}

/** Per request kind counters and the memory budget of an NBD export, for metrics. */
export interface NativeNbdIoStats {
  /** Per request kind. */
  ops: {
    read: NativeNbdOpStats;
    write: NativeNbdOpStats;
    flush: NativeNbdOpStats;
    trim: NativeNbdOpStats;
    writeZeroes: NativeNbdOpStats;
    /** CACHE, BLOCK_STATUS and unknown commands. */
    other: NativeNbdOpStats;
  };
  /** The export's budget of READ/WRITE bytes in flight across its connections. */
  budgetLimitBytes: number;
  /** Bytes of it held now. */
  budgetUsedBytes: number;
  /** The most held at once since the export started. */
  budgetPeakBytes: number;
  /** Requests that had to wait for the budget (back-pressure). */
  budgetWaits: number;
  /**
   * READs the connection loop answered itself, without a worker: small, and all in the
   * page cache of a replica in this process (docs/architecture.md, "How a write travels").
   */
  inlineReads: number;
  /**
   * WRITEs the connection loop started itself, without a worker: small ones to an engine
   * whose replicas are all on other hosts, when nothing had to wait (docs/architecture.md,
   * "How a write travels").
   */
  loopWrites: number;
  /**
   * READs and WRITEs handed to the device in groups of two or more, so their frames to each
   * remote replica went out together (docs/architecture.md, "Requests sent together").
   */
  groupedRequests: number;
}

export interface NativeNbdServer {
  /** Bound TCP port; 0 for a unix socket. */
  readonly port: number;
  stats(): NativeNbdStats;
  /** Per request kind counters and the budget (absent from fakes and older addons). */
  ioStats?(): NativeNbdIoStats;
  /** Stop accepting, drain in-flight requests, flush, close connections. Idempotent. */
  close(): Promise<void>;
}

// ---------------------------------------------------------------------------------------
// Hand-off of an NBD export between two processes of one host (native/src/handoff,
// native/src/binding/handoff-wrap.h; docs/nbd-frontend.md "Hand-off of an export between
// processes"). The listening socket and every client connection move, with what each
// client negotiated; the clients stay connected. Optional on NativeAddon: fakes and addons
// built before it lack it. Rejections: BUSY (freeze timed out; nothing changed),
// INVALID_STATE (wrong server state, a record used twice), PROTOCOL_ERROR (a bad record or
// peer; the channel is then broken), UNAVAILABLE (the peer closed, or a timeout), CLOSED.
// ---------------------------------------------------------------------------------------

/**
 * What a frozen NBD export hands over: opaque, but for a summary. It owns the fds it
 * carries and closes them once sent, adopted, closed or collected; it is used at most once.
 */
export interface NativeNbdHandOffRecord {
  /** Ids of the connections it carries (they keep them in the adopting server). */
  readonly connectionIds: number[];
  /** The export's unix socket path, '' for TCP. */
  readonly unixPath: string;
  /** The export's TCP port, 0 for unix. */
  readonly tcpPort: number;
  readonly exportName: string;
  /** Bytes received from clients and not parsed yet (each less than one request header). */
  readonly pendingBytes: number;
  /** The export's connectionsTotal, which the adopting server continues. */
  readonly connectionsTotal: number;
  /** Closes its fds now (the frozen server keeps its own). */
  close(): void;
}

/** What {@link NativeHandOffChannel.receive} resolves with. */
export type NativeHandOffItem =
  | { type: 'message'; data: Buffer }
  | { type: 'nbd-server'; record: NativeNbdHandOffRecord };

/**
 * A hand-off link (AF_UNIX SOCK_SEQPACKET) to a process of the same uid, or root.
 * Plain messages (bytes, at most 1 MiB) are the caller's protocol (HELLO, READY, COMMIT).
 */
export interface NativeHandOffChannel {
  /** The peer's pid and uid (SO_PEERCRED). */
  readonly peerPid: number;
  readonly peerUid: number;
  /** Sends a message, or an NBD record (used up, sent or not). timeoutMs 0/absent: none. */
  send(item: Uint8Array | NativeNbdHandOffRecord, timeoutMs?: number): Promise<void>;
  /** The next item; a bad one rejects PROTOCOL_ERROR (its fds closed) and breaks the channel. */
  receive(timeoutMs?: number): Promise<NativeHandOffItem>;
  /** Wakes pending calls (they reject CLOSED); the peer sees the channel close. */
  close(): void;
}

export interface NativeHandOffListener {
  readonly path: string;
  /** The next peer of our uid or root. */
  accept(timeoutMs?: number): Promise<NativeHandOffChannel>;
  /** Stops accepting; removes the socket file if it is still the one it created. */
  close(): void;
}

export interface NativeHandOff {
  /** Listens at `path` (absolute, must not exist), mode 0600. ADDRESS_IN_USE if it exists. */
  listen(path: string): Promise<NativeHandOffListener>;
  connect(path: string, timeoutMs?: number): Promise<NativeHandOffChannel>;
}

/** Options of {@link NativeAddon.adoptNbdServer}: the rest comes from the record. */
export interface NativeNbdAdoptOptions {
  ioThreads?: number;
  maxConnections?: number;
  bufferBytesMax?: number;
  /** TLS for the clients that connect after the adoption (a TLS export is never handed off). */
  tls?: NativeTlsOptions;
}

/** The NBD server of an addon built with the hand-off (every server it makes). */
export interface NativeNbdHandOffServer extends NativeNbdServer {
  /** Ids of the open connections, ascending; a connection keeps its id across hand-offs. */
  connectionIds(): number[];
  /**
   * Stops accepting (new clients wait in the backlog) and brings every connection to a
   * request boundary with nothing in flight. BUSY if one does not get there in timeoutMs:
   * then everything carries on as before. `hold`: frozen, a connection still answers the
   * FLUSHes at the head of its stream (not for a hand-off: see NbdServer::Freeze).
   */
  freeze(timeoutMs: number, hold?: boolean): Promise<void>;
  /**
   * Frozen only: the record to send. The server stays frozen with its own fds (unfreeze()
   * rolls back) and no longer counts against its engine, which may now close; close()
   * then releases the sockets (closes its fds, no shutdown, no unlink).
   */
  detach(): Promise<NativeNbdHandOffRecord>;
  /**
   * Serve again where it stopped (an adopted server: start). `engine`: serve that engine
   * from now on (required when the one it served was closed meanwhile).
   */
  unfreeze(engine?: NativeEngine): Promise<void>;
}

/**
 * Options of a write-zeroes request.
 *
 * @inline
 */
export interface NativeWriteZeroesOptions {
  /** Storage may be released (default true). */
  mayTrim?: boolean;
  /** Fail with UNSUPPORTED rather than write zeros the slow way. */
  fastOnly?: boolean;
  /** Durable when the call resolves. */
  fua?: boolean;
}

export interface NativeEngine {
  /** The volume's size now (read at each access: {@link NativeEngine.resize} changes it). */
  readonly sizeBytes: number;
  epoch(): number;
  /**
   * Grows the volume while it serves (engine.h Resize): every RW replica records the new
   * size, then the engine takes it. The same size: nothing. INVALID_ARGUMENT (smaller or
   * not a multiple of 4096), BUSY (a rebuild runs), UNSUPPORTED (a replica server predates
   * GROW), INVALID_STATE (standby), STALE_EPOCH, NO_QUORUM, CLOSED.
   */
  resize(sizeBytes: number): Promise<void>;
  /** True while it serves nothing: opened as standby, or after deactivate(). */
  standby(): boolean;
  replicas(): NativeReplicaState[];
  /**
   * Hand-over, source side: stop a rebuild, drain, flush the RW replicas, become standby.
   * INVALID_STATE (standby already), STALE_EPOCH (fenced), BUSY (one runs already).
   */
  deactivate(): Promise<NativeHandOver>;
  /**
   * Hand-over, target side: claim `epoch` (allocated by the caller) on the replicas, check
   * that the latest replica set is the hand-over's, commit a new one and serve. INVALID_STATE
   * (active already), STALE_EPOCH (the hand-over was used or overtaken, or `epoch` is not
   * above a replica's), NO_QUORUM, NO_HEALTHY_REPLICA.
   */
  activate(handOver: NativeHandOver, epoch: number): Promise<void>;
  read(offset: number, length: number): Promise<Buffer>;
  write(offset: number, data: Uint8Array, fua?: boolean): Promise<void>;
  flush(): Promise<void>;
  trim(offset: number, length: number): Promise<void>;
  writeZeroes(offset: number, length: number, options?: NativeWriteZeroesOptions): Promise<void>;
  blockStatus(offset: number, length: number): Promise<NativeExtent[]>;
  snapshot(name: string, labels: Record<string, string>, userCreated: boolean): Promise<void>;
  /** Every layer; with `name`, only that snapshot's layer and its ancestors up to its nearest visible one (empty: no such snapshot). */
  listSnapshots(name?: string): Promise<NativeLayerInfo[]>;
  deleteSnapshot(name: string): Promise<void>;
  revert(name: string): Promise<void>;
  /**
   * Rebuild: add a replica write-only, copy what it lacks, make it RW (see engine.h
   * AddReplica). Progress arrives as rebuild-* events. Resolves when it is RW.
   */
  addReplica(endpoint: NativeReplicaEndpoint, member: string): Promise<NativeRebuildResult>;
  /**
   * Remove a replica that is not RW (aborting its rebuild if WO) and close it; with
   * `allowRw`, a RW one too while another replica is RW (an older addon ignores the flag
   * and refuses).
   */
  removeReplica(id: string, allowRw?: boolean): Promise<void>;
  /** Serve this engine over NBD. The engine must stay open while the server runs. */
  exportNbd(options: NativeNbdOptions): Promise<NativeNbdServer>;
  /** Drain, flush, mark replicas clean, close. Idempotent. Close NBD servers first. */
  close(): Promise<void>;
  /**
   * Writes the content of snapshot `name` (the volume as it read when the snapshot was
   * taken) into a new sparse raw file at the absolute `path`, whose directory must exist
   * and which must not: ALREADY_EXISTS, INVALID_ARGUMENT, NOT_FOUND (no such snapshot),
   * NO_SPACE / IO_ERROR (the partial file is removed), CLOSED (the engine closed meanwhile).
   * Snapshot delete and revert on this engine fail with BUSY while it runs.
   */
  exportSnapshot(name: string, path: string): Promise<NativeSnapshotCopyResult>;
  /**
   * Writes the content of snapshot `name` into `target` (another open engine of the same
   * size) through its replicated write path, zeroing what the snapshot does not hold, then
   * flushes it: a clone. INVALID_ARGUMENT (same engine, sizes differ), NOT_FOUND, CLOSED.
   */
  copySnapshotTo(name: string, target: NativeEngine): Promise<NativeSnapshotCopyResult>;
}

/** A volume's replica set as stored on a replica (docs/single-writer.md). */
export interface NativeReplicaSet {
  epoch: number;
  generation: number;
  /** Member names (control-plane replica ids). */
  members: string[];
  /** The members that hold every write acknowledged under this set. */
  rw: string[];
}

/**
 * A single replica opened directly, without an engine: for inspection, verification
 * (are all replicas identical?), and, later, the replica server. Holds the replica's
 * directory lock, so it cannot be open in an engine at the same time.
 */
export interface NativeReplica {
  readonly id: string;
  /** Its size now (read at each access: {@link NativeReplica.grow} changes it). */
  readonly sizeBytes: number;
  epoch(): number;
  clean(): boolean;
  /**
   * Grows the replica (every layer file, then one metadata commit). The same size: nothing.
   * INVALID_ARGUMENT (smaller, or not a multiple of 4096), CLOSED.
   */
  grow(sizeBytes: number): Promise<void>;
  /** Promise `epoch` (above epoch(), else STALE_EPOCH); resolves to the replica set stored here, or null. */
  claimEpoch(epoch: number): Promise<NativeReplicaSet | null>;
  /**
   * Store a replica set (its epoch must be epoch() and it must be newer than the stored one,
   * else STALE_EPOCH); `selfRw`: this replica is RW in it, so it becomes the replica's last RW set.
   */
  setReplicaSet(set: NativeReplicaSet, selfRw?: boolean): Promise<void>;
  /** The newest replica set stored here in which this replica was RW, or null. */
  lastRw(): Promise<{ epoch: number; generation: number } | null>;
  read(offset: number, length: number): Promise<Buffer>;
  /** Write as the writer of `epoch`; rejects with STALE_EPOCH unless it is epoch(). */
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
  /** sanlock's client API (disk locks, host liveness); see {@link NativeSanlock}. */
  readonly sanlock: NativeSanlock;
  /** Create an empty replica directory of the given size, optionally over a backing image. */
  createReplica(dir: string, sizeBytes: number, options?: NativeReplicaCreateOptions): Promise<void>;
  /** Open an engine over local replicas; claims a new epoch, reconciles if needed (a standby does neither). */
  openEngine(options: NativeEngineOptions): Promise<NativeEngine>;
  /**
   * Open one replica directly (see NativeReplica): a local directory, or a backing image file
   * on another data engine's replica server (read-only; writes fail UNSUPPORTED / EROFS).
   */
  openReplica(endpoint: string | NativeRemoteBackingFile): Promise<NativeReplica>;
  /** Read a replica's metadata (works while it is open in an engine or served). */
  inspectReplica(dir: string): Promise<NativeReplicaInfo>;
  /** Serve the replicas under `root` to engines on other hosts (replica protocol). */
  startReplicaServer(options: NativeReplicaServerOptions): Promise<NativeReplicaServer>;
  /** Open a raw or qcow2 image (and its backing chain) read-only; see {@link NativeImage}. */
  openImage(path: string, options?: NativeImageOpenOptions): Promise<NativeImage>;
  /** Hand-off links between processes (absent from fakes and older addons). */
  readonly handOff?: NativeHandOff;
  /**
   * An NBD server built from a received record, serving `engine` (the same volume, at
   * least as large). It starts frozen: unfreeze() starts it; close() before that only
   * closes its fds (the sender may still take the export back). PROTOCOL_ERROR when it
   * cannot keep what a connection was promised. Absent from fakes and older addons.
   */
  adoptNbdServer?(record: NativeNbdHandOffRecord, engine: NativeEngine, options?: NativeNbdAdoptOptions): Promise<NativeNbdHandOffServer>;
}

// ---------------------------------------------------------------------------------------
// Images (native/src/image, native/src/binding/image-wrap.cc): raw and qcow2 files read
// natively, as the bottom layer of a volume. Rejections carry CORRUPT_METADATA for damaged
// or hostile metadata, UNSUPPORTED for features not read (encryption, unknown incompatible
// features, libzstd missing), NOT_FOUND for a missing file of the chain.
// ---------------------------------------------------------------------------------------

/** How the top image is read: probed by its magic ('auto', the default) or forced. */
export type NativeImageFormat = 'raw' | 'qcow2';

export interface NativeImageOpenOptions {
  format?: NativeImageFormat | 'auto';
}

/** One file of an opened image chain. */
export interface NativeImageLayer {
  path: string;
  format: NativeImageFormat;
  /** Virtual size of this layer (a multiple of 512). */
  sizeBytes: number;
  /** qcow2 external data file, '' if none. */
  dataFile: string;
  /** qcow2 dirty bit set (refcounts may be stale; reads are unaffected). */
  dirty: boolean;
}

export interface NativeImage {
  readonly path: string;
  readonly format: NativeImageFormat;
  /** Virtual size, as QEMU reports it: a raw file's size rounded up to 512, a qcow2 header's size rounded down. */
  readonly sizeBytes: number;
  /** The chain, this image first, then its backing images. */
  readonly chain: NativeImageLayer[];
  /** At most 32 MiB per call; the range must lie inside sizeBytes. */
  read(offset: number, length: number): Promise<Buffer>;
  /**
   * Allocation as NBD base:allocation extents: flags 0 data, 2 zeros recorded in the image
   * (zero clusters), 3 nothing recorded in any layer. May cover less than `length` (at most
   * 65,536 extents, or a scan limit): continue from where it ends.
   */
  blockStatus(offset: number, length: number): Promise<NativeExtent[]>;
  /** Waits for calls in flight, closes every file of the chain. Idempotent. */
  close(): Promise<void>;
}

// ---------------------------------------------------------------------------------------
// sanlock (native/src/binding/sanlock-binding.cc): one function per sanlock client call.
// Daemon calls resolve with `{ rv, ... }`: rv >= 0 is success, rv <= -200 a sanlock_rv.h
// error, other negatives -errno; src/locks/sanlock-errors.ts maps rv to MooringError. They
// reject only for bad arguments (INVALID_ARGUMENT) or a missing library (UNSUPPORTED).
// ---------------------------------------------------------------------------------------

/** Where a lease lives: a file or block device and a byte offset (struct sanlk_disk). */
export interface NativeSanlockDisk {
  path: string;
  offset: number;
}

/** struct sanlk_lockspace: `hostId` 0 where the call does not need one. */
export interface NativeSanlockLockspace {
  name: string;
  hostId?: number;
  path: string;
  offset: number;
  /** SANLK_LSF_ALIGN* | SANLK_LSF_SECTOR* (write/read), 0 otherwise. */
  flags?: number;
}

/** struct sanlk_resource (a paxos lease) with 1..4 disks. */
export interface NativeSanlockResource {
  lockspace: string;
  name: string;
  /** Lease version; used with the SANLK_RES_LVER flag. */
  lver?: number;
  /** SANLK_RES_* bits. */
  flags?: number;
  disks: NativeSanlockDisk[];
}

/** struct sanlk_host: one host's delta lease as the daemon sees it. */
export interface NativeSanlockHost {
  hostId: number;
  generation: number;
  timestamp: number;
  ioTimeout: number;
  /** `flags & 0xf` is the state: 1 unknown, 2 free, 3 live, 4 fail, 5 dead. */
  flags: number;
}

/** struct sanlk_host_event. */
export interface NativeSanlockHostEvent {
  hostId: number;
  generation: number;
  event: number;
  data: number;
}

/** struct sanlk_rindex: the resource index of a lockspace. */
export interface NativeSanlockRindex {
  lockspace: string;
  path: string;
  offset: number;
  flags?: number;
  maxResources?: number;
}

/** Who a resource call acts for: a registered connection of this process, or a registered pid. */
export type NativeSanlockTarget = { fd: number; pid?: undefined } | { pid: number; fd?: undefined };

/** A daemon call's result. */
export interface NativeSanlockRv {
  rv: number;
}

/** One host's delta lease read from storage (not through the daemon). */
export interface NativeDeltaLease {
  /** The sector holds a delta lease. */
  valid: boolean;
  ownerId: number;
  generation: number;
  /** Renewal time of its owner's clock; 0 = free. */
  timestamp: number;
  lockspace: string;
  /** The owning daemon's host name (`-e`, or a UUID). */
  hostName: string;
}

export interface NativeSanlock {
  /** dlopen libsanlock_client.so.1 once; `error` names the package to install. */
  load(): { loaded: boolean; library: string; error?: string };
  strerror(rv: number): string;
  version(): Promise<NativeSanlockRv & { version: number; proto: number }>;
  writeLockspace(ls: NativeSanlockLockspace, maxHosts: number, ioTimeoutSeconds: number): Promise<NativeSanlockRv>;
  readLockspace(
    ls: NativeSanlockLockspace,
  ): Promise<NativeSanlockRv & { lockspace: Required<NativeSanlockLockspace>; ioTimeoutSeconds: number }>;
  writeResource(res: NativeSanlockResource, maxHosts: number, numHosts: number, clear?: boolean): Promise<NativeSanlockRv>;
  readResource(
    res: NativeSanlockResource,
    withOwners?: boolean,
  ): Promise<NativeSanlockRv & { resource: Required<NativeSanlockResource>; owners?: NativeSanlockHost[] }>;
  align(disk: NativeSanlockDisk): Promise<NativeSanlockRv>;
  addLockspace(ls: NativeSanlockLockspace, async: boolean, ioTimeoutSeconds: number): Promise<NativeSanlockRv>;
  inqLockspace(ls: NativeSanlockLockspace, wait?: boolean): Promise<NativeSanlockRv>;
  remLockspace(ls: NativeSanlockLockspace, options?: { async?: boolean; unused?: boolean }): Promise<NativeSanlockRv>;
  getLockspaces(): Promise<NativeSanlockRv & { lockspaces: Array<Required<NativeSanlockLockspace>> }>;
  getHosts(lockspaceName: string, hostId?: number): Promise<NativeSanlockRv & { hosts: NativeSanlockHost[] }>;
  formatRindex(rx: NativeSanlockRindex): Promise<NativeSanlockRv>;
  lookupRindex(
    rx: NativeSanlockRindex,
    entry?: { name?: string; offset?: number },
  ): Promise<NativeSanlockRv & { entry: { name: string; offset: number } }>;
  createResource(
    rx: NativeSanlockRindex,
    name: string,
    maxHosts: number,
    numHosts: number,
  ): Promise<NativeSanlockRv & { entry: { name: string; offset: number } }>;
  deleteResource(rx: NativeSanlockRindex, entry: { name?: string; offset?: number }): Promise<NativeSanlockRv>;
  /** Registers this process; the fd (no CLOEXEC) survives exec. */
  register(): Promise<NativeSanlockRv & { fd?: number }>;
  unregister(fd: number): Promise<NativeSanlockRv>;
  restrict(fd: number, flags: number): Promise<NativeSanlockRv>;
  killpath(fd: number, path: string, args?: string, appendPid?: boolean): Promise<NativeSanlockRv>;
  acquire(
    target: NativeSanlockTarget,
    flags: number,
    resources: NativeSanlockResource[],
    ownerName?: string,
  ): Promise<NativeSanlockRv>;
  release(target: NativeSanlockTarget, flags: number, resources?: NativeSanlockResource[]): Promise<NativeSanlockRv>;
  inquire(target: NativeSanlockTarget): Promise<NativeSanlockRv & { count: number; state: string }>;
  convert(target: NativeSanlockTarget, flags: number, resource: NativeSanlockResource): Promise<NativeSanlockRv>;
  request(flags: number, forceMode: number, resource: NativeSanlockResource): Promise<NativeSanlockRv>;
  regEvent(lockspaceName: string): Promise<NativeSanlockRv & { fd?: number }>;
  getEvent(
    fd: number,
  ): Promise<NativeSanlockRv & { event: NativeSanlockHostEvent; fromHostId: number; fromGeneration: number }>;
  endEvent(fd: number, lockspaceName: string): Promise<NativeSanlockRv>;
  setEvent(lockspaceName: string, event: Partial<NativeSanlockHostEvent>, flags: number): Promise<NativeSanlockRv>;
  readDeltaLease(path: string, offset: number, hostId: number, sectorSize: number): Promise<NativeDeltaLease>;
  /**
   * Reads `length` bytes at `offset` of a lockspace's storage (both multiples of 512, length
   * at most 4 MiB) with O_DIRECT, so what other hosts' daemons wrote is seen rather than a
   * copy cached here; shorter when the storage ends first. No daemon involved.
   */
  readLeaseArea(path: string, offset: number, length: number): Promise<Buffer>;
  resToStr(res: NativeSanlockResource): NativeSanlockRv & { str?: string };
  strToRes(str: string): NativeSanlockRv & { resource?: Required<NativeSanlockResource> };
  argsToState(resources: NativeSanlockResource[]): NativeSanlockRv & { state?: string };
  stateToArgs(state: string): NativeSanlockRv & { resources?: Array<Required<NativeSanlockResource>> };
  /**
   * Replaces this process (signals and stdio reset first); `closeOnExec` fds are closed by
   * a successful exec only. Returns only by throwing.
   */
  execvp(file: string, args: string[], closeOnExec?: number[]): never;
}
