// The one entry point on its embedded defaults, with the real addon and real NBD clients:
// Mooring.open({ dir }) keeps the store and this host's data engine in one directory; a
// volume attached without naming a host is served here; the host id sticks to the
// directory; a second opener of the directory is refused; after a restart a volume that
// was attached serves again by itself; bad options are coded errors; and a directory the
// last single-directory release wrote (test/fixtures/legacy-volume) opens in place, its
// data, snapshot and epochs kept.
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';

import { Mooring } from '../../src/mooring.js';
import { MemoryStateStore } from '../../src/state/memory-state-store.js';
import { importDirectoryVolume } from '../../src/volume/directory-import.js';
import { VolumeLock } from '../../src/volume/volume-lock.js';
import { waitFor } from './helpers/hosts.js';
import { qemuIo, requireTool, run, TempDir } from './helpers/tools.js';

const KiB = 1024;
const MiB = 1024 * KiB;

// A volume directory of the last single-directory release: 2 replicas, 8 MiB, snapshot
// release-1, lastEpoch 2, fills 0x6c at 0, 0x6d at 3M, 0x6e at 8M-4k (before the snapshot)
// and 0x6f at 1M (after it). How it was made: test/fixtures/legacy-volume/README.md.
const LEGACY_VOLUME = fileURLToPath(new URL('../fixtures/legacy-volume/legacy-volume.tar.gz', import.meta.url));
const extractLegacyVolume = (dir: string) => run('tar', ['-xzf', LEGACY_VOLUME, '-C', dir]);

describe('Mooring (embedded defaults)', () => {
  const dirs: TempDir[] = [];
  const open: Mooring[] = [];
  const tmp = (): TempDir => {
    const d = new TempDir('mooring-m-');
    dirs.push(d);
    return d;
  };
  const opened = async (options: Parameters<typeof Mooring.open>[0]): Promise<Mooring> => {
    const m = await Mooring.open(options);
    open.push(m);
    return m;
  };

  beforeAll(() => {
    requireTool('qemu-io');
    requireTool('nbdinfo');
  });
  afterEach(async () => {
    for (const m of open.splice(0)) await m.close();
    for (const d of dirs.splice(0)) d.cleanup();
  });

  it('serves a volume attached on this host over NBD, one replica per host by default', async () => {
    const t = tmp();
    const m = await opened({ dir: t.path, hostId: 'h1', repairIntervalMs: 0 });
    expect(m.hostId).toBe('h1');
    expect(m.hostIds).toEqual(['h1']);
    const disk = await m.createVolume({ name: 'disk0', sizeBytes: 16 * MiB });
    const st = await disk.attach({ nbd: `unix:${t.join('d.sock')}` });
    expect(st).toMatchObject({ attachedHost: 'h1', state: 'healthy', replicaCount: 1, epoch: 1 });
    const info = await run('nbdinfo', ['--size', st.nbd!.uri]);
    expect(info.stdout.trim()).toBe(String(16 * MiB));
    await qemuIo(st.nbd!.uri, ['write -P 0x5c 1M 256k', 'read -P 0x5c 1M 256k']);
    // The engine's handle: where it runs, its epoch, replicas, export and the export's counters.
    const engine = await disk.engine();
    expect(engine).toMatchObject({ volume: 'disk0', hostId: 'h1', epoch: st.epoch, role: 'active', sizeBytes: 16 * MiB, healthy: true, nbd: st.nbd });
    expect(engine!.replicas.map((r) => `${r.id}@${r.hostId}:${r.mode}:${r.lastErrno}`)).toEqual(['r0@h1:RW:0']);
    expect(engine!.nbdStats!.bytesWritten).toBeGreaterThanOrEqual(256 * 1024);
    expect(engine!.nbdStats!.bytesRead).toBeGreaterThanOrEqual(256 * 1024);
    expect(engine!.nbdStats!.connectionsTotal).toBeGreaterThanOrEqual(2);
    // Three replicas need three hosts: refused with the reason, nothing left behind.
    await expect(m.createVolume({ name: 'disk1', sizeBytes: MiB, replicas: 3 })).rejects.toMatchObject({ code: 'UNAVAILABLE' });
    expect((await m.listVolumes()).map((v) => v.name)).toEqual(['disk0']);
    await disk.detach();
    expect((await disk.status()).state).toBe('detached');
    expect(await disk.engine()).toBeNull();
    await m.deleteVolume('disk0');
    expect(await m.listVolumes()).toEqual([]);
  });

  it('keeps the host id of its directory, refuses a second opener, and serves attached volumes again after a restart', async () => {
    const t = tmp();
    const first = await Mooring.open({ dir: t.path, hostId: 'h7', repairIntervalMs: 100 });
    const disk = await first.createVolume({ name: 'vm', sizeBytes: 8 * MiB });
    const st = await disk.attach({ nbd: `unix:${t.join('vm.sock')}` });
    await qemuIo(st.nbd!.uri, ['write -P 0x7e 0 64k']);
    await expect(Mooring.open({ dir: t.path, repairIntervalMs: 0 })).rejects.toMatchObject({ code: 'BUSY' });
    await first.close();
    // The engine stopped with the process that ran it; no attach call after the restart.
    const again = await opened({ dir: t.path, repairIntervalMs: 100 });
    expect(again.hostId).toBe('h7');
    const vol = again.volume('vm');
    const serving = await waitFor(async () => (await vol.status()).state === 'healthy', 30_000, 50);
    expect(serving, JSON.stringify(await vol.status())).toBe(true);
    const after = await vol.status();
    expect(after.epoch).toBeGreaterThan(st.epoch);
    await qemuIo(after.nbd!.uri, ['read -P 0x7e 0 64k']);
  });

  it('answers bad options and host-less attaches with coded errors', async () => {
    await expect(Mooring.open(undefined as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Mooring.open({})).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Mooring.open({ dir: '' })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Mooring.open({ dir: tmp().path, hostId: '../up' })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Mooring.open({ store: new MemoryStateStore(), dataEngine: {} })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    // A process that only decides (no data engine) must name the host.
    const m = await opened({ store: new MemoryStateStore(), repairIntervalMs: 0 });
    expect(m.hostId).toBeNull();
    await expect(m.volume('x').attach()).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/needs a host/) });
  });
});

