/**
 * Lockspace: one per storage (as in Virtink's VM HA design). It lives on a file or block device shared by every
 * host: 1 MiB of host (delta) leases, a 2 MiB resource index, then 1 MiB per lock, so a
 * lockspace for `maxLocks` locks is (maxLocks + 3) MiB and never grows.
 *
 * A host joins with a host id that is unique across hosts (the embedder assigns it); the
 * host's sanlock daemon then renews the host lease every 2 × io_timeout, and other hosts
 * see it live, fail or dead from those renewals ({@link LivenessWatcher}).
 *
 * @packageDocumentation
 */
import { EventEmitter } from 'node:events';
import { open, stat, unlink } from 'node:fs/promises';
import { isAbsolute } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type * as TE from 'typed-emitter';

import { MooringError, callNative } from '../errors.js';
import type { NativeAddon, NativeSanlockLockspace, NativeSanlockRindex } from '../native/binding.js';
import { hostStateFromFlags, type HostStatus } from './host-state.js';
import { parseHostLeases, parseRindex, type HostLeaseRecord, type RindexRecord } from './lease-area.js';
import { Lock } from './lock.js';
import { LivenessWatcher, type LivenessWatcherOptions } from './liveness-watcher.js';
import { SanlockClient } from './sanlock-client.js';
import { sanlockError } from './sanlock-errors.js';
import { failureTimings, hostDeadSeconds, lockspaceSizeBytes, renewalIntervalSeconds, type FailureTimings } from './timing.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** Names of lockspaces and locks: sanlock keeps 48 bytes; ':' separates fields in its lease strings. */
export const LOCK_NAME_PATTERN = /^[A-Za-z0-9._-]{1,48}$/;
/** Largest host id (sanlock's limit for 512-byte sectors and 1 MiB alignment). */
export const HOST_ID_MAX = 2000;
/** Largest `maxLocks` of one lockspace (the resource index's capacity at 1 MiB alignment). */
export const MAX_LOCKS_MAX = 10_000;
/** io_timeout bounds, seconds (sanlock's default is 10). */
export const IO_TIMEOUT_SECONDS_MIN = 1;
/** io_timeout bounds, seconds. */
export const IO_TIMEOUT_SECONDS_MAX = 60;
/** Default io_timeout, seconds (sanlock's default). */
export const DEFAULT_IO_TIMEOUT_SECONDS = 10;

const MIB = 1024 * 1024;
/** Offset of the resource index inside the lockspace area (after the host leases). */
export const RINDEX_OFFSET_BYTES = MIB;
/** SANLK_LSF_ALIGN1M | SANLK_LSF_SECTOR512: the layout Mooring writes. */
const LAYOUT_FLAGS = 0x10 | 0x100;
const SECTOR_BYTES = 512;
const LSF_ADD = 0x1;
const LSF_REM = 0x2;
/** How often {@link Lockspace.delete} reads the host leases again while it waits for held ones to renew or die. */
export const DELETE_POLL_INTERVAL_MS = 1000;
/** Bytes zeroed per write when {@link Lockspace.delete} wipes an area it cannot remove. */
const WIPE_CHUNK_BYTES = MIB;

/** Where this host stands in a lockspace. */
export type Membership = 'not-joined' | 'joining' | 'joined' | 'leaving';

/** Options naming a lockspace on storage. */
export interface LockspaceOptions {
  /** Lockspace name, [A-Za-z0-9._-]{1,48}, the same on every host. */
  name: string;
  /** Absolute path of the file or block device, as this host sees it. */
  path: string;
  /** Byte offset of the lockspace area on `path` (MiB-aligned; default 0). */
  offset?: number;
  /** The native addon (default: this package's). Tests inject a fake. */
  addon?: NativeAddon;
}

/** Options of {@link Lockspace.create}. */
export interface LockspaceCreateOptions extends LockspaceOptions {
  /** How many locks it holds; sizes the storage at (maxLocks + 3) MiB. Immutable. */
  maxLocks: number;
  /**
   * io_timeout of this lockspace in seconds (default 10). Every recovery time scales with
   * it (see {@link FailureTimings}); it is written into the lockspace and used on join.
   */
  ioTimeoutSeconds?: number;
}

