/**
 * Starting, activating and stopping a volume's engines on their hosts, each with a writer
 * epoch newly allocated from the volume's counter in the store (src/cluster/epochs.ts,
 * docs/single-writer.md). The attachment and migration controllers start and stop engines
 * only through here.
 *
 * @packageDocumentation
 */
import type { DataEngine, DataEngineEvent, EngineHandOver, EngineInfo, EngineStartOptions } from '../data-engine/data-engine.js';
import type { VolumeSalvagedEvent } from '../mooring-options.js';
import { MooringError, toMooringError } from '../errors.js';
import { delay, withTimeout } from '../util/async.js';
import type { Frontend } from '../attachment/attachment-ticket.js';
import { CLUSTER_SCHEMA_VERSION, KIND, type EngineRecord } from './cluster-records.js';
import type { ControlState, Observed } from './control-state.js';
import { HOST_PROBE_TIMEOUT_MS } from './hosts.js';
import { settleEngineSize } from './volume-resize.js';

/**
 * Epochs one start or activation tries: a STALE_EPOCH refusal (a replica promised that epoch
 * or more, e.g. one written by a release whose engines chose their epochs) is tried again
 * above the highest epoch the replicas report.
 */
export const EPOCH_ATTEMPTS_MAX = 3;

/** How long a salvage start waits for its data engine's `salvaged` report after the start returned. */
const SALVAGED_EVENT_WAIT_MS = 2000;

type SalvagedReport = Extract<DataEngineEvent, { type: 'salvaged' }>;

/** See the module comment. */
export class EngineLifecycle {
  /** The last salvage start of each volume (read and dropped by the salvage operation). */
  readonly salvaged = new Map<string, VolumeSalvagedEvent>();

  constructor(private readonly state: ControlState) {}

