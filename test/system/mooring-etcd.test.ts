// Mooring with its control-plane store in a real etcd (ports 28220-28221): a volume is
// created, attached (NBD), written and detached by one Mooring; after it closed, a second
// Mooring on the same etcd and the same host directory finds the volume, attaches it again
// with a higher epoch and reads back what the first wrote.
import { existsSync } from 'node:fs';

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { Mooring } from '../../src/mooring.js';
import { EtcdStateStore } from '../../src/state/etcd-state-store.js';
import { EtcdServer } from '../../src/bench/etcd-server.js';
import { qemuIo, requireTool, run, TempDir } from './helpers/tools.js';

const MiB = 1024 * 1024;

describe('Mooring on an EtcdStateStore', () => {
  let server: EtcdServer;
  const t = new TempDir('mooring-etcd-');
  const stores: EtcdStateStore[] = [];
  const moorings: Mooring[] = [];
  const openStore = async (): Promise<EtcdStateStore> => {
    const s = await EtcdStateStore.open({ endpoints: [server.endpoint], prefix: '/cluster-a/' });
    stores.push(s);
    return s;
  };

  beforeAll(async () => {
    requireTool('qemu-io');
    requireTool('nbdinfo');
    server = await EtcdServer.start(28220, 28221);
  });
  afterEach(async () => {
    for (const m of moorings.splice(0)) await m.close();
    for (const s of stores.splice(0)) await s.close();
  });
  afterAll(async () => {
    await server?.destroy();
    t.cleanup();
  });

  it('creates, attaches, writes and detaches; a second Mooring on the same etcd reopens the volume with its data', async () => {
    const store1 = await openStore();
    const first = await Mooring.open({ dir: t.path, hostId: 'h1', store: store1, repairIntervalMs: 0 });
    moorings.push(first);
    const disk = await first.createVolume({ name: 'vm', sizeBytes: 8 * MiB });
    const st = await disk.attach({ nbd: `unix:${t.join('vm-1.sock')}` });
    expect(st).toMatchObject({ attachedHost: 'h1', state: 'healthy', replicaCount: 1 });
    expect((await run('nbdinfo', ['--size', st.nbd!.uri])).stdout.trim()).toBe(String(8 * MiB));
    await qemuIo(st.nbd!.uri, ['write -P 0x3d 1M 256k', 'write -P 0x3e 7M 64k']);
    await disk.detach();
    expect((await disk.status()).state).toBe('detached');
    // The records are in etcd, not in the host directory.
    expect((await store1.get('volume', 'vm'))?.value).toMatchObject({ name: 'vm' });
    expect(existsSync(t.join('state'))).toBe(false);
    await first.close();
    moorings.splice(0);

    const store2 = await openStore();
    const second = await Mooring.open({ dir: t.path, hostId: 'h1', store: store2, repairIntervalMs: 0 });
    moorings.push(second);
    expect((await second.listVolumes()).map((v) => v.name)).toEqual(['vm']);
    const again = await second.volume('vm').attach({ nbd: `unix:${t.join('vm-2.sock')}` });
    expect(again).toMatchObject({ attachedHost: 'h1', state: 'healthy' });
    expect(again.epoch).toBeGreaterThan(st.epoch);
    await qemuIo(again.nbd!.uri, ['read -P 0x3d 1M 256k', 'read -P 0x3e 7M 64k', 'read -P 0 2M 64k']);
    await second.volume('vm').detach();
    await second.deleteVolume('vm');
    expect(await second.listVolumes()).toEqual([]);
    expect(await store2.get('volume', 'vm')).toBeNull();
  });
});
