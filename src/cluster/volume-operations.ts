/**
 * Operations on a volume's data that need its engine running: snapshots (take, list,
 * delete, export) and rebuild. Each runs under a ticket of its own: on the attached host, or,
 * for a detached volume, on a host where the volume attaches itself without frontend for
 * the operation and detaches after it.
 *
 * @packageDocumentation
 */
import type { EngineSnapshotInfo, SnapshotCopyResult } from '../data-engine/data-engine.js';
import { MooringError } from '../errors.js';
import { sleep } from '../util/async.js';
import { checkIntIn, checkName } from '../util/validate.js';
import { MS_SETTING_MAX, type AttachmentController } from './attachment-controller.js';
import type { VolumeStatus } from '../volume/volume.js';
import type { ControlState } from './control-state.js';
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
  ) {}

  async createSnapshot(name: string, snapshot: string, labels: Record<string, string> | undefined): Promise<EngineSnapshotInfo> {
    this.state.checkOpen();
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
    this.state.checkOpen();
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
    this.state.checkOpen();
    checkName('snapshot name', snapshot);
    const eng = await this.state.engineRecord(name);
    if (eng && !eng.frontendDisabled) {
      throw new MooringError('INVALID_STATE', `volume ${name} is attached on ${eng.hostId} with a frontend: detach it before reverting to ${snapshot}`, { details: { volume: name, host: eng.hostId } });
    }
    const host = await this.attachment.operationHost(name, undefined);
    await this.attachment.withTicket(name, 'snapshot', host, (w) => this.state.hosts.engineOf(w).revertSnapshot(name, snapshot));
  }

  async exportSnapshot(name: string, snapshot: string, options: { path: string; host?: string }): Promise<SnapshotCopyResult & { hostId: string }> {
    this.state.checkOpen();
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
    this.state.checkOpen();
    const timeoutMs = checkIntIn('timeoutMs', options?.timeoutMs, 0, MS_SETTING_MAX, this.state.settings.ticketWaitMs);
    const host = await this.attachment.operationHost(name, options?.host);
    return this.attachment.withTicket(name, 'volume-rebuild', host, async () => {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const st = await volumeStatus(this.state, name);
        if (st.state === 'healthy') return st;
        if (Date.now() >= deadline) throw new MooringError('UNAVAILABLE', `volume ${name} is still ${st.state} after ${timeoutMs} ms of rebuilding`, { details: { state: st.state } });
        await sleep(REBUILD_POLL_MS);
        await this.state.serial(name, async () => {
          const eng = await this.state.engineRecord(name);
          if (eng) await this.repair.repair(eng);
        });
      }
    });
  }
}
