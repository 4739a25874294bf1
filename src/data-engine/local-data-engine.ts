import { randomUUID } from 'node:crypto';
import { readdir, rm } from 'node:fs/promises';
import { isAbsolute, join, resolve } from 'node:path';

import { MooringError, callNative, codeFromErrno, toMooringError } from '../errors.js';
import type { ReplicaServerStats } from '../native/replica-server-stats.js';
import { LocalEngine, type EngineReplicaSpec, type RebuildEvent, type RebuildFailedEvent, type SalvagedEvent } from '../engine/engine.js';
import type { NativeAddon, NativeNbdHandOffRecord, NativeReplicaInfo, NativeReplicaServer } from '../native/binding.js';
import { loadAddon, packageVersion } from '../native/load.js';
import { DOWNLOAD_DEFAULTS, checkDownloadSettings, type DownloadSettings } from '../backing-image/download.js';
import { NBD_LIMITS, type NbdExport } from '../nbd/nbd-export.js';
import { ensureDirectory, pathExists, readFileLimited, writeFileAtomic } from '../util/files.js';
import { QUORUM_HOLD_MS_MAX, REPLICA_COUNT_MAX, REPLICA_COUNT_MIN } from '../util/limits.js';
import { checkEpoch, checkIntIn, checkLabels, checkName, checkVolumeSize, describe } from '../util/validate.js';
import { VolumeLock } from '../volume/volume-lock.js';
import {
  checkLoopbackRule,
  checkTls,
  formatTcpAddress,
  parseTcpAddress,
  type DataEngineTlsOptions,
  type TcpAddress,
} from './addresses.js';
import { BACKING_IMAGES_SUBDIR, BackingImageFiles } from './backing-image-files.js';
import { checkPullSource, openPullSource } from './backing-image-pull.js';
import { checkClusterSecret, processClusterSecret } from './cluster-secret.js';
import { ExportHold } from './export-hold.js';
import type {
  BackingImageDownloadOptions,
  BackingImageFileInfo,
  BackingImageFileRef,
  BackingImagePullOptions,
  BackingImageWriteOptions,
  DataEngine,
  DataEngineEvent,
  DataEngineInfo,
  EngineActivateOptions,
  EngineHandOver,
  EngineInfo,
  EngineNbdStats,
  EngineReplicaInfo,
  EngineReplicaRef,
  EngineSnapshotInfo,
  EngineStartOptions,
  HostedReplicaInfo,
  RebuildProgress,
  RebuildResult,
  ReplicaCreateOptions,
  SnapshotCopyResult,
  ReplicaRemoveOptions,
} from './data-engine.js';
import { checkReplicaBackingImage } from './replica-backing-image.js';
import { growReplicaDir, whenReleased } from './replica-grow.js';
import { Semaphore } from './semaphore.js';
import { visibleSnapshots } from './snapshots.js';
import { checkLogger, safeLog, type Logger } from '../util/logger.js';

/** Defaults of {@link LocalDataEngineOptions}. */
export const DATA_ENGINE_DEFAULTS = {
  /** Replica server address: loopback, any free port. */
  replicaListen: 'tcp:127.0.0.1:0',
  /** Rebuilds running at once across all engines of one data engine. */
  maxConcurrentRebuilds: 2,
  /** Snapshot exports and copies at once across all engines (each holds a libuv pool thread throughout). */
  maxConcurrentSnapshotCopies: 2,
  /** Self-repair: first re-add of an ERR replica after this long. */
  repairFirstRetryMs: 1000,
  /** Self-repair: the back-off doubles up to this interval, then retries at it until the replica is RW or removed. */
  repairMaxRetryMs: 15_000,
  /** LocalEngine-to-replica I/O timeout for remote replicas. */
  ioTimeoutMs: 8000,
  /**
   * NBD worker threads of an engine with remote replicas. Where one of its RW replicas is
   * in this process, a write's worker waits for the remote replicas' round trips (the local
   * copy is written after they accepted), and a flush's always does, so the default 4 would
   * cap those in flight at 4. (Reads and writes of an engine whose RW replicas are all
   * remote hold no worker: the replicas' answers finish them.) Local replicas answer from
   * the page cache and keep the NBD default.
   */
  nbdIoThreadsRemote: 32,
  /**
   * How long the export of an engine that handed over holds its clients' requests (unread)
   * before refusing them; see src/data-engine/export-hold.ts. Rollback and confirm end it
   * sooner.
   */
  handOverHoldMs: 300_000,
  /** How long the hand-over waits for the export to reach a request boundary before it goes on without holding. */
  handOverFreezeMs: 2000,
  /** Request and reply bytes the replica server holds at once, across all its connections (docs/hardening.md). */
  replicaServerBufferBytesMax: 256 * 1024 * 1024,
  /**
   * Connections the replica server holds at once: one per replica it serves to an engine on
   * another host (its data path) and per rebuild, so a host holding replicas of a thousand
   * volumes whose engines run elsewhere needs about as many. The native default (256) capped
   * a 3-host cluster at about 385 three-replica volumes per host (the scale benchmark's
   * NO_QUORUM at volume 385).
   */
  replicaServerConnectionsMax: 4096,
  /** READ and WRITE data one NBD export holds at once, across all its connections. */
  nbdExportBufferBytesMax: 128 * 1024 * 1024,
} as const;

/** Bounds of {@link LocalDataEngineOptions}. */
export const DATA_ENGINE_LIMITS = {
  /** Largest `maxConcurrentRebuilds`. */
  maxConcurrentRebuildsMax: 64,
  /** Rebuilds waiting for a permit (all engines); more is refused with BUSY. */
  rebuildWaitersMax: 4096,
  /** Largest `maxConcurrentSnapshotCopies`. */
  maxConcurrentSnapshotCopiesMax: 16,
  /** Snapshot exports and copies waiting for a permit; more is refused with BUSY. */
  snapshotCopyWaitersMax: 1024,
  /** Shortest `repair.firstRetryMs` and `repair.maxRetryMs`. */
  repairRetryMsMin: 10,
  /** Longest `repair.firstRetryMs` and `repair.maxRetryMs`. */
  repairRetryMsMax: 3_600_000,
  /** Shortest engine-to-replica I/O timeout. */
  ioTimeoutMsMin: 100,
  /** Longest engine-to-replica I/O timeout. */
  ioTimeoutMsMax: 600_000,
  /** Listeners of {@link LocalDataEngine.watch}. */
  watchersMax: 1024,
  /** Replicas one data engine lists (a directory with more is refused). */
  replicasMax: 100_000,
  /** Longest `handOverHoldMs` (a day). */
  handOverHoldMsMax: 86_400_000,
  /** Smallest `replicaServerBufferBytesMax` (two largest replica-protocol requests). */
  replicaServerBufferBytesMaxMin: 8 * 1024 * 1024,
  /** Largest `replicaServerBufferBytesMax`. */
  replicaServerBufferBytesMaxMax: 64 * 1024 * 1024 * 1024,
} as const;

/** The file recording who owns a data engine directory. */
export const DATA_ENGINE_FILE = 'data-engine.json';
/** The lock file of a data engine directory. */
export const DATA_ENGINE_LOCK_FILE = 'data-engine.lock';
/** Subdirectory holding the replicas (served by the replica server). */
export const DATA_ENGINE_REPLICAS_SUBDIR = 'replicas';
const DATA_ENGINE_FORMAT = 'mooring-data-engine';
const DATA_ENGINE_FILE_BYTES_MAX = 64 * 1024;
const DISK_ID_PATTERN = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Self-repair settings of {@link LocalDataEngineOptions}. */
export interface DataEngineRepairOptions {
  /** Re-add ERR replicas without being asked (default true). */
  enabled?: boolean;
  /** Delay of the first attempt after a replica goes ERR (default 1000 ms). */
  firstRetryMs?: number;
  /** Largest delay between attempts; the delay doubles up to it (default 15000 ms). */
  maxRetryMs?: number;
}

/** Options of {@link LocalDataEngine.start}. */
export interface LocalDataEngineOptions {
  /** Directory the data engine owns (created if missing). */
  dir: string;
  /** This host's id, as other hosts name it in {@link EngineReplicaRef.hostId} ([A-Za-z0-9._-]{1,63}). */
  hostId: string;
  /** Replica server address `tcp:HOST:PORT` (default tcp:127.0.0.1:0); null: serve no replicas to other hosts. */
  replicaListen?: string | null;
  /**
   * Mutual TLS for the replica server, for reaching other hosts' replicas, and for NBD
   * exports on TCP addresses (clients negotiate STARTTLS with a certificate from `ca`).
   */
  tls?: DataEngineTlsOptions;
  /**
   * The cluster secret (16 to 1024 bytes) every data engine of the cluster shares: the
   * replica server requires clients to prove it, and this data engine proves it to the
   * replica servers it reaches, both before any request (docs/data-engine.md,
   * "Authentication"). Default: a secret made once per process and shared by the data
   * engines of this process only (so another process can reach none of their replicas).
   * `null`: no authentication, for a cluster with data engines of a release before it.
   */
  clusterSecret?: Uint8Array | null;
  /**
   * Allow a non-loopback replica server, and NBD exports on non-loopback TCP addresses,
   * without TLS (default false: they carry the disks' data unauthenticated).
   */
  allowInsecureRemote?: boolean;
  /** Rebuilds at once across all engines (default 2, at most 64). */
  maxConcurrentRebuilds?: number;
  /** Snapshot exports and copies at once across all engines (default 2, at most 16); later ones wait their turn. */
  maxConcurrentSnapshotCopies?: number;
  /** Self-repair settings. */
  repair?: DataEngineRepairOptions;
  /**
   * How long, in ms, the NBD export of an engine that handed its volume over holds the
   * requests its clients still send, until a rollback serves them or a confirm closes the
   * connections (default 300000; 0: refuse them at once with NBD EPERM).
   */
  handOverHoldMs?: number;
  /**
   * The group (gid) given the NBD unix sockets of this data engine's exports, made 0660 so
   * that QEMU running as another user of that group can connect; without it they are 0600
   * (this process's user only). See `NbdExportOptions.socketGroup`.
   */
  nbdSocketGroup?: number;
  /**
   * Request and reply bytes the replica server holds at once across all its connections
   * (default {@link DATA_ENGINE_DEFAULTS}.replicaServerBufferBytesMax, 256 MiB): past it a
   * connection stops reading until its own requests are answered. Bounds what peers that
   * send and never read can make this process hold.
   */
  replicaServerBufferBytesMax?: number;
  /**
   * The same bound for each NBD export of this data engine (default 128 MiB; at least
   * 32 MiB, one largest request). See `NbdExportOptions.bufferBytesMax`.
   */
  nbdExportBufferBytesMax?: number;
  /**
   * Timing of backing image downloads on this disk (start and stall timeouts, retries and
   * back-off, redirects, extra CA certificates); defaults in DOWNLOAD_DEFAULTS. A call's own
   * startTimeoutMs and retries take precedence. `stallTimeoutMs` also bounds a pull from
   * another data engine ({@link LocalDataEngine.pullBackingImageFile}): no chunk for that
   * long fails it UNAVAILABLE, the partial file kept for a resume.
   */
  backingImageDownload?: DownloadSettings;
  /**
   * Where this data engine logs its own life (started, closed: debug; a failed close: warn) (docs/logging.md): a pino
   * logger or anything with pino's level methods and `child()`. Default: none. Its events
   * ({@link LocalDataEngine.watch}) are logged by whoever watches them: a
   * {@link Mooring} that has this host, or `mooring data-engine`.
   */
  logger?: Logger;
  /** The native addon (default: this package's). Tests inject a fake. */
  addon?: NativeAddon;
}

