/**
 * Cluster: volumes whose replicas live on several hosts. It places replicas on the data
 * engines it is given, starts a volume's engine on the host it is attached to, keeps what
 * it decided in a {@link StateStore} (so a restarted VM manager finds its volumes, engines
 * and replicas again), and repairs volumes: a replica that stays ERR beyond a wait is
 * replaced by a new one on a host that holds none of the volume's replicas.
 *
 * The data engines do the data work (replica servers, engines, rebuilds); a data engine
 * also re-adds a replica by itself when that replica's host comes back. The cluster only
 * decides; it never carries data.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type * as TE from 'typed-emitter';

import type { DataEngine, DataEngineEvent, EngineInfo, EngineReplicaRef, RebuildProgress } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import type { StateStore } from '../state/state-store.js';
import { safeEmit } from '../util/emit.js';
import { checkIntIn, checkName, checkReplicaCount, checkVolumeSize, describe } from '../util/validate.js';
import {
  CLUSTER_SCHEMA_VERSION,
  KIND,
  parseEngineRecord,
  parseHostRecord,
  parseReplicaRecord,
  parseVolumeRecord,
  type EngineRecord,
  type HostRecord,
  type ReplicaRecord,
  type VolumeRecord,
} from './cluster-records.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** How often the repair loop looks at attached volumes, by default. */
export const DEFAULT_REPAIR_INTERVAL_MS = 2000;
/** How long a replica may stay ERR before it is replaced on another host, by default (Longhorn: 600 s). */
export const DEFAULT_REPLICA_REPLACEMENT_WAIT_MS = 600_000;
/** Largest value of the millisecond settings (a week). */
const MS_SETTING_MAX = 7 * 24 * 3600 * 1000;
/** How long a call to a data engine may take before its host counts as unreachable for a decision. */
export const HOST_PROBE_TIMEOUT_MS = 3000;

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
}

/** Options of {@link Cluster.createVolume}. */
export interface ClusterVolumeCreateOptions {
  /** Volume name ([A-Za-z0-9._-]{1,63}), unique in the store. */
  name: string;
  /** Size in bytes: a positive multiple of 4096. */
  sizeBytes: number;
  /** Number of replicas (default 3), each on a different host. */
  replicas?: number;
  /** Hosts to place the replicas on (default: the hosts with the fewest replicas). */
  hosts?: string[];
}

