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
  /** Releases resources (file locks, connections). Idempotent. */
  close(): Promise<void>;
}
