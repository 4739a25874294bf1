/**
 * Growing a replica that no engine uses (a detached volume's; docs/data-engine.md,
 * "Resize"). It is opened on its own, which takes its directory lock, so a replica that an
 * engine or the replica server still holds is refused rather than changed behind that
 * engine's back.
 *
 * @packageDocumentation
 */
import { MooringError, callNative, toMooringError } from '../errors.js';
import type { NativeAddon } from '../native/binding.js';
import { sleep } from '../util/async.js';

/**
 * How long a grow waits for a replica to be let go. An engine elsewhere that just stopped
 * closes its connection to this host's replica server, which releases the replica a moment
 * later: a resize right after a detach must not fail for that.
 */
export const GROW_BUSY_WAIT_MS = 2000;
const GROW_BUSY_RETRY_MS = 100;

/**
 * Grows the replica at `path` to `sizeBytes`.
 *
 * @throws MooringError INVALID_ARGUMENT (smaller: a replica only grows), BUSY (still open
 *   elsewhere after {@link GROW_BUSY_WAIT_MS}), NOT_FOUND, CORRUPT_METADATA, IO_ERROR
 */
export async function growReplicaDir(addon: NativeAddon, path: string, name: string, sizeBytes: number): Promise<void> {
  const deadline = Date.now() + GROW_BUSY_WAIT_MS;
  for (;;) {
    try {
      const replica = await callNative(() => addon.openReplica(path), `opening replica ${name}`);
      try {
        if (sizeBytes < replica.sizeBytes) {
          throw new MooringError('INVALID_ARGUMENT', `replica ${name} has ${replica.sizeBytes} bytes: it can grow, not shrink to ${sizeBytes}`, {
            details: { name, sizeBytes, currentSizeBytes: replica.sizeBytes },
          });
        }
        await callNative(() => replica.grow(sizeBytes), `growing replica ${name}`);
        return;
      } finally {
        await replica.close().catch(() => undefined);
      }
    } catch (err) {
      const e = toMooringError(err);
      if (e.code !== 'BUSY' || Date.now() >= deadline) throw e;
      await sleep(GROW_BUSY_RETRY_MS);
    }
  }
}
