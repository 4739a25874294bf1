/**
 * The upgrade controller: starts an upgrade session after checking every precondition,
 * then drives it host by host, one recorded step at a time (seed 004's states), and picks
 * it up again after the VM manager restarts. One control plane drives a session at a time:
 * it holds a lease in the session document, renewed while it works; another control plane
 * over the same store takes over only once that lease has run out.
 *
 * Per host, with the `restart` method: initializing (the host becomes unschedulable; its
 * volumes are listed and snapshotted) → switching-over (nothing moves) →
 * upgrading-instance-manager (the launcher replaces the process; the host answers with a
 * new instance id) → switching-back (the host's engines are started again, at new epochs)
 * → rebuilding-replica (until every volume is healthy) → completed.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';

import { DATA_ENGINE_FEATURES, type DataEngine, type DataEngineInfo, type EngineInfo } from '../data-engine/data-engine.js';
import { RemoteDataEngine } from '../data-engine/grpc/remote-data-engine.js';
import type { HandOffEpochs } from '../data-engine/process-handoff.js';
import { MooringError, toMooringError } from '../errors.js';
import type { ControlState } from '../cluster/control-state.js';
import { KIND } from '../cluster/cluster-records.js';
import { sleep, withTimeout } from '../util/async.js';
import { checkIntIn, checkName, describe } from '../util/validate.js';
import { HOST_PROBE_TIMEOUT_MS } from '../cluster/hosts.js';
import { MS_SETTING_MAX } from '../cluster/attachment-controller.js';
import { chooseMethod, upgradeBlocks, volumesOn, type UpgradeLayout, type VolumeLayout } from './upgrade-preconditions.js';
import {
  UPGRADE_FINISHED,
  UPGRADE_KIND,
  UPGRADE_METHODS,
  UPGRADE_SCHEMA_VERSION,
  UPGRADE_SESSION_KEY,
  parseHostUpgradeRecord,
  parseNewDataEngine,
  parseUpgradeSessionRecord,
  type HostUpgradeRecord,
  type HostUpgradeState,
  type NewDataEngine,
  type RecordedError,
  type UpgradeSessionRecord,
  type UpgradeState,
  type VolumeUpgradeStatus,
} from './upgrade-records.js';
import { RecordFields } from '../state/record-fields.js';
import { successorLauncher } from './successor-launcher.js';
import { UpgradeSession, blocksMessage, type DataEngineLauncher, type UpgradeOptions, type UpgradeSessionEvents, type UpgradeSessionStatus } from './upgrade-session.js';

/** How long a control plane's hold on a session lasts without renewal. */
export const UPGRADE_LEASE_MS = 15_000;
/** Default of {@link UpgradeOptions.stepTimeoutMs}. */
export const DEFAULT_UPGRADE_STEP_TIMEOUT_MS = 600_000;
/** How long a host may take to answer again after an in-place hand-off. */
const HANDOFF_ANSWER_MS = 30_000;
/** How often a waiting step looks again. */
const WAIT_POLL_MS = 200;
/** Host states a cancel can still undo (the data engine was not replaced yet). */
const CANCELLABLE: ReadonlySet<HostUpgradeState> = new Set(['pending', 'initializing', 'switching-over']);

/** What the controller needs from the rest of the control plane. */
export interface UpgradeDeps {
  state: ControlState;
  /** The embedder's launcher, or null: hosts whose data engine starts its successor use that. */
  launcher: DataEngineLauncher | null;
  /** Whether the host's data engine runs in this process. */
  inProcess(hostId: string): boolean;
  /** Takes a snapshot of a volume (through its operation ticket). */
  snapshot(volume: string, snapshot: string, labels: Record<string, string>): Promise<void>;
  /** Reconciles a volume's tickets now (starts its engine again where a ticket asks). */
  converge(volume: string): Promise<void>;
  /** One repair step for an attached volume (re-adds replicas whose host came back). */
  repair(volume: string): Promise<void>;
  /** Offers a data engine handle (and records its replica address). */
  addHost(engine: DataEngine): Promise<void>;
  /** How long the lease lasts (default {@link UPGRADE_LEASE_MS}; tests shorten it). */
  leaseMs?: number;
}

