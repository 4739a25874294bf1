/**
 * Resize (grow) of a volume (docs/cluster.md, "Resize"). The volume record's `sizeBytes`
 * is the size the cluster wants, like a Kubernetes spec: a resize writes it first, then
 * grows the data — through the running engine (every RW replica, then the engine and its
 * NBD export) or, detached, each replica through its own data engine. A resize that fails
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
import type { ControlState } from './control-state.js';

/** See the module comment. */
export class VolumeResize {
  constructor(private readonly state: ControlState) {}

  /**
   * Grows the volume to `sizeBytes`. The same size finishes a resize that was cut short (and
   * otherwise does nothing); `resized` is emitted when the recorded size changes.
   *
   * @throws MooringError INVALID_ARGUMENT (smaller: volumes only grow; not a multiple of
   *   4096; above the limit), INVALID_STATE (migrating), NOT_FOUND, BUSY (a rebuild runs in
   *   the engine: ask again when it is done), UNAVAILABLE (a host cannot be reached),
   *   UNSUPPORTED (a data engine predates resize), IO_ERROR
   */
  async resize(name: string, sizeBytes: number): Promise<VolumeResizedEvent> {
    const state = this.state;
    state.checkOpen();
    checkVolumeSize(sizeBytes);
    return state.serial(name, async () => {
      const vol = await state.volume(name);
      if (await state.migrationRecord(name)) {
        // The target's standby export was negotiated at the old size, and QEMU's destination
        // would see another size than its source: resize before or after a migration.
        throw new MooringError('INVALID_STATE', `volume ${name} is migrating: resize it once the migration is confirmed or rolled back`, { details: { volume: name } });
      }
      if (sizeBytes < vol.sizeBytes) {
        throw new MooringError('INVALID_ARGUMENT', `volume ${name} has ${vol.sizeBytes} bytes: volumes only grow (shrinking to ${sizeBytes} would cut off data the guest may have written)`, {
          details: { volume: name, sizeBytes, currentSizeBytes: vol.sizeBytes },
        });
      }
      // The record first: new engines and replacement replicas get the new size, and a grow
      // cut short below is finished from it.
      if (sizeBytes > vol.sizeBytes) await state.putVolume({ ...vol, sizeBytes });
      const eng = await state.engineRecord(name);
      // What clients could address before: the engine's size (behind the record when an
      // earlier resize was cut short, which this call finishes), else the record's.
      let oldSizeBytes = vol.sizeBytes;
      if (eng) {
        const de = state.hosts.engineOf(eng.hostId);
        oldSizeBytes = Math.min(oldSizeBytes, (await de.engineInfo(name)).sizeBytes);
        await de.resizeEngine(name, sizeBytes);
      } else {
        await this.#growDetached(name, sizeBytes);
      }
      const event: VolumeResizedEvent = { volume: name, oldSizeBytes, newSizeBytes: sizeBytes };
      if (sizeBytes > oldSizeBytes) state.events.volume(name, 'resized', event);
      return event;
    });
  }

  // Each replica through its own data engine. One on a host that cannot be reached keeps its
  // size until the volume's next engine grows it (the size rule) or a rebuild gives it the
  // new size; that is a warning, not a failure.
  async #growDetached(name: string, sizeBytes: number): Promise<void> {
    const state = this.state;
    const behind: string[] = [];
    for (const r of await state.replicas(name)) {
      const de = state.hosts.get(r.hostId);
      if (!de) {
        behind.push(`${r.id}@${r.hostId}`);
        continue;
      }
      try {
        await de.growReplica(r.name, sizeBytes);
      } catch (err) {
        const e = toMooringError(err, `growing replica ${r.id} (${r.name}) of ${name} on ${r.hostId}`);
        if (e.code !== 'UNAVAILABLE') throw e;
        behind.push(`${r.id}@${r.hostId}`);
      }
    }
    if (behind.length > 0) {
      state.events.cluster('warning', new MooringError('UNAVAILABLE', `volume ${name} grew to ${sizeBytes} bytes, but replica(s) ${behind.join(', ')} could not be reached: they grow when the volume is next attached, or are rebuilt at the new size`));
    }
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
