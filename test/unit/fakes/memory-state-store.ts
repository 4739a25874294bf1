// A StateStore in memory for unit tests: compare-and-set by version, values deep-copied so
// callers cannot change stored documents behind the store's back.
import { MooringError } from '../../../src/errors.js';
import type { StateStore, StateWriteOptions, StoredObject } from '../../../src/state/state-store.js';

export class MemoryStateStore implements StateStore {
  readonly #docs = new Map<string, StoredObject<unknown>>();

  async get<T>(kind: string, key: string): Promise<StoredObject<T> | null> {
    const d = this.#docs.get(`${kind}/${key}`);
    return d ? (structuredClone(d) as StoredObject<T>) : null;
  }

  async list<T>(kind: string): Promise<Array<StoredObject<T>>> {
    return [...this.#docs.values()].filter((d) => d.kind === kind).sort((a, b) => (a.key < b.key ? -1 : 1)).map((d) => structuredClone(d) as StoredObject<T>);
  }

  async put<T>(kind: string, key: string, value: T, options: StateWriteOptions = {}): Promise<StoredObject<T>> {
    const old = this.#docs.get(`${kind}/${key}`);
    this.#cas(kind, key, old, options);
    const doc = { kind, key, version: (old?.version ?? 0) + 1, value: structuredClone(value) };
    this.#docs.set(`${kind}/${key}`, doc);
    return structuredClone(doc) as StoredObject<T>;
  }

  async delete(kind: string, key: string, options: StateWriteOptions = {}): Promise<void> {
    this.#cas(kind, key, this.#docs.get(`${kind}/${key}`), options);
    this.#docs.delete(`${kind}/${key}`);
  }

  async close(): Promise<void> {}

  #cas(kind: string, key: string, old: StoredObject<unknown> | undefined, options: StateWriteOptions): void {
    if (options.expectedVersion !== undefined && (old?.version ?? 0) !== options.expectedVersion) {
      throw new MooringError('CONFLICT', `${kind}/${key} is at version ${old?.version ?? 0}, not ${options.expectedVersion}`);
    }
  }
}
