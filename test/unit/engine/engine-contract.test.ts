// The same LocalEngine scenarios against the in-memory fake and the real addon, so the fake
// stays honest about what the native side does: I/O and allocation, range checks, snapshots
// as users see them, NBD exports, and a reopen that needs an epoch above the last. The real
// addon must load: a missing build fails this suite loudly instead of skipping it.
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { visibleSnapshots } from '../../../src/data-engine/snapshots.js';
import { LocalEngine, type EngineReplicaSpec } from '../../../src/engine/engine.js';
import type { NativeAddon } from '../../../src/native/binding.js';
import { loadAddon } from '../../../src/native/load.js';
import { FakeAddon } from '../fakes/fake-addon.js';

const MiB = 1 << 20;

const suites: Array<[string, () => NativeAddon]> = [
  ['fake addon', () => new FakeAddon()],
  ['real addon', () => loadAddon()],
];

// Epochs are allocated by the caller (docs/single-writer.md); here, a counter.
let lastEpoch = 0;

for (const [label, make] of suites) {
  describe(`LocalEngine contract (${label})`, () => {
    let root: string;
    let addon: NativeAddon;
    beforeEach(async () => {
      root = await mkdtemp(join(tmpdir(), 'mooring-contract-'));
      addon = make();
    });
    afterEach(async () => {
      await rm(root, { recursive: true, force: true });
    });

    // `count` new replicas of `sizeBytes` and an engine over them.
    async function openNew(count: number, sizeBytes: number): Promise<{ engine: LocalEngine; replicas: EngineReplicaSpec[] }> {
      const replicas = Array.from({ length: count }, (_, i) => ({ id: `r${i}`, path: join(root, `r${i}`) }));
      for (const r of replicas) await addon.createReplica(r.path, sizeBytes);
      return { engine: await LocalEngine.open({ replicas, addon, epoch: ++lastEpoch }), replicas };
    }

    it('writes, reads, trims and reports allocation', async () => {
      const { engine: v } = await openNew(3, 4 * MiB);
      try {
        const a = Buffer.alloc(3 * 4096, 0x5a);
        await v.write(8192, a);
        const odd = Buffer.from('unaligned write across a block boundary');
        await v.write(4096 * 10 - 7, odd, { fua: true });
        await v.flush();
        expect(await v.read(8192, a.length)).toEqual(a);
        expect(await v.read(4096 * 10 - 7, odd.length)).toEqual(odd);
        expect(await v.read(0, 8192)).toEqual(Buffer.alloc(8192));
        const map = await v.blockStatus(0, 4 * MiB);
        expect(map.reduce((n, e) => n + e.length, 0)).toBeLessThanOrEqual(4 * MiB);
        expect(map[0]).toMatchObject({ offset: 0, hole: true, zero: true });
        const dataExtent = map.find((e) => e.offset <= 8192 && e.offset + e.length > 8192);
        expect(dataExtent).toMatchObject({ hole: false, zero: false });
        await v.trim(8192, 3 * 4096);
        expect(await v.read(8192, 3 * 4096)).toEqual(Buffer.alloc(3 * 4096));
        const after = await v.blockStatus(8192, 3 * 4096);
        expect(after.every((e) => e.zero)).toBe(true);
        await v.writeZeroes(4096 * 9, 8192);
        expect(await v.read(4096 * 10 - 7, odd.length)).toEqual(Buffer.alloc(odd.length));
        expect(v.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
      } finally {
        await v.close();
      }
    });

    it('checks I/O ranges', async () => {
      const { engine: v } = await openNew(1, MiB);
      try {
        await expect(v.read(MiB - 4096, 8192)).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
        await expect(v.read(MiB - 1, 2)).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
        await expect(v.read(-1, 1)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
        await expect(v.read(0, 0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
        await expect(v.read(0.5, 1)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
        await expect(v.read(0, 64 * MiB)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
        await expect(v.write(MiB, Buffer.alloc(1))).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
        await expect(v.write(0, 'text' as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
        await expect(v.trim(0, MiB + 4096)).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
      } finally {
        await v.close();
      }
    });

    it('snapshots: create, list as users see them, delete, revert only when not exported', async () => {
      const { engine: v } = await openNew(2, MiB);
      const list = async () => visibleSnapshots(await v.listLayers());
      try {
        await v.write(0, Buffer.alloc(4096, 1));
        await v.createSnapshot('s1', { labels: { k: 'v' } });
        expect((await list())[0]).toMatchObject({ name: 's1', parent: null, labels: { k: 'v' }, userCreated: true, sizeBytes: MiB });
        await v.write(0, Buffer.alloc(4096, 2));
        await v.createSnapshot('s2');
        await v.write(0, Buffer.alloc(4096, 3));
        expect((await list()).map((s) => [s.name, s.parent])).toEqual([
          ['s1', null],
          ['s2', 's1'],
        ]);
        await expect(v.createSnapshot('s1')).rejects.toMatchObject({ code: 'ALREADY_EXISTS' });
        await expect(v.createSnapshot('bad name')).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
        await expect(v.createSnapshot('ok', { labels: { k: 'line\nbreak' } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
        const exp = await v.exportNbd({ nbd: `unix:${join(root, 'nbd.sock')}` });
        await expect(v.revert('s1')).rejects.toMatchObject({ code: 'INVALID_STATE' });
        await exp.close();
        await v.deleteSnapshot('s2');
        expect((await list()).map((s) => s.name)).toEqual(['s1']);
        await expect(v.deleteSnapshot('s2')).rejects.toMatchObject({ code: 'NOT_FOUND' });
        await expect(v.revert('nope')).rejects.toMatchObject({ code: 'NOT_FOUND' });
        await v.revert('s1');
        expect(await v.read(0, 4096)).toEqual(Buffer.alloc(4096, 1));
      } finally {
        await v.close();
      }
    });

    it('exports on a unix socket and TCP, closes cleanly, and reopens only with an epoch above the last', async () => {
      const { engine: v, replicas } = await openNew(1, MiB);
      const epoch = v.epoch;
      const sock = join(root, 'nbd.sock');
      const exp = await v.exportNbd({ nbd: `unix:${sock}` });
      expect(exp.uri).toBe(`nbd+unix:///?socket=${sock}`);
      expect(exp.stats()).toMatchObject({ connectionsOpen: 0 });
      await exp.close();
      const tcp = await v.exportNbd({ nbd: 'tcp:127.0.0.1:0', exportName: 'disk' });
      expect(tcp.address.kind === 'tcp' && tcp.address.port > 0).toBe(true);
      expect(tcp.uri).toMatch(/^nbd:\/\/127\.0\.0\.1:\d+\/disk$/);
      await v.close();
      expect(tcp.closed).toBe(true);
      await expect(v.read(0, 1)).rejects.toMatchObject({ code: 'CLOSED' });
      expect(await readdir(root)).not.toContain('nbd.sock');
      // The replicas promised `epoch`: an engine given it (or less) again is refused.
      await expect(LocalEngine.open({ replicas, addon, epoch })).rejects.toMatchObject({ code: 'STALE_EPOCH' });
      const again = await LocalEngine.open({ replicas, addon, epoch: ++lastEpoch });
      try {
        expect(again.epoch).toBeGreaterThan(epoch);
        expect(again.replicas()[0]).toMatchObject({ mode: 'RW', epoch: again.epoch });
      } finally {
        await again.close();
      }
    });
  });
}
