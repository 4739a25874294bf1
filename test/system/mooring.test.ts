// The one entry point on its embedded defaults, with the real addon and real NBD clients:
// Mooring.open({ dir }) keeps the store and this host's data engine in one directory; a
// volume attached without naming a host is served here; the host id sticks to the
// directory; a second opener of the directory is refused; after a restart a volume that
// was attached serves again by itself; bad options are coded errors.
import { afterEach, beforeAll, describe, expect, it } from 'vitest';

import { Mooring } from '../../src/mooring.js';
import { MemoryStateStore } from '../../src/state/memory-state-store.js';
import { waitFor } from './helpers/hosts.js';
import { qemuIo, requireTool, run, TempDir } from './helpers/tools.js';

const MiB = 1024 * 1024;

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
