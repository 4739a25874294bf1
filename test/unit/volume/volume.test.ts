import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { MooringError } from '../../../src/errors.js';
import { DirectoryVolume } from '../../../src/volume/directory-volume.js';
import { FakeAddon, nativeError } from '../fakes/fake-addon.js';

const MiB = 1024 * 1024;

describe('Volume', () => {
  let root: string;
  let dir: string;
  let addon: FakeAddon;
  const open: DirectoryVolume[] = [];

  async function create(extra: Partial<Parameters<typeof DirectoryVolume.create>[0]> = {}): Promise<DirectoryVolume> {
    const v = await DirectoryVolume.create({ dir, sizeBytes: MiB, addon, ...extra });
    open.push(v);
    return v;
  }

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-volume-'));
    dir = join(root, 'vol0');
    addon = new FakeAddon();
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((v) => v.close()));
    await rm(root, { recursive: true, force: true });
  });

  it('creates the directory layout and volume.json', async () => {
    const v = await create();
    expect(v.name).toBe('vol0');
    expect(v.sizeBytes).toBe(MiB);
    expect(v.replicaCount).toBe(3);
    expect((await readdir(dir)).sort()).toEqual(['replicas', 'volume.json', 'volume.lock']);
    expect((await readdir(join(dir, 'replicas'))).sort()).toEqual(['r0', 'r1', 'r2']);
    const spec = JSON.parse(await readFile(join(dir, 'volume.json'), 'utf8'));
    // The first engine's epoch was allocated from the counter (new replicas: 1) and recorded.
    expect(spec).toMatchObject({ format: 'mooring-volume', version: 1, name: 'vol0', sizeBytes: MiB, lastEpoch: 1 });
    expect(spec.replicas).toEqual([
      { id: 'r0', path: 'replicas/r0', mode: 'RW' },
      { id: 'r1', path: 'replicas/r1', mode: 'RW' },
      { id: 'r2', path: 'replicas/r2', mode: 'RW' },
    ]);
    await v.close();
    expect(await readdir(dir)).not.toContain('volume.lock');
  });

  it('validates create options', async () => {
    const bad = async (o: object) => expect(DirectoryVolume.create({ dir, sizeBytes: MiB, addon, ...o })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await bad({ sizeBytes: 0 });
    await bad({ sizeBytes: 4095 });
    await bad({ sizeBytes: 4096 + 1 });
    await bad({ sizeBytes: 2 ** 53 });
    await bad({ sizeBytes: '1M' });
    await bad({ replicas: 0 });
    await bad({ replicas: 17 });
    await bad({ replicas: 1.5 });
    await bad({ name: 'a/b' });
    await bad({ name: '..' });
    await bad({ name: 'x'.repeat(64) });
    await bad({ dir: '' });
    await bad({ dir: 'a\0b' });
    await expect(DirectoryVolume.create(null as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    // Nothing was created by the refused calls.
    await expect(readdir(dir)).rejects.toThrow();
  });

  it('refuses a non-empty directory and an existing volume', async () => {
    await mkdir(dir);
    await writeFile(join(dir, 'other'), 'x');
    await expect(create()).rejects.toMatchObject({ code: 'ALREADY_EXISTS' });
    await rm(join(dir, 'other'));
    const v = await create();
    await v.close();
    await expect(create()).rejects.toMatchObject({ code: 'ALREADY_EXISTS', message: expect.stringContaining('a volume exists') });
  });

  it('removes what it created when create fails', async () => {
    addon.failCreate = /r1$/;
    await expect(create()).rejects.toMatchObject({ code: 'NO_SPACE' });
    await expect(readdir(dir)).rejects.toMatchObject({ code: 'ENOENT' });
    await mkdir(dir);
    await expect(create()).rejects.toMatchObject({ code: 'NO_SPACE' });
    expect(await readdir(dir)).toEqual([]);
  });

  it('writes and reads through the engine, and reopens with a new epoch', async () => {
    const v = await create({ replicas: 2 });
    const data = Buffer.alloc(8192, 0xab);
    await v.write(4096, data);
    await v.flush();
    expect(await v.read(4096, 8192)).toEqual(data);
    expect(await v.read(0, 10)).toEqual(Buffer.alloc(10));
    const extents = await v.blockStatus(0, 16384);
    expect(extents).toEqual([
      { offset: 0, length: 4096, hole: true, zero: true },
      { offset: 4096, length: 8192, hole: false, zero: false },
      { offset: 12288, length: 4096, hole: true, zero: true },
    ]);
    await v.trim(4096, 4096);
    await v.writeZeroes(8192, 4096);
    expect(await v.read(4096, 8192)).toEqual(Buffer.alloc(8192));
    const epoch = v.epoch;
    await v.close();
    const again = await DirectoryVolume.open(dir, { addon });
    open.push(again);
    expect(again.epoch).toBe(epoch + 1);
    expect(again.uuid).toBe(v.uuid);
  });

  it('checks I/O ranges', async () => {
    const v = await create({ replicas: 1 });
    await expect(v.read(MiB - 4096, 8192)).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
    await expect(v.read(-1, 1)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(v.read(0, 0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(v.read(0.5, 1)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(v.read(0, 64 * MiB)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(v.write(MiB, Buffer.alloc(1))).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
    await expect(v.write(0, 'text' as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(v.trim(0, MiB + 4096)).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
  });

  it('close waits for calls in flight; calls after close reject with CLOSED', async () => {
    const v = await create();
    let release!: () => void;
    addon.engine.gate = new Promise((res) => (release = res));
    const write = v.write(0, Buffer.alloc(4096, 1));
    const read = v.read(0, 4096);
    await new Promise((r) => setTimeout(r, 10));
    let closed = false;
    const closing = v.close().then(() => (closed = true));
    expect(v.state).toBe('closing');
    await expect(v.read(0, 1)).rejects.toMatchObject({ code: 'CLOSED' });
    await new Promise((r) => setTimeout(r, 20));
    expect(closed).toBe(false);
    expect(addon.engine.closed).toBe(false);
    release();
    await closing;
    await expect(write).resolves.toBeUndefined();
    expect((await read).length).toBe(4096);
    expect(addon.engine.closed).toBe(true);
    expect(v.state).toBe('closed');
    for (const call of [() => v.write(0, Buffer.alloc(1)), () => v.flush(), () => v.listSnapshots(), () => v.export(), () => v.status()]) {
      await expect(call()).rejects.toMatchObject({ code: 'CLOSED' });
    }
    expect(() => v.epoch).toThrow(MooringError);
    await v.close(); // idempotent
  });

  it('records replica failures in volume.json and re-emits them', async () => {
    const v = await create();
    const events: unknown[] = [];
    v.on('replica-error', (e) => events.push(e));
    const sets: unknown[] = [];
    v.on('replica-set-changed', (e) => sets.push(e));
    addon.engine.failReplica(join(dir, 'replicas', 'r1'), 5);
    expect(events).toEqual([
      { replicaId: 'r1', path: join(dir, 'replicas', 'r1'), errno: 5, code: 'IO_ERROR', message: expect.stringContaining('I/O error') },
    ]);
    // Dropped by a commit of the replica set without it; the epoch stays the engine's.
    expect(sets).toEqual([{ epoch: v.epoch, generation: 2, rwReplicaIds: ['r0', 'r2'] }]);
    const status = await v.status();
    expect(status.healthy).toBe(false);
    expect(status.replicas.map((r) => [r.id, r.mode])).toEqual([['r0', 'RW'], ['r1', 'ERR'], ['r2', 'RW']]);
    expect(status.replicas[1]).toMatchObject({ lastErrno: 5, lastError: { errno: 5, code: 'IO_ERROR' } });
    await v.close();
    const spec = JSON.parse(await readFile(join(dir, 'volume.json'), 'utf8'));
    expect(spec.replicas[1]).toMatchObject({ id: 'r1', mode: 'ERR', lastError: { errno: 5, code: 'IO_ERROR' } });
    expect(spec.replicas[0].mode).toBe('RW');
  });

  it('records replicas fenced at open as ERR', async () => {
    const v = await create();
    addon.engine.failReplica(join(dir, 'replicas', 'r2'));
    await v.close();
    // Pretend the record was lost: the engine's epochs still tell.
    const spec = JSON.parse(await readFile(join(dir, 'volume.json'), 'utf8'));
    spec.replicas[2] = { id: 'r2', path: 'replicas/r2', mode: 'RW' };
    await writeFile(join(dir, 'volume.json'), JSON.stringify(spec));
    const again = await DirectoryVolume.open(dir, { addon });
    open.push(again);
    expect((await again.status()).replicas[2]!.mode).toBe('ERR');
    expect(JSON.parse(await readFile(join(dir, 'volume.json'), 'utf8')).replicas[2].mode).toBe('ERR');
  });

  it('exports once, refuses revert while exported, and closes the export before the engine', async () => {
    const v = await create();
    const seen: string[] = [];
    v.on('exported', (e) => seen.push(`exported ${e.address}`));
    v.on('unexported', (e) => seen.push(`unexported ${e.address}`));
    await v.createSnapshot('s1', { labels: { purpose: 'test' } });
    const exp = await v.export();
    expect(exp.addressString).toBe(`unix:${join(dir, 'nbd.sock')}`);
    expect(exp.uri).toBe(`nbd+unix:///?socket=${join(dir, 'nbd.sock')}`);
    expect((await v.status()).exported).toEqual({ address: exp.addressString, uri: exp.uri, exportName: '' });
    await expect(v.export()).rejects.toMatchObject({ code: 'INVALID_STATE' });
    await expect(v.revertToSnapshot('s1')).rejects.toMatchObject({ code: 'INVALID_STATE' });
    expect(addon.reverts).toEqual([]);
    await exp.close();
    expect(v.exported).toBeNull();
    await v.revertToSnapshot('s1');
    expect(addon.reverts).toEqual(['s1']);
    const tcp = await v.export({ nbd: 'tcp:127.0.0.1:0', exportName: 'disk' });
    expect(tcp.address).toMatchObject({ kind: 'tcp', host: '127.0.0.1' });
    expect((tcp.address as { port: number }).port).toBeGreaterThan(0);
    expect(tcp.uri).toMatch(/^nbd:\/\/127\.0\.0\.1:\d+\/disk$/);
    const server = addon.engine.servers[1]!;
    await v.close();
    // The fake engine throws if closed while a server runs; the volume closed it first.
    expect(server.closed).toBe(true);
    expect(seen).toEqual([
      `exported unix:${join(dir, 'nbd.sock')}`,
      `unexported unix:${join(dir, 'nbd.sock')}`,
      `exported ${tcp.addressString}`,
      `unexported ${tcp.addressString}`,
    ]);
  });

  it('maps address-in-use and keeps no export behind', async () => {
    const v = await create();
    addon.busyAddresses.add(join(dir, 'nbd.sock'));
    await expect(v.export()).rejects.toMatchObject({ code: 'ADDRESS_IN_USE', errno: 98 });
    expect(v.exported).toBeNull();
    await expect(v.export({ nbd: 'bogus:1' })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('lists user-visible snapshots with parents', async () => {
    const v = await create({ replicas: 1 });
    expect(await v.listSnapshots()).toEqual([]);
    const s1 = await v.createSnapshot('s1', { labels: { a: 'b' } });
    expect(s1).toMatchObject({ name: 's1', parent: null, labels: { a: 'b' }, userCreated: true, sizeBytes: MiB });
    await v.createSnapshot('s2');
    await v.createSnapshot('s3');
    await expect(v.createSnapshot('s3')).rejects.toMatchObject({ code: 'ALREADY_EXISTS' });
    await v.deleteSnapshot('s2');
    const list = await v.listSnapshots();
    expect(list.map((s) => [s.name, s.parent])).toEqual([
      ['s1', null],
      ['s3', 's1'],
    ]);
    await expect(v.deleteSnapshot('nope')).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(v.createSnapshot('bad name')).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(v.createSnapshot('ok', { labels: { 'bad key': 'x' } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(v.createSnapshot('ok', { labels: { k: 'line\nbreak' } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('locks the directory against a second opener', async () => {
    const v = await create();
    await expect(DirectoryVolume.open(dir, { addon })).rejects.toMatchObject({ code: 'BUSY' });
    await v.close();
    const again = await DirectoryVolume.open(dir, { addon });
    open.push(again);
  });

  it('takes over a stale lock from a dead process', async () => {
    const v = await create();
    await v.close();
    await writeFile(join(dir, 'volume.lock'), JSON.stringify({ pid: 2 ** 22 + 12345, hostname: (await import('node:os')).hostname(), acquiredMs: 1 }));
    const again = await DirectoryVolume.open(dir, { addon });
    open.push(again);
  });

  it('treats a lock of a live process as BUSY, unless its pid was reused', async () => {
    const v = await create();
    await v.close();
    const host = (await import('node:os')).hostname();
    await writeFile(join(dir, 'volume.lock'), JSON.stringify({ pid: process.ppid, hostname: host, acquiredMs: 1 }));
    await expect(DirectoryVolume.open(dir, { addon })).rejects.toMatchObject({ code: 'BUSY', details: { pid: process.ppid } });
    await writeFile(join(dir, 'volume.lock'), JSON.stringify({ pid: process.ppid, hostname: host, acquiredMs: 1, startTicks: 1 }));
    const again = await DirectoryVolume.open(dir, { addon });
    open.push(again);
    await again.close();
    await writeFile(join(dir, 'volume.lock'), JSON.stringify({ pid: 1, hostname: 'elsewhere', acquiredMs: 1 }));
    await expect(DirectoryVolume.open(dir, { addon })).rejects.toMatchObject({ code: 'BUSY' });
  });

  it('refuses damaged or hostile volume.json with CORRUPT_METADATA', async () => {
    const v = await create();
    await v.close();
    const file = join(dir, 'volume.json');
    const spec = JSON.parse(await readFile(file, 'utf8'));
    const hostile = [
      '{',
      JSON.stringify({ ...spec, replicas: [{ id: 'r0', path: '../../etc', mode: 'RW' }] }),
      JSON.stringify({ ...spec, sizeBytes: 'big' }),
      ...[-1, 1.5, '7', null, 2 ** 53].map((lastEpoch) => JSON.stringify({ ...spec, lastEpoch })),
    ];
    for (const bad of hostile) {
      await writeFile(file, bad);
      await expect(DirectoryVolume.open(dir, { addon })).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
      // A failed open leaves no lock behind.
      expect(await readdir(dir)).not.toContain('volume.lock');
    }
    await writeFile(file, JSON.stringify({ ...spec, replicas: [{ id: 'r0', path: 'replicas/r0', mode: 'RW', address: '10.0.0.2:9000' }] }));
    await expect(DirectoryVolume.open(dir, { addon })).rejects.toMatchObject({ code: 'UNSUPPORTED' });
  });

  describe('writer epochs (allocated from volume.json, docs/single-writer.md)', () => {
    // What each LocalEngine.open was handed: the epoch the Volume allocated, whatever the engine does with it.
    function recordEpochs(): number[] {
      const given: number[] = [];
      const openEngine = addon.openEngine.bind(addon);
      addon.openEngine = async (options) => {
        given.push(options.epoch ?? 0);
        return openEngine(options);
      };
      return given;
    }
    const counter = async (): Promise<unknown> => JSON.parse(await readFile(join(dir, 'volume.json'), 'utf8')).lastEpoch;

    it('hands every open a new epoch, above the counter, recorded in volume.json before the engine opens', async () => {
      const given = recordEpochs();
      await (await create({ replicas: 2 })).close();
      for (let i = 0; i < 3; i++) await (await DirectoryVolume.open(dir, { addon })).close();
      expect(given).toEqual([1, 2, 3, 4]);
      expect(await counter()).toBe(4);
      // The counter goes on even where the replicas' epochs are lower (it is never lowered).
      const spec = JSON.parse(await readFile(join(dir, 'volume.json'), 'utf8'));
      await writeFile(join(dir, 'volume.json'), JSON.stringify({ ...spec, lastEpoch: 20 }));
      await (await DirectoryVolume.open(dir, { addon })).close();
      expect(given.at(-1)).toBe(21);
      expect(await counter()).toBe(21);
    });

    it('opens a volume.json of the last release (no counter) above the epochs its replicas promised', async () => {
      const given = recordEpochs();
      await (await create()).close();
      const spec = JSON.parse(await readFile(join(dir, 'volume.json'), 'utf8'));
      delete spec.lastEpoch;
      await writeFile(join(dir, 'volume.json'), JSON.stringify(spec));
      // The last release's engines chose epochs themselves: 7 on one replica.
      addon.replica(join(dir, 'replicas', 'r1')).epoch = 7;
      const v = await DirectoryVolume.open(dir, { addon });
      open.push(v);
      expect(given).toEqual([1, 8]);
      expect(await counter()).toBe(8);
    });

    it('keeps an epoch whose open failed, and tries again above a replica that refused it', async () => {
      const given = recordEpochs();
      await (await create({ replicas: 2 })).close();
      // An open that fails after the epoch was allocated: the epoch is spent all the same.
      const openEngine = addon.openEngine;
      addon.openEngine = async (options) => {
        addon.openEngine = openEngine;
        given.push(options.epoch ?? 0);
        throw nativeError('IO_ERROR', 'disk gone', 5);
      };
      await expect(DirectoryVolume.open(dir, { addon })).rejects.toMatchObject({ code: 'IO_ERROR' });
      expect(await counter()).toBe(2);
      // A replica promised more than its metadata showed when the epoch was allocated.
      let refusals = 0;
      addon.openEngine = async (options) => {
        if (refusals++ < 1) {
          given.push(options.epoch ?? 0);
          addon.replica(join(dir, 'replicas', 'r0')).epoch = 40;
          throw nativeError('STALE_EPOCH', `epoch ${options.epoch} is not above the epoch 40 replica r0 promised`, 116);
        }
        addon.openEngine = openEngine;
        return openEngine(options); // records it
      };
      const v = await DirectoryVolume.open(dir, { addon });
      open.push(v);
      expect(given).toEqual([1, 2, 3, 41]);
      expect(await counter()).toBe(41);
      await v.close();
      // At most OPEN_EPOCH_ATTEMPTS_MAX epochs per open.
      addon.openEngine = async (options) => {
        given.push(options.epoch ?? 0);
        throw nativeError('STALE_EPOCH', 'refused', 116);
      };
      await expect(DirectoryVolume.open(dir, { addon })).rejects.toMatchObject({ code: 'STALE_EPOCH' });
      expect(given.slice(4)).toEqual([42, 43, 44]);
      expect(await counter()).toBe(44);
      expect(await readdir(dir)).not.toContain('volume.lock');
    });
  });

  it('reports a missing volume as NOT_FOUND', async () => {
    await expect(DirectoryVolume.open(join(root, 'missing'), { addon })).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await mkdir(dir);
    await expect(DirectoryVolume.open(dir, { addon })).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
});
