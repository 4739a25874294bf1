// Rebuild (LocalEngine.addReplica / removeReplica) through the real addon, over local replica
// directories: a fresh replica added while several writers change the volume, an
// incremental rebuild of a replica that missed writes (bytes sent against bytes changed),
// chains with merged, pruned and dropped snapshots, a crash in the middle (the target
// reopens ERR and is never read: invariant 3), a target that runs out of space, the
// operations refused meanwhile, removeReplica stopping a rebuild, and the events.
//
// Every scenario ends by closing the engine and comparing the replicas byte for byte (and
// with a model of what was written), and their layer lists and per-layer allocation.
import { spawnSync } from 'node:child_process';
import { closeSync, openSync, readFileSync, writeFileSync, writeSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { NativeEngine, NativeEngineEvent, NativeRebuildResult } from '../../src/native/binding.js';
import {
  KiB,
  MiB,
  Scratch,
  addon,
  assertDirsIdentical,
  codeOf,
  layerSummary,
  mountTmpfs,
  pattern,
  unmount,
  withReplica,
  engineOptions,
  memberOf,
  nextEpoch,
} from './helpers.js';

type RebuildEvent = Extract<NativeEngineEvent, { replicaId: string; sentBytes: number }>;

/** An engine opened over replica directories, recording its events. */
class EngineRun {
  readonly events: NativeEngineEvent[] = [];
  private waiters: Array<{ type: string; resolve: (e: NativeEngineEvent) => void }> = [];
  private constructor(readonly engine: NativeEngine) {}

  static async open(dirs: string[]): Promise<EngineRun> {
    let run: EngineRun | null = null;
    const pending: NativeEngineEvent[] = [];
    const engine = await addon().openEngine(engineOptions({
      replicas: dirs,
      onEvents: (evs) => {
        if (run) for (const e of evs) run.deliver(e);
        else pending.push(...evs);
      },
    }));
    run = new EngineRun(engine);
    for (const e of pending) run.deliver(e);
    return run;
  }

  private deliver(e: NativeEngineEvent): void {
    this.events.push(e);
    const ready = this.waiters.filter((w) => w.type === e.type);
    this.waiters = this.waiters.filter((w) => w.type !== e.type);
    for (const w of ready) w.resolve(e);
  }

  /** The next event of `type` (not one already seen). */
  next(type: NativeEngineEvent['type']): Promise<NativeEngineEvent> {
    return new Promise((resolve) => this.waiters.push({ type, resolve }));
  }

  /** An event of `type` already delivered, or the next one (events arrive asynchronously). */
  seen(type: NativeEngineEvent['type']): Promise<NativeEngineEvent> {
    const past = this.events.find((e) => e.type === type);
    return past ? Promise.resolve(past) : this.next(type);
  }

  rebuildEvents(): RebuildEvent[] {
    return this.events.filter((e): e is RebuildEvent => e.type.startsWith('rebuild-'));
  }

  mode(id: string): string | undefined {
    return this.engine.replicas().find((r) => r.id === id)?.mode;
  }
}

/** Deterministic pseudo-random numbers (xorshift32), so a failure can be replayed. */
class Rng {
  private x: number;
  constructor(seed: number) {
    this.x = (seed * 2654435761) >>> 0 || 1;
  }
  next(): number {
    this.x ^= this.x << 13;
    this.x >>>= 0;
    this.x ^= this.x >>> 17;
    this.x ^= this.x << 5;
    this.x >>>= 0;
    return this.x;
  }
  /** Integer in [0, n). */
  int(n: number): number {
    return this.next() % n;
  }
}

/** Writes `len` bytes of pattern(seed) at `off` through the engine and into the model. */
async function put(e: NativeEngine, model: Buffer, off: number, len: number, seed: number): Promise<void> {
  const data = pattern(seed, len);
  await e.write(off, data);
  data.copy(model, off);
}

/** Fills [0, bytes) in 4 MiB pieces of distinct patterns (fast bulk data for big tests). */
async function fill(e: NativeEngine, model: Buffer, bytes: number, seedBase: number): Promise<void> {
  const piece = 4 * MiB;
  for (let off = 0; off < bytes; off += piece) await put(e, model, off, Math.min(piece, bytes - off), seedBase + off / piece);
}

async function expectEngineReads(e: NativeEngine, model: Buffer, what: string): Promise<void> {
  const chunk = 8 * MiB;
  for (let off = 0; off < model.length; off += chunk) {
    const n = Math.min(chunk, model.length - off);
    const got = await e.read(off, n);
    if (!got.equals(model.subarray(off, off + n))) {
      const at = got.findIndex((b, i) => b !== model[off + i]);
      throw new Error(`${what}: engine read differs from the model at byte ${off + at}`);
    }
  }
}

/** Asserts every replica's chain (names, parents, flags, per-layer allocation) equals the first's. */
async function expectSameChains(dirs: string[]): Promise<string[]> {
  const ref = await layerSummary(dirs[0]!);
  for (const d of dirs.slice(1)) expect(await layerSummary(d), `chain of ${d} vs ${dirs[0]}`).toEqual(ref);
  return ref;
}

const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));

