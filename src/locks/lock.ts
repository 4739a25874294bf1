/**
 * Lock: a disk lock (a sanlock paxos lease) in a {@link Lockspace}, one per disk image
 * (Virtink's lock controller creates one per disk). A VM process holds it while it runs, so two
 * VMs never write the same disk: acquiring a lock another process or host holds fails with
 * LOCK_HELD. Locks are held by processes registered with the daemon (see
 * {@link LockedProcess}); the library acquires and releases them on the process's behalf.
 *
 * @packageDocumentation
 */
import { MooringError } from '../errors.js';
import type { NativeSanlockResource, NativeSanlockTarget } from '../native/binding.js';
import { checkLockName, type Lockspace } from './lockspace.js';
import type { SanlockClient } from './sanlock-client.js';
import { sanlockError } from './sanlock-errors.js';

/** SANLK_RES_LVER: acquire only if the lease version on disk equals the one given. */
export const RES_LVER = 0x1;
/** SANLK_RES_SHARED: a shared lease (any number of shared holders, no exclusive one). */
export const RES_SHARED = 0x4;
/** Locks one process may hold (sanlock's SANLK_MAX_RESOURCES per call). */
export const LOCKS_PER_PROCESS_MAX = 8;

/** Who holds or asks for a lock: a process registered with the local sanlock daemon. */
export interface LockHolder {
  /** Its pid (in the daemon's pid namespace). */
  readonly pid: number;
}

/** Options of {@link Lock.acquire}. */
export interface LockAcquireOptions {
  /** A shared lease instead of an exclusive one. */
  shared?: boolean;
  /**
   * Acquire only if the lease version on disk is still this one (SANLK_RES_LVER): the
   * version a migration source handed over. Fails with LOCK_VERSION_MISMATCH when any host
   * acquired the lock since.
   */
  version?: number;
  /** A name for the holder shown by sanlock (the VM name), up to 48 bytes. */
  ownerName?: string;
}

/** A lock as stored. */
export interface LockInfo {
  /** The lockspace it lives in. */
  lockspace: string;
  /** Its name. */
  name: string;
  /** Byte offset of the lease on the lockspace's storage. */
  offset: number;
  /** Lease version: incremented by every exclusive acquire; kept by release. */
  version: number;
  /** Hosts that hold it now (empty when free). */
  owners: Array<{
    /** The holder's host id. */
    hostId: number;
    /** That host's generation in the lockspace (it grows each time the host joins). */
    generation: number;
    /** sanlock's timestamp of the ownership, on the holder's clock (seconds; 0: not held). */
    timestamp: number;
  }>;
}

/** A disk lock in a lockspace. */
export class Lock {
  private constructor(
    /** The lockspace it lives in. */
    readonly lockspace: Lockspace,
    /** Its name, [A-Za-z0-9._-]{1,48}. */
    readonly name: string,
    /** Byte offset of its lease on the lockspace's storage. */
    readonly offset: number,
  ) {}

  /**
   * Creates a lock: allocates a lease in the lockspace's resource index and initialises it.
   * Needs this host joined to the lockspace.
   *
   * @throws MooringError ALREADY_EXISTS, NO_SPACE (maxLocks reached), LOCKSPACE_NOT_JOINED
   */
  static async create(lockspace: Lockspace, name: string): Promise<Lock> {
    checkLockName(name, 'lock name');
    const existing = await lookup(lockspace, name);
    if (existing !== undefined)
      throw new MooringError('ALREADY_EXISTS', `lock ${name} exists in lockspace ${lockspace.name}`, {
        details: { lockspace: lockspace.name, lock: name, offset: existing },
      });
    const r = await lockspace.client.call(
      'createResource',
      `lock ${name} in lockspace ${lockspace.name}`,
      (s) => s.createResource(lockspace.rindex(), name, 0, 0),
      { lockspace: lockspace.name, lock: name },
    );
    return new Lock(lockspace, name, r.entry.offset);
  }

  /**
   * Opens an existing lock by name.
   *
   * @throws MooringError NOT_FOUND
   */
  static async open(lockspace: Lockspace, name: string): Promise<Lock> {
    checkLockName(name, 'lock name');
    const offset = await lookup(lockspace, name);
    if (offset === undefined) throw new MooringError('NOT_FOUND', `no lock ${name} in lockspace ${lockspace.name}`);
    return new Lock(lockspace, name, offset);
  }

