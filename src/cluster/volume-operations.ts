/**
 * Operations on a volume's data that need its engine running: snapshots (take, list,
 * delete, export) and rebuild. Each runs under a ticket of its own: on the attached host, or,
 * for a detached volume, on a host where the volume attaches itself without frontend for
 * the operation and detaches after it.
 *
 * @packageDocumentation
 */
import type { EngineSnapshotInfo, SnapshotCopyResult } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import { compareTickets } from '../attachment/attachment-ticket.js';
import { KIND } from './cluster-records.js';
import { delay } from '../util/async.js';
import { checkIntIn, checkName } from '../util/validate.js';
import { MS_SETTING_MAX, type AttachmentController } from './attachment-controller.js';
import type { VolumeStatus } from '../volume/volume.js';
import type { VolumeSalvagedEvent } from '../mooring-options.js';
import type { ControlState } from './control-state.js';
import type { EngineLifecycle } from './engine-lifecycle.js';
import type { RepairController } from './repair-controller.js';
import { volumeStatus } from './volume-status.js';

/** How often a rebuild looks at the volume again. */
const REBUILD_POLL_MS = 500;

/** See the module comment. */
export class VolumeOperations {
  constructor(
    private readonly state: ControlState,
    private readonly attachment: AttachmentController,
    private readonly repair: RepairController,
    private readonly engines: EngineLifecycle,
  ) {}

  async createSnapshot(name: string, snapshot: string, labels: Record<string, string> | undefined): Promise<EngineSnapshotInfo> {
    this.state.checkLeader();
    checkName('snapshot name', snapshot);
    const host = await this.attachment.operationHost(name, undefined);
    return this.attachment.withTicket(name, 'snapshot', host, (w) => this.state.hosts.engineOf(w).createSnapshot(name, snapshot, labels ? { labels } : {}));
  }

  async listSnapshots(name: string): Promise<EngineSnapshotInfo[]> {
    this.state.checkOpen();
    const host = await this.attachment.operationHost(name, undefined);
    return this.attachment.withTicket(name, 'snapshot', host, (w) => this.state.hosts.engineOf(w).listSnapshots(name));
  }

  async deleteSnapshot(name: string, snapshot: string): Promise<void> {
    this.state.checkLeader();
    checkName('snapshot name', snapshot);
    const host = await this.attachment.operationHost(name, undefined);
    await this.attachment.withTicket(name, 'snapshot', host, (w) => this.state.hosts.engineOf(w).deleteSnapshot(name, snapshot));
  }

  /**
   * Makes the volume's content that of a snapshot. Its engine must not be exported (clients
   * would see their disk change under them): an attached volume with a frontend is refused.
   *
   * @throws MooringError INVALID_STATE (attached with a frontend), NOT_FOUND
   */
  async revertSnapshot(name: string, snapshot: string): Promise<void> {
    this.state.checkLeader();
    checkName('snapshot name', snapshot);
    const eng = await this.state.engineRecord(name);
    if (eng && !eng.frontendDisabled) {
      throw new MooringError('INVALID_STATE', `volume ${name} is attached on ${eng.hostId} with a frontend: detach it before reverting to ${snapshot}`, { details: { volume: name, host: eng.hostId } });
    }
    const host = await this.attachment.operationHost(name, undefined);
    await this.attachment.withTicket(name, 'snapshot', host, (w) => this.state.hosts.engineOf(w).revertSnapshot(name, snapshot));
  }

  async exportSnapshot(name: string, snapshot: string, options: { path: string; host?: string }): Promise<SnapshotCopyResult & { hostId: string }> {
    this.state.checkLeader();
    checkName('snapshot name', snapshot);
    if (typeof options !== 'object' || options === null || typeof options.path !== 'string') throw new MooringError('INVALID_ARGUMENT', 'exportSnapshot needs { path }');
    const host = await this.attachment.operationHost(name, options.host);
    return this.attachment.withTicket(name, 'backup', host, async (w) => ({ ...(await this.state.hosts.engineOf(w).exportSnapshot(name, snapshot, options.path)), hostId: w }));
  }

