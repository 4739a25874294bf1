/**
 * The migration controller: a second engine on the target host over the same replicas, the
 * hand-over that makes it the writer, confirm and rollback, the embedder's hooks and the
 * disk locks carried at hand-over, and the recovery of a migration a crash left midway
 * (docs/migration.md). The attachment controller starts and ends migrations through it
 * when tickets ask; the embedder's calls arrive through the volume handle.
 *
 * @packageDocumentation
 */
import type { AttachmentDecision } from '../attachment/attachment-reconciler.js';
import type { EngineHandOver, EngineInfo } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import { describe } from '../util/validate.js';
import { CLUSTER_SCHEMA_VERSION, KIND, type EngineRecord, type MigrationRecord } from './cluster-records.js';
import type { HandOverResult, MigrationHooks, MigrationInfo, MigrationLocks } from '../volume/volume.js';
import { migrationInfo, type ControlState, type Observed } from './control-state.js';
import type { EngineLifecycle } from './engine-lifecycle.js';

/** See the module comment. */
export class MigrationController {
  readonly #hooks = new Map<string, { hooks: MigrationHooks; locks: MigrationLocks | null }>();

  constructor(
    private readonly state: ControlState,
    private readonly engines: EngineLifecycle,
  ) {}

  /**
   * Checks that the volume may migrate to `target` now (caller holds the volume's turn).
   *
   * @throws MooringError INVALID_STATE
   */
  async checkMigratable(name: string, target: string): Promise<void> {
    const o = await this.state.observe(name);
    if (o.vol.accessMode !== 'migratable') throw new MooringError('INVALID_STATE', `volume ${name} is RWO; create it with accessMode 'migratable' to migrate it`);
    if (!o.eng || o.engState !== 'running') throw new MooringError('INVALID_STATE', `volume ${name} is not attached on a reachable host`);
    if (o.eng.hostId === target) throw new MooringError('INVALID_STATE', `volume ${name} is attached on ${target} already`);
    if (o.eng.frontendDisabled) throw new MooringError('INVALID_STATE', `volume ${name} is attached without frontend (an operation holds it); migrate it once attached for a VM`);
    if (o.mig && o.mig.targetHost !== target) throw new MooringError('INVALID_STATE', `volume ${name} is migrating to ${o.mig.targetHost} already`);
  }

  /** Keeps (or, with both null, forgets) the hooks and locks of the volume's migrations. Kept in memory only. */
  setHooks(name: string, hooks: MigrationHooks | null, locks: MigrationLocks | null): void {
    if (hooks !== null && typeof hooks !== 'object') throw new MooringError('INVALID_ARGUMENT', `migration hooks must be an object (got ${describe(hooks)})`);
    if (hooks === null && locks === null) this.#hooks.delete(name);
    else this.#hooks.set(name, { hooks: hooks ?? {}, locks });
  }

  /** The recorded migration, or null. */
  async current(name: string): Promise<MigrationInfo | null> {
    const m = await this.state.migrationRecord(name);
    return m ? migrationInfo(m) : null;
  }

