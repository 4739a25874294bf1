/**
 * Host (disk) eviction and disk replacement. A data engine serves one directory, its disk,
 * so a host id names one disk here.
 *
 * - **Eviction** ({@link EvictionController.request}): the host record is marked
 *   `evicting` (kept until cancelled, so an evicted host stays empty); no new replica or
 *   image file goes there, and each control-loop pass moves
 *   one replica per volume off it: an attached volume's engine gets a new replica on
 *   another host (rebuilt), then lets the old one go; a detached volume is attached without
 *   frontend under a `volume-eviction` ticket for that. Backing image files there stop
 *   counting toward minCopies once enough copies are ready elsewhere, and go once unused
 *   (backing-image-decide.ts). Done when the host holds neither (`host-evicted`).
 * - **Disk replacement** ({@link EvictionController.hostSeen}): a data engine that comes
 *   back under a known host id with another disk id lost its replicas and files; their
 *   records are marked failed at once, so the next pass replaces them without the
 *   replacement wait.
 *
 * @packageDocumentation
 */
import type { DataEngineInfo } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import type { AttachmentController } from './attachment-controller.js';
import { CLUSTER_SCHEMA_VERSION, KIND, type EngineRecord, type HostRecord, type ReplicaRecord } from './cluster-records.js';
import { leastLoaded, replicaLoad, type ControlState } from './control-state.js';
import type { RepairController } from './repair-controller.js';

/** What an eviction still has to move (Mooring.evictHost, `host-eviction` events). */
export interface HostEvictionProgress {
  /** The host being evicted. */
  hostId: string;
  /** Replicas still on it. */
  replicasLeft: number;
  /** Backing image files still on it. */
  imageFilesLeft: number;
}

// What one eviction pass reads once and every volume's move uses: the evicting hosts, the
// hosts new replicas may go to, and the replicas per host (kept current as moves add some).
interface EvictionPass {
  evicting: Set<string>;
  schedulable: string[];
  load: Map<string, number>;
}

/** See the module comment. */
export class EvictionController {
  // Evicted hosts whose `host-evicted` event this process emitted.
  readonly #reported = new Set<string>();

  constructor(
    private readonly state: ControlState,
    private readonly attachment: AttachmentController,
    private readonly repair: RepairController,
    /** Backing image files a host holds, from the images' records. */
    private readonly imageFilesOn: (hostId: string) => Promise<number>,
  ) {}

  /**
   * The record to store for a host that answered: its address now, its disk id, and the
   * eviction mark kept. A disk id other than the recorded one means a replaced disk: that
   * host's replica records are marked failed (their data is gone) and a `disk-replaced`
   * event says so.
   */
  async hostSeen(hostId: string, info: DataEngineInfo): Promise<HostRecord> {
    const old = await this.state.hostRecord(hostId);
    const rec: HostRecord = {
      schema: CLUSTER_SCHEMA_VERSION,
      hostId,
      replicaAddress: info.replicaAddress,
      lastSeenMs: Date.now(),
      diskId: info.diskId || (old?.diskId ?? ''),
      evicting: old?.evicting ?? false,
    };
    if (old && old.diskId !== '' && info.diskId !== '' && old.diskId !== info.diskId) {
      const lost: string[] = [];
      for (const r of await this.state.allReplicas()) {
        if (r.hostId !== hostId) continue;
        await this.state.store.put(KIND.replica, r.name, { ...r, mode: 'ERR', failedSinceMs: 0, lastError: `disk ${old.diskId} of host ${hostId} was replaced by ${info.diskId}` });
        lost.push(r.name);
      }
      this.state.events.cluster('disk-replaced', { hostId, oldDiskId: old.diskId, newDiskId: info.diskId, lostReplicas: lost });
    }
    return rec;
  }

  /**
   * Marks a host evicting (or no longer). Its record must exist: the host answered once.
   *
   * @throws MooringError NOT_FOUND (never seen)
   */
  async request(hostId: string, evicting: boolean): Promise<void> {
    const rec = await this.state.hostRecord(hostId);
    if (!rec) throw new MooringError('NOT_FOUND', `host ${hostId} has no record: add it (and let it answer once) before evicting it`, { details: { hostId } });
    if (rec.evicting === evicting) return;
    await this.state.store.put(KIND.host, hostId, { ...rec, evicting });
    this.#reported.delete(hostId);
  }

  /** What an eviction of `hostId` still has to move. */
  async progress(hostId: string): Promise<HostEvictionProgress> {
    const replicasLeft = (await this.state.allReplicas()).filter((r) => r.hostId === hostId).length;
    return { hostId, replicasLeft, imageFilesLeft: await this.imageFilesOn(hostId) };
  }

