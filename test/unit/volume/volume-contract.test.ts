// The same Volume scenarios against the in-memory fake and the real addon, so the fake
// stays honest about what the native side does. The real addon must load: a missing
// build fails this suite loudly instead of skipping it.
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import type { NativeAddon } from '../../../src/native/binding.js';
import { loadAddon } from '../../../src/native/load.js';
import { DirectoryVolume } from '../../../src/volume/directory-volume.js';
import { FakeAddon } from '../fakes/fake-addon.js';

const MiB = 1 << 20;

const suites: Array<[string, () => NativeAddon]> = [
  ['fake addon', () => new FakeAddon()],
  ['real addon', () => loadAddon()],
];

for (const [label, make] of suites) {
  describe(`DirectoryVolume contract (${label})`, () => {
    let root: string;
    let addon: NativeAddon;
    beforeEach(async () => {
      root = await mkdtemp(join(tmpdir(), 'mooring-contract-'));
      addon = make();
    });
    afterEach(async () => {
      await rm(root, { recursive: true, force: true });
    });

    it('writes, reads, trims and reports allocation', async () => {
      const v = await DirectoryVolume.create({ dir: join(root, 'v'), sizeBytes: 4 * MiB, replicas: 3, addon });
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
        await expect(v.read(4 * MiB - 1, 2)).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
        const st = await v.status();
        expect(st.replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
        expect(st.healthy).toBe(true);
      } finally {
        await v.close();
      }
    });

    it('snapshots: create, list, delete, revert when not exported', async () => {
      const dir = join(root, 'v');
      const v = await DirectoryVolume.create({ dir, sizeBytes: 1 * MiB, replicas: 2, addon });
      try {
        await v.write(0, Buffer.alloc(4096, 1));
        const s1 = await v.createSnapshot('s1', { labels: { k: 'v' } });
        expect(s1).toMatchObject({ name: 's1', parent: null, labels: { k: 'v' }, userCreated: true });
        await v.write(0, Buffer.alloc(4096, 2));
        await v.createSnapshot('s2');
        await v.write(0, Buffer.alloc(4096, 3));
        expect((await v.listSnapshots()).map((s) => [s.name, s.parent])).toEqual([
          ['s1', null],
          ['s2', 's1'],
        ]);
        await expect(v.createSnapshot('s1')).rejects.toMatchObject({ code: 'ALREADY_EXISTS' });
        const exp = await v.export();
        await expect(v.revertToSnapshot('s1')).rejects.toMatchObject({ code: 'INVALID_STATE' });
        await exp.close();
        await v.deleteSnapshot('s2');
        expect((await v.listSnapshots()).map((s) => s.name)).toEqual(['s1']);
        await expect(v.deleteSnapshot('s2')).rejects.toMatchObject({ code: 'NOT_FOUND' });
        await expect(v.revertToSnapshot('nope')).rejects.toMatchObject({ code: 'NOT_FOUND' });
      } finally {
        await v.close();
      }
    });

    it('exports on a unix socket and TCP, closes cleanly, reopens with a higher epoch', async () => {
      const dir = join(root, 'v');
      const v = await DirectoryVolume.create({ dir, sizeBytes: 1 * MiB, replicas: 1, addon });
      const epoch = v.epoch;
      const exp = await v.export();
      expect(exp.uri).toBe(`nbd+unix:///?socket=${join(dir, 'nbd.sock')}`);
      expect(exp.stats()).toMatchObject({ connectionsOpen: 0 });
      await exp.close();
      const tcp = await v.export({ nbd: 'tcp:127.0.0.1:0' });
      expect(tcp.address.kind === 'tcp' && tcp.address.port > 0).toBe(true);
      await v.close();
      await expect(v.read(0, 1)).rejects.toMatchObject({ code: 'CLOSED' });
      expect(await readdir(dir)).not.toContain('nbd.sock');
      const again = await DirectoryVolume.open(dir, { addon });
      try {
        expect(again.epoch).toBeGreaterThan(epoch);
      } finally {
        await again.close();
      }
      expect((await stat(join(dir, 'volume.json'))).isFile()).toBe(true);
    });
  });
}