/** Options of {@link Lockspace.join}. */
export interface JoinOptions {
  /** This host's id, unique among the hosts of the lockspace (1..2000). */
  hostId: number;
  /**
   * This host's sanlock host name (the daemon's `-e`). When the host lease already carries
   * it (this host crashed and restarted), the check for another live holder is skipped.
   */
  hostName?: string;
}

/** What {@link Lockspace.status} reports. */
export interface LockspaceStatus {
  /** The lockspace's name. */
  name: string;
  /** Its file or block device. */
  path: string;
  /** Byte offset of its area on `path`. */
  offset: number;
  /** Locks it can hold. */
  maxLocks: number;
  /** io_timeout written in the lockspace, seconds. */
  ioTimeoutSeconds: number;
  /** This host's membership. */
  membership: Membership;
  /** This host's id when it joined through this object. */
  hostId: number | undefined;
}

/** This host lost the lockspace without leaving it: its renewals failed. */
export interface LockspaceLostEvent {
  /** The lockspace. */
  lockspace: string;
  /** This host's id in it, when it joined through this object. */
  hostId: number | undefined;
  /** Why: the host lease could not be renewed (storage unreachable from this host). */
  reason: 'renewal-failed';
}

/** A process holding locks in this lockspace was stopped by sanlock. */
export interface HolderKilledEvent {
  /** The lockspace. */
  lockspace: string;
  /** The process. */
  pid: number;
  /** Its owner name (the VM name) when given. */
  ownerName: string | undefined;
  /** Locks of this lockspace it held. */
  locks: string[];
  /** The signal that ended it (null when a kill path made it exit normally). */
  signal: NodeJS.Signals | null;
  /** Its exit code when it exited instead of being signalled. */
  exitCode: number | null;
  /** Why sanlock stopped it. */
  reason: 'renewal-failed' | 'lockspace-left';
}

/** A host that keeps a lockspace in use, as {@link Lockspace.delete} reports it. */
export interface LockspaceUser {
  /** Its host id. */
  hostId: number;
  /** Its sanlock host name, from its lease. */
  hostName: string;
  /** Its generation in the lockspace. */
  generation: number;
  /**
   * `joined-here`: this host's daemon is a member; `live`: its lease was renewed while
   * delete watched; `not-yet-dead`: held, not renewed since, but not silent for
   * 8N + 60 s yet (it may be failing, or between two renewals).
   */
  state: 'joined-here' | 'live' | 'not-yet-dead';
}

/** A lock that keeps a lockspace in use: held by a host that is not dead. */
export interface LockspaceHeldLock {
  /** The lock's name. */
  name: string;
  /** Host ids holding it. */
  hostIds: number[];
}

/** Events of a {@link Lockspace}. */
export type LockspaceEvents = {
  /** This host lost the lockspace (renewal failure); its lock holders are being stopped. */
  lost: (event: LockspaceLostEvent) => void;
  /** A lock holder was stopped by sanlock. */
  'holder-killed': (event: HolderKilledEvent) => void;
};

/** @internal */
export function checkLockName(name: unknown, what: string): string {
  if (typeof name !== 'string' || !LOCK_NAME_PATTERN.test(name))
    throw new MooringError('INVALID_ARGUMENT', `${what} must match ${LOCK_NAME_PATTERN} (got ${JSON.stringify(name)})`);
  return name;
}

function checkInt(value: unknown, what: string, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max)
    throw new MooringError('INVALID_ARGUMENT', `${what} must be an integer in [${min}, ${max}] (got ${String(value)})`);
  return value;
}

function checkPath(path: unknown): string {
  if (typeof path !== 'string' || !isAbsolute(path) || path.length > 1000 || path.includes(':'))
    throw new MooringError('INVALID_ARGUMENT', `path must be an absolute path without ':' (got ${JSON.stringify(path)})`);
  return path;
}

/**
 * A lockspace on shared storage, seen from this host. Create it once (any host), then
 * {@link Lockspace.open} it on every host and {@link Lockspace.join} with each host's id.
 */
