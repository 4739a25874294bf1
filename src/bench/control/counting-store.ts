/**
 * A StateStore that passes every call to another and counts reads (get, list) and writes
 * (put, delete): the control-plane benchmark reports how many store calls each operation
 * makes, which is what a slower store multiplies.
 */
import type { StateChange, StateListOptions, StateStore, StateWatch, StateWriteOptions, StoredObject } from '../../state/state-store.js';

export class CountingStore implements StateStore {
  reads = 0;
  writes = 0;

  constructor(private readonly inner: StateStore) {}

  get<T>(kind: string, key: string): Promise<StoredObject<T> | null> {
    this.reads++;
    return this.inner.get<T>(kind, key);
  }

  list<T>(kind: string, options?: StateListOptions): Promise<Array<StoredObject<T>>> {
    this.reads++;
    return this.inner.list<T>(kind, options);
  }

  put<T>(kind: string, key: string, value: T, options?: StateWriteOptions): Promise<StoredObject<T>> {
    this.writes++;
    return this.inner.put<T>(kind, key, value, options);
  }

  delete(kind: string, key: string, options?: StateWriteOptions): Promise<void> {
    this.writes++;
    return this.inner.delete(kind, key, options);
  }

  // Every store the benchmark measures has watches.
  watch<T>(kind: string, listener: (change: StateChange<T>) => void, options?: StateListOptions): Promise<StateWatch> {
    return this.inner.watch!<T>(kind, listener, options);
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
