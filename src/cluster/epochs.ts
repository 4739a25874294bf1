/**
 * Writer epochs of a cluster's volumes: allocated, never chosen (docs/single-writer.md).
 * Every engine the cluster starts or activates is handed an epoch that no other engine of
 * the volume ever held, so the replicas' promises (a replica refuses everything below the
 * highest epoch it promised) leave one writer.
 *
 * A volume's counter is one store document ({@link VolumeEpochRecord}), raised by
 * compare-and-set and written before the epoch is returned: two allocators sharing a store
 * (two control planes, or two calls racing in one) never get the same epoch, and neither
 * does a control plane that restarts, since the counter it finds is at least every epoch
 * it handed out.
 *
 * @packageDocumentation
 */
import { MooringError } from '../errors.js';
import type { StateStore } from '../state/state-store.js';
import { sleep } from '../util/async.js';
import { checkName, describe } from '../util/validate.js';
import { CLUSTER_SCHEMA_VERSION, KIND, parseVolumeEpochRecord, type VolumeEpochRecord } from './cluster-records.js';

/** Compare-and-set attempts of one allocation before it gives up with CONFLICT (each lost race is another allocator's success). */
export const EPOCH_ALLOCATION_ATTEMPTS_MAX = 64;
/** Largest pause between two attempts, in ms (a random part of it, so racing allocators spread out). */
const EPOCH_ALLOCATION_BACKOFF_MS_MAX = 20;

/** Allocates volumes' writer epochs from their counters in a store; see the module comment. */
export class EpochAllocator {
  readonly #store: StateStore;

  constructor(store: StateStore) {
    this.#store = store;
  }

  /** The last epoch allocated for `volume`, or null when it has no counter yet (a volume of a release before allocated epochs, or none allocated). */
  async last(volume: string): Promise<number | null> {
    const d = await this.#store.get<unknown>(KIND.volumeEpoch, checkName('volume name', volume));
    return d ? parseVolumeEpochRecord(d.value, d.key).last : null;
  }

  /**
   * Allocates the next epoch of `volume`: max(last, atLeast) + 1, recorded in the store
   * before it is returned. `atLeast` lifts the counter above epochs it never saw (replicas
   * written by an older release, which promised epochs their engines chose).
   *
   * @throws MooringError INVALID_ARGUMENT, OUT_OF_RANGE (the counter is at 2^53 - 1),
   *   CONFLICT (lost {@link EPOCH_ALLOCATION_ATTEMPTS_MAX} races in a row), CORRUPT_METADATA
   *   (the counter's document is damaged: it is never reset, which could hand out an epoch twice)
   */
  async allocate(volume: string, atLeast = 0): Promise<number> {
    checkName('volume name', volume);
    if (typeof atLeast !== 'number' || !Number.isSafeInteger(atLeast) || atLeast < 0) {
      throw new MooringError('INVALID_ARGUMENT', `atLeast must be a non-negative integer (got ${describe(atLeast)})`);
    }
    for (let attempt = 1; ; attempt++) {
      const d = await this.#store.get<unknown>(KIND.volumeEpoch, volume);
      const last = d ? parseVolumeEpochRecord(d.value, d.key).last : 0;
      const base = Math.max(last, atLeast);
      if (base >= Number.MAX_SAFE_INTEGER) throw new MooringError('OUT_OF_RANGE', `volume ${volume}: no writer epoch is left above ${base}`);
      const epoch = base + 1;
      const rec: VolumeEpochRecord = { schema: CLUSTER_SCHEMA_VERSION, volume, last: epoch, updatedMs: Date.now() };
      try {
        await this.#store.put(KIND.volumeEpoch, volume, rec, { expectedVersion: d?.version ?? 0 });
        return epoch;
      } catch (err) {
        if (!(err instanceof MooringError && err.code === 'CONFLICT')) throw err;
        if (attempt >= EPOCH_ALLOCATION_ATTEMPTS_MAX) {
          throw new MooringError('CONFLICT', `volume ${volume}: the epoch counter changed under ${attempt} allocations in a row`, { cause: err, details: { volume } });
        }
      }
      // Another allocator won this round: read its counter again.
      await sleep(Math.floor(Math.random() * Math.min(attempt, EPOCH_ALLOCATION_BACKOFF_MS_MAX)));
    }
  }
}
