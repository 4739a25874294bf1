/**
 * Cluster: volumes whose replicas live on several hosts. It places replicas on the data
 * engines it is given, starts a volume's engine on the host it is attached to, keeps what
 * it decided in a {@link StateStore} (so a restarted VM manager finds its volumes, engines
 * and replicas again), and repairs volumes: a replica that stays ERR beyond a wait is
 * replaced by a new one on a host that holds none of the volume's replicas.
 *
 * The data engines do the data work (replica servers, engines, rebuilds); a data engine
 * also re-adds a replica by itself when that replica's host comes back. The cluster only
 * decides; it never carries data. It allocates every writer epoch: each engine it starts or
 * activates is handed a new one from the volume's counter in the store (src/cluster/epochs.ts,
 * docs/single-writer.md).
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type * as TE from 'typed-emitter';

import { BackingImageController } from '../backing-image/backing-image-controller.js';
import type { BackingImage, BackingImageCreateOptions, BackingImageStatus } from '../backing-image/backing-image.js';
import { decideAttachment, sameSpec, type AccessMode, type AttachmentDecision } from '../attachment/attachment-reconciler.js';
import {
  MIGRATING_ATTACHERS,
  checkParameters,
  frontendCompatible,
  checkTicketIdentity,
  type AttacherType,
  type AttachmentTicket,
  type Frontend,
} from '../attachment/attachment-ticket.js';
import type {
  DataEngine,
  DataEngineEvent,
  EngineHandOver,
  EngineInfo,
  EngineReplicaRef,
  EngineSnapshotInfo,
  EngineStartOptions,
  RebuildProgress,
  ReplicaBackingImage,
  SnapshotCopyResult,
} from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import type { StateStore } from '../state/state-store.js';
import { KeyedSerial, sleep, withTimeout } from '../util/async.js';
import { safeEmit } from '../util/emit.js';
import { BLOCK_SIZE_BYTES } from '../util/limits.js';
import { checkIntIn, checkName, checkReplicaCount, checkVolumeSize, describe } from '../util/validate.js';
import {
  ATTACHMENT_TICKETS_MAX,
  CLUSTER_SCHEMA_VERSION,
  KIND,
  NO_FRONTEND_CHOSEN,
  parseAttachmentRecord,
  parseEngineRecord,
  parseHostRecord,
  parseMigrationRecord,
  parseReplicaRecord,
  parseVolumeRecord,
  type AttachmentRecord,
  type EngineRecord,
  type HostRecord,
  type MigrationRecord,
  type ReplicaRecord,
  type VolumeRecord,
} from './cluster-records.js';
import { EpochAllocator } from './epochs.js';
import {
  ClusterVolume,
  type ClusterAttachOptions,
  type ClusterDetachOptions,
  type ClusterTicket,
  type HandOverResult,
  type MigrateOptions,
  type MigrationHooks,
  type MigrationInfo,
  type MigrationLocks,
  type TicketOptions,
  type VolumeOps,
} from './cluster-volume.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** How often the repair loop looks at attached volumes, by default. */
export const DEFAULT_REPAIR_INTERVAL_MS = 2000;
/** How long a replica may stay ERR before it is replaced on another host, by default (Longhorn: 600 s). */
export const DEFAULT_REPLICA_REPLACEMENT_WAIT_MS = 600_000;
/** Largest value of the millisecond settings (a week). */
const MS_SETTING_MAX = 7 * 24 * 3600 * 1000;
/** How long a call to a data engine may take before its host counts as unreachable for a decision. */
export const HOST_PROBE_TIMEOUT_MS = 3000;
/** How long an attach (or an operation's own ticket) waits to be satisfied, by default. */
export const DEFAULT_TICKET_WAIT_TIMEOUT_MS = 60_000;
/** How often a waiting ticket is reconciled again. */
const TICKET_POLL_MS = 100;
/**
 * How long a replacement waits in the repair pass for its backing image file on the new host.
 * The copy goes on after that; a later pass finds it ready (other volumes' repairs do not
 * wait behind a long copy).
 */
const REPLACEMENT_IMAGE_WAIT_MS = 5000;
/** Bounds of {@link ClusterOptions.engineIoTimeoutMs} (those of the data engine's ioTimeoutMs). */
const ENGINE_IO_TIMEOUT_MS_MIN = 100;
const ENGINE_IO_TIMEOUT_MS_MAX = 600_000;
/** Passes of one reconcile before it stops to let others run (each pass takes one step). */
const CONVERGE_PASSES_MAX = 8;
/**
 * Epochs one start or activation tries: a STALE_EPOCH refusal (a replica promised that epoch
 * or more, e.g. one written by a release whose engines chose their epochs) is tried again
 * above the highest epoch the replicas report.
 */
export const EPOCH_ATTEMPTS_MAX = 3;

/** How long a backing image file no replica uses stays on its disk, by default (Longhorn: 60 min). */
export const DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS = 3_600_000;

/** Options of {@link Cluster.open}. */
export interface ClusterOptions {
  /** Where specs and status are kept (e.g. a FileStateStore). */
  store: StateStore;
  /** Data engines offered for replicas and engines (more with {@link Cluster.addHost}). */
  hosts?: DataEngine[];
  /** Repair loop period (default 2000 ms); 0 turns the loop off ({@link Cluster.repairOnce} still works). */
  repairIntervalMs?: number;
  /** ERR time after which a replica is replaced on another host (default 600,000 ms). */
  replicaReplacementWaitMs?: number;
  /** Default wait of an attach for its ticket (default 60,000 ms); also how long a volume waits for its backing image file on a host. */
  ticketWaitTimeoutMs?: number;
  /** How long a backing image file that no replica uses stays on its disk before it is deleted (default 3,600,000 ms; minCopies ready copies always stay). */
  backingImageCleanupWaitMs?: number;
  /**
   * I/O timeout towards remote replicas of every engine this cluster starts (default: the
   * data engine's, 8000 ms; 100 to 600,000): how long a replica may not answer before the
   * engine counts it as lost.
   */
  engineIoTimeoutMs?: number;
}

/** Options of {@link Cluster.createVolume}. */
export interface ClusterVolumeCreateOptions {
  /** Volume name ([A-Za-z0-9._-]{1,63}), unique in the store. */
  name: string;
  /** Size in bytes: a positive multiple of 4096 (default with a backing image: its virtual size rounded up to 4096; never less than it). */
  sizeBytes?: number;
  /** Number of replicas (default 3), each on a different host. */
  replicas?: number;
  /** Hosts to place the replicas on (default: the hosts with the fewest replicas). */
  hosts?: string[];
  /** `rwo` (default): one host at a time; `migratable`: may live-migrate between hosts (block only). */
  accessMode?: AccessMode;
  /** A backing image (by name) beneath every replica: its file is delivered to each replica's host first (the volume waits for it). */
  backingImage?: string;
}

/** Options of {@link Cluster.cloneVolume} (the clone has the source's size and backing image). */
export interface ClusterCloneOptions extends Omit<ClusterVolumeCreateOptions, 'sizeBytes' | 'backingImage'> {
  /** Source volume. */
  from: string;
  /** Snapshot of the source to copy. */
  snapshot: string;
}

export type { ClusterAttachOptions, ClusterDetachOptions } from './cluster-volume.js';

/** A replica as the cluster reports it. */
export interface ClusterReplicaStatus {
  id: string;
  hostId: string;
  name: string;
  mode: 'RW' | 'WO' | 'ERR' | 'unknown';
  rebuild?: RebuildProgress;
}

/** A volume as the cluster reports it. */
export interface ClusterVolumeStatus {
  name: string;
  uuid: string;
  sizeBytes: number;
  replicaCount: number;
  accessMode: AccessMode;
  /** The backing image beneath its replicas, or null. */
  backingImage: string | null;
  /** detached; healthy (all RW); degraded (some RW, fewer than wanted); faulted (no RW); unknown (engine host unreachable). */
  state: 'detached' | 'healthy' | 'degraded' | 'faulted' | 'unknown';
  /** Where it is attached (during a migration: the source, until confirmed). */
  attachedHost: string | null;
  /** The host whose engine writes (during a migration after hand-over: the target), or null. */
  writerHost: string | null;
  /** The frontend of the attached engine (null when detached). */
  frontend: Frontend | null;
  /** A migration in progress, or null. */
  migration: MigrationInfo | null;
  epoch: number;
  nbd: { address: string; uri: string } | null;
  replicas: ClusterReplicaStatus[];
}

/** A replica that stayed ERR was replaced by a new one on another host. */
export interface ReplicaReplacedEvent {
  volume: string;
  oldReplicaId: string;
  oldHostId: string;
  newReplicaId: string;
  newHostId: string;
  sentBytes: number;
}

/** Events of a {@link Cluster}: data-engine events of its volumes, plus its own decisions. */
export type ClusterEvents = {
  /** An event from a data engine about one of the cluster's volumes. */
  'data-engine-event': (hostId: string, event: DataEngineEvent) => void;
  /** A replica was replaced on another host. */
  'replica-replaced': (event: ReplicaReplacedEvent) => void;
  /** A volume's engine was started on a host after its previous host became unreachable. */
  'engine-taken-over': (event: { volume: string; fromHost: string; toHost: string; epoch: number }) => void;
  /** An engine of a volume found on a host it is no longer attached to (left by a takeover) was stopped. */
  'stray-engine-stopped': (event: { volume: string; hostId: string }) => void;
  /** Something failed in the background (repair, recording status); the cluster keeps going. */
  warning: (error: MooringError) => void;
};

/** What a cluster last saw of a volume's engines, for one reconcile pass. */
interface Observed {
  vol: VolumeRecord;
  att: AttachmentRecord;
  attVersion: number;
  eng: EngineRecord | null;
  engState: 'none' | 'running' | 'unreachable';
  engInfo: EngineInfo | null;
  mig: MigrationRecord | null;
}

function migrationInfo(m: MigrationRecord, epoch = 0): MigrationInfo {
  return { volume: m.volume, sourceHost: m.sourceHost, targetHost: m.targetHost, phase: m.phase, epoch };
}

function replicaName(volume: string, id: string): string {
  return `${volume.slice(0, 40)}-${id}-${randomUUID().slice(0, 8)}`;
}

/**
 * Volumes across hosts; see the module comment. Create with {@link Cluster.open}; always
 * {@link Cluster.close} (it stops the repair loop; engines keep running on their hosts).
 */