  get #client(): SanlockClient {
    return this.lockspace.client;
  }

  /** The lease as sanlock describes it. @internal */
  resource(opts: { shared?: boolean; version?: number } = {}): NativeSanlockResource {
    let flags = 0;
    if (opts.shared) flags |= RES_SHARED;
    if (opts.version !== undefined) flags |= RES_LVER;
    return {
      lockspace: this.lockspace.name,
      name: this.name,
      disks: [{ path: this.lockspace.path, offset: this.offset }],
      flags,
      ...(opts.version !== undefined ? { lver: opts.version } : {}),
    };
  }

  /** Reads the lease: its version and current owners. */
  async inspect(): Promise<LockInfo> {
    const r = await this.#client.call('readResource', this.#what(), (s) => s.readResource(this.resource(), true));
    return {
      lockspace: this.lockspace.name,
      name: this.name,
      offset: this.offset,
      version: r.resource.lver,
      owners: (r.owners ?? []).map((o) => ({ hostId: o.hostId, generation: o.generation, timestamp: o.timestamp })),
    };
  }

  /**
   * Acquires the lock for `holder`, a process registered with this host's daemon.
   *
   * @throws MooringError LOCK_HELD, LOCK_VERSION_MISMATCH, LOCKSPACE_NOT_JOINED, ALREADY_EXISTS (the holder has it)
   */
  async acquire(holder: LockHolder, opts: LockAcquireOptions = {}): Promise<void> {
    await acquireLocks(this.#client, { pid: holder.pid }, [{ lock: this, ...opts }], opts.ownerName);
  }

  /** Releases the lock held by `holder`. The lease version stays on disk. */
  async release(holder: LockHolder): Promise<void> {
    await this.#client.call('release', this.#what(), (s) => s.release({ pid: holder.pid }, 0, [this.resource()]), {
      lockspace: this.lockspace.name,
      lock: this.name,
    });
  }

  /**
   * Deletes the lock from the resource index. Refused while any host holds it.
   *
   * @throws MooringError BUSY
   */
  async delete(): Promise<void> {
    const info = await this.inspect();
    if (info.owners.some((o) => o.timestamp !== 0))
      throw new MooringError('BUSY', `${this.#what()} is held by host ${info.owners.map((o) => o.hostId).join(', ')}`, {
        details: { lockspace: this.lockspace.name, lock: this.name, owners: info.owners },
      });
    await this.#client.call('deleteResource', this.#what(), (s) =>
      s.deleteResource(this.lockspace.rindex(), { name: this.name, offset: this.offset }),
    );
  }

  #what(): string {
    return `lock ${this.name} in lockspace ${this.lockspace.name}`;
  }
}

/**
 * Acquires several locks in one sanlock call (all or none). @internal
 */
export async function acquireLocks(
  client: SanlockClient,
  target: NativeSanlockTarget,
  locks: Array<{ lock: Lock; shared?: boolean; version?: number }>,
  ownerName?: string,
): Promise<void> {
  if (locks.length === 0) return;
  if (locks.length > LOCKS_PER_PROCESS_MAX)
    throw new MooringError('INVALID_ARGUMENT', `at most ${LOCKS_PER_PROCESS_MAX} locks per process (got ${locks.length})`);
  if (ownerName !== undefined && (Buffer.byteLength(ownerName) > 48 || ownerName.length === 0))
    throw new MooringError('INVALID_ARGUMENT', 'ownerName must be 1..48 bytes');
  const what = locks.map((l) => `${l.lock.lockspace.name}:${l.lock.name}`).join(', ');
  await client.call(
    'acquire',
    `lock ${what}`,
    (s) => s.acquire(target, 0, locks.map((l) => l.lock.resource(l)), ownerName),
    { locks: locks.map((l) => ({ lockspace: l.lock.lockspace.name, lock: l.lock.name, version: l.version })) },
  );
}

async function lookup(lockspace: Lockspace, name: string): Promise<number | undefined> {
  const r = await lockspace.client.rv('lookupRindex', `lock ${name} in lockspace ${lockspace.name}`, (s) =>
    s.lookupRindex(lockspace.rindex(), { name }),
  );
  if (r.rv === -2) return undefined; // -ENOENT: no such entry
  if (r.rv < 0) {
    throw sanlockError(r.rv, 'lookupRindex', `lock ${name} in lockspace ${lockspace.name}`);
  }
  return r.entry.offset;
}
