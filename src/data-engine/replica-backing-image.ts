// Validation of the backing image reference a replica is created over. The
// native store checks the same rules again (and opens the file); checking here gives the
// caller a clear INVALID_ARGUMENT before any directory is made.
import { MooringError } from '../errors.js';
import { describe } from '../util/validate.js';
import type { ReplicaBackingImage } from './data-engine.js';

/** Longest backing image directory name (`<image name>-<image uuid>`). */
export const BACKING_IMAGE_DIR_LENGTH_MAX = 127;
const BACKING_IMAGE_DIR_PATTERN = /^[A-Za-z0-9._-]{1,127}$/;
/** QEMU reports virtual sizes in whole sectors. */
const SECTOR_BYTES = 512;

/**
 * A {@link ReplicaBackingImage} for a replica of `replicaSizeBytes`: a plain directory
 * name, format raw or qcow2, and a virtual size that is a positive multiple of 512 at most
 * the replica's size. Returns a copy holding only those fields.
 *
 * @throws MooringError INVALID_ARGUMENT naming the field
 */
export function checkReplicaBackingImage(value: unknown, replicaSizeBytes: number): ReplicaBackingImage {
  if (typeof value !== 'object' || value === null) {
    throw new MooringError('INVALID_ARGUMENT', `backingImage must be an object (got ${describe(value)})`);
  }
  const v = value as Record<string, unknown>;
  const dir = v['dir'];
  if (typeof dir !== 'string' || !BACKING_IMAGE_DIR_PATTERN.test(dir) || dir === '.' || dir === '..') {
    throw new MooringError(
      'INVALID_ARGUMENT',
      `backingImage.dir must match [A-Za-z0-9._-]{1,${BACKING_IMAGE_DIR_LENGTH_MAX}} and not be "." or ".." (got ${describe(dir)})`,
      { details: { dir } },
    );
  }
  const format = v['format'];
  if (format !== 'raw' && format !== 'qcow2') {
    throw new MooringError('INVALID_ARGUMENT', `backingImage.format must be 'raw' or 'qcow2' (got ${describe(format)})`);
  }
  const virtualSizeBytes = v['virtualSizeBytes'];
  if (
    typeof virtualSizeBytes !== 'number' ||
    !Number.isSafeInteger(virtualSizeBytes) ||
    virtualSizeBytes <= 0 ||
    virtualSizeBytes % SECTOR_BYTES !== 0 ||
    virtualSizeBytes > replicaSizeBytes
  ) {
    throw new MooringError(
      'INVALID_ARGUMENT',
      `backingImage.virtualSizeBytes must be a positive multiple of ${SECTOR_BYTES} at most the replica's size ${replicaSizeBytes} (got ${describe(virtualSizeBytes)})`,
      { details: { virtualSizeBytes } },
    );
  }
  return { dir, format, virtualSizeBytes };
}
