/**
 * LockedProcess: a VM process that holds disk locks. sanlock ties leases to a process
 * registered with the daemon, so the VM command is started through the lock-exec helper
 * (`mooring-lock-exec`, src/locks/exec-helper.ts): it registers with the daemon, reports
 * its pid, waits until the library has acquired the locks on its behalf, then execs the VM
 * command in the same process, keeping the registration. The VM never runs without its
 * locks; when it exits, the daemon releases them.
 *
 * For live migration the locks follow the vCPUs: {@link LockedProcess.handOver} (source,
 * at switch-over) reads the lease versions and releases; {@link LockedProcess.takeOver}
 * (target, before resuming) acquires with those versions, so a host that took a lock in
 * between makes it fail with LOCK_VERSION_MISMATCH; on rollback the source calls takeOver
 * with the same hand-over. See docs/locks.md.
 *
 * @packageDocumentation
 */
import { spawn, type ChildProcess, type IOType } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import type * as TE from 'typed-emitter';

import { MooringError, isMooringErrorCode } from '../errors.js';
import type { NativeAddon, NativeSanlockResource } from '../native/binding.js';
import { findPackageRoot } from '../native/load.js';
import { safeEmit } from '../util/emit.js';
import { LOCKS_PER_PROCESS_MAX, RES_SHARED, acquireLocks, type Lock } from './lock.js';
import type { HolderKilledEvent, Lockspace } from './lockspace.js';
import { SanlockClient } from './sanlock-client.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** How long {@link LockedProcess.start} waits for the helper to register. */
export const REGISTER_TIMEOUT_MS = 30_000;
/** How long it waits for the exec after the locks are acquired. */
export const EXEC_TIMEOUT_MS = 30_000;
/**
 * After a holder died of a signal not sent through {@link LockedProcess.kill}: how long to
 * watch for its lockspace turning lost. sanlock marks a failed lockspace only once all its
 * holders are gone (about 0.5 s later here), so the check cannot be instant.
 */
export const KILL_REPORT_WAIT_MS = 3000;
/** Poll interval of that watch. */
const KILL_REPORT_POLL_MS = 200;
/** Largest control message accepted from the helper. */
const CONTROL_LINE_BYTES_MAX = 64 * 1024;
/** The helper's control channel: fd 3 of the helper process. */
export const CONTROL_FD = 3;

/** What sanlock does to the holder when its lockspace fails. */
export type RestrictMode = 'none' | 'sigkill' | 'sigterm';

/** A lock to hold, with how. */
export interface LockRequest {
  /** The lock. */
  lock: Lock;
  /** Shared instead of exclusive. */
  shared?: boolean;
  /** Only if the lease version on disk is still this one (see {@link Lock.acquire}). */
  version?: number;
}

/** Options of {@link LockedProcess.start}. */
export interface LockedProcessOptions {
  /** The VM program (looked up in PATH) and its arguments. */
  command: string;
  /** Its arguments. */
  args?: string[];
  /** Locks the process holds before the command runs (up to 8; none: registered only, e.g. a migration target). */
  locks?: Array<Lock | LockRequest>;
  /** A name for the holder shown by sanlock (the VM name), up to 48 bytes. */
  ownerName?: string;
  /**
   * A program the daemon runs (with the pid appended) instead of SIGTERM when the
   * lockspace fails, to stop the VM gracefully; SIGKILL follows if it does not exit.
   */
  killPath?: {
    /** The program (under 128 bytes). */
    path: string;
    /** Its arguments, one string (under 128 bytes). */
    args?: string;
  };
  /**
   * Signals sanlock may not use (sanlock_restrict): 'sigterm' makes it go straight to
   * SIGKILL, 'sigkill' leaves only SIGTERM. Default 'none'.
   */
  restrict?: RestrictMode;
  /** stdio of the process (default inherit). */
  stdio?: [IOType | number, IOType | number, IOType | number];
  /** Environment of the process (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** Working directory of the process (default: this process's). */
  cwd?: string;
  /** The native addon (default this package's). */
  addon?: NativeAddon;
  /** Path of the helper script (default: dist/lock-exec.js of this package). */
  helperPath?: string;
}