describe('rebuild (addReplica) over real replicas', () => {
  let s: Scratch;
  const mounts: string[] = [];
  beforeAll(() => {
    s = new Scratch('mooring-native-rebuild-');
  });
  afterAll(() => {
    for (const m of mounts.reverse()) unmount(m);
    s.cleanup();
  });

  async function replicas(name: string, n: number, size: number): Promise<string[]> {
    const dirs: string[] = [];
    for (let i = 0; i < n; i++) {
      const d = s.path(name, `r${i}`);
      s.dir(name);
      await addon().createReplica(d, size);
      dirs.push(d);
    }
    return dirs;
  }

  it('adds a fresh replica while writers keep changing the volume; all replicas end identical and equal to the model', async () => {
    const SIZE = 64 * MiB;
    const [r0, r1, r2] = await replicas('concurrent', 3, SIZE);
    const run = await EngineRun.open([r0!, r1!]);
    const e = run.engine;
    const model = Buffer.alloc(SIZE);
    const rng = new Rng(7);
    // Data in a snapshot and in the head, so both a lower layer and the head are copied.
    for (let i = 0; i < 24; i++) await put(e, model, rng.int(SIZE / MiB) * MiB, MiB, 100 + i);
    await e.snapshot('base', {}, true);
    for (let i = 0; i < 24; i++) await put(e, model, rng.int(SIZE / MiB) * MiB, MiB, 200 + i);

    // Three writers, each in its own quarter (so the model knows the order of its ops):
    // unaligned writes of any size, trims (read back: a trim may leave anything), and
    // write-zeroes with and without mayTrim.
    let rebuilding = false;
    let stop = false;
    let opsDuringRebuild = 0;
    const opsAfter = [0, 0, 0];
    const region = SIZE / 4;
    const writer = async (w: number): Promise<void> => {
      const r = new Rng(1000 + w);
      const base = w * region;
      let seed = 10_000 * (w + 1);
      while (!stop) {
        const kind = r.int(10);
        const len = 1 + r.int(kind < 2 ? 300 * KiB : 64 * KiB);
        const off = base + r.int(region - len);
        if (kind < 6) {
          await put(e, model, off, len, seed++);
        } else if (kind < 8) {
          await e.trim(off, len);
          (await e.read(off, len)).copy(model, off);
        } else {
          await e.writeZeroes(off, len, { mayTrim: kind === 8 });
          model.fill(0, off, off + len);
        }
        if (rebuilding) opsDuringRebuild++;
        if (!rebuilding && result) opsAfter[w]!++;
        if (opsAfter.every((n) => n >= 30)) stop = true;
      }
    };
    let result: NativeRebuildResult | null = null;
    const writers = [0, 1, 2].map((w) => writer(w));
    // Let the writers get going before the target joins.
    await new Promise((r) => setTimeout(r, 50));
    rebuilding = true;
    // A snapshot while the copy runs: the head being copied freezes, writers continue in a
    // new head that the next pass copies.
    const midSnapshot = run.next('rebuild-started').then(() => e.snapshot('mid', {}, true));
    result = await e
      .addReplica(r2!, memberOf(r2!))
      .catch((err: unknown) => {
        stop = true; // let the writers end, then report the failure
        throw err;
      })
      .finally(() => {
        rebuilding = false;
      });
    await Promise.all(writers);
    await midSnapshot;
    expect((await e.listSnapshots()).map((l) => l.name)).toEqual(['base', 'mid', '']);
    expect(opsDuringRebuild, 'foreground operations completed while the rebuild ran').toBeGreaterThan(0);
    expect(run.mode(r2!)).toBe('RW');
    expect(e.replicas().map((x) => x.mode)).toEqual(['RW', 'RW', 'RW']);
    expect(result.sentBytes).toBeGreaterThan(0);
    // Reads now also come from the rebuilt replica (round robin over RW).
    await expectEngineReads(e, model, 'after the rebuild');
    await e.close();
    await assertDirsIdentical([r0!, r1!, r2!], model);
    await expectSameChains([r0!, r1!, r2!]);
    const info = await addon().inspectReplica(r2!);
    expect(info.rebuilding).toBe(false);
    expect(info.users).toBe(0);
  });

  it('rebuilds a replica that missed writes incrementally: bytes sent stay within 1.2x of the bytes changed', async () => {
    const SIZE = 64 * MiB;
    const dirs = await replicas('incremental', 3, SIZE);
    const [r0, r1, r2] = dirs as [string, string, string];
    const model = Buffer.alloc(SIZE);
    let run = await EngineRun.open(dirs);
    await fill(run.engine, model, 48 * MiB, 1);
    await run.engine.close();

    // r2's host is down: the volume runs on r0 and r1 and changes.
    run = await EngineRun.open([r0, r1]);
    const rng = new Rng(99);
    const PIECE = 256 * KiB;
    const taken = new Set<number>();
    let changed = 0;
    while (taken.size < 24) {
      const slot = rng.int(SIZE / PIECE);
      if (taken.has(slot) || (slot >= 160 && slot < 164)) continue; // [40, 41) MiB is trimmed below
      taken.add(slot);
      await put(run.engine, model, slot * PIECE, PIECE, 500 + slot);
      changed += PIECE;
    }
    // One trimmed MiB in data all replicas held: the target must give those blocks up.
    const TRIM_OFF = 40 * MiB;
    await run.engine.trim(TRIM_OFF, MiB);
    (await run.engine.read(TRIM_OFF, MiB)).copy(model, TRIM_OFF);
    await run.engine.close();

    // r2 comes back: it opens ERR (it missed writes: lower epoch) and is rebuilt into its slot.
    run = await EngineRun.open(dirs);
    expect(run.mode(r2)).toBe('ERR');
    const res = await run.engine.addReplica(r2, memberOf(r2));
    expect(run.engine.replicas().map((x) => [x.id, x.mode])).toEqual(dirs.map((d) => [d, 'RW']));
    console.log(
      `incremental rebuild: changed ${changed} bytes written + ${MiB} trimmed; sent ${res.sentBytes}, ` +
        `unmapped ${res.unmappedBytes}, scanned ${res.scannedBytes} (${(res.sentBytes / changed).toFixed(3)}x)`,
    );
    expect(res.sentBytes).toBeGreaterThanOrEqual(changed);
    expect(res.sentBytes).toBeLessThanOrEqual(1.2 * changed);
    // Exactly the changed blocks are sent, the trimmed ones unmapped.
    expect(res.sentBytes).toBe(changed);
    expect(res.unmappedBytes).toBe(MiB);
    expect(res.scannedBytes).toBeGreaterThanOrEqual(48 * MiB - MiB);
    await expectEngineReads(run.engine, model, 'after the incremental rebuild');
    await run.engine.close();
    await assertDirsIdentical(dirs, model);
    await expectSameChains(dirs);
  });

  it('copies a chain with merged and pruned (removed, kept) snapshots; the rebuilt replica alone reverts to each snapshot', async () => {
    const SIZE = 32 * MiB;
    const [r0, r1, r2] = await replicas('chain', 3, SIZE);
    const run = await EngineRun.open([r0!, r1!]);
    const e = run.engine;
    const model = Buffer.alloc(SIZE);
    await put(e, model, 0, 8 * MiB, 1);
    await e.snapshot('s1', { k: 'v1' }, true);
    const atS1 = Buffer.from(model);
    await put(e, model, 4 * MiB + 100, 3 * MiB, 2);
    await e.snapshot('s2', {}, false);
    await put(e, model, 12 * MiB, 2 * MiB + 7, 3);
    await e.snapshot('s3', {}, true);
    const atS3 = Buffer.from(model);
    await e.deleteSnapshot('s2'); // one child, a snapshot: merged into s3
    await put(e, model, 1 * MiB, 64 * KiB, 4);
    await e.snapshot('s4', {}, true);
    await put(e, model, 1 * MiB + 4 * KiB, 8 * KiB, 5);
    await e.deleteSnapshot('s4'); // its only child is the head: pruned, kept as removed
    await e.trim(2 * MiB, MiB); // head punched over s1/s3 data: reads fall through
    (await e.read(2 * MiB, MiB)).copy(model, 2 * MiB);
    await e.writeZeroes(5 * MiB, 512 * KiB, { mayTrim: true });
    model.fill(0, 5 * MiB, 5 * MiB + 512 * KiB);
    const layers = await e.listSnapshots();
    expect(layers.map((l) => [l.name, l.removed, l.head])).toEqual([
      ['s1', false, false],
      ['s3', false, false],
      ['s4', true, false],
      ['', false, true],
    ]);

    await e.addReplica(r2!, memberOf(r2!));
    await expectEngineReads(e, model, 'after rebuilding the chain');
    await e.close();
    const chain = await expectSameChains([r0!, r1!, r2!]);
    expect(chain.length).toBe(4);
    await assertDirsIdentical([r0!, r1!, r2!], model);

    // The snapshots' own data came across: exported from the rebuilt replica (a snapshot
    // read uses the first RW replica; an engine never opens a minority of the replicas).
    const again = await EngineRun.open([r2!, r0!, r1!]);
    for (const [snap, want] of [['s1', atS1], ['s3', atS3]] as const) {
      const out = s.path('chain', `${snap}.raw`);
      await again.engine.exportSnapshot(snap, out);
      expect(readFileSync(out).equals(want), `${snap} exported from r2`).toBe(true);
    }
    await again.engine.close();
  });

  it('rebuilds a returning replica whose chain is out of date: dropped layers go, new ones are created, kept ones are compared', async () => {
    const SIZE = 32 * MiB;
    const dirs = await replicas('stale-chain', 3, SIZE);
    const [r0, r1, r2] = dirs as [string, string, string];
    const model = Buffer.alloc(SIZE);
    let run = await EngineRun.open(dirs);
    await put(run.engine, model, 0, 6 * MiB, 11);
    await run.engine.snapshot('a', {}, true);
    await put(run.engine, model, 8 * MiB, 6 * MiB, 12);
    await run.engine.snapshot('old', {}, true);
    await put(run.engine, model, 16 * MiB, 2 * MiB, 13);
    await run.engine.close();

    run = await EngineRun.open([r0, r1]);
    await run.engine.deleteSnapshot('old'); // pruned against the head, kept as removed
    await run.engine.revert('a'); // the old head and then 'old' go; a new head over 'a'
    const atA = Buffer.from(model.fill(0, 6 * MiB));
    await put(run.engine, model, 20 * MiB, 3 * MiB, 14);
    await run.engine.snapshot('b', {}, true);
    const atB = Buffer.from(model);
    await put(run.engine, model, 2 * MiB, 64 * KiB, 15);
    await run.engine.close();
    const before = await layerSummary(r2);
    const after = await layerSummary(r0);
    expect(before).not.toEqual(after);

    run = await EngineRun.open(dirs);
    expect(run.mode(r2)).toBe('ERR');
    const res = await run.engine.addReplica(r2, memberOf(r2));
    // L000001 ('a') is kept and matches: not sent again. New: b's 3 MiB and the head's unit.
    expect(res.sentBytes).toBe(3 * MiB + 64 * KiB);
    expect(res.unmappedBytes).toBe(0);
    await run.engine.close();
    expect(readFileSync(`${r2}/replica.json`, 'utf8')).not.toContain('"rebuilding"');
    await expectSameChains(dirs);
    await assertDirsIdentical(dirs, model);
    // Exported from the rebuilt replica (the first RW one; see the chain test above).
    const again = await EngineRun.open([r2, r0, r1]);
    for (const [snap, want] of [['a', atA], ['b', atB]] as const) {
      const out = s.path('stale-chain', `${snap}.raw`);
      await again.engine.exportSnapshot(snap, out);
      expect(readFileSync(out).equals(want), `${snap} exported from r2`).toBe(true);
    }
    await again.engine.close();
  });

  it('repairs blocks the target holds wrongly in a kept layer (same allocation, other bytes) and unmaps blocks it should not hold', async () => {
    const SIZE = 16 * MiB;
    const dirs = await replicas('damaged-layer', 3, SIZE);
    const [r0, r1, r2] = dirs as [string, string, string];
    const model = Buffer.alloc(SIZE);
    let run = await EngineRun.open(dirs);
    await put(run.engine, model, 0, 4 * MiB, 21);
    await run.engine.snapshot('s', {}, true);
    await put(run.engine, model, 8 * MiB, MiB, 22);
    await run.engine.close();
    // Damage r2's snapshot layer behind its back: 4 KiB changed inside data (same
    // allocation, different bytes) and 8 KiB written where the layer holds nothing.
    // Written in place, so the file stays sparse elsewhere.
    const fd = openSync(`${r2}/layer-L000001.img`, 'r+');
    writeSync(fd, Buffer.alloc(4 * KiB, 0x5a), 0, 4 * KiB, MiB + 4 * KiB);
    writeSync(fd, Buffer.alloc(8 * KiB, 0xa5), 0, 8 * KiB, 6 * MiB);
    closeSync(fd);
    run = await EngineRun.open([r0, r1]);
    await run.engine.write(12 * MiB, pattern(23, 4 * KiB)); // so r2 is stale and opens ERR
    pattern(23, 4 * KiB).copy(model, 12 * MiB);
    await run.engine.close();

    run = await EngineRun.open(dirs);
    const res = await run.engine.addReplica(r2, memberOf(r2));
    // The damaged 4 KiB block of the snapshot and the new head block; the extra blocks are unmapped.
    expect(res.sentBytes).toBe(4 * KiB + 4 * KiB);
    expect(res.unmappedBytes).toBe(8 * KiB);
    await run.engine.close();
    await expectSameChains(dirs);
    await assertDirsIdentical(dirs, model);
  });

  it('progress events carry the figures; delete and revert are refused BUSY meanwhile, a snapshot is taken and copied too', async () => {
    const SIZE = 384 * MiB;
    const [r0, r1, r2] = await replicas('busy', 3, SIZE);
    const run = await EngineRun.open([r0!]);
    const e = run.engine;
    const model = Buffer.alloc(SIZE);
    await fill(e, model, 64 * MiB, 1000);
    await e.snapshot('s1', {}, true);
    await fill(e, model, 256 * MiB, 2000);
    const started = run.next('rebuild-started');
    const rebuild = e.addReplica(r1!, memberOf(r1!));
    let settled = false;
    void rebuild.finally(() => {
      settled = true;
    });
    await started;
    const during = await Promise.all([
      codeOf(e.deleteSnapshot('s1')),
      codeOf(e.revert('s1')),
      codeOf(e.addReplica(r2!, memberOf(r2!))),
      e.snapshot('during', {}, true).then(() => 'OK'),
    ]);
    // Taken while the copy still ran, or the BUSY answers above would prove nothing.
    expect(settled, 'the rebuild was still running when the operations were answered').toBe(false);
    expect(during).toEqual(['BUSY', 'BUSY', 'BUSY', 'OK']);
    await put(e, model, 300 * MiB, MiB, 3000);
    const res = await rebuild;
    expect(e.replicas().map((r) => r.mode)).toEqual(['RW', 'RW']);
    await run.seen('rebuild-completed');
    const evs = run.rebuildEvents().filter((x) => x.replicaId === r1);
    expect(evs[0]!.type).toBe('rebuild-started');
    const progress = evs.filter((x) => x.type === 'rebuild-progress');
    expect(progress.length).toBeGreaterThanOrEqual(3); // 256+ MiB scanned, one every 64 MiB
    for (let i = 1; i < progress.length; i++) {
      expect(progress[i]!.scannedBytes).toBeGreaterThanOrEqual(progress[i - 1]!.scannedBytes + 64 * MiB);
      expect(progress[i]!.sentBytes).toBeGreaterThanOrEqual(progress[i - 1]!.sentBytes);
    }
    // Planned from the start: both layers' allocation (64 + 256 MiB).
    expect(progress[0]!.totalBytes).toBe(320 * MiB);
    const last = evs[evs.length - 1]!;
    expect(last.type).toBe('rebuild-completed');
    expect([last.sentBytes, last.scannedBytes, last.totalBytes]).toEqual([res.sentBytes, res.scannedBytes, res.scannedBytes]);
    // A fresh target gets what the source's layers hold (s1: 64 MiB, then 256 MiB); the
    // write after the snapshot reached the target as a write (WO) and is not sent again.
    expect(res.sentBytes).toBe(320 * MiB);
    // Afterwards the chain operations work again, on both replicas.
    await e.deleteSnapshot('s1');
    await e.close();
    const chain = await expectSameChains([r0!, r1!]);
    expect(chain.map((l) => l.split(' ')[1])).toEqual(['name=during', 'name=']);
    await assertDirsIdentical([r0!, r1!], model);
  });

  it('removeReplica stops a running rebuild: the promise rejects, the target leaves the engine marked as rebuilding', async () => {
    const SIZE = 384 * MiB;
    const [r0, r1] = await replicas('remove', 2, SIZE);
    const run = await EngineRun.open([r0!]);
    const e = run.engine;
    const model = Buffer.alloc(SIZE);
    await fill(e, model, 256 * MiB, 4000);
    const started = run.next('rebuild-started');
    const failed = run.next('rebuild-failed');
    const outcome = codeOf(e.addReplica(r1!, memberOf(r1!)));
    await started;
    expect(run.mode(r1!)).toBe('WO');
    expect(await codeOf(e.removeReplica(r0!))).toBe('INVALID_STATE');
    await e.removeReplica(r1!);
    expect(await outcome).toBe('CLOSED');
    const ev = (await failed) as RebuildEvent & { errno: number; message: string };
    expect(ev.replicaId).toBe(r1);
    expect(ev.message).toMatch(/removed/);
    expect(ev.scannedBytes).toBeLessThan(256 * MiB);
    expect(e.replicas().map((r) => r.id)).toEqual([r0]);
    const info = await addon().inspectReplica(r1!);
    expect(info.rebuilding).toBe(true);
    expect(info.users).toBe(0);
    expect(await codeOf(e.removeReplica(r1!))).toBe('NOT_FOUND');
    // The engine keeps serving, and the replica can be added again from scratch.
    await put(e, model, 100 * MiB, MiB, 4500);
    const res = await e.addReplica(r1!, memberOf(r1!));
    expect(res.sentBytes).toBeGreaterThan(0);
    await e.close();
    await assertDirsIdentical([r0!, r1!], model);
  });

  it('a crash in the middle leaves the target rebuilding: it reopens ERR, is never read, and can be rebuilt', async () => {
    const SIZE = 384 * MiB;
    const dirs = await replicas('crash', 3, SIZE);
    const [r0, r1, r2] = dirs as [string, string, string];
    const model = Buffer.alloc(SIZE);
    let run = await EngineRun.open([r0, r1]);
    await fill(run.engine, model, 256 * MiB, 5000);
    await run.engine.close();

    // A child process rebuilds r2 and is SIGKILLed at the first progress event.
    const script = s.path('crash-child.cjs');
    writeFileSync(
      script,
      `const addon = require(${JSON.stringify(`${REPO_ROOT}/node_modules/node-gyp-build`)})(${JSON.stringify(REPO_ROOT)});
(async () => {
  const e = await addon.openEngine({
    replicas: ${JSON.stringify([r0, r1])},
    members: ${JSON.stringify([r0!, r1!].map(memberOf))},
    epoch: ${nextEpoch()},
    onEvents: (evs) => {
      for (const ev of evs) {
        if (ev.type === 'rebuild-progress') {
          process.stdout.write(JSON.stringify(ev) + '\\n', () => process.kill(process.pid, 'SIGKILL'));
          return;
        }
      }
    },
  });
  await e.addReplica(${JSON.stringify(r2)}, ${JSON.stringify(memberOf(r2!))});
  process.stdout.write('COMPLETED\\n');
})().catch((err) => { process.stdout.write('ERROR ' + err.message + '\\n'); process.exit(3); });
`,
    );
    const child = spawnSync(process.execPath, [script], { encoding: 'utf8', timeout: 120_000 });
    expect(child.signal, `child output: ${child.stdout} ${child.stderr}`).toBe('SIGKILL');
    const last = JSON.parse(child.stdout.trim().split('\n').pop()!) as RebuildEvent;
    expect(last.type).toBe('rebuild-progress');
    expect(last.scannedBytes).toBeLessThan(last.totalBytes);
    expect((await addon().inspectReplica(r2)).rebuilding).toBe(true);

    run = await EngineRun.open(dirs);
    expect(run.mode(r2)).toBe('ERR');
    const err = (await run.seen('replica-error')) as { replicaId: string; message: string };
    expect(err.replicaId).toBe(r2);
    expect(err.message).toMatch(/middle of a rebuild/);
    // Round-robin reads over RW replicas only: r2's uncopied part would read as zeros.
    for (let round = 0; round < 3; round++) await expectEngineReads(run.engine, model, `read round ${round} with r2 ERR`);
    const res = await run.engine.addReplica(r2, memberOf(r2));
    expect(res.scannedBytes).toBeGreaterThanOrEqual(256 * MiB);
    // What the killed rebuild already copied is not sent again.
    expect(res.sentBytes).toBeLessThan(256 * MiB);
    await run.engine.close();
    await assertDirsIdentical(dirs, model);
    await expectSameChains(dirs);
  });

  it('a target that runs out of space goes ERR and fails its rebuild; the writers never see an error', async () => {
    const SIZE = 64 * MiB;
    const [r0, r1] = await replicas('enospc', 2, SIZE);
    const small = s.path('enospc', 'small');
    mountTmpfs(small, '8m');
    mounts.push(small);
    const r2 = `${small}/r2`;
    await addon().createReplica(r2, SIZE);
    const run = await EngineRun.open([r0!, r1!]);
    const e = run.engine;
    const model = Buffer.alloc(SIZE);
    await fill(e, model, 32 * MiB, 6000);
    let stop = false;
    let writes = 0;
    const writer = (async () => {
      const r = new Rng(5);
      while (!stop) {
        await put(e, model, 40 * MiB + r.int(8 * MiB), 1 + r.int(40 * KiB), 7000 + writes);
        writes++;
      }
    })();
    const failed = run.next('rebuild-failed');
    expect(await codeOf(e.addReplica(r2, memberOf(r2)))).toBe('NO_SPACE');
    stop = true;
    await writer;
    const ev = (await failed) as RebuildEvent & { errno: number };
    expect(ev.errno).toBe(-28); // ENOSPC
    expect(run.mode(r2)).toBe('ERR');
    expect(writes).toBeGreaterThan(0);
    await expectEngineReads(e, model, 'after the failed rebuild');
    await e.removeReplica(r2);
    await e.close();
    await assertDirsIdentical([r0!, r1!], model);
    expect((await addon().inspectReplica(r2)).rebuilding).toBe(true);
  });

  it('removes a RW replica when asked to (a replica moved off its host) while writes run, never the last RW one', async () => {
    const SIZE = 16 * MiB;
    const [r0, r1, r2] = await replicas('move', 3, SIZE);
    const run = await EngineRun.open([r0!, r1!, r2!]);
    const e = run.engine;
    const model = Buffer.alloc(SIZE);
    await fill(e, model, 4 * MiB, 8000);
    let stop = false;
    let writes = 0;
    const writer = (async () => {
      const r = new Rng(9);
      while (!stop) {
        await put(e, model, r.int(12 * MiB), 1 + r.int(40 * KiB), 9000 + writes);
        writes++;
      }
    })();
    // Without the flag a RW replica stays; with it, it leaves while the writer runs.
    expect(await codeOf(e.removeReplica(r2!))).toBe('INVALID_STATE');
    await e.removeReplica(r2!, true);
    await e.removeReplica(r1!, true);
    expect(await codeOf(e.removeReplica(r0!, true))).toBe('INVALID_STATE'); // the only RW one
    stop = true;
    await writer;
    expect(writes).toBeGreaterThan(0);
    expect(e.replicas().map((r) => r.id)).toEqual([r0]);
    await expectEngineReads(e, model, 'after removing two RW replicas');
    await e.close();
    await assertDirsIdentical([r0!], model);
  });

  it('refuses bad requests with coded errors', async () => {
    const SIZE = 8 * MiB;
    const [r0, r1] = await replicas('bad', 2, SIZE);
    const other = s.path('bad', 'promised-more');
    await addon().createReplica(other, SIZE);
    const run = await EngineRun.open([r0!]);
    const e = run.engine;
    expect(await codeOf(e.addReplica(s.path('bad', 'missing'), memberOf(s.path('bad', 'missing'))))).toBe('NOT_FOUND');
    // A replica that promised a newer epoch belongs to another engine. (One of another size
    // is no refusal: a rebuild target takes the volume's size, test/native/resize.test.ts.)
    await withReplica(other, async (r) => void (await r.claimEpoch(nextEpoch())));
    expect(await codeOf(e.addReplica(other, memberOf(other)))).toBe('STALE_EPOCH');
    expect(await codeOf(e.addReplica(r0!, memberOf(r0!)))).toBe('INVALID_STATE');
    expect(await codeOf(e.addReplica(42 as unknown as string, 'x'))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(e.addReplica({ host: '', port: 1, name: 'x' }, 'x'))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(e.removeReplica(r0!))).toBe('INVALID_STATE');
    expect(await codeOf(e.removeReplica('nope'))).toBe('NOT_FOUND');
    expect(await codeOf(e.removeReplica(''))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().inspectReplica(s.path('bad', 'missing')))).toBe('NOT_FOUND');
    // The refused targets were released: they open directly.
    await withReplica(other, async () => undefined);
    expect(e.replicas().map((r) => r.id)).toEqual([r0]);
    await e.addReplica(r1!, memberOf(r1!));
    await e.close();
    expect(await codeOf(e.addReplica(r1!, memberOf(r1!)))).toBe('CLOSED');
    await assertDirsIdentical([r0!, r1!]);
  });
});