  /** Starts the standby on the target the decision names. Caller holds the volume's turn. */
  async start(o: Observed, d: AttachmentDecision): Promise<void> {
    const name = o.vol.name;
    const target = d.migrationHost!;
    const now = Date.now();
    const rec: MigrationRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: name, sourceHost: o.eng!.hostId, targetHost: target, phase: 'starting', handOver: null, targetActivated: false, startedMs: now, updatedMs: now };
    await this.state.store.put(KIND.migration, name, rec, { expectedVersion: 0 });
    this.state.events.volume(name, 'migration-started', migrationInfo(rec));
    try {
      const refs = await this.state.refs(name);
      await this.engines.startOn(target, { volume: name, replicas: refs, nbd: d.migrationFrontend.disabled ? null : d.migrationFrontend.nbd, standby: true });
    } catch (err) {
      const e = toMooringError(err, `starting the migration target of ${name} on ${target}`);
      await this.state.store.delete(KIND.migration, name);
      // The target's tickets go with the failed start, or every pass would try again.
      await this.state.removeTicketsOf(name, target);
      this.state.events.volume(name, 'migration-failed', { ...migrationInfo(rec), step: 'start', error: e });
      throw e;
    }
    const ready = await this.state.putMigration({ ...rec, phase: 'target-ready' });
    this.state.events.volume(name, 'migration-target-ready', migrationInfo(ready));
  }

  /**
   * Moves the writer to the target (idempotent after success). Caller holds the volume's turn.
   *
   * @throws MooringError INVALID_STATE (no migration, or not target-ready), the step's error (rolled back to the source)
   */
  async handOver(name: string): Promise<HandOverResult> {
    const m = await this.state.migrationRecord(name);
    if (!m) throw new MooringError('INVALID_STATE', `volume ${name} is not migrating`);
    if (m.phase === 'handed-over') {
      const info = await this.state.hosts.engineOf(m.targetHost).engineInfo(name);
      return { ...migrationInfo(m, info.epoch), pauseMs: 0, drainMs: 0, rwReplicaIds: info.replicas.filter((r) => r.mode === 'RW').map((r) => r.id) };
    }
    if (m.phase !== 'target-ready') throw new MooringError('INVALID_STATE', `migration of ${name} is ${m.phase}; hand-over needs target-ready`);
    await this.#runHook(name, migrationInfo(m), 'beforeHandOver');
    const source = this.state.hosts.engineOf(m.sourceHost);
    const target = this.state.hosts.engineOf(m.targetHost);
    const locks = this.#hooks.get(name)?.locks ?? null;
    const fail = (step: string, err: unknown): MooringError => {
      const e = toMooringError(err, `migration of ${name}: ${step}`);
      this.state.events.volume(name, 'migration-failed', { ...migrationInfo(m), step, error: e });
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
    let rec = await this.state.putMigration({ ...m, phase: 'handing-over', handOver: { epoch: ho.epoch, generation: ho.generation, rwReplicaIds: [...ho.rwReplicaIds] } });
    // Back to the source: it claims a newer epoch over the replicas it handed over.
    const back = async (): Promise<void> => {
      await this.engines.activate(source, name, ho);
      rec = await this.state.putMigration({ ...rec, phase: 'target-ready', handOver: null });
    };
    let lockHandover = null;
    if (locks) {
      try {
        lockHandover = await locks.source.handOver();
        await locks.target.takeOver(lockHandover, locks.lockspaces);
      } catch (err) {
        if (lockHandover) await locks.source.takeOver(lockHandover, locks.lockspaces).catch((e: unknown) => this.#warn(e, `re-acquiring the locks of ${name} on the source`));
        await back();
        throw fail('locks', err);
      }
    }
    let info: EngineInfo;
    try {
      info = await this.engines.activate(target, name, ho);
    } catch (err) {
      if (locks && lockHandover) {
        const again = await locks.target.handOver().catch(() => lockHandover!);
        await locks.source.takeOver(again, locks.lockspaces).catch((e: unknown) => this.#warn(e, `re-acquiring the locks of ${name} on the source`));
      }
      await back();
      throw fail('activate-target', err);
    }
    const t2 = performance.now();
    rec = await this.state.putMigration({ ...rec, phase: 'handed-over', targetActivated: true });
    const result: HandOverResult = { ...migrationInfo(rec, info.epoch), pauseMs: t2 - t0, drainMs: t1 - t0, rwReplicaIds: ho.rwReplicaIds };
    this.state.events.volume(name, 'migration-handed-over', result);
    await this.#runHook(name, migrationInfo(rec, info.epoch), 'afterHandOver');
    return result;
  }

  /**
   * Ends a migration on the target (handing over first if that has not happened). Caller
   * holds the volume's turn. `viaTickets`: the source's tickets went already.
   */
  async confirm(name: string, viaTickets: boolean, automatic = false): Promise<void> {
    let m = (await this.state.migrationRecord(name))!;
    if (m.phase === 'target-ready') {
      await this.handOver(name);
      m = (await this.state.migrationRecord(name))!;
    }
    if (m.phase !== 'handed-over' && m.phase !== 'confirming') throw new MooringError('INVALID_STATE', `migration of ${name} is ${m.phase}; it cannot be confirmed now`);
    m = await this.state.putMigration({ ...m, phase: 'confirming' });
    if (this.state.hosts.has(m.sourceHost)) {
      await this.state.hosts.stopEngine(m.sourceHost, name).catch((err: unknown) => {
        // A source that cannot be reached is fenced already; the repair loop stops it later.
        if (toMooringError(err).code !== 'NOT_FOUND') this.#warn(err, `stopping the migration source of ${name} on ${m.sourceHost}`);
      });
    }
    const vol = await this.state.volume(name);
    const info = await this.state.hosts.engineOf(m.targetHost).engineInfo(name);
    const frontend = vol.migrationFrontend;
    const eng: EngineRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: name, hostId: m.targetHost, nbd: frontend.disabled ? null : frontend.nbd, frontendDisabled: frontend.disabled, epoch: info.epoch, startedMs: Date.now() };
    await this.state.store.put(KIND.engine, name, eng);
    await this.state.putVolume({ ...vol, desiredHost: m.targetHost, migrationHost: null, frontend });
    if (!viaTickets) await this.state.removeTicketsOf(name, m.sourceHost);
    await this.state.store.delete(KIND.migration, name);
    const done = migrationInfo({ ...m, phase: 'confirming' }, info.epoch);
    this.state.events.volume(name, 'migration-confirmed', { ...done, automatic });
    await this.#runHook(name, done, 'afterConfirm');
  }

  /** Ends a migration on the source. Caller holds the volume's turn. */
  async rollback(name: string, automatic: boolean, reason: string): Promise<void> {
    let m = (await this.state.migrationRecord(name))!;
    // Once the target writes, it gives that up only to a source that can take it back:
    // else the volume would be left with no writer (the source's engine a standby, the
    // target's stopped) while its status said attached on the source.
    if (m.targetActivated && !(await this.state.hosts.reachable(m.sourceHost))) {
      throw new MooringError('UNAVAILABLE', `volume ${name}: the migration source ${m.sourceHost} cannot be reached, so the target on ${m.targetHost} keeps writing; confirm, or roll back once ${m.sourceHost} is back`, {
        details: { volume: name, sourceHost: m.sourceHost, targetHost: m.targetHost },
      });
    }
    m = await this.state.putMigration({ ...m, phase: 'rolling-back' });
    const target = this.state.hosts.get(m.targetHost);
    if (m.targetActivated) {
      // The target may have written: it drains and hands back; the source claims a newly allocated epoch.
      const ho = target ? await target.deactivateEngine(name).catch(() => null) : null;
      const src = this.state.hosts.engineOf(m.sourceHost);
      if (ho) {
        const locks = this.#hooks.get(name)?.locks ?? null;
        if (locks) {
          try {
            await locks.source.takeOver(await locks.target.handOver(), locks.lockspaces);
          } catch (err) {
            const e = toMooringError(err, `moving the locks of ${name} back to the source`);
            this.state.events.volume(name, 'migration-failed', { ...migrationInfo(m), step: 'locks', error: e });
            throw e;
          }
        }
        const role = await src.engineInfo(name).then((i) => i.role, () => null);
        if (role === 'standby') await this.engines.activate(src, name, ho);
        else if (role === null) {
          // Gone since the check: the record stays rolling-back, and the next pass finishes it
          // (the target, handed back, starts nothing; the source takes over with a new epoch).
          throw new MooringError('UNAVAILABLE', `volume ${name}: the migration source ${m.sourceHost} stopped answering during the rollback; it is finished once ${m.sourceHost} is back`);
        }
      } else {
        // The target cannot hand back (its host is gone, or it was fenced).
        await this.#restartSource(name, m.sourceHost);
      }
      m = await this.state.putMigration({ ...m, targetActivated: false });
    }
    if (target) {
      await this.state.hosts.stopEngine(m.targetHost, name).catch((err: unknown) => {
        if (toMooringError(err).code !== 'NOT_FOUND') this.#warn(err, `stopping the migration target of ${name} on ${m.targetHost}`);
      });
    }
    await this.state.removeTicketsOf(name, m.targetHost);
    const vol = await this.state.volume(name);
    await this.state.putVolume({ ...vol, migrationHost: null });
    await this.state.store.delete(KIND.migration, name);
    const info = await this.state.hosts.engineOf(m.sourceHost).engineInfo(name).then((i) => i.epoch, () => 0);
    const done = migrationInfo(m, info);
    this.state.events.volume(name, 'migration-rolled-back', { ...done, automatic, reason });
    await this.#runHook(name, done, 'afterRollback');
  }

  /**
   * A migration found in an intermediate state (a crash of a host, or of this process):
   * finish or undo it. True if something changed. Caller holds the volume's turn.
   */
  async recover(o: Observed): Promise<boolean> {
    const m = o.mig!;
    const name = m.volume;
    const target = await this.state.hosts.probe(m.targetHost, name);
    const source = await this.state.hosts.probe(m.sourceHost, name);
    const gone = (p: typeof target): p is 'unreachable' | 'stopped' => p === 'unreachable' || p === 'stopped';
    switch (m.phase) {
      case 'starting':
        if (!gone(target)) {
          await this.state.putMigration({ ...m, phase: 'target-ready' });
          this.state.events.volume(name, 'migration-target-ready', migrationInfo(m));
        } else {
          await this.rollback(name, true, `the target engine on ${m.targetHost} did not start`);
        }
        return true;
      case 'target-ready':
        if (gone(target)) {
          await this.rollback(name, true, `the target ${target === 'stopped' ? 'engine is gone' : 'host cannot be reached'}`);
          return true;
        }
        // The source drained for a hand-over whose record was never written (the control
        // plane died in between): nobody writes, and what it handed over is lost with that
        // process. The target has not claimed; the source serves again as a fresh engine.
        if (target.role === 'standby' && !gone(source) && source.role === 'standby') {
          await this.#restartSource(name, m.sourceHost);
          this.#warn(new MooringError('INVALID_STATE', `the source engine of ${name} on ${m.sourceHost} had drained for a hand-over that was never recorded`), `restarted it; the migration stays target-ready`);
          return true;
        }
        return false;
      case 'handing-over':
        // Interrupted between the source's drain and the target's claim.
        if (!gone(target) && target.role === 'active') {
          await this.state.putMigration({ ...m, phase: 'handed-over', targetActivated: true });
        } else if (!gone(source) && m.handOver) {
          if (source.role === 'standby') await this.engines.activate(this.state.hosts.engineOf(m.sourceHost), name, m.handOver);
          await this.state.putMigration({ ...m, phase: 'target-ready', handOver: null });
        } else if (!gone(target) && m.handOver) {
          await this.engines.activate(this.state.hosts.engineOf(m.targetHost), name, m.handOver);
          await this.state.putMigration({ ...m, phase: 'handed-over', targetActivated: true });
        } else {
          return false; // neither side can be reached: wait
        }
        return true;
      case 'handed-over':
        if (gone(target)) {
          await this.rollback(name, true, `the target ${target === 'stopped' ? 'engine is gone' : 'host cannot be reached'} after hand-over`);
          return true;
        }
        if (source === 'unreachable') {
          await this.confirm(name, false, true);
          return true;
        }
        return false;
      case 'confirming':
        await this.confirm(name, false, true);
        return true;
      case 'rolling-back':
        await this.rollback(name, true, 'finishing a rollback that was interrupted');
        return true;
    }
  }

  // The source takes the volume over as after a crash: a fresh engine claims a newly
  // allocated epoch, above every one handed out before; replicas the target fenced open ERR
  // and are rebuilt. Its export is recreated: its clients reconnect.
  async #restartSource(name: string, sourceHost: string): Promise<void> {
    const eng = await this.state.engineRecord(name);
    await this.state.hosts.stopEngine(sourceHost, name).catch(() => undefined);
    const refs = await this.state.refs(name);
    const info = await this.engines.withNewEpoch(name, 0, 'start', (epoch) => this.engines.startOn(sourceHost, { volume: name, replicas: refs, nbd: eng?.nbd ?? null, epoch }));
    if (eng) await this.state.store.put(KIND.engine, name, { ...eng, epoch: info.epoch, startedMs: Date.now() });
  }

  /** Forgets every volume's hooks and locks. */
  close(): void {
    this.#hooks.clear();
  }

  async #runHook(name: string, m: MigrationInfo, hook: keyof MigrationHooks): Promise<void> {
    const fn = this.#hooks.get(name)?.hooks[hook];
    if (!fn) return;
    try {
      await fn(m);
    } catch (err) {
      const e = toMooringError(err, `migration hook ${hook} of ${name}`);
      this.state.events.volume(name, 'migration-failed', { ...m, step: hook, error: e });
      if (hook === 'beforeHandOver') throw e;
    }
  }

  #warn(err: unknown, what: string): void {
    this.state.events.cluster('warning', toMooringError(err, what));
  }
}
