// The engine through the real addon: epochs across reopen and fencing of older writers
// (invariant 2), fan-out with a replica that really runs out of space (a 2 MiB tmpfs) and
// is dropped as ERR (invariant 3), NO_SPACE when every replica is full, identical replicas
// after each 3-replica scenario, and damaged metadata at Volume.open.
//
// The tmpfs tests mount filesystems and therefore need root (CI runs as root). They fail,
// never skip, without it.
import { execFileSync } from 'node:child_process';
import { renameSync, writeFileSync } from 'node:fs';
import { constants as osConstants } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { ReplicaErrorEvent } from '../../src/engine/engine.js';
import { DirectoryVolume } from '../../src/volume/directory-volume.js';
import {
  MiB,
  Scratch,
  assertReplicasIdentical,
  codeOf,
  mountTmpfs,
  pattern,
  readVolumeJson,
  replicaPath,
  unmount,
  waitFor,
  withReplica,
} from './helpers.js';

function expectSame(actual: Buffer, expected: Buffer, what: string): void {
  if (!actual.equals(expected)) {
    const at = actual.length !== expected.length ? -1 : actual.findIndex((b, i) => b !== expected[i]);
    throw new Error(`${what}: differs at byte ${at} (lengths ${actual.length}/${expected.length})`);
  }
}

/** Replica epochs as the replicas themselves record them (volume closed). */
async function replicaEpochs(dir: string): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const r of readVolumeJson(dir).replicas) out[r.id] = await withReplica(replicaPath(dir, r.id), async (x) => x.epoch());
  return out;
}