interface RepairState {
  attempt: number;
  delayMs: number;
  phase: 'idle' | 'waiting' | 'busy';
  timer?: NodeJS.Timeout;
  /** The attempt in progress (phase busy). */
  promise?: Promise<RebuildResult>;
}

/**
 * An engine handed over by {@link LocalDataEngine.detachEnginesForHandOff}: how to start it
 * again, its frozen export (kept for a rollback) and the record the successor adopts.
 *
 * @internal
 */
export interface HandedEngine {
  volume: string;
  refs: EngineReplicaRef[];
  ioTimeoutMs: number;
  quorumHoldMs: number | undefined;
  nbd: { export: NbdExport; record: NativeNbdHandOffRecord } | null;
}

// DataEngineInfo.instanceId: one per process, so a data engine reopened in the same process
// (a rolled-back hand-off) still reads as the process that was there.
const PROCESS_INSTANCE_ID = randomUUID();

/** Requests of one kind on an NBD export ({@link NbdIoStats}). */
export interface NbdOpStats {
  /** Requests executed (replied to, successfully or not). */
  count: number;
  /** Of which answered with an NBD error. */
  errors: number;
  /** Their device time in all, in nanoseconds: a worker taking the request to its reply being queued. */
  sumNs: number;
  /** That time in log2 buckets, not cumulative: `buckets[i]` counts requests that took at most 2^i µs (more than 2^(i-1)); the last bucket holds the rest. */
  buckets: number[];
}

/** Per request kind counters of an NBD export, and its memory budget. */
export interface NbdIoStats {
  /** Per request kind. */
  ops: {
    /** READ. */
    read: NbdOpStats;
    /** WRITE. */
    write: NbdOpStats;
    /** FLUSH. */
    flush: NbdOpStats;
    /** TRIM. */
    trim: NbdOpStats;
    /** WRITE_ZEROES. */
    writeZeroes: NbdOpStats;
    /** CACHE, BLOCK_STATUS and unknown commands. */
    other: NbdOpStats;
  };
  /** The export's budget of READ/WRITE bytes in flight across its connections. */
  budgetLimitBytes: number;
  /** Bytes of it held now. */
  budgetUsedBytes: number;
  /** The most held at once since the export started. */
  budgetPeakBytes: number;
  /** Requests that had to wait for the budget (back-pressure). */
  budgetWaits: number;
  /** READs the connection loop answered itself, without a worker (page cache of a local replica). */
  inlineReads: number;
  /** WRITEs the connection loop started itself, without a worker (small ones, all replicas on other hosts). */
  loopWrites: number;
  /** READs and WRITEs started in groups of two or more, one message per remote replica for each group. */
  groupedRequests: number;
}


/** An engine's NBD export as {@link LocalDataEngine.ioStats} reports it. */
export interface EngineIoStats {
  /** The volume the engine serves. */
  volume: string;
  /** active, or standby (a migration standby, or an engine that handed over). */
  role: 'active' | 'standby';
  /** Connection and byte counters of its export. */
  nbd: EngineNbdStats;
  /** Per request kind counts and latencies, and the export's memory budget (null: the addon does not count them). */
  io: NbdIoStats | null;
}

/** What {@link LocalDataEngine.ioStats} reports: counters read from the data path at once, without I/O. */
export interface LocalDataEngineIoStats {
  /** The engines of this data engine that have an NBD export. */
  engines: EngineIoStats[];
  /** The replica server's counters (engines of other hosts connect to it), or null when it serves none. */
  replicaServer: ReplicaServerStats | null;
}

interface EngineSlot {
  volume: string;
  engine: LocalEngine;
  refs: EngineReplicaRef[];
  ioTimeoutMs: number;
  quorumHoldMs: number | undefined;
  nbd: NbdExport | null;
  progress: Map<string, RebuildProgress>;
  repairs: Map<string, RepairState>;
  /** Rebuilds of one engine run one after another (the native engine allows one). */
  serial: Promise<unknown>;
  stopping: boolean;
  /** standby: serves nothing and is not repaired (opened as a standby, or handed over). */
  role: 'active' | 'standby';
  /** A deactivate or activate in progress (one at a time; repairs wait for its outcome). */
  handingOver: boolean;
  /** Handed over: the export holds what its clients send (null: none, or it refuses). */
  hold: ExportHold | null;
}

/**
 * The {@link DataEngine} of this host, in this process. It owns a directory
 * (`DIR/replicas/<name>/` per replica, `DIR/data-engine.json`, a lock), serves its replicas
 * to engines elsewhere through the native replica server, runs engines (one per volume,
 * each optionally exported over NBD), and repairs them: a replica that is ERR is re-added
 * (rebuilt) with back-off until it is RW again, rebuilds bounded across engines. Engines
 * may run as migration standbys (exported, serving nothing, repairing nothing) and hand a
 * volume over between hosts (deactivateEngine on the source, activateEngine on the target);
 * docs/data-engine.md, "Hand-over".
 */
export class LocalDataEngine implements DataEngine {
  /** Host id. */
  readonly hostId: string;
  /** Directory it owns (absolute). */
  readonly dir: string;
  readonly #replicasDir: string;
  readonly #diskId: string;
  readonly #addon: NativeAddon;
  readonly #lock: VolumeLock;
  readonly #tls: DataEngineTlsOptions | undefined;
  readonly #clusterSecret: Buffer | undefined;
  readonly #server: NativeReplicaServer | null;
  readonly #replicaAddress: TcpAddress | null;
  readonly #rebuilds: Semaphore;
  readonly #snapshotCopies: Semaphore;
  readonly #repair: Required<DataEngineRepairOptions>;
  readonly #handOverHoldMs: number;
  readonly #nbdSocketGroup: number | undefined;
  readonly #nbdExportBufferBytesMax: number;
  readonly #allowInsecureRemote: boolean;
  readonly #engines = new Map<string, EngineSlot>();
  readonly #starting = new Set<string>();
  readonly #replicaOps = new Set<string>();
  readonly #listeners = new Set<(event: DataEngineEvent) => void>();
  /** Backing image files on this disk (set by start(), right after construction). */
  #files!: BackingImageFiles;
  /** A pull from another data engine fails when no chunk comes for this long (backingImageDownload.stallTimeoutMs). */
  #pullStallMs: number = DOWNLOAD_DEFAULTS.stallTimeoutMs;
  #closing: Promise<void> | undefined;

  readonly #log: Logger;

  private constructor(init: {
    hostId: string;
    dir: string;
    diskId: string;
    addon: NativeAddon;
    lock: VolumeLock;
    tls: DataEngineTlsOptions | undefined;
    clusterSecret: Buffer | undefined;
    server: NativeReplicaServer | null;
    replicaAddress: TcpAddress | null;
    maxConcurrentRebuilds: number;
    maxConcurrentSnapshotCopies: number;
    repair: Required<DataEngineRepairOptions>;
    handOverHoldMs: number;
    allowInsecureRemote: boolean;
    nbdSocketGroup: number | undefined;
    nbdExportBufferBytesMax: number;
    log: Logger;
  }) {
    this.#log = init.log;
    this.hostId = init.hostId;
    this.dir = init.dir;
    this.#diskId = init.diskId;
    this.#replicasDir = join(init.dir, DATA_ENGINE_REPLICAS_SUBDIR);
    this.#addon = init.addon;
    this.#lock = init.lock;
    this.#tls = init.tls;
    this.#clusterSecret = init.clusterSecret;
    this.#server = init.server;
    this.#replicaAddress = init.replicaAddress;
    this.#rebuilds = new Semaphore(init.maxConcurrentRebuilds, DATA_ENGINE_LIMITS.rebuildWaitersMax);
    this.#snapshotCopies = new Semaphore(init.maxConcurrentSnapshotCopies, DATA_ENGINE_LIMITS.snapshotCopyWaitersMax);
    this.#repair = init.repair;
    this.#handOverHoldMs = init.handOverHoldMs;
    this.#allowInsecureRemote = init.allowInsecureRemote;
    this.#nbdSocketGroup = init.nbdSocketGroup;
    this.#nbdExportBufferBytesMax = init.nbdExportBufferBytesMax;
  }

