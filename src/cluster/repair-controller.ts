/**
 * The repair controller: for an attached volume, records the replica modes its engine
 * reports, re-adds a replica whose host came back under a new address, replaces a replica
 * that stayed ERR beyond the replacement wait with a new one on a host that holds none of
 * the volume's replicas, and stops engines of the volume left on other hosts by a takeover.
 * The data engines rebuild; this controller only decides.
 *
 * @packageDocumentation
 */
import type { BackingImageController } from '../backing-image/backing-image-controller.js';
import { MooringError, toMooringError } from '../errors.js';
import { KIND, type EngineRecord, type ReplicaRecord, type VolumeRecord } from './cluster-records.js';
import type { ControlState } from './control-state.js';
import type { EngineInfo } from '../data-engine/data-engine.js';

/**
 * How long a replacement waits in the repair pass for its backing image file on the new host.
 * The copy goes on after that; a later pass finds it ready (other volumes' repairs do not
 * wait behind a long copy).
 */
const REPLACEMENT_IMAGE_WAIT_MS = 5000;

/** See the module comment. */
export class RepairController {
  constructor(
    private readonly state: ControlState,
    private readonly images: Pick<BackingImageController, 'acquire'>,
  ) {}

  /**
   * One repair step for the volume attached per `eng` (at most one replacement). Caller
   * holds the volume's turn.
   */
  async repair(eng: EngineRecord): Promise<void> {
    if (this.state.closed) return;
    const vol = await this.state.volume(eng.volume);
    const de = this.state.hosts.get(eng.hostId);
    if (!de) return;
    // A full pass has each host's engines listed once: a volume whose listed engine shows
    // what its records say, nothing failed, needs nothing (most of them, most passes); any
    // other is asked of its host before anything is decided (the listing may be older).
    const listed = await this.state.hosts.listedEngine(eng.hostId, eng.volume);
    if (listed && this.#steady(listed, await this.state.replicas(eng.volume))) {
      await this.#stopStrayEngines(eng);
      return;
    }
    const info = await this.state.hosts.probe(eng.hostId, eng.volume);
    if (typeof info === 'string') return; // the engine is gone or its host away: nothing to decide from here
    await this.state.recordModes(eng.volume, info);
    await this.#stopStrayEngines(eng);
    const records = await this.state.replicas(eng.volume);
    const now = Date.now();
    const healthy = info.replicas.filter((r) => r.mode !== 'ERR').length;

    for (const r of records) {
      const seen = info.replicas.find((x) => x.id === r.id);
      // A record the engine does not hold counts when it is ERR: a replica a salvage left out.
      if (seen ? seen.mode !== 'ERR' : r.mode !== 'ERR') continue;
      // Its host is back under a new address (restarted data engine): re-add with the new one.
      const host = await this.state.hostRecord(r.hostId);
      if (seen && host && host.replicaAddress !== null && seen.address !== null && host.replicaAddress !== seen.address && (await this.state.hosts.reachable(r.hostId))) {
        await de.addReplica(eng.volume, { id: r.id, hostId: r.hostId, name: r.name, address: host.replicaAddress });
        return;
      }
      // Replace only while fewer than the wanted replicas are healthy, and only after the wait.
      if (healthy >= vol.replicaCount) continue;
      // A host being upgraded comes back with its replicas (seed 004: no replenishing meanwhile).
      if ((await this.state.unschedulableHosts()).has(r.hostId)) continue;
      if (r.failedSinceMs === null || now - r.failedSinceMs < this.state.settings.replacementWaitMs) continue;
      const used = new Set(records.map((x) => x.hostId));
      let target: string;
      try {
        [target] = (await this.state.pickHosts(1, used)) as [string];
      } catch {
        return; // no spare host offered yet
      }
      await this.replace(eng, vol, r, target);
      return; // one replacement per pass per volume
    }
  }