export class Lockspace extends (EventEmitter as new () => TypedEmitter<LockspaceEvents>) {
  /** Lockspace name. */
  readonly name: string;
  /** File or block device. */
  readonly path: string;
  /** Offset of the lockspace area. */
  readonly offset: number;
  /** Locks it can hold, as its resource index was formatted (`maxLocks` at create). */
  readonly maxLocks: number;
  /** io_timeout written in it, seconds. */
  readonly ioTimeoutSeconds: number;
  /** @internal */
  readonly client: SanlockClient;
  #hostId: number | undefined;
  #leaving = false;
  #lostReported = false;

  private constructor(opts: LockspaceOptions, maxLocks: number, ioTimeoutSeconds: number, client: SanlockClient) {
    super();
    this.name = opts.name;
    this.path = opts.path;
    this.offset = opts.offset ?? 0;
    this.maxLocks = maxLocks;
    this.ioTimeoutSeconds = ioTimeoutSeconds;
    this.client = client;
  }

  /**
   * Initialises a lockspace (what Virtink's initializer does): creates the file at (maxLocks + 3) MiB
   * when it does not exist (a block device must be at least that large), writes the host
   * leases with the io_timeout, and formats the resource index. Needs the local sanlock
   * daemon (the writes go through it) but not a join.
   *
   * @throws MooringError ALREADY_EXISTS when the area already holds a lockspace
   */
  static async create(opts: LockspaceCreateOptions): Promise<Lockspace> {
    const name = checkLockName(opts.name, 'name');
    const path = checkPath(opts.path);
    const offset = checkInt(opts.offset ?? 0, 'offset', 0, Number.MAX_SAFE_INTEGER);
    if (offset % MIB !== 0) throw new MooringError('INVALID_ARGUMENT', 'offset must be a multiple of 1 MiB');
    const maxLocks = checkInt(opts.maxLocks, 'maxLocks', 1, MAX_LOCKS_MAX);
    const io = checkInt(opts.ioTimeoutSeconds ?? DEFAULT_IO_TIMEOUT_SECONDS, 'ioTimeoutSeconds', IO_TIMEOUT_SECONDS_MIN, IO_TIMEOUT_SECONDS_MAX);
    const client = new SanlockClient(opts.addon);
    client.ensureLoaded();
    const size = offset + lockspaceSizeBytes(maxLocks);
    await ensureStorage(path, size);

    const ls = { name, hostId: 1, path, offset };
    const existing = await client.rv('readLockspace', `lockspace ${name} at ${path}`, (s) => s.readLockspace(ls));
    if (existing.rv >= 0)
      throw new MooringError('ALREADY_EXISTS', `${path}:${offset} already holds lockspace ${existing.lockspace.name}`, {
        details: { path, offset, lockspace: existing.lockspace.name },
      });
    await client.call('writeLockspace', `lockspace ${name} at ${path}`, (s) =>
      s.writeLockspace({ ...ls, hostId: 0, flags: LAYOUT_FLAGS }, 0, io),
    );
    await client.call('formatRindex', `lockspace ${name}`, (s) => s.formatRindex(rindexOf(name, path, offset, maxLocks)));
    return new Lockspace({ ...opts, offset }, maxLocks, io, client);
  }

  /**
   * Opens an initialised lockspace: reads its name and io_timeout back from storage.
   *
   * @throws MooringError NOT_FOUND when `path` does not exist; CORRUPT_METADATA when the area holds no lockspace; INVALID_ARGUMENT when it holds another one
   */
  static async open(opts: LockspaceOptions): Promise<Lockspace> {
    const name = checkLockName(opts.name, 'name');
    const path = checkPath(opts.path);
    const offset = checkInt(opts.offset ?? 0, 'offset', 0, Number.MAX_SAFE_INTEGER);
    const client = new SanlockClient(opts.addon);
    // The daemon reports a missing file as an I/O error: say what is missing.
    if ((await stat(path).catch(() => undefined)) === undefined)
      throw new MooringError('NOT_FOUND', `lockspace ${name}: ${path} does not exist`, { details: { path, lockspace: name } });
    const r = await client.call('readLockspace', `lockspace ${name} at ${path}`, (s) =>
      s.readLockspace({ name, hostId: 1, path, offset }),
    );
    if (r.lockspace.name !== name)
      throw new MooringError('INVALID_ARGUMENT', `${path}:${offset} holds lockspace ${r.lockspace.name}, not ${name}`);
    // The index header says how many locks it was formatted for: a block device's size
    // says nothing (stat gives 0, and a LUN may be larger than the lockspace).
    const rindex = await readRindex(client, path, offset, 512);
    if (rindex === undefined)
      throw new MooringError('CORRUPT_METADATA', `${path}:${offset} holds lockspace ${name} without a resource index: not fully created?`, {
        details: { path, offset, lockspace: name },
      });
    return new Lockspace({ ...opts, offset }, rindex.maxResources, r.ioTimeoutSeconds, client);
  }

