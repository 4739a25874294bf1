// LocalEngine over three replica directories, through the real addon: the epoch its caller
// gives it claimed on every replica and older writers fenced (invariant 2; the epochs come
// from nextEpoch(), as a control plane would allocate them), fan-out with a replica that
// really runs out of space (a 2 MiB tmpfs) and is dropped as ERR (invariant 3), NO_SPACE
// when every replica is full, identical replicas after each scenario, and damaged replica
// metadata at LocalEngine.open.
//
// The tmpfs tests mount filesystems and therefore need root (CI runs as root). They fail,
// never skip, without it.
import { execFileSync } from 'node:child_process';
import { renameSync, writeFileSync } from 'node:fs';
import { constants as osConstants } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { LocalEngine, type ReplicaErrorEvent } from '../../src/engine/engine.js';
import {
  MiB,
  Scratch,
  assertReplicasIdentical,
  codeOf,
  createReplicas,
  mountTmpfs,
  nextEpoch,
  pattern,
  replicaDir,
  unmount,
  waitFor,
  withReplica,
  type ReplicaDir,
} from './helpers.js';

function expectSame(actual: Buffer, expected: Buffer, what: string): void {
  if (!actual.equals(expected)) {
    const at = actual.length !== expected.length ? -1 : actual.findIndex((b, i) => b !== expected[i]);
    throw new Error(`${what}: differs at byte ${at} (lengths ${actual.length}/${expected.length})`);
  }
}

/** Replica epochs as the replicas themselves record them (engine closed). */
async function replicaEpochs(replicas: ReplicaDir[]): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const r of replicas) out[r.id] = await withReplica(r.path, async (x) => x.epoch());
  return out;
}

/** An engine over `replicas` with a newly allocated epoch. */
function openEngine(replicas: ReplicaDir[]): Promise<LocalEngine> {
  return LocalEngine.open({ replicas, epoch: nextEpoch() });
}

/** Moves a closed engine's replica directory onto a fresh tmpfs of `size`, content and all. */
function moveReplicaToTmpfs(path: string, size: string, mounts: string[]): void {
  renameSync(path, `${path}.orig`);
  mountTmpfs(path, size);
  mounts.push(path);
  execFileSync('cp', ['-a', '--sparse=always', `${path}.orig/.`, path]);
}

