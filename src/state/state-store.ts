/**
 * StateStore: where Mooring keeps the specs and status of volumes, replicas and engines, so
 * that a restarted VM manager finds its volumes again (Longhorn keeps them as Kubernetes
 * objects; a library keeps them here).
 *
 * The interface is deliberately small: keyed JSON documents grouped by kind, with a
 * version per document for compare-and-set. An embedder can back it with Kubernetes
 * objects (kind = resource, key = name, version = resourceVersion) or etcd (key prefix,
 * mod revision). The default is {@link FileStateStore}: one file per document, written
 * atomically.
 *
 * @packageDocumentation
 */

/** A stored document. */
export interface StoredObject<T> {
  /** Kind of object ([a-z][a-z0-9-]{0,62}), e.g. `volume`. */
  kind: string;
  /** Key within the kind ([A-Za-z0-9._-]{1,63}, not `.`/`..`). */
  key: string;
  /** Increases by at least 1 on every put; starts at 1. */
  version: number;
  /** The document (JSON-serialisable). */
  value: T;
}

/** Options of {@link StateStore.put} and {@link StateStore.delete}. */
export interface StateWriteOptions {
  /**
   * Compare-and-set: the write happens only if the stored version equals this; `0` means
   * "must not exist yet". Otherwise CONFLICT. Omitted: unconditional.
   */
  expectedVersion?: number;
  /**
   * A second condition, on another document: the write happens only if that document is at
   * this version (0: absent), checked atomically with the write. Otherwise CONFLICT with
   * `details.guard` true. A leader's writes carry its leadership document's version, so a
   * deposed leader's writes fail (src/cluster/leader-lease.ts). A store that cannot check it
   * atomically must refuse it (UNSUPPORTED).
   */
  guard?: StateGuard;
}

/** See {@link StateWriteOptions.guard}. */
export interface StateGuard {
  /** Kind of the guard document. */
  kind: string;
  /** Its key. */
  key: string;
  /** The version it must be at (0: absent). */
  version: number;
}

/** Options of {@link StateStore.list}. */
export interface StateListOptions {
  /**
   * Only keys that start with this. A store may ignore it and return more: callers filter
   * what they get (the control plane does), so a store written before the option works.
   */
  prefix?: string;
}

/** A {@link StateChange}: the document was created or replaced. */
export interface StatePutChange<T> {
  /** `put`. */
  type: 'put';
  /** Kind of the document. */
  kind: string;
  /** Key of the document. */
  key: string;
  /** Its new version. */
  version: number;
  /** Its new value (a copy of the listener's own). */
  value: T;
}

/** A {@link StateChange}: the document is gone. */
export interface StateDeleteChange {
  /** `delete`. */
  type: 'delete';
  /** Kind of the document. */
  kind: string;
  /** Key of the document. */
  key: string;
}

/**
 * A {@link StateChange}: changes may have been missed (the store reconnected, or it could
 * not read a change); the listener should list the kind again and treat that as the truth.
 */
export interface StateResyncChange {
  /** `resync`. */
  type: 'resync';
  /** The kind watched. */
  kind: string;
}

/** One change a {@link StateStore.watch} listener hears of. */
export type StateChange<T> = StatePutChange<T> | StateDeleteChange | StateResyncChange;

/** What {@link StateStore.watch} returns: stops the listener. */
export interface StateWatch {
  /** Stops delivering changes (none arrives after it resolves). Idempotent. */
  close(): Promise<void>;
}

/** Where specs and status live. Every method may reject with a MooringError. */
export interface StateStore {
  /** The document, or null if there is none. */
  get<T>(kind: string, key: string): Promise<StoredObject<T> | null>;
  /** Every document of a kind (whose key starts with `options.prefix`, if given), ordered by key. */
  list<T>(kind: string, options?: StateListOptions): Promise<Array<StoredObject<T>>>;
  /** Creates or replaces a document; durable when the promise resolves. CONFLICT on a failed compare-and-set. */
  put<T>(kind: string, key: string, value: T, options?: StateWriteOptions): Promise<StoredObject<T>>;
  /** Removes a document (no error if missing, unless expectedVersion is given). */
  delete(kind: string, key: string, options?: StateWriteOptions): Promise<void>;
  /**
   * Optional: calls `listener` for every change to the documents of `kind` (whose key
   * starts with `options.prefix`, if given) made after the returned promise resolves, so a
   * controller reacts to changes instead of polling. List after the watch resolves to start
   * from a known state.
   *
   * Delivery is at least once and in order per document; a store may coalesce several puts
   * of a document into the last one, and sends a `resync` change whenever it may have
   * missed some (after reconnecting to a remote store). The listener must not throw (what
   * it throws is reported as a process warning). Stores without it leave callers to poll.
   */
  watch?<T>(kind: string, listener: (change: StateChange<T>) => void, options?: StateListOptions): Promise<StateWatch>;
  /** Releases resources (file locks, connections, watches). Idempotent. */
  close(): Promise<void>;
}