describe('Mooring over a directory of the single-directory release', () => {
  const t = new TempDir('mooring-imp-');
  afterEach(() => t.cleanup());

  it('opens the volume in place: records in the store, replicas moved under this host, data, snapshot and epochs kept', async () => {
    const dir = t.path;
    await extractLegacyVolume(dir);
    // Held by another opener right now (as `mooring serve` holds it): the import waits for it (BUSY), nothing moves.
    const held = await VolumeLock.acquire(dir);
    try {
      await expect(Mooring.open({ dir, hostId: 'h1', repairIntervalMs: 0 })).rejects.toMatchObject({ code: 'BUSY' });
    } finally {
      await held.release();
    }
    expect(existsSync(join(dir, 'volume.json'))).toBe(true);
    expect(readdirSync(join(dir, 'replicas')).sort()).toEqual(['r0', 'r1']);

    const m = await Mooring.open({ dir, hostId: 'h1', repairIntervalMs: 0 });
    try {
      expect(m.imported).toEqual({ volume: 'legacy', replicas: 2, lastEpoch: 2 });
      expect(existsSync(join(dir, 'volume.json'))).toBe(false);
      expect(existsSync(join(dir, 'volume.json.imported'))).toBe(true);
      expect(readdirSync(join(dir, 'replicas'))).toEqual([]);
      const [st] = await m.listVolumes();
      expect(st).toMatchObject({ name: 'legacy', sizeBytes: 8 * MiB, replicaCount: 2, state: 'detached' });
      expect(st!.replicas.map((r) => `${r.id}@${r.hostId}`)).toEqual(['r0@h1', 'r1@h1']);
      const vol = m.volume('legacy');
      const attached = await vol.attach({ nbd: `unix:${join(dir, 'legacy.sock')}` });
      expect(attached.state).toBe('healthy');
      // Above every epoch the last release handed out: its replicas refuse no write.
      expect(attached.epoch).toBeGreaterThan(m.imported!.lastEpoch);
      await qemuIo(attached.nbd!.uri, [
        'read -P 0x6c 0 64k',
        'read -P 0 64k 960k',
        'read -P 0x6f 1M 4k',
        'read -P 0 1028k 2044k',
        'read -P 0x6d 3M 64k',
        'read -P 0x6e 8188k 4k',
        'write -P 0x70 0 4k',
      ]);
      const snapshots = await vol.listSnapshots();
      expect(snapshots.map((x) => [x.name, x.parent, x.labels, x.sizeBytes])).toEqual([['release-1', null, { purpose: 'upgrade-test' }, 8 * MiB]]);
      // The snapshot holds the data as it was when taken: without the second serve's fill, nor ours.
      const raw = join(dir, 'release-1.raw');
      await vol.exportSnapshot('release-1', { path: raw });
      const image = readFileSync(raw);
      const expected = Buffer.alloc(8 * MiB);
      expected.fill(0x6c, 0, 64 * KiB).fill(0x6d, 3 * MiB, 3 * MiB + 64 * KiB).fill(0x6e, 8 * MiB - 4 * KiB);
      expect(image.equals(expected), 'release-1 as exported').toBe(true);
    } finally {
      await m.close();
    }
    // Opened again: nothing left to import; the volume serves again by itself.
    const again = await Mooring.open({ dir, repairIntervalMs: 100 });
    try {
      expect(again.imported).toBeNull();
      expect(again.hostId).toBe('h1');
      const vol = again.volume('legacy');
      expect(await waitFor(async () => (await vol.status()).state === 'healthy', 30_000, 50)).toBe(true);
      await qemuIo((await vol.status()).nbd!.uri, ['read -P 0x70 0 4k', 'read -P 0x6f 1M 4k', 'read -P 0x6d 3M 64k']);
    } finally {
      await again.close();
    }
  });
});

