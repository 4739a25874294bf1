// Mooring.open({ dir }) on its embedded defaults (the store in DIR/state, this host's data
// engine in DIR/host), with the fake addon: what a caller gets back for bad create options,
// a replica that cannot be made, a directory another process holds, an NBD export and its
// address, and a damaged volume directory of the single-directory release.
import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { newVolumeSpec, writeVolumeSpec } from '../../../src/volume/volume-spec.js';
import { codeOf } from '../../helpers/codes.js';
import { FakeAddon } from '../fakes/fake-addon.js';

const MiB = 1024 * 1024;

describe('Mooring.open({ dir })', () => {
  let root: string;
  let dir: string;
  let addon: FakeAddon;
  const open: Mooring[] = [];

  async function opened(): Promise<Mooring> {
    const m = await Mooring.open({ dir, hostId: 'h1', repairIntervalMs: 0, dataEngine: { addon, replicaListen: null } });
    open.push(m);
    return m;
  }

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-embedded-'));
    dir = join(root, 'm');
    addon = new FakeAddon();
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((m) => m.close()));
    await rm(root, { recursive: true, force: true });
  });

  it('validates create options, and a refused create leaves nothing behind', async () => {
    const m = await opened();
    const bad = async (o: object) => expect(await codeOf(m.createVolume({ name: 'v', sizeBytes: MiB, ...o })), JSON.stringify(o)).toBe('INVALID_ARGUMENT');
    for (const sizeBytes of [0, 4095, 4096 + 1, 2 ** 53, '1M']) await bad({ sizeBytes });
    for (const replicas of [0, 17, 1.5]) await bad({ replicas });
    for (const name of ['a/b', '..', 'x'.repeat(64), '', undefined]) await bad({ name });
    expect(await codeOf(m.createVolume(null as never))).toBe('INVALID_ARGUMENT');
    expect(await m.listVolumes()).toEqual([]);
    expect(await readdir(join(dir, 'host', 'replicas'))).toEqual([]);
    await expect(Mooring.open({ dir: join(root, 'a\0b') })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('fails a create whose replica cannot be made with the native code, and leaves nothing behind', async () => {
    const m = await opened();
    addon.failCreate = /v-r0/;
    expect(await codeOf(m.createVolume({ name: 'v', sizeBytes: MiB }))).toBe('NO_SPACE');
    expect(await m.listVolumes()).toEqual([]);
    expect(await readdir(join(dir, 'host', 'replicas'))).toEqual([]);
    addon.failCreate = undefined;
    expect((await (await m.createVolume({ name: 'v', sizeBytes: MiB })).status()).replicaCount).toBe(1);
  });

  it('is BUSY while a live process holds DIR; takes it over from a dead process or a reused pid; BUSY for another host', async () => {
    await (await opened()).close();
    open.splice(0);
    const lock = join(dir, 'state', 'state.lock');
    const holder = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      await writeFile(lock, JSON.stringify({ pid: holder.pid, hostname: hostname(), acquiredMs: 1 }));
      await expect(opened()).rejects.toMatchObject({ code: 'BUSY', details: { pid: holder.pid } });
    } finally {
      holder.kill('SIGKILL');
      await new Promise((r) => holder.once('exit', r));
    }
    // Its owner is gone: the lock is stale and taken over.
    await (await opened()).close();
    open.splice(0);
    // A live pid whose process started at another time is not the owner (the pid was reused).
    await writeFile(lock, JSON.stringify({ pid: process.ppid, hostname: hostname(), acquiredMs: 1, startTicks: 1 }));
    await (await opened()).close();
    open.splice(0);
    // Another host's lock cannot be checked from here: BUSY.
    await writeFile(lock, JSON.stringify({ pid: 1, hostname: 'elsewhere', acquiredMs: 1 }));
    await expect(opened()).rejects.toMatchObject({ code: 'BUSY', details: { hostname: 'elsewhere' } });
  });

  it('attaches with an NBD export on a unix socket or TCP (status and engine carry address and URI), and detaching closes it', async () => {
    const m = await opened();
    const v = await m.createVolume({ name: 'v', sizeBytes: MiB });
    const sock = join(root, 'v.sock');
    const st = await v.attach({ nbd: `unix:${sock}` });
    expect(st.nbd).toEqual({ address: `unix:${sock}`, uri: `nbd+unix:///?socket=${sock}` });
    expect((await v.engine())?.nbd).toEqual(st.nbd);
    const server = addon.engine.servers[0]!;
    expect(server.options.unixPath).toBe(sock);
    await v.detach();
    expect(server.closed).toBe(true);
    expect((await v.status()).nbd).toBeNull();
    const tcp = await v.attach({ nbd: 'tcp:127.0.0.1:0' });
    expect(tcp.nbd!.address).toMatch(/^tcp:127\.0\.0\.1:[1-9]\d*$/);
    expect(tcp.nbd!.uri).toBe(`nbd://127.0.0.1:${tcp.nbd!.address.split(':')[2]}/`);
  });

  it('answers a bad NBD address with INVALID_ARGUMENT and one in use with ADDRESS_IN_USE, serving nothing', async () => {
    const m = await opened();
    const v = await m.createVolume({ name: 'v', sizeBytes: MiB });
    expect(await codeOf(v.attach({ nbd: 'bogus:1' }))).toBe('INVALID_ARGUMENT');
    const sock = join(root, 'taken.sock');
    addon.busyAddresses.add(sock);
    expect(await codeOf(v.attach({ nbd: `unix:${sock}`, timeoutMs: 2000 }))).toBe('ADDRESS_IN_USE');
    // The engine started for the export was stopped again.
    expect(addon.engines.length).toBeGreaterThan(0);
    expect(addon.engines.every((e) => e.closed)).toBe(true);
    expect(await v.engine()).toBeNull();
  });

  it('refuses a damaged or hostile volume.json of the single-directory release with CORRUPT_METADATA, moving and locking nothing', async () => {
    await mkdir(join(dir, 'replicas', 'r0'), { recursive: true });
    const spec = newVolumeSpec('old', MiB, 1);
    await writeVolumeSpec(dir, spec);
    const file = join(dir, 'volume.json');
    const hostile = [
      '{',
      JSON.stringify({ ...spec, replicas: [{ id: 'r0', path: '../../etc', mode: 'RW' }] }),
      JSON.stringify({ ...spec, sizeBytes: 'big' }),
      ...[-1, 1.5, '7', null, 2 ** 53].map((lastEpoch) => JSON.stringify({ ...spec, lastEpoch })),
    ];
    for (const bad of hostile) {
      await writeFile(file, bad);
      await expect(opened(), bad).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
      expect((await readdir(dir)).sort()).toEqual(['replicas', 'state', 'volume.json']);
      expect(await readdir(join(dir, 'replicas'))).toEqual(['r0']);
    }
    await writeFile(file, JSON.stringify({ ...spec, replicas: [{ id: 'r0', path: 'replicas/r0', mode: 'RW', address: '10.0.0.2:9000' }] }));
    await expect(opened()).rejects.toMatchObject({ code: 'UNSUPPORTED' });
    expect(await readdir(join(dir, 'replicas'))).toEqual(['r0']);
  });
});
