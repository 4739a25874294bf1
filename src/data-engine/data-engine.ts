/**
 * DataEngine: the per-host host of replicas and engines (Longhorn's instance manager).
 *
 * One interface, two ways to reach it:
 * - {@link LocalDataEngine}: in the embedding process (the default), direct calls;
 * - {@link RemoteDataEngine}: a `mooring data-engine` process, over gRPC (a unix socket on
 *   the same host, TCP between hosts, optionally mutual TLS).
 *
 * A data engine owns a directory (`DIR/replicas/<name>/` per replica), serves its replicas
 * to engines on other hosts through its replica server, and runs engines (one per volume
 * attached on this host), each optionally exported over NBD.
 *
 * @packageDocumentation
 */
import type { ReplicaRemoveOptions } from '../engine/engine.js';
import type { NativeNbdStats } from '../native/binding.js';

export type { ReplicaRemoveOptions };

/** A replica this data engine holds. */
export interface HostedReplicaInfo {
  /** Replica name, unique on this data engine ([A-Za-z0-9._-]{1,63}). */
  name: string;
  /** Size of the replica (the volume's size) in bytes. */
  sizeBytes: number;
  /** Highest writer epoch promised on it: an engine must be given a higher one to start over it. */
  epoch: number;
  /** The last engine closed it cleanly. */
  clean: boolean;
  /** A rebuild into it has not finished (it is not an equal of the others). */
  rebuilding: boolean;
  /** Real disk usage. */
  allocatedBytes: number;
  /** Open in an engine here or served to an engine elsewhere. */
  inUse: boolean;
  /** The backing image file its chain reads beneath its bottom layer, or null. */
  backingImage: ReplicaBackingImage | null;
}

/**
 * The backing image beneath a replica's chain: the bottom, read-only layer that
 * every replica of a volume shares with the other replicas on its disk. The file is
 * `DISK/backing-images/<dir>/image`, where DISK is the directory two levels above the
 * replica's (a data engine's `DIR`, whose replicas are `DIR/replicas/<name>`).
 */
export interface ReplicaBackingImage {
  /** The image's directory on the disk: `<image name>-<image uuid>` ([A-Za-z0-9._-]{1,127}). */
  dir: string;
  /** How the file is read. */
  format: 'raw' | 'qcow2';
  /** Virtual size of the image in bytes, at most the replica's size; above it the volume reads zeros. */
  virtualSizeBytes: number;
}

/** Options of {@link DataEngine.createReplica}. */
export interface ReplicaCreateOptions {
  /** A backing image beneath the new replica's chain; its file must be ready on this disk. */
  backingImage?: ReplicaBackingImage;
}

/** Names one backing image file on a data engine's disk (`DIR/backing-images/<name>-<uuid>/`). */
export interface BackingImageFileRef {
  /** Backing image name ([A-Za-z0-9._-]{1,63}). */
  name: string;
  /** The image's UUID, generated when the image was created: a new image with an old name never meets the old files. */
  uuid: string;
}

/**
 * State of one backing image file on one disk: `pending` (not started), `starting`,
 * `in-progress` (downloading, receiving or exporting), `ready` (verified, usable), `failed`,
 * `unknown` (its host cannot be reached).
 */
export type BackingImageFileState = 'pending' | 'starting' | 'in-progress' | 'ready' | 'failed' | 'unknown';

/** One backing image file on a data engine's disk. */
export interface BackingImageFileInfo extends BackingImageFileRef {
  /** Where its preparation stands. */
  state: BackingImageFileState;
  /** Percent done (0..100) while in progress; 100 when ready. */
  progress: number;
  /** Why it failed, or what it is doing; '' if nothing to say. */
  message: string;
  /** Size of the file in bytes (0 while unknown, e.g. a download without Content-Length). */
  sizeBytes: number;
  /** Bytes of it on disk so far: a preparation that stopped resumes from here. */
  receivedBytes: number;
  /** SHA-512 of the file's bytes (hex), '' until ready. */
  checksum: string;
  /** Format and virtual size as the native reader sees them, known once ready. */
  format: 'raw' | 'qcow2' | null;
  /** The size of the disk the image holds (a qcow2 file's virtual size; a raw file's size), 0 until ready. */
  virtualSizeBytes: number;
  /** Replicas on this disk whose chain reads it (it is never deleted while any does). */
  usedBy: string[];
}