  /**
   * Brings every replica back to RW, repairing until the volume is healthy or the timeout.
   *
   * @throws MooringError UNAVAILABLE (still not healthy), NOT_FOUND
   */
  async rebuild(name: string, options: { host?: string; timeoutMs?: number }): Promise<VolumeStatus> {
    this.state.checkLeader();
    const timeoutMs = checkIntIn('timeoutMs', options?.timeoutMs, 0, MS_SETTING_MAX, this.state.settings.ticketWaitMs);
    const host = await this.attachment.operationHost(name, options?.host);
    return this.attachment.withTicket(name, 'volume-rebuild', host, () => this.#repairUntilHealthy(name, timeoutMs));
  }

  /**
   * Brings a volume whose RW replicas are gone back from the replicas whose hosts answer
   * (docs/salvage.md): its engine, if one runs, is stopped (it cannot commit without the
   * gone replicas); a `salvage` ticket attaches it on `host` with a salvage start (the best
   * remaining replica serves, the others are rebuilt from it, the replicas of hosts that do
   * not answer are replaced), and the call waits until it is healthy or `timeoutMs` passed.
   * The volume stays attached for the tickets that want it.
   *
   * @throws MooringError INVALID_STATE (it migrates), NO_HEALTHY_REPLICA (no replica host answers), NO_QUORUM, NOT_FOUND, UNAVAILABLE (not healthy in time; the salvage itself is done), BUSY
   */
  async salvage(name: string, options: { host?: string; timeoutMs?: number }): Promise<VolumeSalvagedEvent & { status: VolumeStatus }> {
    this.state.checkLeader();
    const timeoutMs = checkIntIn('timeoutMs', options?.timeoutMs, 0, MS_SETTING_MAX, this.state.settings.ticketWaitMs);
    // Where asked, else where the tickets want it (the reconciler starts it there), else a
    // replica host that answers.
    const wanted = [...(await this.attachment.tickets(name))].sort(compareTickets)[0];
    let host: string;
    if (options?.host !== undefined) {
      host = checkName('host id', options.host);
      this.state.hosts.engineOf(host);
    } else {
      const found = wanted?.hostId ?? (await this.state.reachableReplicaHost(name));
      if (found === null) throw new MooringError('NO_HEALTHY_REPLICA', `volume ${name}: no host holding one of its replicas answers; nothing to salvage from`);
      host = found;
    }
    return this.attachment.withTicket(
      name,
      'salvage',
      host,
      async () => {
        const done = this.engines.salvaged.get(name);
        this.engines.salvaged.delete(name);
        if (!done) throw new MooringError('INVALID_STATE', `volume ${name} was attached by another ticket before the salvage could start`);
        let status: VolumeStatus;
        try {
          status = await this.#repairUntilHealthy(name, timeoutMs);
        } catch (err) {
          throw toMooringError(err, `volume ${name} was salvaged from ${done.sourceReplicas.join(', ')}, then`);
        }
        return { ...done, status };
      },
      true,
      async (o) => {
        if (o.mig) throw new MooringError('INVALID_STATE', `volume ${name} is migrating: confirm or roll back first`);
        // The engine goes (one whose host does not answer is fenced by the salvage's claims
        // on the replicas it reaches).
        if (o.eng && o.engState === 'running') await this.engines.stop(o);
        else if (o.eng) await this.state.store.delete(KIND.engine, name);
        this.engines.salvaged.delete(name);
      },
    );
  }

  // Repairs (rebuilds, replaces) until the volume is healthy or the time is up.
  async #repairUntilHealthy(name: string, timeoutMs: number): Promise<VolumeStatus> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const st = await volumeStatus(this.state, name);
      if (st.state === 'healthy') return st;
      if (Date.now() >= deadline) throw new MooringError('UNAVAILABLE', `volume ${name} is still ${st.state} after ${timeoutMs} ms of rebuilding`, { details: { state: st.state } });
      await delay(REBUILD_POLL_MS);
      await this.state.serial(name, async () => {
        const eng = await this.state.engineRecord(name);
        if (eng) await this.repair.repair(eng);
      });
    }
  }
}