  /** This host's id after {@link join}. */
  get hostId(): number | undefined {
    return this.#hostId;
  }

  /** The recovery timings (T1..T5) for this lockspace's io_timeout. */
  timings(watchdogSeconds?: number): FailureTimings {
    return failureTimings(this.ioTimeoutSeconds, watchdogSeconds);
  }

  /** @internal */
  nativeLockspace(hostId = this.#hostId ?? 0): NativeSanlockLockspace {
    return { name: this.name, hostId, path: this.path, offset: this.offset };
  }

  /** @internal */
  rindex(): NativeSanlockRindex {
    return rindexOf(this.name, this.path, this.offset, this.maxLocks);
  }

  /**
   * Joins as host `hostId` (what Virtink's attacher does): the local daemon acquires the host lease
   * and renews it from then on. Takes about 2 × io_timeout + 1 s on a free lease.
   *
   * Before asking the daemon, the host lease is read from storage: when another host name
   * holds it and renews it (its timestamp moves within one renewal interval), the join
   * fails at once with HOST_ID_IN_USE instead of after sanlock's 8 × io_timeout + 60 s.
   *
   * @throws MooringError HOST_ID_IN_USE, SANLOCK_DAEMON_UNAVAILABLE, ALREADY_EXISTS (joined already)
   */
  async join(opts: JoinOptions): Promise<void> {
    const hostId = checkInt(opts.hostId, 'hostId', 1, HOST_ID_MAX);
    if (opts.hostName !== undefined) checkLockName(opts.hostName, 'hostName');
    this.client.ensureLoaded();
    await this.#checkHostIdFree(hostId, opts.hostName);
    await this.client.call(
      'addLockspace',
      `lockspace ${this.name} as host ${hostId}`,
      (s) => s.addLockspace(this.nativeLockspace(hostId), false, this.ioTimeoutSeconds),
      { lockspace: this.name, hostId },
    );
    this.#hostId = hostId;
    this.#leaving = false;
    this.#lostReported = false;
  }

