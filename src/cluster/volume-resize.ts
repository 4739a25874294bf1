/**
 * Resize (grow) of a volume (docs/cluster.md, "Resize"). The volume record's `sizeBytes`
 * is the size the cluster wants, like a Kubernetes spec: a resize writes it first, then
 * grows the data through the running engine (every RW replica, then the engine and its
 * NBD export); a detached volume is attached for it under a `volume-expansion` ticket
 * (seed 002's expansion ticket) and detached again. A resize that fails
 * or is cut short part-way is not undone (a grow loses nothing); it is finished by calling
 * resize again, and at the latest when the volume's next engine starts
 * ({@link settleEngineSize}). Engines follow their own rule meanwhile: the largest size a
 * RW replica recorded wins, so replicas left at different sizes open consistently.
 *
 * @packageDocumentation
 */
import type { EngineInfo } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import { checkVolumeSize } from '../util/validate.js';
import type { VolumeResizedEvent } from '../volume/volume.js';
import type { AttachmentController } from './attachment-controller.js';
import type { ControlState } from './control-state.js';

/** See the module comment. */
export class VolumeResize {
  constructor(
    private readonly state: ControlState,
    private readonly attachment: AttachmentController,
  ) {}

  /**
   * Grows the volume to `sizeBytes`. The same size finishes a resize that was cut short (and
   * otherwise does nothing); `resized` is emitted when the recorded size changes. A detached
   * volume is attached for it, without frontend, under a `volume-expansion` ticket (the
   * seed's expansion ticket: its priority keeps other tickets from taking the volume
   * meanwhile), grown through that engine like an attached one, and detached again.
   *
   * @throws MooringError INVALID_ARGUMENT (smaller: volumes only grow; not a multiple of
   *   4096; above the limit), INVALID_STATE (migrating), NOT_FOUND, BUSY (a rebuild runs in
   *   the engine: ask again when it is done), UNAVAILABLE (a host cannot be reached; a
   *   detached volume that cannot attach), NO_QUORUM, UNSUPPORTED (a data engine predates
   *   resize), IO_ERROR
   */
  async resize(name: string, sizeBytes: number): Promise<VolumeResizedEvent> {
    this.state.checkLeader();
    checkVolumeSize(sizeBytes);
    // Refused before anything attaches for it.
    await this.#check(name, sizeBytes);
    const done = await this.#throughEngine(name, sizeBytes);
    if (done) return done;
    const host = await this.attachment.operationHost(name, undefined);
    return this.attachment.withTicket(name, 'volume-expansion', host, async () => {
      const grown = await this.#throughEngine(name, sizeBytes);
      if (!grown) throw new MooringError('UNAVAILABLE', `volume ${name} detached while its expansion ticket was held`, { details: { volume: name } });
      return grown;
    });
  }

  async #check(name: string, sizeBytes: number): Promise<void> {
    const vol = await this.state.volume(name);
    if (await this.state.migrationRecord(name)) {
      // The target's standby export was negotiated at the old size, and QEMU's destination
      // would see another size than its source: resize before or after a migration.
      throw new MooringError('INVALID_STATE', `volume ${name} is migrating: resize it once the migration is confirmed or rolled back`, { details: { volume: name } });
    }
    if (sizeBytes < vol.sizeBytes) {
      throw new MooringError('INVALID_ARGUMENT', `volume ${name} has ${vol.sizeBytes} bytes: volumes only grow (shrinking to ${sizeBytes} would cut off data the guest may have written)`, {
        details: { volume: name, sizeBytes, currentSizeBytes: vol.sizeBytes },
      });
    }
  }

  // Through the running engine (every RW replica, then the engine and its export), under the
  // volume's turn; null when no engine runs.
  async #throughEngine(name: string, sizeBytes: number): Promise<VolumeResizedEvent | null> {
    const state = this.state;
    return state.serial(name, async () => {
      await this.#check(name, sizeBytes);
      const eng = await state.engineRecord(name);
      if (!eng) return null;
      const vol = await state.volume(name);
      // The record first: new engines and replacement replicas get the new size, and a grow
      // cut short below is finished from it.
      if (sizeBytes > vol.sizeBytes) await state.putVolume({ ...vol, sizeBytes });
      const de = state.hosts.engineOf(eng.hostId);
      // What clients could address before: the engine's size (behind the record when an
      // earlier resize was cut short, which this call finishes), else the record's.
      const oldSizeBytes = Math.min(vol.sizeBytes, (await de.engineInfo(name)).sizeBytes);
      await de.resizeEngine(name, sizeBytes);
      const event: VolumeResizedEvent = { volume: name, oldSizeBytes, newSizeBytes: sizeBytes };
      if (sizeBytes > oldSizeBytes) state.events.volume(name, 'resized', event);
      return event;
    });
  }
}

/**
 * After an engine of the volume started: brings it to the recorded size (a resize that was
 * cut short), or, if its replicas recorded more than the volume record (grown behind the
 * cluster's back), records that size, since data is never cut off. A grow that fails here
 * leaves the volume attached at its old size with a warning: resize again to finish it.
 */
export async function settleEngineSize(state: ControlState, name: string, host: string, info: EngineInfo): Promise<void> {
  const vol = await state.volume(name);
  if (info.sizeBytes > vol.sizeBytes) {
    await state.putVolume({ ...vol, sizeBytes: info.sizeBytes });
    state.events.volume(name, 'resized', { volume: name, oldSizeBytes: vol.sizeBytes, newSizeBytes: info.sizeBytes });
  } else if (info.sizeBytes < vol.sizeBytes) {
    try {
      await state.hosts.engineOf(host).resizeEngine(name, vol.sizeBytes);
      state.events.volume(name, 'resized', { volume: name, oldSizeBytes: info.sizeBytes, newSizeBytes: vol.sizeBytes });
    } catch (err) {
      state.events.cluster('warning', toMooringError(err, `growing volume ${name} on ${host} from ${info.sizeBytes} to its recorded ${vol.sizeBytes} bytes (resize it again to finish)`));
    }
  }
}
