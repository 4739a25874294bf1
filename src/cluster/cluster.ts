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
 * The decisions are made by small controllers over one shared layer of state
 * (docs/architecture.md): attachment (tickets), migration, repair, backing images, and the
 * operations that run under a ticket of their own. This class opens them over a store,
 * offers hosts, creates and deletes volumes, hands out volume handles and runs the loop.
 *
 * @packageDocumentation
 */
import { EventEmitter } from 'node:events';
import type * as TE from 'typed-emitter';

import type { AccessMode } from '../attachment/attachment-reconciler.js';
import { BackingImageController } from '../backing-image/backing-image-controller.js';
import type { BackingImage, BackingImageCreateOptions, BackingImageStatus } from '../backing-image/backing-image.js';
import type { DataEngine, DataEngineEvent } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import type { StateStore } from '../state/state-store.js';
import { withTimeout } from '../util/async.js';
import { safeEmit } from '../util/emit.js';
import { checkIntIn, checkName, describe } from '../util/validate.js';
import { AttachmentController, MS_SETTING_MAX } from './attachment-controller.js';
import { CLUSTER_SCHEMA_VERSION, KIND, type HostRecord } from './cluster-records.js';
import { ClusterVolume, type ClusterAttachOptions, type ClusterDetachOptions, type ClusterVolumeStatus, type VolumeOps } from './cluster-volume.js';
import { ControlState } from './control-state.js';
import { EngineLifecycle } from './engine-lifecycle.js';
import { HOST_PROBE_TIMEOUT_MS, Hosts } from './hosts.js';
import { MigrationController } from './migration-controller.js';
import { RepairController } from './repair-controller.js';
import { upgradeStore } from './store-schema.js';
import { VolumeLifecycle } from './volume-lifecycle.js';
import { VolumeOperations } from './volume-operations.js';
import { VolumeResize } from './volume-resize.js';
import { volumeStatus } from './volume-status.js';

export { EPOCH_ATTEMPTS_MAX } from './engine-lifecycle.js';
export { HOST_PROBE_TIMEOUT_MS } from './hosts.js';
export type { ClusterAttachOptions, ClusterDetachOptions, ClusterReplicaStatus, ClusterVolumeStatus } from './cluster-volume.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** How often the repair loop looks at attached volumes, by default. */
export const DEFAULT_REPAIR_INTERVAL_MS = 2000;
/** How long a replica may stay ERR before it is replaced on another host, by default (Longhorn: 600 s). */
export const DEFAULT_REPLICA_REPLACEMENT_WAIT_MS = 600_000;
/** How long an attach (or an operation's own ticket) waits to be satisfied, by default. */
export const DEFAULT_TICKET_WAIT_TIMEOUT_MS = 60_000;
/** Bounds of {@link ClusterOptions.engineIoTimeoutMs} (those of the data engine's ioTimeoutMs). */
const ENGINE_IO_TIMEOUT_MS_MIN = 100;
const ENGINE_IO_TIMEOUT_MS_MAX = 600_000;
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

/**
 * Volumes across hosts; see the module comment. Create with {@link Cluster.open}; always
 * {@link Cluster.close} (it stops the repair loop; engines keep running on their hosts).
 */
export class Cluster extends (EventEmitter as new () => TypedEmitter<ClusterEvents>) {
  readonly #state: ControlState;
  readonly #attachment: AttachmentController;
  readonly #migrations: MigrationController;
  readonly #repair: RepairController;
  readonly #operations: VolumeOperations;
  readonly #volumes: VolumeLifecycle;
  readonly #images: BackingImageController;
  readonly #repairIntervalMs: number;
  #timer: NodeJS.Timeout | null = null;
  #repairing: Promise<void> | null = null;
  readonly #handles = new Map<string, ClusterVolume>();
  readonly #ops: VolumeOps;