  async #checkHostIdFree(hostId: number, hostName: string | undefined): Promise<void> {
    const read = () => this.client.native.readDeltaLease(this.path, this.offset, hostId, SECTOR_BYTES);
    const first = await read();
    if (!first.valid)
      throw new MooringError('CORRUPT_METADATA', `${this.path}:${this.offset} holds no host lease for host ${hostId}: not initialised?`);
    if (first.timestamp === 0) return; // free
    if (hostName !== undefined && first.hostName === hostName) return; // ours: sanlock reacquires at once
    // Held by another name: live if it renews within one interval (plus a second of slack).
    await sleep((renewalIntervalSeconds(this.ioTimeoutSeconds) + 1) * 1000);
    const second = await read();
    if (second.timestamp !== 0 && second.timestamp !== first.timestamp && second.hostName !== hostName) {
      throw new MooringError(
        'HOST_ID_IN_USE',
        `host id ${hostId} in lockspace ${this.name} is held by live host ${JSON.stringify(second.hostName)}`,
        { details: { lockspace: this.name, hostId, holder: second.hostName, generation: second.generation } },
      );
    }
  }

  /**
   * Leaves the lockspace: the daemon releases the host lease (other hosts then see this
   * host `free`). sanlock stops every process still holding locks in it, so release or
   * stop them first. Idempotent when not joined.
   */
  async leave(): Promise<void> {
    const hostId = this.#hostId;
    if (hostId === undefined) return;
    this.#leaving = true;
    const r = await this.client.rv('remLockspace', `lockspace ${this.name}`, (s) => s.remLockspace(this.nativeLockspace(hostId)));
    // -ENOENT: already gone (it was lost to a renewal failure and removed).
    if (r.rv < 0 && r.rv !== -2) {
      this.#leaving = false;
      throw sanlockError(r.rv, 'remLockspace', `lockspace ${this.name}`);
    }
    this.#hostId = undefined;
  }

  /**
   * Deletes the lockspace from its storage, what Virtink's lockspace controller does when a
   * Lockspace goes away (it cleans up the lockspace's volume). A regular file that holds
   * only this lockspace (offset 0) is removed; on a block device, or at an offset inside a
   * larger file, the lockspace's area is zeroed instead (its host leases first, then its
   * resource index, then the leases of the locks the index lists), so the storage no longer
   * opens as a lockspace and {@link Lockspace.create} can use it again.
   *
   * Refused with BUSY while the lockspace is in use: while this host's daemon is a member
   * (leave first), or while any host holds a host lease that is not yet dead by the timing
   * rules (a host is dead once its lease went 8N + 60 s without a renewal, N = io_timeout).
   * A lock is in use while its holder's host is, so the error lists the hosts that are not
   * dead (`details.hosts`, {@link LockspaceUser}) and the locks they hold (`details.locks`).
   * delete reads the host leases from storage, so it needs no join: a held lease that
   * renews within one renewal interval (2N) refuses at once; one that does not renew is
   * watched until it is dead, as sanlock itself would before granting its locks, so
   * deleting after a host crashed takes up to 8N + 60 s. It needs this host's daemon
   * (lock owners are read through it).
   *
   * A host that starts joining while delete wipes the area loses the lockspace (its join or
   * its renewals fail): delete is meant for a lockspace every host has left.
   *
   * @throws MooringError BUSY (in use; details.hosts, details.locks), SANLOCK_DAEMON_UNAVAILABLE
   */
  async delete(): Promise<void> {
    this.client.ensureLoaded();
    const lockspaces = await this.client.call('getLockspaces', 'of this host', (s) => s.getLockspaces());
    const here = lockspaces.lockspaces.find((l) => l.name === this.name);
    const firstRead = await this.#readHostLeases();
    if (here) {
      // A member's daemon knows the other hosts' states: name those not dead.
      const states = new Map((await this.client.getHosts(this.name).catch(() => [])).map((x) => [x.hostId, hostStateFromFlags(x.flags)]));
      const users: LockspaceUser[] = [];
      for (const h of firstRead) {
        const st = states.get(h.hostId) ?? 'unknown';
        if (h.hostId === here.hostId) users.push({ ...user(h), state: 'joined-here' });
        else if (st !== 'dead' && st !== 'free') users.push({ ...user(h), state: st === 'live' ? 'live' : 'not-yet-dead' });
      }
      if (!users.some((u) => u.hostId === here.hostId)) users.unshift({ hostId: here.hostId, hostName: '', generation: 0, state: 'joined-here' });
      throw await this.#busy(users, `this host is a member (host ${here.hostId}): leave() it first`);
    }

    // Held leases must each either renew (live: refuse) or stay silent until dead.
    const deadMs = hostDeadSeconds(this.ioTimeoutSeconds) * 1000;
    const startMs = Date.now();
    const held = new Map(firstRead.map((h) => [h.hostId, h]));
    while (held.size > 0 && Date.now() - startMs < deadMs) {
      await sleep(Math.min(DELETE_POLL_INTERVAL_MS, Math.max(0, deadMs - (Date.now() - startMs))));
      const now = new Map((await this.#readHostLeases()).map((h) => [h.hostId, h]));
      const renewed = [...now.values()].filter((h) => {
        const before = held.get(h.hostId);
        return before === undefined || before.timestamp !== h.timestamp || before.generation !== h.generation;
      });
      for (const id of [...held.keys()]) if (!now.has(id)) held.delete(id); // released meanwhile: free
      if (renewed.length > 0) {
        const live = new Set(renewed.map((h) => h.hostId));
        const users: LockspaceUser[] = [...new Map([...held, ...now]).values()]
          .sort((a, b) => a.hostId - b.hostId)
          .map((h) => ({ ...user(h), state: live.has(h.hostId) ? 'live' : 'not-yet-dead' }));
        throw await this.#busy(users, 'hosts hold leases in it');
      }
    }

    // Every held lease is dead or was released. Read once more: a host may have joined since.
    const last = await this.#readHostLeases();
    const joined = last.filter((h) => {
      const was = firstRead.find((f) => f.hostId === h.hostId);
      return was === undefined || was.timestamp !== h.timestamp || was.generation !== h.generation;
    });
    if (joined.length > 0) throw await this.#busy(joined.map((h) => ({ ...user(h), state: 'live' })), 'a host joined meanwhile');

    const rindex = await readRindex(this.client, this.path, this.offset, SECTOR_BYTES);
    await this.#wipe(rindex);
  }

  async #readHostLeases(): Promise<HostLeaseRecord[]> {
    const area = await callNative(() => this.client.native.readLeaseArea(this.path, this.offset, MIB), `read the host leases of lockspace ${this.name}`);
    return parseHostLeases(area, SECTOR_BYTES);
  }

  // BUSY naming the hosts not dead and the locks they hold (lock owners through the daemon).
  async #busy(users: LockspaceUser[], why: string): Promise<MooringError> {
    const live = new Set(users.map((u) => u.hostId));
    const locks: LockspaceHeldLock[] = [];
    const rindex = await readRindex(this.client, this.path, this.offset, SECTOR_BYTES).catch(() => undefined);
    for (const e of rindex?.entries ?? []) {
      const r = await this.client.rv('readResource', `lock ${e.name} in lockspace ${this.name}`, (s) =>
        s.readResource({ lockspace: this.name, name: e.name, disks: [{ path: this.path, offset: e.offset }] }, true),
      );
      const hostIds = (r.rv >= 0 ? (r.owners ?? []) : []).filter((o) => o.timestamp !== 0 && live.has(o.hostId)).map((o) => o.hostId);
      if (hostIds.length > 0) locks.push({ name: e.name, hostIds });
    }
    const hostText = users.map((u) => `host ${u.hostId}${u.hostName ? ` (${u.hostName})` : ''} ${u.state}`).join(', ');
    const lockText = locks.length > 0 ? `; locks held: ${locks.map((l) => `${l.name} by host ${l.hostIds.join(', ')}`).join('; ')}` : '';
    return new MooringError('BUSY', `lockspace ${this.name} is in use, ${why}: ${hostText}${lockText}`, {
      details: { lockspace: this.name, hosts: users, locks },
    });
  }

  // Removes a file that holds only this lockspace; otherwise zeroes the lockspace's area,
  // host leases first (from then on nothing can join it or open it).
  async #wipe(rindex: RindexRecord | undefined): Promise<void> {
    const st = await stat(this.path);
    if (st.isFile() && this.offset === 0) {
      await unlink(this.path);
      return;
    }
    const spans: Array<[number, number]> = [
      [this.offset, MIB],
      [this.offset + RINDEX_OFFSET_BYTES, 2 * MIB],
      ...(rindex?.entries ?? []).map((e): [number, number] => [e.offset, MIB]),
    ];
    const zeros = Buffer.alloc(WIPE_CHUNK_BYTES);
    const fh = await open(this.path, 'r+');
    try {
      for (const [at, len] of spans) {
        for (let done = 0; done < len; done += WIPE_CHUNK_BYTES) await fh.write(zeros, 0, Math.min(WIPE_CHUNK_BYTES, len - done), at + done);
        await fh.sync();
      }
    } finally {
      await fh.close();
    }
  }

  /** This host's membership, from the daemon's list of lockspaces. */
  async membership(): Promise<Membership> {
    const r = await this.client.call('getLockspaces', 'of this host', (s) => s.getLockspaces());
    const mine = r.lockspaces.find((l) => l.name === this.name);
    if (!mine) return 'not-joined';
    if ((mine.flags & LSF_REM) !== 0) return 'leaving';
    if ((mine.flags & LSF_ADD) !== 0) return 'joining';
    return 'joined';
  }

  /** Name, layout, io_timeout and this host's membership. */
  async status(): Promise<LockspaceStatus> {
    return {
      name: this.name,
      path: this.path,
      offset: this.offset,
      maxLocks: this.maxLocks,
      ioTimeoutSeconds: this.ioTimeoutSeconds,
      membership: await this.membership(),
      hostId: this.#hostId,
    };
  }

  /**
   * Every host the daemon knows in this lockspace with its state (free, unknown, live,
   * fail, dead). Needs this host joined.
   *
   * @throws MooringError LOCKSPACE_NOT_JOINED
   */
  async hosts(): Promise<HostStatus[]> {
    const hosts = await this.client.getHosts(this.name);
    return hosts.map((h) => ({
      hostId: h.hostId,
      state: hostStateFromFlags(h.flags),
      generation: h.generation,
      timestamp: h.timestamp,
      ioTimeoutSeconds: h.ioTimeout,
    }));
  }

  /** A watcher that polls {@link hosts} and emits state changes. Call `start()` on it. */
  watch(options: Omit<LivenessWatcherOptions, 'lockspace'> = {}): LivenessWatcher {
    return new LivenessWatcher({ ...options, lockspace: this });
  }

  /** Creates a lock (a paxos lease) in this lockspace (what Virtink's lock controller does). Needs this host joined. */
  createLock(name: string): Promise<Lock> {
    return Lock.create(this, name);
  }

  /** Opens an existing lock by name. */
  openLock(name: string): Promise<Lock> {
    return Lock.open(this, name);
  }

  /**
   * Checks whether this host lost the lockspace without leaving it, and reports it once
   * (`lost`). Returns the reason, or undefined while it is fine. Called by lock holders
   * that exited and by watchers.
   *
   * @internal
   */
  async checkLost(): Promise<'renewal-failed' | 'lockspace-left' | undefined> {
    if (this.#leaving) return 'lockspace-left';
    if (this.#hostId === undefined) return undefined;
    const m = await this.membership();
    if (this.#leaving) return 'lockspace-left';
    if (m === 'joined' || m === 'joining') return undefined;
    if (!this.#lostReported) {
      this.#lostReported = true;
      this.emit('lost', { lockspace: this.name, hostId: this.#hostId, reason: 'renewal-failed' });
    }
    return 'renewal-failed';
  }
}

function user(h: HostLeaseRecord): Omit<LockspaceUser, 'state'> {
  return { hostId: h.hostId, hostName: h.hostName, generation: h.generation };
}

// The resource index of the lockspace at `offset`, read from storage (undefined: none there).
async function readRindex(client: SanlockClient, path: string, offset: number, sectorBytes: number): Promise<RindexRecord | undefined> {
  const area = await callNative(() => client.native.readLeaseArea(path, offset + RINDEX_OFFSET_BYTES, MIB), `read the resource index of ${path}:${offset}`);
  const rindex = parseRindex(area);
  return rindex && rindex.sectorBytes === sectorBytes ? rindex : undefined;
}

function rindexOf(name: string, path: string, offset: number, maxLocks: number): NativeSanlockRindex {
  return { lockspace: name, path, offset: offset + RINDEX_OFFSET_BYTES, flags: LAYOUT_FLAGS, maxResources: maxLocks };
}

// A regular file is created (sparse) or extended to `size`; a block device must be large enough.
async function ensureStorage(path: string, size: number): Promise<void> {
  const st = await stat(path).catch(() => undefined);
  if (st?.isBlockDevice()) {
    const fh = await open(path, 'r');
    try {
      // stat reports 0 bytes for a block device: check that its last needed byte exists.
      const { bytesRead } = await fh.read(Buffer.alloc(1), 0, 1, size - 1);
      if (bytesRead !== 1) throw new MooringError('OUT_OF_RANGE', `${path} is smaller than the ${size} bytes the lockspace needs`);
    } finally {
      await fh.close();
    }
    return;
  }
  if (st && !st.isFile()) throw new MooringError('INVALID_ARGUMENT', `${path} is neither a file nor a block device`);
  const fh = await open(path, st ? 'r+' : 'w+', 0o660);
  try {
    if ((st?.size ?? 0) < size) await fh.truncate(size);
    await fh.sync();
  } finally {
    await fh.close();
  }
}
