// Validation shared by the StateStore implementations, so the file store, the memory store
// and any embedder's store built on these helpers agree on what a kind, a key, a version
// and a document are.
import { MooringError } from '../errors.js';
import { checkName, describe } from '../util/validate.js';
import type { StateGuard, StateWriteOptions } from './state-store.js';

/** Kinds: lower-case words joined by '-', e.g. `volume`, `engine-status`. */
export const STATE_KIND_PATTERN = /^[a-z][a-z0-9-]{0,62}$/;
/** Largest serialised document (JSON text of the value), in bytes. */
export const STATE_DOCUMENT_BYTES_MAX = 1024 * 1024;

/** Checks a kind ({@link STATE_KIND_PATTERN}). */
export function checkKind(kind: unknown): string {
  if (typeof kind !== 'string' || !STATE_KIND_PATTERN.test(kind)) {
    throw new MooringError('INVALID_ARGUMENT', `state kind must match [a-z][a-z0-9-]{0,62} (got ${describe(kind)})`, { details: { kind } });
  }
  return kind;
}

/** Checks a key: a name ([A-Za-z0-9._-]{1,63}, not `.` or `..`), so it is safe as a file name. */
export function checkKey(key: unknown): string {
  return checkName('state key', key);
}

/** Whether `key` is a valid key ({@link checkKey}), for skipping names that are not documents. */
export function isKey(key: string): boolean {
  try {
    checkKey(key);
    return true;
  } catch {
    return false;
  }
}

/** The expected version of a compare-and-set, or undefined for an unconditional write. */
export function checkExpectedVersion(options: StateWriteOptions | undefined): number | undefined {
  if (options === undefined) return undefined;
  if (typeof options !== 'object' || options === null) {
    throw new MooringError('INVALID_ARGUMENT', `state write options must be an object (got ${describe(options)})`);
  }
  const v = options.expectedVersion;
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
    throw new MooringError('INVALID_ARGUMENT', `expectedVersion must be a non-negative integer (got ${describe(v)})`);
  }
  return v;
}

/** Serialises a value as JSON, refusing what JSON cannot hold and documents over {@link STATE_DOCUMENT_BYTES_MAX}. */
export function serialiseValue(kind: string, key: string, value: unknown): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    throw new MooringError('INVALID_ARGUMENT', `${kind}/${key}: value is not JSON-serialisable (${(err as Error).message})`, { cause: err });
  }
  if (text === undefined) throw new MooringError('INVALID_ARGUMENT', `${kind}/${key}: value is not JSON-serialisable (got ${describe(value)})`);
  if (Buffer.byteLength(text) > STATE_DOCUMENT_BYTES_MAX) {
    throw new MooringError('INVALID_ARGUMENT', `${kind}/${key}: document is larger than ${STATE_DOCUMENT_BYTES_MAX} bytes`);
  }
  return text;
}

/** Refuses a compare-and-set whose expected version is not the stored one (0 = absent). */
export function checkCompareAndSet(kind: string, key: string, expected: number | undefined, stored: number): void {
  if (expected === undefined || expected === stored) return;
  throw new MooringError(
    'CONFLICT',
    stored === 0
      ? `${kind}/${key} does not exist (expected version ${expected})`
      : `${kind}/${key} is at version ${stored}, not ${expected}${expected === 0 ? ' (expected it not to exist)' : ''}`,
    { details: { kind, key, expectedVersion: expected, version: stored } },
  );
}

/** The guard of a write ({@link StateWriteOptions.guard}), checked, or undefined. */
export function checkGuard(options: StateWriteOptions | undefined): StateGuard | undefined {
  const g = options?.guard;
  if (g === undefined) return undefined;
  if (typeof g !== 'object' || g === null) throw new MooringError('INVALID_ARGUMENT', `guard must be an object (got ${describe(g)})`);
  if (typeof g.version !== 'number' || !Number.isSafeInteger(g.version) || g.version < 0) {
    throw new MooringError('INVALID_ARGUMENT', `guard.version must be a non-negative integer (got ${describe(g.version)})`);
  }
  return { kind: checkKind(g.kind), key: checkKey(g.key), version: g.version };
}

/** Refuses a write whose guard document is not at the guard's version (0 = absent). */
export function checkGuardVersion(guard: StateGuard | undefined, stored: number): void {
  if (guard === undefined || guard.version === stored) return;
  throw new MooringError('CONFLICT', `guard ${guard.kind}/${guard.key} is at version ${stored}, not ${guard.version}`, {
    details: { guard: true, kind: guard.kind, key: guard.key, expectedVersion: guard.version, version: stored },
  });
}