/** Options of {@link Cluster.attach}. */
export interface ClusterAttachOptions {
  /** Host whose data engine runs the engine. */
  host: string;
  /** NBD address to export on (default: none). */
  nbd?: string | null;
}

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
  /** detached; healthy (all RW); degraded (some RW, fewer than wanted); faulted (no RW); unknown (engine host unreachable). */
  state: 'detached' | 'healthy' | 'degraded' | 'faulted' | 'unknown';
  attachedHost: string | null;
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

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new MooringError('UNAVAILABLE', `${what}: no answer within ${ms} ms`)), ms);
    t.unref();
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
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
  readonly #hosts = new Map<string, { engine: DataEngine; unwatch: () => void }>();
  readonly #repairIntervalMs: number;
  readonly #replacementWaitMs: number;
  #timer: NodeJS.Timeout | null = null;
  #repairing: Promise<void> | null = null;
  #closed = false;
  // Serialises the decisions about one volume (attach, detach, repair).
  readonly #volumeChains = new Map<string, Promise<unknown>>();

  private constructor(options: ClusterOptions) {
    super();
    this.#store = options.store;
    this.#repairIntervalMs = options.repairIntervalMs ?? DEFAULT_REPAIR_INTERVAL_MS;
    this.#replacementWaitMs = options.replicaReplacementWaitMs ?? DEFAULT_REPLICA_REPLACEMENT_WAIT_MS;
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
    const c = new Cluster(options);
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
    const info = await engine.info();
    checkName('host id', info.hostId);
    const old = this.#hosts.get(info.hostId);
    if (old && old.engine !== engine) old.unwatch();
    if (!old || old.engine !== engine) {
      const unwatch = engine.watch((e) => safeEmit(this, 'data-engine-event', info.hostId, e));
      this.#hosts.set(info.hostId, { engine, unwatch });
    }
    const rec: HostRecord = { schema: CLUSTER_SCHEMA_VERSION, hostId: info.hostId, replicaAddress: info.replicaAddress, lastSeenMs: Date.now() };
    await this.#store.put(KIND.host, info.hostId, rec);
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
   * the store. Detached until {@link Cluster.attach}.
   *
   * @throws MooringError INVALID_ARGUMENT, ALREADY_EXISTS, UNAVAILABLE (too few reachable hosts), NO_SPACE
   */
  async createVolume(options: ClusterVolumeCreateOptions): Promise<ClusterVolumeStatus> {
    this.#checkOpen();
    const name = checkName('volume name', options.name);
    const sizeBytes = checkVolumeSize(options.sizeBytes);
    const count = checkReplicaCount(options.replicas ?? 3);
    if (await this.#store.get(KIND.volume, name)) throw new MooringError('ALREADY_EXISTS', `volume ${name} exists already`);
    const hosts = options.hosts ?? (await this.#pickHosts(count, new Set()));
    if (hosts.length !== count || new Set(hosts).size !== count) {
      throw new MooringError('INVALID_ARGUMENT', `volume ${name} needs ${count} distinct hosts (got ${hosts.join(', ') || 'none'})`);
    }
    for (const h of hosts) this.#engineOf(h);
    const vol: VolumeRecord = { schema: CLUSTER_SCHEMA_VERSION, name, uuid: randomUUID(), sizeBytes, replicaCount: count, createdMs: Date.now() };
    // Reserve the name first (compare-and-set), so two creators cannot both proceed.
    await this.#store.put(KIND.volume, name, vol, { expectedVersion: 0 });
    const made: ReplicaRecord[] = [];
    try {
      for (let i = 0; i < count; i++) {
        const rec = this.#newReplicaRecord(name, `r${i}`, hosts[i]!);
        await this.#engineOf(rec.hostId).createReplica(rec.name, sizeBytes);
        made.push(rec);
        await this.#store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
      }
    } catch (err) {
      for (const r of made) {
        await this.#engineOf(r.hostId).deleteReplica(r.name).catch(() => undefined);
        await this.#store.delete(KIND.replica, r.name).catch(() => undefined);
      }
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
      await this.#store.delete(KIND.volume, name);
    });
  }

  /** Every volume in the store, with its status. */
  async listVolumes(): Promise<ClusterVolumeStatus[]> {
    const out: ClusterVolumeStatus[] = [];
    for (const d of await this.#store.list<unknown>(KIND.volume)) out.push(await this.status(parseVolumeRecord(d.value, d.key).name));
    return out;
  }

  /**
   * Attaches a volume on a host: starts its engine there (a new writer epoch) over all its
   * replicas, exported at `nbd` if given. Attaching again on the same host returns the
   * current state. If the volume is attached on another host that cannot be reached, the
   * new engine takes over (its newer epoch fences the old one); if that host is reachable,
   * BUSY.
   *
   * @throws MooringError NOT_FOUND, BUSY, UNAVAILABLE, NO_HEALTHY_REPLICA
   */
  async attach(name: string, options: ClusterAttachOptions): Promise<ClusterVolumeStatus> {
    this.#checkOpen();
    const host = checkName('host id', options?.host);
    return this.#serial(name, async () => {
      await this.#volume(name);
      const de = this.#engineOf(host);
      const current = await this.#engineRecord(name);
      if (current) {
        const running = await this.#probeEngine(current.hostId, name);
        if (current.hostId === host && running === 'running') return this.status(name);
        if (current.hostId !== host && running === 'running') throw new MooringError('BUSY', `volume ${name} is attached on ${current.hostId}; detach it first`);
      }
      const refs = await this.#refs(name);
      const info = await de.startEngine({ volume: name, replicas: refs, nbd: options.nbd ?? null });
      const rec: EngineRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: name, hostId: host, nbd: options.nbd ?? null, epoch: info.epoch, startedMs: Date.now() };
      await this.#store.put(KIND.engine, name, rec);
      if (current && current.hostId !== host) safeEmit(this, 'engine-taken-over', { volume: name, fromHost: current.hostId, toHost: host, epoch: info.epoch });
      await this.#recordModes(name, info);
      return this.status(name);
    });
  }

  /**
   * Detaches a volume: stops its engine (drain, flush, replicas marked clean). If the
   * engine stops but reports a failure on the way (say, its replicas could not be marked
   * clean on full disks), the volume is detached and the failure is emitted as `warning`.
   *
   * @throws MooringError NOT_FOUND, UNAVAILABLE (its host cannot be reached)
   */
  async detach(name: string): Promise<void> {
    this.#checkOpen();
    await this.#serial(name, async () => {
      await this.#volume(name);
      const current = await this.#engineRecord(name);
      if (!current) return;
      const h = this.#hosts.get(current.hostId);
      if (h) {
        try {
          await h.engine.stopEngine(name);
        } catch (err) {
          const e = toMooringError(err);
          // The engine is gone but its close reported a failure (e.g. full disks: the
          // replicas could not be marked clean, so the next attach reconciles them): the
          // volume is detached, the failure is a warning.
          if (e.code !== 'NOT_FOUND' && (await this.#probeEngine(current.hostId, name)) !== 'stopped') throw e;
          if (e.code !== 'NOT_FOUND') safeEmit(this, 'warning', toMooringError(err, `detaching ${name} from ${current.hostId}`));
        }
      } else {
        throw new MooringError('UNAVAILABLE', `volume ${name} is attached on ${current.hostId}, which is not a host of this cluster`);
      }
      await this.#store.delete(KIND.engine, name);
    });
  }

  /** The volume's state, replicas and export, as its engine reports them (or as last recorded). */
  async status(name: string): Promise<ClusterVolumeStatus> {
    const vol = await this.#volume(name);
    const replicas = await this.#replicas(name);
    const eng = await this.#engineRecord(name);
    const base: ClusterVolumeStatus = {
      name,
      uuid: vol.uuid,
      sizeBytes: vol.sizeBytes,
      replicaCount: vol.replicaCount,
      state: 'detached',
      attachedHost: eng?.hostId ?? null,
      epoch: eng?.epoch ?? 0,
      nbd: null,
      replicas: replicas.map((r) => ({ id: r.id, hostId: r.hostId, name: r.name, mode: r.mode })),
    };
    if (!eng) return base;
    let info: EngineInfo;
    try {
      info = await withTimeout(this.#engineOf(eng.hostId).engineInfo(name), HOST_PROBE_TIMEOUT_MS, `engine of ${name} on ${eng.hostId}`);
    } catch {
      return { ...base, state: 'unknown' };
    }
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
    for (const d of await this.#store.list<unknown>(KIND.engine)) {
      const volume = parseEngineRecord(d.value, d.key).volume;
      // The record is read again inside the volume's turn: an attach queued before this
      // pass may have moved the engine, and acting on the old record would take the new
      // engine for a stray one.
      await this.#serial(volume, async () => {
        const eng = await this.#engineRecord(volume);
        if (eng) await this.#repairVolume(eng);
      }).catch((err: unknown) => {
        safeEmit(this, 'warning', toMooringError(err, `repairing ${volume}`));
      });
    }
  }

  /** Stops the repair loop and stops watching data engines. Engines keep running on their hosts. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#repairing?.catch(() => undefined);
    for (const h of this.#hosts.values()) h.unwatch();
    this.#hosts.clear();
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
    const prev = this.#volumeChains.get(volume) ?? Promise.resolve();
    const next = prev.catch(() => undefined).then(fn);
    const tail = next.catch(() => undefined);
    this.#volumeChains.set(volume, tail);
    void tail.then(() => {
      if (this.#volumeChains.get(volume) === tail) this.#volumeChains.delete(volume);
    });
    return next;
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

  async #hostRecord(hostId: string): Promise<HostRecord | null> {
    const d = await this.#store.get<unknown>(KIND.host, hostId);
    return d ? parseHostRecord(d.value, d.key) : null;
  }

  #newReplicaRecord(volume: string, id: string, hostId: string): ReplicaRecord {
    return { schema: CLUSTER_SCHEMA_VERSION, volume, id, hostId, name: replicaName(volume, id), mode: 'unknown', failedSinceMs: null, lastError: null };
  }

  // Whether a host answers and runs the volume's engine.
  async #probeEngine(hostId: string, volume: string): Promise<'running' | 'stopped' | 'unreachable'> {
    const h = this.#hosts.get(hostId);
    if (!h) return 'unreachable';
    try {
      await withTimeout(h.engine.engineInfo(volume), HOST_PROBE_TIMEOUT_MS, `engine of ${volume} on ${hostId}`);
      return 'running';
    } catch (err) {
      return toMooringError(err).code === 'NOT_FOUND' ? 'stopped' : 'unreachable';
    }
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
    await this.#engineOf(targetHost).createReplica(rec.name, vol.sizeBytes);
    await this.#store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
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
