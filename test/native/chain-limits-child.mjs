// Deep snapshot chains in a process of their own (test/native/chain-limits.test.ts runs it
// under `prlimit --nofile=N:N`, so the open-file limit is real). It loads the addon from the
// package root as the library does (node-gyp-build: build/, then prebuilds/). Prints one JSON
// line with what it measured on stdout; any failure throws (non-zero exit, stderr shown).
//
//   node chain-limits-child.mjs deep DIR DEPTH
//     3 replicas, DEPTH snapshots each over writes that overwrite earlier layers' blocks;
//     reopens the volume, reads every block back (the nearest layer must win), takes one
//     more snapshot and writes and reads again. Prints {fds, layers, cacheCapacity}.
//   node chain-limits-child.mjs random DIR SEED OPS
//     2 replicas; OPS random writes, write-zeroes, snapshots, snapshot deletes, reverts and
//     reopens, the whole volume checked against a model after each. Prints {ops, seed}.
import { readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(dirname(fileURLToPath(import.meta.url))));
const addon = createRequire(join(root, 'package.json'))('node-gyp-build')(root);
const BLOCK = 4096;
let epoch = Date.now() * 1000;

const [mode, dir, a1, a2] = process.argv.slice(2);

function block(seed) {
  const b = Buffer.allocUnsafe(BLOCK);
  let x = (seed * 2654435761 + 1) >>> 0 || 1;
  for (let i = 0; i < BLOCK; i += 4) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    b.writeUInt32LE(x >>> 0, i);
  }
  return b;
}

function open(replicas) {
  return addon.openEngine({ replicas, members: replicas.map((_, i) => `r${i}`), epoch: ++epoch });
}

function check(got, want, what) {
  if (!got.equals(want)) {
    const at = got.findIndex((v, i) => v !== want[i]);
    throw new Error(`${what}: differs at byte ${at} (block ${Math.floor(at / BLOCK)})`);
  }
}

async function deep(depth) {
  const size = 16 * 1024 * 1024;
  const slots = 512;
  const replicas = [0, 1, 2].map((i) => join(dir, `r${i}`));
  for (const r of replicas) await addon.createReplica(r, size);
  // Write i lands in slot i % slots: every slot is written by several layers, the last wins.
  const want = new Map();
  let e = await open(replicas);
  for (let i = 0; i < depth; i++) {
    await e.write((i % slots) * BLOCK, block(i));
    want.set(i % slots, i);
    await e.snapshot(`s${i}`, {}, true);
  }
  await e.close();
  e = await open(replicas);
  const layers = (await e.listSnapshots()).length;
  const verify = async (what) => {
    // Twice over, in a different order, so the cache evicts and reopens along the way.
    for (const order of [1, -1]) {
      for (let k = 0; k < slots; k++) {
        const s = order > 0 ? k : slots - 1 - k;
        const got = await e.read(s * BLOCK, BLOCK);
        check(got, want.has(s) ? block(want.get(s)) : Buffer.alloc(BLOCK), `${what}, slot ${s}`);
      }
    }
  };
  await verify('after reopen');
  await e.snapshot('one-more', {}, true);
  await e.write(3 * BLOCK, block(1e6));
  want.set(3, 1e6);
  await verify('after one more snapshot');
  const fds = readdirSync('/proc/self/fd').length;
  await e.close();
  process.stdout.write(JSON.stringify({ fds, layers, cacheCapacity: Number(process.env.MOORING_LAYER_FDS ?? 0) }) + '\n');
}

async function random(seed, ops) {
  const size = 256 * BLOCK;
  const replicas = [0, 1].map((i) => join(dir, `r${i}`));
  for (const r of replicas) await addon.createReplica(r, size);
  let x = seed >>> 0 || 1;
  const rnd = (n) => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) % n;
  };
  let model = Buffer.alloc(size);
  const snaps = new Map();
  let e = await open(replicas);
  let nextName = 0;
  for (let op = 0; op < ops; op++) {
    const kind = rnd(100);
    let what;
    if (kind < 45) {
      const off = rnd(size - 1);
      const len = 1 + rnd(Math.min(size - off, 3 * BLOCK));
      const data = block(op * 7 + 1).subarray(0, Math.min(len, BLOCK));
      const buf = Buffer.concat([data, data, data, data]).subarray(0, len);
      await e.write(off, buf);
      buf.copy(model, off);
      what = `write ${off}+${len}`;
    } else if (kind < 55) {
      const off = rnd(size / BLOCK) * BLOCK;
      const len = BLOCK * (1 + rnd(4));
      const n = Math.min(len, size - off);
      await e.writeZeroes(off, n);
      model.fill(0, off, off + n);
      what = `zeroes ${off}+${n}`;
    } else if (kind < 75) {
      const name = `s${nextName++}`;
      await e.snapshot(name, {}, true);
      snaps.set(name, Buffer.from(model));
      what = `snapshot ${name}`;
    } else if (kind < 87 && snaps.size > 0) {
      const names = [...snaps.keys()];
      const name = names[rnd(names.length)];
      await e.deleteSnapshot(name);
      snaps.delete(name);
      what = `delete ${name}`;
    } else if (kind < 95 && snaps.size > 0) {
      const names = [...snaps.keys()];
      const name = names[rnd(names.length)];
      await e.revert(name);
      model = Buffer.from(snaps.get(name));
      what = `revert ${name}`;
    } else {
      await e.close();
      e = await open(replicas);
      what = 'reopen';
    }
    check(await e.read(0, size), model, `seed ${seed}, op ${op} (${what})`);
  }
  await e.close();
  process.stdout.write(JSON.stringify({ ops, seed, snapshots: snaps.size }) + '\n');
}

if (mode === 'deep') await deep(Number(a1));
else if (mode === 'random') await random(Number(a1), Number(a2));
else throw new Error(`unknown mode ${mode}`);