/** One lease a process holds, as sanlock reports it. */
export interface HeldLease {
  /** The lockspace of the lock. */
  lockspace: string;
  /** The lock's name. */
  name: string;
  /** Lease version (0 for shared leases, which carry none). */
  version: number;
  /** Held shared. */
  shared: boolean;
  /** Where the lease lives. */
  disks: Array<{
    /** The lockspace's file or block device. */
    path: string;
    /** Byte offset of the lease on it. */
    offset: number;
  }>;
}

/** What a migration source hands to the target: the leases and their versions. JSON-safe. */
export interface LockHandover {
  /** sanlock's own state string (`ls:res:path:off:lver ...`), for logs and other tools. */
  state: string;
  /** The leases handed over. */
  leases: HeldLease[];
}

/** How the process ended. */
export interface LockedProcessExit {
  /** The process. */
  pid: number;
  /** Its exit code, or null when a signal ended it. */
  code: number | null;
  /** The signal that ended it, or null. */
  signal: NodeJS.Signals | null;
  /** Set when sanlock stopped it because a lockspace failed on this host (or was left). */
  stoppedBySanlock?: Omit<HolderKilledEvent, 'pid' | 'ownerName' | 'signal' | 'exitCode'> & {
    /** Every lockspace whose failure (or leaving) stopped it. */
    lockspaces: string[];
  };
}

/** Events of a {@link LockedProcess}. */
export type LockedProcessEvents = {
  /** The process ended; `stoppedBySanlock` says if sanlock stopped it and why. */
  exit: (exit: LockedProcessExit) => void;
};

interface HeldLock {
  lock: Lock;
  shared: boolean;
}

/**
 * A VM process that holds disk locks: started through the `mooring-lock-exec` helper, which
 * registers with the sanlock daemon and execs the VM command only once the locks are held,
 * so the VM never runs without them; when it exits, the daemon releases them. For live
 * migration the locks follow the VM: {@link LockedProcess.handOver} on the source,
 * {@link LockedProcess.takeOver} on the target (see {@link MigrationLocks}).
 */
export class LockedProcess extends (EventEmitter as new () => TypedEmitter<LockedProcessEvents>) {
  /** The child process (the helper, then the VM command in the same process). */
  readonly child: ChildProcess;
  /** Its pid. */
  readonly pid: number;
  /** The owner name given (the VM name), if any. */
  readonly ownerName: string | undefined;
  /** Resolves when the process ended (after the sanlock check). */
  readonly exited: Promise<LockedProcessExit>;
  readonly #client: SanlockClient;
  // Locks acquired through this object, and every lockspace ever involved (for the report).
  readonly #held = new Map<string, HeldLock>();
  readonly #lockspaces = new Map<string, Lockspace>();
  #exit: LockedProcessExit | undefined;
  #killedByUs = false;

