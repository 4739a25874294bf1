/**
 * Growing a replica that no engine uses (a detached volume's; docs/data-engine.md,
 * "Resize"). It is opened on its own, which takes its directory lock, so a replica that an
 * engine or the replica server still holds is refused rather than changed behind that
 * engine's back. Also the wait for such a hold to end ({@link whenReleased}), which
 * deleteReplica uses too.
 *
 * @packageDocumentation
 */
import { MooringError, callNative, toMooringError } from '../errors.js';
import type { NativeAddon } from '../native/binding.js';
import { sleep } from '../util/async.js';

/**
 * How long a grow or a delete waits for a replica to be let go. An engine elsewhere that
 * just stopped closes its connection to this host's replica server, which releases the
 * replica a moment later: a resize or a delete right after a detach (or after a migration
 * moved the engine away) must not fail for that.
 */
export const REPLICA_RELEASE_WAIT_MS = 2000;
const RELEASE_RETRY_MS = 100;

/** Runs `run` again while it fails BUSY, for up to {@link REPLICA_RELEASE_WAIT_MS}. */
export async function whenReleased<T>(run: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + REPLICA_RELEASE_WAIT_MS;
  for (;;) {
    try {
      return await run();
    } catch (err) {
      const e = toMooringError(err);
      if (e.code !== 'BUSY' || Date.now() >= deadline) throw e;
      await sleep(RELEASE_RETRY_MS);
    }
  }
}

/**
 * Grows the replica at `path` to `sizeBytes`.
 *
 * @throws MooringError INVALID_ARGUMENT (smaller: a replica only grows), BUSY (still open
 *   elsewhere after {@link REPLICA_RELEASE_WAIT_MS}), NOT_FOUND, CORRUPT_METADATA, IO_ERROR
 */
export async function growReplicaDir(addon: NativeAddon, path: string, name: string, sizeBytes: number): Promise<void> {
  await whenReleased(async () => {
    const replica = await callNative(() => addon.openReplica(path), `opening replica ${name}`);
    try {
      if (sizeBytes < replica.sizeBytes) {
        throw new MooringError('INVALID_ARGUMENT', `replica ${name} has ${replica.sizeBytes} bytes: it can grow, not shrink to ${sizeBytes}`, {
          details: { name, sizeBytes, currentSizeBytes: replica.sizeBytes },
        });
      }
      await callNative(() => replica.grow(sizeBytes), `growing replica ${name}`);
    } finally {
      await replica.close().catch(() => undefined);
    }
  });
}
