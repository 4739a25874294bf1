// Snapshots through the real addon: O(1) create, listing as users see them (the data
// engine's visibleSnapshots), name checks, delete by merge and by prune with real space
// reclaimed, revert (refused while exported), on a LocalEngine over three replicas that are
// compared afterwards; and a chain of 1,000 snapshots.
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { visibleSnapshots } from '../../src/data-engine/snapshots.js';
import type { EngineSnapshotInfo } from '../../src/data-engine/data-engine.js';
import { LocalEngine } from '../../src/engine/engine.js';
import {
  BLOCK,
  MiB,
  KiB,
  Scratch,
  addon,
  assertReplicasIdentical,
  codeOf,
  createReplicas,
  pattern,
  replicaDir,
  withReplica,
  nextEpoch,
  engineOptions,
  type ReplicaDir,
} from './helpers.js';

function expectSame(actual: Buffer, expected: Buffer, what: string): void {
  if (!actual.equals(expected)) {
    const at = actual.length !== expected.length ? -1 : actual.findIndex((b, i) => b !== expected[i]);
    throw new Error(`${what}: differs at byte ${at} (lengths ${actual.length}/${expected.length})`);
  }
}

describe('snapshots on a 3-replica engine (real addon)', () => {
  const size = 32 * MiB;
  let s: Scratch;
  let replicas: ReplicaDir[];
  let vol: LocalEngine;
  const model = Buffer.alloc(size);

  async function write(off: number, data: Buffer): Promise<void> {
    await vol.write(off, data);
    data.copy(model, off);
  }
  async function allocated(): Promise<number[]> {
    return vol.replicas().map((r) => r.allocatedBytes);
  }
  async function checkData(what: string): Promise<void> {
    expectSame(await vol.read(0, size), model, what);
  }
  async function listSnapshots(): Promise<EngineSnapshotInfo[]> {
    return visibleSnapshots(await vol.listLayers());
  }
  // Takes a snapshot and returns it as listed.
  async function createSnapshot(name: string, labels?: Record<string, string>): Promise<EngineSnapshotInfo> {
    await vol.createSnapshot(name, labels === undefined ? {} : { labels });
    const found = (await listSnapshots()).find((x) => x.name === name);
    if (!found) throw new Error(`snapshot ${name} is not listed`);
    return found;
  }

  beforeAll(async () => {
    s = new Scratch('mooring-native-snap-');
    replicas = await createReplicas(s.path('vol'), 3, size);
    vol = await LocalEngine.open({ replicas, epoch: nextEpoch() });
  });
  afterAll(async () => {
    await vol.close().catch(() => undefined);
    s.cleanup();
  });

  it('creates a snapshot in O(1): nothing copied, allocation unchanged, listed with its metadata', async () => {
    await write(0, pattern(1, 4 * MiB));
    await vol.flush();
    const before = await allocated();
    const headBefore = (await vol.listLayers()).find((l) => l.head)!;
    expect(headBefore.allocatedBytes).toBeGreaterThanOrEqual(4 * MiB);
    const t0 = Date.now();
    const snap = await createSnapshot('s1', { owner: 'tests', 'example.com/purpose': 'o(1)' });
    const t1 = Date.now();
    expect(snap).toMatchObject({
      name: 's1',
      parent: null,
      labels: { owner: 'tests', 'example.com/purpose': 'o(1)' },
      sizeBytes: size,
      userCreated: true,
      allocatedBytes: headBefore.allocatedBytes, // the old head's file, untouched
    });
    expect(snap.createdMs).toBeGreaterThanOrEqual(t0);
    expect(snap.createdMs).toBeLessThanOrEqual(t1);
    expect(await allocated()).toEqual(before);
    const layers = await vol.listLayers();
    expect(layers.map((l) => [l.name, l.head, l.parentId === '' ? '' : 'p'])).toEqual([
      ['s1', false, ''],
      ['', true, 'p'],
    ]);
    expect(layers[1]!.allocatedBytes).toBe(0);
    await checkData('after snapshot');

    await write(5 * MiB, pattern(2, MiB));
    const s2 = await createSnapshot('s2');
    expect(s2.parent).toBe('s1');
    expect(s2.labels).toEqual({});
    expect((await listSnapshots()).map((x) => [x.name, x.parent])).toEqual([
      ['s1', null],
      ['s2', 's1'],
    ]);
  });

  it('refuses bad, duplicate and unknown names with coded errors', async () => {
    for (const bad of ['', 'a/b', '../x', '.', '..', 'x'.repeat(64), 'sp ace', 'é', 'a\0b']) {
      expect(await codeOf(vol.createSnapshot(bad)), JSON.stringify(bad)).toBe('INVALID_ARGUMENT');
    }
    expect(await codeOf(vol.createSnapshot('s1'))).toBe('ALREADY_EXISTS');
    expect(await codeOf(vol.deleteSnapshot('nope'))).toBe('NOT_FOUND');
    expect(await codeOf(vol.revert('nope'))).toBe('NOT_FOUND');
    expect((await listSnapshots()).map((x) => x.name)).toEqual(['s1', 's2']);
  });

  it('deletes a snapshot with a snapshot child by merging: one layer less, data intact, space reclaimed', async () => {
    // s1 holds [0, 4M), s2 [5M, 6M). Deleting s2 (only child: the head) hides it; then s3
    // takes a head that shadows s1's first MiB: s1 -> s2 (removed) -> s3 -> head.
    await vol.deleteSnapshot('s2');
    await write(0, pattern(3, MiB));
    await write(8 * MiB, pattern(4, MiB));
    await createSnapshot('s3');
    await write(12 * MiB, pattern(5, MiB));
    await checkData('before merge');
    const layersBefore = await vol.listLayers();
    // One snapshot's layers (what a data engine's createSnapshot answers from): s3 and the
    // way to its visible parent past the removed s2, exactly as the full listing has them.
    const mine = await vol.snapshotLayers('s3');
    expect(mine.map((l) => l.name)).toEqual(['s1', 's2', 's3']);
    expect(mine).toEqual(layersBefore.filter((l) => !l.head && ['s1', 's2', 's3'].includes(l.name)));
    expect(visibleSnapshots(mine).find((x) => x.name === 's3')?.parent).toBe('s1');
    expect(await vol.snapshotLayers('s2')).toEqual([]); // removed: not a snapshot any more
    expect(await vol.snapshotLayers('nope')).toEqual([]);
    const before = await allocated();

    await vol.deleteSnapshot('s1');
    const layersAfter = await vol.listLayers();
    expect(layersAfter.length).toBeLessThan(layersBefore.length);
    expect(layersAfter.find((l) => l.name === 's1')).toBeUndefined();
    expect((await listSnapshots()).map((x) => [x.name, x.parent])).toEqual([['s3', null]]);
    await checkData('after merge');
    // s1's first MiB was shadowed by s3's copy: merging dropped it, so each replica frees
    // about 1 MiB (the other 3 MiB moved into the child).
    const after = await allocated();
    after.forEach((a, i) => {
      const freed = before[i]! - a;
      expect(freed, `replica r${i}`).toBeGreaterThanOrEqual(MiB - 64 * KiB);
      expect(freed, `replica r${i}`).toBeLessThanOrEqual(MiB + 64 * KiB);
    });
  });

  it('deletes a snapshot whose only child is the head by pruning: hidden, space reclaimed, data intact', async () => {
    const s3 = (await listSnapshots()).find((x) => x.name === 's3')!;
    await write(8 * MiB, pattern(6, 2 * MiB)); // the head shadows s3's [8M, 9M) (and more)
    await vol.flush();
    const before = await allocated();
    await vol.deleteSnapshot('s3');
    expect(await listSnapshots()).toEqual([]);
    const layers = await vol.listLayers();
    const kept = layers.find((l) => l.id === s3.id)!;
    expect(kept.removed).toBe(true); // still under the head, hidden
    await checkData('after prune');
    const after = await allocated();
    after.forEach((a, i) => {
      const freed = before[i]! - a;
      expect(freed, `replica r${i}`).toBeGreaterThanOrEqual(MiB - 64 * KiB);
      expect(freed, `replica r${i}`).toBeLessThanOrEqual(MiB + 64 * KiB);
    });
  });

  it('reverts to a snapshot, and refuses while exported', async () => {
    await createSnapshot('good');
    const good = Buffer.from(model);
    await write(20 * MiB, pattern(7, MiB));
    await write(100, pattern(8, 5000));
    const exp = await vol.exportNbd({ nbd: `unix:${s.path('nbd.sock')}` });
    try {
      expect(await codeOf(vol.revert('good'))).toBe('INVALID_STATE');
      await checkData('after refused revert');
    } finally {
      await exp.close();
    }
    await vol.revert('good');
    good.copy(model);
    await checkData('after revert');
    expect((await listSnapshots()).map((x) => x.name)).toEqual(['good']);
    // The volume is writable after revert, and the snapshot stays as it was.
    await write(0, pattern(9, BLOCK));
    await checkData('write after revert');
  });

  it('leaves the three replicas identical, with the same layers', async () => {
    await vol.close();
    const r = await assertReplicasIdentical(replicas, { expected: model });
    expect(r.ids).toEqual(['r0', 'r1', 'r2']);
    const lists = [];
    for (const id of r.ids) {
      lists.push(await withReplica(replicaDir(replicas, id), async (rep) => (await rep.listLayers()).map((l) => [l.id, l.parent, l.name, l.removed])));
    }
    expect(lists[1]).toEqual(lists[0]);
    expect(lists[2]).toEqual(lists[0]);
  });

  it('refuses bad names at the native boundary too (not only in TypeScript)', async () => {
    const rdir = s.path('native-names');
    await addon().createReplica(rdir, MiB);
    const engine = await addon().openEngine(engineOptions({ replicas: [rdir] }));
    try {
      for (const bad of ['', 'a/b', '../x', 'x'.repeat(256), 'new\nline']) {
        expect(await codeOf(engine.snapshot(bad, {}, true)), JSON.stringify(bad)).toBe('INVALID_ARGUMENT');
      }
      expect(await codeOf(engine.snapshot('ok', { '': 'v' }, true))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(engine.snapshot('ok', 'labels' as unknown as Record<string, string>, true))).toBe('INVALID_ARGUMENT');
      await engine.snapshot('ok', {}, true);
      expect(await codeOf(engine.snapshot('ok', {}, true))).toBe('ALREADY_EXISTS');
      expect(await codeOf(engine.deleteSnapshot('missing'))).toBe('NOT_FOUND');
      expect((await engine.listSnapshots()).map((l) => l.name)).toEqual(['ok', '']);
    } finally {
      await engine.close();
    }
  });

  it('keeps labels of any text through replica.json (written directly, not through a JSON tree) and a reopen', async () => {
    const rdir = s.path('label-text');
    await addon().createReplica(rdir, MiB);
    const labels = { plain: 'v', 'quote"key': 'back\\slash', 'ctl\u0001\t\n': 'del\u007f', 'utf8 é ✓': '日本', empty: '' };
    let engine = await addon().openEngine(engineOptions({ replicas: [rdir] }));
    try {
      await engine.snapshot('one', labels, true);
      await engine.snapshot('two', {}, true);
    } finally {
      await engine.close();
    }
    const text = readFileSync(`${rdir}/replica.json`, 'utf8');
    const json = JSON.parse(text) as { layers: Array<{ name: string; labels: Record<string, string> }> };
    expect(json.layers.map((l) => l.name)).toEqual(['one', 'two', '']);
    expect(json.layers[0]!.labels).toEqual(labels);
    // The layout of every replica.json before: one-space indent, keys in the documented order.
    expect(text).toContain('\n "layers": [\n  {\n   "id": "L000001",\n   "file": "layer-L000001.img",\n   "parent": "",\n   "name": "one",\n');
    expect(text.endsWith('\n  }\n ]\n}\n')).toBe(true);
    engine = await addon().openEngine(engineOptions({ replicas: [rdir] }));
    try {
      expect((await engine.listSnapshots()).find((l) => l.name === 'one')!.labels).toEqual(labels);
    } finally {
      await engine.close();
    }
  });
});