  /**
   * One pass: for each evicting host, moves one replica of each volume that has one there,
   * then reports progress (`host-eviction` events). A volume that cannot move now (no spare
   * host, migrating, a failure) waits for a later pass, with a warning for a failure.
   */
  async step(): Promise<void> {
    const evicting = await this.state.evictingHosts();
    if (evicting.size === 0) return;
    const all = await this.state.allReplicas();
    const pass: EvictionPass = { evicting, schedulable: await this.state.schedulableHosts(evicting), load: replicaLoad(all) };
    const byVolume = new Map<string, ReplicaRecord>();
    for (const r of all) if (evicting.has(r.hostId) && !byVolume.has(r.volume)) byVolume.set(r.volume, r);
    for (const [volume, old] of byVolume) {
      if (this.state.closed) return;
      await this.#move(pass, volume, old).catch((err: unknown) => this.state.events.cluster('warning', toMooringError(err, `evicting replica ${old.id} of ${volume} from ${old.hostId}`)));
    }
    for (const hostId of evicting) {
      const p = await this.progress(hostId);
      if (p.replicasLeft > 0 || p.imageFilesLeft > 0) {
        this.#reported.delete(hostId);
        this.state.events.cluster('host-eviction', p);
      } else if (!this.#reported.has(hostId)) {
        this.#reported.add(hostId);
        this.state.events.cluster('host-evicted', { hostId });
      }
    }
  }

  async #move(pass: EvictionPass, volume: string, old: ReplicaRecord): Promise<void> {
    if (await this.state.migrationRecord(volume)) return; // its writer moves: after the migration
    const before = await this.state.replicas(volume);
    const target = this.#target(pass, before);
    try {
      await this.#moveTo(pass, volume, old, target);
    } finally {
      // What the move added (or failed to clean up) counts when the next volume picks its target.
      if (target !== null) this.#recount(pass.load, before, await this.state.replicas(volume));
    }
  }

  async #moveTo(pass: EvictionPass, volume: string, old: ReplicaRecord, target: string | null): Promise<void> {
    const attached = await this.state.serial(volume, async () => {
      const eng = await this.state.engineRecord(volume);
      if (!eng) return false;
      if ((await this.state.hosts.probeEngine(eng.hostId, volume)) !== 'running') return true; // the reconcile brings it back first
      await this.#moveThrough(pass, eng, volume, old.id, target);
      return true;
    });
    if (attached || target === null) return;
    // Detached: attached without frontend, where a replica that stays lives if one can be reached.
    const host = await this.#ticketHost(pass, volume, old.hostId);
    await this.attachment.withTicket(volume, 'volume-eviction', host, () =>
      this.state.serial(volume, async () => {
        const eng = await this.state.engineRecord(volume);
        if (!eng) throw new MooringError('UNAVAILABLE', `volume ${volume} detached while its eviction ticket was held`, { details: { volume } });
        await this.#moveThrough(pass, eng, volume, old.id, target);
      }),
    );
  }

  // In the volume's turn, through its running engine: a new replica on `target`, then the
  // old one retired; or only the retirement when enough replicas already live elsewhere (a
  // pass that added the new one and could not retire the old).
  async #moveThrough(pass: EvictionPass, eng: EngineRecord, volume: string, oldId: string, target: string | null): Promise<void> {
    const vol = await this.state.volume(volume);
    const replicas = await this.state.replicas(volume);
    const old = replicas.find((r) => r.id === oldId);
    if (!old) return;
    // RW as the engine sees it now, not as last recorded.
    const info = await this.state.hosts.probe(eng.hostId, volume);
    if (typeof info === 'string') return;
    const rw = new Set(info.replicas.filter((r) => r.mode === 'RW').map((r) => r.id));
    const elsewhere = replicas.filter((r) => !pass.evicting.has(r.hostId) && rw.has(r.id)).length;
    if (elsewhere >= vol.replicaCount) await this.repair.retire(eng, vol, old, true);
    else if (target !== null) await this.repair.replace(eng, vol, old, target, true);
  }

  // The schedulable host with the fewest replicas holding none of the volume's, or null while there is none.
  #target(pass: EvictionPass, replicas: ReplicaRecord[]): string | null {
    const used = new Set(replicas.map((r) => r.hostId));
    const free = pass.schedulable.filter((h) => !used.has(h));
    return free.length === 0 ? null : leastLoaded(free, pass.load, 1)[0]!;
  }

  #recount(load: Map<string, number>, before: ReplicaRecord[], after: ReplicaRecord[]): void {
    for (const r of before) load.set(r.hostId, (load.get(r.hostId) ?? 0) - 1);
    for (const r of after) load.set(r.hostId, (load.get(r.hostId) ?? 0) + 1);
  }

  async #ticketHost(pass: EvictionPass, volume: string, evictingHost: string): Promise<string> {
    for (const r of await this.state.replicas(volume)) {
      if (r.hostId !== evictingHost && !pass.evicting.has(r.hostId) && this.state.hosts.has(r.hostId) && (await this.state.hosts.reachable(r.hostId))) return r.hostId;
    }
    return this.attachment.operationHost(volume, undefined);
  }
}