/** Options of {@link DataEngine.downloadBackingImageFile}. */
export interface BackingImageDownloadOptions {
  /** http:// or https:// URL, fetched from this data engine's host. */
  url: string;
  /** SHA-512 (hex) the file must have; a mismatch fails the file with both checksums in the message. */
  expectedChecksum?: string;
  /** The server must start sending within this time (default 30,000 ms), per attempt. */
  startTimeoutMs?: number;
  /** Attempts after a failed one (default 5), with back-off; resumed with Range where the server supports it. */
  retries?: number;
}

/** Options of {@link DataEngine.writeBackingImageFile}. */
export interface BackingImageWriteOptions {
  /** The whole file's size in bytes (declared up front). */
  sizeBytes: number;
  /** Where `data` starts: 0, or the file's `receivedBytes` to resume a partial file. */
  offset?: number;
  /** SHA-512 (hex) the whole file must have. */
  expectedChecksum?: string;
}

/** Options of {@link DataEngine.pullBackingImageFile}. */
export interface BackingImagePullOptions extends BackingImageWriteOptions {
  /**
   * The data engine holding a ready copy: its gRPC address (`tcp:HOST:PORT`, or `unix:PATH`
   * on this machine) and host id (checked: a data engine with another id is refused).
   * Reached with this data engine's own TLS certificate and cluster secret.
   */
  source: {
    /** `tcp:HOST:PORT` or `unix:PATH` of the source's gRPC server, as this data engine reaches it. */
    address: string;
    /** The source's host id; a data engine with another id at `address` is refused (INVALID_ARGUMENT). */
    hostId: string;
  };
}

/** Who this data engine is and how other hosts reach its replicas. */
export interface DataEngineInfo {
  /** The host id the embedder gave it. */
  hostId: string;
  /** Package version of the data engine. */
  version: string;
  /** Directory it owns. */
  dir: string;
  /** Replica server address (`tcp:HOST:PORT`) for engines on other hosts, or null if it serves none. */
  replicaAddress: string | null;
  /** Whether host-to-host traffic (gRPC and replica protocol) uses mutual TLS. */
  tls: boolean;
  /**
   * A random id drawn when the data engine's process started: another id at the same
   * address means another process (a restart, or a new version after an upgrade). '' from
   * a data engine older than the field.
   */
  instanceId: string;
  /**
   * The identity of the disk (directory) it serves, drawn when the directory was first
   * used and kept in its data-engine.json: another id under the same host id means the
   * disk was replaced (its replicas and image files are gone). '' from a data engine older
   * than the field.
   */
  diskId: string;
  /**
   * What this data engine's gRPC service offers beyond the base service:
   * `successor-exec` (it replaces its own process by a new version: `mooring data-engine
   * --allow-successor-exec`), `in-place-handoff` (it hands its engines, clients
   * connected, to that successor), `salvage` (it honours
   * {@link EngineStartOptions.salvage}) and `backing-file-read` (its replica server, at
   * `replicaAddress`, also serves its ready backing image files, so another data engine pulls
   * them over the replica protocol rather than the gRPC stream). Empty in process (where everything of this release
   * is offered) and from older data engines.
   */
  features: string[];
}

/** Features a data engine may announce in {@link DataEngineInfo.features} (docs/upgrade.md). */
export const DATA_ENGINE_FEATURES = {
  successorExec: 'successor-exec',
  inPlaceHandOff: 'in-place-handoff',
  salvage: 'salvage',
  backingFileRead: 'backing-file-read',
} as const;

/** How an engine reaches one replica of its volume. */
export interface EngineReplicaRef {
  /** Replica id within the volume (e.g. `r0`); stable across rebuilds of the same slot. */
  id: string;
  /** Host id of the data engine holding it. */
  hostId: string;
  /** Replica name on that data engine. */
  name: string;
  /** That data engine's replica server (`tcp:HOST:PORT`); ignored when hostId is this engine's host. */
  address: string | null;
}