/** Moves a closed volume's replica directory onto a fresh tmpfs of `size`, content and all. */
function moveReplicaToTmpfs(volumeDir: string, id: string, size: string, mounts: string[]): void {
  const path = replicaPath(volumeDir, id);
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
    it('claims a strictly higher epoch on every replica at each open, and marks them clean at close', async () => {
      const dir = s.path('epochs');
      let vol = await DirectoryVolume.create({ dir, sizeBytes: 4 * MiB, replicas: 3 });
      const seen: number[] = [];
      for (let round = 0; round < 3; round++) {
        if (round > 0) vol = await DirectoryVolume.open(dir);
        const st = await vol.status();
        seen.push(st.epoch);
        expect(st.replicas.map((r) => [r.id, r.mode, r.epoch])).toEqual(
          ['r0', 'r1', 'r2'].map((id) => [id, 'RW', st.epoch]),
        );
        await vol.write(round * MiB + 1, pattern(round, 1000));
        await vol.close();
        expect(await replicaEpochs(dir)).toEqual({ r0: st.epoch, r1: st.epoch, r2: st.epoch });
        for (const r of readVolumeJson(dir).replicas) {
          expect(await withReplica(replicaPath(dir, r.id), async (x) => x.clean()), `${r.id} clean`).toBe(true);
        }
      }
      expect(seen[1]!).toBeGreaterThan(seen[0]!);
      expect(seen[2]!).toBeGreaterThan(seen[1]!);
      await assertReplicasIdentical(dir);
    });

    it('fences an older writer that comes back after a newer engine claimed the replicas', async () => {
      const dir = s.path('fence-old-writer');
      const vol0 = await DirectoryVolume.create({ dir, sizeBytes: 4 * MiB, replicas: 3 });
      await vol0.close();
      // Writer A claims the volume the way an engine does (max epoch + 1 on every replica),
      // writes, and goes away (say, partitioned) without closing cleanly.
      const ids = ['r0', 'r1', 'r2'];
      const epochA = Math.max(...Object.values(await replicaEpochs(dir))) + 1;
      for (const id of ids) {
        await withReplica(replicaPath(dir, id), async (r) => {
          await r.claimEpoch(epochA);
          await r.write(epochA, 0, Buffer.alloc(8192, 0xaa));
        });
      }
      // LocalEngine B opens the volume: it must claim above A, and its data wins.
      const vol = await DirectoryVolume.open(dir);
      const epochB = vol.epoch;
      expect(epochB).toBeGreaterThan(epochA);
      const b = pattern(60, 8192);
      await vol.write(0, b);
      await vol.close();
      // A comes back with its old epoch: refused on every replica, nothing changes.
      for (const id of ids) {
        await withReplica(replicaPath(dir, id), async (r) => {
          expect(r.epoch()).toBe(epochB);
          expect(await codeOf(r.write(epochA, 0, Buffer.alloc(8192, 0xbb))), id).toBe('STALE_EPOCH');
          expectSame(await r.read(0, 8192), b, `${id} after the stale write`);
        });
      }
      await assertReplicasIdentical(dir);
    });

    it('opens a replica missed by a newer writer as ERR (lower epoch) and never reads from it', async () => {
      const dir = s.path('fence-stale-replica');
      const size = 4 * MiB;
      const v1 = await DirectoryVolume.create({ dir, sizeBytes: size, replicas: 3 });
      const old = pattern(70, MiB);
      await v1.write(0, old);
      await v1.close();
      // A newer writer reached r0 and r1 only (r2 was unreachable): it claimed a higher
      // epoch there, committed its replica set (r0 and r1 RW: a majority) and overwrote the data.
      const newer = Math.max(...Object.values(await replicaEpochs(dir))) + 5;
      const fresh = pattern(71, MiB);
      for (const id of ['r0', 'r1']) {
        await withReplica(replicaPath(dir, id), async (r) => {
          await r.claimEpoch(newer);
          await r.setReplicaSet({ epoch: newer, generation: 1, members: ['r0', 'r1', 'r2'], rw: ['r0', 'r1'] });
          await r.write(newer, 0, fresh);
        });
      }
      const vol = await DirectoryVolume.open(dir);
      try {
        expect(vol.epoch).toBe(newer + 1);
        const st = await vol.status();
        expect(st.replicas.map((r) => [r.id, r.mode])).toEqual([
          ['r0', 'RW'],
          ['r1', 'RW'],
          ['r2', 'ERR'],
        ]);
        expect(st.healthy).toBe(false);
        // Round-robin reads would reach r2 within three tries if it were still used.
        for (let i = 0; i < 12; i++) expectSame(await vol.read(0, MiB), fresh, `read ${i}`);
        await waitFor('r2 recorded as ERR in volume.json', () => readVolumeJson(dir).replicas[2]!.mode === 'ERR');
        expect(readVolumeJson(dir).replicas[2]!.lastError).toMatchObject({ code: 'STALE_EPOCH', errno: osConstants.errno.ESTALE });
      } finally {
        await vol.close();
      }
      // The stale replica promised this engine's epoch but was neither written nor made RW:
      // the replica set the engine committed leaves it out, so it stays behind.
      const epochs = await replicaEpochs(dir);
      expect(epochs.r0).toBe(epochs.r1);
      const committed = await withReplica(replicaPath(dir, 'r0'), (r) => r.claimEpoch(r.epoch() + 1));
      expect(committed).toMatchObject({ epoch: epochs.r0, generation: 1, rw: ['r0', 'r1'] });
      await withReplica(replicaPath(dir, 'r2'), async (r) => expectSame(await r.read(0, MiB), old, 'r2 untouched'));
      // Reopened, it is still ERR.
      const again = await DirectoryVolume.open(dir);
      try {
        expect((await again.status()).replicas[2]!.mode).toBe('ERR');
        expectSame(await again.read(0, MiB), fresh, 'after reopen');
      } finally {
        await again.close();
      }
      await assertReplicasIdentical(dir, { exclude: ['r2'] });
    });
  });

  describe('a replica that runs out of space (real tmpfs, needs root)', () => {
    it('drops it as ERR with a typed event; the write succeeds; it stays ERR after reopen and is never read', async () => {
      const dir = s.path('nospace-one');
      const size = 8 * MiB;
      const created = await DirectoryVolume.create({ dir, sizeBytes: size, replicas: 3 });
      await created.close();
      moveReplicaToTmpfs(dir, 'r1', '2m', mounts);

      const model = Buffer.alloc(size);
      const vol = await DirectoryVolume.open(dir);
      const events: ReplicaErrorEvent[] = [];
      vol.on('replica-error', (e) => events.push(e));
      const sets: Array<{ epoch: number; generation: number; rwReplicaIds: string[] }> = [];
      vol.on('replica-set-changed', (e) => sets.push(e));
      try {
        const epochBefore = vol.epoch;
        expect((await vol.status()).replicas.every((r) => r.mode === 'RW')).toBe(true);
        // 4 MiB into a replica with 2 MiB of room: every write still succeeds.
        for (let i = 0; i < 4; i++) {
          const d = pattern(80 + i, MiB);
          await vol.write(i * MiB, d);
          d.copy(model, i * MiB);
        }
        await waitFor('a replica-error event', () => events.length > 0);
        expect(events).toHaveLength(1);
        expect(events[0]).toMatchObject({ replicaId: 'r1', code: 'NO_SPACE', errno: osConstants.errno.ENOSPC });
        expect(events[0]!.path).toBe(replicaPath(dir, 'r1'));
        const st = await vol.status();
        expect(st.replicas.map((r) => [r.id, r.mode])).toEqual([
          ['r0', 'RW'],
          ['r1', 'ERR'],
          ['r2', 'RW'],
        ]);
        expect(st.replicas[1]!.lastErrno).toBe(osConstants.errno.ENOSPC);
        expect(st.healthy).toBe(false);
        // Dropping it committed a replica set without it (the epoch stays the engine's).
        expect(st.epoch).toBe(epochBefore);
        await waitFor('a replica set without r1', () => sets.some((x) => x.generation === 2));
        expect(sets.find((x) => x.generation === 2)).toEqual({ epoch: epochBefore, generation: 2, rwReplicaIds: ['r0', 'r2'] });
        await waitFor('volume.json to record r1 as ERR', () => readVolumeJson(dir).replicas[1]!.mode === 'ERR');
        expect(readVolumeJson(dir).replicas[1]!.lastError).toMatchObject({ code: 'NO_SPACE', errno: osConstants.errno.ENOSPC });
        // Reads stay correct (and keep away from r1), writes go on.
        for (let i = 0; i < 6; i++) expectSame(await vol.read(0, size), model, `read ${i}`);
        const more = pattern(90, MiB);
        await vol.write(6 * MiB, more);
        more.copy(model, 6 * MiB);
        expectSame(await vol.read(0, size), model, 'after more writes');
      } finally {
        await vol.close();
      }
      // r0 and r2 durably hold the replica set that leaves r1 out (a claim answers with it).
      for (const id of ['r0', 'r2']) {
        const stored = await withReplica(replicaPath(dir, id), (r) => r.claimEpoch(r.epoch() + 1));
        expect(stored, id).toMatchObject({ generation: 2, rw: ['r0', 'r2'] });
      }
      // Poison what r1 holds, with its own (old) epoch: if the volume ever read from r1
      // again, the reads below would see it.
      await withReplica(replicaPath(dir, 'r1'), async (r) => {
        expect((await r.blockStatus(0, 4096))[0]!.flags).toBe(0); // r1 did get the first MiB
        await r.write(r.epoch(), 0, Buffer.alloc(4096, 0xee));
      });
      const reopened = await DirectoryVolume.open(dir);
      try {
        const st = await reopened.status();
        expect(st.replicas.map((r) => r.mode)).toEqual(['RW', 'ERR', 'RW']);
        for (let i = 0; i < 12; i++) expectSame(await reopened.read(0, 64 * 1024), model.subarray(0, 64 * 1024), `read ${i} after reopen`);
        expectSame(await reopened.read(0, size), model, 'whole volume after reopen');
      } finally {
        await reopened.close();
      }
      expect(readVolumeJson(dir).replicas.map((r) => r.mode)).toEqual(['RW', 'ERR', 'RW']);
      await assertReplicasIdentical(dir, { exclude: ['r1'], expected: model });
    });

    it('passes NO_SPACE to the caller when every replica is full', async () => {
      const dir = s.path('nospace-all');
      const size = 8 * MiB;
      const created = await DirectoryVolume.create({ dir, sizeBytes: size, replicas: 3 });
      await created.close();
      for (const id of ['r0', 'r1', 'r2']) moveReplicaToTmpfs(dir, id, '2m', mounts);
      const vol = await DirectoryVolume.open(dir);
      let failure: unknown;
      const acked: number[] = [];
      try {
        for (let i = 0; i < 4 && failure === undefined; i++) {
          await vol.write(i * MiB, pattern(100 + i, MiB)).then(
            () => acked.push(i),
            (err: unknown) => (failure = err),
          );
        }
        expect(failure, 'a write that fits nowhere must fail').toBeDefined();
        expect(failure).toMatchObject({ name: 'MooringError', code: 'NO_SPACE' });
        // All full at once: none is dropped (they hold the same acknowledged data), the
        // caller gets the error and the volume keeps its three copies.
        expect((await vol.status()).replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
        // What was acknowledged before is still there, on every replica (reads rotate).
        for (let round = 0; round < 3; round++) {
          for (const i of acked) expectSame(await vol.read(i * MiB, MiB), pattern(100 + i, MiB), `acked write ${i}, read ${round}`);
        }
        // Overwriting data already allocated needs no new space: the volume still writes.
        await vol.write(0, pattern(200, 64 * 1024));
        expectSame(await vol.read(0, 64 * 1024), pattern(200, 64 * 1024), 'overwrite after ENOSPC');
      } finally {
        // Closing a volume whose replicas are all full may itself report NO_SPACE (its
        // metadata cannot be written); it must not hang or crash.
        await vol.close().catch((err: unknown) => expect(err).toMatchObject({ code: expect.stringMatching(/^(NO_SPACE|IO_ERROR)$/) }));
      }
      expect(acked.length).toBeGreaterThanOrEqual(1);
    });
  });

  describe('damaged metadata at DirectoryVolume.open', () => {
    it('answers CORRUPT_METADATA for a damaged replica.json or volume.json, and stays openable after repair', async () => {
      const dir = s.path('corrupt');
      const vol = await DirectoryVolume.create({ dir, sizeBytes: 4 * MiB, replicas: 3 });
      await vol.write(0, pattern(110, 4096));
      await vol.close();
      const r1meta = `${replicaPath(dir, 'r1')}/replica.json`;
      const saved = readVolumeJson(dir);
      const savedReplicaJson = execFileSync('cat', [r1meta]);

      writeFileSync(r1meta, '{"format": 1, "layers": [');
      expect(await codeOf(DirectoryVolume.open(dir))).toBe('CORRUPT_METADATA');
      // The failed open released every lock: the same answer again, not BUSY.
      expect(await codeOf(DirectoryVolume.open(dir))).toBe('CORRUPT_METADATA');
      const meta = JSON.parse(savedReplicaJson.toString()) as { layers: Array<{ file: string }> };
      meta.layers[0]!.file = '../../r0/layer-L000001.img';
      writeFileSync(r1meta, JSON.stringify(meta));
      expect(await codeOf(DirectoryVolume.open(dir))).toBe('CORRUPT_METADATA');
      writeFileSync(r1meta, savedReplicaJson);

      writeFileSync(`${dir}/volume.json`, 'not json at all');
      expect(await codeOf(DirectoryVolume.open(dir))).toBe('CORRUPT_METADATA');
      writeFileSync(`${dir}/volume.json`, JSON.stringify({ ...saved, replicas: [{ id: 'r0', path: '../../etc', mode: 'RW' }] }));
      expect(await codeOf(DirectoryVolume.open(dir))).toBe('CORRUPT_METADATA');
      writeFileSync(`${dir}/volume.json`, JSON.stringify(saved));

      const ok = await DirectoryVolume.open(dir);
      try {
        expectSame(await ok.read(0, 4096), pattern(110, 4096), 'after repair');
      } finally {
        await ok.close();
      }
      await assertReplicasIdentical(dir);
    });
  });

  it('the comparison helper notices a replica that differs', async () => {
    const dir = s.path('differs');
    const vol = await DirectoryVolume.create({ dir, sizeBytes: 4 * MiB, replicas: 3 });
    await vol.write(MiB, pattern(120, 8192));
    await vol.close();
    await assertReplicasIdentical(dir);
    // One byte changed in one replica, and one block only one replica holds.
    await withReplica(replicaPath(dir, 'r2'), (r) => r.write(r.epoch(), MiB + 5000, Buffer.from([0])));
    await expect(assertReplicasIdentical(dir)).rejects.toThrow(/replica r2 differs from replica r0 at byte 1053576/);
    await withReplica(replicaPath(dir, 'r2'), (r) => r.write(r.epoch(), MiB + 5000, pattern(120, 8192).subarray(5000, 5001)));
    await assertReplicasIdentical(dir);
    await withReplica(replicaPath(dir, 'r1'), (r) => r.write(r.epoch(), 3 * MiB, Buffer.from([1])));
    await expect(assertReplicasIdentical(dir)).rejects.toThrow(/replica r1 differs from replica r0 at byte 3145728/);
    // The open volume holds the replicas' locks: the helper reports BUSY rather than reading under it.
    const open = await DirectoryVolume.open(dir);
    try {
      await expect(assertReplicasIdentical(dir)).rejects.toMatchObject({ code: 'BUSY' });
    } finally {
      await open.close();
    }
  });
});
