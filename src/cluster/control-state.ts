/**
 * The one layer the controllers share: the records in the state store, typed, the offered
 * hosts, what a volume's engines look like right now ({@link ControlState.observe}), one
 * queue per volume that serialises every decision about it, the settings, and where
 * events go. Controllers read and write the control plane's state only through here; none
 * holds another's private state.
 *
 * @packageDocumentation
 */
import type { LeaderLease } from './leader-lease.js';
import { notLeader } from './leader-store.js';
import { randomUUID } from 'node:crypto';

import { MIGRATING_ATTACHERS } from '../attachment/attachment-ticket.js';
import type { EngineInfo, EngineReplicaRef } from '../data-engine/data-engine.js';
import { MooringError } from '../errors.js';
import type { StateStore } from '../state/state-store.js';
import { KeyedSerial } from '../util/async.js';
import { checkName } from '../util/validate.js';
import {
  CLUSTER_SCHEMA_VERSION,
  byReplicaId,
  KIND,
  emptyAttachmentRecord,
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
import type { MooringEvents } from '../mooring.js';
import type { VolumeEvents, MigrationInfo } from '../volume/volume.js';
import { EpochAllocator } from './epochs.js';
import { HOST_UPGRADE_ACTIVE, HOST_UPGRADE_HANDING_OFF, UPGRADE_KIND, parseHostUpgradeRecord } from '../upgrade/upgrade-records.js';
import { Hosts } from './hosts.js';

/** Settings every controller reads (validated by the facade). */
export interface ControlSettings {
  /** ERR time after which a replica is replaced on another host. */
  replacementWaitMs: number;
  /** Default wait of an attach (and of an operation's own ticket). */
  ticketWaitMs: number;
  /** I/O timeout handed to every engine started, or undefined for the data engine's own. */
  engineIoTimeoutMs: number | undefined;
}

/** Where the controllers' events go: the facade's emitter and the volume handles. */
export interface ControlEvents {
  cluster<E extends keyof MooringEvents>(event: E, ...args: Parameters<MooringEvents[E]>): void;
  volume<E extends keyof VolumeEvents>(name: string, event: E, ...args: Parameters<VolumeEvents[E]>): void;
}

/** What the control plane last saw of a volume's engines, for one reconcile pass. */
export interface Observed {
  vol: VolumeRecord;
  att: AttachmentRecord;
  attVersion: number;
  eng: EngineRecord | null;
  engState: 'none' | 'running' | 'unreachable';
  engInfo: EngineInfo | null;
  mig: MigrationRecord | null;
}

/** A migration record as the API reports it. */
export function migrationInfo(m: MigrationRecord, epoch = 0): MigrationInfo {
  return { volume: m.volume, sourceHost: m.sourceHost, targetHost: m.targetHost, phase: m.phase, epoch };
}

/** A replica's directory name on its host: unique, and readable as its volume and id. */
export function replicaName(volume: string, id: string): string {
  return `${replicaNamePrefix(volume)}${id}-${randomUUID().slice(0, 8)}`;
}

/** What every replica name of `volume` starts with (other volumes' names may too: filter by record). */
export function replicaNamePrefix(volume: string): string {
  return `${volume.slice(0, 40)}-`;
}

/** Replicas per host id. */
export function replicaLoad(replicas: ReplicaRecord[]): Map<string, number> {
  const load = new Map<string, number>();
  for (const r of replicas) load.set(r.hostId, (load.get(r.hostId) ?? 0) + 1);
  return load;
}

/**
 * The `count` hosts of `candidates` holding the fewest replicas (ties by id).
 *
 * @throws MooringError UNAVAILABLE (fewer than `count` candidates)
 */
export function leastLoaded(candidates: string[], load: Map<string, number>, count: number): string[] {
  const sorted = [...candidates].sort((a, b) => (load.get(a) ?? 0) - (load.get(b) ?? 0) || a.localeCompare(b));
  if (sorted.length < count) {
    throw new MooringError('UNAVAILABLE', `need ${count} reachable host(s) for replicas, have ${sorted.length} (${sorted.join(', ') || 'none'})`);
  }
  return sorted.slice(0, count);
}

/** See the module comment. */
export class ControlState {
  readonly epochs: EpochAllocator;
  /** This control plane's instance (one per open): the operation tickets it takes carry it. */
  readonly instanceId = randomUUID();
  readonly #chains = new KeyedSerial();
  #closed = false;

  constructor(
    readonly store: StateStore,
    readonly hosts: Hosts,
    readonly settings: ControlSettings,
    readonly events: ControlEvents,
  ) {
    this.epochs = new EpochAllocator(store);
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** From now on every public call fails CLOSED and loops stop. */
  markClosed(): void {
    this.#closed = true;
  }

  /** @throws MooringError CLOSED */
  checkOpen(): void {
    if (this.#closed) throw new MooringError('CLOSED', 'cluster is closed');
  }

  /** Set when several embedders share the store: only the leader changes anything. */
  leadership: LeaderLease | null = null;

  /**
   * What a control operation checks first: open, and this embedder leads (when several
   * share the store). The store refuses a deposed leader's writes as well.
   *
   * @throws MooringError CLOSED, NOT_LEADER
   */
  checkLeader(): void {
    this.checkOpen();
    if (this.leadership && !this.leadership.isLeader) throw notLeader(this.leadership);
  }

  /** Runs `fn` in the volume's turn: decisions about one volume never interleave. */
  serial<T>(volume: string, fn: () => Promise<T>): Promise<T> {
    return this.#chains.run(volume, fn);
  }

  // --- records ---

  /** @throws MooringError NOT_FOUND, INVALID_ARGUMENT (bad name) */
  async volume(name: string): Promise<VolumeRecord> {
    checkName('volume name', name);
    const d = await this.store.get<unknown>(KIND.volume, name);
    if (!d) throw new MooringError('NOT_FOUND', `no volume ${name}`);
    return parseVolumeRecord(d.value, d.key);
  }

  async putVolume(vol: VolumeRecord): Promise<void> {
    await this.store.put(KIND.volume, vol.name, { ...vol, schema: CLUSTER_SCHEMA_VERSION });
  }

  /** Every volume record. */
  async volumes(): Promise<VolumeRecord[]> {
    return (await this.store.list<unknown>(KIND.volume)).map((d) => parseVolumeRecord(d.value, d.key));
  }

  /** Every replica record (of every volume). */
  async allReplicas(): Promise<ReplicaRecord[]> {
    return (await this.store.list<unknown>(KIND.replica)).map((d) => parseReplicaRecord(d.value, d.key));
  }

  /**
   * The volume's replica records, by id: those whose key (the replica name) starts with the
   * volume's name prefix, so a pass over N volumes reads each record about once, not N times.
   */
  async replicas(volume: string): Promise<ReplicaRecord[]> {
    const docs = await this.store.list<unknown>(KIND.replica, { prefix: replicaNamePrefix(volume) });
    return docs
      .map((d) => parseReplicaRecord(d.value, d.key))
      .filter((r) => r.volume === volume)
      .sort(byReplicaId);
  }

  newReplicaRecord(volume: string, id: string, hostId: string): ReplicaRecord {
    return { schema: CLUSTER_SCHEMA_VERSION, volume, id, hostId, name: replicaName(volume, id), mode: 'unknown', failedSinceMs: null, lastError: null };
  }

  async engineRecord(volume: string): Promise<EngineRecord | null> {
    const d = await this.store.get<unknown>(KIND.engine, volume);
    return d ? parseEngineRecord(d.value, d.key) : null;
  }

  /** Every engine record. */
  async engineRecords(): Promise<EngineRecord[]> {
    return (await this.store.list<unknown>(KIND.engine)).map((d) => parseEngineRecord(d.value, d.key));
  }

  async attachment(volume: string): Promise<{ rec: AttachmentRecord; version: number }> {
    const d = await this.store.get<unknown>(KIND.attachment, volume);
    if (!d) return { rec: emptyAttachmentRecord(volume), version: 0 };
    return { rec: parseAttachmentRecord(d.value, d.key), version: d.version };
  }

  /** Drops the `api`/`workload` tickets of a host (a migration's side that ended). */
  async removeTicketsOf(name: string, host: string): Promise<void> {
    const att = await this.attachment(name);
    const kept = att.rec.tickets.filter((t) => !(t.hostId === host && MIGRATING_ATTACHERS.has(t.type)));
    if (kept.length !== att.rec.tickets.length) await this.store.put(KIND.attachment, name, { ...att.rec, tickets: kept }, { expectedVersion: att.version });
  }

  /** Every migration record. */
  async migrationRecords(): Promise<MigrationRecord[]> {
    return (await this.store.list<unknown>(KIND.migration)).map((d) => parseMigrationRecord(d.value, d.key));
  }

  async migrationRecord(volume: string): Promise<MigrationRecord | null> {
    const d = await this.store.get<unknown>(KIND.migration, volume);
    return d ? parseMigrationRecord(d.value, d.key) : null;
  }

  async putMigration(m: MigrationRecord): Promise<MigrationRecord> {
    const next = { ...m, updatedMs: Date.now() };
    await this.store.put(KIND.migration, m.volume, next);
    return next;
  }

  async hostRecord(hostId: string): Promise<HostRecord | null> {
    const d = await this.store.get<unknown>(KIND.host, hostId);
    return d ? parseHostRecord(d.value, d.key) : null;
  }

  // --- what runs ---

  /**
   * Reads the records and what runs. Drops an engine record whose engine is gone (its data
   * engine restarted): the next pass attaches again if a ticket still asks.
   */
  async observe(name: string): Promise<Observed> {
    const vol = await this.volume(name);
    const att = await this.attachment(name);
    let eng = await this.engineRecord(name);
    const mig = await this.migrationRecord(name);
    let engState: Observed['engState'] = 'none';
    let engInfo: EngineInfo | null = null;
    if (eng) {
      // In a full pass, an engine its host listed runs (a stale 'running' waits one pass;
      // 'stopped', which drops the record, is always asked of the host itself).
      const p = (await this.hosts.listedEngine(eng.hostId, name)) ?? (await this.hosts.probe(eng.hostId, name));
      if (p === 'stopped' && (await this.#handingOff(eng.hostId))) {
        // Its host's process is handing its engines to a new one (an in-place upgrade): the
        // engine is between the two, and the upgrade controller brings it back. Starting it
        // here would restart it under its NBD clients.
        engState = 'unreachable';
      } else if (p === 'stopped') {
        if (!mig) await this.store.delete(KIND.engine, name);
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

  /** How an engine reaches a replica: its host's recorded replica address. */
  async refOf(r: ReplicaRecord): Promise<EngineReplicaRef> {
    const host = await this.hostRecord(r.hostId);
    return { id: r.id, hostId: r.hostId, name: r.name, address: host?.replicaAddress ?? null };
  }

  /** The first host holding one of the volume's replicas that answers, or null. */
  async reachableReplicaHost(volume: string): Promise<string | null> {
    for (const r of await this.replicas(volume)) if (await this.hosts.reachable(r.hostId)) return r.hostId;
    return null;
  }

  /** @throws MooringError NO_HEALTHY_REPLICA (the volume has none) */
  async refs(volume: string): Promise<EngineReplicaRef[]> {
    const out: EngineReplicaRef[] = [];
    for (const r of await this.replicas(volume)) out.push(await this.refOf(r));
    if (out.length === 0) throw new MooringError('NO_HEALTHY_REPLICA', `volume ${volume} has no replicas`);
    return out;
  }

  // Whether an upgrade session is handing the host's engines to a new process now.
  async #handingOff(hostId: string): Promise<boolean> {
    for (const d of await this.store.list<unknown>(UPGRADE_KIND.host)) {
      const h = parseHostUpgradeRecord(d.value, d.key);
      if (h.hostId === hostId && HOST_UPGRADE_HANDING_OFF.has(h.state)) return true;
    }
    return false;
  }

  /** Hosts an upgrade session holds now (src/upgrade/): no new replicas go there, and their replicas are not replaced. */
  async unschedulableHosts(): Promise<Set<string>> {
    const out = new Set<string>();
    for (const d of await this.store.list<unknown>(UPGRADE_KIND.host)) {
      const h = parseHostUpgradeRecord(d.value, d.key);
      if (HOST_UPGRADE_ACTIVE.has(h.state)) out.add(h.hostId);
    }
    return out;
  }

  /** Hosts marked evicting (src/cluster/eviction-controller.ts): no new replicas or image files go there. */
  async evictingHosts(): Promise<Set<string>> {
    const out = new Set<string>();
    for (const d of await this.store.list<unknown>(KIND.host)) if (parseHostRecord(d.value, d.key).evicting) out.add(d.key);
    return out;
  }

  /** Offered hosts that answer, neither in `exclude` nor held by an upgrade session: where new replicas may go. */
  async schedulableHosts(exclude: Set<string>): Promise<string[]> {
    const held = await this.unschedulableHosts();
    const out: string[] = [];
    for (const id of this.hosts.ids) if (!exclude.has(id) && !held.has(id) && (await this.hosts.reachable(id))) out.push(id);
    return out;
  }

  /**
   * Reachable, schedulable hosts not in `exclude` (nor being evicted), fewest replicas first.
   *
   * @throws MooringError UNAVAILABLE (fewer than `count`)
   */
  async pickHosts(count: number, exclude: Set<string>): Promise<string[]> {
    const load = replicaLoad(await this.allReplicas());
    const evicting = await this.evictingHosts();
    return leastLoaded(await this.schedulableHosts(new Set([...exclude, ...evicting])), load, count);
  }

  /** Records the replica modes an engine reports (and since when a replica is ERR). */
  async recordModes(volume: string, info: EngineInfo): Promise<void> {
    const now = Date.now();
    for (const r of await this.replicas(volume)) {
      const seen = info.replicas.find((x) => x.id === r.id);
      if (!seen) continue;
      const failedSinceMs = seen.mode === 'ERR' ? (r.failedSinceMs ?? now) : null;
      if (seen.mode === r.mode && failedSinceMs === r.failedSinceMs) continue;
      const lastError = seen.mode === 'ERR' && seen.lastError !== 0 ? `errno ${-seen.lastError}` : r.lastError;
      await this.store.put(KIND.replica, r.name, { ...r, mode: seen.mode, failedSinceMs, lastError });
    }
  }
}