  /**
   * Starts the data engine of this host: locks `dir` (one data engine per directory),
   * checks that it belongs to `hostId`, and starts the replica server.
   *
   * @throws MooringError INVALID_ARGUMENT (options; a non-loopback replicaListen without
   *   TLS; a directory of another host), BUSY (dir in use), ADDRESS_IN_USE, NATIVE_LOAD_FAILED
   */
  static async start(options: LocalDataEngineOptions): Promise<LocalDataEngine> {
    if (typeof options !== 'object' || options === null) {
      throw new MooringError('INVALID_ARGUMENT', `data engine options must be an object (got ${describe(options)})`);
    }
    if (typeof options.dir !== 'string' || options.dir.length === 0 || options.dir.includes('\0')) {
      throw new MooringError('INVALID_ARGUMENT', `dir must be a path (got ${describe(options.dir)})`);
    }
    const dir = isAbsolute(options.dir) ? resolve(options.dir) : resolve(process.cwd(), options.dir);
    const hostId = checkName('hostId', options.hostId);
    const tls = checkTls(options.tls);
    const clusterSecret = options.clusterSecret === null ? undefined : (checkClusterSecret(options.clusterSecret) ?? processClusterSecret());
    const allowInsecure = options.allowInsecureRemote === true;
    const listen = options.replicaListen === undefined ? DATA_ENGINE_DEFAULTS.replicaListen : options.replicaListen;
    const listenAddress = listen === null ? null : parseTcpAddress(listen, 'replicaListen', true);
    if (listenAddress) checkLoopbackRule('replicaListen', listenAddress.host, tls !== undefined, allowInsecure);
    const maxConcurrentRebuilds = checkIntIn(
      'maxConcurrentRebuilds',
      options.maxConcurrentRebuilds,
      1,
      DATA_ENGINE_LIMITS.maxConcurrentRebuildsMax,
      DATA_ENGINE_DEFAULTS.maxConcurrentRebuilds,
    );
    const maxConcurrentSnapshotCopies = checkIntIn(
      'maxConcurrentSnapshotCopies',
      options.maxConcurrentSnapshotCopies,
      1,
      DATA_ENGINE_LIMITS.maxConcurrentSnapshotCopiesMax,
      DATA_ENGINE_DEFAULTS.maxConcurrentSnapshotCopies,
    );
    const r = options.repair ?? {};
    if (typeof r !== 'object' || r === null) throw new MooringError('INVALID_ARGUMENT', `repair must be an object (got ${describe(r)})`);
    const { repairRetryMsMin: lo, repairRetryMsMax: hi } = DATA_ENGINE_LIMITS;
    const repair: Required<DataEngineRepairOptions> = {
      enabled: r.enabled !== false,
      firstRetryMs: checkIntIn('repair.firstRetryMs', r.firstRetryMs, lo, hi, DATA_ENGINE_DEFAULTS.repairFirstRetryMs),
      maxRetryMs: checkIntIn('repair.maxRetryMs', r.maxRetryMs, lo, hi, DATA_ENGINE_DEFAULTS.repairMaxRetryMs),
    };
    if (repair.maxRetryMs < repair.firstRetryMs) {
      throw new MooringError('INVALID_ARGUMENT', `repair.maxRetryMs (${repair.maxRetryMs}) must be at least repair.firstRetryMs (${repair.firstRetryMs})`);
    }
    const handOverHoldMs = checkIntIn('handOverHoldMs', options.handOverHoldMs, 0, DATA_ENGINE_LIMITS.handOverHoldMsMax, DATA_ENGINE_DEFAULTS.handOverHoldMs);
    const replicaServerBufferBytesMax = checkIntIn(
      'replicaServerBufferBytesMax',
      options.replicaServerBufferBytesMax,
      DATA_ENGINE_LIMITS.replicaServerBufferBytesMaxMin,
      DATA_ENGINE_LIMITS.replicaServerBufferBytesMaxMax,
      DATA_ENGINE_DEFAULTS.replicaServerBufferBytesMax,
    );
    const nbdExportBufferBytesMax = checkIntIn('nbdExportBufferBytesMax', options.nbdExportBufferBytesMax, NBD_LIMITS.bufferBytesMaxMin, NBD_LIMITS.bufferBytesMaxMax, DATA_ENGINE_DEFAULTS.nbdExportBufferBytesMax);
    const nbdSocketGroup = options.nbdSocketGroup === undefined ? undefined : checkIntIn('nbdSocketGroup', options.nbdSocketGroup, 0, NBD_LIMITS.groupIdMax, 0);
    const log = checkLogger('logger', options.logger);
    const addon = options.addon ?? loadAddon();

    await ensureDirectory(join(dir, DATA_ENGINE_REPLICAS_SUBDIR));
    const lock = await VolumeLock.acquire(dir, {
      file: DATA_ENGINE_LOCK_FILE,
      what: 'data engine directory',
      hint: 'another data engine (`mooring data-engine` or an embedding process) uses it; stop it first',
    });
    let server: NativeReplicaServer | null = null;
    try {
      const diskId = await claimDirectory(dir, hostId);
      let replicaAddress: TcpAddress | null = null;
      if (listenAddress) {
        if (typeof addon.startReplicaServer !== 'function') {
          throw new MooringError('UNSUPPORTED', 'this build of the native addon has no replica server; start the data engine with replicaListen: null (--replica-listen none)');
        }
        server = await callNative(
          () =>
            addon.startReplicaServer({
              root: join(dir, DATA_ENGINE_REPLICAS_SUBDIR),
              backingFilesRoot: join(dir, BACKING_IMAGES_SUBDIR),
              host: listenAddress.host,
              port: listenAddress.port,
              bufferBytesMax: replicaServerBufferBytesMax,
              maxConnections: DATA_ENGINE_DEFAULTS.replicaServerConnectionsMax,
              ...(tls ? { tls: { ...tls, serverName: '' } } : {}),
              ...(clusterSecret ? { clusterSecret } : {}),
            }),
          `starting the replica server on ${formatTcpAddress(listenAddress)}`,
        );
        replicaAddress = { host: listenAddress.host, port: server.port };
      }
      const de = new LocalDataEngine({ hostId, dir, diskId, addon, lock, tls, clusterSecret, server, replicaAddress, maxConcurrentRebuilds, maxConcurrentSnapshotCopies, repair, handOverHoldMs, allowInsecureRemote: allowInsecure, nbdSocketGroup, nbdExportBufferBytesMax, log });
      de.#pullStallMs = checkDownloadSettings(options.backingImageDownload, 'backingImageDownload').stallTimeoutMs;
      de.#files = await BackingImageFiles.open({
        dir,
        addon,
        emit: (e) => de.#emit(e),
        usedBy: () => de.#backingImageUsers(),
        exportSnapshot: (volume, snapshot, path) => de.exportSnapshot(volume, snapshot, path),
        ...(options.backingImageDownload !== undefined ? { download: options.backingImageDownload } : {}),
      });
      const replicas = replicaAddress ? formatTcpAddress(replicaAddress) : null;
      safeLog(log, 'debug', { hostId, dir, replicaAddress: replicas, tls: tls !== undefined, clusterSecret: clusterSecret !== undefined }, `data engine ${hostId} started in ${dir}${replicas ? `, replicas at ${replicas}` : ''}`);
      return de;
    } catch (err) {
      if (server) await server.close().catch(() => undefined);
      await lock.release();
      throw err;
    }
  }

  /**
   * The counters of the data path, read synchronously from the native side (no I/O, no
   * waiting): each exported engine's NBD counters and latency buckets, and the replica
   * server's. For metrics (docs/metrics.md); a closed data engine reports nothing.
   */
  ioStats(): LocalDataEngineIoStats {
    const engines: EngineIoStats[] = [];
    if (this.#closing !== undefined) return { engines, replicaServer: null };
    for (const slot of this.#engines.values()) {
      const nbd = slot.nbd;
      if (!nbd || nbd.closed) continue;
      try {
        engines.push({ volume: slot.volume, role: slot.role, nbd: { ...nbd.stats() }, io: nbd.ioStats() });
      } catch {
        // closed meanwhile: it has no export to report
      }
    }
    let replicaServer: ReplicaServerStats | null = null;
    try {
      replicaServer = this.#server ? { ...this.#server.stats() } : null;
    } catch {
      replicaServer = null;
    }
    return { engines, replicaServer };
  }

  /** @inheritDoc DataEngine.info */
  async info(): Promise<DataEngineInfo> {
    this.#assertOpen();
    return {
      hostId: this.hostId,
      version: packageVersion(),
      dir: this.dir,
      replicaAddress: this.#replicaAddress ? formatTcpAddress(this.#replicaAddress) : null,
      tls: this.#tls !== undefined,
      instanceId: PROCESS_INSTANCE_ID,
      diskId: this.#diskId,
      features: [],
    };
  }

  /** @inheritDoc DataEngine.createReplica */
  async createReplica(name: string, sizeBytes: number, options: ReplicaCreateOptions = {}): Promise<HostedReplicaInfo> {
    this.#assertOpen();
    checkName('replica name', name);
    checkVolumeSize(sizeBytes);
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `replica options must be an object (got ${describe(options)})`);
    const backingImage = options.backingImage === undefined ? undefined : checkReplicaBackingImage(options.backingImage, sizeBytes);
    if (backingImage) {
      const b = backingImage;
      const file = this.#files.readyFile(b.dir);
      if (!file) {
        if (this.#files.has(b.dir)) throw new MooringError('INVALID_STATE', `backing image file ${b.dir} is not ready on ${this.hostId}`, { details: { dir: b.dir } });
        throw new MooringError('NOT_FOUND', `no backing image file ${b.dir} on ${this.hostId}`, { details: { dir: b.dir } });
      }
      if (file.format !== b.format || file.virtualSizeBytes !== b.virtualSizeBytes) {
        throw new MooringError('INVALID_ARGUMENT', `backing image file ${b.dir} is ${file.format} of ${file.virtualSizeBytes} bytes, not ${b.format} of ${b.virtualSizeBytes}`);
      }
    }
    return this.#withReplicaOp(name, async () => {
      const path = join(this.#replicasDir, name);
      if (await pathExists(path)) throw new MooringError('ALREADY_EXISTS', `replica ${name} exists on ${this.hostId} (${path})`, { details: { name } });
      try {
        await callNative(() => this.#addon.createReplica(path, sizeBytes, backingImage ? { backingImage } : undefined), `creating replica ${name}`);
      } catch (err) {
        // Leave no half-made replica behind to be mistaken for one.
        await rm(path, { recursive: true, force: true }).catch(() => undefined);
        throw err;
      }
      return this.#hosted(name, await this.#inspect(name));
    });
  }

  /** @inheritDoc DataEngine.deleteReplica */
  async deleteReplica(name: string): Promise<void> {
    this.#assertOpen();
    checkName('replica name', name);
    return this.#withReplicaOp(name, async () => {
      const path = join(this.#replicasDir, name);
      if (!(await pathExists(path))) throw new MooringError('NOT_FOUND', `no replica ${name} on ${this.hostId}`, { details: { name } });
      const user = this.#engineUsing(name);
      if (user) throw new MooringError('BUSY', `replica ${name} is open in the engine of volume ${user}; stop it first`, { details: { name, volume: user } });
      await whenReleased(async () => {
        const info = await this.#inspect(name).catch((err: unknown) => {
          // A replica that cannot be read at all (half-created, damaged) may still be deleted.
          if (err instanceof MooringError && (err.code === 'NOT_FOUND' || err.code === 'CORRUPT_METADATA')) return undefined;
          throw err;
        });
        if (info && info.users > 0) {
          throw new MooringError('BUSY', `replica ${name} is in use (${info.users} open handles, e.g. served to an engine on another host)`, { details: { name } });
        }
      });
      await rm(path, { recursive: true, force: true }).catch((err: unknown) => Promise.reject(toMooringError(err, `deleting replica ${name}`)));
    });
  }

  /** @inheritDoc DataEngine.growReplica */
  async growReplica(name: string, sizeBytes: number): Promise<HostedReplicaInfo> {
    this.#assertOpen();
    checkName('replica name', name);
    checkVolumeSize(sizeBytes);
    return this.#withReplicaOp(name, async () => {
      const path = join(this.#replicasDir, name);
      if (!(await pathExists(path))) throw new MooringError('NOT_FOUND', `no replica ${name} on ${this.hostId}`, { details: { name } });
      const user = this.#engineUsing(name);
      if (user) throw new MooringError('BUSY', `replica ${name} is open in the engine of volume ${user}: resize through that engine`, { details: { name, volume: user } });
      await growReplicaDir(this.#addon, path, name, sizeBytes);
      return this.#hosted(name, await this.#inspect(name));
    });
  }

  /** @inheritDoc DataEngine.listReplicas */
  async listReplicas(): Promise<HostedReplicaInfo[]> {
    this.#assertOpen();
    const entries = await readdir(this.#replicasDir, { withFileTypes: true }).catch((err: unknown) =>
      Promise.reject(toMooringError(err, `listing ${this.#replicasDir}`)),
    );
    const names = entries
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
      .filter((n) => {
        try {
          checkName('replica name', n);
          return true;
        } catch {
          return false;
        }
      })
      .sort();
    if (names.length > DATA_ENGINE_LIMITS.replicasMax) {
      throw new MooringError('INVALID_STATE', `${this.#replicasDir} holds ${names.length} replicas, more than the ${DATA_ENGINE_LIMITS.replicasMax} listed`);
    }
    const out: HostedReplicaInfo[] = [];
    for (const name of names) {
      if (this.#replicaOps.has(name)) continue;
      try {
        out.push(this.#hosted(name, await this.#inspect(name)));
      } catch (err) {
        // A directory without replica metadata (a create that crashed) is not a replica.
        if (err instanceof MooringError && err.code === 'NOT_FOUND') continue;
        throw err;
      }
    }
    return out;
  }

  /** Whether an engine's NBD export here is served over TLS (it could not be handed off in place). */
  servesTlsExports(): boolean {
    for (const slot of this.#engines.values()) if (slot.nbd?.tls === true) return true;
    return false;
  }

  /** @inheritDoc DataEngine.startEngine */
  async startEngine(options: EngineStartOptions): Promise<EngineInfo> {
    this.#assertOpen();
    if (typeof options !== 'object' || options === null) {
      throw new MooringError('INVALID_ARGUMENT', `engine start options must be an object (got ${describe(options)})`);
    }
    const volume = checkName('volume', options.volume);
    const refs = checkRefs(options.replicas);
    const ioTimeoutMs = checkIntIn(
      'ioTimeoutMs',
      options.ioTimeoutMs,
      DATA_ENGINE_LIMITS.ioTimeoutMsMin,
      DATA_ENGINE_LIMITS.ioTimeoutMsMax,
      DATA_ENGINE_DEFAULTS.ioTimeoutMs,
    );
    const nbd = options.nbd ?? null;
    if (nbd !== null && typeof nbd !== 'string') throw new MooringError('INVALID_ARGUMENT', `nbd must be unix:PATH or tcp:HOST:PORT (got ${describe(nbd)})`);
    // A TCP export is served over TLS with this data engine's material; without it, only
    // loopback unless allowed (the disk would be served to anyone who can reach it).
    if (nbd !== null && nbd.startsWith('tcp:')) checkLoopbackRule('nbd', parseTcpAddress(nbd, 'nbd', true).host, this.#tls !== undefined, this.#allowInsecureRemote);
    if (options.standby !== undefined && typeof options.standby !== 'boolean') {
      throw new MooringError('INVALID_ARGUMENT', `standby must be a boolean (got ${describe(options.standby)})`);
    }
    const standby = options.standby === true;
    if (options.salvage !== undefined && typeof options.salvage !== 'boolean') {
      throw new MooringError('INVALID_ARGUMENT', `salvage must be a boolean (got ${describe(options.salvage)})`);
    }
    const salvage = options.salvage === true;
    if (salvage && standby) throw new MooringError('INVALID_ARGUMENT', 'salvage and standby exclude each other: a salvage start claims its epoch and serves (docs/salvage.md)');
    // The epoch comes from the caller, who allocated it; a standby claims none until activated.
    let epoch: number | undefined;
    if (standby) {
      if (options.epoch !== undefined) throw new MooringError('INVALID_ARGUMENT', `a standby claims no epoch (got epoch ${describe(options.epoch)}); activateEngine gives it one`);
    } else {
      epoch = checkEpoch('epoch', options.epoch);
    }
    const quorumHoldMs = options.quorumHoldMs === undefined ? undefined : checkIntIn('quorumHoldMs', options.quorumHoldMs, 0, QUORUM_HOLD_MS_MAX, 0);
    if (this.#engines.has(volume) || this.#starting.has(volume)) {
      throw new MooringError('ALREADY_EXISTS', `an engine for volume ${volume} runs on ${this.hostId} already`, { details: { volume } });
    }
    this.#starting.add(volume);
    try {
      const specs: EngineReplicaSpec[] = [];
      for (const ref of refs) {
        if (ref.hostId === this.hostId) {
          const user = this.#engineUsing(ref.name);
          if (user) throw new MooringError('BUSY', `replica ${ref.name} is open in the engine of volume ${user}`, { details: { name: ref.name, volume: user } });
          if (!(await pathExists(join(this.#replicasDir, ref.name)))) {
            throw new MooringError('NOT_FOUND', `replica ${ref.id}: no replica ${ref.name} on ${this.hostId}`, { details: { replicaId: ref.id, name: ref.name } });
          }
        }
        specs.push(this.#spec(ref, ioTimeoutMs));
      }
      // A standby opens replicas another engine (on another host) is writing: a replica of
      // this host that is served to that engine by our replica server is shared with it
      // (native/src/store/replica-registry.h), not refused as in use.
      const engine = await LocalEngine.open({
        replicas: specs,
        addon: this.#addon,
        ...(standby ? { standby } : { epoch }),
        ...(salvage ? { salvage } : {}),
        ...(quorumHoldMs !== undefined ? { quorumHoldMs } : {}),
      });
      const slot: EngineSlot = {
        volume,
        engine,
        refs,
        ioTimeoutMs,
        quorumHoldMs,
        nbd: null,
        progress: new Map(),
        repairs: new Map(),
        serial: Promise.resolve(),
        stopping: false,
        role: standby ? 'standby' : 'active',
        handingOver: false,
        hold: null,
      };
      this.#wire(slot);
      if (nbd !== null) {
        try {
          // A standby is exported too, so a migrating VM's destination can connect before
          // the hand-over; its requests fail with EPERM until activateEngine.
          const remote = refs.some((r) => r.hostId !== this.hostId);
          slot.nbd = await engine.exportNbd({
            nbd,
            ...(remote ? { ioThreads: DATA_ENGINE_DEFAULTS.nbdIoThreadsRemote } : {}),
            bufferBytesMax: this.#nbdExportBufferBytesMax,
            ...(this.#nbdSocketGroup !== undefined ? { socketGroup: this.#nbdSocketGroup } : {}),
            ...(this.#tls !== undefined && nbd.startsWith('tcp:') ? { tls: this.#tls } : {}),
          });
        } catch (err) {
          await engine.close().catch(() => undefined);
          throw err;
        }
      }
      this.#engines.set(volume, slot);
      this.#repairErr(slot, 'at engine start');
      return this.#engineInfo(slot);
    } finally {
      this.#starting.delete(volume);
    }
  }

  /**
   * In-place upgrade, the old process's side (docs/upgrade.md): freezes the NBD export of
   * every engine (clients stay connected, nothing in flight), detaches the exports, then
   * stops the engines (flushed, replicas marked clean). The exports stay frozen, with their
   * client connections, in the caller's hands: it sends them to the successor, or serves
   * them here again with {@link startEngineOver} if the successor fails.
   *
   * @internal
   * @throws MooringError INVALID_STATE (a standby or a hand-over in progress), BUSY (an export did not freeze in time: nothing changed)
   */
  async detachEnginesForHandOff(freezeTimeoutMs: number): Promise<HandedEngine[]> {
    this.#assertOpen();
    const slots = [...this.#engines.values()];
    const odd = slots.find((s) => s.role !== 'active' || s.handingOver || s.stopping)?.volume ?? [...this.#starting][0];
    if (odd !== undefined) throw new MooringError('INVALID_STATE', `the engine of ${odd} on ${this.hostId} is migrating, starting or stopping; hand over once it is settled`);
    const frozen: NbdExport[] = [];
    try {
      for (const s of slots) if (s.nbd) frozen.push(await s.nbd.freeze(freezeTimeoutMs).then(() => s.nbd!));
    } catch (err) {
      await Promise.allSettled(frozen.map((e) => e.unfreeze()));
      throw err;
    }
    const out: HandedEngine[] = [];
    for (const s of slots) {
      const nbd = s.nbd ? { export: s.nbd, record: await s.nbd.detach() } : null;
      out.push({ volume: s.volume, refs: s.refs.map((r) => ({ ...r })), ioTimeoutMs: s.ioTimeoutMs, quorumHoldMs: s.quorumHoldMs, nbd });
      s.nbd = null;
      await this.#stop(s);
    }
    return out;
  }

  /**
   * In-place upgrade, before {@link detachEnginesForHandOff}: flushes every engine while its
   * clients still run, so the flush in the frozen stop has only the last moments' writes to
   * make durable. A failure is left to that stop, which reports it; after `timeoutMs` it
   * stops waiting (the frozen stop flushes anyway).
   *
   * @internal
   */
  async flushEnginesBeforeHandOff(timeoutMs: number): Promise<void> {
    this.#assertOpen();
    let timer: NodeJS.Timeout | undefined;
    const bound = new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)));
    await Promise.race([Promise.allSettled([...this.#engines.values()].map((s) => s.engine.flush())), bound]);
    clearTimeout(timer);
  }

  /**
   * In-place upgrade: tells every engine elsewhere that reads a replica here to drain and
   * reconnect (replica protocol GOAWAY, docs/replica-protocol.md), so they reach the
   * successor's replica server at the same address without dropping the replica. Waits
   * until they have let go, or `timeoutMs`. Clients that predate GOAWAY are disconnected
   * (their replica goes ERR and is rebuilt, as after a crash).
   *
   * @internal
   */
  async goAwayReplicaClients(timeoutMs: number): Promise<{ goaway: number; timedOut: number; closed: number }> {
    this.#assertOpen();
    if (!this.#server) return { goaway: 0, timedOut: 0, closed: 0 };
    const server = this.#server;
    return callNative(() => server.goAway(timeoutMs), `data engine ${this.hostId}: sending GOAWAY to replica clients`);
  }

  /**
   * In-place upgrade: starts an engine (options as {@link startEngine}, without `nbd`) with
   * an export handed over by the old process (`record`: adopted frozen; the caller unfreezes
   * it once the hand-off is committed) or kept frozen by this one (`resume`, a rollback:
   * it serves again at once). Its clients carry on where they stopped.
   *
   * @internal
   */
  async startEngineOver(options: Omit<EngineStartOptions, 'nbd' | 'standby'>, from: { record: NativeNbdHandOffRecord } | { resume: NbdExport }): Promise<NbdExport> {
    await this.startEngine({ ...options, nbd: null });
    const slot = this.#slot(options.volume);
    try {
      if ('record' in from) slot.nbd = await slot.engine.adoptNbd(from.record, { bufferBytesMax: this.#nbdExportBufferBytesMax });
      else {
        await slot.engine.resumeExport(from.resume);
        slot.nbd = from.resume;
      }
    } catch (err) {
      await this.#stop(slot).catch(() => undefined);
      throw err;
    }
    return slot.nbd;
  }

  /** @inheritDoc DataEngine.stopEngine */
  async stopEngine(volume: string): Promise<void> {
    this.#assertOpen();
    await this.#stop(this.#slot(volume));
  }

  /** @inheritDoc DataEngine.engineInfo */
  async engineInfo(volume: string): Promise<EngineInfo> {
    this.#assertOpen();
    return this.#engineInfo(this.#slot(volume));
  }

  /** @inheritDoc DataEngine.listEngines */
  async listEngines(): Promise<EngineInfo[]> {
    this.#assertOpen();
    return [...this.#engines.values()]
      .filter((s) => !s.stopping)
      .sort((a, b) => (a.volume < b.volume ? -1 : 1))
      .map((s) => this.#engineInfo(s));
  }

  /** @inheritDoc DataEngine.addReplica */
  async addReplica(volume: string, replica: EngineReplicaRef): Promise<RebuildResult> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    const ref = checkRefs([replica])[0]!;
    if (slot.role === 'standby' || slot.handingOver) {
      throw new MooringError('INVALID_STATE', `the engine of ${volume} on ${this.hostId} is a standby (or handing over): it rebuilds nothing`, { details: { volume } });
    }
    const current = slot.refs.find((r) => r.id === ref.id);
    // The slot holds this very replica at this address (else: another replica takes the
    // slot, or the same one under a new address, its host back with another server address).
    const unchanged = current !== undefined && sameReplica(current, ref) && current.address === ref.address;
    const st = slot.repairs.get(ref.id);
    if (unchanged && st?.phase === 'busy' && st.promise) return st.promise;
    const clash = slot.refs.find((r) => r.id !== ref.id && sameReplica(r, ref));
    if (clash) throw new MooringError('INVALID_ARGUMENT', `replica ${ref.name} on ${ref.hostId} is in volume ${volume} already as ${clash.id}`);
    if (ref.hostId === this.hostId) {
      const user = this.#engineUsing(ref.name);
      if (user && user !== volume) throw new MooringError('BUSY', `replica ${ref.name} is open in the engine of volume ${user}`);
      if (!(await pathExists(join(this.#replicasDir, ref.name)))) throw new MooringError('NOT_FOUND', `no replica ${ref.name} on ${this.hostId}`);
    }
    if (current && !unchanged) {
      // What the slot held must not be RW.
      const mode = slot.engine.replicas().find((r) => r.id === ref.id)?.mode;
      if (mode === 'RW') throw new MooringError('INVALID_STATE', `replica ${ref.id} of ${volume} is RW; remove it before replacing it`);
      this.#cancelRepair(slot, ref.id);
      await slot.engine.removeReplica(ref.id).catch((err: unknown) => {
        if (!(err instanceof MooringError && err.code === 'NOT_FOUND')) throw err;
      });
      slot.refs = slot.refs.filter((r) => r.id !== ref.id);
    }
    if (!slot.refs.some((r) => r.id === ref.id)) {
      if (slot.refs.length >= REPLICA_COUNT_MAX) throw new MooringError('INVALID_ARGUMENT', `volume ${volume} has ${REPLICA_COUNT_MAX} replicas already`);
      slot.refs.push(ref);
    }
    this.#cancelRepair(slot, ref.id);
    return this.#attempt(slot, ref.id);
  }

  /** @inheritDoc DataEngine.removeReplica */
  async removeReplica(volume: string, replicaId: string, options: ReplicaRemoveOptions = {}): Promise<void> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    checkName('replica id', replicaId);
    const evenIfRw = options?.evenIfRw === true;
    if (!slot.refs.some((r) => r.id === replicaId)) throw new MooringError('NOT_FOUND', `volume ${volume} has no replica ${replicaId}`);
    const mode = slot.engine.replicas().find((r) => r.id === replicaId)?.mode;
    if (mode === 'RW' && !evenIfRw) throw new MooringError('INVALID_STATE', `replica ${replicaId} of ${volume} is RW; only ERR or rebuilding replicas can be removed`);
    this.#cancelRepair(slot, replicaId);
    // The engine refuses first (the only RW replica): the slot keeps it then.
    await slot.engine.removeReplica(replicaId, { evenIfRw }).catch((err: unknown) => {
      if (!(err instanceof MooringError && err.code === 'NOT_FOUND')) throw err;
    });
    slot.refs = slot.refs.filter((r) => r.id !== replicaId);
    slot.progress.delete(replicaId);
  }

  /** @inheritDoc DataEngine.resizeEngine */
  async resizeEngine(volume: string, sizeBytes: number): Promise<EngineInfo> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    checkVolumeSize(sizeBytes);
    if (slot.role === 'standby' || slot.handingOver) {
      throw new MooringError('INVALID_STATE', `the engine of ${volume} on ${this.hostId} is a standby (or handing over): it resizes nothing`, { details: { volume } });
    }
    // The NBD export asks the engine for the size at each handshake, so new connections see
    // the new size from here on.
    await slot.engine.resize(sizeBytes);
    return this.#engineInfo(slot);
  }

  /** @inheritDoc DataEngine.deactivateEngine */
  async deactivateEngine(volume: string): Promise<EngineHandOver> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    if (slot.handingOver) throw new MooringError('BUSY', `the engine of ${volume} is being deactivated or activated`, { details: { volume } });
    if (slot.role === 'standby') throw new MooringError('INVALID_STATE', `the engine of ${volume} on ${this.hostId} is a standby already`, { details: { volume } });
    slot.handingOver = true;
    // Pending repairs would rebuild into replicas the next writer owns; a rebuild already
    // running is stopped by the engine itself (its replica is left for the next writer).
    for (const id of [...slot.repairs.keys()]) this.#cancelRepair(slot, id);
    // The export stops reading first (what is in flight is answered by the writer), so
    // what its clients send from now on waits for a rollback instead of failing. A client
    // that keeps the freeze from happening in time costs the hold, not the hand-over.
    const hold = slot.nbd && this.#handOverHoldMs > 0 ? await ExportHold.start(slot.nbd, DATA_ENGINE_DEFAULTS.handOverFreezeMs, this.#handOverHoldMs).catch(() => null) : null;
    let h: EngineHandOver;
    try {
      h = await slot.engine.deactivate();
      slot.role = 'standby';
      slot.hold = hold;
      for (const id of [...slot.repairs.keys()]) this.#cancelRepair(slot, id);
    } catch (err) {
      // Still active (fenced, or its last replica failed to flush): repair as before.
      await hold?.release().catch(() => undefined);
      slot.handingOver = false;
      if (slot.engine.state === 'open' && !slot.stopping) this.#repairErr(slot, 'after a failed hand-over');
      throw err;
    }
    slot.handingOver = false;
    this.#emit({ type: 'engine-deactivated', volume, epoch: h.epoch });
    return { epoch: h.epoch, generation: h.generation, rwReplicaIds: [...h.rwReplicaIds] };
  }

  /** @inheritDoc DataEngine.activateEngine */
  async activateEngine(volume: string, handOver: EngineHandOver, options: EngineActivateOptions): Promise<EngineInfo> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    const h = checkHandOver(handOver);
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `activate options must be {epoch} (got ${describe(options)})`);
    const epoch = checkEpoch('epoch', options.epoch);
    if (slot.handingOver) throw new MooringError('BUSY', `the engine of ${volume} is being deactivated or activated`, { details: { volume } });
    if (slot.role === 'active') throw new MooringError('INVALID_STATE', `the engine of ${volume} on ${this.hostId} is active already`, { details: { volume } });
    slot.handingOver = true;
    try {
      await slot.engine.activate(h, { epoch });
      slot.role = 'active';
      // The requests held since the hand-over go to the writer now, in order (a release
      // fails only on an export that closed meanwhile: nothing is held there any more).
      await slot.hold?.release().catch(() => undefined);
      slot.hold = null;
    } finally {
      slot.handingOver = false;
    }
    this.#emit({ type: 'engine-activated', volume, epoch: slot.engine.epoch });
    // As after a start: every replica that is not RW now (not in the hand-over, lost while
    // standby) is rebuilt by self-repair.
    this.#repairErr(slot, 'at activation');
    return this.#engineInfo(slot);
  }

  // --- snapshots ---------------------------------------------------------------

  /** @inheritDoc DataEngine.createSnapshot */
  async createSnapshot(volume: string, name: string, options: { labels?: Record<string, string> } = {}): Promise<EngineSnapshotInfo> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    checkName('snapshot name', name);
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `snapshot options must be an object (got ${describe(options)})`);
    const labels = checkLabels(options.labels);
    await slot.engine.createSnapshot(name, { labels });
    const found = visibleSnapshots(await slot.engine.snapshotLayers(name)).find((x) => x.name === name);
    if (!found) throw new MooringError('IO_ERROR', `snapshot ${name} of ${volume} was created but is not listed`);
    return found;
  }

  /** @inheritDoc DataEngine.listSnapshots */
  async listSnapshots(volume: string): Promise<EngineSnapshotInfo[]> {
    this.#assertOpen();
    return visibleSnapshots(await this.#slot(volume).engine.listLayers());
  }

  /** @inheritDoc DataEngine.deleteSnapshot */
  async deleteSnapshot(volume: string, name: string): Promise<void> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    checkName('snapshot name', name);
    await slot.engine.deleteSnapshot(name);
  }

  /** @inheritDoc DataEngine.revertSnapshot */
  async revertSnapshot(volume: string, name: string): Promise<void> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    checkName('snapshot name', name);
    await slot.engine.revert(name);
  }

  /**
   * @inheritDoc DataEngine.exportSnapshot
   *
   * At most `maxConcurrentSnapshotCopies` exports and copies run at once; later ones wait.
   * While it runs, deleteSnapshot of the volume fails with BUSY; stopping the engine cuts
   * it short (CLOSED) and removes the partial file.
   */
  async exportSnapshot(volume: string, snapshot: string, path: string): Promise<SnapshotCopyResult> {
    this.#assertOpen();
    const slot = this.#slot(volume);
    checkName('snapshot name', snapshot);
    return this.#withCopyPermit(() => slot.engine.exportSnapshot(snapshot, path));
  }

  /**
   * @inheritDoc DataEngine.copySnapshot
   *
   * The target's old content is replaced everywhere (ranges the snapshot does not hold are
   * zeroed); if the copy fails it holds part of the snapshot.
   */
  async copySnapshot(volume: string, snapshot: string, toVolume: string): Promise<SnapshotCopyResult> {
    this.#assertOpen();
    const from = this.#slot(volume);
    checkName('snapshot name', snapshot);
    const to = this.#slot(toVolume);
    if (to === from) throw new MooringError('INVALID_ARGUMENT', `a snapshot of ${volume} cannot be copied into ${volume} itself`);
    if (to.engine.sizeBytes !== from.engine.sizeBytes) {
      throw new MooringError('INVALID_ARGUMENT', `volume ${toVolume} has ${to.engine.sizeBytes} bytes, ${volume} ${from.engine.sizeBytes}: a copy needs equal sizes`, {
        details: { volume, toVolume },
      });
    }
    return this.#withCopyPermit(() => from.engine.copySnapshotTo(snapshot, to.engine));
  }

  // Bounds exports and copies across engines: each holds a libuv pool thread to the end.
  async #withCopyPermit<T>(body: () => Promise<T>): Promise<T> {
    const release = await this.#snapshotCopies.acquire();
    try {
      return await body();
    } finally {
      release();
    }
  }

  // --- backing image files (docs/data-engine.md, "Backing image files") ------------

  /** @inheritDoc DataEngine.listBackingImageFiles */
  async listBackingImageFiles(): Promise<BackingImageFileInfo[]> {
    this.#assertOpen();
    return this.#files.list();
  }

  /** @inheritDoc DataEngine.backingImageFile */
  async backingImageFile(ref: BackingImageFileRef): Promise<BackingImageFileInfo | null> {
    this.#assertOpen();
    return this.#files.get(ref);
  }

  /** @inheritDoc DataEngine.downloadBackingImageFile */
  async downloadBackingImageFile(ref: BackingImageFileRef, options: BackingImageDownloadOptions): Promise<BackingImageFileInfo> {
    this.#assertOpen();
    return this.#files.download(ref, options);
  }

  /** @inheritDoc DataEngine.writeBackingImageFile */
  async writeBackingImageFile(ref: BackingImageFileRef, options: BackingImageWriteOptions, data: AsyncIterable<Uint8Array>): Promise<BackingImageFileInfo> {
    this.#assertOpen();
    return this.#files.write(ref, options, data);
  }

  /** @inheritDoc DataEngine.readBackingImageFile */
  async *readBackingImageFile(ref: BackingImageFileRef, options?: { offset?: number }): AsyncGenerator<Uint8Array> {
    this.#assertOpen();
    yield* this.#files.read(ref, options);
  }

  /** @inheritDoc DataEngine.pullBackingImageFile */
  async pullBackingImageFile(ref: BackingImageFileRef, options: BackingImagePullOptions): Promise<BackingImageFileInfo> {
    this.#assertOpen();
    const source = checkPullSource(options);
    const { source: _s, ...write } = options;
    const offset = typeof write.offset === 'number' ? write.offset : 0;
    const creds = { tls: this.#tls, clusterSecret: this.#clusterSecret, allowInsecureRemote: this.#allowInsecureRemote };
    const src = await openPullSource(creds, source, this.hostId, ref, offset, this.#pullStallMs, this.#addon);
    safeLog(this.#log, 'info', { ref, source: source.hostId, offset, via: src.via }, `pulling backing image file ${ref.name}-${ref.uuid} from ${source.hostId} at byte ${offset} over ${src.via === 'replica-protocol' ? 'the replica protocol' : 'gRPC'}`);
    try {
      return await this.#files.write(ref, write, src.data);
    } finally {
      await src.close();
    }
  }

  /** @inheritDoc DataEngine.exportSnapshotToBackingImageFile */
  async exportSnapshotToBackingImageFile(volume: string, snapshot: string, ref: BackingImageFileRef, options?: { expectedChecksum?: string }): Promise<BackingImageFileInfo> {
    this.#assertOpen();
    return this.#files.exportSnapshot(volume, snapshot, ref, options);
  }

  /** @inheritDoc DataEngine.cancelBackingImageFile */
  async cancelBackingImageFile(ref: BackingImageFileRef): Promise<void> {
    this.#assertOpen();
    return this.#files.cancel(ref);
  }

  /** @inheritDoc DataEngine.deleteBackingImageFile */
  async deleteBackingImageFile(ref: BackingImageFileRef): Promise<void> {
    this.#assertOpen();
    return this.#files.delete(ref);
  }

  // Replicas on this disk by the backing image directory their chain reads.
  async #backingImageUsers(): Promise<Map<string, string[]>> {
    const out = new Map<string, string[]>();
    for (const r of await this.listReplicas()) {
      if (!r.backingImage) continue;
      const list = out.get(r.backingImage.dir) ?? [];
      list.push(r.name);
      out.set(r.backingImage.dir, list);
    }
    return out;
  }

  /** @inheritDoc DataEngine.watch */
  watch(listener: (event: DataEngineEvent) => void): () => void {
    if (typeof listener !== 'function') throw new MooringError('INVALID_ARGUMENT', 'watch needs a function');
    if (this.#listeners.size >= DATA_ENGINE_LIMITS.watchersMax) {
      throw new MooringError('BUSY', `${DATA_ENGINE_LIMITS.watchersMax} watchers are registered already`);
    }
    // A wrapper, so one function may be registered twice and unsubscribed once each.
    const entry = (e: DataEngineEvent): void => listener(e);
    this.#listeners.add(entry);
    return () => void this.#listeners.delete(entry);
  }

  /** Stops every engine (drain, flush, replicas clean), the replica server, and unlocks the directory. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      // Preparations stop first (an export holds an engine); partial files stay for a resume.
      await this.#files.close();
      const results = await Promise.allSettled([...this.#engines.values()].map((s) => this.#stop(s)));
      if (this.#server) await this.#server.close().catch((err: unknown) => results.push({ status: 'rejected', reason: err }));
      await this.#lock.release();
      const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) {
        const e = toMooringError(failed.reason, 'closing the data engine');
        safeLog(this.#log, 'warn', { hostId: this.hostId, code: e.code }, e.message);
        throw e;
      }
      safeLog(this.#log, 'debug', { hostId: this.hostId, engines: results.length }, `data engine ${this.hostId} closed (${results.length} engine(s) stopped)`);
    })();
    return this.#closing;
  }

  // --- engines -------------------------------------------------------------

  #slot(volume: string): EngineSlot {
    checkName('volume', volume);
    const slot = this.#engines.get(volume);
    if (!slot || slot.stopping) throw new MooringError('NOT_FOUND', `no engine for volume ${volume} on ${this.hostId}`, { details: { volume } });
    return slot;
  }

  #spec(ref: EngineReplicaRef, ioTimeoutMs: number): EngineReplicaSpec {
    if (ref.hostId === this.hostId) return { id: ref.id, path: join(this.#replicasDir, ref.name) };
    const a = parseTcpAddress(ref.address, `replica ${ref.id} address`, false);
    return {
      id: ref.id,
      remote: {
        host: a.host,
        port: a.port,
        name: ref.name,
        ioTimeoutMs,
        ...(this.#tls ? { tls: { ...this.#tls, serverName: '' } } : {}),
        ...(this.#clusterSecret ? { clusterSecret: this.#clusterSecret } : {}),
      },
    };
  }

  #wire(slot: EngineSlot): void {
    const { engine, volume } = slot;
    const onRebuild = (type: 'rebuild-started' | 'rebuild-progress' | 'rebuild-completed') => (e: RebuildEvent) => {
      const figures = { sentBytes: e.sentBytes, scannedBytes: e.scannedBytes, totalBytes: e.totalBytes };
      if (type === 'rebuild-completed') slot.progress.delete(e.replicaId);
      else slot.progress.set(e.replicaId, figures);
      this.#emit({ type, volume, replicaId: e.replicaId, ...figures });
    };
    engine.on('rebuild-started', onRebuild('rebuild-started'));
    engine.on('rebuild-progress', onRebuild('rebuild-progress'));
    engine.on('rebuild-completed', onRebuild('rebuild-completed'));
    engine.on('rebuild-failed', (e: RebuildFailedEvent) => {
      slot.progress.delete(e.replicaId);
      this.#emit({
        type: 'rebuild-failed',
        volume,
        replicaId: e.replicaId,
        code: e.code,
        message: e.message,
        sentBytes: e.sentBytes,
        scannedBytes: e.scannedBytes,
        totalBytes: e.totalBytes,
      });
    });
    engine.on('epoch-claimed', (e) => this.#emit({ type: 'epoch-claimed', volume, epoch: e.epoch }));
    const onSalvaged = (e: SalvagedEvent): void =>
      this.#emit({ type: 'salvaged', volume, replicaId: e.replicaId, lastRw: e.lastRw && { ...e.lastRw }, complete: e.complete, message: e.message });
    engine.on('salvaged', onSalvaged);
    engine.on('replica-set-changed', (e) =>
      this.#emit({ type: 'replica-set-changed', volume, epoch: e.epoch, generation: e.generation, rwReplicaIds: [...e.rwReplicaIds] }),
    );
    engine.on('snapshot-copy-progress', (e) =>
      this.#emit({ type: 'snapshot-copy-progress', volume, snapshot: e.snapshot, copiedBytes: e.copiedBytes, totalBytes: e.totalBytes }),
    );
    engine.on('replica-error', (e) => {
      this.#emit({ type: 'replica-error', volume, replicaId: e.replicaId, errno: e.errno, message: e.message });
      this.#scheduleRepair(slot, e.replicaId, e.code, e.message);
    });
    for (const e of engine.openEvents) {
      if (e.type === 'epoch-claimed') this.#emit({ type: 'epoch-claimed', volume, epoch: e.epoch });
      if (e.type === 'salvaged') onSalvaged(e);
      if (e.type === 'replica-set-changed') {
        this.#emit({ type: 'replica-set-changed', volume, epoch: e.epoch, generation: e.generation, rwReplicaIds: [...e.rwReplicaIds] });
      }
      if (e.type === 'replica-error') this.#emit({ type: 'replica-error', volume, replicaId: e.replicaId, errno: e.errno, message: e.message });
    }
  }

  #engineInfo(slot: EngineSlot): EngineInfo {
    const states = slot.engine.state === 'open' ? slot.engine.replicas() : [];
    const replicas: EngineReplicaInfo[] = slot.refs.map((ref) => {
      const s = states.find((x) => x.id === ref.id);
      const progress = slot.progress.get(ref.id);
      return {
        ...ref,
        mode: s?.mode ?? 'ERR',
        lastError: s && s.lastErrno !== 0 ? -s.lastErrno : 0,
        ...(progress && s?.mode === 'WO' ? { rebuild: { ...progress } } : {}),
      };
    });
    return {
      volume: slot.volume,
      sizeBytes: slot.engine.sizeBytes,
      epoch: slot.engine.state === 'open' ? slot.engine.epoch : 0,
      role: slot.role,
      replicas,
      nbd: slot.nbd && !slot.nbd.closed ? { address: slot.nbd.addressString, uri: slot.nbd.uri } : null,
      nbdStats: nbdStatsOf(slot.nbd),
    };
  }

  async #stop(slot: EngineSlot): Promise<void> {
    if (slot.stopping) return;
    slot.stopping = true;
    for (const id of [...slot.repairs.keys()]) this.#cancelRepair(slot, id);
    // Closing a held export closes its connections with what they sent unread.
    slot.hold?.dispose();
    try {
      // A rebuild in flight would hold the engine's drain: abort it (the replica is simply
      // not part of the next engine until it is rebuilt again).
      const rebuilding = slot.engine.state === 'open' ? slot.engine.replicas().filter((r) => r.mode === 'WO') : [];
      await Promise.allSettled(rebuilding.map((r) => slot.engine.removeReplica(r.id)));
      await slot.engine.close();
    } finally {
      this.#engines.delete(slot.volume);
      this.#emit({ type: 'engine-stopped', volume: slot.volume });
    }
  }

  // --- self-repair -----------------------------------------------------------

  #scheduleRepair(slot: EngineSlot, replicaId: string, code: string, message: string): void {
    if (!this.#repair.enabled || slot.stopping || this.#closing) return;
    // A standby's replicas belong to the active engine elsewhere; it repairs them.
    if (slot.role === 'standby' || slot.handingOver) return;
    if (!slot.refs.some((r) => r.id === replicaId)) return;
    let st = slot.repairs.get(replicaId);
    if (st && st.phase !== 'idle') return;
    if (!st) {
      st = { attempt: 0, delayMs: 0, phase: 'idle' };
      slot.repairs.set(replicaId, st);
    }
    st.attempt++;
    st.delayMs = st.attempt === 1 ? this.#repair.firstRetryMs : Math.min(st.delayMs * 2, this.#repair.maxRetryMs);
    st.phase = 'waiting';
    const state = st;
    st.timer = setTimeout(() => {
      state.timer = undefined;
      if (state.phase !== 'waiting' || slot.repairs.get(replicaId) !== state) return;
      this.#attempt(slot, replicaId).catch(() => undefined);
    }, st.delayMs);
    this.#emit({ type: 'repair-scheduled', volume: slot.volume, replicaId, attempt: st.attempt, delayMs: st.delayMs, code, message });
  }

  // Schedules a repair of every ERR replica of an engine that just became active.
  #repairErr(slot: EngineSlot, when: string): void {
    for (const r of slot.engine.replicas()) {
      if (r.mode !== 'ERR') continue;
      // Unreachable (an errno) or out of date (fenced by a newer epoch, no errno).
      const code = r.lastErrno !== 0 ? codeFromErrno(r.lastErrno) : 'INVALID_STATE';
      this.#scheduleRepair(slot, r.id, code, `replica ${r.id} is ERR ${when}${r.lastErrno !== 0 ? ` (errno ${r.lastErrno})` : ' (out of date)'}`);
    }
  }

  #cancelRepair(slot: EngineSlot, replicaId: string): void {
    const st = slot.repairs.get(replicaId);
    if (!st) return;
    if (st.timer) clearTimeout(st.timer);
    st.timer = undefined;
    // A busy attempt finishes on its own; it finds its ref gone or the engine stopping.
    if (st.phase !== 'busy') slot.repairs.delete(replicaId);
  }

  // One rebuild attempt of a replica in the engine's refs: waits for the engine's turn, then
  // for a data-engine-wide permit, then re-adds it. A failure schedules the next attempt.
  #attempt(slot: EngineSlot, replicaId: string): Promise<RebuildResult> {
    let st = slot.repairs.get(replicaId);
    if (!st) {
      st = { attempt: 0, delayMs: 0, phase: 'idle' };
      slot.repairs.set(replicaId, st);
    }
    const state = st;
    state.phase = 'busy';
    const run = async (): Promise<RebuildResult> => {
      const release = await this.#rebuilds.acquire();
      try {
        const ref = slot.refs.find((r) => r.id === replicaId);
        if (slot.stopping || this.#closing) throw new MooringError('CLOSED', `the engine of ${slot.volume} is stopping`);
        if (slot.role === 'standby') throw new MooringError('INVALID_STATE', `the engine of ${slot.volume} is a standby`);
        if (!ref) throw new MooringError('NOT_FOUND', `replica ${replicaId} was removed from ${slot.volume}`);
        const started = Date.now();
        const r = await slot.engine.addReplica(this.#spec(ref, slot.ioTimeoutMs));
        return { replicaId, scannedBytes: r.scannedBytes, sentBytes: r.sentBytes, unmappedBytes: r.unmappedBytes, durationMs: r.durationMs || Date.now() - started };
      } finally {
        release();
      }
    };
    const promise = slot.serial.then(run, run);
    slot.serial = promise.catch(() => undefined);
    state.promise = promise;
    promise.then(
      () => {
        if (slot.repairs.get(replicaId) === state) slot.repairs.delete(replicaId);
        // It may have failed again between RW and now.
        const mode = slot.engine.state === 'open' ? slot.engine.replicas().find((r) => r.id === replicaId)?.mode : undefined;
        if (mode === 'ERR') this.#scheduleRepair(slot, replicaId, 'IO_ERROR', `replica ${replicaId} failed again after its rebuild`);
      },
      (err: unknown) => {
        state.phase = 'idle';
        state.promise = undefined;
        if (slot.repairs.get(replicaId) !== state) return;
        const mode = slot.engine.state === 'open' ? slot.engine.replicas().find((r) => r.id === replicaId)?.mode : undefined;
        if (mode === 'RW' || !slot.refs.some((r) => r.id === replicaId)) {
          slot.repairs.delete(replicaId);
          return;
        }
        const e = toMooringError(err);
        this.#scheduleRepair(slot, replicaId, e.code, e.message);
      },
    );
    return promise;
  }

  // --- replicas --------------------------------------------------------------

  async #withReplicaOp<T>(name: string, body: () => Promise<T>): Promise<T> {
    if (this.#replicaOps.has(name)) throw new MooringError('BUSY', `replica ${name} is being created or deleted`, { details: { name } });
    this.#replicaOps.add(name);
    try {
      return await body();
    } finally {
      this.#replicaOps.delete(name);
    }
  }

  #engineUsing(name: string): string | undefined {
    for (const s of this.#engines.values()) {
      if (s.refs.some((r) => r.hostId === this.hostId && r.name === name)) return s.volume;
    }
    return undefined;
  }

  async #inspect(name: string): Promise<NativeReplicaInfo> {
    const path = join(this.#replicasDir, name);
    return callNative(() => this.#addon.inspectReplica(path), `inspecting replica ${name}`);
  }

  #hosted(name: string, info: NativeReplicaInfo): HostedReplicaInfo {
    return {
      name,
      sizeBytes: info.sizeBytes,
      epoch: info.epoch,
      clean: info.clean,
      rebuilding: info.rebuilding,
      allocatedBytes: info.allocatedBytes,
      inUse: info.users > 0 || this.#engineUsing(name) !== undefined,
      backingImage: info.backingImage ? { ...info.backingImage } : null,
    };
  }

  #emit(event: DataEngineEvent): void {
    for (const l of [...this.#listeners]) {
      try {
        l(event);
      } catch (err) {
        // A throwing listener must not break the engine's bookkeeping; it surfaces as an
        // uncaught exception of the application on its own tick.
        process.nextTick(() => {
          throw err;
        });
      }
    }
  }

  #assertOpen(): void {
    if (this.#closing) throw new MooringError('CLOSED', `data engine ${this.hostId} is closed`);
  }
}

function sameReplica(a: EngineReplicaRef, b: EngineReplicaRef): boolean {
  return a.hostId === b.hostId && a.name === b.name;
}

/**
 * Checks engine replica refs: 1..16, unique ids, unique (hostId, name).
 *
 * @internal
 */
export function checkRefs(value: unknown): EngineReplicaRef[] {
  if (!Array.isArray(value) || value.length < REPLICA_COUNT_MIN || value.length > REPLICA_COUNT_MAX) {
    throw new MooringError('INVALID_ARGUMENT', `replicas must be an array of ${REPLICA_COUNT_MIN}..${REPLICA_COUNT_MAX} replica refs (got ${describe(value)})`);
  }
  const ids = new Set<string>();
  const places = new Set<string>();
  return value.map((v: unknown, i) => {
    if (typeof v !== 'object' || v === null) throw new MooringError('INVALID_ARGUMENT', `replicas[${i}] must be {id, hostId, name, address}`);
    const r = v as Partial<EngineReplicaRef>;
    const ref: EngineReplicaRef = {
      id: checkName(`replicas[${i}].id`, r.id),
      hostId: checkName(`replicas[${i}].hostId`, r.hostId),
      name: checkName(`replicas[${i}].name`, r.name),
      address: r.address === undefined || r.address === null || r.address === '' ? null : String(r.address),
    };
    if (r.address !== undefined && r.address !== null && typeof r.address !== 'string') {
      throw new MooringError('INVALID_ARGUMENT', `replicas[${i}].address must be tcp:HOST:PORT or null (got ${describe(r.address)})`);
    }
    if (ref.address !== null) parseTcpAddress(ref.address, `replicas[${i}].address`, false);
    if (ids.has(ref.id)) throw new MooringError('INVALID_ARGUMENT', `replica id ${ref.id} appears twice`);
    const place = `${ref.hostId}/${ref.name}`;
    if (places.has(place)) throw new MooringError('INVALID_ARGUMENT', `replica ${place} appears twice`);
    ids.add(ref.id);
    places.add(place);
    return ref;
  });
}

/**
 * Checks a hand-over: non-negative safe-integer epoch and generation, 0..16 replica ids.
 *
 * @internal
 */
export function checkHandOver(value: unknown): EngineHandOver {
  const h = value as Partial<EngineHandOver> | null;
  const count = (v: unknown): boolean => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
  if (typeof h !== 'object' || h === null || !count(h.epoch) || !count(h.generation) || !Array.isArray(h.rwReplicaIds)) {
    throw new MooringError('INVALID_ARGUMENT', `handOver must be {epoch, generation, rwReplicaIds} (got ${describe(value)})`);
  }
  if (h.rwReplicaIds.length > REPLICA_COUNT_MAX) {
    throw new MooringError('INVALID_ARGUMENT', `handOver.rwReplicaIds lists ${h.rwReplicaIds.length} replicas, at most ${REPLICA_COUNT_MAX}`);
  }
  return { epoch: h.epoch!, generation: h.generation!, rwReplicaIds: h.rwReplicaIds.map((id: unknown, i) => checkName(`handOver.rwReplicaIds[${i}]`, id)) };
}

/** What a data engine directory's data-engine.json records. */
interface DataEngineDirRecord {
  hostId: string;
  /** The disk's identity, drawn when the directory was made ('' if a release before it made it). */
  diskId: string;
  createdMs: number;
}

async function readDataEngineRecord(dir: string): Promise<DataEngineDirRecord | null> {
  const file = join(dir, DATA_ENGINE_FILE);
  if (!(await pathExists(file))) return null;
  const text = await readFileLimited(file, DATA_ENGINE_FILE_BYTES_MAX);
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new MooringError('CORRUPT_METADATA', `${file} is not valid JSON`, { cause: err, details: { file } });
  }
  const d = doc as { format?: unknown; hostId?: unknown; diskId?: unknown; createdMs?: unknown } | null;
  if (typeof d !== 'object' || d === null || d.format !== DATA_ENGINE_FORMAT || typeof d.hostId !== 'string') {
    throw new MooringError('CORRUPT_METADATA', `${file} is not a data engine record`, { details: { file } });
  }
  if (d.diskId !== undefined && (typeof d.diskId !== 'string' || !DISK_ID_PATTERN.test(d.diskId))) {
    throw new MooringError('CORRUPT_METADATA', `${file} has a malformed diskId`, { details: { file } });
  }
  return { hostId: d.hostId, diskId: d.diskId ?? '', createdMs: typeof d.createdMs === 'number' ? d.createdMs : 0 };
}

/**
 * The host id a data engine directory was created for (its data-engine.json), or null when
 * the directory holds no data engine yet.
 *
 * @throws MooringError CORRUPT_METADATA
 */
export async function readDataEngineHostId(dir: string): Promise<string | null> {
  return (await readDataEngineRecord(dir))?.hostId ?? null;
}

// The export's counters, or null when there is none (or it closed meanwhile).
function nbdStatsOf(nbd: NbdExport | null): EngineNbdStats | null {
  if (!nbd || nbd.closed) return null;
  try {
    return { ...nbd.stats() };
  } catch {
    return null;
  }
}

// Records (or checks) which host owns a data engine directory: replicas are known to other
// hosts by host id, so the same directory must not come back under another one. Returns the
// directory's disk id, drawing one for a directory made before the field.
async function claimDirectory(dir: string, hostId: string): Promise<string> {
  const rec = await readDataEngineRecord(dir);
  if (rec !== null && rec.hostId !== hostId) {
    throw new MooringError(
      'INVALID_ARGUMENT',
      `${dir} belongs to data engine host ${describe(rec.hostId)}, not ${describe(hostId)}: other hosts know its replicas by that id`,
      { details: { dir, hostId: rec.hostId } },
    );
  }
  if (rec !== null && rec.diskId !== '') return rec.diskId;
  const diskId = randomUUID();
  await writeFileAtomic(join(dir, DATA_ENGINE_FILE), `${JSON.stringify({ format: DATA_ENGINE_FORMAT, formatVersion: 1, hostId, diskId, createdMs: rec?.createdMs ?? Date.now() })}\n`);
  return diskId;
}
