// One opener per volume directory. Opening a volume claims a new writer epoch, which fences
// whoever had it open before; the lock turns that accident (e.g. `mooring info` while
// `mooring serve` runs) into a BUSY error instead.
//
// DIR/volume.lock holds {pid, hostname, acquiredMs}. A lock whose process is gone (crash,
// SIGKILL) is stale and taken over; a lock from another host cannot be checked and is
// always BUSY.
import { unlinkSync } from 'node:fs';
import { open, readFile, unlink } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';

import { MooringError, toMooringError } from '../errors.js';
import { PRIVATE_FILE_MODE, readFileLimited } from '../util/files.js';

/** The lock file's name inside the volume directory. */
export const VOLUME_LOCK_FILE = 'volume.lock';
/** Attempts to take over a stale lock before giving up (another opener may race us). */
const LOCK_ATTEMPTS_MAX = 3;
/** Largest lock file read. */
const LOCK_FILE_BYTES_MAX = 4096;

// Lock files held by this process, removed on exit even without close().
const heldLocks = new Set<string>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once('exit', () => {
    for (const file of heldLocks) {
      try {
        unlinkSync(file);
      } catch {
        // Best effort: a stale lock is detected and taken over on the next open.
      }
    }
  });
}

interface LockOwner {
  pid: number;
  hostname: string;
  acquiredMs: number;
  /** Process start time (clock ticks since boot, /proc/PID/stat field 22): tells a reused pid apart. */
  startTicks?: number;
}

// State and start time of a process from /proc/PID/stat, or undefined when it is gone.
// The command name (field 2) may hold spaces and parentheses, so parse after the last ')'.
async function procStat(pid: number): Promise<{ state: string; startTicks: number } | undefined> {
  try {
    const text = await readFile(`/proc/${pid}/stat`, 'utf8');
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
    // fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    return { state: fields[0] ?? '?', startTicks: Number(fields[19]) };
  } catch {
    return undefined;
  }
}

async function processAlive(owner: LockOwner): Promise<boolean> {
  const st = await procStat(owner.pid);
  if (st) {
    // A zombie (killed, not yet reaped by its parent) holds nothing any more.
    if (st.state === 'Z' || st.state === 'X') return false;
    return owner.startTicks === undefined || !Number.isFinite(st.startTicks) || st.startTicks === owner.startTicks;
  }
  try {
    process.kill(owner.pid, 0);
    return true;
  } catch (err) {
    return (err as { code?: string }).code === 'EPERM';
  }
}

async function readOwner(file: string): Promise<LockOwner | undefined> {
  try {
    const text = await readFileLimited(file, LOCK_FILE_BYTES_MAX);
    const v = JSON.parse(text) as Partial<LockOwner>;
    if (typeof v.pid === 'number' && Number.isInteger(v.pid) && v.pid > 0 && typeof v.hostname === 'string') {
      return {
        pid: v.pid,
        hostname: v.hostname,
        acquiredMs: typeof v.acquiredMs === 'number' ? v.acquiredMs : 0,
        ...(typeof v.startTicks === 'number' ? { startTicks: v.startTicks } : {}),
      };
    }
  } catch {
    // Unreadable or half-written: treated as stale below.
  }
  return undefined;
}

/** Options of {@link VolumeLock.acquire} for directories other than a volume's. */
export interface DirLockOptions {
  /** Lock file name inside the directory (default {@link VOLUME_LOCK_FILE}). */
  file?: string;
  /** What the directory is, for the BUSY message (default `volume`). */
  what?: string;
  /** What to do about a BUSY lock, for the message (default: stop `mooring serve`). */
  hint?: string;
}

/** An exclusive claim on a volume directory (or, with {@link DirLockOptions}, another directory) by this process. */
export class VolumeLock {
  readonly #file: string;
  #released = false;

  private constructor(file: string) {
    this.#file = file;
  }

  /**
   * Takes DIR/volume.lock (or DIR/`options.file`).
   *
   * @throws MooringError BUSY when a live process (or another host) holds it
   */
  static async acquire(dir: string, options: DirLockOptions = {}): Promise<VolumeLock> {
    const file = join(dir, options.file ?? VOLUME_LOCK_FILE);
    const what = options.what ?? 'volume';
    const hint = options.hint ?? 'close it (stop `mooring serve`) first';
    const self = await procStat(process.pid);
    const me: LockOwner = {
      pid: process.pid,
      hostname: hostname(),
      acquiredMs: Date.now(),
      ...(self && Number.isFinite(self.startTicks) ? { startTicks: self.startTicks } : {}),
    };
    for (let attempt = 0; attempt < LOCK_ATTEMPTS_MAX; attempt++) {
      try {
        const fh = await open(file, 'wx', PRIVATE_FILE_MODE);
        try {
          await fh.writeFile(`${JSON.stringify(me)}\n`);
        } finally {
          await fh.close();
        }
        heldLocks.add(file);
        installExitHook();
        return new VolumeLock(file);
      } catch (err) {
        if ((err as { code?: string }).code !== 'EEXIST') throw toMooringError(err, `locking ${dir}`);
      }
      const owner = await readOwner(file);
      if (owner) {
        const here = owner.hostname === me.hostname;
        const busy = !here || (owner.pid === process.pid ? heldLocks.has(file) : await processAlive(owner));
        if (busy) {
          throw new MooringError(
            'BUSY',
            `${what} ${dir} is open in process ${owner.pid} on ${owner.hostname} (since ${new Date(owner.acquiredMs).toISOString()}); ` +
              `${hint}, or remove the stale lock file if that host is gone`,
            { details: { dir, pid: owner.pid, hostname: owner.hostname } },
          );
        }
      }
      // Stale: its owner died. Remove it and try again.
      await unlink(file).catch(() => undefined);
    }
    throw new MooringError('BUSY', `could not lock ${dir}: another opener keeps racing for ${file}`);
  }

  /** Removes the lock file. Idempotent. */
  async release(): Promise<void> {
    if (this.#released) return;
    this.#released = true;
    heldLocks.delete(this.#file);
    await unlink(this.#file).catch(() => undefined);
  }
}