/** Options of {@link DataEngine.startEngine}. */
export interface EngineStartOptions {
  /** Volume name; one engine per volume per data engine. */
  volume: string;
  /** The replicas (1..16). Remote ones that cannot be reached start as ERR and are repaired later. */
  replicas: EngineReplicaRef[];
  /** NBD address to export on (`unix:PATH` or `tcp:HOST:PORT`); null or omitted: no export. */
  nbd?: string | null;
  /** Engine-to-replica I/O timeout for remote replicas (default 8000 ms). */
  ioTimeoutMs?: number;
  /**
   * Start as a migration standby (default false): open the replicas and the export but claim
   * no epoch, reconcile nothing and serve no I/O (NBD requests fail with EPERM) until
   * {@link DataEngine.activateEngine}. Another engine may be writing the same replicas meanwhile.
   */
  standby?: boolean;
  /**
   * Salvage start (default false; not with `standby`; docs/salvage.md): the caller asserts
   * that the volume's replicas not given are gone for good. No majority of the latest
   * replica set is needed; with no reachable RW replica of it, the replica whose last RW
   * set is newest serves. A `salvaged` event names the source and whether writes may be
   * missing. A {@link RemoteDataEngine} refuses it (UNSUPPORTED) towards a data engine
   * whose {@link DataEngineInfo.features} lack `salvage`: an older one would ignore the
   * field and start normally.
   */
  salvage?: boolean;
  /**
   * The writer epoch the engine claims: a positive integer, required unless `standby` (a
   * standby takes none; {@link DataEngine.activateEngine} gives it one). The caller
   * allocates it so that no other engine of the volume ever holds it (a Mooring allocates
   * it in its store), above every epoch a replica promised, else the start fails with
   * STALE_EPOCH and nothing is served. A data engine never picks an epoch itself
   * (docs/single-writer.md).
   */
  epoch?: number;
  /**
   * How long a request waits when a change of the replica set cannot reach a majority of
   * the volume's replicas, before it fails (default 15000 ms, 0..600000); it is never
   * acknowledged meanwhile (docs/single-writer.md).
   */
  quorumHoldMs?: number;
}

/** Options of {@link DataEngine.activateEngine}. */
export interface EngineActivateOptions {
  /** The writer epoch the activated engine claims, allocated by the caller as for {@link EngineStartOptions.epoch}. */
  epoch: number;
}

/**
 * What an engine hands to the next writer of its volume ({@link DataEngine.deactivateEngine}
 * returns it, {@link DataEngine.activateEngine} takes it).
 */
export interface EngineHandOver {
  /** The writer epoch the deactivated engine held. */
  epoch: number;
  /** The generation of its last committed replica set; activation checks that it is still the volume's latest. */
  generation: number;
  /** Replicas that were RW when it drained: identical, holding every acknowledged write. */
  rwReplicaIds: string[];
}

/** Rebuild figures of a replica being rebuilt. */
export interface RebuildProgress {
  /** Bytes written to the replica so far (the blocks that differed). */
  sentBytes: number;
  /** Bytes compared so far. */
  scannedBytes: number;
  /** Bytes to compare in all: planned per layer, corrected as each layer is done. */
  totalBytes: number;
}

/** A replica as the engine sees it. */
export interface EngineReplicaInfo extends EngineReplicaRef {
  /** RW (read and written), WO (written only, being rebuilt) or ERR (dropped). */
  mode: 'RW' | 'WO' | 'ERR';
  /** Negative errno of the failure that made it ERR, else 0. */
  lastError: number;
  /** Present while it is being rebuilt. */
  rebuild?: RebuildProgress;
}

