/**
 * Child processes of the benchmark: every one is tracked so that a failure, Ctrl-C or an
 * unexpected exit of the bench itself never leaves a server or fio behind.
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { readFileSync } from 'node:fs';

import { sleepUnlessAborted } from '../util/async.js';

/** Raised when the run is interrupted (SIGINT/SIGTERM); the CLI exits 130. */
export class BenchInterrupted extends Error {
  override readonly name = 'BenchInterrupted';
  constructor(signal: string) {
    super(`interrupted by ${signal}`);
  }
}

/** A failure the report should show as `mooring: <code>: message`. */
export class BenchError extends Error {
  override readonly name = 'BenchError';
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** Keeps the tail of a stream for error messages without growing without bound. */
export class TailBuffer {
  private text = '';
  constructor(private readonly limitChars: number) {}
  push(chunk: string): void {
    this.text += chunk;
    if (this.text.length > this.limitChars * 2) this.text = this.text.slice(-this.limitChars);
  }
  toString(): string {
    return this.text.slice(-this.limitChars);
  }
}

/** Error-message tails: enough to show a stack trace or a fio complaint. */
const STDERR_TAIL_CHARS = 4000;
/** fio's JSON for one group-reported job is a few tens of KiB. */
const STDOUT_LIMIT_CHARS = 4 * 1024 * 1024;

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** The child was killed because it outlived `timeoutMs`. */
  timedOut: boolean;
}

export interface RunOptions extends SpawnOptions {
  /** Kill the child (SIGKILL) after this long; undefined = no limit. */
  timeoutMs?: number;
}

/** Tracks children; `killAll` is safe to call from signal and exit handlers. */
export class ProcessTracker {
  private readonly live = new Set<ChildProcess>();

  /** Spawns and tracks a child; spawn failures (e.g. ENOENT) surface as its `error` event. */
  spawn(command: string, args: readonly string[], options: SpawnOptions = {}): ChildProcess {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], ...options });
    this.live.add(child);
    child.once('exit', () => this.live.delete(child));
    child.once('error', () => this.live.delete(child));
    return child;
  }

  /** Sends `signal` to every live child (synchronous: usable in a process 'exit' handler). */
  killAll(signal: NodeJS.Signals): void {
    for (const child of this.live) {
      try {
        child.kill(signal);
      } catch {
        // Already gone.
      }
    }
  }

  get size(): number {
    return this.live.size;
  }

  /** Runs a command to completion, collecting output; rejects on abort (the child is killed). */
  run(command: string, args: readonly string[], abort: AbortSignal, options: RunOptions = {}): Promise<RunResult> {
    const { timeoutMs, ...spawnOptions } = options;
    return new Promise((resolve, reject) => {
      if (abort.aborted) {
        reject(abort.reason);
        return;
      }
      const child = this.spawn(command, args, spawnOptions);
      let timedOut = false;
      const timer =
        timeoutMs === undefined
          ? undefined
          : setTimeout(() => {
              timedOut = true;
              child.kill('SIGKILL');
            }, timeoutMs);
      let stdout = '';
      const stderr = new TailBuffer(STDERR_TAIL_CHARS);
      child.stdout?.setEncoding('utf8').on('data', (d: string) => {
        if (stdout.length < STDOUT_LIMIT_CHARS) stdout += d;
      });
      child.stderr?.setEncoding('utf8').on('data', (d: string) => stderr.push(d));
      const onAbort = (): void => {
        child.kill('SIGKILL');
      };
      abort.addEventListener('abort', onAbort, { once: true });
      child.once('error', (err: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        abort.removeEventListener('abort', onAbort);
        reject(
          err.code === 'ENOENT'
            ? new BenchError('BENCH_TOOL_MISSING', `cannot run '${command}': not found on PATH`)
            : new BenchError('BENCH_CHILD_FAILED', `cannot run '${command}': ${err.message}`),
        );
      });
      child.once('close', (code, signal) => {
        clearTimeout(timer);
        abort.removeEventListener('abort', onAbort);
        if (abort.aborted) reject(abort.reason);
        else resolve({ code, signal, stdout, stderr: stderr.toString(), timedOut });
      });
    });
  }
}

/** Resolves when `child` has exited (immediately if it already has). */
export function waitForExit(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.once('error', () => resolve());
  });
}

/** Waits up to `timeoutMs` for exit; returns false on timeout. */
export async function waitForExitWithin(child: ChildProcess, timeoutMs: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(false), timeoutMs);
  });
  try {
    return await Promise.race([waitForExit(child).then(() => true), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** SIGTERM, then SIGKILL after `graceMs`: servers get the chance to drain and flush. */
export async function stopChild(child: ChildProcess, graceMs: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  if (await waitForExitWithin(child, graceMs)) return;
  child.kill('SIGKILL');
  await waitForExitWithin(child, graceMs);
}

/** Resolves after `ms`, or rejects with the abort reason. */
export const sleep = sleepUnlessAborted;

/** Memory and CPU counters of a live process, from /proc. */
export interface ProcStats {
  /** Peak resident set (VmHWM), bytes. */
  peakRssBytes: number;
  /** Current resident set (VmRSS), bytes. */
  rssBytes: number;
  threads: number;
  /** user + system CPU time, seconds. */
  cpuSec: number;
}

/** Linux USER_HZ: /proc/PID/stat counts CPU time in these ticks (100 on every Linux ABI in use). */
const CLOCK_TICKS_PER_SEC = 100;

/** Reads /proc/PID/status and /proc/PID/stat; undefined if the process is gone. */
export function readProcStats(pid: number): ProcStats | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const field = (name: string): number => {
      const m = new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status);
      return m ? Number(m[1]) : 0;
    };
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may contain spaces; fields after the closing ')' are fixed.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const utime = Number(rest[11]);
    const stime = Number(rest[12]);
    return {
      peakRssBytes: field('VmHWM') * 1024,
      rssBytes: field('VmRSS') * 1024,
      threads: field('Threads'),
      cpuSec: (utime + stime) / CLOCK_TICKS_PER_SEC,
    };
  } catch {
    return undefined;
  }
}
