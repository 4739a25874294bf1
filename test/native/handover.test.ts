// Hand-over between two engines of one process over the same replicas (engine.h: standby,
// Deactivate, Activate), through the real addon: local replica directories (shared by the
// two engines through the replica registry) and replicas behind real replica servers.
// Each scenario checks what the replicas hold afterwards: byte for byte against a model of
// every acknowledged write, and their epochs and clean flags as the replicas record them.
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { LocalEngine } from '../../src/engine/engine.js';
import type { NativeEngine, NativeEngineEvent, NativeHandOver, NativeReplicaEndpoint } from '../../src/native/binding.js';
import { KiB, MiB, Scratch, addon, assertDirsIdentical, codeOf, pattern, waitFor, nextEpoch, engineOptions, memberOf, withReplica } from './helpers.js';
import { closeAll, endpoint, startHosts, type Host } from './remote-helpers.js';

/** An engine (active or standby) recording its events. */
class Run {
  readonly events: NativeEngineEvent[] = [];
  private constructor(readonly engine: NativeEngine) {}

  static async open(replicas: NativeReplicaEndpoint[], standby = false, members?: string[]): Promise<Run> {
    let run: Run | null = null;
    const early: NativeEngineEvent[] = [];
    const engine = await addon().openEngine(engineOptions({
      replicas,
      standby,
      ...(members ? { members } : {}),
      onEvents: (evs) => (run ? run.events.push(...evs) : early.push(...evs)),
    }));
    run = new Run(engine);
    run.events.push(...early);
    return run;
  }

  mode(id: string): string | undefined {
    return this.engine.replicas().find((r) => r.id === id)?.mode;
  }

  claimed(): number[] {
    return this.events.filter((e): e is Extract<NativeEngineEvent, { type: 'epoch-claimed' }> => e.type === 'epoch-claimed').map((e) => e.epoch);
  }
}

/** The error a rejected call carries (fails if it resolves). */
async function errorOf(p: Promise<unknown>): Promise<{ code: string; errno?: number }> {
  try {
    await p;
  } catch (err) {
    return err as { code: string; errno?: number };
  }
  throw new Error('expected a rejection, but the call succeeded');
}

/** Writes pattern(seed) at off through `e` and into the model. */
async function put(e: NativeEngine, model: Buffer, off: number, len: number, seed: number): Promise<void> {
  const data = pattern(seed, len);
  await e.write(off, data);
  data.copy(model, off);
}

async function expectReads(e: NativeEngine, model: Buffer, what: string): Promise<void> {
  const chunk = 4 * MiB;
  for (let off = 0; off < model.length; off += chunk) {
    const got = await e.read(off, Math.min(chunk, model.length - off));
    const want = model.subarray(off, off + got.length);
    if (!got.equals(want)) throw new Error(`${what}: differs from the model at byte ${off + got.findIndex((b, i) => b !== want[i])}`);
  }
}

/** Epoch and clean flag of each replica, as the replica itself records them (works while open). */
async function recorded(dirs: string[]): Promise<Array<{ epoch: number; clean: boolean }>> {
  return Promise.all(dirs.map(async (d) => {
    const i = await addon().inspectReplica(d);
    return { epoch: i.epoch, clean: i.clean };
  }));
}

const SIZE = 16 * MiB;