/** An engine running on a data engine. */
export interface EngineInfo {
  /** The volume it serves. */
  volume: string;
  /** The volume's size in bytes. */
  sizeBytes: number;
  /** Writer epoch it holds (0 for a standby that was never active). */
  epoch: number;
  /** active: serves I/O; standby: a migration standby, or an engine that handed over (serves none). */
  role: 'active' | 'standby';
  /** Its replicas and their modes. */
  replicas: EngineReplicaInfo[];
  /** The NBD export, or null. */
  nbd: {
    /** Where it listens: `unix:PATH` or `tcp:HOST:PORT`. */
    address: string;
    /** The NBD URI for clients (`nbd+unix:///?socket=PATH`, `nbd://HOST:PORT`). */
    uri: string;
  } | null;
  /** Counters of the NBD export since it started (absent from an older data engine, null when not exported). */
  nbdStats?: EngineNbdStats | null;
}

/** Counters of an engine's NBD export since it started. */
export type EngineNbdStats = NativeNbdStats;

/** What a finished rebuild did. */
export interface RebuildResult {
  /** The replica rebuilt (now RW). */
  replicaId: string;
  /** Bytes compared: what either the source or the new replica held allocated. */
  scannedBytes: number;
  /** Bytes written to the new replica (the blocks that differed). */
  sentBytes: number;
  /** Bytes unmapped on the new replica (it held them, the source did not). */
  unmappedBytes: number;
  /** How long the rebuild took. */
  durationMs: number;
}

/**
 * Events a data engine reports about the engines it runs, each naming its `volume` (except
 * `backing-image-file`), told apart by `type`.
 */
export type DataEngineEvent =
  /** A replica failed and was dropped (ERR): the OS `errno` and a message say why. */
  | { type: 'replica-error'; volume: string; replicaId: string; errno: number; message: string }
  /** An engine claimed its writer epoch (when it started, or was activated). */
  | { type: 'epoch-claimed'; volume: string; epoch: number }
  /**
   * A salvage start ({@link EngineStartOptions.salvage}) serves from replica `replicaId`,
   * last RW in the replica set `lastRw` (null: it recorded none); `complete` false: writes
   * acknowledged after that set may be missing (`message` says why).
   */
  | { type: 'salvaged'; volume: string; replicaId: string; lastRw: { epoch: number; generation: number } | null; complete: boolean; message: string }
  /**
   * An engine committed a new replica set to a majority of the volume's replicas (at start,
   * at activation, after dropping a failed replica, when a rebuilt one became RW or one was
   * removed): `epoch` and `generation` name the set, `rwReplicaIds` are replica ids
   * ({@link EngineReplicaRef.id}).
   */
  | { type: 'replica-set-changed'; volume: string; epoch: number; generation: number; rwReplicaIds: string[] }
  /** A rebuild of `replicaId` started (the replica is WO). */
  | ({ type: 'rebuild-started'; volume: string; replicaId: string } & RebuildProgress)
  /** A rebuild advanced (at most every 64 MiB compared). */
  | ({ type: 'rebuild-progress'; volume: string; replicaId: string } & RebuildProgress)
  /** A rebuild finished: the replica is RW. */
  | ({ type: 'rebuild-completed'; volume: string; replicaId: string } & RebuildProgress)
  /** A rebuild failed: `code` (a {@link MooringErrorCode}) and `message` say why; the replica is ERR. */
  | ({ type: 'rebuild-failed'; volume: string; replicaId: string; code: string; message: string } & RebuildProgress)
  /** Self-repair: the replica is ERR (`code`/`message` say why, or why the last attempt failed); it is re-added after `delayMs`. */
  | { type: 'repair-scheduled'; volume: string; replicaId: string; attempt: number; delayMs: number; code: string; message: string }
  /** The volume's engine stopped. */
  | { type: 'engine-stopped'; volume: string }
  /** A standby engine became the writer ({@link DataEngine.activateEngine}). */
  | { type: 'engine-activated'; volume: string; epoch: number }
  /** An active engine drained and became standby ({@link DataEngine.deactivateEngine}). */
  | { type: 'engine-deactivated'; volume: string; epoch: number }
  /** A snapshot export or copy advanced: data bytes of the snapshot handled so far, of `totalBytes` (at least 64 MiB apart). */
  | { type: 'snapshot-copy-progress'; volume: string; snapshot: string; copiedBytes: number; totalBytes: number }
  /** A backing image file changed state or advanced (progress at most every 1 % or 250 ms). */
  | ({ type: 'backing-image-file' } & Omit<BackingImageFileInfo, 'usedBy'>);