// Stops the driver where it is: paused, cancelled at a safe point, or the lease went to another control plane.
class Stop extends Error {}

/** See the module comment. */
export class UpgradeController {
  readonly #ownerId = randomUUID();
  readonly #leaseMs: number;
  #driving: Promise<void> | null = null;
  #handle: UpgradeSession | null = null;
  // Session document writes of this process, one at a time (each is read-modify-write with a version check).
  #saving: Promise<unknown> = Promise.resolve();

  constructor(private readonly deps: UpgradeDeps) {
    this.#leaseMs = deps.leaseMs ?? UPGRADE_LEASE_MS;
  }

  /**
   * Checks the preconditions on every host, records the session and starts driving it.
   *
   * @throws MooringError INVALID_ARGUMENT, BUSY (a session is in progress), PRECONDITION_FAILED (`details.reasons`), CLOSED
   */
  async start(options: UpgradeOptions): Promise<UpgradeSession> {
    const { state } = this.deps;
    state.checkLeader();
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `upgrade options must be an object (got ${describe(options)})`);
    const dataEngine = (() => {
      try {
        return parseNewDataEngine(new RecordFields('upgrade', 'options', options.dataEngine, 'dataEngine'));
      } catch (err) {
        throw new MooringError('INVALID_ARGUMENT', `dataEngine: ${toMooringError(err).message.replace(/^state store: upgrade options: /, '')}`);
      }
    })();
    const method = options.method ?? 'auto';
    if (method !== 'auto' && !UPGRADE_METHODS.includes(method)) throw new MooringError('INVALID_ARGUMENT', `method must be 'auto', ${UPGRADE_METHODS.map((m) => `'${m}'`).join(' or ')} (got ${describe(method)})`);
    const stepTimeoutMs = checkIntIn('stepTimeoutMs', options.stepTimeoutMs, 1, MS_SETTING_MAX, DEFAULT_UPGRADE_STEP_TIMEOUT_MS);
    let hosts: string[];
    if (options.hosts === undefined || (Array.isArray(options.hosts) && options.hosts.length === 0)) hosts = state.hosts.ids;
    else if (Array.isArray(options.hosts)) hosts = options.hosts.map((h) => checkName('host id', h));
    else throw new MooringError('INVALID_ARGUMENT', `hosts must be a list of host ids (got ${describe(options.hosts)})`);
    if (new Set(hosts).size !== hosts.length) throw new MooringError('INVALID_ARGUMENT', `hosts lists a host twice (${hosts.join(', ')})`);
    if (hosts.length === 0) throw new MooringError('INVALID_ARGUMENT', 'there is no host to upgrade');

    const old = await state.store.get<unknown>(UPGRADE_KIND.session, UPGRADE_SESSION_KEY);
    if (old) {
      const prev = parseUpgradeSessionRecord(old.value, old.key);
      if (!UPGRADE_FINISHED.has(prev.state)) throw new MooringError('BUSY', `upgrade session ${prev.id} is ${prev.state}; one session at a time`, { details: { session: prev.id } });
    }
    const layout = await this.#layout(hosts, method, dataEngine);
    const blocks = upgradeBlocks(layout);
    if (blocks.length > 0) throw new MooringError('PRECONDITION_FAILED', blocksMessage(blocks), { details: { reasons: blocks } });

