/**
 * Backing image reads: a Mooring volume (1 replica) whose chain sits on a qcow2
 * backing image, against `qemu-nbd -r` serving the same qcow2 file, read by fio over NBD.
 *
 * The image is `BACKING_IMAGE_BYTES_MAX` (or the test area, if smaller) of random data written into a fresh qcow2 by qemu-io
 * (so every read hits a real, allocated cluster); the replica above it is empty, so every
 * Mooring read goes through the native qcow2 reader. Both servers read the one file through
 * the page cache (qemu-nbd with its default writeback cache, as the qemu targets run). The
 * Mooring engine runs in this process (its I/O is on native threads; fio is a separate
 * process), qemu-nbd in its own.
 */
import { randomFillSync } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { LocalEngine } from '../engine/engine.js';
import { loadAddon } from '../native/load.js';
import { runFio, workloadJob, type FioFigures, type FioJob } from './fio.js';
import { BenchError } from './processes.js';
import { serveQemuNbd, type TargetContext } from './targets.js';
import { workloadById, type Workload } from './workloads.js';

/** Largest qcow2 image (and volume over it); a smaller --size makes it that size instead. */
export const BACKING_IMAGE_BYTES_MAX = 384 * 1024 ** 2;
/** qemu-io writes the random data in pieces of this size, from PATTERN_FILES different files. */
const PIECE_BYTES = 16 * 1024 ** 2;
const PATTERN_FILES = 4;
/** The workloads compared (4k random read judged by IOPS, 1M sequential read by MiB/s). */
export const BACKING_IMAGE_WORKLOAD_IDS = ['randread-4k-qd16-j1', 'read-1m-qd8'] as const;
/** qemu-io and qemu-img may take a while on a busy 2-core machine. */
const TOOL_TIMEOUT_MS = 600_000;

/** One workload on both servers (medians over the rounds). */
export interface BackingImageRow {
  workloadId: string;
  label: string;
  family: Workload['family'];
  mooring: FioFigures;
  qemu: FioFigures;
  /** Mooring / qemu-nbd: IOPS for 4k random, MiB/s for 1M sequential. Target ≥ 1.0. */
  ratio: number;
  /** That headline figure (mooring / qemu) in each round, in order: the spread shows the noise. */
  rounds: Array<[number, number]>;
}