  /**
   * Starts the volume's engine on a host with a new epoch and records it as attached there.
   * `salvage` (a salvage ticket asks for it; docs/salvage.md): over the replicas whose hosts
   * answer, as a salvage start; the others are recorded ERR, to be replaced.
   */
  async start(name: string, host: string, frontend: Frontend, salvage = false): Promise<void> {
    let refs = await this.state.refs(name);
    const gone: string[] = [];
    if (salvage) {
      const kept = [];
      for (const r of refs) {
        if (await this.state.hosts.reachable(r.hostId)) kept.push(r);
        else gone.push(r.id);
      }
      if (kept.length === 0) throw new MooringError('NO_HEALTHY_REPLICA', `volume ${name}: no host holding one of its replicas answers; nothing to salvage from`);
      refs = kept;
    }
    const nbd = frontend.disabled ? null : frontend.nbd;
    const de = this.state.hosts.engineOf(host);
    let report: SalvagedReport | null = null;
    const unwatch = salvage ? de.watch((e) => {
      if (e.type === 'salvaged' && e.volume === name) report = e;
    }) : () => undefined;
    let info: EngineInfo;
    try {
      info = await this.withNewEpoch(name, 0, 'start', (epoch) => this.startOn(host, { volume: name, replicas: refs, nbd, epoch, ...(salvage ? { salvage } : {}) }));
      // The report may trail the start (it comes over the data engine's event stream).
      for (const until = Date.now() + SALVAGED_EVENT_WAIT_MS; salvage && report === null && Date.now() < until; ) await delay(20);
    } finally {
      unwatch();
    }
    const rec: EngineRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: name, hostId: host, nbd, frontendDisabled: frontend.disabled, epoch: info.epoch, startedMs: Date.now() };
    await this.state.store.put(KIND.engine, name, rec);
    if (salvage) await this.#recordSalvage(name, host, info, gone, report);
    await this.state.recordModes(name, info);
    await settleEngineSize(this.state, name, host, info);
  }

  // The replicas left out become ERR at once (replaced by the repair that follows), and the
  // salvage is reported.
  async #recordSalvage(name: string, host: string, info: EngineInfo, gone: string[], report: SalvagedReport | null): Promise<void> {
    for (const r of await this.state.replicas(name)) {
      if (!gone.includes(r.id)) continue;
      await this.state.store.put(KIND.replica, r.name, { ...r, mode: 'ERR', failedSinceMs: 0, lastError: `host ${r.hostId} did not answer when ${name} was salvaged: left out` });
    }
    const event: VolumeSalvagedEvent = {
      volume: name,
      hostId: host,
      epoch: info.epoch,
      sourceReplicas: info.replicas.filter((r) => r.mode === 'RW').map((r) => r.id),
      goneReplicas: gone,
      complete: report?.complete ?? null,
      message: report?.message ?? 'the engine\'s salvage report did not arrive in time',
    };
    this.salvaged.set(name, event);
    this.state.events.cluster('volume-salvaged', event);
  }

  /**
   * Starts an engine (or a standby) on a host. An engine of the volume left there by an
   * earlier attachment (its host was unreachable when the volume moved on, so a newer epoch
   * fenced it, or a migration standby whose rollback could not reach it) is replaced. The
   * second start reuses the epoch: ALREADY_EXISTS is answered before anything is claimed.
   */
  async startOn(host: string, started: EngineStartOptions): Promise<EngineInfo> {
    const de = this.state.hosts.engineOf(host);
    const timeout = this.state.settings.engineIoTimeoutMs;
    const options: EngineStartOptions = timeout === undefined ? started : { ...started, ioTimeoutMs: timeout };
    try {
      return await de.startEngine(options);
    } catch (err) {
      if (toMooringError(err).code !== 'ALREADY_EXISTS') throw err;
      await this.state.hosts.stopEngine(host, options.volume).catch(() => undefined);
      this.state.events.cluster('stray-engine-stopped', { volume: options.volume, hostId: host });
      return de.startEngine(options);
    }
  }

  /**
   * Stops the attached engine. If it stops but reports a failure on the way (say, its
   * replicas could not be marked clean on full disks), the volume is detached and the
   * failure is a warning; if its host cannot be reached, UNAVAILABLE (the next pass retries).
   */
  async stop(o: Observed): Promise<void> {
    const eng = o.eng!;
    if (!this.state.hosts.has(eng.hostId)) throw new MooringError('UNAVAILABLE', `volume ${o.vol.name} is attached on ${eng.hostId}, which is not a host of this cluster`);
    try {
      await this.state.hosts.stopEngine(eng.hostId, o.vol.name);
    } catch (err) {
      const e = toMooringError(err);
      if (e.code !== 'NOT_FOUND' && (await this.state.hosts.probe(eng.hostId, o.vol.name)) !== 'stopped') throw e;
      if (e.code !== 'NOT_FOUND') this.state.events.cluster('warning', toMooringError(err, `detaching ${o.vol.name} from ${eng.hostId}`));
    }
    await this.state.store.delete(KIND.engine, o.vol.name);
  }

  /**
   * Runs a start or an activation of the volume's engine with a newly allocated epoch (above
   * `atLeast`). Refused with STALE_EPOCH because a replica promised that epoch or more
   * (replicas of a release whose engines chose their epochs, whose epochs the store never
   * saw), it is tried again above the highest epoch the replicas report, at most
   * EPOCH_ATTEMPTS_MAX epochs in all. A refusal that no listed epoch explains is not tried
   * again: for a start, no replica at or above the epoch refused (the replicas that refused
   * cannot be listed from here); for an activation, none above it, since a refused
   * activation has claimed its epoch on the replicas anyway, and its STALE_EPOCH more likely
   * says that the hand-over was overtaken, which no epoch mends.
   */
  async withNewEpoch<T>(name: string, atLeast: number, kind: 'start' | 'activate', run: (epoch: number) => Promise<T>): Promise<T> {
    let floor = atLeast;
    for (let attempt = 1; ; attempt++) {
      const epoch = await this.state.epochs.allocate(name, floor);
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

  /** Activates a standby from a hand-over with a newly allocated epoch (above the hand-over's, as the engine requires). */
  activate(de: DataEngine, name: string, handOver: EngineHandOver): Promise<EngineInfo> {
    return this.withNewEpoch(name, handOver.epoch, 'activate', (epoch) => de.activateEngine(name, handOver, { epoch }));
  }

  // The highest epoch the volume's replicas promised, as their data engines list them (hosts
  // that do not answer in time are left out: 0 if none does).
  async #replicaEpochMax(name: string): Promise<number> {
    const byHost = new Map<string, Set<string>>();
    for (const r of await this.state.replicas(name)) {
      const names = byHost.get(r.hostId) ?? new Set<string>();
      byHost.set(r.hostId, names.add(r.name));
    }
    let max = 0;
    await Promise.all(
      [...byHost].map(async ([hostId, names]) => {
        const de = this.state.hosts.get(hostId);
        if (!de) return;
        const listed = await withTimeout(de.listReplicas(), HOST_PROBE_TIMEOUT_MS, `replicas of ${hostId}`).catch(() => []);
        for (const r of listed) {
          if (names.has(r.name) && Number.isSafeInteger(r.epoch) && r.epoch > max) max = r.epoch;
        }
      }),
    );
    return max;
  }
}
