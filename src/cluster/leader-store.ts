/**
 * The state store as the control plane of one of several embedders sees it
 * (`MooringOptions.leadership`, docs/leadership.md): reads go through; every write carries
 * the leader's fencing token as a guard, and is refused NOT_LEADER without being sent when
 * this embedder does not lead, or by the store once another took over.
 *
 * @packageDocumentation
 */
import { MooringError, toMooringError } from '../errors.js';
import type { StateChange, StateListOptions, StateStore, StateWatch, StateWriteOptions, StoredObject } from '../state/state-store.js';
import type { LeaderLease } from './leader-lease.js';

/** NOT_LEADER for `lease`'s embedder, naming the leader it knows. */
export function notLeader(lease: LeaderLease, cause?: unknown): MooringError {
  const { holder, term } = lease.status;
  const leader = holder && holder !== lease.id ? holder : null;
  return new MooringError('NOT_LEADER', `${lease.id} does not lead the cluster${leader ? `: ${leader} does (term ${term})` : ' (no leader known now)'}`, {
    details: { leader, term },
    ...(cause === undefined ? {} : { cause }),
  });
}

/** See the module comment. */
export class LeaderGuardedStore implements StateStore {
  constructor(
    private readonly store: StateStore,
    private readonly lease: LeaderLease,
  ) {}

  get<T>(kind: string, key: string): Promise<StoredObject<T> | null> {
    return this.store.get<T>(kind, key);
  }

  list<T>(kind: string, options?: StateListOptions): Promise<Array<StoredObject<T>>> {
    return this.store.list<T>(kind, options);
  }

  watch<T>(kind: string, listener: (change: StateChange<T>) => void, options?: StateListOptions): Promise<StateWatch> {
    if (!this.store.watch) return Promise.reject(new MooringError('UNSUPPORTED', 'the state store has no watches'));
    return this.store.watch<T>(kind, listener, options);
  }

  put<T>(kind: string, key: string, value: T, options?: StateWriteOptions): Promise<StoredObject<T>> {
    return this.#guarded(options, (o) => this.store.put<T>(kind, key, value, o));
  }

  delete(kind: string, key: string, options?: StateWriteOptions): Promise<void> {
    return this.#guarded(options, (o) => this.store.delete(kind, key, o));
  }

  /** The store is the embedder's: closing the control plane does not close it. */
  async close(): Promise<void> {}

  async #guarded<R>(options: StateWriteOptions | undefined, write: (o: StateWriteOptions) => Promise<R>): Promise<R> {
    const guard = this.lease.guard;
    if (!guard) throw notLeader(this.lease);
    try {
      return await write({ ...options, guard });
    } catch (err) {
      const e = toMooringError(err);
      if (e.code === 'CONFLICT' && (e.details as { guard?: boolean } | undefined)?.guard === true) throw notLeader(this.lease, e);
      throw e;
    }
  }
}