export interface BackingImageReadResults {
  imageBytes: number;
  clusterBytes: number;
  rounds: number;
  rows: BackingImageRow[];
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** The run whose judged figure is the median (so its latencies belong to it). */
function medianRun(runs: FioFigures[], family: Workload['family']): FioFigures {
  const key = (f: FioFigures): number => (family === 'random-4k' ? f.iops : f.mibPerSec);
  const m = median(runs.map(key));
  return runs.reduce((best, f) => (Math.abs(key(f) - m) < Math.abs(key(best) - m) ? f : best));
}

/** Builds the qcow2 image: random data in every cluster, written by qemu-io. */
async function makeImage(ctx: TargetContext, path: string, imageBytes: number): Promise<void> {
  const r = await ctx.tracker.run('qemu-img', ['create', '-q', '-f', 'qcow2', path, String(imageBytes)], ctx.abort, { timeoutMs: TOOL_TIMEOUT_MS });
  if (r.code !== 0) throw new BenchError('BENCH_TARGET_FAILED', `qemu-img create failed (${r.code}): ${r.stderr}`);
  const patterns: string[] = [];
  for (let i = 0; i < PATTERN_FILES; i++) {
    const p = join(ctx.dir, `random-${i}.bin`);
    writeFileSync(p, randomFillSync(Buffer.allocUnsafe(PIECE_BYTES)));
    patterns.push(p);
  }
  const args = ['-f', 'qcow2'];
  for (let off = 0, i = 0; off < imageBytes; off += PIECE_BYTES, i++) {
    args.push('-c', `write -q -s ${patterns[i % PATTERN_FILES]!} ${off} ${Math.min(PIECE_BYTES, imageBytes - off)}`);
  }
  args.push(path);
  const w = await ctx.tracker.run('qemu-io', args, ctx.abort, { timeoutMs: TOOL_TIMEOUT_MS });
  if (w.code !== 0 || /error|failed/i.test(w.stdout)) {
    throw new BenchError('BENCH_TARGET_FAILED', `qemu-io failed (${w.code}): ${w.stdout}${w.stderr}`);
  }
}

/** Reads the whole volume once, so both servers start from a warm page cache. */
function warmJob(uri: string, imageBytes: number): FioJob {
  return {
    name: 'warm',
    endpoint: { kind: 'nbd', uri },
    options: ['rw=read', 'bs=1M', 'iodepth=8', 'numjobs=1', `size=${imageBytes}`],
    expectedSec: 600,
  };
}

/**
 * Runs the comparison: `rounds` passes, each running every workload on Mooring then on
 * qemu-nbd. Everything it started is stopped when it returns or throws.
 */
export async function measureBackingImageRead(ctx: TargetContext, runtimeSec: number, rampSec: number, rounds: number): Promise<BackingImageReadResults> {
  const imageBytes = Math.min(BACKING_IMAGE_BYTES_MAX, ctx.areaBytes);
  const diskDir = join(ctx.dir, 'disk');
  const imageDir = join(diskDir, 'backing-images', 'bench-image');
  mkdirSync(imageDir, { recursive: true });
  mkdirSync(join(diskDir, 'replicas'));
  const image = join(imageDir, 'image');
  await makeImage(ctx, image, imageBytes);
  ctx.log(`  image: ${imageBytes / 1024 ** 2} MiB qcow2 (64 KiB clusters) of random data, written by qemu-io`);

  const replica = join(diskDir, 'replicas', 'r0');
  await loadAddon().createReplica(replica, imageBytes, {
    backingImage: { dir: 'bench-image', format: 'qcow2', virtualSizeBytes: imageBytes },
  });
  let engine: LocalEngine | undefined;
  let qemu: Awaited<ReturnType<typeof serveQemuNbd>> | undefined;
  try {
    // A replica made just above: the first and only engine over it gets epoch 1.
    engine = await LocalEngine.open({ replicas: [{ id: 'r0', path: replica }], epoch: 1 });
    const exp = await engine.exportNbd({ nbd: `unix:${join(ctx.dir, 'mooring.sock')}` });
    const qemuDir = join(ctx.dir, 'qemu');
    mkdirSync(qemuDir);
    qemu = await serveQemuNbd('qemu-nbd backing image', image, 'qcow2', ['-r'], { ...ctx, dir: qemuDir });
    const endpoints = { mooring: exp.uri, qemu: (qemu.endpoint as { uri: string }).uri };
    for (const uri of Object.values(endpoints)) await runFio(warmJob(uri, imageBytes), 'read', ctx.tracker, ctx.abort);

    const runs = new Map<string, { mooring: FioFigures[]; qemu: FioFigures[] }>();
    for (let round = 0; round < rounds; round++) {
      for (const id of BACKING_IMAGE_WORKLOAD_IDS) {
        const w = workloadById(id);
        const entry = runs.get(id) ?? { mooring: [], qemu: [] };
        runs.set(id, entry);
        for (const who of ['mooring', 'qemu'] as const) {
          const f = await runFio(workloadJob(w, { kind: 'nbd', uri: endpoints[who] }, imageBytes, runtimeSec, rampSec), 'read', ctx.tracker, ctx.abort);
          entry[who].push(f);
          ctx.log(`  ${w.label.padEnd(20)} ${who.padEnd(8)} ${f.iops.toFixed(0).padStart(7)} IOPS ${f.mibPerSec.toFixed(1).padStart(7)} MiB/s  clat p50 ${f.clatP50Us.toFixed(0)} µs p99 ${f.clatP99Us.toFixed(0)} µs`);
        }
      }
    }
    const rows: BackingImageRow[] = BACKING_IMAGE_WORKLOAD_IDS.map((id) => {
      const w = workloadById(id);
      const e = runs.get(id)!;
      const m = medianRun(e.mooring, w.family);
      const q = medianRun(e.qemu, w.family);
      const key = (f: FioFigures): number => (w.family === 'random-4k' ? f.iops : f.mibPerSec);
      return {
        workloadId: id,
        label: w.label,
        family: w.family,
        mooring: m,
        qemu: q,
        ratio: key(m) / key(q),
        rounds: e.mooring.map((f, i): [number, number] => [key(f), key(e.qemu[i]!)]),
      };
    });
    return { imageBytes, clusterBytes: 64 * 1024, rounds, rows };
  } finally {
    await qemu?.stop().catch((err: unknown) => ctx.log(`  warning: stopping qemu-nbd: ${String(err)}`));
    await engine?.close().catch((err: unknown) => ctx.log(`  warning: closing the engine: ${String(err)}`));
  }
}
