/**
 * Cost per I/O of a target's server processes (issue 16), and the page-cache state every
 * target meets before each of its runs.
 *
 * CPU: user+system time of every server process from /proc/PID/stat (it includes threads
 * that have exited). Syscalls and context switches: one `perf stat -e
 * raw_syscalls:sys_enter,context-switches -p PIDS`, started disabled and switched on and off
 * through its control FIFO, so it counts exactly the measured window; perf follows threads
 * created during the window and keeps the counts of threads that exit. Without a working
 * perf (not root, no tracefs) those two stay unmeasured and the report says so.
 */
import { open, readdir, type FileHandle } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { BenchError, readProcStats, waitForExitWithin, type ProcessTracker } from './processes.js';
import type { ServerProcess } from './targets.js';

/** Counts over one window, summed over the processes; per process for CPU. */
export interface CostWindow {
  /** CPU seconds per process, in `processes` order. */
  cpuSec: number[];
  /** undefined when perf is unavailable or failed in this window. */
  syscalls: number | undefined;
  switches: number | undefined;
}

/** Cost per I/O of one run, summed over all server processes. */
export interface IoCost {
  ios: number;
  cpuUsPerIo: number;
  /** CPU µs per I/O of each server process, named. */
  perProcess: Array<{ name: string; cpuUsPerIo: number }>;
  syscallsPerIo: number | undefined;
  switchesPerIo: number | undefined;
}

/** Turns a window's counts into per-I/O figures. */
export function costPerIo(processes: readonly ServerProcess[], w: CostWindow, ios: number): IoCost | undefined {
  if (ios <= 0 || processes.length === 0) return undefined;
  const total = w.cpuSec.reduce((a, b) => a + b, 0);
  return {
    ios,
    cpuUsPerIo: (total * 1e6) / ios,
    perProcess: processes.map((p, i) => ({ name: p.name, cpuUsPerIo: ((w.cpuSec[i] ?? 0) * 1e6) / ios })),
    syscallsPerIo: w.syscalls === undefined ? undefined : w.syscalls / ios,
    switchesPerIo: w.switches === undefined ? undefined : w.switches / ios,
  };
}

const PERF_EVENTS = ['raw_syscalls:sys_enter', 'context-switches'];
/** perf answers 'ack' on its ack FIFO once it has (dis)abled its counters. */
const PERF_ACK_TIMEOUT_MS = 30_000;
const PERF_STOP_GRACE_MS = 10_000;

/** Whether `perf stat` can count syscalls here (root or a permissive perf_event_paranoid, tracefs). */
export async function perfWorks(tracker: ProcessTracker, abort: AbortSignal): Promise<{ ok: boolean; why: string }> {
  const r = await tracker
    .run('perf', ['stat', '-x,', '-e', PERF_EVENTS.join(','), '--', 'true'], abort, { timeoutMs: 30_000 })
    .catch((err: unknown) => {
      if (abort.aborted) throw err;
      return undefined;
    });
  if (!r) return { ok: false, why: 'perf is not installed (apt-get install linux-perf)' };
  const counts = parsePerfCsv(r.stderr);
  if (r.code !== 0 || counts.syscalls === undefined) return { ok: false, why: `perf stat cannot count ${PERF_EVENTS[0]}: ${r.stderr.trim().split('\n').slice(-2).join(' / ')}` };
  return { ok: true, why: '' };
}

/** Reads perf stat's -x, output: the first field is the count ('<not counted>' = no events ran). */
export function parsePerfCsv(text: string): { syscalls: number | undefined; switches: number | undefined } {
  const value = (event: string): number | undefined => {
    const line = text.split('\n').find((l) => l.split(',')[2] === event);
    if (!line) return undefined;
    const first = line.split(',')[0]!;
    if (first === '<not counted>') return 0;
    const n = Number(first);
    return Number.isFinite(n) ? n : undefined;
  };
  return { syscalls: value(PERF_EVENTS[0]!), switches: value(PERF_EVENTS[1]!) };
}

function cpuSecOf(processes: readonly ServerProcess[]): number[] {
  return processes.map((p) => readProcStats(p.pid)?.cpuSec ?? NaN);
}

/**
 * One measured window over `processes`: `begin()` at the start, `end()` at the end. With
 * `perf` false only CPU is counted.
 */
export class CostProbe {
  private cpuBefore: number[] = [];
  private counting = false;
  private constructor(
    private readonly processes: readonly ServerProcess[],
    private readonly perf: { child: ReturnType<ProcessTracker['spawn']>; ctl: FileHandle; ack: FileHandle; out: string } | undefined,
  ) {}