  private constructor(child: ChildProcess, client: SanlockClient, ownerName: string | undefined) {
    super();
    this.child = child;
    this.pid = child.pid!;
    this.ownerName = ownerName;
    this.#client = client;
    const ended = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      child.once('exit', (code, signal) => resolve({ code, signal })),
    );
    this.exited = ended.then(async ({ code, signal }) => {
      const exit: LockedProcessExit = { pid: this.pid, code, signal };
      const report = await this.#sanlockReport(code, signal).catch(() => undefined);
      if (report) exit.stoppedBySanlock = report;
      this.#exit = exit;
      safeEmit(this, 'exit', exit);
      return exit;
    });
    // An 'exited' nobody awaits must not become an unhandled rejection (it never rejects,
    // but keep the chain explicit).
    this.exited.catch(() => undefined);
  }

  /**
   * Starts `command` holding `locks`: spawns the helper, waits for it to register,
   * acquires the locks for it (all or none), then lets it exec the command. If the locks
   * cannot be acquired the helper exits without running the command and this rejects
   * with the acquire's error (LOCK_HELD, LOCK_VERSION_MISMATCH...).
   */
  static async start(opts: LockedProcessOptions): Promise<LockedProcess> {
    if (typeof opts.command !== 'string' || opts.command.length === 0)
      throw new MooringError('INVALID_ARGUMENT', 'command must be a non-empty string');
    const requests = (opts.locks ?? []).map((l) => ('lock' in l ? l : { lock: l }));
    if (requests.length > LOCKS_PER_PROCESS_MAX)
      throw new MooringError('INVALID_ARGUMENT', `at most ${LOCKS_PER_PROCESS_MAX} locks per process`);
    const client = new SanlockClient(opts.addon);
    client.ensureLoaded();

    const helper = opts.helperPath ?? join(findPackageRoot(), 'dist', 'lock-exec.js');
    const helperArgs: string[] = [helper, '--control-fd', String(CONTROL_FD)];
    if (opts.killPath) helperArgs.push('--killpath', opts.killPath.path, '--killpath-args', opts.killPath.args ?? '');
    if (opts.restrict && opts.restrict !== 'none') helperArgs.push('--restrict', opts.restrict);
    helperArgs.push('--', opts.command, ...(opts.args ?? []));
    const [i, o, e] = opts.stdio ?? ['inherit', 'inherit', 'inherit'];
    const child: ChildProcess = spawn(process.execPath, helperArgs, {
      stdio: [i, o, e, 'pipe'],
      env: opts.env ?? process.env,
      cwd: opts.cwd,
    });
    const control = new ControlChannel(child);
    const proc = new LockedProcess(child, client, opts.ownerName);
    try {
      const hello = await control.next(REGISTER_TIMEOUT_MS);
      if (hello.type !== 'registered') throw helperError(hello, 'registering with the sanlock daemon');
      if (requests.length > 0) await proc.acquire(requests);
      control.send('go');
      const after = await control.next(EXEC_TIMEOUT_MS);
      if (after.type !== 'exec') throw helperError(after, `starting ${opts.command}`);
      return proc;
    } catch (err) {
      control.send('abort');
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await proc.exited;
      throw err;
    } finally {
      control.close();
    }
  }

  /** How it ended, once it has. */
  get exit(): LockedProcessExit | undefined {
    return this.#exit;
  }

  /**
   * Acquires more locks for the running process (all or none).
   *
   * @throws MooringError LOCK_HELD, LOCK_VERSION_MISMATCH, LOCKSPACE_NOT_JOINED
   */
  async acquire(locks: Array<Lock | LockRequest>): Promise<void> {
    const requests = locks.map((l) => ('lock' in l ? l : { lock: l }));
    await acquireLocks(this.#client, { pid: this.pid }, requests, this.ownerName);
    for (const r of requests) {
      this.#held.set(key(r.lock.lockspace.name, r.lock.name), { lock: r.lock, shared: r.shared ?? false });
      this.#lockspaces.set(r.lock.lockspace.name, r.lock.lockspace);
    }
  }

  /** Releases `locks` (default all) held by the process. */
  async release(locks?: Lock[]): Promise<void> {
    if (locks === undefined) {
      await this.#client.call('release', `all locks of pid ${this.pid}`, (s) => s.release({ pid: this.pid }, 0x1 /* REL_ALL */));
      this.#held.clear();
      return;
    }
    if (locks.length === 0) return;
    const resources = locks.map((l) => l.resource({ shared: this.#held.get(key(l.lockspace.name, l.name))?.shared }));
    await this.#client.call('release', `locks of pid ${this.pid}`, (s) => s.release({ pid: this.pid }, 0, resources));
    for (const l of locks) this.#held.delete(key(l.lockspace.name, l.name));
  }

  /** The leases the process holds now, with their versions (sanlock_inquire). */
  async inquire(): Promise<HeldLease[]> {
    return (await this.#inquireState()).leases;
  }

  async #inquireState(): Promise<LockHandover> {
    const r = await this.#client.call('inquire', `pid ${this.pid}`, (s) => s.inquire({ pid: this.pid }));
    if (r.count === 0 || r.state === '') return { state: '', leases: [] };
    const parsed = this.#client.native.stateToArgs(r.state);
    if (parsed.rv < 0 || !parsed.resources)
      throw new MooringError('IO_ERROR', `cannot parse sanlock state ${JSON.stringify(r.state)} (rv ${parsed.rv})`);
    return { state: r.state, leases: parsed.resources.map(toHeldLease) };
  }

  /**
   * Migration source, at switch-over (vCPUs stopped): reads the leases with their versions
   * and releases them all. The VM must not write to its disks after this. Hand the result
   * to the target's {@link takeOver}; keep it for a rollback.
   */
  async handOver(): Promise<LockHandover> {
    const handover = await this.#inquireState();
    if (handover.leases.length > 0) {
      await this.#client.call('release', `locks of pid ${this.pid} for hand-over`, (s) =>
        s.release({ pid: this.pid }, 0x1 /* REL_ALL */),
      );
    }
    this.#held.clear();
    return handover;
  }

  /**
   * Migration target before resuming vCPUs (or the source on rollback): acquires the
   * handed-over leases only if their versions are unchanged. All or none.
   *
   * @param handover - from the source's {@link handOver}
   * @param lockspaces - the lockspaces the leases live in (opened on this host), by name
   * @throws MooringError LOCK_VERSION_MISMATCH when any host acquired a lease since the
   *   hand-over (keep the VM paused); LOCK_HELD when one is held now
   */
  async takeOver(handover: LockHandover, lockspaces: Lockspace[]): Promise<void> {
    checkHandover(handover);
    if (handover.leases.length === 0) return;
    const byName = new Map(lockspaces.map((l) => [l.name, l]));
    const resources: NativeSanlockResource[] = handover.leases.map((l) => {
      if (!byName.has(l.lockspace))
        throw new MooringError('INVALID_ARGUMENT', `lease ${l.lockspace}:${l.name} is in a lockspace not given`);
      return {
        lockspace: l.lockspace,
        name: l.name,
        disks: l.disks,
        // Exclusive leases carry the version to check; shared ones have none to compare.
        ...(l.shared ? { flags: RES_SHARED } : { flags: 0x1 /* RES_LVER */, lver: l.version }),
      };
    });
    await this.#client.call(
      'acquire',
      `handed-over locks for pid ${this.pid}`,
      (s) => s.acquire({ pid: this.pid }, 0, resources, this.ownerName),
      { leases: handover.leases.map((l) => ({ lockspace: l.lockspace, lock: l.name, version: l.version })) },
    );
    for (const l of handover.leases) this.#lockspaces.set(l.lockspace, byName.get(l.lockspace)!);
  }

  /** Sends `signal` to the process. */
  kill(signal: NodeJS.Signals = 'SIGTERM'): void {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.#killedByUs = true;
      this.child.kill(signal);
    }
  }

  // After the process ended: did sanlock stop it? It did if it was signalled (or killed
  // through a kill path) while one of its lockspaces was lost on this host.
  async #sanlockReport(code: number | null, signal: NodeJS.Signals | null): Promise<LockedProcessExit['stoppedBySanlock']> {
    if (this.#lockspaces.size === 0 || this.#killedByUs) return undefined;
    if (signal === null && code === 0) return undefined;
    const lost: string[] = [];
    let reason: HolderKilledEvent['reason'] | undefined;
    const deadline = Date.now() + KILL_REPORT_WAIT_MS;
    for (;;) {
      for (const ls of this.#lockspaces.values()) {
        if (lost.includes(ls.name)) continue;
        const why = await ls.checkLost();
        if (why) {
          lost.push(ls.name);
          reason ??= why;
        }
      }
      if (reason || Date.now() >= deadline) break;
      await new Promise((r) => setTimeout(r, KILL_REPORT_POLL_MS));
    }
    if (!reason) return undefined;
    const locks = [...this.#held.values()].filter((h) => lost.includes(h.lock.lockspace.name)).map((h) => h.lock.name);
    for (const name of lost) {
      const ls = this.#lockspaces.get(name)!;
      safeEmit(ls, 'holder-killed', {
        lockspace: name,
        pid: this.pid,
        ownerName: this.ownerName,
        locks: [...this.#held.values()].filter((h) => h.lock.lockspace.name === name).map((h) => h.lock.name),
        signal,
        exitCode: code,
        reason,
      } satisfies HolderKilledEvent);
    }
    return { lockspace: lost[0]!, lockspaces: lost, locks, reason };
  }
}

function key(lockspace: string, name: string): string {
  return `${lockspace}\0${name}`;
}

function toHeldLease(r: Required<NativeSanlockResource>): HeldLease {
  const shared = (r.flags & RES_SHARED) !== 0;
  return { lockspace: r.lockspace, name: r.name, version: shared ? 0 : r.lver, shared, disks: r.disks };
}

function checkHandover(h: LockHandover): void {
  const ok =
    typeof h === 'object' &&
    h !== null &&
    Array.isArray(h.leases) &&
    h.leases.length <= LOCKS_PER_PROCESS_MAX &&
    h.leases.every(
      (l) =>
        typeof l.lockspace === 'string' &&
        typeof l.name === 'string' &&
        Number.isSafeInteger(l.version) &&
        l.version >= 0 &&
        Array.isArray(l.disks) &&
        l.disks.length >= 1 &&
        l.disks.every((d) => typeof d.path === 'string' && Number.isSafeInteger(d.offset)),
    );
  if (!ok) throw new MooringError('INVALID_ARGUMENT', 'not a lock hand-over (from LockedProcess.handOver)');
}

/** A message from the helper on its control channel. */
type HelperMessage =
  | { type: 'registered'; pid: number }
  | { type: 'exec' }
  | { type: 'error'; code: string; message: string }
  | { type: 'closed' };

function helperError(m: HelperMessage, doing: string): MooringError {
  if (m.type === 'error')
    return new MooringError(isMooringErrorCode(m.code) ? m.code : 'IO_ERROR', `lock-exec helper, ${doing}: ${m.message}`);
  return new MooringError('IO_ERROR', `lock-exec helper exited while ${doing}`);
}

// Line-delimited JSON over the helper's fd 3. The exec closes the helper's end (it is
// close-on-exec), so "exec" is reported as EOF after "go"; an exec failure arrives as an
// error line first.
class ControlChannel {
  readonly #in: Readable;
  readonly #out: Writable;
  #buf = '';
  readonly #queue: HelperMessage[] = [];
  #waiter: ((m: HelperMessage) => void) | undefined;
  #sentGo = false;
  #ended = false;

  constructor(child: ChildProcess) {
    const stream = child.stdio[CONTROL_FD] as unknown as Readable & Writable;
    this.#in = stream;
    this.#out = stream;
    stream.setEncoding('utf8');
    stream.on('data', (d: string) => {
      this.#buf += d;
      if (this.#buf.length > CONTROL_LINE_BYTES_MAX) {
        this.#push({ type: 'error', code: 'IO_ERROR', message: 'control message too long' });
        this.#buf = '';
      }
      let nl: number;
      while ((nl = this.#buf.indexOf('\n')) >= 0) {
        const line = this.#buf.slice(0, nl);
        this.#buf = this.#buf.slice(nl + 1);
        try {
          this.#push(JSON.parse(line) as HelperMessage);
        } catch {
          this.#push({ type: 'error', code: 'IO_ERROR', message: `bad control line ${JSON.stringify(line.slice(0, 200))}` });
        }
      }
    });
    const end = () => {
      if (this.#ended) return;
      this.#ended = true;
      this.#push(this.#sentGo ? { type: 'exec' } : { type: 'closed' });
    };
    stream.on('end', end);
    stream.on('close', end);
    stream.on('error', () => undefined);
    child.once('exit', () => setImmediate(end));
  }

  #push(m: HelperMessage): void {
    const w = this.#waiter;
    if (w) {
      this.#waiter = undefined;
      w(m);
    } else this.#queue.push(m);
  }

  next(timeoutMs: number): Promise<HelperMessage> {
    const m = this.#queue.shift();
    if (m) return Promise.resolve(m);
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.#waiter = undefined;
        resolve({ type: 'error', code: 'IO_ERROR', message: `no answer within ${timeoutMs} ms` });
      }, timeoutMs);
      this.#waiter = (msg) => {
        clearTimeout(t);
        resolve(msg);
      };
    });
  }

  send(word: 'go' | 'abort'): void {
    if (word === 'go') this.#sentGo = true;
    if (!this.#out.writableEnded && !this.#out.destroyed) this.#out.write(`${word}\n`);
  }

  close(): void {
    this.#in.removeAllListeners('data');
    this.#in.on('error', () => undefined);
    this.#in.destroy();
  }
}