    const now = Date.now();
    const rec: UpgradeSessionRecord = {
      schema: UPGRADE_SCHEMA_VERSION,
      id: randomUUID(),
      spec: { hosts, dataEngine, method, stepTimeoutMs },
      state: 'undefined',
      paused: false,
      cancelRequested: false,
      upgradingHost: null,
      error: null,
      ownerId: this.#ownerId,
      leaseUntilMs: now + this.#leaseMs,
      createdMs: now,
      updatedMs: now,
    };
    // Created only over the version read above: two VM managers starting at once get one session.
    await state.store.put(UPGRADE_KIND.session, UPGRADE_SESSION_KEY, rec, { expectedVersion: old?.version ?? 0 }).catch((err: unknown) => {
      throw toMooringError(err).code === 'CONFLICT' ? new MooringError('BUSY', 'another upgrade session was started at the same time', { cause: err }) : err;
    });
    for (const d of await state.store.list<unknown>(UPGRADE_KIND.host)) await state.store.delete(UPGRADE_KIND.host, d.key);
    for (const hostId of hosts) {
      const { method: chosen, reason } = chooseMethod(method, layout.inPlace.has(hostId));
      const h: HostUpgradeRecord = {
        schema: UPGRADE_SCHEMA_VERSION,
        session: rec.id,
        hostId,
        state: 'pending',
        method: chosen,
        methodReason: reason,
        instanceBefore: null,
        versionBefore: null,
        versionAfter: null,
        volumes: {},
        error: null,
        startedMs: null,
        doneMs: null,
      };
      await state.store.put(UPGRADE_KIND.host, hostId, h);
    }
    this.#handle = new UpgradeSession(rec.id, this.#ops());
    this.kick();
    return this.#handle;
  }

  /** The cluster's session (running, paused or the last one ended), or null if none was ever started. */
  async current(): Promise<UpgradeSession | null> {
    const s = await this.#load();
    if (!s) return null;
    if (this.#handle?.id !== s.id) this.#handle = new UpgradeSession(s.id, this.#ops());
    return this.#handle;
  }

  /**
   * Drives the cluster's session if it needs driving and no other control plane holds it
   * (called by the control loop; returns at once). Errors go to `warning`.
   */
  kick(): void {
    if (this.#driving || this.deps.state.closed) return;
    this.#driving = this.#drive()
      .catch((err: unknown) => {
        if (!(err instanceof Stop) && !this.deps.state.closed) this.deps.state.events.cluster('warning', toMooringError(err, 'driving the upgrade session'));
      })
      .finally(() => {
        this.#driving = null;
      });
  }

  /** Waits for the driver to stop (on close). */
  async close(): Promise<void> {
    await this.#driving;
  }

  // --- driving ---

  async #drive(): Promise<void> {
    let s = await this.#load();
    if (!s || UPGRADE_FINISHED.has(s.state) || s.paused) return;
    if (s.ownerId !== this.#ownerId && s.leaseUntilMs > Date.now()) return;
    const heartbeat = setInterval(() => void this.#save(s!.id, (r) => r).catch(() => undefined), this.#leaseMs / 3);
    heartbeat.unref();
    try {
      s = await this.#save(s.id, (r) => r);
      if (s.state === 'undefined' || s.state === 'initializing') {
        s = await this.#setState(s, 'initializing');
        s = await this.#setState(s, 'upgrading');
      }
      for (const hostId of s.spec.hosts) {
        let h = await this.#host(hostId, s.id);
        if (h.state === 'completed' || h.state === 'cancelled') continue;
        if (h.state === 'error') return void (await this.#fail(s, hostId, h.error));
        s = await this.#save(s.id, (r) => ({ ...r, upgradingHost: hostId }));
        if (s.paused) return;
        try {
          h = await this.#upgradeHost(s, h);
        } catch (err) {
          // Stopped, or this control plane closed: the session stays where it was recorded.
          if (err instanceof Stop || this.deps.state.closed) return;
          const e = toMooringError(err, `upgrading host ${hostId}`);
          await this.#putHost({ ...(await this.#host(hostId, s.id)), state: 'error', error: recorded(e), doneMs: Date.now() });
          return void (await this.#fail(s, hostId, recorded(e)));
        }
      }
      s = await this.#save(s.id, (r) => ({ ...r, upgradingHost: null }));
      const cancelled = (await Promise.all(s.spec.hosts.map((h) => this.#host(h, s!.id)))).some((h) => h.state === 'cancelled');
      await this.#setState(s, cancelled ? 'cancelled' : 'completed');
    } finally {
      clearInterval(heartbeat);
    }
  }

  // One host, step after step, from its recorded state. Returns it completed or cancelled.
  async #upgradeHost(s: UpgradeSessionRecord, h: HostUpgradeRecord): Promise<HostUpgradeRecord> {
    const { state } = this.deps;
    const step = (next: HostUpgradeState, patch: Partial<HostUpgradeRecord> = {}): Promise<HostUpgradeRecord> => this.#hostStep(s, h, next, patch);
    for (;;) {
      state.checkOpen();
      s = await this.#save(s.id, (r) => r);
      if (s.paused) throw new Stop();
      if (s.cancelRequested && CANCELLABLE.has(h.state)) return (h = await step('cancelled', { doneMs: Date.now() }));
      switch (h.state) {
        case 'pending':
          this.#emit('method-chosen', { host: h.hostId, method: h.method, reason: h.methodReason });
          h = await step('initializing', { startedMs: Date.now() });
          break;
        case 'initializing':
          h = await this.#initialize(s, h);
          h = await step('switching-over');
          break;
        case 'switching-over':
          // `in-place` hands the engines to the new process here; `restart` moves none away
          // (they stop with the process and start again after it).
          if (h.method === 'in-place') await this.#handOffInPlace(s, h);
          else this.#emit('progress', { host: h.hostId, step: 'switching-over', done: 0, total: 0 });
          h = await step('upgrading-instance-manager');
          break;
        case 'upgrading-instance-manager': {
          const info = await this.#replaceProcess(s, h);
          h = await step('switching-back', { versionAfter: info.version });
          break;
        }
        case 'switching-back':
          await this.#engineVolumesBack(s, h);
          h = await step('rebuilding-replica');
          break;
        case 'rebuilding-replica':
          h = await this.#waitHealthy(s, h);
          h = await step('completed', { doneMs: Date.now() });
          break;
        case 'completed':
        case 'cancelled':
          return h;
        case 'error':
          throw toMooringError(h.error ? new MooringError(h.error.code, h.error.message) : new Error('host upgrade failed'));
      }
    }
  }

  // Lists the host's volumes, checks the host's preconditions again, snapshots each volume.
  async #initialize(s: UpgradeSessionRecord, h: HostUpgradeRecord): Promise<HostUpgradeRecord> {
    const layout = await this.#layout([h.hostId], s.spec.method, s.spec.dataEngine);
    const blocks = upgradeBlocks(layout);
    if (blocks.length > 0) throw new MooringError('PRECONDITION_FAILED', blocksMessage(blocks), { details: { reasons: blocks } });
    const info = await this.#info(h.hostId);
    const volumes = { ...h.volumes };
    for (const v of volumesOn(h.hostId, layout.volumes)) volumes[v.name] ??= { role: v.engineHost === h.hostId ? 'engine' : 'replica', snapshot: null, state: 'listed' };
    h = await this.#putHost({ ...h, volumes, instanceBefore: h.instanceBefore ?? info.instanceId, versionBefore: h.versionBefore ?? info.version });
    const names = Object.keys(volumes).sort();
    const snapshot = `upgrade-${s.id.slice(0, 8)}`;
    // A volume on several hosts is snapshotted once per session, by the first of them.
    const taken = new Set<string>();
    for (const other of s.spec.hosts) {
      if (other === h.hostId) continue;
      for (const [n, v] of Object.entries((await this.#host(other, s.id)).volumes)) if (v.snapshot !== null) taken.add(n);
    }
    let done = names.filter((n) => volumes[n]!.state !== 'listed').length;
    for (const name of names) {
      if (h.volumes[name]!.state !== 'listed') continue;
      await this.#checkFlags(s.id);
      if (taken.has(name)) {
        h = await this.#putVolume(h, name, { snapshot, state: 'snapshotted' });
        this.#emit('progress', { host: h.hostId, step: 'initializing', done: ++done, total: names.length });
        continue;
      }
      await this.deps.snapshot(name, snapshot, { 'mooring.upgrade-session': s.id }).catch((err: unknown) => {
        const e = toMooringError(err);
        // Taken already: by this session for another host, or before a restart of the VM manager.
        if (e.code === 'ALREADY_EXISTS') return;
        // A volume deleted meanwhile has nothing left to protect.
        if (e.code === 'NOT_FOUND' && /no volume/.test(e.message)) return;
        throw toMooringError(err, `snapshotting volume ${name} before upgrading ${h.hostId}`);
      });
      h = await this.#putVolume(h, name, { snapshot, state: 'snapshotted' });
      this.#emit('volume-snapshotted', { host: h.hostId, volume: name, snapshot });
      this.#emit('progress', { host: h.hostId, step: 'initializing', done: ++done, total: names.length });
    }
    return h;
  }

  // In place: the host's data engine hands every engine, NBD clients connected, to the new
  // version's process. Each engine gets two new epochs from its volume's counter: the one the
  // successor claims, and the one the old process claims back on a rollback.
  async #handOffInPlace(s: UpgradeSessionRecord, h: HostUpgradeRecord): Promise<void> {
    const { state } = this.deps;
    const de = state.hosts.engineOf(h.hostId);
    const now = await this.#info(h.hostId);
    // Handed over already (the VM manager stopped after the call): the successor answers.
    if (now.instanceId !== h.instanceBefore) return void (await this.#recordEpochs(h.hostId));
    if (!(de instanceof RemoteDataEngine)) throw new MooringError('UNSUPPORTED', `host ${h.hostId}'s data engine is not reached over gRPC`);
    const engines = await de.listEngines();
    const epochs = new Map<string, HandOffEpochs>();
    for (const e of engines) {
      const epoch = await state.epochs.allocate(e.volume, e.epoch);
      epochs.set(e.volume, { epoch, rollbackEpoch: await state.epochs.allocate(e.volume) });
    }
    this.#emit('progress', { host: h.hostId, step: 'switching-over', done: 0, total: engines.length });
    const out = await de.handOffProcess(s.spec.dataEngine.command!, epochs);
    await this.#recordEpochs(h.hostId);
    if (!out.committed) {
      const e = out.error ?? { code: 'IO_ERROR' as const, message: 'no reason given' };
      throw new MooringError(e.code, `the in-place hand-off on ${h.hostId} was rolled back; its engines serve on in the old process: ${e.message}`, { details: { host: h.hostId, rolledBack: true } });
    }
    this.#emit('progress', { host: h.hostId, step: 'switching-over', done: engines.length, total: engines.length });
    this.#emit('handed-off', { host: h.hostId, engines: out.engines, pauseMs: out.pauseMs });
  }

  // The engine records of a host's volumes take the epochs their engines claimed.
  async #recordEpochs(hostId: string): Promise<void> {
    const { state } = this.deps;
    const infos = await this.#waitForEngines(hostId);
    for (const info of infos) {
      await state.serial(info.volume, async () => {
        const eng = await state.engineRecord(info.volume);
        if (eng && eng.hostId === hostId && eng.epoch !== info.epoch) await state.store.put(KIND.engine, info.volume, { ...eng, epoch: info.epoch });
      });
    }
  }

  // The host's engines, once its data engine answers (the successor may still be binding gRPC).
  async #waitForEngines(hostId: string): Promise<EngineInfo[]> {
    const deadline = Date.now() + HANDOFF_ANSWER_MS;
    for (;;) {
      try {
        return await this.deps.state.hosts.engineOf(hostId).listEngines();
      } catch (err) {
        if (Date.now() >= deadline) throw toMooringError(err, `asking ${hostId} for its engines after the hand-off`);
        await sleep(WAIT_POLL_MS);
      }
    }
  }

  // Has the launcher replace the host's process (unless it was replaced already) and waits
  // until the new one answers.
  async #replaceProcess(s: UpgradeSessionRecord, h: HostUpgradeRecord): Promise<DataEngineInfo> {
    const { state } = this.deps;
    this.#emit('progress', { host: h.hostId, step: 'upgrading-instance-manager', done: 0, total: 1 });
    const now = await this.#info(h.hostId).catch(() => null);
    if (now && now.instanceId === h.instanceBefore) {
      const launcher = this.deps.launcher ?? (now.features.includes(DATA_ENGINE_FEATURES.successorExec) ? successorLauncher : null);
      if (!launcher) throw new MooringError('PRECONDITION_FAILED', `nothing can start the new version on ${h.hostId} (no launcher, and its data engine does not start its successor)`);
      const handle = await launcher.replace(h.hostId, s.spec.dataEngine, { engine: state.hosts.engineOf(h.hostId) });
      if (handle) await this.deps.addHost(handle);
    }
    const info = await this.#waitFor(s, `host ${h.hostId}'s new data engine to answer`, async () => {
      const i = await this.#info(h.hostId).catch(() => null);
      return i && i.instanceId !== h.instanceBefore ? i : null;
    });
    // Its replica address is recorded again (a new process may listen elsewhere).
    await this.deps.addHost(state.hosts.engineOf(h.hostId));
    if (info.version !== s.spec.dataEngine.version) {
      throw new MooringError('INVALID_STATE', `host ${h.hostId} runs data engine version ${info.version} after the upgrade, not ${s.spec.dataEngine.version}`, { details: { host: h.hostId, version: info.version } });
    }
    this.#emit('progress', { host: h.hostId, step: 'upgrading-instance-manager', done: 1, total: 1 });
    return info;
  }

  // The engines that ran on the host start again there (their tickets still ask), at new epochs.
  async #engineVolumesBack(s: UpgradeSessionRecord, h: HostUpgradeRecord): Promise<void> {
    const { state } = this.deps;
    const names = Object.keys(h.volumes).filter((n) => h.volumes[n]!.role === 'engine').sort();
    let done = 0;
    for (const name of names) {
      await this.#waitFor(s, `volume ${name}'s engine to run on ${h.hostId} again`, async () => {
        await this.deps.converge(name).catch(() => undefined);
        const vol = await state.volume(name).catch(() => null);
        if (!vol || vol.desiredHost !== h.hostId) return true; // deleted, detached or moved meanwhile
        const eng = await state.engineRecord(name);
        return eng?.hostId === h.hostId && (await state.hosts.probeEngine(h.hostId, name)) === 'running' ? true : null;
      });
      this.#emit('progress', { host: h.hostId, step: 'switching-back', done: ++done, total: names.length });
    }
  }

  // Every listed volume healthy: attached ones with every replica RW; detached ones count as healthy.
  async #waitHealthy(s: UpgradeSessionRecord, h: HostUpgradeRecord): Promise<HostUpgradeRecord> {
    const { state } = this.deps;
    const names = Object.keys(h.volumes).sort();
    let done = names.filter((n) => h.volumes[n]!.state === 'healthy').length;
    for (const name of names) {
      if (h.volumes[name]!.state === 'healthy') continue;
      await this.#waitFor(s, `volume ${name} to be healthy again`, async () => {
        const eng = await state.engineRecord(name);
        if (!eng) return true;
        await this.deps.repair(name).catch(() => undefined);
        const p = await state.hosts.probe(eng.hostId, name);
        return typeof p !== 'string' && p.replicas.every((r) => r.mode === 'RW') ? true : null;
      });
      h = await this.#putVolume(h, name, { state: 'healthy' });
      this.#emit('progress', { host: h.hostId, step: 'rebuilding-replica', done: ++done, total: names.length });
    }
    return h;
  }

  // Polls `check` until it returns a value, the session is paused or cancelled (only where
  // that is safe: the caller's host state decides), or the step's timeout passes.
  async #waitFor<T>(s: UpgradeSessionRecord, what: string, check: () => Promise<T | null>): Promise<T> {
    const deadline = Date.now() + s.spec.stepTimeoutMs;
    for (;;) {
      this.deps.state.checkOpen();
      const v = await check();
      if (v !== null) return v;
      if (Date.now() >= deadline) throw new MooringError('UNAVAILABLE', `waited ${s.spec.stepTimeoutMs} ms for ${what}`);
      await sleep(WAIT_POLL_MS);
    }
  }

  async #checkFlags(id: string): Promise<void> {
    const s = await this.#load();
    if (!s || s.id !== id || s.paused || s.cancelRequested) throw new Stop();
  }

  async #info(hostId: string): Promise<DataEngineInfo> {
    return withTimeout(this.deps.state.hosts.engineOf(hostId).info(), HOST_PROBE_TIMEOUT_MS, `host ${hostId}`);
  }

  // What the preconditions look at: the hosts, and every volume with its engine's view of its replicas.
  async #layout(hosts: string[], method: UpgradeLayout['method'], dataEngine: NewDataEngine): Promise<UpgradeLayout> {
    const { state } = this.deps;
    const reachable = new Set<string>();
    const launchable = new Set<string>();
    const inPlace = new Set<string>();
    for (const h of hosts) {
      const info = state.hosts.has(h) ? await this.#info(h).catch(() => null) : null;
      if (!info) continue;
      reachable.add(h);
      if (this.deps.launcher !== null || (info.features.includes(DATA_ENGINE_FEATURES.successorExec) && dataEngine.command !== undefined)) launchable.add(h);
      if (info.features.includes(DATA_ENGINE_FEATURES.inPlaceHandOff) && dataEngine.command !== undefined && state.hosts.get(h) instanceof RemoteDataEngine) inPlace.add(h);
    }
    const replicas = await state.allReplicas();
    const migrating = new Set((await state.store.list<unknown>(KIND.migration)).map((d) => d.key));
    const volumes: VolumeLayout[] = [];
    for (const vol of await state.volumes()) {
      const eng = await state.engineRecord(vol.name);
      const mine = replicas.filter((r) => r.volume === vol.name);
      const touches = mine.some((r) => hosts.includes(r.hostId)) || (eng !== null && hosts.includes(eng.hostId));
      if (!touches) continue;
      const probe = eng ? await state.hosts.probe(eng.hostId, vol.name) : null;
      const info = probe !== null && typeof probe !== 'string' ? probe : null;
      volumes.push({
        name: vol.name,
        engineHost: probe === 'stopped' ? null : (eng?.hostId ?? null),
        frontend: eng !== null && !eng.frontendDisabled,
        migrating: migrating.has(vol.name),
        engineAnswered: eng === null || probe !== 'unreachable',
        replicas: mine.map((r) => ({ hostId: r.hostId, mode: info?.replicas.find((x) => x.id === r.id)?.mode ?? 'unknown' })),
      });
    }
    const offered = new Set(state.hosts.ids);
    const inProcess = new Set(state.hosts.ids.filter((h) => this.deps.inProcess(h)));
    return { hosts, offered, reachable, inProcess, launchable, inPlace, method, volumes };
  }

  // --- records ---

  async #load(): Promise<UpgradeSessionRecord | null> {
    const d = await this.deps.state.store.get<unknown>(UPGRADE_KIND.session, UPGRADE_SESSION_KEY);
    return d ? parseUpgradeSessionRecord(d.value, d.key) : null;
  }

  async #host(hostId: string, session: string): Promise<HostUpgradeRecord> {
    const d = await this.deps.state.store.get<unknown>(UPGRADE_KIND.host, hostId);
    const h = d ? parseHostUpgradeRecord(d.value, d.key) : null;
    if (!h || h.session !== session) throw new MooringError('CORRUPT_METADATA', `upgrade session ${session} has no record of host ${hostId}`);
    return h;
  }

  async #putHost(h: HostUpgradeRecord): Promise<HostUpgradeRecord> {
    await this.deps.state.store.put(UPGRADE_KIND.host, h.hostId, h);
    return h;
  }

  #putVolume(h: HostUpgradeRecord, volume: string, patch: Partial<VolumeUpgradeStatus>): Promise<HostUpgradeRecord> {
    return this.#putHost({ ...h, volumes: { ...h.volumes, [volume]: { ...h.volumes[volume]!, ...patch } } });
  }

  async #hostStep(s: UpgradeSessionRecord, h: HostUpgradeRecord, next: HostUpgradeState, patch: Partial<HostUpgradeRecord>): Promise<HostUpgradeRecord> {
    const cur = await this.#host(h.hostId, s.id);
    const out = await this.#putHost({ ...cur, ...patch, state: next });
    this.#emit('host-state-changed', { host: h.hostId, state: next, previous: cur.state });
    return out;
  }

  /**
   * A read-modify-write of the session document as its driver: only while this control
   * plane holds the lease (or the lease ran out), renewing it. `asOwner` false: a flag
   * change that any control plane may make (pause, resume, cancel).
   */
  #save(id: string, change: (r: UpgradeSessionRecord) => UpgradeSessionRecord, asOwner = true): Promise<UpgradeSessionRecord> {
    const run = async (): Promise<UpgradeSessionRecord> => {
      const { store } = this.deps.state;
      const d = await store.get<unknown>(UPGRADE_KIND.session, UPGRADE_SESSION_KEY);
      const cur = d ? parseUpgradeSessionRecord(d.value, d.key) : null;
      if (!cur || cur.id !== id) throw asOwner ? new Stop() : new MooringError('NOT_FOUND', `upgrade session ${id} is no longer the cluster's session`);
      const now = Date.now();
      if (asOwner && cur.ownerId !== this.#ownerId && cur.leaseUntilMs > now) throw new Stop();
      const next = { ...change(cur), updatedMs: now, ...(asOwner ? { ownerId: this.#ownerId, leaseUntilMs: now + this.#leaseMs } : {}) };
      await store.put(UPGRADE_KIND.session, UPGRADE_SESSION_KEY, next, { expectedVersion: d!.version });
      return next;
    };
    const p = this.#saving.then(run, run);
    this.#saving = p.catch(() => undefined);
    return p;
  }

  async #setState(s: UpgradeSessionRecord, state: UpgradeState): Promise<UpgradeSessionRecord> {
    if (s.state === state) return s;
    const out = await this.#save(s.id, (r) => ({ ...r, state }));
    this.#emit('state-changed', { state, previous: s.state });
    return out;
  }

  async #fail(s: UpgradeSessionRecord, host: string | null, error: RecordedError | null): Promise<void> {
    const e = error ?? { code: 'IO_ERROR' as const, message: 'the upgrade failed' };
    const out = await this.#save(s.id, (r) => ({ ...r, error: e, upgradingHost: null }));
    await this.#setState(out, 'error');
    this.#emit('failed', { host, error: new MooringError(e.code, e.message) });
  }

  #emit<E extends keyof UpgradeSessionEvents>(event: E, ...args: Parameters<UpgradeSessionEvents[E]>): void {
    const h = this.#handle;
    if (!h) return;
    try {
      (h.emit as (e: E, ...a: Parameters<UpgradeSessionEvents[E]>) => boolean)(event, ...args);
    } catch (err) {
      this.deps.state.events.cluster('warning', toMooringError(err, `an upgrade session ${event} listener threw`));
    }
  }

  #ops() {
    return {
      status: (id: string) => this.#status(id),
      setFlags: async (id: string, flags: { paused?: boolean; cancelRequested?: boolean }) => {
        this.deps.state.checkOpen();
        const cur = await this.#load();
        if (!cur || cur.id !== id) throw new MooringError('NOT_FOUND', `upgrade session ${id} is no longer the cluster's session`);
        if (UPGRADE_FINISHED.has(cur.state)) throw new MooringError('INVALID_STATE', `upgrade session ${id} has ended (${cur.state})`);
        await this.#save(id, (r) => ({ ...r, ...flags }), false);
        if (flags.paused === false || flags.cancelRequested) this.kick();
      },
    };
  }

  async #status(id: string): Promise<UpgradeSessionStatus> {
    this.deps.state.checkOpen();
    const s = await this.#load();
    if (!s || s.id !== id) throw new MooringError('NOT_FOUND', `upgrade session ${id} is no longer the cluster's session`);
    const hosts: UpgradeSessionStatus['hosts'] = {};
    for (const hostId of s.spec.hosts) {
      const { schema: _s, session: _id, ...rest } = await this.#host(hostId, s.id);
      hosts[hostId] = rest;
    }
    const { schema: _schema, ownerId: _o, leaseUntilMs: _l, ...rest } = s;
    return { ...rest, hosts };
  }
}

function recorded(e: MooringError): RecordedError {
  return { code: e.code, message: e.message.slice(0, 1024) };
}
