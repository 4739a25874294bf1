/**
 * The scale step of `mooring bench` (`--scale`, issue 21): four curves, each growing one
 * thing on this machine: volumes per host, volumes per cluster, snapshot chain depth,
 * extents. Each curve runs in its own scratch directory with its own data-engine processes;
 * a curve that fails to start is recorded and the next one runs.
 */
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';

import type { ScaleCurveId } from '../options.js';
import type { TargetContext } from '../targets.js';
import { errorCode, type ScaleCurve } from './curve.js';
import { measureChainCurve } from './chains.js';
import { measureExtentCurve } from './extents.js';
import { measureClusterCurve, measureHostCurve } from './volumes.js';

export type { ScaleCurve, ScalePoint } from './curve.js';

/** The sizes of a full run (issue 21). */
export const SCALE_VOLUMES = [10, 100, 1000] as const;
export const SCALE_DEPTHS = [0, 100, 1000] as const;
export const SCALE_EXTENTS = [10_000, 100_000, 1_000_000] as const;
/** Chained and flat volumes' size (written whole before the first snapshot). */
const CHAIN_AREA_BYTES = 64 * 1024 ** 2;
const IDLE_CPU_SEC = 10;
const QUICK_IDLE_CPU_SEC = 3;

export interface ScaleSettings {
  /** Only the first two sizes of each curve. */
  quick: boolean;
  /** Largest size of any curve (undefined = no cap): larger sizes are left out, the cap itself is measured instead. */
  max: number | undefined;
  /** fio seconds per read measurement of the chain curve. */
  runtimeSec: number;
  /** One size of one curve may take this long before it is recorded as BENCH_TIMEOUT. */
  stepTimeoutSec: number;
  /** The curves to run (`--scale-curves`). */
  curves: readonly ScaleCurveId[];
}

export interface ScaleResults {
  curves: ScaleCurve[];
  /** Curves that could not be measured at all (their hosts did not start, say). */
  failures: Array<{ curve: string; code: string; message: string }>;
  /** The open-file limit of the bench process (its data engines inherit it). */
  openFileLimit: string;
  settings: ScaleSettings;
}

/** The sizes a curve runs at under the settings: `--quick` keeps two, `--scale-max N` caps them at N. */
export function scaleSizes(all: readonly number[], settings: Pick<ScaleSettings, 'quick' | 'max'>): number[] {
  const sizes = settings.quick ? all.slice(0, 2) : [...all];
  if (settings.max === undefined) return sizes;
  const max = settings.max;
  const kept = sizes.filter((n) => n <= max);
  if (max < sizes.at(-1)! && !kept.includes(max)) kept.push(max);
  return kept;
}

function openFileLimit(): string {
  try {
    // Linux: the soft limit is the 4th field of "Max open files" in /proc/self/limits.
    const line = readFileSync('/proc/self/limits', 'utf8').split('\n').find((l) => l.startsWith('Max open files'));
    return line?.split(/\s{2,}/)[1] ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

/** Runs the four curves; failures are recorded in the results, never thrown (except an interrupt). */
export async function measureScale(ctx: TargetContext, settings: ScaleSettings): Promise<ScaleResults> {
  const volumes = scaleSizes(SCALE_VOLUMES, settings);
  const stepTimeoutMs = settings.stepTimeoutSec * 1000;
  // In SCALE_CURVE_IDS's order: the cluster curve last.
  const steps: Array<[ScaleCurveId, (c: TargetContext) => Promise<ScaleCurve>]> = [
    ['host', (c) => measureHostCurve(c, { sizes: volumes, stepTimeoutMs, idleCpuSec: 0 })],
    ['depth', (c) => measureChainCurve(c, { depths: scaleSizes(SCALE_DEPTHS, settings), stepTimeoutMs, areaBytes: CHAIN_AREA_BYTES, runtimeSec: settings.runtimeSec })],
    ['extents', (c) => measureExtentCurve(c, { sizes: scaleSizes(SCALE_EXTENTS, settings), stepTimeoutMs })],
    ['cluster', (c) => measureClusterCurve(c, { sizes: volumes, stepTimeoutMs, idleCpuSec: settings.quick ? QUICK_IDLE_CPU_SEC : IDLE_CPU_SEC })],
  ];
  const results: ScaleResults = { curves: [], failures: [], openFileLimit: openFileLimit(), settings };
  for (const [id, run] of steps) {
    if (!settings.curves.includes(id)) continue;
    const dir = join(ctx.dir, id);
    mkdirSync(dir);
    ctx.log(`  [scale ${id}]`);
    try {
      results.curves.push(await run({ ...ctx, dir }));
    } catch (err) {
      if (ctx.abort.aborted) throw err;
      const message = err instanceof Error ? err.message : String(err);
      results.failures.push({ curve: id, code: errorCode(err), message });
      ctx.log(`  scale ${id}: FAILED: ${message}`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
  return results;
}