describe('a chain of 1,000 snapshots (real addon)', () => {
  it('takes 1,000 snapshots each over a distinct write, reopens, and reads every write back', async () => {
    const s = new Scratch('mooring-native-chain-');
    try {
      const dir = s.path('r0');
      const count = 1000;
      await addon().createReplica(dir, 64 * MiB);
      // Each write: 300 bytes at an unaligned offset in its own 16 KiB slot.
      const at = (i: number): number => i * 16 * KiB + (i % 7) * 100;
      const data = (i: number): Buffer => pattern(1000 + i, 300);
      let engine = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', path: dir }] });
      const t0 = Date.now();
      try {
        for (let i = 0; i < count; i++) {
          await engine.write(at(i), data(i));
          await engine.createSnapshot(`s${i}`);
        }
      } finally {
        await engine.close();
      }
      const tCreate = Date.now() - t0;
      const t1 = Date.now();
      engine = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', path: dir }] });
      const tOpen = Date.now() - t1;
      try {
        const layers = await engine.listLayers();
        expect(layers).toHaveLength(count + 1);
        expect(layers[count - 1]!.name).toBe(`s${count - 1}`);
        const t2 = Date.now();
        const reads = await Promise.all(Array.from({ length: count }, (_, i) => engine.read(at(i), 300)));
        const tRead = Date.now() - t2;
        reads.forEach((b, i) => expectSame(b, data(i), `write ${i}`));
        // Nothing else is set: the gap after each write reads as zeros through the chain.
        expect((await engine.read(at(500) + 300, 100)).every((b) => b === 0)).toBe(true);
        // Deleting from the middle of the long chain merges into its child.
        const t3 = Date.now();
        await engine.deleteSnapshot('s500');
        const tDelete = Date.now() - t3;
        expect(await engine.listLayers()).toHaveLength(count);
        expectSame(await engine.read(at(500), 300), data(500), 'write 500 after deleting s500');
        expectSame(await engine.read(at(501), 300), data(501), 'write 501 after deleting s500');
        console.log(
          `1,000-snapshot chain: create ${tCreate} ms (write + snapshot each), reopen ${tOpen} ms, ` +
            `1,000 reads ${tRead} ms, delete from the middle ${tDelete} ms`,
        );
      } finally {
        await engine.close();
      }
      await withReplica(dir, async (r) => {
        expect(await r.listLayers()).toHaveLength(count);
        expectSame(await r.read(at(999), 300), data(999), 'write 999 via openReplica');
      });
    } finally {
      s.cleanup();
    }
  });

  it("a replica's allocated bytes match its layer files after every snapshot, write, delete and revert (the figure below the head is kept between changes)", async () => {
    const s = new Scratch('mooring-native-alloc-');
    try {
      const dir = s.path('r');
      await addon().createReplica(dir, 8 * MiB);
      const engine = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', path: dir }] });
      const onDisk = (): number =>
        readdirSync(dir)
          .filter((n) => /^layer-L\d+\.img$/.test(n))
          .reduce((sum, n) => sum + statSync(join(dir, n)).blocks * 512, 0);
      try {
        const seed = Number(process.env.MOORING_TEST_SEED ?? Date.now() % 1_000_000) || 1;
        console.log(`allocation seed ${seed} (MOORING_TEST_SEED=${seed} repeats it)`);
        let x = seed;
        const rand = (n: number): number => ((x = (x * 48271) % 2147483647), x % n);
        const live: string[] = [];
        for (let i = 0; i < 60; i++) {
          const op = rand(10);
          if (op < 4) {
            // 1 to 4 blocks, wholly inside the 8 MiB (2,048 blocks) volume.
            const blocks = 1 + rand(4);
            await engine.write(rand(2048 - blocks + 1) * BLOCK, pattern(i, BLOCK * blocks));
          } else if (op < 7) {
            await engine.createSnapshot(`s${i}`);
            live.push(`s${i}`);
          } else if (op < 9 && live.length > 0) {
            await engine.deleteSnapshot(live.splice(rand(live.length), 1)[0]!);
          } else if (live.length > 0) {
            await engine.revert(live[rand(live.length)]!);
          }
          expect(engine.replicas()[0]!.allocatedBytes, `after step ${i} (op ${op})`).toBe(onDisk());
        }
      } finally {
        await engine.close();
      }
    } finally {
      s.cleanup();
    }
  });
});
