/**
 * Mooring, the one entry point (what it offers: the class comment below), and how it works
 * inside.
 *
 * The data engines do the data work (replica servers, engines, rebuilds); a data engine
 * also re-adds a replica by itself when that replica's host comes back. The control plane
 * only decides; it never carries data. It allocates every writer epoch: each engine it
 * starts or activates is handed a new one from the volume's counter in the store
 * (src/cluster/epochs.ts, docs/single-writer.md). What it decides is kept in the store, so
 * a restarted VM manager finds its volumes, engines and replicas again.
 *
 * The decisions are made by small controllers over one shared layer of state
 * (src/cluster/, docs/architecture.md): attachment (tickets), migration, repair, backing
 * images, and the operations that run under a ticket of their own. This class opens them,
 * offers hosts, creates and deletes volumes, hands out volume handles and runs the loop.
 *
 * @packageDocumentation
 */
import { EventEmitter } from 'node:events';
import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import type * as TE from 'typed-emitter';

import { BackingImageController } from './backing-image/backing-image-controller.js';
import type { BackingImage, BackingImageCreateOptions, BackingImageStatus } from './backing-image/backing-image.js';
import type { DataEngine, DataEngineInfo } from './data-engine/data-engine.js';
import { MooringError, toMooringError } from './errors.js';
import { LocalDataEngine, readDataEngineHostId } from './data-engine/local-data-engine.js';
import { FileStateStore } from './state/file-state-store.js';
import type { StateStore } from './state/state-store.js';
import { NAME_PATTERN } from './util/limits.js';
import { withTimeout } from './util/async.js';
import { ensureDirectory } from './util/files.js';
import { safeEmit } from './util/emit.js';
import { formatBytes } from './util/size.js';
import { checkLogger, logDataEngineEvent, safeLog, type Logger } from './util/logger.js';
import { logClusterEvent } from './cluster/cluster-event-log.js';
import type { MooringEvents, MooringOptions } from './mooring-options.js';
import { checkIntIn, checkName, describe } from './util/validate.js';
import { AttachmentController, MS_SETTING_MAX } from './cluster/attachment-controller.js';
import { KIND, byReplicaId, type ReplicaRecord } from './cluster/cluster-records.js';
import { EvictionController, type HostEvictionProgress } from './cluster/eviction-controller.js';
import { importDirectoryVolume, type DirectoryImport } from './volume/directory-import.js';
import { Volume, type VolumeCreateOptions, type VolumeOps, type VolumeStatus } from './volume/volume.js';
import { ControlState } from './cluster/control-state.js';
import { EngineLifecycle } from './cluster/engine-lifecycle.js';
import { HOST_PROBE_TIMEOUT_MS, Hosts } from './cluster/hosts.js';
import { MigrationController } from './cluster/migration-controller.js';
import { RepairController } from './cluster/repair-controller.js';
import { RepairLoop, type RepairLoopStatus } from './cluster/repair-loop.js';
import { upgradeStore } from './cluster/store-schema.js';
import { VolumeLifecycle } from './cluster/volume-lifecycle.js';
import { VolumeOperations } from './cluster/volume-operations.js';
import { VolumeResize } from './cluster/volume-resize.js';
import { volumeEngine, volumeStatus } from './cluster/volume-status.js';
import { LeaderLease, type LeaderStatus } from './cluster/leader-lease.js';
import { LeaderGuardedStore } from './cluster/leader-store.js';
import { UpgradeController } from './upgrade/upgrade-controller.js';
import type { UpgradeOptions, UpgradeSession } from './upgrade/upgrade-session.js';

export { EPOCH_ATTEMPTS_MAX } from './cluster/engine-lifecycle.js';
export { HOST_PROBE_TIMEOUT_MS } from './cluster/hosts.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

export type { MooringEvents, MooringOptions, ReplicaReplacedEvent, VolumeSalvagedEvent } from './mooring-options.js';
export type { RepairLoopStatus, RepairPassEvent } from './cluster/repair-loop.js';
export { EVENT_REPAIR_DELAY_MS, EVENT_REPAIR_PENDING_MAX, HOST_RECHECK_INTERVAL_MS, PASS_DURATION_FACTOR } from './cluster/repair-loop.js';