describe('engine over real replicas', () => {
  let s: Scratch;
  const mounts: string[] = [];
  beforeAll(() => {
    s = new Scratch('mooring-native-engine-');
  });
  afterAll(() => {
    for (const m of mounts.reverse()) unmount(m);
    s.cleanup();
  });

  describe('writer epochs (invariant 2)', () => {
    it('claims the epoch it is given on every replica at each open, refuses one not above it, and marks them clean at close', async () => {
      const replicas = await createReplicas(s.path('epochs'), 3, 4 * MiB);
      for (let round = 0; round < 3; round++) {
        const epoch = nextEpoch();
        const engine = await LocalEngine.open({ replicas, epoch });
        expect(engine.epoch).toBe(epoch);
        expect(engine.replicas().map((r) => [r.id, r.mode, r.epoch])).toEqual(['r0', 'r1', 'r2'].map((id) => [id, 'RW', epoch]));
        await engine.write(round * MiB + 1, pattern(round, 1000));
        await engine.close();
        expect(await replicaEpochs(replicas)).toEqual({ r0: epoch, r1: epoch, r2: epoch });
        for (const r of replicas) {
          expect(await withReplica(r.path, async (x) => x.clean()), `${r.id} clean`).toBe(true);
        }
        // The same epoch again (or any not above it) is refused, and changes nothing: an
        // epoch is never handed to two engines.
        expect(await codeOf(LocalEngine.open({ replicas, epoch }))).toBe('STALE_EPOCH');
        expect(await codeOf(LocalEngine.open({ replicas, epoch: epoch - 1 }))).toBe('STALE_EPOCH');
        expect(await replicaEpochs(replicas)).toEqual({ r0: epoch, r1: epoch, r2: epoch });
      }
      const expected = Buffer.alloc(4 * MiB);
      for (let round = 0; round < 3; round++) pattern(round, 1000).copy(expected, round * MiB + 1);
      await assertReplicasIdentical(replicas, { expected });
    });

    it('reconciles at open only when a replica was not closed cleanly before the claim', async () => {
      const replicas = await createReplicas(s.path('clean-open'), 3, 4 * MiB);
      // The open's events come in one batch (the claim, then any reconcile), possibly after
      // open resolved: wait for the claim's.
      const kinds = async (e: LocalEngine): Promise<string[]> => {
        const got = e.openEvents.map((x) => x.type);
        e.on('epoch-claimed', () => got.push('epoch-claimed'));
        e.on('reconciled', () => got.push('reconciled'));
        await waitFor('the open events', () => got.includes('epoch-claimed'));
        return got;
      };
      const first = await openEngine(replicas);
      await first.write(0, pattern(80, 64 * 1024));
      await first.close();
      // Closed cleanly: the next engine's claim finds every replica clean, so nothing is
      // compared or copied (the claim's own "not clean" mark does not count).
      const second = await openEngine(replicas);
      expect(await kinds(second)).not.toContain('reconciled');
      await second.write(64 * 1024, pattern(81, 4096));
      await second.close();
      // A writer that claimed r1 alone and wrote there went away without closing: r1 is not
      // clean and differs, so the next engine reconciles, and the replicas end identical.
      const stray = nextEpoch();
      await withReplica(replicaDir(replicas, 'r1'), async (x) => {
        await x.claimEpoch(stray);
        await x.write(stray, 0, Buffer.alloc(8192, 0xee));
      });
      const third = await openEngine(replicas);
      expect(await kinds(third)).toContain('reconciled');
      await third.close();
      await assertReplicasIdentical(replicas);
    });

    it('fences an older writer that comes back after a newer engine claimed the replicas', async () => {
      const replicas = await createReplicas(s.path('fence-old-writer'), 3, 4 * MiB);
      await (await openEngine(replicas)).close();
      // Writer A claims the volume the way an engine does (its epoch on every replica),
      // writes, and goes away (say, partitioned) without closing cleanly.
      const epochA = nextEpoch();
      for (const r of replicas) {
        await withReplica(r.path, async (x) => {
          await x.claimEpoch(epochA);
          await x.write(epochA, 0, Buffer.alloc(8192, 0xaa));
        });
      }
      // Engine B needs an epoch above A's; its data wins.
      expect(await codeOf(LocalEngine.open({ replicas, epoch: epochA }))).toBe('STALE_EPOCH');
      const epochB = nextEpoch();
      const engine = await LocalEngine.open({ replicas, epoch: epochB });
      expect(engine.epoch).toBeGreaterThan(epochA);
      const b = pattern(60, 8192);
      await engine.write(0, b);
      await engine.close();
      // A comes back with its old epoch: refused on every replica, nothing changes.
      for (const r of replicas) {
        await withReplica(r.path, async (x) => {
          expect(x.epoch()).toBe(epochB);
          expect(await codeOf(x.write(epochA, 0, Buffer.alloc(8192, 0xbb))), r.id).toBe('STALE_EPOCH');
          expectSame(await x.read(0, 8192), b, `${r.id} after the stale write`);
        });
      }
      await assertReplicasIdentical(replicas);
    });

    it('opens a replica missed by a newer writer as ERR (lower epoch, STALE_EPOCH event) and never reads from it', async () => {
      const size = 4 * MiB;
      const replicas = await createReplicas(s.path('fence-stale-replica'), 3, size);
      const v1 = await openEngine(replicas);
      const old = pattern(70, MiB);
      await v1.write(0, old);
      await v1.close();
      // A newer writer reached r0 and r1 only (r2 was unreachable): it claimed a higher
      // epoch there, committed its replica set (r0 and r1 RW: a majority) and overwrote the data.
      const newer = nextEpoch();
      const fresh = pattern(71, MiB);
      for (const id of ['r0', 'r1']) {
        await withReplica(replicaDir(replicas, id), async (r) => {
          await r.claimEpoch(newer);
          await r.setReplicaSet({ epoch: newer, generation: 1, members: ['r0', 'r1', 'r2'], rw: ['r0', 'r1'] });
          await r.write(newer, 0, fresh);
        });
      }
      const epoch = nextEpoch();
      const engine = await LocalEngine.open({ replicas, epoch });
      const errors: ReplicaErrorEvent[] = engine.openEvents.flatMap(({ type, ...e }) => (type === 'replica-error' ? [e as ReplicaErrorEvent] : []));
      engine.on('replica-error', (e) => errors.push(e));
      try {
        expect(engine.epoch).toBe(epoch);
        expect(engine.replicas().map((r) => [r.id, r.mode])).toEqual([
          ['r0', 'RW'],
          ['r1', 'RW'],
          ['r2', 'ERR'],
        ]);
        // Round-robin reads would reach r2 within three tries if it were still used.
        for (let i = 0; i < 12; i++) expectSame(await engine.read(0, MiB), fresh, `read ${i}`);
        await waitFor('a replica-error event for r2', () => errors.some((e) => e.replicaId === 'r2'));
        expect(errors).toEqual([expect.objectContaining({ replicaId: 'r2', path: replicaDir(replicas, 'r2'), code: 'STALE_EPOCH', errno: osConstants.errno.ESTALE })]);
      } finally {
        await engine.close();
      }
      // The stale replica promised this engine's epoch but was neither written nor made RW:
      // the replica set the engine committed leaves it out, so it stays behind.
      const epochs = await replicaEpochs(replicas);
      expect(epochs.r0).toBe(epochs.r1);
      const committed = await withReplica(replicaDir(replicas, 'r0'), (r) => r.claimEpoch(r.epoch() + 1));
      expect(committed).toMatchObject({ epoch: epochs.r0, generation: 1, rw: ['r0', 'r1'] });
      await withReplica(replicaDir(replicas, 'r2'), async (r) => expectSame(await r.read(0, MiB), old, 'r2 untouched'));
      // Reopened, it is still ERR.
      const again = await openEngine(replicas);
      try {
        expect(again.replicas()[2]!.mode).toBe('ERR');
        expectSame(await again.read(0, MiB), fresh, 'after reopen');
      } finally {
        await again.close();
      }
      await assertReplicasIdentical(replicas, { exclude: ['r2'] });
    });
  });

  describe('a replica that runs out of space (real tmpfs, needs root)', () => {
    it('drops it as ERR with a typed event; the write succeeds; it stays ERR after reopen and is never read', async () => {
      const size = 8 * MiB;
      const replicas = await createReplicas(s.path('nospace-one'), 3, size);
      moveReplicaToTmpfs(replicaDir(replicas, 'r1'), '2m', mounts);

      const model = Buffer.alloc(size);
      const engine = await openEngine(replicas);
      const events: ReplicaErrorEvent[] = [];
      engine.on('replica-error', (e) => events.push(e));
      const sets: Array<{ epoch: number; generation: number; rwReplicaIds: string[] }> = [];
      engine.on('replica-set-changed', (e) => sets.push(e));
      try {
        const epochBefore = engine.epoch;
        expect(engine.replicas().every((r) => r.mode === 'RW')).toBe(true);
        // 4 MiB into a replica with 2 MiB of room: every write still succeeds.
        for (let i = 0; i < 4; i++) {
          const d = pattern(80 + i, MiB);
          await engine.write(i * MiB, d);
          d.copy(model, i * MiB);
        }
        await waitFor('a replica-error event', () => events.length > 0);
        expect(events).toHaveLength(1);
        expect(events[0]).toMatchObject({ replicaId: 'r1', code: 'NO_SPACE', errno: osConstants.errno.ENOSPC });
        expect(events[0]!.path).toBe(replicaDir(replicas, 'r1'));
        const st = engine.replicas();
        expect(st.map((r) => [r.id, r.mode])).toEqual([
          ['r0', 'RW'],
          ['r1', 'ERR'],
          ['r2', 'RW'],
        ]);
        expect(st[1]!.lastErrno).toBe(osConstants.errno.ENOSPC);
        // Dropping it committed a replica set without it (the epoch stays the engine's).
        expect(engine.epoch).toBe(epochBefore);
        await waitFor('a replica set without r1', () => sets.some((x) => x.generation === 2));
        expect(sets.find((x) => x.generation === 2)).toEqual({ epoch: epochBefore, generation: 2, rwReplicaIds: ['r0', 'r2'] });
        // Reads stay correct (and keep away from r1), writes go on.
        for (let i = 0; i < 6; i++) expectSame(await engine.read(0, size), model, `read ${i}`);
        const more = pattern(90, MiB);
        await engine.write(6 * MiB, more);
        more.copy(model, 6 * MiB);
        expectSame(await engine.read(0, size), model, 'after more writes');
      } finally {
        await engine.close();
      }
      // r0 and r2 durably hold the replica set that leaves r1 out (a claim answers with it).
      for (const id of ['r0', 'r2']) {
        const stored = await withReplica(replicaDir(replicas, id), (r) => r.claimEpoch(r.epoch() + 1));
        expect(stored, id).toMatchObject({ generation: 2, rw: ['r0', 'r2'] });
      }
      // Poison what r1 holds, with its own (old) epoch: if the volume ever read from r1
      // again, the reads below would see it.
      await withReplica(replicaDir(replicas, 'r1'), async (r) => {
        expect((await r.blockStatus(0, 4096))[0]!.flags).toBe(0); // r1 did get the first MiB
        await r.write(r.epoch(), 0, Buffer.alloc(4096, 0xee));
      });
      const reopened = await openEngine(replicas);
      try {
        expect(reopened.replicas().map((r) => r.mode)).toEqual(['RW', 'ERR', 'RW']);
        for (let i = 0; i < 12; i++) expectSame(await reopened.read(0, 64 * 1024), model.subarray(0, 64 * 1024), `read ${i} after reopen`);
        expectSame(await reopened.read(0, size), model, 'whole volume after reopen');
      } finally {
        await reopened.close();
      }
      await assertReplicasIdentical(replicas, { exclude: ['r1'], expected: model });
    });

    it('passes NO_SPACE to the caller when every replica is full', async () => {
      const size = 8 * MiB;
      const replicas = await createReplicas(s.path('nospace-all'), 3, size);
      for (const r of replicas) moveReplicaToTmpfs(r.path, '2m', mounts);
      const engine = await openEngine(replicas);
      let failure: unknown;
      const acked: number[] = [];
      try {
        for (let i = 0; i < 4 && failure === undefined; i++) {
          await engine.write(i * MiB, pattern(100 + i, MiB)).then(
            () => acked.push(i),
            (err: unknown) => (failure = err),
          );
        }
        expect(failure, 'a write that fits nowhere must fail').toBeDefined();
        expect(failure).toMatchObject({ name: 'MooringError', code: 'NO_SPACE' });
        // All full at once: none is dropped (they hold the same acknowledged data), the
        // caller gets the error and the volume keeps its three copies.
        expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
        // What was acknowledged before is still there, on every replica (reads rotate).
        for (let round = 0; round < 3; round++) {
          for (const i of acked) expectSame(await engine.read(i * MiB, MiB), pattern(100 + i, MiB), `acked write ${i}, read ${round}`);
        }
        // Overwriting data already allocated needs no new space: the volume still writes.
        await engine.write(0, pattern(200, 64 * 1024));
        expectSame(await engine.read(0, 64 * 1024), pattern(200, 64 * 1024), 'overwrite after ENOSPC');
      } finally {
        // Closing an engine whose replicas are all full may itself report NO_SPACE (its
        // metadata cannot be written); it must not hang or crash.
        await engine.close().catch((err: unknown) => expect(err).toMatchObject({ code: expect.stringMatching(/^(NO_SPACE|IO_ERROR)$/) }));
      }
      expect(acked.length).toBeGreaterThanOrEqual(1);
    });
  });

  describe('damaged metadata at LocalEngine.open', () => {
    it('answers CORRUPT_METADATA for a damaged or hostile replica.json, and opens again after repair', async () => {
      const replicas = await createReplicas(s.path('corrupt'), 3, 4 * MiB);
      const vol = await openEngine(replicas);
      await vol.write(0, pattern(110, 4096));
      await vol.close();
      const r1meta = `${replicaDir(replicas, 'r1')}/replica.json`;
      const savedReplicaJson = execFileSync('cat', [r1meta]);

      writeFileSync(r1meta, '{"format": 1, "layers": [');
      expect(await codeOf(openEngine(replicas))).toBe('CORRUPT_METADATA');
      // The failed open released every lock: the same answer again, not BUSY.
      expect(await codeOf(openEngine(replicas))).toBe('CORRUPT_METADATA');
      const meta = JSON.parse(savedReplicaJson.toString()) as { layers: Array<{ file: string }> };
      meta.layers[0]!.file = '../../r0/layer-L000001.img';
      writeFileSync(r1meta, JSON.stringify(meta));
      expect(await codeOf(openEngine(replicas))).toBe('CORRUPT_METADATA');
      writeFileSync(r1meta, savedReplicaJson);

      const ok = await openEngine(replicas);
      try {
        expectSame(await ok.read(0, 4096), pattern(110, 4096), 'after repair');
      } finally {
        await ok.close();
      }
      await assertReplicasIdentical(replicas);
    });
  });

  it('the comparison helper notices a replica that differs', async () => {
    const replicas = await createReplicas(s.path('differs'), 3, 4 * MiB);
    const vol = await openEngine(replicas);
    await vol.write(MiB, pattern(120, 8192));
    await vol.close();
    await assertReplicasIdentical(replicas);
    // One byte changed in one replica, and one block only one replica holds.
    const r1 = replicaDir(replicas, 'r1');
    const r2 = replicaDir(replicas, 'r2');
    await withReplica(r2, (r) => r.write(r.epoch(), MiB + 5000, Buffer.from([0])));
    await expect(assertReplicasIdentical(replicas)).rejects.toThrow(/replica r2 differs from replica r0 at byte 1053576/);
    await withReplica(r2, (r) => r.write(r.epoch(), MiB + 5000, pattern(120, 8192).subarray(5000, 5001)));
    await assertReplicasIdentical(replicas);
    await withReplica(r1, (r) => r.write(r.epoch(), 3 * MiB, Buffer.from([1])));
    await expect(assertReplicasIdentical(replicas)).rejects.toThrow(/replica r1 differs from replica r0 at byte 3145728/);
    // The open engine holds the replicas' locks: the helper reports BUSY rather than reading under it.
    const open = await openEngine(replicas);
    try {
      await expect(assertReplicasIdentical(replicas)).rejects.toMatchObject({ code: 'BUSY' });
    } finally {
      await open.close();
    }
  });
});
