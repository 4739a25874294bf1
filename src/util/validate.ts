// Input validation shared by the classes; every failure is a MooringError with a code
// chosen by the caller (INVALID_ARGUMENT for API input, CORRUPT_METADATA for stored files).
import { MooringError, type MooringErrorCode } from '../errors.js';
import {
  BLOCK_SIZE_BYTES,
  IO_LENGTH_MAX_BYTES,
  LABEL_COUNT_MAX,
  LABEL_KEY_PATTERN,
  LABEL_VALUE_LENGTH_MAX,
  NAME_PATTERN,
  REPLICA_COUNT_MAX,
  REPLICA_COUNT_MIN,
  UUID_PATTERN,
  VOLUME_SIZE_MAX_BYTES,
} from './limits.js';

/** Human form of a value for error messages, bounded in length. */
export function describe(value: unknown): string {
  let s: string;
  try {
    s = typeof value === 'bigint' ? `${value}n` : (JSON.stringify(value) ?? String(value));
  } catch {
    s = Object.prototype.toString.call(value);
  }
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

/** A name of a volume, snapshot or replica: [A-Za-z0-9._-]{1,63}, not "." or "..". */
/**
 * An optional integer setting in [min, max]; `fallback` when undefined.
 *
 * @throws MooringError INVALID_ARGUMENT naming `what`
 */
export function checkIntIn(what: string, value: unknown, min: number, max: number, fallback: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new MooringError('INVALID_ARGUMENT', `${what} must be an integer in ${min}..${max} (got ${describe(value)})`);
  }
  return value;
}

export function checkName(what: string, value: unknown, code: MooringErrorCode = 'INVALID_ARGUMENT'): string {
  if (typeof value !== 'string' || !NAME_PATTERN.test(value) || value === '.' || value === '..') {
    throw new MooringError(code, `${what} must match [A-Za-z0-9._-]{1,63} and not be "." or ".." (got ${describe(value)})`, {
      details: { what, value },
    });
  }
  return value;
}

/** A volume size: a positive multiple of 4096 up to 2^53 - 4096. */
export function checkVolumeSize(value: unknown, code: MooringErrorCode = 'INVALID_ARGUMENT'): number {
  if (
    typeof value !== 'number' ||
    !Number.isSafeInteger(value) ||
    value <= 0 ||
    value % BLOCK_SIZE_BYTES !== 0 ||
    value > VOLUME_SIZE_MAX_BYTES
  ) {
    throw new MooringError(
      code,
      `sizeBytes must be a positive multiple of ${BLOCK_SIZE_BYTES} up to ${VOLUME_SIZE_MAX_BYTES} (got ${describe(value)})`,
      { details: { sizeBytes: value } },
    );
  }
  return value;
}

/** A replica count: an integer in 1..16. */
export function checkReplicaCount(value: unknown, code: MooringErrorCode = 'INVALID_ARGUMENT'): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < REPLICA_COUNT_MIN || value > REPLICA_COUNT_MAX) {
    throw new MooringError(code, `replica count must be an integer in ${REPLICA_COUNT_MIN}..${REPLICA_COUNT_MAX} (got ${describe(value)})`, {
      details: { replicas: value },
    });
  }
  return value;
}

/** Snapshot labels: at most 64, keys [A-Za-z0-9._/-]{1,128}, string values up to 512 characters. */
export function checkLabels(value: unknown, code: MooringErrorCode = 'INVALID_ARGUMENT'): Record<string, string> {
  if (value === undefined) return {};
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new MooringError(code, `labels must be an object of string values (got ${describe(value)})`);
  }
  const entries = Object.entries(value as Record<string, unknown>);
  if (entries.length > LABEL_COUNT_MAX) {
    throw new MooringError(code, `at most ${LABEL_COUNT_MAX} labels are allowed (got ${entries.length})`);
  }
  const out: Record<string, string> = {};
  for (const [k, v] of entries) {
    if (!LABEL_KEY_PATTERN.test(k)) {
      throw new MooringError(code, `label key must match [A-Za-z0-9._/-]{1,128} (got ${describe(k)})`);
    }
    // Control characters would garble listings and logs; reject them.
    // eslint-disable-next-line no-control-regex
    if (typeof v !== 'string' || v.length > LABEL_VALUE_LENGTH_MAX || /[\u0000-\u001f\u007f]/.test(v)) {
      throw new MooringError(code, `label ${k} must be a string of at most ${LABEL_VALUE_LENGTH_MAX} printable characters (got ${describe(v)})`);
    }
    out[k] = v;
  }
  return out;
}

/**
 * An I/O range against a volume of `sizeBytes`: offset and length non-negative safe
 * integers, length 1..`lengthMax` (IO_LENGTH_MAX_BYTES for calls that move data), the range
 * inside the volume (OUT_OF_RANGE otherwise).
 */
export function checkRange(offset: unknown, length: unknown, sizeBytes: number, lengthMax: number = IO_LENGTH_MAX_BYTES): void {
  if (typeof offset !== 'number' || !Number.isSafeInteger(offset) || offset < 0) {
    throw new MooringError('INVALID_ARGUMENT', `offset must be a non-negative integer (got ${describe(offset)})`);
  }
  if (
    typeof length !== 'number' ||
    !Number.isSafeInteger(length) ||
    length < 0 ||
    length === 0 ||
    length > lengthMax
  ) {
    throw new MooringError(
      'INVALID_ARGUMENT',
      `length must be an integer in 1..${lengthMax} (got ${describe(length)})`,
    );
  }
  if (offset + length > sizeBytes) {
    throw new MooringError('OUT_OF_RANGE', `range ${offset}+${length} ends past the volume's ${sizeBytes} bytes`, {
      details: { offset, length, sizeBytes },
    });
  }
}

/** A UUID as the library generates them: lowercase 8-4-4-4-12 hex. */
export function checkUuid(what: string, value: unknown, code: MooringErrorCode = 'INVALID_ARGUMENT'): string {
  if (typeof value !== 'string' || !UUID_PATTERN.test(value)) {
    throw new MooringError(code, `${what} must be a lowercase UUID (8-4-4-4-12 hex digits; got ${describe(value)})`, { details: { what, value } });
  }
  return value;
}

/**
 * A writer epoch handed to an engine: a positive safe integer. Epochs are allocated by the
 * caller (a Mooring in its store, a Volume in its volume.json), never chosen by an engine
 * (docs/single-writer.md).
 */
export function checkEpoch(what: string, value: unknown, code: MooringErrorCode = 'INVALID_ARGUMENT'): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) {
    throw new MooringError(code, `${what} must be a positive integer allocated for this engine (got ${describe(value)}); see docs/single-writer.md`, { details: { what, value } });
  }
  return value;
}