export class Cluster extends (EventEmitter as new () => TypedEmitter<ClusterEvents>) {
  readonly #store: StateStore;
  readonly #epochs: EpochAllocator;
  readonly #hosts = new Map<string, { engine: DataEngine; unwatch: () => void }>();
  readonly #repairIntervalMs: number;
  readonly #replacementWaitMs: number;
  #timer: NodeJS.Timeout | null = null;
  #repairing: Promise<void> | null = null;
  readonly #ticketWaitMs: number;
  readonly #engineIoTimeoutMs: number | undefined;
  #closed = false;
  readonly #images: BackingImageController;
  // Serialises the decisions about one volume (attach, detach, repair, migration steps).
  readonly #volumeChains = new KeyedSerial();
  readonly #handles = new Map<string, ClusterVolume>();
  readonly #migrationHooks = new Map<string, { hooks: MigrationHooks; locks: MigrationLocks | null }>();
  // Volumes whose attach is taking them over from an unreachable host (for the event).
  readonly #takeovers = new Map<string, string>();
  readonly #ops: VolumeOps = {
    attach: (n, o) => this.#attach(n, o),
    detach: (n, o) => this.#detach(n, o),
    status: (n) => this.status(n),
    tickets: (n) => this.#ticketList(n),
    setTicket: (n, t) => this.#setTicket(n, t),
    deleteTicket: async (n, id) => {
      this.#checkOpen();
      checkTicketIdentity(id, 'api');
      await this.#serial(n, () => this.#removeTickets(n, (t) => t.id === id));
    },
    migrate: (n, t, o) => this.#migrate(n, t, o),
    migration: async (n) => {
      const m = await this.#migrationRecord(n);
      return m ? migrationInfo(m) : null;
    },
    handOver: (n) => this.#handOver(n),
    confirm: (n) => this.#confirmCall(n),
    rollback: (n) => this.#rollbackCall(n),
    setHooks: (n, h, l) => this.#setHooks(n, h, l),
    createSnapshot: (n, s, l) => this.#createSnapshot(n, s, l),
    listSnapshots: (n) => this.#listSnapshots(n),
    deleteSnapshot: (n, s) => this.#deleteSnapshot(n, s),
    exportSnapshot: (n, s, o) => this.#exportSnapshot(n, s, o),
    rebuild: (n, o) => this.#rebuild(n, o),
  };

  private constructor(options: ClusterOptions) {
    super();
    this.#store = options.store;
    this.#epochs = new EpochAllocator(options.store);
    this.#repairIntervalMs = options.repairIntervalMs ?? DEFAULT_REPAIR_INTERVAL_MS;
    this.#replacementWaitMs = options.replicaReplacementWaitMs ?? DEFAULT_REPLICA_REPLACEMENT_WAIT_MS;
    this.#ticketWaitMs = options.ticketWaitTimeoutMs ?? DEFAULT_TICKET_WAIT_TIMEOUT_MS;
    this.#engineIoTimeoutMs = options.engineIoTimeoutMs;
    this.#images = new BackingImageController({
      store: this.#store,
      hostIds: () => this.hostIds,
      engineOf: (h) => this.#engineOf(h),
      usage: () => this.#imageUsage(),
      pickHost: async () => (await this.#pickHosts(1, new Set()))[0]!,
      operationHost: async (v) => {
        await this.#volume(v);
        return this.#operationHost(v, undefined);
      },
      withExportTicket: async (v, fn) => this.#withTicket(v, 'backing-image-export', await this.#operationHost(v, undefined), fn),
      warn: (e) => safeEmit(this, 'warning', e),
      cleanupWaitMs: options.backingImageCleanupWaitMs ?? DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS,
      probeTimeoutMs: HOST_PROBE_TIMEOUT_MS,
      waitTimeoutMs: this.#ticketWaitMs,
    });
  }

  /**
   * Opens a cluster over a state store and the given data engines.
   *
   * @throws MooringError INVALID_ARGUMENT
   */
  static async open(options: ClusterOptions): Promise<Cluster> {
    if (typeof options !== 'object' || options === null || typeof options.store !== 'object' || options.store === null) {
      throw new MooringError('INVALID_ARGUMENT', `cluster options need a store (got ${describe(options)})`);
    }
    checkIntIn('repairIntervalMs', options.repairIntervalMs, 0, MS_SETTING_MAX, DEFAULT_REPAIR_INTERVAL_MS);
    checkIntIn('replicaReplacementWaitMs', options.replicaReplacementWaitMs, 0, MS_SETTING_MAX, DEFAULT_REPLICA_REPLACEMENT_WAIT_MS);
    checkIntIn('ticketWaitTimeoutMs', options.ticketWaitTimeoutMs, 0, MS_SETTING_MAX, DEFAULT_TICKET_WAIT_TIMEOUT_MS);
    checkIntIn('backingImageCleanupWaitMs', options.backingImageCleanupWaitMs, 0, MS_SETTING_MAX, DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS);
    if (options.engineIoTimeoutMs !== undefined) checkIntIn('engineIoTimeoutMs', options.engineIoTimeoutMs, ENGINE_IO_TIMEOUT_MS_MIN, ENGINE_IO_TIMEOUT_MS_MAX, 0);
    const c = new Cluster(options);
    await c.#upgradeStore();
    for (const h of options.hosts ?? []) await c.addHost(h);
    if (c.#repairIntervalMs > 0) c.#schedule();
    return c;
  }

  /** Host ids offered to this cluster. */
  get hostIds(): string[] {
    return [...this.#hosts.keys()];
  }

  /**
   * Offers a data engine for replicas and engines (or updates how to reach it, e.g. after
   * its process restarted on another port). Its replica address is recorded in the store.
   */
  async addHost(engine: DataEngine): Promise<void> {
    this.#checkOpen();
    const hostId = checkName('host id', engine?.hostId);
    let info;
    try {
      info = await withTimeout(engine.info(), HOST_PROBE_TIMEOUT_MS, `host ${hostId}`);
    } catch (err) {
      // A host that is down while the VM manager starts is still a host of the cluster: its
      // recorded address stays, and decisions treat it as unreachable until it answers.
      info = null;
      safeEmit(this, 'warning', toMooringError(err, `host ${hostId} did not answer when added; its last recorded address is kept`));
    }
    if (info && info.hostId !== hostId) throw new MooringError('INVALID_ARGUMENT', `data engine says it is host ${info.hostId}, its handle says ${hostId}`);
    const old = this.#hosts.get(hostId);
    if (old && old.engine !== engine) old.unwatch();
    if (!old || old.engine !== engine) {
      const unwatch = engine.watch((e) => {
        this.#images.onDataEngineEvent(hostId, e);
        safeEmit(this, 'data-engine-event', hostId, e);
      });
      this.#hosts.set(hostId, { engine, unwatch });
    }
    if (!info) return;
    const rec: HostRecord = { schema: CLUSTER_SCHEMA_VERSION, hostId, replicaAddress: info.replicaAddress, lastSeenMs: Date.now() };
    await this.#store.put(KIND.host, hostId, rec);
  }

  /** Withdraws a host: no new replicas or engines go there. Its existing replicas stay until replaced. */
  removeHost(hostId: string): void {
    const h = this.#hosts.get(hostId);
    if (!h) return;
    h.unwatch();
    this.#hosts.delete(hostId);
  }

  /**
   * Creates a volume: one empty replica on each of `replicas` distinct hosts, recorded in
   * the store. Detached until {@link Cluster.attach}. With a backing image, it waits for the
   * image's first file, then for a copy on each replica host, then creates the replicas over it.
   *
   * @throws MooringError INVALID_ARGUMENT, ALREADY_EXISTS, UNAVAILABLE (too few reachable hosts, or the image's file did not reach a host in time), NO_SPACE, NOT_FOUND (no such backing image)
   */
  async createVolume(options: ClusterVolumeCreateOptions): Promise<ClusterVolumeStatus> {
    this.#checkOpen();
    const name = checkName('volume name', options.name);
    const imageName = options.backingImage === undefined ? null : checkName('backing image name', options.backingImage);
    let sizeBytes: number;
    if (imageName !== null) {
      const img = await this.#images.waitReady(imageName, undefined);
      const minBytes = Math.ceil(img.virtualSizeBytes / BLOCK_SIZE_BYTES) * BLOCK_SIZE_BYTES;
      sizeBytes = options.sizeBytes === undefined ? minBytes : checkVolumeSize(options.sizeBytes);
      if (sizeBytes < img.virtualSizeBytes) throw new MooringError('INVALID_ARGUMENT', `volume ${name} (${sizeBytes} bytes) is smaller than its backing image ${imageName} (${img.virtualSizeBytes} bytes)`, { details: { sizeBytes, virtualSizeBytes: img.virtualSizeBytes } });
    } else {
      sizeBytes = checkVolumeSize(options.sizeBytes);
    }
    const count = checkReplicaCount(options.replicas ?? 3);
    const accessMode = options.accessMode ?? 'rwo';
    if (accessMode !== 'rwo' && accessMode !== 'migratable') throw new MooringError('INVALID_ARGUMENT', `accessMode must be 'rwo' or 'migratable' (got ${describe(accessMode)})`);
    if (await this.#store.get(KIND.volume, name)) throw new MooringError('ALREADY_EXISTS', `volume ${name} exists already`);
    const hosts = options.hosts ?? (await this.#pickHosts(count, new Set()));
    if (hosts.length !== count || new Set(hosts).size !== count) {
      throw new MooringError('INVALID_ARGUMENT', `volume ${name} needs ${count} distinct hosts (got ${hosts.join(', ') || 'none'})`);
    }
    for (const h of hosts) this.#engineOf(h);
    const vol: VolumeRecord = {
      schema: CLUSTER_SCHEMA_VERSION,
      name,
      uuid: randomUUID(),
      sizeBytes,
      replicaCount: count,
      createdMs: Date.now(),
      accessMode,
      desiredHost: null,
      migrationHost: null,
      frontend: { ...NO_FRONTEND_CHOSEN },
      migrationFrontend: { ...NO_FRONTEND_CHOSEN },
      backingImage: imageName,
    };
    // Reserve the name first (compare-and-set), so two creators cannot both proceed.
    await this.#store.put(KIND.volume, name, vol, { expectedVersion: 0 });
    await this.#store.put(KIND.attachment, name, { schema: CLUSTER_SCHEMA_VERSION, volume: name, tickets: [], statuses: [] } satisfies AttachmentRecord);
    const made: ReplicaRecord[] = [];
    let lease: { backingImage: ReplicaBackingImage; release: () => void } | null = null;
    try {
      // The volume's record names the image already, so the image cannot be deleted meanwhile.
      if (imageName !== null) lease = await this.#images.acquire(imageName, hosts);
      for (let i = 0; i < count; i++) {
        const rec = this.#newReplicaRecord(name, `r${i}`, hosts[i]!);
        if (lease) await this.#engineOf(rec.hostId).createReplica(rec.name, sizeBytes, { backingImage: lease.backingImage });
        else await this.#engineOf(rec.hostId).createReplica(rec.name, sizeBytes);
        made.push(rec);
        await this.#store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
      }
      lease?.release();
    } catch (err) {
      lease?.release();
      for (const r of made) {
        await this.#engineOf(r.hostId).deleteReplica(r.name).catch(() => undefined);
        await this.#store.delete(KIND.replica, r.name).catch(() => undefined);
      }
      await this.#store.delete(KIND.attachment, name).catch(() => undefined);
      await this.#store.delete(KIND.volume, name).catch(() => undefined);
      throw toMooringError(err, `creating volume ${name}`);
    }
    return this.status(name);
  }

  /**
   * Deletes a detached volume and its replicas (on hosts that can be reached; the records
   * of the others are kept so a later delete finishes the job).
   *
   * @throws MooringError NOT_FOUND, BUSY (attached)
   */
  async deleteVolume(name: string): Promise<void> {
    this.#checkOpen();
    await this.#serial(name, async () => {
      await this.#volume(name);
      if (await this.#store.get(KIND.engine, name)) throw new MooringError('BUSY', `volume ${name} is attached; detach it first`);
      const tickets = (await this.#attachment(name)).rec.tickets;
      if (tickets.length > 0) throw new MooringError('BUSY', `volume ${name} has ${tickets.length} attachment ticket(s) (${tickets.map((t) => t.id).join(', ')}); detach it first`);
      let left = 0;
      for (const r of await this.#replicas(name)) {
        try {
          await this.#engineOf(r.hostId).deleteReplica(r.name);
        } catch (err) {
          const e = toMooringError(err);
          if (e.code !== 'NOT_FOUND') {
            left++;
            safeEmit(this, 'warning', toMooringError(err, `deleting replica ${r.name} of ${name} on ${r.hostId}`));
            continue;
          }
        }
        await this.#store.delete(KIND.replica, r.name);
      }
      if (left > 0) throw new MooringError('UNAVAILABLE', `volume ${name}: ${left} replica(s) could not be deleted; delete again when their hosts are back`);
      await this.#store.delete(KIND.attachment, name);
      await this.#store.delete(KIND.volume, name);
      this.#handles.delete(name);
      this.#migrationHooks.delete(name);
    });
  }

  /** Every volume in the store, with its status. */
  async listVolumes(): Promise<ClusterVolumeStatus[]> {
    const out: ClusterVolumeStatus[] = [];
    for (const d of await this.#store.list<unknown>(KIND.volume)) out.push(await this.status(parseVolumeRecord(d.value, d.key).name));
    return out;
  }

  /** The volume's handle (attach, detach, migrate, snapshots, events); one object per name. */
  volume(name: string): ClusterVolume {
    checkName('volume name', name);
    let v = this.#handles.get(name);
    if (!v) {
      v = new ClusterVolume(name, this.#ops);
      this.#handles.set(name, v);
    }
    return v;
  }

  /** Same as `volume(name).attach(options)`. */
  attach(name: string, options: ClusterAttachOptions): Promise<ClusterVolumeStatus> {
    return this.#attach(name, options);
  }

  /** Same as `volume(name).detach(options)`. */
  detach(name: string, options: ClusterDetachOptions = {}): Promise<void> {
    return this.#detach(name, options);
  }

  /**
   * Creates a volume from a snapshot of another: both attach themselves on one host (the
   * source's attached host, or its first reachable replica host; frontends off unless the
   * source is attached), the snapshot's data is written through the new volume's engine, and
   * both detach again (the source stays attached if it was).
   *
   * @throws MooringError NOT_FOUND, ALREADY_EXISTS, UNAVAILABLE, INVALID_ARGUMENT
   */
  async cloneVolume(options: ClusterCloneOptions): Promise<ClusterVolumeStatus & { copiedBytes: number }> {
    this.#checkOpen();
    const src = await this.#volume(options.from);
    checkName('snapshot name', options.snapshot);
    const host = await this.#operationHost(src.name, undefined);
    const created = await this.createVolume({ ...options, sizeBytes: src.sizeBytes, ...(src.backingImage ? { backingImage: src.backingImage } : {}) });
    try {
      const res = await this.#withTicket(src.name, 'volume-clone', host, async () =>
        this.#withTicket(created.name, 'volume-clone', host, async (writer) => this.#engineOf(writer).copySnapshot(src.name, options.snapshot, created.name)),
      );
      return { ...(await this.status(created.name)), copiedBytes: res.copiedBytes };
    } catch (err) {
      await this.deleteVolume(created.name).catch((e: unknown) => safeEmit(this, 'warning', toMooringError(e, `removing the failed clone ${created.name}`)));
      throw toMooringError(err, `cloning ${src.name}@${options.snapshot} into ${created.name}`);
    }
  }

  /** The volume's state, replicas and export, as its engine reports them (or as last recorded). */
  async status(name: string): Promise<ClusterVolumeStatus> {
    const vol = await this.#volume(name);
    const replicas = await this.#replicas(name);
    const eng = await this.#engineRecord(name);
    const mig = await this.#migrationRecord(name);
    const writerHost = eng ? (mig?.targetActivated ? mig.targetHost : eng.hostId) : null;
    const base: ClusterVolumeStatus = {
      name,
      uuid: vol.uuid,
      sizeBytes: vol.sizeBytes,
      replicaCount: vol.replicaCount,
      accessMode: vol.accessMode,
      backingImage: vol.backingImage ?? null,
      state: 'detached',
      attachedHost: eng?.hostId ?? null,
      writerHost,
      frontend: eng ? { disabled: eng.frontendDisabled, nbd: eng.nbd } : null,
      migration: mig ? migrationInfo(mig) : null,
      epoch: eng?.epoch ?? 0,
      nbd: null,
      replicas: replicas.map((r) => ({ id: r.id, hostId: r.hostId, name: r.name, mode: r.mode })),
    };
    if (!eng || !writerHost) return base;
    let info: EngineInfo;
    try {
      info = await withTimeout(this.#engineOf(writerHost).engineInfo(name), HOST_PROBE_TIMEOUT_MS, `engine of ${name} on ${writerHost}`);
    } catch {
      return { ...base, state: 'unknown' };
    }
    if (base.migration) base.migration.epoch = mig?.targetActivated ? info.epoch : 0;
    const rw = info.replicas.filter((r) => r.mode === 'RW').length;
    return {
      ...base,
      epoch: info.epoch,
      nbd: info.nbd,
      state: rw === 0 ? 'faulted' : rw >= vol.replicaCount && info.replicas.every((r) => r.mode === 'RW') ? 'healthy' : 'degraded',
      replicas: info.replicas.map((r) => ({ id: r.id, hostId: r.hostId, name: r.name, mode: r.mode, ...(r.rebuild ? { rebuild: { ...r.rebuild } } : {}) })),
    };
  }

  /**
   * One pass of the repair loop over every attached volume: records replica modes, and
   * replaces replicas that stayed ERR longer than the replacement wait with new ones on
   * hosts holding none of the volume's replicas. The loop calls this every
   * `repairIntervalMs`; tests and embedders may call it directly.
   */
  async repairOnce(): Promise<void> {
    // Tickets first: attach, detach, finish or undo migrations (a host may have died).
    for (const d of await this.#store.list<unknown>(KIND.attachment)) {
      if (this.#closed) return;
      const volume = d.key;
      await this.#serial(volume, () => this.#converge(volume)).catch((err: unknown) => {
        safeEmit(this, 'warning', toMooringError(err, `reconciling the attachment of ${volume}`));
      });
    }
    for (const d of await this.#store.list<unknown>(KIND.engine)) {
      const volume = parseEngineRecord(d.value, d.key).volume;
      // The record is read again inside the volume's turn: an attach queued before this
      // pass may have moved the engine, and acting on the old record would take the new
      // engine for a stray one.
      await this.#serial(volume, async () => {
        const eng = await this.#engineRecord(volume);
        // A migrating volume is left alone (its writer moves); the reconcile above recovers it.
        if (eng && !(await this.#migrationRecord(volume))) await this.#repairVolume(eng);
      }).catch((err: unknown) => {
        safeEmit(this, 'warning', toMooringError(err, `repairing ${volume}`));
      });
    }
    // Backing images last: copies for replacements made above, cleanup of unused files.
    if (!this.#closed) await this.#images.reconcileAll().catch((err: unknown) => safeEmit(this, 'warning', toMooringError(err, 'reconciling backing images')));
  }

  // --- backing images (src/backing-image/) ---

  /**
   * Creates a backing image: records it (with a new UUID) and starts preparing its first
   * file on a host from its source (download, upload, or a snapshot of a volume). Await
   * `waitReady()` on the handle; an upload source waits for `upload(stream)`.
   *
   * @throws MooringError INVALID_ARGUMENT, ALREADY_EXISTS, NOT_FOUND (host or source volume), UNAVAILABLE (no reachable host)
   */
  async createBackingImage(options: BackingImageCreateOptions): Promise<BackingImage> {
    this.#checkOpen();
    return this.#images.create(options);
  }

  /** The handle of a backing image (status, waitReady, upload, cancel, delete, cleanup, events); one object per name. */
  backingImage(name: string): BackingImage {
    return this.#images.handle(name);
  }

  /** Every backing image with its status. */
  listBackingImages(): Promise<BackingImageStatus[]> {
    return this.#images.list();
  }

  // Volumes on each backing image and the hosts of their replicas.
  async #imageUsage(): Promise<Map<string, { volumes: Set<string>; hosts: Set<string> }>> {
    const out = new Map<string, { volumes: Set<string>; hosts: Set<string> }>();
    const vols = (await this.#store.list<unknown>(KIND.volume)).map((d) => parseVolumeRecord(d.value, d.key)).filter((v) => v.backingImage);
    if (vols.length === 0) return out;
    const replicas = (await this.#store.list<unknown>(KIND.replica)).map((d) => parseReplicaRecord(d.value, d.key));
    for (const v of vols) {
      const e = out.get(v.backingImage!) ?? { volumes: new Set<string>(), hosts: new Set<string>() };
      out.set(v.backingImage!, e);
      e.volumes.add(v.name);
      for (const r of replicas) if (r.volume === v.name) e.hosts.add(r.hostId);
    }
    return out;
  }

  /** Stops the repair loop and stops watching data engines. Engines keep running on their hosts. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#images.close();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#repairing?.catch(() => undefined);
    for (const h of this.#hosts.values()) h.unwatch();
    this.#hosts.clear();
    this.#migrationHooks.clear();
  }

  // --- attachment: tickets and the reconcile loop ---

  async #attach(name: string, options: ClusterAttachOptions): Promise<ClusterVolumeStatus> {
    this.#checkOpen();
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `attach options must be an object (got ${describe(options)})`);
    const host = checkName('host id', options.host);
    this.#engineOf(host);
    const attacher = options.attacher ?? 'api';
    if (attacher !== 'api' && attacher !== 'workload') throw new MooringError('INVALID_ARGUMENT', `attacher must be 'api' or 'workload' (got ${describe(attacher)})`);
    const parameters = checkParameters({ disableFrontend: options.disableFrontend === true ? 'true' : 'false', nbd: options.nbd ?? null, lastAttachedBy: options.lastAttachedBy ?? null });
    const id = checkTicketIdentity(options.ticketId ?? `${attacher}-${host}`, attacher).id;
    const timeoutMs = checkIntIn('timeoutMs', options.timeoutMs, 0, MS_SETTING_MAX, this.#ticketWaitMs);
    const created = await this.#serial(name, async () => {
      const o = await this.#observe(name);
      if (o.eng && o.eng.hostId !== host) {
        if (o.engState === 'unreachable' && !o.mig) {
          // Its host is gone, and so is the VM that used it there: its tickets go, and the
          // new engine's epoch fences the old one (an engine-taken-over event follows).
          const kept = o.att.tickets.filter((t) => !(t.hostId === o.eng!.hostId && MIGRATING_ATTACHERS.has(t.type)));
          await this.#putTickets(o, kept);
          this.#takeovers.set(name, o.eng.hostId);
          await this.#store.delete(KIND.engine, name);
        } else if (o.vol.accessMode === 'rwo' || o.eng.frontendDisabled || parameters.disableFrontend === 'true' || (o.mig && o.mig.targetHost !== host)) {
          const why = o.mig ? `it is migrating from ${o.mig.sourceHost} to ${o.mig.targetHost}` : o.vol.accessMode === 'rwo' ? 'it is RWO' : 'it is attached without frontend (block migration needs one)';
          throw new MooringError('BUSY', `volume ${name} is attached on ${o.eng.hostId} and ${why}; detach it first`, { details: { attachedHost: o.eng.hostId } });
        }
      }
      const isNew = !o.att.tickets.some((t) => t.id === id);
      await this.#upsertTicket(o, { id, type: attacher, hostId: host, parameters, generation: 0 });
      await this.#converge(name);
      return isNew;
    });
    try {
      await this.#waitSatisfied(name, id, timeoutMs);
    } catch (err) {
      // A ticket this call created and could not satisfy is withdrawn (a failed migration start, a timeout).
      if (created) await this.#serial(name, async () => this.#removeTickets(name, (t) => t.id === id)).catch(() => undefined);
      throw err;
    }
    const st = await this.status(name);
    const taken = this.#takeovers.get(name);
    if (taken !== undefined) {
      this.#takeovers.delete(name);
      safeEmit(this, 'engine-taken-over', { volume: name, fromHost: taken, toHost: host, epoch: st.epoch });
    }
    return st;
  }

  async #detach(name: string, options: ClusterDetachOptions): Promise<void> {
    this.#checkOpen();
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `detach options must be an object (got ${describe(options)})`);
    const host = options.host === undefined || options.host === '' ? null : checkName('host id', options.host);
    const ticketId = options.ticketId === undefined ? null : checkTicketIdentity(options.ticketId, 'api').id;
    await this.#serial(name, async () => {
      await this.#volume(name);
      await this.#removeTickets(name, (t) => (ticketId !== null ? t.id === ticketId : MIGRATING_ATTACHERS.has(t.type) && (host === null || t.hostId === host)));
    });
  }

  // Removes matching tickets and reconciles. Caller holds the volume's turn.
  async #removeTickets(name: string, match: (t: AttachmentTicket) => boolean): Promise<void> {
    const o = await this.#observe(name);
    const kept = o.att.tickets.filter((t) => !match(t));
    if (kept.length !== o.att.tickets.length) await this.#putTickets(o, kept);
    await this.#converge(name);
  }

  async #upsertTicket(o: Observed, t: AttachmentTicket): Promise<void> {
    const old = o.att.tickets.find((x) => x.id === t.id);
    const same = old && old.type === t.type && old.hostId === t.hostId && JSON.stringify(old.parameters) === JSON.stringify(t.parameters);
    if (same) return;
    // Neither engine of a migration can change its frontend midway: a ticket for either host
    // that the engine there could not serve waits until the migration ends, or is refused
    // if it would replace the ticket the engine serves.
    if (o.mig && old && (t.hostId === o.mig.sourceHost || t.hostId === o.mig.targetHost)) {
      const fe = t.hostId === o.mig.targetHost ? o.vol.migrationFrontend : { disabled: o.eng?.frontendDisabled ?? false, nbd: o.eng?.nbd ?? null };
      if (!frontendCompatible(t.parameters, fe)) {
        throw new MooringError('BUSY', `volume ${o.vol.name} is migrating from ${o.mig.sourceHost} to ${o.mig.targetHost}; ticket ${t.id} cannot change the frontend of ${t.hostId} until the migration ends`);
      }
    }
    if (!old && o.att.tickets.length >= ATTACHMENT_TICKETS_MAX) throw new MooringError('OUT_OF_RANGE', `volume ${o.vol.name} has ${ATTACHMENT_TICKETS_MAX} tickets already`);
    const next = { ...t, generation: (old?.generation ?? 0) + 1 };
    await this.#putTickets(o, [...o.att.tickets.filter((x) => x.id !== t.id), next]);
  }

  async #putTickets(o: Observed, tickets: AttachmentTicket[]): Promise<void> {
    const rec: AttachmentRecord = { ...o.att, schema: CLUSTER_SCHEMA_VERSION, tickets };
    const put = await this.#store.put(KIND.attachment, o.vol.name, rec, { expectedVersion: o.attVersion });
    o.att = rec;
    o.attVersion = put.version;
  }

  async #waitSatisfied(name: string, id: string, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const att = await this.#attachment(name);
      const t = att.rec.tickets.find((x) => x.id === id);
      if (!t) throw new MooringError('INVALID_STATE', `ticket ${id} of ${name} was withdrawn while waiting for it`);
      const st = att.rec.statuses.find((x) => x.id === id);
      if (st?.satisfied && st.generation === t.generation) return;
      if (Date.now() >= deadline) {
        const why = st?.conditions[0]?.message ?? 'not reconciled yet';
        throw new MooringError('BUSY', `ticket ${id} of ${name} not satisfied within ${timeoutMs} ms: ${why}`, { details: { reason: st?.conditions[0]?.reason ?? null } });
      }
      await sleep(TICKET_POLL_MS);
      this.#checkOpen();
      await this.#serial(name, () => this.#converge(name));
    }
  }

  // Reads the records and what runs. Drops an engine record whose engine is gone (its data
  // engine restarted): the next pass attaches again if a ticket still asks.
  async #observe(name: string): Promise<Observed> {
    const vol = await this.#volume(name);
    const att = await this.#attachment(name);
    let eng = await this.#engineRecord(name);
    const mig = await this.#migrationRecord(name);
    let engState: Observed['engState'] = 'none';
    let engInfo: EngineInfo | null = null;
    if (eng) {
      const p = await this.#probe(eng.hostId, name);
      if (p === 'stopped') {
        if (!mig) await this.#store.delete(KIND.engine, name);
        eng = null;
      } else if (p === 'unreachable') {
        engState = 'unreachable';
      } else {
        engState = 'running';
        engInfo = p;
      }
    }
    return { vol, att: att.rec, attVersion: att.version, eng, engState, engInfo, mig };
  }

  /**
   * Brings one volume's engines to what its tickets ask, one step per pass: migration
   * recovery, then the reconciler's decision (spec), then one action (start, stop, migrate,
   * confirm, roll back). Ends by recording the ticket statuses. Caller holds the volume's turn.
   */
  async #converge(name: string): Promise<void> {
    for (let pass = 0; pass < CONVERGE_PASSES_MAX; pass++) {
      const o = await this.#observe(name);
      if (o.mig && (await this.#recoverMigration(o))) continue;
      const targetReady = o.mig !== null && (o.mig.phase === 'target-ready' || o.mig.phase === 'handed-over') && (await this.#probe(o.mig.targetHost, name)) !== 'unreachable';
      const attachedFrontend: Frontend | null = o.eng ? { disabled: o.eng.frontendDisabled, nbd: o.eng.nbd } : null;
      const d = decideAttachment({
        accessMode: o.vol.accessMode,
        desiredHost: o.vol.desiredHost,
        migrationHost: o.vol.migrationHost,
        frontend: o.vol.frontend,
        migrationFrontend: o.vol.migrationFrontend,
        attachedHost: o.eng?.hostId ?? null,
        attachedFrontend,
        migrationTargetReady: targetReady,
        tickets: o.att.tickets,
      });
      if (!sameSpec(d, o.vol)) {
        o.vol = { ...o.vol, schema: CLUSTER_SCHEMA_VERSION, desiredHost: d.desiredHost, migrationHost: d.migrationHost, frontend: d.frontend, migrationFrontend: d.migrationFrontend };
        await this.#store.put(KIND.volume, name, o.vol);
      }
      let acted: boolean;
      try {
        acted = await this.#act(o, d);
      } catch (err) {
        // The statuses still tell the truth about what runs (the step did not happen).
        await this.#putStatuses(o, d).catch(() => undefined);
        throw err;
      }
      if (acted) continue;
      await this.#putStatuses(o, d);
      return;
    }
  }

  async #putStatuses(o: Observed, d: AttachmentDecision): Promise<void> {
    if (JSON.stringify(o.att.statuses) === JSON.stringify(d.statuses)) return;
    const rec: AttachmentRecord = { ...o.att, schema: CLUSTER_SCHEMA_VERSION, statuses: d.statuses };
    const put = await this.#store.put(KIND.attachment, o.vol.name, rec, { expectedVersion: o.attVersion });
    o.att = rec;
    o.attVersion = put.version;
  }

  // One step towards the decision; true if something changed (another pass follows).
  async #act(o: Observed, d: AttachmentDecision): Promise<boolean> {
    const name = o.vol.name;
    if (o.mig) {
      if (d.migrationHost !== null) return false; // the migration goes on; hand-over is the embedder's call
      if (d.desiredHost === o.mig.targetHost) await this.#confirm(name, true);
      else await this.#rollback(name, false, 'the target ticket was withdrawn');
      return true;
    }
    if (d.migrationHost !== null && o.eng && o.engState === 'running') {
      await this.#startMigration(o, d);
      return true;
    }
    if (o.eng && (d.desiredHost !== o.eng.hostId || d.desiredHost === null)) {
      await this.#stopEngine(o);
      return true;
    }
    if (d.desiredHost !== null && !o.eng) {
      await this.#startEngine(name, d.desiredHost, d.frontend);
      return true;
    }
    return false;
  }

  async #startEngine(name: string, host: string, frontend: Frontend): Promise<void> {
    const refs = await this.#refs(name);
    const nbd = frontend.disabled ? null : frontend.nbd;
    const info = await this.#withNewEpoch(name, 0, 'start', (epoch) => this.#startOn(host, { volume: name, replicas: refs, nbd, epoch }));
    const rec: EngineRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: name, hostId: host, nbd, frontendDisabled: frontend.disabled, epoch: info.epoch, startedMs: Date.now() };
    await this.#store.put(KIND.engine, name, rec);
    await this.#recordModes(name, info);
  }

  // Starts an engine (or a standby) on a host. An engine of the volume left there by an
  // earlier attachment (its host was unreachable when the volume moved on, so a newer epoch
  // fenced it, or a migration standby whose rollback could not reach it) is replaced. The
  // second start reuses the epoch: ALREADY_EXISTS is answered before anything is claimed.
  async #startOn(host: string, started: EngineStartOptions): Promise<EngineInfo> {
    const de = this.#engineOf(host);
    const options: EngineStartOptions = this.#engineIoTimeoutMs === undefined ? started : { ...started, ioTimeoutMs: this.#engineIoTimeoutMs };
    try {
      return await de.startEngine(options);
    } catch (err) {
      if (toMooringError(err).code !== 'ALREADY_EXISTS') throw err;
      await de.stopEngine(options.volume).catch(() => undefined);
      safeEmit(this, 'stray-engine-stopped', { volume: options.volume, hostId: host });
      return de.startEngine(options);
    }
  }

  // Stops the attached engine. If it stops but reports a failure on the way (say, its
  // replicas could not be marked clean on full disks), the volume is detached and the failure
  // is a warning; if its host cannot be reached, UNAVAILABLE (the next pass retries).
  async #stopEngine(o: Observed): Promise<void> {
    const eng = o.eng!;
    const h = this.#hosts.get(eng.hostId);
    if (!h) throw new MooringError('UNAVAILABLE', `volume ${o.vol.name} is attached on ${eng.hostId}, which is not a host of this cluster`);
    try {
      await h.engine.stopEngine(o.vol.name);
    } catch (err) {
      const e = toMooringError(err);
      if (e.code !== 'NOT_FOUND' && (await this.#probe(eng.hostId, o.vol.name)) !== 'stopped') throw e;
      if (e.code !== 'NOT_FOUND') safeEmit(this, 'warning', toMooringError(err, `detaching ${o.vol.name} from ${eng.hostId}`));
    }
    await this.#store.delete(KIND.engine, o.vol.name);
  }

  // Operations (snapshot, export, clone, rebuild) hold their own ticket while they run: on
  // the attached host (any frontend), or on `host` where the volume attaches itself without
  // frontend. `fn` gets the host whose engine writes.
  async #withTicket<T>(name: string, type: AttacherType, host: string, fn: (writer: string) => Promise<T>): Promise<T> {
    const id = `${type}-${randomUUID().slice(0, 8)}`;
    await this.#serial(name, async () => {
      const o = await this.#observe(name);
      const here = o.eng !== null && o.eng.hostId === host;
      await this.#upsertTicket(o, { id, type, hostId: host, parameters: checkParameters({ disableFrontend: here ? 'any' : 'true' }), generation: 0 });
      await this.#converge(name);
    });
    try {
      await this.#waitSatisfied(name, id, this.#ticketWaitMs);
      const mig = await this.#migrationRecord(name);
      return await fn(mig?.targetActivated ? mig.targetHost : host);
    } finally {
      await this.#serial(name, () => this.#removeTickets(name, (t) => t.id === id)).catch((err: unknown) =>
        safeEmit(this, 'warning', toMooringError(err, `withdrawing the ${type} ticket of ${name}`)),
      );
    }
  }

  // Where an operation runs: the attached host, else `preferred`, else the first reachable replica host.
  async #operationHost(name: string, preferred: string | undefined): Promise<string> {
    const eng = await this.#engineRecord(name);
    if (eng) return eng.hostId;
    if (preferred !== undefined) {
      this.#engineOf(checkName('host id', preferred));
      return preferred;
    }
    for (const r of await this.#replicas(name)) if (this.#hosts.has(r.hostId) && (await this.#reachable(r.hostId))) return r.hostId;
    throw new MooringError('UNAVAILABLE', `volume ${name}: no host holding one of its replicas can be reached`);
  }

  async #createSnapshot(name: string, snapshot: string, labels: Record<string, string> | undefined): Promise<EngineSnapshotInfo> {
    this.#checkOpen();
    checkName('snapshot name', snapshot);
    const host = await this.#operationHost(name, undefined);
    return this.#withTicket(name, 'snapshot', host, (w) => this.#engineOf(w).createSnapshot(name, snapshot, labels ? { labels } : {}));
  }

  async #listSnapshots(name: string): Promise<EngineSnapshotInfo[]> {
    this.#checkOpen();
    const host = await this.#operationHost(name, undefined);
    return this.#withTicket(name, 'snapshot', host, (w) => this.#engineOf(w).listSnapshots(name));
  }

  async #deleteSnapshot(name: string, snapshot: string): Promise<void> {
    this.#checkOpen();
    checkName('snapshot name', snapshot);
    const host = await this.#operationHost(name, undefined);
    await this.#withTicket(name, 'snapshot', host, (w) => this.#engineOf(w).deleteSnapshot(name, snapshot));
  }

  async #exportSnapshot(name: string, snapshot: string, options: { path: string; host?: string }): Promise<SnapshotCopyResult & { hostId: string }> {
    this.#checkOpen();
    checkName('snapshot name', snapshot);
    if (typeof options !== 'object' || options === null || typeof options.path !== 'string') throw new MooringError('INVALID_ARGUMENT', 'exportSnapshot needs { path }');
    const host = await this.#operationHost(name, options.host);
    return this.#withTicket(name, 'backup', host, async (w) => ({ ...(await this.#engineOf(w).exportSnapshot(name, snapshot, options.path)), hostId: w }));
  }

  async #rebuild(name: string, options: { host?: string; timeoutMs?: number }): Promise<ClusterVolumeStatus> {
    this.#checkOpen();
    const timeoutMs = checkIntIn('timeoutMs', options?.timeoutMs, 0, MS_SETTING_MAX, this.#ticketWaitMs);
    const host = await this.#operationHost(name, options?.host);
    return this.#withTicket(name, 'volume-rebuild', host, async () => {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const st = await this.status(name);
        if (st.state === 'healthy') return st;
        if (Date.now() >= deadline) throw new MooringError('UNAVAILABLE', `volume ${name} is still ${st.state} after ${timeoutMs} ms of rebuilding`, { details: { state: st.state } });
        await sleep(TICKET_POLL_MS * 5);
        await this.#serial(name, async () => {
          const eng = await this.#engineRecord(name);
          if (eng) await this.#repairVolume(eng);
        });
      }
    });
  }

  async #ticketList(name: string): Promise<ClusterTicket[]> {
    await this.#volume(name);
    const att = (await this.#attachment(name)).rec;
    return att.tickets.map((t) => ({ ...t, status: att.statuses.find((s) => s.id === t.id) ?? null }));
  }

  async #setTicket(name: string, t: TicketOptions): Promise<ClusterTicket> {
    this.#checkOpen();
    if (typeof t !== 'object' || t === null) throw new MooringError('INVALID_ARGUMENT', `a ticket must be an object (got ${describe(t)})`);
    const { id, type } = checkTicketIdentity(t.id, t.type);
    const host = checkName('host id', t.host);
    const parameters = checkParameters(t.parameters ?? {});
    await this.#serial(name, async () => {
      const o = await this.#observe(name);
      await this.#upsertTicket(o, { id, type, hostId: host, parameters, generation: 0 });
      await this.#converge(name);
    });
    return (await this.#ticketList(name)).find((x) => x.id === id)!;
  }

  // --- migration (docs/migration.md) ---

  async #startMigration(o: Observed, d: AttachmentDecision): Promise<void> {
    const name = o.vol.name;
    const target = d.migrationHost!;
    const now = Date.now();
    const rec: MigrationRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: name, sourceHost: o.eng!.hostId, targetHost: target, phase: 'starting', handOver: null, targetActivated: false, startedMs: now, updatedMs: now };
    await this.#store.put(KIND.migration, name, rec, { expectedVersion: 0 });
    this.#emitVolume(name, 'migration-started', migrationInfo(rec));
    try {
      const refs = await this.#refs(name);
      await this.#startOn(target, { volume: name, replicas: refs, nbd: d.migrationFrontend.disabled ? null : d.migrationFrontend.nbd, standby: true });
    } catch (err) {
      const e = toMooringError(err, `starting the migration target of ${name} on ${target}`);
      await this.#store.delete(KIND.migration, name);
      // The target's tickets go with the failed start, or every pass would try again.
      await this.#removeTicketsOf(name, target);
      this.#emitVolume(name, 'migration-failed', { ...migrationInfo(rec), step: 'start', error: e });
      throw e;
    }
    const ready = await this.#putMigration({ ...rec, phase: 'target-ready' });
    this.#emitVolume(name, 'migration-target-ready', migrationInfo(ready));
  }

  async #removeTicketsOf(name: string, host: string): Promise<void> {
    const att = await this.#attachment(name);
    const kept = att.rec.tickets.filter((t) => !(t.hostId === host && MIGRATING_ATTACHERS.has(t.type)));
    if (kept.length !== att.rec.tickets.length) await this.#store.put(KIND.attachment, name, { ...att.rec, tickets: kept }, { expectedVersion: att.version });
  }

  async #putMigration(m: MigrationRecord): Promise<MigrationRecord> {
    const next = { ...m, updatedMs: Date.now() };
    await this.#store.put(KIND.migration, m.volume, next);
    return next;
  }

  async #migrate(name: string, target: string, options: MigrateOptions): Promise<MigrationInfo> {
    this.#checkOpen();
    checkName('host id', target);
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `migrate options must be an object (got ${describe(options)})`);
    await this.#serial(name, async () => {
      const o = await this.#observe(name);
      if (o.vol.accessMode !== 'migratable') throw new MooringError('INVALID_STATE', `volume ${name} is RWO; create it with accessMode 'migratable' to migrate it`);
      if (!o.eng || o.engState !== 'running') throw new MooringError('INVALID_STATE', `volume ${name} is not attached on a reachable host`);
      if (o.eng.hostId === target) throw new MooringError('INVALID_STATE', `volume ${name} is attached on ${target} already`);
      if (o.eng.frontendDisabled) throw new MooringError('INVALID_STATE', `volume ${name} is attached without frontend (an operation holds it); migrate it once attached for a VM`);
      if (o.mig && o.mig.targetHost !== target) throw new MooringError('INVALID_STATE', `volume ${name} is migrating to ${o.mig.targetHost} already`);
    });
    if (options.hooks !== undefined || options.locks !== undefined) this.#setHooks(name, options.hooks ?? null, options.locks ?? null);
    await this.#attach(name, { host: target, nbd: options.nbd ?? null, attacher: options.attacher ?? 'api', ...(options.ticketId ? { ticketId: options.ticketId } : {}) });
    const m = await this.#migrationRecord(name);
    if (!m || m.targetHost !== target) throw new MooringError('INVALID_STATE', `volume ${name}: the migration to ${target} ended before it could be handed over`);
    return migrationInfo(m);
  }

  #setHooks(name: string, hooks: MigrationHooks | null, locks: MigrationLocks | null): void {
    if (hooks === null && locks === null) this.#migrationHooks.delete(name);
    else this.#migrationHooks.set(name, { hooks: hooks ?? {}, locks });
  }

  async #runHook(name: string, m: MigrationInfo, hook: keyof MigrationHooks): Promise<void> {
    const fn = this.#migrationHooks.get(name)?.hooks[hook];
    if (!fn) return;
    try {
      await fn(m);
    } catch (err) {
      const e = toMooringError(err, `migration hook ${hook} of ${name}`);
      this.#emitVolume(name, 'migration-failed', { ...m, step: hook, error: e });
      if (hook === 'beforeHandOver') throw e;
    }
  }

  async #handOver(name: string): Promise<HandOverResult> {
    this.#checkOpen();
    return this.#serial(name, async () => {
      const m = await this.#migrationRecord(name);
      if (!m) throw new MooringError('INVALID_STATE', `volume ${name} is not migrating`);
      return this.#handOverLocked(m);
    });
  }

  async #handOverLocked(m: MigrationRecord): Promise<HandOverResult> {
    const name = m.volume;
    if (m.phase === 'handed-over') {
      const info = await this.#engineOf(m.targetHost).engineInfo(name);
      return { ...migrationInfo(m, info.epoch), pauseMs: 0, drainMs: 0, rwReplicaIds: info.replicas.filter((r) => r.mode === 'RW').map((r) => r.id) };
    }
    if (m.phase !== 'target-ready') throw new MooringError('INVALID_STATE', `migration of ${name} is ${m.phase}; hand-over needs target-ready`);
    await this.#runHook(name, migrationInfo(m), 'beforeHandOver');
    const source = this.#engineOf(m.sourceHost);
    const target = this.#engineOf(m.targetHost);
    const locks = this.#migrationHooks.get(name)?.locks ?? null;
    const fail = (step: string, err: unknown): MooringError => {
      const e = toMooringError(err, `migration of ${name}: ${step}`);
      this.#emitVolume(name, 'migration-failed', { ...migrationInfo(m), step, error: e });
      return e;
    };
    const t0 = performance.now();
    let ho: EngineHandOver;
    try {
      ho = await source.deactivateEngine(name);
    } catch (err) {
      throw fail('deactivate-source', err);
    }
    const t1 = performance.now();
    let rec = await this.#putMigration({ ...m, phase: 'handing-over', handOver: { epoch: ho.epoch, generation: ho.generation, rwReplicaIds: [...ho.rwReplicaIds] } });
    // Back to the source: it claims a newer epoch over the replicas it handed over.
    const back = async (): Promise<void> => {
      await this.#activateWithNewEpoch(source, name, ho);
      rec = await this.#putMigration({ ...rec, phase: 'target-ready', handOver: null });
    };
    let lockHandover = null;
    if (locks) {
      try {
        lockHandover = await locks.source.handOver();
        await locks.target.takeOver(lockHandover, locks.lockspaces);
      } catch (err) {
        if (lockHandover) await locks.source.takeOver(lockHandover, locks.lockspaces).catch((e: unknown) => safeEmit(this, 'warning', toMooringError(e, `re-acquiring the locks of ${name} on the source`)));
        await back();
        throw fail('locks', err);
      }
    }
    let info: EngineInfo;
    try {
      info = await this.#activateWithNewEpoch(target, name, ho);
    } catch (err) {
      if (locks && lockHandover) {
        const again = await locks.target.handOver().catch(() => lockHandover!);
        await locks.source.takeOver(again, locks.lockspaces).catch((e: unknown) => safeEmit(this, 'warning', toMooringError(e, `re-acquiring the locks of ${name} on the source`)));
      }
      await back();
      throw fail('activate-target', err);
    }
    const t2 = performance.now();
    rec = await this.#putMigration({ ...rec, phase: 'handed-over', targetActivated: true });
    const result: HandOverResult = { ...migrationInfo(rec, info.epoch), pauseMs: t2 - t0, drainMs: t1 - t0, rwReplicaIds: ho.rwReplicaIds };
    this.#emitVolume(name, 'migration-handed-over', result);
    await this.#runHook(name, migrationInfo(rec, info.epoch), 'afterHandOver');
    return result;
  }

  async #confirmCall(name: string): Promise<void> {
    this.#checkOpen();
    await this.#serial(name, async () => {
      const m = await this.#migrationRecord(name);
      if (!m) throw new MooringError('INVALID_STATE', `volume ${name} is not migrating`);
      await this.#confirm(name, false);
      await this.#converge(name);
    });
  }

  async #rollbackCall(name: string): Promise<void> {
    this.#checkOpen();
    await this.#serial(name, async () => {
      const m = await this.#migrationRecord(name);
      if (!m) throw new MooringError('INVALID_STATE', `volume ${name} is not migrating`);
      await this.#rollback(name, false, 'asked by the embedder');
      await this.#converge(name);
    });
  }

  // Ends a migration on the target. Caller holds the volume's turn.
  async #confirm(name: string, viaTickets: boolean, automatic = false): Promise<void> {
    let m = (await this.#migrationRecord(name))!;
    if (m.phase === 'target-ready') {
      await this.#handOverLocked(m);
      m = (await this.#migrationRecord(name))!;
    }
    if (m.phase !== 'handed-over' && m.phase !== 'confirming') throw new MooringError('INVALID_STATE', `migration of ${name} is ${m.phase}; it cannot be confirmed now`);
    m = await this.#putMigration({ ...m, phase: 'confirming' });
    const src = this.#hosts.get(m.sourceHost);
    if (src) {
      await src.engine.stopEngine(name).catch((err: unknown) => {
        // A source that cannot be reached is fenced already; the repair loop stops it later.
        if (toMooringError(err).code !== 'NOT_FOUND') safeEmit(this, 'warning', toMooringError(err, `stopping the migration source of ${name} on ${m.sourceHost}`));
      });
    }
    const vol = await this.#volume(name);
    const info = await this.#engineOf(m.targetHost).engineInfo(name);
    const frontend = vol.migrationFrontend;
    const eng: EngineRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: name, hostId: m.targetHost, nbd: frontend.disabled ? null : frontend.nbd, frontendDisabled: frontend.disabled, epoch: info.epoch, startedMs: Date.now() };
    await this.#store.put(KIND.engine, name, eng);
    await this.#store.put(KIND.volume, name, { ...vol, schema: CLUSTER_SCHEMA_VERSION, desiredHost: m.targetHost, migrationHost: null, frontend });
    if (!viaTickets) await this.#removeTicketsOf(name, m.sourceHost);
    await this.#store.delete(KIND.migration, name);
    const done = migrationInfo({ ...m, phase: 'confirming' }, info.epoch);
    this.#emitVolume(name, 'migration-confirmed', { ...done, automatic });
    await this.#runHook(name, done, 'afterConfirm');
  }

  // Ends a migration on the source. Caller holds the volume's turn.
  async #rollback(name: string, automatic: boolean, reason: string): Promise<void> {
    let m = (await this.#migrationRecord(name))!;
    m = await this.#putMigration({ ...m, phase: 'rolling-back' });
    const target = this.#hosts.get(m.targetHost);
    if (m.targetActivated) {
      // The target may have written: it drains and hands back; the source claims a newly allocated epoch.
      const ho = target ? await target.engine.deactivateEngine(name).catch(() => null) : null;
      const src = this.#engineOf(m.sourceHost);
      if (ho) {
        const locks = this.#migrationHooks.get(name)?.locks ?? null;
        if (locks) {
          try {
            await locks.source.takeOver(await locks.target.handOver(), locks.lockspaces);
          } catch (err) {
            const e = toMooringError(err, `moving the locks of ${name} back to the source`);
            this.#emitVolume(name, 'migration-failed', { ...migrationInfo(m), step: 'locks', error: e });
            throw e;
          }
        }
        const role = await src.engineInfo(name).then((i) => i.role, () => null);
        if (role === 'standby') await this.#activateWithNewEpoch(src, name, ho);
      } else {
        // The target cannot hand back (its host is gone, or it was fenced): the source takes
        // the volume over as after a crash. A fresh engine claims a newly allocated epoch,
        // above every one handed out before; replicas the target fenced open ERR and are rebuilt.
        const eng = await this.#engineRecord(name);
        await src.stopEngine(name).catch(() => undefined);
        const refs = await this.#refs(name);
        const info = await this.#withNewEpoch(name, 0, 'start', (epoch) => this.#startOn(m.sourceHost, { volume: name, replicas: refs, nbd: eng?.nbd ?? null, epoch }));
        if (eng) await this.#store.put(KIND.engine, name, { ...eng, epoch: info.epoch, startedMs: Date.now() });
      }
      m = await this.#putMigration({ ...m, targetActivated: false });
    }
    if (target) {
      await target.engine.stopEngine(name).catch((err: unknown) => {
        if (toMooringError(err).code !== 'NOT_FOUND') safeEmit(this, 'warning', toMooringError(err, `stopping the migration target of ${name} on ${m.targetHost}`));
      });
    }
    await this.#removeTicketsOf(name, m.targetHost);
    const vol = await this.#volume(name);
    await this.#store.put(KIND.volume, name, { ...vol, schema: CLUSTER_SCHEMA_VERSION, migrationHost: null });
    await this.#store.delete(KIND.migration, name);
    const info = await this.#engineOf(m.sourceHost).engineInfo(name).then((i) => i.epoch, () => 0);
    const done = migrationInfo(m, info);
    this.#emitVolume(name, 'migration-rolled-back', { ...done, automatic, reason });
    await this.#runHook(name, done, 'afterRollback');
  }

  // A migration found in an intermediate state (a crash of a host, or of this process):
  // finish or undo it. True if something changed.
  async #recoverMigration(o: Observed): Promise<boolean> {
    const m = o.mig!;
    const name = m.volume;
    const target = await this.#probe(m.targetHost, name);
    const source = await this.#probe(m.sourceHost, name);
    switch (m.phase) {
      case 'starting':
        if (target !== 'unreachable' && target !== 'stopped') {
          await this.#putMigration({ ...m, phase: 'target-ready' });
          this.#emitVolume(name, 'migration-target-ready', migrationInfo(m));
        } else {
          await this.#rollback(name, true, `the target engine on ${m.targetHost} did not start`);
        }
        return true;
      case 'target-ready':
        if (target === 'unreachable' || target === 'stopped') {
          await this.#rollback(name, true, `the target ${target === 'stopped' ? 'engine is gone' : 'host cannot be reached'}`);
          return true;
        }
        return false;
      case 'handing-over': {
        // Interrupted between the source's drain and the target's claim.
        if (target !== 'unreachable' && target !== 'stopped' && target.role === 'active') {
          await this.#putMigration({ ...m, phase: 'handed-over', targetActivated: true });
        } else if (source !== 'unreachable' && source !== 'stopped' && m.handOver) {
          if (source.role === 'standby') await this.#activateWithNewEpoch(this.#engineOf(m.sourceHost), name, m.handOver);
          await this.#putMigration({ ...m, phase: 'target-ready', handOver: null });
        } else if (target !== 'unreachable' && target !== 'stopped' && m.handOver) {
          await this.#activateWithNewEpoch(this.#engineOf(m.targetHost), name, m.handOver);
          await this.#putMigration({ ...m, phase: 'handed-over', targetActivated: true });
        } else {
          return false; // neither side can be reached: wait
        }
        return true;
      }
      case 'handed-over':
        if (target === 'unreachable' || target === 'stopped') {
          await this.#rollback(name, true, `the target ${target === 'stopped' ? 'engine is gone' : 'host cannot be reached'} after hand-over`);
          return true;
        }
        if (source === 'unreachable') {
          await this.#confirm(name, false, true);
          return true;
        }
        return false;
      case 'confirming':
        await this.#confirm(name, false, true);
        return true;
      case 'rolling-back':
        await this.#rollback(name, true, 'finishing a rollback that was interrupted');
        return true;
    }
  }

  #emitVolume<E extends keyof import('./cluster-volume.js').ClusterVolumeEvents>(name: string, event: E, ...args: Parameters<import('./cluster-volume.js').ClusterVolumeEvents[E]>): void {
    safeEmit(this.volume(name), event, ...args);
  }

  // --- writer epochs (src/cluster/epochs.ts, docs/single-writer.md) ---

  // Runs a start or an activation of the volume's engine with a newly allocated epoch (above
  // `atLeast`). Refused with STALE_EPOCH because a replica promised that epoch or more
  // (replicas of a release whose engines chose their epochs, whose epochs the store never
  // saw), it is tried again above the highest epoch the replicas report, at most
  // EPOCH_ATTEMPTS_MAX epochs in all. A refusal that no listed epoch explains is not tried
  // again: for a start, no replica at or above the epoch refused (the replicas that refused
  // cannot be listed from here); for an activation, none above it, since a refused activation
  // has claimed its epoch on the replicas anyway, and its STALE_EPOCH more likely says that
  // the hand-over was overtaken, which no epoch mends.
  async #withNewEpoch<T>(name: string, atLeast: number, kind: 'start' | 'activate', run: (epoch: number) => Promise<T>): Promise<T> {
    let floor = atLeast;
    for (let attempt = 1; ; attempt++) {
      const epoch = await this.#epochs.allocate(name, floor);
      try {
        return await run(epoch);
      } catch (err) {
        if (toMooringError(err).code !== 'STALE_EPOCH' || attempt >= EPOCH_ATTEMPTS_MAX) throw err;
        const seen = await this.#replicaEpochMax(name);
        if (seen < epoch || (kind === 'activate' && seen === epoch)) throw err;
        floor = seen;
      }
    }
  }

  // Activates a standby from a hand-over with a newly allocated epoch (above the hand-over's,
  // as the engine requires).
  #activateWithNewEpoch(de: DataEngine, name: string, handOver: EngineHandOver): Promise<EngineInfo> {
    return this.#withNewEpoch(name, handOver.epoch, 'activate', (epoch) => de.activateEngine(name, handOver, { epoch }));
  }

  // The highest epoch the volume's replicas promised, as their data engines list them (hosts
  // that do not answer in time are left out: 0 if none does).
  async #replicaEpochMax(name: string): Promise<number> {
    const byHost = new Map<string, Set<string>>();
    for (const r of await this.#replicas(name)) {
      const names = byHost.get(r.hostId) ?? new Set<string>();
      byHost.set(r.hostId, names.add(r.name));
    }
    let max = 0;
    await Promise.all(
      [...byHost].map(async ([hostId, names]) => {
        const h = this.#hosts.get(hostId);
        if (!h) return;
        const listed = await withTimeout(h.engine.listReplicas(), HOST_PROBE_TIMEOUT_MS, `replicas of ${hostId}`).catch(() => []);
        for (const r of listed) {
          if (names.has(r.name) && Number.isSafeInteger(r.epoch) && r.epoch > max) max = r.epoch;
        }
      }),
    );
    return max;
  }

  // --- store upgrade ---

  // Schema 1 (before tickets): a volume with an engine record gets an `api` ticket for that
  // host (it was attached by the embedder's call), so it stays attached; every volume gets
  // an access mode (rwo) and an empty attachment record. Runs at open, idempotent.
  async #upgradeStore(): Promise<number> {
    let upgraded = 0;
    for (const d of await this.#store.list<unknown>(KIND.volume)) {
      const raw = d.value as { schema?: unknown };
      if (typeof raw === 'object' && raw !== null && typeof raw.schema === 'number' && raw.schema >= 2) continue;
      const vol = parseVolumeRecord(d.value, d.key);
      const eng = await this.#engineRecord(vol.name);
      const tickets: AttachmentTicket[] = eng
        ? [{ id: `api-${eng.hostId}`, type: 'api', hostId: eng.hostId, parameters: checkParameters({ nbd: eng.nbd }), generation: 1 }]
        : [];
      if (!(await this.#store.get(KIND.attachment, vol.name))) {
        const att: AttachmentRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: vol.name, tickets, statuses: [] };
        await this.#store.put(KIND.attachment, vol.name, att, { expectedVersion: 0 });
      }
      if (eng) await this.#store.put(KIND.engine, vol.name, { ...eng, schema: CLUSTER_SCHEMA_VERSION, frontendDisabled: false });
      const next: VolumeRecord = { ...vol, schema: CLUSTER_SCHEMA_VERSION, accessMode: 'rwo', desiredHost: eng?.hostId ?? null, migrationHost: null, frontend: { disabled: false, nbd: eng?.nbd ?? null }, migrationFrontend: { ...NO_FRONTEND_CHOSEN } };
      await this.#store.put(KIND.volume, vol.name, next, { expectedVersion: d.version });
      upgraded++;
    }
    return upgraded;
  }

  // --- internals ---

  #checkOpen(): void {
    if (this.#closed) throw new MooringError('CLOSED', 'cluster is closed');
  }

  #schedule(): void {
    this.#timer = setTimeout(() => {
      this.#repairing = this.repairOnce()
        .catch((err: unknown) => safeEmit(this, 'warning', toMooringError(err, 'repair loop')))
        .finally(() => {
          this.#repairing = null;
          if (!this.#closed) this.#schedule();
        });
    }, this.#repairIntervalMs);
    this.#timer.unref();
  }

  #serial<T>(volume: string, fn: () => Promise<T>): Promise<T> {
    return this.#volumeChains.run(volume, fn);
  }

  #engineOf(hostId: string): DataEngine {
    const h = this.#hosts.get(hostId);
    if (!h) throw new MooringError('NOT_FOUND', `host ${hostId} is not a host of this cluster (known: ${this.hostIds.join(', ') || 'none'})`);
    return h.engine;
  }

  async #volume(name: string): Promise<VolumeRecord> {
    checkName('volume name', name);
    const d = await this.#store.get<unknown>(KIND.volume, name);
    if (!d) throw new MooringError('NOT_FOUND', `no volume ${name}`);
    return parseVolumeRecord(d.value, d.key);
  }

  async #replicas(volume: string): Promise<ReplicaRecord[]> {
    const all = await this.#store.list<unknown>(KIND.replica);
    return all
      .map((d) => parseReplicaRecord(d.value, d.key))
      .filter((r) => r.volume === volume)
      .sort((a, b) => a.id.localeCompare(b.id, 'en', { numeric: true }));
  }

  async #engineRecord(volume: string): Promise<EngineRecord | null> {
    const d = await this.#store.get<unknown>(KIND.engine, volume);
    return d ? parseEngineRecord(d.value, d.key) : null;
  }

  async #attachment(volume: string): Promise<{ rec: AttachmentRecord; version: number }> {
    const d = await this.#store.get<unknown>(KIND.attachment, volume);
    if (!d) return { rec: { schema: CLUSTER_SCHEMA_VERSION, volume, tickets: [], statuses: [] }, version: 0 };
    return { rec: parseAttachmentRecord(d.value, d.key), version: d.version };
  }

  async #migrationRecord(volume: string): Promise<MigrationRecord | null> {
    const d = await this.#store.get<unknown>(KIND.migration, volume);
    return d ? parseMigrationRecord(d.value, d.key) : null;
  }

  // The volume's engine on a host: its info, or whether it is stopped or the host unreachable.
  async #probe(hostId: string, volume: string): Promise<EngineInfo | 'stopped' | 'unreachable'> {
    const h = this.#hosts.get(hostId);
    if (!h) return 'unreachable';
    try {
      return await withTimeout(h.engine.engineInfo(volume), HOST_PROBE_TIMEOUT_MS, `engine of ${volume} on ${hostId}`);
    } catch (err) {
      return toMooringError(err).code === 'NOT_FOUND' ? 'stopped' : 'unreachable';
    }
  }

  async #hostRecord(hostId: string): Promise<HostRecord | null> {
    const d = await this.#store.get<unknown>(KIND.host, hostId);
    return d ? parseHostRecord(d.value, d.key) : null;
  }

  #newReplicaRecord(volume: string, id: string, hostId: string): ReplicaRecord {
    return { schema: CLUSTER_SCHEMA_VERSION, volume, id, hostId, name: replicaName(volume, id), mode: 'unknown', failedSinceMs: null, lastError: null };
  }

  // Whether a host answers and runs the volume's engine.
  async #probeEngine(hostId: string, volume: string): Promise<'running' | 'stopped' | 'unreachable'> {
    const p = await this.#probe(hostId, volume);
    return typeof p === 'string' ? p : 'running';
  }

  async #reachable(hostId: string): Promise<boolean> {
    const h = this.#hosts.get(hostId);
    if (!h) return false;
    try {
      await withTimeout(h.engine.info(), HOST_PROBE_TIMEOUT_MS, `host ${hostId}`);
      return true;
    } catch {
      return false;
    }
  }

  async #refOf(r: ReplicaRecord): Promise<EngineReplicaRef> {
    const host = await this.#hostRecord(r.hostId);
    return { id: r.id, hostId: r.hostId, name: r.name, address: host?.replicaAddress ?? null };
  }

  async #refs(volume: string): Promise<EngineReplicaRef[]> {
    const out: EngineReplicaRef[] = [];
    for (const r of await this.#replicas(volume)) out.push(await this.#refOf(r));
    if (out.length === 0) throw new MooringError('NO_HEALTHY_REPLICA', `volume ${volume} has no replicas`);
    return out;
  }

  // Reachable hosts not in `exclude`, fewest replicas first.
  async #pickHosts(count: number, exclude: Set<string>): Promise<string[]> {
    const load = new Map<string, number>();
    for (const d of await this.#store.list<unknown>(KIND.replica)) {
      const r = parseReplicaRecord(d.value, d.key);
      load.set(r.hostId, (load.get(r.hostId) ?? 0) + 1);
    }
    const candidates: string[] = [];
    for (const id of this.#hosts.keys()) if (!exclude.has(id) && (await this.#reachable(id))) candidates.push(id);
    candidates.sort((a, b) => (load.get(a) ?? 0) - (load.get(b) ?? 0) || a.localeCompare(b));
    if (candidates.length < count) {
      throw new MooringError('UNAVAILABLE', `need ${count} reachable host(s) for replicas, have ${candidates.length} (${candidates.join(', ') || 'none'})`);
    }
    return candidates.slice(0, count);
  }

  async #recordModes(volume: string, info: EngineInfo): Promise<void> {
    const now = Date.now();
    for (const r of await this.#replicas(volume)) {
      const seen = info.replicas.find((x) => x.id === r.id);
      if (!seen) continue;
      const failedSinceMs = seen.mode === 'ERR' ? (r.failedSinceMs ?? now) : null;
      if (seen.mode === r.mode && failedSinceMs === r.failedSinceMs) continue;
      const lastError = seen.mode === 'ERR' && seen.lastError !== 0 ? `errno ${-seen.lastError}` : r.lastError;
      await this.#store.put(KIND.replica, r.name, { ...r, mode: seen.mode, failedSinceMs, lastError });
    }
  }

  async #repairVolume(eng: EngineRecord): Promise<void> {
    if (this.#closed) return;
    const vol = await this.#volume(eng.volume);
    const h = this.#hosts.get(eng.hostId);
    if (!h) return;
    let info: EngineInfo;
    try {
      info = await withTimeout(h.engine.engineInfo(eng.volume), HOST_PROBE_TIMEOUT_MS, `engine of ${eng.volume} on ${eng.hostId}`);
    } catch {
      return; // the engine's host is away: nothing to decide from here
    }
    await this.#recordModes(eng.volume, info);
    await this.#stopStrayEngines(eng);
    const records = await this.#replicas(eng.volume);
    const now = Date.now();
    const healthy = info.replicas.filter((r) => r.mode !== 'ERR').length;

    for (const r of records) {
      const seen = info.replicas.find((x) => x.id === r.id);
      if (!seen || seen.mode !== 'ERR') continue;
      // Its host is back under a new address (restarted data engine): re-add with the new one.
      const host = await this.#hostRecord(r.hostId);
      if (host && host.replicaAddress !== null && seen.address !== null && host.replicaAddress !== seen.address && (await this.#reachable(r.hostId))) {
        await h.engine.addReplica(eng.volume, { id: r.id, hostId: r.hostId, name: r.name, address: host.replicaAddress });
        return;
      }
      // Replace only while fewer than the wanted replicas are healthy, and only after the wait.
      if (healthy >= vol.replicaCount) continue;
      if (r.failedSinceMs === null || now - r.failedSinceMs < this.#replacementWaitMs) continue;
      const used = new Set(records.map((x) => x.hostId));
      let target: string;
      try {
        [target] = (await this.#pickHosts(1, used)) as [string];
      } catch {
        return; // no spare host offered yet
      }
      await this.#replace(eng, vol, r, target);
      return; // one replacement per pass per volume
    }
  }

  // An engine for the volume on another host is a leftover of a takeover (its host was
  // unreachable then): the newer epoch already fences it; stopping it releases its replicas
  // and its NBD socket.
  async #stopStrayEngines(eng: EngineRecord): Promise<void> {
    for (const [hostId, h] of this.#hosts) {
      if (hostId === eng.hostId) continue;
      const state = await this.#probeEngine(hostId, eng.volume);
      if (state !== 'running') continue;
      await h.engine.stopEngine(eng.volume).then(
        () => safeEmit(this, 'stray-engine-stopped', { volume: eng.volume, hostId }),
        (err: unknown) => safeEmit(this, 'warning', toMooringError(err, `stopping the stale engine of ${eng.volume} on ${hostId}`)),
      );
    }
  }

  async #replace(eng: EngineRecord, vol: VolumeRecord, old: ReplicaRecord, targetHost: string): Promise<void> {
    const engineHost = this.#engineOf(eng.hostId);
    const ids = new Set((await this.#replicas(vol.name)).map((r) => r.id));
    let n = 0;
    while (ids.has(`r${n}`)) n++;
    const rec = this.#newReplicaRecord(vol.name, `r${n}`, targetHost);
    if (vol.backingImage) {
      // The new host gets the image's file first (delivered from a ready copy).
      const lease = await this.#images.acquire(vol.backingImage, [targetHost], Math.min(REPLACEMENT_IMAGE_WAIT_MS, this.#ticketWaitMs));
      try {
        await this.#engineOf(targetHost).createReplica(rec.name, vol.sizeBytes, { backingImage: lease.backingImage });
        await this.#store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
      } finally {
        lease.release();
      }
    } else {
      await this.#engineOf(targetHost).createReplica(rec.name, vol.sizeBytes);
      await this.#store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
    }
    let result;
    try {
      result = await engineHost.addReplica(vol.name, await this.#refOf(rec));
    } catch (err) {
      await engineHost.removeReplica(vol.name, rec.id).catch(() => undefined);
      await this.#engineOf(targetHost).deleteReplica(rec.name).catch(() => undefined);
      await this.#store.delete(KIND.replica, rec.name).catch(() => undefined);
      throw toMooringError(err, `replacing ${old.id} of ${vol.name} on ${targetHost}`);
    }
    await this.#store.put(KIND.replica, rec.name, { ...rec, mode: 'RW' });
    await engineHost.removeReplica(vol.name, old.id).catch((err: unknown) => safeEmit(this, 'warning', toMooringError(err, `removing ${old.id} from ${vol.name}`)));
    const oldHost = this.#hosts.get(old.hostId);
    let deleted = false;
    if (oldHost) deleted = await oldHost.engine.deleteReplica(old.name).then(() => true, () => false);
    // A replica whose host is away keeps no record: when that host returns, its data engine
    // lists the directory, and an embedder may delete it (it belongs to no volume).
    await this.#store.delete(KIND.replica, old.name);
    if (!deleted) safeEmit(this, 'warning', new MooringError('UNAVAILABLE', `replica ${old.name} of ${vol.name} on ${old.hostId} was replaced but could not be deleted; delete it when the host is back`));
    safeEmit(this, 'replica-replaced', { volume: vol.name, oldReplicaId: old.id, oldHostId: old.hostId, newReplicaId: rec.id, newHostId: targetHost, sentBytes: result.sentBytes });
  }
}