  // Every record seen by the engine in the mode recorded, none failed: recordModes would
  // write nothing and the loop of repair() would pass over every record.
  #steady(info: EngineInfo, records: ReplicaRecord[]): boolean {
    return records.every((r) => {
      const seen = info.replicas.find((x) => x.id === r.id);
      return seen !== undefined && seen.mode !== 'ERR' && seen.mode === r.mode && r.failedSinceMs === null;
    });
  }

  // An engine for the volume on another host is a leftover of a takeover (its host was
  // unreachable then): the newer epoch already fences it; stopping it releases its replicas
  // and its NBD socket.
  async #stopStrayEngines(eng: EngineRecord): Promise<void> {
    for (const hostId of this.state.hosts.ids) {
      if (hostId === eng.hostId || !(await this.state.hosts.mayRunEngine(hostId, eng.volume))) continue;
      const state = await this.state.hosts.probeEngine(hostId, eng.volume);
      if (state !== 'running') continue;
      await this.state.hosts.stopEngine(hostId, eng.volume).then(
        () => this.state.events.cluster('stray-engine-stopped', { volume: eng.volume, hostId }),
        (err: unknown) => this.state.events.cluster('warning', toMooringError(err, `stopping the stale engine of ${eng.volume} on ${hostId}`)),
      );
    }
  }

  /**
   * Replaces `old` by a new replica on `targetHost`: created (over the backing image's file
   * there), added to the engine of `eng` (rebuilt), then `old` retired ({@link retire}).
   * `moving`: `old` may be healthy (an eviction). Caller holds the volume's turn.
   */
  async replace(eng: EngineRecord, vol: VolumeRecord, old: ReplicaRecord, targetHost: string, moving = false): Promise<void> {
    const { hosts, store } = this.state;
    const engineHost = hosts.engineOf(eng.hostId);
    const ids = new Set((await this.state.replicas(vol.name)).map((r) => r.id));
    let n = 0;
    while (ids.has(`r${n}`)) n++;
    const rec = this.state.newReplicaRecord(vol.name, `r${n}`, targetHost);
    if (vol.backingImage) {
      // The new host gets the image's file first (delivered from a ready copy).
      const lease = await this.images.acquire(vol.backingImage, [targetHost], Math.min(REPLACEMENT_IMAGE_WAIT_MS, this.state.settings.ticketWaitMs));
      try {
        await hosts.engineOf(targetHost).createReplica(rec.name, vol.sizeBytes, { backingImage: lease.backingImage });
        await store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
      } finally {
        lease.release();
      }
    } else {
      await hosts.engineOf(targetHost).createReplica(rec.name, vol.sizeBytes);
      await store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
    }
    let result;
    try {
      result = await engineHost.addReplica(vol.name, await this.state.refOf(rec));
    } catch (err) {
      await engineHost.removeReplica(vol.name, rec.id).catch(() => undefined);
      await hosts.engineOf(targetHost).deleteReplica(rec.name).catch(() => undefined);
      await store.delete(KIND.replica, rec.name).catch(() => undefined);
      throw toMooringError(err, `replacing ${old.id} of ${vol.name} on ${targetHost}`);
    }
    await store.put(KIND.replica, rec.name, { ...rec, mode: 'RW' });
    await this.retire(eng, vol, old, moving);
    this.state.events.cluster('replica-replaced', { volume: vol.name, oldReplicaId: old.id, oldHostId: old.hostId, newReplicaId: rec.id, newHostId: targetHost, sentBytes: result.sentBytes });
  }

  /**
   * Takes `old` out of the engine of `eng`, deletes it on its host and drops its record.
   * `healthy`: it may be RW (another replica is): a refusal then throws and keeps the record
   * (the engine still writes it); otherwise a refusal is a warning. Caller holds the turn.
   */
  async retire(eng: EngineRecord, vol: VolumeRecord, old: ReplicaRecord, healthy: boolean): Promise<void> {
    const { hosts, store } = this.state;
    // NOT_FOUND: the engine does not hold it (a replica a salvage left out): already out.
    const removing = hosts.engineOf(eng.hostId).removeReplica(vol.name, old.id, { evenIfRw: healthy }).catch((err: unknown) => {
      if (toMooringError(err).code !== 'NOT_FOUND') throw err;
    });
    if (healthy) await removing.catch((err: unknown) => Promise.reject(toMooringError(err, `removing ${old.id} from ${vol.name}`)));
    else await removing.catch((err: unknown) => this.state.events.cluster('warning', toMooringError(err, `removing ${old.id} from ${vol.name}`)));
    const oldHost = hosts.get(old.hostId);
    let deleted = false;
    if (oldHost) deleted = await oldHost.deleteReplica(old.name).then(() => true, () => false);
    // A replica whose host is away keeps no record: when that host returns, its data engine
    // lists the directory, and an embedder may delete it (it belongs to no volume).
    await store.delete(KIND.replica, old.name);
    if (!deleted) this.state.events.cluster('warning', new MooringError('UNAVAILABLE', `replica ${old.name} of ${vol.name} on ${old.hostId} was replaced but could not be deleted; delete it when the host is back`));
  }
}
