/**
 * Reading one document of the state store field by field, each checked: a store may be
 * shared and its contents are treated as untrusted, so a malformed document is a
 * CORRUPT_METADATA error naming its kind, key and field, never a crash or a wrong value.
 *
 * @packageDocumentation
 */
import { MooringError } from '../errors.js';

/** Longest string a field may hold unless told otherwise. */
const STRING_LENGTH_MAX = 4096;

/** Whether a stored value is a plain object (not null, not an array). */
export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The checked fields of one document (or of an object nested in it). */
export class RecordFields {
  readonly #o: Record<string, unknown>;

  /** @throws MooringError CORRUPT_METADATA (not an object) */
  constructor(
    readonly kind: string,
    readonly key: string,
    value: unknown,
    readonly path = '',
  ) {
    if (!isObject(value)) this.fail(`${path || 'the document'} is not an object`);
    this.#o = value;
  }

  /** @throws MooringError CORRUPT_METADATA, always */
  fail(why: string): never {
    throw new MooringError('CORRUPT_METADATA', `state store: ${this.kind} ${this.key}: ${why}`, { details: { kind: this.kind, key: this.key } });
  }

  #name(k: string): string {
    return this.path ? `${this.path}.${k}` : k;
  }

  /** The field's raw value (for the caller's own check). */
  raw(k: string): unknown {
    return this.#o[k];
  }

  str(k: string, pattern?: RegExp, maxLength = STRING_LENGTH_MAX): string {
    const v = this.#o[k];
    if (typeof v !== 'string' || v.length > maxLength || (pattern && !pattern.test(v))) this.fail(`${this.#name(k)} is not a valid string`);
    return v;
  }

  optStr(k: string, pattern?: RegExp, maxLength = STRING_LENGTH_MAX): string | null {
    return this.#o[k] === null || this.#o[k] === undefined ? null : this.str(k, pattern, maxLength);
  }

  int(k: string, min: number, max: number): number {
    const v = this.#o[k];
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) this.fail(`${this.#name(k)} is not an integer in [${min}, ${max}]`);
    return v;
  }

  optInt(k: string, min: number, max: number): number | null {
    return this.#o[k] === null || this.#o[k] === undefined ? null : this.int(k, min, max);
  }

  bool(k: string): boolean {
    const v = this.#o[k];
    if (typeof v !== 'boolean') this.fail(`${this.#name(k)} is not a boolean`);
    return v;
  }

  oneOf<T extends string>(k: string, values: readonly T[]): T {
    const v = this.#o[k];
    if (typeof v !== 'string' || !(values as readonly string[]).includes(v)) this.fail(`${this.#name(k)} is not one of ${values.join(', ')}`);
    return v as T;
  }

  /** A nested object's fields. */
  obj(k: string): RecordFields {
    return new RecordFields(this.kind, this.key, this.#o[k], this.#name(k));
  }

  optObj(k: string): RecordFields | null {
    return this.#o[k] === null || this.#o[k] === undefined ? null : this.obj(k);
  }

  /** An array of at most `max` items. */
  list(k: string, max: number): unknown[] {
    const v = this.#o[k];
    if (!Array.isArray(v) || v.length > max) this.fail(`${this.#name(k)} is not a list of at most ${max}`);
    return v;
  }

  /** The keys of a nested map (an object) of at most `max` entries, each matching `pattern`. */
  mapKeys(k: string, max: number, pattern: RegExp): string[] {
    const v = this.#o[k];
    if (!isObject(v)) this.fail(`${this.#name(k)} is not an object`);
    const keys = Object.keys(v);
    if (keys.length > max || keys.some((x) => !pattern.test(x))) this.fail(`${this.#name(k)} has more than ${max} entries or a bad key`);
    return keys;
  }
}