describe('hand-over between engines over the same replicas', () => {
  let s: Scratch;
  let n = 0;
  beforeAll(() => {
    s = new Scratch('mooring-native-handover-');
  });
  afterAll(() => {
    s.cleanup();
  });

  async function replicas(count: number, size = SIZE): Promise<string[]> {
    const base = s.dir(`v${n++}`);
    const dirs: string[] = [];
    for (let i = 0; i < count; i++) {
      await addon().createReplica(`${base}/r${i}`, size);
      dirs.push(`${base}/r${i}`);
    }
    return dirs;
  }

  it('a standby claims no epoch, changes nothing and refuses every I/O and control call, while the active engine writes on', async () => {
    const dirs = await replicas(2);
    const model = Buffer.alloc(SIZE);
    const src = await Run.open(dirs);
    await put(src.engine, model, 0, 64 * KiB, 1);
    const before = await recorded(dirs);
    const standby = await Run.open(dirs, true);
    const e = standby.engine;
    expect(e.standby()).toBe(true);
    expect(src.engine.standby()).toBe(false);
    expect(e.epoch()).toBe(0);
    expect(e.sizeBytes).toBe(SIZE);
    expect(e.replicas().map((r) => [r.id, r.mode])).toEqual(dirs.map((d) => [d, 'RW']));
    expect(await recorded(dirs)).toEqual(before);

    // Data path: INVALID_STATE carrying EPERM (what NBD clients are sent).
    for (const [what, call] of [
      ['read', () => e.read(0, 4096)],
      ['write', () => e.write(0, pattern(99, 4096))],
      ['flush', () => e.flush()],
      ['trim', () => e.trim(0, 4096)],
      ['writeZeroes', () => e.writeZeroes(0, 4096)],
      ['blockStatus', () => e.blockStatus(0, SIZE)],
    ] as const) {
      const err = await errorOf(call());
      expect([what, err.code, err.errno]).toEqual([what, 'INVALID_STATE', -1]);
    }
    // Control path.
    expect(await codeOf(e.snapshot('s1', {}, true))).toBe('INVALID_STATE');
    expect(await codeOf(e.deleteSnapshot('s1'))).toBe('INVALID_STATE');
    expect(await codeOf(e.revert('s1'))).toBe('INVALID_STATE');
    // Only the writer reads snapshots (its pin keeps them from being deleted meanwhile).
    await src.engine.snapshot('s0', {}, true);
    expect(await codeOf(e.exportSnapshot('s0', join(tmpdir(), `mooring-standby-export-${process.pid}.raw`)))).toBe('INVALID_STATE');
    const spare = (await replicas(1))[0]!;
    expect(await codeOf(e.addReplica(spare, memberOf(spare)))).toBe('INVALID_STATE');
    expect(await codeOf(e.activate({ epoch: 0, generation: 1, rwReplicaIds: 'x' as unknown as string[] }, nextEpoch()))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(e.deactivate())).toBe('INVALID_STATE');
    expect(await codeOf(src.engine.activate({ epoch: 1, generation: 1, rwReplicaIds: dirs }, nextEpoch()))).toBe('INVALID_STATE');

    // The source is undisturbed: it writes and reads on, and the standby raised no claim.
    await put(src.engine, model, MiB, 128 * KiB, 2);
    await expectReads(src.engine, model, 'source with a standby open');
    expect(standby.claimed()).toEqual([]);
    expect((await recorded(dirs)).map((r) => r.epoch)).toEqual(before.map((r) => r.epoch));
    await standby.engine.close();
    await put(src.engine, model, 2 * MiB, 4096, 3);
    await src.engine.close();
    await assertDirsIdentical(dirs, model);
    expect(await recorded(dirs)).toEqual(dirs.map(() => ({ epoch: before[0]!.epoch, clean: true })));
  });

  it('a standby over replicas nobody writes leaves them exactly as they were, clean flag included', async () => {
    const dirs = await replicas(2);
    const model = Buffer.alloc(SIZE);
    const first = await Run.open(dirs);
    await put(first.engine, model, 5 * MiB, 8192, 4);
    await first.engine.close();
    const before = await recorded(dirs);
    expect(before.every((r) => r.clean)).toBe(true);
    const standby = await Run.open(dirs, true);
    expect(await recorded(dirs)).toEqual(before);
    await standby.engine.close();
    expect(await recorded(dirs)).toEqual(before);
    await assertDirsIdentical(dirs, model);
  });

  it('hands over: the target reads every acknowledged write and writes more; the source refuses writes and changed nothing', async () => {
    const dirs = await replicas(3);
    const model = Buffer.alloc(SIZE);
    const src = await Run.open(dirs);
    const tgt = await Run.open(dirs, true);
    for (let i = 0; i < 16; i++) await put(src.engine, model, i * 997 * KiB, 4096 + i * 512, 100 + i);
    const epoch = src.engine.epoch();

    const h = await src.engine.deactivate();
    expect(h).toEqual({ epoch, generation: 1, rwReplicaIds: dirs });
    expect(src.engine.standby()).toBe(true);
    expect(src.engine.epoch()).toBe(epoch);
    // Flushed, not marked clean: the next writer owns the replicas.
    expect(await recorded(dirs)).toEqual(dirs.map(() => ({ epoch, clean: false })));

    const next = nextEpoch();
    await tgt.engine.activate(h, next);
    expect(tgt.engine.standby()).toBe(false);
    expect(tgt.engine.epoch()).toBe(next);
    await waitFor('epoch-claimed on the target', () => tgt.claimed().includes(next));
    expect(tgt.engine.replicas().map((r) => [r.mode, r.epoch])).toEqual(dirs.map(() => ['RW', next]));
    await expectReads(tgt.engine, model, 'target after the hand-over');
    for (let i = 0; i < 8; i++) await put(tgt.engine, model, 9 * MiB + i * 64 * KiB, 32 * KiB, 200 + i);

    // The source after the hand-over: every call refused, nothing changed.
    const err = await errorOf(src.engine.write(9 * MiB, pattern(999, 4096)));
    expect([err.code, err.errno]).toEqual(['INVALID_STATE', -1]);
    expect(await codeOf(src.engine.read(0, 4096))).toBe('INVALID_STATE');
    expect(await codeOf(src.engine.deactivate())).toBe('INVALID_STATE');
    await expectReads(tgt.engine, model, 'target after a refused source write');

    // Closing the handed-over source flushes nothing and marks nothing clean.
    await src.engine.close();
    expect(await recorded(dirs)).toEqual(dirs.map(() => ({ epoch: next, clean: false })));
    await put(tgt.engine, model, 15 * MiB, 4096, 300);
    await tgt.engine.close();
    expect(await recorded(dirs)).toEqual(dirs.map(() => ({ epoch: next, clean: true })));
    await assertDirsIdentical(dirs, model);
  });

  it('writes in flight when the source deactivates either land (and the target reads them) or fail with EPERM and change nothing', async () => {
    const dirs = await replicas(2);
    const model = Buffer.alloc(SIZE);
    const src = await Run.open(dirs);
    const tgt = await Run.open(dirs, true);
    const BLOCKS = 256;
    const write = (i: number): Promise<string> =>
      src.engine.write(i * 32 * KiB, pattern(1000 + i, 32 * KiB)).then(
        () => 'ok',
        (e: { code: string; errno?: number }) => `${e.code}/${e.errno}`,
      );
    // Half queued before the deactivate, half after it: the native pool runs them around
    // it, some before it takes the gate, the rest behind it.
    const before = Array.from({ length: BLOCKS / 2 }, (_, i) => write(i));
    const deactivated = src.engine.deactivate();
    const after = Array.from({ length: BLOCKS / 2 }, (_, i) => write(BLOCKS / 2 + i));
    const h = await deactivated;
    const outcomes = await Promise.all([...before, ...after]);
    expect([...new Set(outcomes)].sort()).toEqual(['INVALID_STATE/-1', 'ok']);
    await tgt.engine.activate(h, nextEpoch());
    for (let i = 0; i < BLOCKS; i++) {
      const got = await tgt.engine.read(i * 32 * KiB, 32 * KiB);
      const want = outcomes[i] === 'ok' ? pattern(1000 + i, 32 * KiB) : Buffer.alloc(32 * KiB);
      expect(got.equals(want), `block ${i} (${outcomes[i]})`).toBe(true);
      if (outcomes[i] === 'ok') want.copy(model, i * 32 * KiB);
    }
    await src.engine.close();
    await tgt.engine.close();
    await assertDirsIdentical(dirs, model);
  });

  it('rolls back after the target wrote: the target hands back, the source claims a newer epoch and reads the target\'s writes', async () => {
    const dirs = await replicas(2);
    const model = Buffer.alloc(SIZE);
    const src = await Run.open(dirs);
    const tgt = await Run.open(dirs, true);
    await put(src.engine, model, 0, MiB, 10);
    const h1 = await src.engine.deactivate();
    const e2 = nextEpoch();
    await tgt.engine.activate(h1, e2);
    await put(tgt.engine, model, 512 * KiB, MiB, 11);
    await put(tgt.engine, model, 8 * MiB, 4096, 12);

    const h2 = await tgt.engine.deactivate();
    expect(h2).toEqual({ epoch: e2, generation: 1, rwReplicaIds: dirs });
    // The source cannot take the volume back with its own, spent hand-over.
    expect(await codeOf(src.engine.activate(h1, nextEpoch()))).toBe('STALE_EPOCH');
    const e3 = nextEpoch();
    await src.engine.activate(h2, e3);
    expect(src.engine.epoch()).toBe(e3);
    await expectReads(src.engine, model, 'source after the rollback');
    await put(src.engine, model, 3 * MiB, 4096, 13);
    expect(await codeOf(tgt.engine.write(0, pattern(1, 512)))).toBe('INVALID_STATE');
    // The first hand-over is spent: the target cannot take the volume with it again.
    await tgt.engine.close();
    await src.engine.close();
    expect(await recorded(dirs)).toEqual(dirs.map(() => ({ epoch: e3, clean: true })));
    await assertDirsIdentical(dirs, model);
  });

  it('hands over a degraded volume: the replica that was ERR at the source is ERR at the target and stale on disk', async () => {
    const dirs = await replicas(3);
    const model = Buffer.alloc(SIZE);
    // r2 misses a write made without it, so it opens fenced (ERR) in the source.
    const partial = await Run.open([dirs[0]!, dirs[1]!]);
    await put(partial.engine, model, 0, 256 * KiB, 20);
    await partial.engine.close();
    const src = await Run.open(dirs);
    expect(dirs.map((d) => src.mode(d))).toEqual(['RW', 'RW', 'ERR']);
    const tgt = await Run.open(dirs, true);
    expect(dirs.map((d) => tgt.mode(d))).toEqual(['RW', 'RW', 'RW']);
    await put(src.engine, model, 4 * MiB, 64 * KiB, 21);
    const h = await src.engine.deactivate();
    expect(h.rwReplicaIds).toEqual([dirs[0], dirs[1]]);
    const next = nextEpoch();
    await tgt.engine.activate(h, next);
    expect(dirs.map((d) => tgt.mode(d))).toEqual(['RW', 'RW', 'ERR']);
    await waitFor('replica-error for r2', () => tgt.events.some((e) => e.type === 'replica-error' && e.replicaId === dirs[2]));
    await expectReads(tgt.engine, model, 'degraded target');
    await put(tgt.engine, model, 6 * MiB, 4096, 22);
    expect((await recorded(dirs)).map((r) => r.epoch)[0]).toBe(next);
    // Stale for every later engine: it is not RW in the replica set the target committed.
    await waitFor('the target commits a replica set without r2', () =>
      tgt.events.some((e) => e.type === 'replica-set-changed' && e.epoch === next && !e.rwMembers.includes(memberOf(dirs[2]!)) && e.rwMembers.length === 2),
    );
    // The new writer repairs it as after any start.
    await tgt.engine.addReplica(dirs[2]!, memberOf(dirs[2]!));
    expect(tgt.mode(dirs[2]!)).toBe('RW');
    await src.engine.close();
    await tgt.engine.close();
    await assertDirsIdentical(dirs, model);
  });

  it('deactivate during a rebuild stops it: the target is left rebuilding, ERR at the new writer, which rebuilds it', async () => {
    const BIG = 384 * MiB;
    const [r0, r1] = await replicas(2, BIG);
    const model = Buffer.alloc(BIG);
    const src = await Run.open([r0!]);
    for (let off = 0; off < 256 * MiB; off += 4 * MiB) await put(src.engine, model, off, 4 * MiB, 3000 + off / MiB);
    const tgt = await Run.open([r0!, r1!], true);
    const rebuild = errorOf(src.engine.addReplica(r1!, memberOf(r1!)));
    await waitFor('rebuild-started', () => src.events.some((e) => e.type === 'rebuild-started'), 20_000);
    expect(src.mode(r1!)).toBe('WO');
    const h = await src.engine.deactivate();
    expect((await rebuild).code).toBe('INVALID_STATE');
    await waitFor('rebuild-failed', () => src.events.some((e) => e.type === 'rebuild-failed'));
    const failed = src.events.find((e) => e.type === 'rebuild-failed') as { message: string; scannedBytes: number };
    expect(failed.message).toMatch(/handed the volume over/);
    expect(failed.scannedBytes).toBeLessThan(256 * MiB);
    expect(h.rwReplicaIds).toEqual([r0]);
    expect(src.mode(r1!)).toBe('ERR');
    expect((await addon().inspectReplica(r1!)).rebuilding).toBe(true);

    await tgt.engine.activate(h, nextEpoch());
    expect([tgt.mode(r0!), tgt.mode(r1!)]).toEqual(['RW', 'ERR']);
    await put(tgt.engine, model, 300 * MiB, MiB, 4000);
    const res = await tgt.engine.addReplica(r1!, memberOf(r1!));
    expect(res.sentBytes).toBeGreaterThan(0);
    expect(tgt.mode(r1!)).toBe('RW');
    await src.engine.close();
    await tgt.engine.close();
    await assertDirsIdentical([r0!, r1!], model);
  });

  it('two standbys activating from one hand-over: at most one wins, a loser gets STALE_EPOCH and stays standby; the hand-over is then spent', async () => {
    for (let round = 0; round < 4; round++) {
      const dirs = await replicas(3);
      const model = Buffer.alloc(SIZE);
      const src = await Run.open(dirs);
      const a = await Run.open(dirs, true);
      const b = await Run.open(dirs, true);
      await put(src.engine, model, round * MiB, 64 * KiB, 40 + round);
      const h = await src.engine.deactivate();
      const epochs = [nextEpoch(), nextEpoch()];
      const results = await Promise.allSettled([a.engine.activate(h, epochs[0]!), b.engine.activate(h, epochs[1]!)]);
      const won = results.map((r) => r.status === 'fulfilled');
      // Racing claims may leave both out (each saw the other's claim or commit): never both in.
      expect(won.filter(Boolean).length, `round ${round}`).toBeLessThanOrEqual(1);
      for (const r of results) if (r.status === 'rejected') expect((r.reason as { code: string }).code).toBe('STALE_EPOCH');
      for (const [i, run] of [a, b].entries()) {
        if (won[i]) continue;
        expect(run.engine.standby()).toBe(true);
        expect(run.claimed()).toEqual([]);
        expect(await codeOf(run.engine.write(0, pattern(1, 4096)))).toBe('INVALID_STATE');
      }
      // With no winner the volume is started afresh, as the control plane does.
      const winner = won[0] ? a : won[1] ? b : await Run.open(dirs);
      const other = won[0] ? b : a;
      if (won[0] || won[1]) expect(winner.engine.epoch()).toBe(epochs[won[0] ? 0 : 1]);
      // Used once: a third standby (or a loser, again) is refused before it claims anything.
      const late = await Run.open(dirs, true);
      const before = await recorded(dirs);
      expect(await codeOf(late.engine.activate(h, nextEpoch()))).toBe('STALE_EPOCH');
      expect(await codeOf(other.engine.activate(h, nextEpoch()))).toBe('STALE_EPOCH');
      expect(await recorded(dirs)).toEqual(before);
      expect(before.map((r) => r.epoch)).toEqual(dirs.map(() => winner.engine.epoch()));
      await put(winner.engine, model, 12 * MiB, 4096, 50 + round);
      await expectReads(winner.engine, model, `winner of round ${round}`);
      for (const r of new Set([late, a, b, src])) if (r !== winner) await r.engine.close();
      await winner.engine.close();
      await assertDirsIdentical(dirs, model);
    }
  });

  it('closing a standby or a handed-over engine does not disturb the active writer and marks nothing clean', async () => {
    const dirs = await replicas(2);
    const model = Buffer.alloc(SIZE);
    const src = await Run.open(dirs);
    const tgt = await Run.open(dirs, true);
    const extra = await Run.open(dirs, true);
    let stop = false;
    let writes = 0;
    const writer = (async () => {
      for (let i = 0; !stop; i++, writes++) await put(src.engine, model, (i % 64) * 64 * KiB, 64 * KiB, 5000 + i);
    })();
    await waitFor('a few writes', () => writes >= 20);
    await extra.engine.close();
    await waitFor('more writes', () => writes >= 40);
    stop = true;
    await writer;
    expect(await recorded(dirs)).toEqual(dirs.map(() => ({ epoch: src.engine.epoch(), clean: false })));

    const h = await src.engine.deactivate();
    const next = nextEpoch();
    await tgt.engine.activate(h, next);
    const writes2 = Array.from({ length: 32 }, (_, i) => put(tgt.engine, model, 10 * MiB + i * 4096, 4096, 6000 + i));
    await src.engine.close();
    await Promise.all(writes2);
    expect(await recorded(dirs)).toEqual(dirs.map(() => ({ epoch: next, clean: false })));
    await expectReads(tgt.engine, model, 'target after the source closed');
    await tgt.engine.close();
    expect((await recorded(dirs)).every((r) => r.clean)).toBe(true);
    await assertDirsIdentical(dirs, model);
  });

  it('a fenced source cannot hand over; the third engine that fenced it can, and a hand-over it overtook is refused', async () => {
    const dirs = await replicas(2);
    const model = Buffer.alloc(SIZE);
    const a = await Run.open(dirs);
    const b = await Run.open(dirs, true);
    await put(a.engine, model, 0, 64 * KiB, 60);
    // A third engine starts normally: it claims a newer epoch, fencing a.
    const c = await Run.open(dirs);
    expect(await codeOf(a.engine.write(MiB, pattern(61, 4096)))).toBe('STALE_EPOCH');
    expect(await codeOf(a.engine.deactivate())).toBe('STALE_EPOCH');
    expect(a.engine.standby()).toBe(false);
    await put(c.engine, model, 2 * MiB, 64 * KiB, 62);
    const hc = await c.engine.deactivate();
    expect(hc.epoch).toBeGreaterThan(a.engine.epoch());
    const eb = nextEpoch();
    await b.engine.activate(hc, eb);
    expect(b.engine.epoch()).toBe(eb);
    await expectReads(b.engine, model, 'target after the third engine handed over');
    await put(b.engine, model, 3 * MiB, 4096, 63);

    // A hand-over overtaken by a later start: refused, the standby claims nothing, the
    // engine that started later keeps writing.
    const hb = await b.engine.deactivate();
    const d = await Run.open(dirs);
    await put(d.engine, model, 4 * MiB, 4096, 64);
    const epochs = (await recorded(dirs)).map((r) => r.epoch);
    expect(await codeOf(c.engine.activate(hb, nextEpoch()))).toBe('STALE_EPOCH');
    expect(c.engine.standby()).toBe(true);
    expect((await recorded(dirs)).map((r) => r.epoch)).toEqual(epochs);
    await put(d.engine, model, 5 * MiB, 4096, 65);
    for (const r of [a, b, c]) await r.engine.close();
    await d.engine.close();
    await assertDirsIdentical(dirs, model);
  });

  it('refuses a hand-over after another engine claimed the replicas, before claiming anything: the engine that did keeps writing', async () => {
    const dirs = await replicas(3);
    const model = Buffer.alloc(SIZE);
    const src = await Run.open(dirs);
    const tgt = await Run.open(dirs, true);
    const h = await src.engine.deactivate();
    const rogue = await Run.open(dirs);
    await put(rogue.engine, model, 0, 4096, 70);
    const before = await recorded(dirs);
    expect(await codeOf(tgt.engine.activate({ epoch: h.epoch, generation: h.generation, rwReplicaIds: [dirs[0]!, dirs[1]!] }, nextEpoch()))).toBe('STALE_EPOCH');
    expect(tgt.engine.standby()).toBe(true);
    expect(await recorded(dirs)).toEqual(before);
    await put(rogue.engine, model, 4096, 4096, 71);
    await expectReads(rogue.engine, model, 'the engine that overtook the hand-over');
    for (const r of [rogue, tgt, src]) await r.engine.close();
  });

  it('refuses hand-overs that name no usable replica, and bad hand-over arguments, with coded errors', async () => {
    const dirs = await replicas(2);
    const src = await Run.open(dirs);
    const tgt = await Run.open(dirs, true);
    const h = await src.engine.deactivate();
    expect(await codeOf(tgt.engine.activate({ epoch: h.epoch, generation: h.generation, rwReplicaIds: [] }, nextEpoch()))).toBe('NO_HEALTHY_REPLICA');
    expect(await codeOf(tgt.engine.activate({ epoch: h.epoch, generation: h.generation, rwReplicaIds: ['/nowhere'] }, nextEpoch()))).toBe('NO_HEALTHY_REPLICA');
    expect(await codeOf(tgt.engine.activate({ epoch: -1, generation: 1, rwReplicaIds: dirs } as NativeHandOver, nextEpoch()))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(tgt.engine.activate({ epoch: h.epoch, generation: h.generation, rwReplicaIds: [''] }, nextEpoch()))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(tgt.engine.activate({ epoch: h.epoch, generation: h.generation, rwReplicaIds: Array(65).fill('x') }, nextEpoch()))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(tgt.engine.activate(null as unknown as NativeHandOver, nextEpoch()))).toBe('INVALID_ARGUMENT');
    // An epoch below the replicas' is a hand-over that was overtaken.
    expect(await codeOf(tgt.engine.activate({ epoch: h.epoch - 1, generation: h.generation, rwReplicaIds: dirs }, nextEpoch()))).toBe('STALE_EPOCH');
    expect(tgt.engine.standby()).toBe(true);
    await tgt.engine.activate(h, nextEpoch());
    await tgt.engine.close();
    expect(await codeOf(tgt.engine.deactivate())).toBe('CLOSED');
    expect(await codeOf(tgt.engine.activate(h, nextEpoch()))).toBe('CLOSED');
    await src.engine.close();
  });

  it('through the TypeScript LocalEngine: role, and hand-overs named by replica ids', async () => {
    const dirs = await replicas(3);
    const specs = dirs.map((path, i) => ({ id: `r${i}`, path }));
    const src = await LocalEngine.open({ epoch: nextEpoch(), replicas: specs });
    const tgt = await LocalEngine.open({ epoch: nextEpoch(), replicas: specs, standby: true });
    expect([src.role, tgt.role]).toEqual(['active', 'standby']);
    await src.write(0, pattern(70, 8192));
    const h = await src.deactivate();
    expect(h.rwReplicaIds).toEqual(['r0', 'r1', 'r2']);
    expect(src.role).toBe('standby');
    // Only r0 and r2 handed on: r1 becomes ERR at the target.
    await tgt.activate({ epoch: h.epoch, generation: h.generation, rwReplicaIds: ['r0', 'r2'] }, { epoch: nextEpoch() });
    expect(tgt.role).toBe('active');
    expect(tgt.replicas().map((r) => [r.id, r.mode])).toEqual([['r0', 'RW'], ['r1', 'ERR'], ['r2', 'RW']]);
    expect((await tgt.read(0, 8192)).equals(pattern(70, 8192))).toBe(true);
    await expect(tgt.activate({ epoch: 1, generation: 1, rwReplicaIds: ['bad id!'] }, { epoch: nextEpoch() })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(src.write(0, pattern(1, 512))).rejects.toMatchObject({ code: 'INVALID_STATE', errno: 1 });
    await src.close();
    await tgt.close();
  });
});

describe('hand-over over replicas behind replica servers', () => {
  let s: Scratch;
  let hosts: Host[] = [];
  beforeAll(() => {
    s = new Scratch('mooring-native-handover-remote-');
  });
  afterAll(async () => {
    await closeAll(hosts);
    s.cleanup();
  });

  it('two engines, each with its own connections to the same servers, hand over; a server lost while standby leaves its replica ERR without a claim', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const eps = hosts.map((h) => endpoint(h.server.port));
    const ids = hosts.map((h) => `127.0.0.1:${h.server.port}/vol`);
    const dirs = hosts.map((h) => `${h.root}/vol`);
    const model = Buffer.alloc(SIZE);
    const src = await Run.open(eps);
    const tgt = await Run.open(eps, true);
    expect(tgt.engine.replicas().map((r) => [r.id, r.mode])).toEqual(ids.map((id) => [id, 'RW']));
    for (let i = 0; i < 8; i++) await put(src.engine, model, i * MiB + 4096, 96 * KiB, 700 + i);
    const epoch = src.engine.epoch();

    // Host 2's server goes away: both engines lose their connection to it. The source
    // drops and fences it; the standby only stops counting on it.
    await hosts[2]!.server.close();
    await waitFor('source drops replica 2', () => src.mode(ids[2]!) === 'ERR', 20_000);
    await waitFor('standby drops replica 2', () => tgt.mode(ids[2]!) === 'ERR', 20_000);
    // Events cross to JS in batches, after the mode changed.
    await waitFor('the standby reports replica 2', () => tgt.events.some((e) => e.type === 'replica-error'));
    expect(tgt.events.filter((e) => e.type === 'replica-error').map((e) => (e as { replicaId: string }).replicaId)).toEqual([ids[2]]);
    expect(tgt.claimed()).toEqual([]);
    expect(tgt.engine.epoch()).toBe(0);
    await put(src.engine, model, 12 * MiB, 4096, 710);

    const h = await src.engine.deactivate();
    expect(h.rwReplicaIds).toEqual([ids[0], ids[1]]);
    // Dropping replica 2 committed a new replica set; the epoch stays the source's own.
    expect([h.epoch, h.generation]).toEqual([epoch, 2]);
    await tgt.engine.activate(h, nextEpoch());
    expect(tgt.engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
    await expectReads(tgt.engine, model, 'remote target');
    await put(tgt.engine, model, 13 * MiB, 64 * KiB, 711);
    expect(await codeOf(src.engine.write(13 * MiB, pattern(712, 4096)))).toBe('INVALID_STATE');
    await src.engine.close();
    await tgt.engine.close();
    await closeAll(hosts.slice(0, 2));
    await assertDirsIdentical(dirs.slice(0, 2), model);
    // Replica 2 kept the first replica set; the others name only themselves as RW.
    const stored = async (dir: string) => withReplica(dir, (r) => r.claimEpoch(nextEpoch()));
    expect((await stored(dirs[2]!))?.generation).toBe(1);
    expect((await stored(dirs[0]!))?.rw).toEqual([memberOf(eps[0]!), memberOf(eps[1]!)]);
  });

  it('mixes a local replica shared with the replica server: the target opens directly what the server serves to the source', async () => {
    const [host] = await startHosts(s, 1, SIZE, 'vol');
    hosts.push(host!);
    const localDir = `${host!.root}/vol`;
    const other = `${s.dir('other')}/r1`;
    await addon().createReplica(other, SIZE);
    const model = Buffer.alloc(SIZE);
    // Source "on another host": the shared replica through the server; target "on the
    // server's host": the same replica opened directly, while the server holds it too.
    // The member names are the control plane's, the same for both engines.
    const src = await Run.open([endpoint(host!.server.port), other], false, ['r0', 'r1']);
    const tgt = await Run.open([localDir, other], true, ['r0', 'r1']);
    expect((await addon().inspectReplica(localDir)).users).toBe(2);
    await put(src.engine, model, 0, 256 * KiB, 800);
    const h = await src.engine.deactivate();
    // Ids differ per engine (host:port/name vs directory): map them by position.
    await tgt.engine.activate({ epoch: h.epoch, generation: h.generation, rwReplicaIds: [localDir, other] }, nextEpoch());
    await expectReads(tgt.engine, model, 'target over the directly opened replica');
    await put(tgt.engine, model, MiB, 4096, 801);
    await src.engine.close();
    await tgt.engine.close();
    await host!.server.close();
    await assertDirsIdentical([localDir, other], model);
  });
});
