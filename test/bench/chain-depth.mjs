// Snapshot chain depth against a flat volume (a benchmark, not a test: run it by hand with
// `node test/bench/chain-depth.mjs [--dir DIR] [--replicas N] [--depths 0,100,1000]
// [--runtime SEC] [--rounds N]` after `npm run build:ts` and a native build).
//
// For each depth D a volume of 256 MiB (N replica directories, one LocalEngine over them) is
// filled completely with 4 KiB blocks of known content, in D + 1 random groups: group i is
// written, then snapshot i is taken, D times; the last group stays in the head. So every
// block is owned by exactly one layer and the layers share the data evenly. The flat volume
// holds the same bytes in its head alone. Then, per volume, with the page cache warm (the
// whole volume is read once first):
//   - 4 KiB random reads: fio (nbd engine) against the engine's NBD export on a unix
//     socket, iodepth 16, one job, RUNTIME seconds, ROUNDS rounds alternating flat and
//     chain; the ratio chain / flat per round and its median;
//   - the fds the process holds after the reads (`/proc/self/fd`), against before open;
//   - snapshot create time: the median of the snapshots taken at depths 1, 91-100 and
//     991-1000 while building the chain (write time excluded).
// Also spot-checks content: 2,000 random blocks read back through the engine.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { LocalEngine } from '../../dist/internal.js';

const addon = createRequire(import.meta.url)('node-gyp-build')(fileURLToPath(new URL('../..', import.meta.url)));
const { values: args } = parseArgs({
  options: {
    dir: { type: 'string', default: tmpdir() },
    replicas: { type: 'string', default: '1' },
    depths: { type: 'string', default: '0,100,1000' },
    runtime: { type: 'string', default: '6' },
    rounds: { type: 'string', default: '3' },
  },
});
const REPLICAS = Number(args.replicas);
const DEPTHS = args.depths.split(',').map(Number);
const RUNTIME = Number(args.runtime);
const ROUNDS = Number(args.rounds);
const MiB = 1024 * 1024;
const BLOCK = 4096;
const SIZE = 256 * MiB;
const BLOCKS = SIZE / BLOCK;
let lastEpoch = 0;

const root = mkdtempSync(join(args.dir, 'mooring-chain-bench-'));

/** Block b's content: its number and a word of the seed, repeated. */
function blockData(b) {
  const buf = Buffer.allocUnsafe(BLOCK);
  for (let i = 0; i < BLOCK; i += 8) {
    buf.writeUInt32LE(b, i);
    buf.writeUInt32LE((b * 2654435761) >>> 0, i + 4);
  }
  return buf;
}

function shuffled(n, seed) {
  const a = Array.from({ length: n }, (_, i) => i);
  let x = seed;
  for (let i = n - 1; i > 0; i--) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    const j = x % (i + 1);
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

const openFds = () => readdirSync('/proc/self/fd').length;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function openVolume(name) {
  const replicas = [];
  for (let i = 0; i < REPLICAS; i++) {
    const path = join(root, name, `r${i}`);
    replicas.push({ id: `r${i}`, path });
  }
  return replicas;
}

/** Builds a volume of `depth` snapshots; returns the snapshot create times by depth. */
async function build(name, depth) {
  const replicas = await openVolume(name);
  execFileSync('mkdir', ['-p', join(root, name)]);
  for (const r of replicas) await addon.createReplica(r.path, SIZE);
  const engine = await LocalEngine.open({ replicas, epoch: ++lastEpoch });
  const snapMs = new Map();
  try {
    if (depth === 0) {
      for (let b = 0; b < BLOCKS; b += 256) {
        await engine.write(b * BLOCK, Buffer.concat(Array.from({ length: 256 }, (_, k) => blockData(b + k))));
      }
    } else {
      const order = shuffled(BLOCKS, 7 + depth);
      const per = Math.ceil(BLOCKS / (depth + 1));
      for (let g = 0; g <= depth; g++) {
        const group = order.slice(g * per, (g + 1) * per);
        await Promise.all(group.map((b) => engine.write(b * BLOCK, blockData(b))));
        if (g < depth) {
          const t = process.hrtime.bigint();
          await engine.createSnapshot(`s${g}`);
          snapMs.set(g + 1, Number(process.hrtime.bigint() - t) / 1e6);
        }
      }
    }
    await engine.flush();
  } finally {
    await engine.close();
  }
  return { replicas, snapMs };
}

function fio(uri) {
  const out = execFileSync(
    'fio',
    [
      '--name=randread', '--ioengine=nbd', `--uri=${uri}`, '--rw=randread', '--bs=4k', '--iodepth=16',
      '--numjobs=1', `--size=${SIZE}`, '--time_based=1', `--runtime=${RUNTIME}`, '--ramp_time=1',
      '--norandommap=1', '--randrepeat=0', '--group_reporting=1', '--output-format=json',
    ],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
  );
  // The nbd engine prints a line before the JSON.
  return JSON.parse(out.slice(out.indexOf('{'))).jobs[0].read.iops;
}

async function attach(name, replicas) {
  const before = openFds();
  const engine = await LocalEngine.open({ replicas, epoch: ++lastEpoch });
  const t = process.hrtime.bigint();
  // Warm the page cache and check content on the way.
  for (let b = 0; b < BLOCKS; b += 256) {
    const got = await engine.read(b * BLOCK, 256 * BLOCK);
    for (const k of [0, 97, 255]) {
      if (!got.subarray(k * BLOCK, (k + 1) * BLOCK).equals(blockData(b + k))) throw new Error(`${name}: block ${b + k} differs`);
    }
  }
  const warmMs = Number(process.hrtime.bigint() - t) / 1e6;
  const sock = join(root, `${name}.sock`);
  const exp = await engine.exportNbd({ nbd: `unix:${sock}` });
  return { engine, exp, uri: exp.uri, before, warmMs };
}

const results = [];
try {
  const flat = await build('flat', 0);
  for (const depth of DEPTHS) {
    const vol = depth === 0 ? flat : await build(`d${depth}`, depth);
    const a = await attach('flat', flat.replicas);
    const c = depth === 0 ? a : await attach(`d${depth}`, vol.replicas);
    const fdsHeld = openFds() - c.before;
    const ratios = [];
    const iops = { flat: [], chain: [] };
    for (let r = 0; r < ROUNDS; r++) {
      const f = fio(a.uri);
      const ch = depth === 0 ? fio(a.uri) : fio(c.uri);
      iops.flat.push(f);
      iops.chain.push(ch);
      ratios.push(ch / f);
    }
    const snaps = [1, 100, 1000].filter((d) => d <= depth).map((d) => {
      const xs = [];
      for (let k = Math.max(1, d - 9); k <= d; k++) if (vol.snapMs.has(k)) xs.push(vol.snapMs.get(k));
      return `depth ${d}: ${median(xs).toFixed(2)} ms`;
    });
    const line =
      `depth ${depth} (${REPLICAS} replica${REPLICAS > 1 ? 's' : ''}): randread 4k qd16 flat ${Math.round(median(iops.flat))} IOPS, ` +
      `chain ${Math.round(median(iops.chain))} IOPS, ratio median ${median(ratios).toFixed(2)} ` +
      `[${ratios.map((x) => x.toFixed(2)).join(' ')}]; fds after open + warm read ${fdsHeld}; ` +
      `warm read ${Math.round(c.warmMs)} ms; snapshot create ${snaps.join(', ') || '-'}`;
    console.log(line);
    results.push(line);
    if (c !== a) await c.engine.close();
    await a.engine.close();
    if (depth !== 0) rmSync(join(root, `d${depth}`), { recursive: true, force: true });
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