/** A snapshot of a volume, as an engine lists it. */
export interface EngineSnapshotInfo {
  /** The snapshot's name. */
  name: string;
  /** Stable layer id. */
  id: string;
  /** Name of the snapshot below it, null for the first. */
  parent: string | null;
  /** When it was taken, ms since the Unix epoch. */
  createdMs: number;
  /** Labels given when it was taken. */
  labels: Record<string, string>;
  /** The volume's size when it was taken. */
  sizeBytes: number;
  /** Disk space its layer uses on the replica it was listed from. */
  allocatedBytes: number;
  /** Taken by a user (false: taken by Mooring itself, e.g. for a clone or an export). */
  userCreated: boolean;
}

/** What {@link DataEngine.exportSnapshot} and {@link DataEngine.copySnapshot} did. */
export interface SnapshotCopyResult {
  /** Volume size (the length of the image written). */
  sizeBytes: number;
  /** Data bytes written (holes are not written). */
  copiedBytes: number;
  /** How long the copy took. */
  durationMs: number;
}

/**
 * The per-host host of replicas and engines (Longhorn's instance manager): it owns a
 * directory (`DIR/replicas/<name>/` per replica), serves its replicas to engines on other
 * hosts through its replica server, and runs engines (one per volume attached on its host),
 * each optionally exported over NBD. {@link LocalDataEngine} runs in the embedding process;
 * {@link RemoteDataEngine} reaches a `mooring data-engine` process over gRPC. A
 * {@link Mooring} drives data engines; an embedder may also call them directly.
 */
export interface DataEngine {
  /** Host id (known without a round trip). */
  readonly hostId: string;
  /** Who it is and how other hosts reach its replicas (a round trip for a remote one). */
  info(): Promise<DataEngineInfo>;

  /**
   * Creates an empty replica, optionally over a backing image whose file is ready on this
   * disk. ALREADY_EXISTS, INVALID_ARGUMENT, NO_SPACE, NOT_FOUND (no such image file),
   * INVALID_STATE (the file is not ready).
   */
  createReplica(name: string, sizeBytes: number, options?: ReplicaCreateOptions): Promise<HostedReplicaInfo>;
  /** Deletes a replica and its data. BUSY while it is in use, NOT_FOUND. */
  deleteReplica(name: string): Promise<void>;
  /**
   * Grows a replica that no engine uses (a detached volume's; docs/data-engine.md,
   * "Resize"): every layer file, then one durable metadata commit. The same size does
   * nothing. INVALID_ARGUMENT (smaller, or not a multiple of 4096 within the volume limit),
   * NOT_FOUND, BUSY (open in an engine here or served to one elsewhere: resize through
   * that engine instead), UNSUPPORTED (a data engine of a release without resize).
   */
  growReplica(name: string, sizeBytes: number): Promise<HostedReplicaInfo>;
  /** Every replica this data engine holds. */
  listReplicas(): Promise<HostedReplicaInfo[]>;

