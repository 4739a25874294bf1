/**
 * A scale curve: one thing grown step by step (volumes, chain depth, extents), a row of
 * figures measured at each size. A size that fails (EMFILE, a timeout, a refused create) is
 * recorded with its error code and ends the curve: the larger sizes would fail the same way.
 */
import { readdirSync } from 'node:fs';

import { spread } from '../migration.js';
import { BenchError, readProcStats } from '../processes.js';

/** Figures measured at one size; undefined = not measured at this size. */
export type ScaleFigures = Record<string, number | undefined>;

/** One size of a curve: its figures, or why it failed. */
export interface ScalePoint {
  size: number;
  figures: ScaleFigures;
  /** Set when the size failed: the error's code (MooringError, BenchError, errno) and message. */
  failure?: { code: string; message: string };
  /** Wall time spent growing to this size and measuring it, seconds. */
  wallSec: number;
}

/** A column of a curve: its key in ScalePoint.figures, its heading and unit. */
export interface ScaleColumn {
  key: string;
  label: string;
  /** Digits after the decimal point in the report. */
  digits: number;
}

/** Columns from [key, label, digits] triples. */
export function columns(...cols: Array<[key: string, label: string, digits: number]>): ScaleColumn[] {
  return cols.map(([key, label, digits]) => ({ key, label, digits }));
}

export interface ScaleCurve {
  id: 'host' | 'cluster' | 'depth' | 'extents';
  title: string;
  /** What the size counts (volumes, layers, extents). */
  sizeLabel: string;
  /** How it was measured, one paragraph for the report. */
  method: string;
  columns: ScaleColumn[];
  points: ScalePoint[];
}

/** The code a failure is recorded under: a MooringError's or BenchError's code, an errno (EMFILE), or ERROR. */
export function errorCode(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown } | null;
  if (e && typeof e.code === 'string' && e.code !== '') {
    // An IO_ERROR that says EMFILE is the one worth seeing.
    const m = typeof e.message === 'string' ? /\b(EMFILE|ENFILE|ENOMEM|EAGAIN)\b/.exec(e.message) : null;
    return m && e.code !== m[1] ? `${e.code} (${m[1]})` : e.code;
  }
  return 'ERROR';
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Rejects with BENCH_TIMEOUT when `p` takes longer than `ms` (the work itself is abandoned, not stopped). */
export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new BenchError('BENCH_TIMEOUT', `${what} took longer than ${Math.round(ms / 1000)} s`)), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Grows a curve through `sizes` in order: `step(size, previous)` grows from the previous size
 * and returns the figures. A failed or timed-out size is recorded and ends the curve.
 */
export async function growCurve(
  sizes: readonly number[],
  stepTimeoutMs: number,
  log: (line: string) => void,
  abort: AbortSignal,
  step: (size: number, previous: number) => Promise<ScaleFigures>,
): Promise<ScalePoint[]> {
  const points: ScalePoint[] = [];
  let previous = 0;
  for (const size of sizes) {
    const t0 = Date.now();
    try {
      const figures = await withTimeout(step(size, previous), stepTimeoutMs, `growing to ${size}`);
      points.push({ size, figures, wallSec: (Date.now() - t0) / 1000 });
      log(`    ${size}: ${Object.entries(figures).map(([k, v]) => `${k} ${v === undefined ? '–' : +v.toFixed(2)}`).join(', ')} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    } catch (err) {
      if (abort.aborted) throw err;
      const failure = { code: errorCode(err), message: errorText(err) };
      points.push({ size, figures: {}, failure, wallSec: (Date.now() - t0) / 1000 });
      log(`    ${size}: FAILED ${failure.code}: ${failure.message}`);
      break;
    }
    previous = size;
  }
  return points;
}

/** Milliseconds `fn` takes, median over `runs` calls. */
export async function timeMs(fn: () => Promise<unknown>, runs = 1): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await fn();
    times.push(performance.now() - t0);
  }
  return spread(times).median;
}

/** Threads, open fds and resident set of a live process (from /proc). */
export function processFootprint(pid: number): { threads: number; fds: number; rssMiB: number } {
  const st = readProcStats(pid);
  if (!st) throw new BenchError('BENCH_TARGET_FAILED', `process ${pid} is gone`);
  return {
    threads: readdirSync(`/proc/${pid}/task`).length,
    fds: readdirSync(`/proc/${pid}/fd`).length,
    rssMiB: st.rssBytes / 1024 ** 2,
  };
}
