import { MooringError } from '../errors.js';
import { checkCompareAndSet, checkExpectedVersion, checkGuard, checkGuardVersion, checkKey, checkKind, serialiseValue } from './state-keys.js';
import type { StateChange, StateGuard, StateListOptions, StateStore, StateWatch, StateWriteOptions, StoredObject } from './state-store.js';
import { StateWatchers } from './state-watchers.js';
import { SortedKeys } from './sorted-keys.js';

interface MemoryKind {
  docs: Map<string, { version: number; text: string }>;
  keys: SortedKeys;
}

/**
 * A {@link StateStore} in memory, for tests and embedders that keep state elsewhere. Same
 * validation and compare-and-set rules as {@link FileStateStore}; values are stored as JSON
 * text, so callers never share objects with the store.
 */
export class MemoryStateStore implements StateStore {
  readonly #kinds = new Map<string, MemoryKind>();
  readonly #watchers = new StateWatchers();
  #closed = false;

  /** @inheritDoc StateStore.get */
  async get<T>(kind: string, key: string): Promise<StoredObject<T> | null> {
    const d = this.#kind(kind).docs.get(checkKey(key));
    return d ? { kind, key, version: d.version, value: JSON.parse(d.text) as T } : null;
  }

  /** @inheritDoc StateStore.list */
  async list<T>(kind: string, options: StateListOptions = {}): Promise<Array<StoredObject<T>>> {
    const { docs, keys: all } = this.#kind(kind);
    const prefix = typeof options?.prefix === 'string' ? options.prefix : '';
    const keys = all.withPrefix(prefix);
    return keys.map((key) => ({ kind, key, version: docs.get(key)!.version, value: JSON.parse(docs.get(key)!.text) as T }));
  }

  /** @inheritDoc StateStore.put */
  async put<T>(kind: string, key: string, value: T, options?: StateWriteOptions): Promise<StoredObject<T>> {
    const { docs, keys } = this.#kind(kind);
    checkKey(key);
    const expected = checkExpectedVersion(options);
    const guard = checkGuard(options);
    const text = serialiseValue(kind, key, value);
    const version = (docs.get(key)?.version ?? 0) + 1;
    checkCompareAndSet(kind, key, expected, version - 1);
    this.#checkGuard(guard);
    docs.set(key, { version, text });
    keys.add(key);
    this.#watchers.put(kind, key, version, text);
    return { kind, key, version, value: JSON.parse(text) as T };
  }

  /** @inheritDoc StateStore.delete */
  async delete(kind: string, key: string, options?: StateWriteOptions): Promise<void> {
    const { docs, keys } = this.#kind(kind);
    checkCompareAndSet(kind, checkKey(key), checkExpectedVersion(options), docs.get(key)?.version ?? 0);
    this.#checkGuard(checkGuard(options));
    if (!docs.delete(key)) return;
    keys.delete(key);
    this.#watchers.delete(kind, key);
  }

  /** @inheritDoc StateStore.watch */
  async watch<T>(kind: string, listener: (change: StateChange<T>) => void, options?: StateListOptions): Promise<StateWatch> {
    if (this.#closed) throw new MooringError('CLOSED', 'state store is closed');
    return this.#watchers.add(kind, listener, options);
  }

  /** Later calls reject with CLOSED. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#watchers.clear();
  }

  // Synchronous with the write that follows it: nothing can change the guard in between.
  #checkGuard(guard: StateGuard | undefined): void {
    if (guard) checkGuardVersion(guard, this.#kind(guard.kind).docs.get(guard.key)?.version ?? 0);
  }

  #kind(kind: string): MemoryKind {
    if (this.#closed) throw new MooringError('CLOSED', 'state store is closed');
    checkKind(kind);
    let k = this.#kinds.get(kind);
    if (!k) this.#kinds.set(kind, (k = { docs: new Map(), keys: new SortedKeys() }));
    return k;
  }
}
