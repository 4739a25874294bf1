// The listeners of StateStore.watch and how a change reaches them, shared by every store:
// the in-process stores (file, memory) announce their own writes through StateWatchers,
// the etcd store forwards what etcd's watch stream tells it through deliverChange.
import { MooringError } from '../errors.js';
import { checkKind } from './state-keys.js';
import type { StateChange, StateListOptions, StateWatch } from './state-store.js';

/** Calls a watch listener; what it throws becomes a process warning, never a failed write. */
export function deliverChange<T>(listener: (change: StateChange<T>) => void, change: StateChange<T>): void {
  try {
    listener(change);
  } catch (err) {
    process.emitWarning(`a state store watch listener threw on ${change.type} ${change.kind}${'key' in change ? `/${change.key}` : ''}: ${(err as Error)?.message ?? String(err)}`, 'MooringStateWatch');
  }
}

/** Checks the arguments of StateStore.watch; returns the key prefix ('' for all). */
export function checkWatchArguments(kind: unknown, listener: unknown, options: StateListOptions | undefined): string {
  checkKind(kind);
  if (typeof listener !== 'function') throw new MooringError('INVALID_ARGUMENT', 'a state store watch needs a listener function');
  return typeof options?.prefix === 'string' ? options.prefix : '';
}

interface Entry {
  kind: string;
  prefix: string;
  listener: (change: StateChange<unknown>) => void;
}

/**
 * The watchers of an in-process store. A write calls {@link StateWatchers.put} or
 * {@link StateWatchers.delete} once it is done; each listener gets its own copy of the
 * value (parsed from the stored JSON text), on a microtask, in write order.
 */
export class StateWatchers {
  readonly #entries = new Set<Entry>();

  /** Adds a listener (arguments as StateStore.watch). */
  add<T>(kind: string, listener: (change: StateChange<T>) => void, options: StateListOptions | undefined): StateWatch {
    const prefix = checkWatchArguments(kind, listener, options);
    const entry: Entry = { kind, prefix, listener: listener as (change: StateChange<unknown>) => void };
    this.#entries.add(entry);
    return {
      close: async () => {
        this.#entries.delete(entry);
      },
    };
  }

  /** Announces a put whose stored JSON text is `text`. */
  put(kind: string, key: string, version: number, text: string): void {
    this.#emit(kind, key, () => ({ type: 'put', kind, key, version, value: JSON.parse(text) as unknown }));
  }

  /** Announces a delete. */
  delete(kind: string, key: string): void {
    this.#emit(kind, key, () => ({ type: 'delete', kind, key }));
  }

  /** Drops every listener (the store closed). */
  clear(): void {
    this.#entries.clear();
  }

  #emit(kind: string, key: string, make: () => StateChange<unknown>): void {
    for (const e of this.#entries) {
      if (e.kind !== kind || !key.startsWith(e.prefix)) continue;
      const change = make();
      // On a microtask (in write order), and never after the watch was closed.
      queueMicrotask(() => {
        if (this.#entries.has(e)) deliverChange(e.listener, change);
      });
    }
  }
}