  /**
   * Starts an engine for a volume: it claims `options.epoch` (allocated by the caller) on the
   * replicas, unless it is a standby. ALREADY_EXISTS if one runs, STALE_EPOCH (a replica
   * promised that epoch or a higher one: allocate above it and try again), NO_QUORUM (a
   * majority of the replicas cannot be reached; see `salvage`), NO_HEALTHY_REPLICA,
   * INVALID_ARGUMENT, UNSUPPORTED (`salvage` towards a data engine without it).
   */
  startEngine(options: EngineStartOptions): Promise<EngineInfo>;
  /** Stops an engine: unexports, drains, flushes, marks replicas clean. NOT_FOUND. */
  stopEngine(volume: string): Promise<void>;
  /** The engine of a volume running here. NOT_FOUND if none runs. */
  engineInfo(volume: string): Promise<EngineInfo>;
  /** Every engine running here. */
  listEngines(): Promise<EngineInfo[]>;
  /**
   * Adds (or re-adds) a replica to a running engine and rebuilds it; resolves when it is RW.
   * Rebuilds on one data engine run at most `maxConcurrentRebuilds` at a time; others wait.
   */
  addReplica(volume: string, replica: EngineReplicaRef): Promise<RebuildResult>;
  /**
   * Removes a replica from a running engine: one that is not RW, or with `evenIfRw` a RW
   * one while another replica is RW (eviction moves healthy replicas). INVALID_STATE
   * otherwise (a data engine older than the option refuses any RW replica).
   */
  removeReplica(volume: string, replicaId: string, options?: ReplicaRemoveOptions): Promise<void>;
  /**
   * Grows the volume of a running engine while it serves: every RW replica (here or on
   * other hosts) records the new size durably, then the engine and its NBD export take it;
   * a replica that fails to grow is dropped as ERR and rebuilt at the new size. New NBD
   * connections see the new size; connections negotiated before keep theirs. The same
   * size does nothing. INVALID_ARGUMENT (smaller, or not a multiple of 4096 within the
   * volume limit), NOT_FOUND (no engine), INVALID_STATE (standby), BUSY (a rebuild runs:
   * ask again when it is done), UNSUPPORTED (a replica's data engine predates resize),
   * STALE_EPOCH, NO_QUORUM.
   */
  resizeEngine(volume: string, sizeBytes: number): Promise<EngineInfo>;

  /**
   * Migration hand-over, source side: the active engine stops taking requests, drains those
   * in flight, stops a running rebuild (its target stays ERR: the next writer rebuilds it),
   * flushes its RW replicas and becomes standby (every later request fails with EPERM).
   * NOT_FOUND, INVALID_STATE (already standby), STALE_EPOCH (fenced meanwhile).
   */
  deactivateEngine(volume: string): Promise<EngineHandOver>;
  /**
   * Migration hand-over, target side (or rollback, source side): a standby engine claims
   * `options.epoch` (allocated by the caller, above every replica's: from then on the engine
   * that handed over cannot change any replica), checks that the volume's latest replica set
   * is the hand-over's, uses the hand-over's RW replicas as RW and the others as ERR
   * (self-repair rebuilds them), and serves I/O. NOT_FOUND, INVALID_STATE (already active),
   * STALE_EPOCH (another engine claimed or wrote meanwhile, or a replica promised
   * `options.epoch` already), NO_QUORUM, NO_HEALTHY_REPLICA, INVALID_ARGUMENT.
   */
  activateEngine(volume: string, handOver: EngineHandOver, options: EngineActivateOptions): Promise<EngineInfo>;

  /** Takes a snapshot through the volume's active engine. ALREADY_EXISTS, INVALID_ARGUMENT, INVALID_STATE (standby). */
  createSnapshot(volume: string, name: string, options?: { labels?: Record<string, string> }): Promise<EngineSnapshotInfo>;
  /** Snapshots of the volume (bottom first), from its engine's first RW replica. */
  listSnapshots(volume: string): Promise<EngineSnapshotInfo[]>;
  /** Deletes a snapshot through the active engine. NOT_FOUND, BUSY (a rebuild runs). */
  deleteSnapshot(volume: string, name: string): Promise<void>;
  /**
   * Makes the volume's content that of snapshot `name`, through its active engine, which
   * must not be exported over NBD (clients would see the data change under them).
   * NOT_FOUND, INVALID_STATE (exported, or standby).
   */
  revertSnapshot(volume: string, name: string): Promise<void>;
  /**
   * Writes the volume's content as of `snapshot` into a new sparse raw file at `path` on this
   * data engine's host (`path` must be absolute, its directory must exist, the file must not).
   * ALREADY_EXISTS, NOT_FOUND, INVALID_ARGUMENT, NO_SPACE.
   */
  exportSnapshot(volume: string, snapshot: string, path: string): Promise<SnapshotCopyResult>;
  /**
   * Writes the content of `volume` as of `snapshot` into the volume `toVolume` (same size;
   * both engines run on this data engine, the target active) through the target engine's
   * normal write path: a clone. NOT_FOUND, INVALID_ARGUMENT (sizes differ).
   */
  copySnapshot(volume: string, snapshot: string, toVolume: string): Promise<SnapshotCopyResult>;

