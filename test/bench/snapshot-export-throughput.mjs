// Snapshot export throughput against qemu-img convert (a benchmark, not a test: run it by
// hand with `node test/bench/snapshot-export-throughput.mjs [DIR]` after `npm run build`).
//
// A 256 MiB volume (1 replica) is half allocated in one of two layouts — 1 MiB runs with
// 1 MiB holes, or random 64 KiB extents — snapshotted and exported to a raw file with
// Engine.exportSnapshot (which fsyncs). The same layout is written as a sparse raw file on
// the same disk and copied with `qemu-img convert -f raw -O raw`, once with its default
// cache mode (unsafe: no flush) and once with `-t writeback` (flushes at the end). Page
// cache warm for both (each source is read once before timing). Also copySnapshotTo into a
// fresh 1-replica volume (its write path, flushed at the end). Median of 5 runs. Each volume
// is a LocalEngine over one replica directory, its epoch from a counter (this script is the
// only writer of its replicas).
import { execFileSync } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { LocalEngine } from '../../dist/internal.js';

// The addon as the library loads it (build/Release first, then prebuilds/).
const addon = createRequire(import.meta.url)('node-gyp-build')(fileURLToPath(new URL('../..', import.meta.url)));
// Epochs are allocated by whoever starts engines (docs/single-writer.md); here, a counter.
let lastEpoch = 0;

/** A fresh volume: one new replica in `dir`, and an engine over it. */
async function createVolume(dir, sizeBytes) {
  await addon.createReplica(dir, sizeBytes);
  return LocalEngine.open({ replicas: [{ id: 'r0', path: dir }], epoch: ++lastEpoch });
}

const MiB = 1024 * 1024;
const SIZE = 256 * MiB;
const RUNS = 5;
const root = mkdtempSync(join(process.argv[2] ?? tmpdir(), 'mooring-export-bench-'));

function layout(kind) {
  const out = [];
  if (kind === '1m-runs') {
    for (let off = 0; off < SIZE; off += 2 * MiB) out.push([off, MiB]);
  } else {
    // Random 64 KiB extents until half the volume is allocated (fixed seed).
    const n = SIZE / (64 * 1024);
    const used = new Uint8Array(n);
    let x = 12345;
    let count = 0;
    while (count < n / 2) {
      x = (Math.imul(x, 1103515245) + 12345) >>> 0;
      const i = x % n;
      if (!used[i]) {
        used[i] = 1;
        count++;
      }
    }
    for (let i = 0; i < n; i++) if (used[i]) out.push([i * 64 * 1024, 64 * 1024]);
  }
  return out;
}

function data(len, seed) {
  const b = Buffer.allocUnsafe(len);
  for (let i = 0; i < len; i += 4) b.writeUInt32LE((seed * 2654435761 + i * 40503) >>> 0, i);
  return b;
}

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
const mibps = (ms) => (SIZE / MiB / 2 / (ms / 1000)).toFixed(0);

for (const kind of ['1m-runs', 'random-64k']) {
  const extents = layout(kind);
  const vol = await createVolume(join(root, `vol-${kind}`), SIZE);
  const raw = join(root, `src-${kind}.raw`);
  const fd = openSync(raw, 'w');
  for (const [off, len] of extents) {
    const d = data(len, off / 4096 + 1);
    await vol.write(off, d);
    writeSync(fd, d, 0, len, off);
  }
  execFileSync('truncate', ['-s', String(SIZE), raw]);
  closeSync(fd);
  await vol.flush();
  await vol.createSnapshot('s');
  execFileSync('sync');

  const times = { export: [], convert: [], convertFlush: [], copy: [] };
  // Warm-up reads (page cache) for both sources.
  await vol.exportSnapshot('s', join(root, 'warm.raw'));
  rmSync(join(root, 'warm.raw'));
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'raw', raw, join(root, 'warm.raw')]);
  rmSync(join(root, 'warm.raw'));
  for (let i = 0; i < RUNS; i++) {
    const out = join(root, `out-${i}.raw`);
    let t = performance.now();
    await vol.exportSnapshot('s', out);
    times.export.push(performance.now() - t);
    rmSync(out);
    t = performance.now();
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'raw', raw, out]);
    times.convert.push(performance.now() - t);
    rmSync(out);
    t = performance.now();
    execFileSync('qemu-img', ['convert', '-t', 'writeback', '-f', 'raw', '-O', 'raw', raw, out]);
    times.convertFlush.push(performance.now() - t);
    rmSync(out);
    // A clone into a fresh 1-replica volume (through its write path, flushed).
    const clone = await createVolume(join(root, `clone-${kind}-${i}`), SIZE);
    t = performance.now();
    await vol.copySnapshotTo('s', clone);
    times.copy.push(performance.now() - t);
    await clone.close();
    rmSync(join(root, `clone-${kind}-${i}`), { recursive: true, force: true });
  }
  await vol.close();
  console.log(
    `${kind}: ${extents.length} extents, 128 MiB data of 256 MiB | ` +
      `exportSnapshot ${median(times.export).toFixed(0)} ms (${mibps(median(times.export))} MiB/s of data) | ` +
      `qemu-img convert ${median(times.convert).toFixed(0)} ms (${mibps(median(times.convert))} MiB/s) | ` +
      `qemu-img convert -t writeback ${median(times.convertFlush).toFixed(0)} ms (${mibps(median(times.convertFlush))} MiB/s) | ` +
      `copySnapshotTo ${median(times.copy).toFixed(0)} ms (${mibps(median(times.copy))} MiB/s)`,
  );
}
rmSync(root, { recursive: true, force: true });