  /** Starts perf (disabled) on the processes; `dir` holds its FIFOs and output. */
  static async attach(processes: readonly ServerProcess[], usePerf: boolean, dir: string, tracker: ProcessTracker, abort: AbortSignal): Promise<CostProbe> {
    if (!usePerf || processes.length === 0) return new CostProbe(processes, undefined);
    const ctlPath = join(dir, 'perf.ctl');
    const ackPath = join(dir, 'perf.ack');
    const out = join(dir, 'perf.csv');
    for (const f of [ctlPath, ackPath]) {
      const r = await tracker.run('mkfifo', [f], abort);
      if (r.code !== 0) throw new BenchError('BENCH_CHILD_FAILED', `mkfifo ${f}: ${r.stderr}`);
    }
    // O_RDWR on a FIFO never blocks on Linux; perf opens both the same way.
    const ctl = await open(ctlPath, 'r+');
    const ack = await open(ackPath, 'r+');
    const args = ['stat', '-x,', '-o', out, '--control', `fifo:${ctlPath},${ackPath}`, '-D', '-1', '-e', PERF_EVENTS.join(','), '-p', processes.map((p) => p.pid).join(',')];
    const child = tracker.spawn('perf', args);
    child.stdout?.resume();
    child.stderr?.resume();
    return new CostProbe(processes, { child, ctl, ack, out });
  }

  private async command(word: 'enable' | 'disable'): Promise<boolean> {
    const p = this.perf!;
    await p.ctl.write(`${word}\n`);
    const buf = Buffer.alloc(64);
    const read = p.ack.read(buf, 0, buf.length, null).then((r) => buf.subarray(0, r.bytesRead).toString('latin1').includes('ack'));
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), PERF_ACK_TIMEOUT_MS);
    });
    try {
      return await Promise.race([read, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Starts the window: CPU snapshot, perf counters on (a perf that does not answer leaves syscalls and switches unmeasured). */
  async begin(): Promise<void> {
    this.cpuBefore = cpuSecOf(this.processes);
    this.counting = this.perf !== undefined && (await this.command('enable'));
  }

  /** Ends the window and returns its counts; perf exits. */
  async end(): Promise<CostWindow> {
    const counted = this.counting && (await this.command('disable'));
    const cpuAfter = cpuSecOf(this.processes);
    const counts = await this.detach();
    return { cpuSec: cpuAfter.map((a, i) => a - this.cpuBefore[i]!), ...(counted ? counts : { syscalls: undefined, switches: undefined }) };
  }

  /** Stops perf (SIGINT makes it print its counts) and reads them; safe to call twice. */
  async detach(): Promise<{ syscalls: number | undefined; switches: number | undefined }> {
    const p = this.perf;
    if (!p) return { syscalls: undefined, switches: undefined };
    if (p.child.exitCode === null && p.child.signalCode === null) {
      p.child.kill('SIGINT');
      if (!(await waitForExitWithin(p.child, PERF_STOP_GRACE_MS))) p.child.kill('SIGKILL');
    }
    await p.ctl.close().catch(() => undefined);
    await p.ack.close().catch(() => undefined);
    try {
      return parsePerfCsv(readFileSync(p.out, 'utf8'));
    } catch {
      return { syscalls: undefined, switches: undefined };
    }
  }
}

/** Read size of the cache warm-up. */
const WARM_CHUNK_BYTES = 1024 * 1024;

/**
 * Reads every regular file under `dir` once, so that the target's data is in the page cache
 * when its run starts: this kind of VM pages out cache idle for about a minute (DAMON), and
 * targets wait minutes for their turn. Every target gets this right before each run.
 */
export async function warmPageCache(dir: string): Promise<number> {
  let bytes = 0;
  const buf = Buffer.allocUnsafe(WARM_CHUNK_BYTES);
  const walk = async (d: string): Promise<void> => {
    for (const e of await readdir(d, { withFileTypes: true })) {
      const path = join(d, e.name);
      if (e.isDirectory()) await walk(path);
      else if (e.isFile()) {
        const fh = await open(path, 'r');
        try {
          for (;;) {
            const { bytesRead } = await fh.read(buf, 0, buf.length, null);
            if (bytesRead === 0) break;
            bytes += bytesRead;
          }
        } finally {
          await fh.close();
        }
      }
    }
  };
  await walk(dir);
  return bytes;
}