  // --- Backing image files on this data engine's disk (Longhorn's backing image manager and
  // data source): one file per image per disk, shared by the replicas on it.

  /** The files on this disk, as last known (a ready file found after a restart is verified before it is ready again). */
  listBackingImageFiles(): Promise<BackingImageFileInfo[]>;
  /** One file, or null if this disk has none for `ref`. */
  backingImageFile(ref: BackingImageFileRef): Promise<BackingImageFileInfo | null>;
  /**
   * Prepares the file by downloading it on this host; resolves when it is ready (verified),
   * rejects when it failed (the file stays `failed` with the reason) or was cancelled.
   * A ready file with the same ref is reused as it is. BUSY if a preparation of it runs.
   *
   * @throws MooringError BUSY, CHECKSUM_MISMATCH, DOWNLOAD_FAILED, CANCELLED, the image reader's codes (a file it refuses), INVALID_ARGUMENT
   */
  downloadBackingImageFile(ref: BackingImageFileRef, options: BackingImageDownloadOptions): Promise<BackingImageFileInfo>;
  /**
   * Prepares the file from a stream of its bytes (an upload, or a copy from another data
   * engine); resolves when all `sizeBytes` arrived and the file is verified. A stream that
   * ends early leaves the partial file for a resume (`offset` = its `receivedBytes`).
   *
   * @throws MooringError INVALID_ARGUMENT (a write at the wrong offset, past `sizeBytes`, or a chunk that is not bytes), UNAVAILABLE (the stream ended early; the partial file is kept), BUSY, CHECKSUM_MISMATCH, CANCELLED
   */
  writeBackingImageFile(ref: BackingImageFileRef, options: BackingImageWriteOptions, data: AsyncIterable<Uint8Array>): Promise<BackingImageFileInfo>;
  /**
   * Reads a ready file from `offset` (default 0) to its end, in chunks of
   * `limits.BACKING_IMAGE_FILE_LIMITS.readChunkBytes` (1 MiB).
   *
   * @throws MooringError NOT_FOUND, INVALID_STATE (not ready), BUSY (3 reads of the file run already)
   */
  readBackingImageFile(ref: BackingImageFileRef, options?: { offset?: number }): AsyncIterable<Uint8Array>;
  /**
   * Prepares the file by reading it from another data engine directly (data engine to data
   * engine, its `readBackingImageFile` stream over gRPC with this data engine's own TLS
   * certificate and cluster secret): as {@link writeBackingImageFile} with that stream, the
   * bytes never pass through the caller. Resume with `offset` = this disk's `receivedBytes`.
   * A data engine of a release before this call answers UNSUPPORTED (gRPC UNIMPLEMENTED):
   * the caller relays instead (docs/backing-images.md, "Delivery").
   *
   * @throws MooringError as writeBackingImageFile, and the source's errors: UNAUTHENTICATED
   * (the source refused our credentials), UNAVAILABLE (unreachable), NOT_FOUND, INVALID_STATE, BUSY
   */
  pullBackingImageFile?(ref: BackingImageFileRef, options: BackingImagePullOptions): Promise<BackingImageFileInfo>;
  /**
   * Prepares the file from a snapshot of a volume whose active engine runs here (a raw
   * image of the volume's content as of the snapshot).
   */
  exportSnapshotToBackingImageFile(volume: string, snapshot: string, ref: BackingImageFileRef, options?: { expectedChecksum?: string }): Promise<BackingImageFileInfo>;
  /** Stops a preparation in progress (it fails with CANCELLED; a partial file is kept for a resume). No-op otherwise. */
  cancelBackingImageFile(ref: BackingImageFileRef): Promise<void>;
  /** Deletes the file (cancelling a preparation). BUSY while a replica on this disk uses it; no-op if absent. */
  deleteBackingImageFile(ref: BackingImageFileRef): Promise<void>;

  /** Subscribes to events; returns the unsubscribe function. */
  watch(listener: (event: DataEngineEvent) => void): () => void;
  /**
   * Local: stops engines and the replica server. Remote: closes the connection (the
   * data-engine process and its engines keep running). Idempotent.
   */
  close(): Promise<void>;
}