/** How often the repair loop runs a full pass over attached volumes, by default (at least; it adapts to the pass's duration). */
export const DEFAULT_REPAIR_INTERVAL_MS = 2000;
/** How long a replica may stay ERR before it is replaced on another host, by default (Longhorn: 600 s). */
export const DEFAULT_REPLICA_REPLACEMENT_WAIT_MS = 600_000;
/** How long an attach (or an operation's own ticket) waits to be satisfied, by default. */
export const DEFAULT_TICKET_WAIT_TIMEOUT_MS = 60_000;
/** Bounds of {@link MooringOptions.engineIoTimeoutMs} (those of the data engine's ioTimeoutMs). */
const ENGINE_IO_TIMEOUT_MS_MIN = 100;
const ENGINE_IO_TIMEOUT_MS_MAX = 600_000;
/** How long a backing image file no replica uses stays on its disk, by default (Longhorn: 60 min). */
export const DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS = 3_600_000;

/** Data-engine events after which a volume's engine may report replicas to record, re-add or replace. */
const REPAIR_EVENTS: ReadonlySet<string> = new Set(['replica-error', 'rebuild-failed', 'replica-set-changed']);

/** Where the embedded default keeps the control-plane store, under `dir`. */
export const STATE_SUBDIR = 'state';
/** Where the embedded default's data engine keeps its replicas and backing image files, under `dir`. */
export const HOST_SUBDIR = 'host';

/** What {@link Mooring.open} opened itself (the embedded default) and closes with the Mooring. */
interface Owned {
  store: StateStore | null;
  dataEngine: LocalDataEngine | null;
}

// This machine's host name as a host id, or `local` when it is not one.
function defaultHostId(): string {
  const name = hostname().split('.')[0] ?? '';
  return NAME_PATTERN.test(name) && name !== '.' && name !== '..' ? name : 'local';
}

/**
 * The one entry point: it hands out {@link Volume} handles, whose replicas live on this
 * host or on others. Open it with {@link Mooring.open}: with `dir` it is the embedded
 * default, a cluster of one host (the control-plane store and this host's data engine,
 * both in `dir`, both in this process); more hosts join with {@link Mooring.addHost}, and
 * several VM managers may share one store. What it decides is kept in the store, so a
 * restarted VM manager finds its volumes, engines and replicas again; a repair loop
 * reattaches, repairs and replaces in the background. Always {@link Mooring.close} it.
 */
export class Mooring extends (EventEmitter as new () => TypedEmitter<MooringEvents>) {
  readonly #state: ControlState;
  readonly #attachment: AttachmentController;
  readonly #migrations: MigrationController;
  readonly #repair: RepairController;
  readonly #eviction: EvictionController;
  readonly #operations: VolumeOperations;
  readonly #volumes: VolumeLifecycle;
  readonly #images: BackingImageController;
  readonly #upgrade: UpgradeController;
  readonly #loop: RepairLoop;
  // Set when several embedders share the store (`leadership` option).
  readonly #lease: LeaderLease | null;
  #storeUpgraded = false;
  readonly #handles = new Map<string, Volume>();
  readonly #ops: VolumeOps;
  // What this object opened itself (the embedded default) and closes with it.
  readonly #own: Owned;
  readonly #log: Logger;
  /** This host's id (where `attach()` without a host attaches), or null. */
  readonly hostId: string | null;
  /**
   * The single-directory volume (`DIR/volume.json`, the first releases' layout) that
   * {@link Mooring.open} found in `dir` and made a volume of this host, in place; else null.
   */
  get imported(): DirectoryImport | null {
    return this.#imported;
  }

  #imported: DirectoryImport | null = null;

  /**
   * The data engine {@link Mooring.open} started in this process for this host (`dir`
   * without `dataEngine: false`), or null (hosts offered with {@link Mooring.addHost} are
   * not it). Metrics read its data-path counters (docs/metrics.md).
   */
  get localDataEngine(): LocalDataEngine | null {
    return this.#own.dataEngine;
  }