  private constructor(options: ClusterOptions) {
    super();
    const hosts = new Hosts((hostId, e) => {
      this.#images.onDataEngineEvent(hostId, e);
      safeEmit(this, 'data-engine-event', hostId, e);
    });
    const state = new ControlState(
      options.store,
      hosts,
      {
        replacementWaitMs: options.replicaReplacementWaitMs ?? DEFAULT_REPLICA_REPLACEMENT_WAIT_MS,
        ticketWaitMs: options.ticketWaitTimeoutMs ?? DEFAULT_TICKET_WAIT_TIMEOUT_MS,
        engineIoTimeoutMs: options.engineIoTimeoutMs,
      },
      {
        cluster: (event, ...args) => safeEmit(this, event, ...args),
        volume: (name, event, ...args) => safeEmit(this.volume(name), event, ...args),
      },
    );
    this.#state = state;
    this.#repairIntervalMs = options.repairIntervalMs ?? DEFAULT_REPAIR_INTERVAL_MS;
    const engines = new EngineLifecycle(state);
    this.#migrations = new MigrationController(state, engines);
    this.#attachment = new AttachmentController(state, engines, this.#migrations);
    this.#images = new BackingImageController({
      store: state.store,
      hostIds: () => hosts.ids,
      engineOf: (h) => hosts.engineOf(h),
      usage: () => this.#imageUsage(),
      pickHost: async () => (await state.pickHosts(1, new Set()))[0]!,
      operationHost: async (v) => {
        await state.volume(v);
        return this.#attachment.operationHost(v, undefined);
      },
      withExportTicket: async (v, fn) => this.#attachment.withTicket(v, 'backing-image-export', await this.#attachment.operationHost(v, undefined), fn),
      warn: (e) => safeEmit(this, 'warning', e),
      cleanupWaitMs: options.backingImageCleanupWaitMs ?? DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS,
      probeTimeoutMs: HOST_PROBE_TIMEOUT_MS,
      waitTimeoutMs: state.settings.ticketWaitMs,
    });
    this.#repair = new RepairController(state, this.#images);
    this.#operations = new VolumeOperations(state, this.#attachment, this.#repair);
    this.#volumes = new VolumeLifecycle(state, this.#attachment, this.#images);
    const attachment = this.#attachment;
    const migrations = this.#migrations;
    const operations = this.#operations;
    const resize = new VolumeResize(state);
    this.#ops = {
      attach: (n, o) => attachment.attach(n, o),
      detach: (n, o) => attachment.detach(n, o),
      status: (n) => this.status(n),
      tickets: (n) => attachment.tickets(n),
      setTicket: (n, t) => attachment.setTicket(n, t),
      deleteTicket: (n, id) => attachment.deleteTicket(n, id),
      migrate: async (n, target, o) => {
        state.checkOpen();
        checkName('host id', target);
        if (typeof o !== 'object' || o === null) throw new MooringError('INVALID_ARGUMENT', `migrate options must be an object (got ${describe(o)})`);
        await state.serial(n, () => migrations.checkMigratable(n, target));
        if (o.hooks !== undefined || o.locks !== undefined) migrations.setHooks(n, o.hooks ?? null, o.locks ?? null);
        await attachment.attach(n, { host: target, nbd: o.nbd ?? null, attacher: o.attacher ?? 'api', ...(o.ticketId ? { ticketId: o.ticketId } : {}) });
        const m = await migrations.current(n);
        if (!m || m.targetHost !== target) throw new MooringError('INVALID_STATE', `volume ${n}: the migration to ${target} ended before it could be handed over`);
        return m;
      },
      migration: (n) => migrations.current(n),
      handOver: (n) => this.#migrationStep(n, () => migrations.handOver(n), false),
      confirm: (n) => this.#migrationStep(n, () => migrations.confirm(n, false), true),
      rollback: (n) => this.#migrationStep(n, () => migrations.rollback(n, false, 'asked by the embedder'), true),
      setHooks: (n, h, l) => migrations.setHooks(n, h, l),
      createSnapshot: (n, s, l) => operations.createSnapshot(n, s, l),
      listSnapshots: (n) => operations.listSnapshots(n),
      deleteSnapshot: (n, s) => operations.deleteSnapshot(n, s),
      exportSnapshot: (n, s, o) => operations.exportSnapshot(n, s, o),
      rebuild: (n, o) => operations.rebuild(n, o),
      resize: (n, size) => resize.resize(n, size),
    };
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
    await upgradeStore(c.#state);
    for (const h of options.hosts ?? []) await c.addHost(h);
    if (c.#repairIntervalMs > 0) c.#schedule();
    return c;
  }

  /** Host ids offered to this cluster. */
  get hostIds(): string[] {
    return this.#state.hosts.ids;
  }

  /**
   * Offers a data engine for replicas and engines (or updates how to reach it, e.g. after
   * its process restarted on another port). Its replica address is recorded in the store.
   */
  async addHost(engine: DataEngine): Promise<void> {
    this.#state.checkOpen();
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
    this.#state.hosts.set(hostId, engine);
    if (!info) return;
    const rec: HostRecord = { schema: CLUSTER_SCHEMA_VERSION, hostId, replicaAddress: info.replicaAddress, lastSeenMs: Date.now() };
    await this.#state.store.put(KIND.host, hostId, rec);
  }

  /** Withdraws a host: no new replicas or engines go there. Its existing replicas stay until replaced. */
  removeHost(hostId: string): void {
    this.#state.hosts.delete(hostId);
  }

  /**
   * Creates a volume: one empty replica on each of `replicas` distinct hosts, recorded in
   * the store. Detached until {@link Cluster.attach}. With a backing image, it waits for the
   * image's first file, then for a copy on each replica host, then creates the replicas over it.
   *
   * @throws MooringError INVALID_ARGUMENT, ALREADY_EXISTS, UNAVAILABLE (too few reachable hosts, or the image's file did not reach a host in time), NO_SPACE, NOT_FOUND (no such backing image)
   */
  async createVolume(options: ClusterVolumeCreateOptions): Promise<ClusterVolumeStatus> {
    await this.#volumes.create(options);
    return this.status(options.name);
  }

  /**
   * Deletes a detached volume and its replicas (on hosts that can be reached; the records
   * of the others are kept so a later delete finishes the job).
   *
   * @throws MooringError NOT_FOUND, BUSY (attached), UNAVAILABLE (some replicas could not be deleted)
   */
  async deleteVolume(name: string): Promise<void> {
    this.#state.checkOpen();
    await this.#state.serial(name, async () => {
      await this.#volumes.delete(name);
      this.#handles.delete(name);
      this.#migrations.setHooks(name, null, null);
    });
  }

  /** Every volume in the store, with its status. */
  async listVolumes(): Promise<ClusterVolumeStatus[]> {
    const out: ClusterVolumeStatus[] = [];
    for (const v of await this.#state.volumes()) out.push(await this.status(v.name));
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
    return this.#attachment.attach(name, options);
  }

  /** Same as `volume(name).detach(options)`. */
  detach(name: string, options: ClusterDetachOptions = {}): Promise<void> {
    return this.#attachment.detach(name, options);
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
    this.#state.checkOpen();
    const src = await this.#state.volume(options.from);
    checkName('snapshot name', options.snapshot);
    await this.#attachment.operationHost(src.name, undefined);
    const created = await this.createVolume({ ...options, sizeBytes: src.sizeBytes, ...(src.backingImage ? { backingImage: src.backingImage } : {}) });
    try {
      const res = await this.#volumes.copyInto(options, created.name);
      return { ...(await this.status(created.name)), copiedBytes: res.copiedBytes };
    } catch (err) {
      await this.deleteVolume(created.name).catch((e: unknown) => safeEmit(this, 'warning', toMooringError(e, `removing the failed clone ${created.name}`)));
      throw toMooringError(err, `cloning ${src.name}@${options.snapshot} into ${created.name}`);
    }
  }

  /** The volume's state, replicas and export, as its engine reports them (or as last recorded). */
  status(name: string): Promise<ClusterVolumeStatus> {
    return volumeStatus(this.#state, name);
  }

  /**
   * One pass of the control loop: reconciles every volume's tickets (attach, detach, finish
   * or undo migrations), then repairs every attached volume that is not migrating (records
   * replica modes, replaces replicas that stayed ERR longer than the replacement wait), then
   * reconciles backing images. The loop calls this every `repairIntervalMs`; tests and
   * embedders may call it directly.
   */
  async repairOnce(): Promise<void> {
    const state = this.#state;
    for (const d of await state.store.list<unknown>(KIND.attachment)) {
      if (state.closed) return;
      const volume = d.key;
      await state.serial(volume, () => this.#attachment.converge(volume)).catch((err: unknown) => {
        safeEmit(this, 'warning', toMooringError(err, `reconciling the attachment of ${volume}`));
      });
    }
    for (const { volume } of await state.engineRecords()) {
      // The record is read again inside the volume's turn: an attach queued before this
      // pass may have moved the engine, and acting on the old record would take the new
      // engine for a stray one.
      await state.serial(volume, async () => {
        const eng = await state.engineRecord(volume);
        // A migrating volume is left alone (its writer moves); the reconcile above recovers it.
        if (eng && !(await state.migrationRecord(volume))) await this.#repair.repair(eng);
      }).catch((err: unknown) => {
        safeEmit(this, 'warning', toMooringError(err, `repairing ${volume}`));
      });
    }
    // Backing images last: copies for replacements made above, cleanup of unused files.
    if (!state.closed) await this.#images.reconcileAll().catch((err: unknown) => safeEmit(this, 'warning', toMooringError(err, 'reconciling backing images')));
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
    this.#state.checkOpen();
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

  /** Stops the repair loop and stops watching data engines. Engines keep running on their hosts. Idempotent. */
  async close(): Promise<void> {
    if (this.#state.closed) return;
    this.#state.markClosed();
    this.#images.close();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#repairing?.catch(() => undefined);
    this.#state.hosts.clear();
    this.#migrations.close();
    this.#attachment.close();
  }

  // A migration call of the embedder, in the volume's turn; `converge` reconciles the
  // tickets after it (confirm and rollback change what runs).
  async #migrationStep<T>(name: string, step: () => Promise<T>, converge: boolean): Promise<T> {
    this.#state.checkOpen();
    return this.#state.serial(name, async () => {
      if (!(await this.#state.migrationRecord(name))) throw new MooringError('INVALID_STATE', `volume ${name} is not migrating`);
      const out = await step();
      if (converge) await this.#attachment.converge(name);
      return out;
    });
  }

  // Volumes on each backing image and the hosts of their replicas.
  async #imageUsage(): Promise<Map<string, { volumes: Set<string>; hosts: Set<string> }>> {
    const out = new Map<string, { volumes: Set<string>; hosts: Set<string> }>();
    const vols = (await this.#state.volumes()).filter((v) => v.backingImage);
    if (vols.length === 0) return out;
    const replicas = await this.#state.allReplicas();
    for (const v of vols) {
      const e = out.get(v.backingImage!) ?? { volumes: new Set<string>(), hosts: new Set<string>() };
      out.set(v.backingImage!, e);
      e.volumes.add(v.name);
      for (const r of replicas) if (r.volume === v.name) e.hosts.add(r.hostId);
    }
    return out;
  }

  #schedule(): void {
    this.#timer = setTimeout(() => {
      this.#repairing = this.repairOnce()
        .catch((err: unknown) => safeEmit(this, 'warning', toMooringError(err, 'repair loop')))
        .finally(() => {
          this.#repairing = null;
          if (!this.#state.closed) this.#schedule();
        });
    }, this.#repairIntervalMs);
    this.#timer.unref();
  }
}