describe('importing a single-directory volume, interrupted', () => {
  const t = new TempDir('mooring-imp2-');
  afterEach(() => t.cleanup());

  it('finishes at the next try wherever it stopped, with the same records and no replica lost', async () => {
    const dir = t.path;
    await extractLegacyVolume(dir);
    const store = new MemoryStateStore();
    // The store fails the write of the second replica's record, once: r0 has moved, r1 not.
    let puts = 0;
    const flakyPut: MemoryStateStore['put'] = async (kind, key, value, opts) => {
      if (kind === 'replica' && ++puts === 2) throw new Error('power cut');
      return store.put(kind, key, value, opts);
    };
    const flaky = new Proxy(store, {
      get: (target, prop) => {
        if (prop === 'put') return flakyPut;
        const v = Reflect.get(target, prop) as unknown;
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
      },
    });
    const engineDir = join(dir, 'host');
    await expect(importDirectoryVolume(dir, flaky, 'h1', engineDir)).rejects.toThrow(/power cut/);
    expect(readdirSync(join(dir, 'replicas'))).toEqual(['r1']);
    expect(existsSync(join(dir, 'volume.json'))).toBe(true);
    expect(await importDirectoryVolume(dir, store, 'h1', engineDir)).toEqual({ volume: 'legacy', replicas: 2, lastEpoch: 2 });
    const records = (await store.list<{ id: string; name: string }>('replica')).map((d) => d.value);
    expect(records.map((r) => r.id).sort()).toEqual(['r0', 'r1']);
    expect(readdirSync(join(engineDir, 'replicas')).sort()).toEqual(records.map((r) => r.name).sort());
    expect(await importDirectoryVolume(dir, store, 'h1', engineDir)).toBeNull();
  });
});