  private constructor(options: MooringOptions & { store: StateStore }, hostId: string | null, own: Owned) {
    super();
    this.hostId = hostId;
    this.#own = own;
    this.#log = checkLogger('logger', options.logger).child({ component: 'cluster' });
    const hosts = new Hosts((hostId, e) => {
      logDataEngineEvent(this.#log, hostId, e);
      // What changes a volume's replicas asks for a repair of that volume, soon.
      if (REPAIR_EVENTS.has(e.type) && 'volume' in e) this.#loop.request(e.volume);
      this.#images.onDataEngineEvent(hostId, e);
      safeEmit(this, 'data-engine-event', hostId, e);
      // A volume's own events go to its handle too (if one was asked for: none is made for it).
      if (e.type !== 'backing-image-file') {
        const handle = this.#handles.get(e.volume);
        if (handle) safeEmit(handle, e.type, { ...e, hostId });
      }
    });
    this.#lease = options.leadership === undefined ? null : new LeaderLease(options.store, options.leadership);
    const state = new ControlState(
      this.#lease ? new LeaderGuardedStore(options.store, this.#lease) : options.store,
      hosts,
      {
        replacementWaitMs: options.replicaReplacementWaitMs ?? DEFAULT_REPLICA_REPLACEMENT_WAIT_MS,
        ticketWaitMs: options.ticketWaitTimeoutMs ?? DEFAULT_TICKET_WAIT_TIMEOUT_MS,
        engineIoTimeoutMs: options.engineIoTimeoutMs,
      },
      {
        cluster: (event, ...args) => {
          logClusterEvent(this.#log, event, args[0]);
          safeEmit(this, event, ...args);
        },
        volume: (name, event, ...args) => safeEmit(this.volume(name), event, ...args),
      },
    );
    this.#state = state;
    state.leadership = this.#lease;
    this.#lease?.on('elected', (term) => {
      safeLog(this.#log, 'info', { term }, `${this.#lease!.id} leads the cluster (term ${term})`);
      safeEmit(this, 'leadership', this.#lease!.status);
      // The hosts offered to this embedder are recorded by it now (a follower does not write).
      for (const [, engine] of this.#state.hosts.entries()) void this.addHost(engine).catch((err: unknown) => this.#warn(toMooringError(err, 'recording the hosts after an election')));
    });
    this.#lease?.on('deposed', (reason) => {
      safeLog(this.#log, 'warn', { code: reason.code }, `${this.#lease!.id} no longer leads the cluster: ${reason.message}`);
      safeEmit(this, 'leadership', this.#lease!.status);
    });
    const leads = (): boolean => this.#lease === null || this.#lease.isLeader;
    this.#loop = new RepairLoop(options.repairIntervalMs ?? DEFAULT_REPAIR_INTERVAL_MS, {
      // A follower does not repair: the leader does.
      pass: async () => {
        if (leads()) await this.repairOnce();
      },
      tick: async () => {
        if (leads()) for (const h of await hosts.answeringAgain()) await this.#hostSeen(h.hostId, h.info).catch((err: unknown) => this.#warn(toMooringError(err, `recording host ${h.hostId}, answering again`)));
      },
      repairVolume: async (v) => {
        if (leads()) await this.#repairVolume(v);
      },
      batch: (fn) => hosts.duringPass(fn),
      failed: (err, what) => this.#warn(toMooringError(err, what)),
      passed: (e) => safeEmit(this, 'repair-pass', e),
    });
    const engines = new EngineLifecycle(state);
    this.#migrations = new MigrationController(state, engines);
    this.#attachment = new AttachmentController(state, engines, this.#migrations);
    this.#images = new BackingImageController({
      store: state.store,
      hostIds: () => hosts.ids,
      evictingHosts: () => state.evictingHosts(),
      engineOf: (h) => hosts.engineOf(h),
      usage: () => this.#imageUsage(),
      pickHost: async () => (await state.pickHosts(1, new Set()))[0]!,
      operationHost: async (v) => {
        await state.volume(v);
        return this.#attachment.operationHost(v, undefined);
      },
      withExportTicket: async (v, fn) => this.#attachment.withTicket(v, 'backing-image-export', await this.#attachment.operationHost(v, undefined), fn),
      warn: (e) => this.#warn(e),
      cleanupWaitMs: options.backingImageCleanupWaitMs ?? DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS,
      probeTimeoutMs: HOST_PROBE_TIMEOUT_MS,
      waitTimeoutMs: state.settings.ticketWaitMs,
    });
    this.#repair = new RepairController(state, this.#images);
    this.#eviction = new EvictionController(state, this.#attachment, this.#repair, async (h) => (await this.#images.list()).filter((i) => i.files.some((f) => f.hostId === h)).length);
    this.#operations = new VolumeOperations(state, this.#attachment, this.#repair, engines);
    this.#volumes = new VolumeLifecycle(state, this.#attachment, this.#images);
    const attachment = this.#attachment;
    const migrations = this.#migrations;
    const operations = this.#operations;
    const resize = new VolumeResize(state, attachment);
    this.#upgrade = new UpgradeController({
      state,
      launcher: options.dataEngineLauncher ?? null,
      inProcess: (h) => state.hosts.get(h) instanceof LocalDataEngine,
      snapshot: async (v, snap, labels) => void (await operations.createSnapshot(v, snap, labels)),
      converge: (v) => state.serial(v, () => attachment.converge(v)),
      repair: (v) => this.#repairVolume(v),
      addHost: (de) => this.addHost(de),
    });
    this.#ops = {
      attach: async (n, o) => {
        const st = await attachment.attach(n, o);
        const host = o.host ?? st.attachedHost ?? this.hostId;
        safeLog(
          this.#log,
          'info',
          { volume: n, hostId: host, epoch: st.epoch, ...(st.nbd ? { nbd: st.nbd.uri } : {}) },
          `volume ${n} attached on ${host} (writer epoch ${st.epoch})${st.nbd ? ` at ${st.nbd.uri}` : ''}`,
        );
        return st;
      },
      detach: async (n, o) => {
        await attachment.detach(n, o);
        safeLog(this.#log, 'info', { volume: n, ...(o.host ? { hostId: o.host } : {}) }, `volume ${n} detached${o.host ? ` from ${o.host}` : ''}`);
      },
      status: (n) => volumeStatus(state, n),
      tickets: (n) => attachment.tickets(n),
      setTicket: (n, t) => attachment.setTicket(n, t),
      deleteTicket: (n, id) => attachment.deleteTicket(n, id),
      migrate: async (n, target, o) => {
        state.checkLeader();
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
      defaultHost: () => this.hostId,
      engine: (n) => volumeEngine(state, n),
      clone: async (n, o) => {
        const made = await this.#volumes.clone(n, o);
        return { volume: this.volume(made.name), copiedBytes: made.copiedBytes };
      },
      handOver: async (n) => (await this.#migrationStep(n, () => migrations.handOver(n), false))!,
      confirm: (n, endsOn) => this.#migrationStep(n, () => migrations.confirm(n, false), true, endsOn),
      rollback: (n, endsOn) => this.#migrationStep(n, () => migrations.rollback(n, false, 'asked by the embedder'), true, endsOn),
      setHooks: (n, h, l) => migrations.setHooks(n, h, l),
      createSnapshot: (n, s, l) => operations.createSnapshot(n, s, l),
      listSnapshots: (n) => operations.listSnapshots(n),
      deleteSnapshot: (n, s) => operations.deleteSnapshot(n, s),
      revertSnapshot: (n, s) => operations.revertSnapshot(n, s),
      exportSnapshot: (n, s, o) => operations.exportSnapshot(n, s, o),
      rebuild: (n, o) => operations.rebuild(n, o),
      salvage: (n, o) => operations.salvage(n, o),
      resize: (n, size) => resize.resize(n, size),
    };
  }

  /**
   * Opens the control plane: over `dir` (the embedded default: a FileStateStore in
   * `DIR/state` and this host's data engine in `DIR/host`, in this process), or over a
   * shared `store` and the data engines in `hosts`. Volumes attached before a restart are
   * attached again by the first reconcile (their tickets are in the store).
   *
   * @throws MooringError INVALID_ARGUMENT, BUSY (DIR is open in another process), CORRUPT_METADATA, NATIVE_LOAD_FAILED, IO_ERROR
   */
  static async open(options: MooringOptions): Promise<Mooring> {
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `Mooring options must be an object (got ${describe(options)})`);
    if (options.dir === undefined && (typeof options.store !== 'object' || options.store === null)) {
      throw new MooringError('INVALID_ARGUMENT', 'Mooring.open needs a dir (the embedded default) or a store');
    }
    if (options.dir !== undefined && (typeof options.dir !== 'string' || options.dir === '' || options.dir.includes('\0'))) {
      throw new MooringError('INVALID_ARGUMENT', `dir must be a path (got ${describe(options.dir)})`);
    }
    if (options.dir === undefined && options.dataEngine !== undefined && options.dataEngine !== false) {
      throw new MooringError('INVALID_ARGUMENT', 'an in-process data engine needs a dir to keep its replicas in');
    }
    if (options.hostId !== undefined) checkName('host id', options.hostId);
    checkLogger('logger', options.logger);
    checkIntIn('repairIntervalMs', options.repairIntervalMs, 0, MS_SETTING_MAX, DEFAULT_REPAIR_INTERVAL_MS);
    checkIntIn('replicaReplacementWaitMs', options.replicaReplacementWaitMs, 0, MS_SETTING_MAX, DEFAULT_REPLICA_REPLACEMENT_WAIT_MS);
    checkIntIn('ticketWaitTimeoutMs', options.ticketWaitTimeoutMs, 0, MS_SETTING_MAX, DEFAULT_TICKET_WAIT_TIMEOUT_MS);
    checkIntIn('backingImageCleanupWaitMs', options.backingImageCleanupWaitMs, 0, MS_SETTING_MAX, DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS);
    if (options.engineIoTimeoutMs !== undefined) checkIntIn('engineIoTimeoutMs', options.engineIoTimeoutMs, ENGINE_IO_TIMEOUT_MS_MIN, ENGINE_IO_TIMEOUT_MS_MAX, 0);
    const dir = options.dir === undefined ? null : resolve(options.dir);
    const own: Owned = { store: null, dataEngine: null };
    try {
      if (dir !== null) await ensureDirectory(dir);
      const store = options.store ?? (own.store = await FileStateStore.open(join(dir!, STATE_SUBDIR)));
      let hostId = options.hostId ?? null;
      let imported: DirectoryImport | null = null;
      if (dir !== null && options.dataEngine !== false) {
        const engineDir = join(dir, HOST_SUBDIR);
        hostId ??= (await readDataEngineHostId(engineDir)) ?? defaultHostId();
        // A single-directory volume of the first releases in `dir` becomes one of this host's.
        imported = await importDirectoryVolume(dir, store, hostId, engineDir);
        const dataEngineLogger = options.dataEngine?.logger ?? checkLogger('logger', options.logger).child({ component: 'data-engine' });
        own.dataEngine = await LocalDataEngine.start({ ...(options.dataEngine ?? {}), dir: engineDir, hostId, logger: dataEngineLogger });
      }
      const m = new Mooring({ ...options, store }, hostId, own);
      m.#imported = imported;
      await m.#lease?.start();
      await m.#upgradeStore();
      if (own.dataEngine) await m.addHost(own.dataEngine);
      for (const h of options.hosts ?? []) await m.addHost(h);
      // The first pass at once: volumes attached before a restart serve again without waiting a period.
      m.#loop.start(0);
      safeLog(m.#log, 'debug', { ...(dir !== null ? { dir } : {}), hostId, hostIds: m.hostIds }, `opened${dir !== null ? ` ${dir}` : ''} as host ${hostId ?? '(none)'} (hosts: ${m.hostIds.join(', ') || 'none'})`);
      return m;
    } catch (err) {
      await own.dataEngine?.close().catch(() => undefined);
      await own.store?.close().catch(() => undefined);
      throw toMooringError(err, 'opening Mooring');
    }
  }

  /** Host ids offered to this control plane (this host's first, when it runs a data engine). */
  get hostIds(): string[] {
    return this.#state.hosts.ids;
  }

  /**
   * Offers a data engine for replicas and engines (or updates how to reach it, e.g. after
   * its process restarted on another port). Its replica address is recorded in the store.
   * A host that does not answer is still added (with a `warning` event): it counts as
   * unreachable until it does, and its last recorded address is kept.
   *
   * @throws MooringError INVALID_ARGUMENT (the data engine reports another host id), CLOSED
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
      this.#warn(toMooringError(err, `host ${hostId} did not answer when added; its last recorded address is kept`));
    }
    if (info && info.hostId !== hostId) throw new MooringError('INVALID_ARGUMENT', `data engine says it is host ${info.hostId}, its handle says ${hostId}`);
    this.#state.hosts.set(hostId, engine);
    // Not answering: asked again every few seconds, and recorded once it answers.
    if (!info) return this.#state.hosts.unanswered(hostId);
    await this.#hostSeen(hostId, info);
  }

  // A host that answers, offered or back (perhaps restarted under a new replica address):
  // recorded with what it answered, and its volumes repaired soon. Only by the leader: a
  // follower's record would be refused (NOT_LEADER).
  async #hostSeen(hostId: string, info: DataEngineInfo): Promise<void> {
    if (this.#lease && !this.#lease.isLeader) return;
    await this.#state.store.put(KIND.host, hostId, await this.#eviction.hostSeen(hostId, info));
    this.#repairHostSoon(hostId);
  }

  // A host is back (offered again, or answering after it did not): the volumes with their
  // engine or a replica there, and those it runs an engine of (a takeover's leftover, which
  // the repair stops), are repaired soon.
  #repairHostSoon(hostId: string): void {
    if (!this.#loop.status.running) return;
    void this.#volumesOn(hostId).then(
      (vs) => vs.forEach((v) => this.#loop.request(v)),
      (err: unknown) => this.#state.closed || this.#warn(toMooringError(err, `listing the volumes of host ${hostId}`)),
    );
  }

  // Attached volumes with their engine, a replica or a running engine on a host: three
  // lists, whatever the host (the engines it runs are read only if it answers).
  async #volumesOn(hostId: string): Promise<string[]> {
    const [engines, replicas, here] = await Promise.all([this.#state.engineRecords(), this.#state.allReplicas(), this.#state.hosts.engines(hostId, { markDown: false })]);
    const there = new Set([...replicas.filter((r) => r.hostId === hostId).map((r) => r.volume), ...(here?.keys() ?? [])]);
    return engines.filter((e) => e.hostId === hostId || there.has(e.volume)).map((e) => e.volume);
  }

  /**
   * Who leads the cluster, as this embedder last saw it, or null when it is the only one
   * (no `leadership` option). A `leadership` event reports each change of this embedder's role.
   */
  get leadership(): LeaderStatus | null {
    return this.#lease?.status ?? null;
  }

  /**
   * What the repair loop did so far: its last full pass's duration and busy time, and the
   * delay it chose for the next (max(`repairIntervalMs`, `limits.PASS_DURATION_FACTOR` (19) ×
   * the time the event loop was busy during that pass)),
   * and the repairs events asked for (docs/cluster.md, the control loop).
   */
  get repairLoop(): RepairLoopStatus {
    return this.#loop.status;
  }

  /**
   * Evicts a host (its disk): no new replica or backing image file goes there, and the
   * control loop moves what it holds to other hosts, one replica per volume per pass
   * (attached volumes through their engine, detached ones attached without frontend under
   * a `volume-eviction` ticket), keeping every image's minCopies elsewhere before its file
   * there goes. `host-eviction` events report progress, `host-evicted` the end. The mark
   * stays (the host stays empty) until {@link Mooring.cancelHostEviction}. Returns what is
   * left to move now.
   *
   * @throws MooringError NOT_FOUND (the host never answered this cluster), CLOSED
   */
  async evictHost(hostId: string): Promise<HostEvictionProgress> {
    this.#state.checkLeader();
    checkName('host id', hostId);
    await this.#eviction.request(hostId, true);
    return this.#eviction.progress(hostId);
  }

  /**
   * Ends an eviction: the host takes replicas and files again (what moved stays moved).
   *
   * @throws MooringError NOT_FOUND, CLOSED
   */
  async cancelHostEviction(hostId: string): Promise<void> {
    this.#state.checkLeader();
    checkName('host id', hostId);
    await this.#eviction.request(hostId, false);
  }

  // A background failure: logged (warn, with its code) and emitted as a `warning` event.
  // Older stores are brought to the current schema by the leader, once (a follower leaves it to the leader).
  async #upgradeStore(): Promise<void> {
    if (this.#storeUpgraded || (this.#lease && !this.#lease.isLeader)) return;
    await upgradeStore(this.#state);
    this.#storeUpgraded = true;
  }

  #warn(e: MooringError): void {
    // A follower's background work meeting NOT_LEADER is the expected outcome, not news.
    if (e.code === 'NOT_LEADER' && this.#lease && !this.#lease.isLeader) {
      safeLog(this.#log, 'debug', { code: e.code }, e.message);
      return;
    }
    safeLog(this.#log, 'warn', { code: e.code }, e.message);
    safeEmit(this, 'warning', e);
  }

  /** Withdraws a host: no new replicas or engines go there. Its existing replicas stay until replaced. */
  removeHost(hostId: string): void {
    this.#state.hosts.delete(hostId);
  }

  /**
   * Creates a volume: one empty replica on each of `replicas` distinct hosts, recorded in
   * the store. Detached until {@link Volume.attach}. With a backing image, it waits for the
   * image's first file, then for a copy on each replica host, then creates the replicas over it.
   *
   * @throws MooringError INVALID_ARGUMENT, ALREADY_EXISTS, UNAVAILABLE (too few reachable hosts, or the image's file did not reach a host in time), NO_SPACE, NOT_FOUND (no such backing image)
   */
  async createVolume(options: VolumeCreateOptions): Promise<Volume> {
    await this.#volumes.create(options);
    const v = this.volume(options.name);
    const st = await volumeStatus(this.#state, options.name).catch(() => null);
    const hostIds = st ? [...new Set(st.replicas.map((r) => r.hostId))] : [];
    safeLog(
      this.#log,
      'info',
      { volume: options.name, ...(st ? { sizeBytes: st.sizeBytes, replicas: st.replicaCount, hostIds } : {}) },
      `volume ${options.name} created${st ? ` (${formatBytes(st.sizeBytes)}, ${st.replicaCount} replicas on ${hostIds.join(', ')})` : ''}`,
    );
    return v;
  }

  /**
   * Deletes a detached volume and its replicas (on hosts that can be reached; the records
   * of the others are kept so a later delete finishes the job).
   *
   * @throws MooringError NOT_FOUND, BUSY (attached), UNAVAILABLE (some replicas could not be deleted)
   */
  async deleteVolume(name: string): Promise<void> {
    this.#state.checkLeader();
    await this.#state.serial(name, async () => {
      await this.#volumes.delete(name);
      this.#handles.delete(name);
      this.#migrations.setHooks(name, null, null);
    });
    safeLog(this.#log, 'info', { volume: name }, `volume ${name} deleted`);
  }

  /** Every volume in the store, with its status. */
  async listVolumes(): Promise<VolumeStatus[]> {
    // Records read once for all volumes and each host asked for its engines once: O(N) work
    // and as many data-engine calls as hosts, not one per volume.
    const state = this.#state;
    const [vols, allReplicas, engineRecords, migrations] = await Promise.all([state.volumes(), state.allReplicas(), state.engineRecords(), state.migrationRecords()]);
    const engines = new Map(engineRecords.map((e) => [e.volume, e]));
    const migs = new Map(migrations.map((m) => [m.volume, m]));
    const replicas = new Map<string, ReplicaRecord[]>();
    for (const r of allReplicas) {
      const list = replicas.get(r.volume);
      if (list) list.push(r);
      else replicas.set(r.volume, [r]);
    }
    const probe = state.hosts.listingProbe();
    return Promise.all(
      vols.map((vol) =>
        volumeStatus(state, vol.name, {
          vol,
          replicas: (replicas.get(vol.name) ?? []).sort(byReplicaId),
          eng: engines.get(vol.name) ?? null,
          mig: migs.get(vol.name) ?? null,
          probe,
        }),
      ),
    );
  }

  /** The volume's handle (attach, detach, migrate, snapshots, events); one object per name. */
  volume(name: string): Volume {
    checkName('volume name', name);
    let v = this.#handles.get(name);
    if (!v) {
      v = new Volume(name, this.#ops);
      this.#handles.set(name, v);
    }
    return v;
  }

  /**
   * One pass of the control loop: reconciles every volume's tickets (attach, detach, finish
   * or undo migrations), then repairs every attached volume that is not migrating (records
   * replica modes, replaces replicas that stayed ERR longer than the replacement wait), then
   * reconciles backing images. The loop calls this every `repairIntervalMs` or
   * `limits.PASS_DURATION_FACTOR` (19) times the last pass's busy time, whichever is longer, and
   * repairs single volumes in between when their data engines report a change; tests and
   * embedders may call it directly.
   */
  repairOnce(): Promise<void> {
    return this.#state.hosts.duringPass(() => this.#pass(), { full: true });
  }

  async #pass(): Promise<void> {
    const state = this.#state;
    await this.#upgradeStore();
    for (const d of await state.store.list<unknown>(KIND.attachment)) {
      if (state.closed) return;
      const volume = d.key;
      await state.serial(volume, () => this.#attachment.converge(volume)).catch((err: unknown) => {
        this.#warn(toMooringError(err, `reconciling the attachment of ${volume}`));
      });
    }
    for (const { volume } of await state.engineRecords()) {
      await this.#repairVolume(volume).catch((err: unknown) => {
        this.#warn(toMooringError(err, `repairing ${volume}`));
      });
    }
    // Evictions after the repairs: moves replicas off evicting hosts.
    if (!state.closed) await this.#eviction.step().catch((err: unknown) => safeEmit(this, 'warning', toMooringError(err, 'evicting hosts')));
    // Backing images last: copies for replacements made above, cleanup of unused files.
    if (!state.closed) await this.#images.reconcileAll().catch((err: unknown) => this.#warn(toMooringError(err, 'reconciling backing images')));
    // An upgrade session that needs a driver (after a restart, or a lease that ran out) gets one.
    if (!state.closed) this.#upgrade.kick();
  }

  // One repair step for an attached volume, in its turn. The engine record is read inside
  // the turn: an attach queued before may have moved the engine, and acting on the old
  // record would take the new engine for a stray one.
  #repairVolume(volume: string): Promise<void> {
    return this.#state.serial(volume, async () => {
      const eng = await this.#state.engineRecord(volume);
      // A migrating volume is left alone (its writer moves); the reconcile recovers it.
      if (eng && !(await this.#state.migrationRecord(volume))) await this.#repair.repair(eng);
    });
  }

  // --- upgrades of the data engines (src/upgrade/) ---

  /**
   * Starts a live upgrade of the data engines, host by host (seed 004): checks every
   * precondition on every host first and reports them all together, then records the
   * session and drives it in the background. Follow it through the returned handle's
   * events and `done()`. One session per cluster at a time; docs/upgrade.md.
   *
   * @throws MooringError INVALID_ARGUMENT, BUSY (a session is in progress), PRECONDITION_FAILED (`details.reasons`: each with a code, host and volume), CLOSED
   */
  startUpgrade(options: UpgradeOptions): Promise<UpgradeSession> {
    return this.#upgrade.start(options);
  }

  /** The cluster's upgrade session (in progress, paused, or the last one ended), or null if none was ever started. */
  upgradeSession(): Promise<UpgradeSession | null> {
    this.#state.checkOpen();
    return this.#upgrade.current();
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
    this.#state.checkLeader();
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

  /**
   * Changes how long a backing image file that no replica uses stays on its disk
   * ({@link MooringOptions.backingImageCleanupWaitMs}) while this Mooring runs: the next
   * passes use it (minCopies ready copies always stay).
   *
   * @throws MooringError INVALID_ARGUMENT, CLOSED
   */
  setBackingImageCleanupWaitMs(ms: number): void {
    this.#state.checkOpen();
    if (ms === undefined) throw new MooringError('INVALID_ARGUMENT', 'setBackingImageCleanupWaitMs needs a number of milliseconds');
    this.#images.setCleanupWaitMs(checkIntIn('backingImageCleanupWaitMs', ms, 0, MS_SETTING_MAX, DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS));
  }

  /**
   * Stops the loop and stops watching data engines. Engines on other hosts keep running;
   * the in-process data engine of the embedded default stops (its engines drain and flush).
   * Idempotent.
   */
  async close(): Promise<void> {
    if (this.#state.closed) return;
    this.#state.markClosed();
    this.#images.close();
    await this.#loop.close();
    // A leader hands over at once: the next one need not wait for the lease.
    await this.#lease?.close();
    await this.#upgrade.close();
    this.#state.hosts.clear();
    this.#migrations.close();
    this.#attachment.close();
    // The embedded default's engines stop with it (drained and flushed); the tickets stay in
    // the store, so the next open attaches those volumes again.
    await this.#own.dataEngine?.close().catch((err: unknown) => this.#warn(toMooringError(err, 'closing this host\'s data engine')));
    await this.#own.store?.close().catch((err: unknown) => this.#warn(toMooringError(err, 'closing the state store')));
  }

  // A migration call of the embedder, in the volume's turn; `converge` reconciles the
  // tickets after it (confirm and rollback change what runs). `endsOn`: the migration is
  // over already if the volume runs there (a confirm or rollback done before, by the
  // embedder or by the control loop): the call then does nothing.
  async #migrationStep<T>(name: string, step: () => Promise<T>, converge: boolean, endsOn?: string): Promise<T | undefined> {
    this.#state.checkLeader();
    return this.#state.serial(name, async () => {
      if (!(await this.#state.migrationRecord(name))) {
        if (endsOn !== undefined && (await this.#state.engineRecord(name))?.hostId === endsOn) return undefined;
        throw new MooringError('INVALID_STATE', `volume ${name} is not migrating`);
      }
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
}
