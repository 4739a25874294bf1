// Operations that attach a volume by themselves (attachment tickets, seed 002), with three
// `mooring data-engine` processes as hosts: a snapshot of a detached volume, its export to
// a raw file, a clone into a new volume, and a rebuild of a detached volume whose replica
// missed writes. Each attaches without frontend, does its work and detaches again.
import { readFileSync } from 'node:fs';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import type { Mooring } from '../../../src/mooring.js';
import type { FileStateStore } from '../../../src/state/file-state-store.js';
import { makeHosts, openCluster, readReplicas, type HostProcess } from '../helpers/hosts.js';
import { killAllServers } from '../helpers/serve.js';
import { TempDir, qemuIo } from '../helpers/tools.js';

const MiB = 1 << 20;
const SIZE = 16 * MiB;
const VOLUME = 'ops-vol';

describe('three data-engine hosts, operations with their own tickets', () => {
  let tmp: TempDir;
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  let store: FileStateStore;
  let port = 17530;

  beforeEach(async () => {
    tmp = new TempDir();
    hosts = makeHosts(tmp.path, 3, port);
    port += 10;
    for (const h of hosts) await h.start();
    ({ cluster, store } = await openCluster(tmp.path, hosts, { repairIntervalMs: 0 }));
  });

  afterEach(async () => {
    await cluster?.close();
    await store?.close();
    for (const h of hosts) await h.stop().catch(() => undefined);
    await killAllServers();
    tmp.cleanup();
  });

  const uri = (name: string): string => `nbd+unix:///?socket=${tmp.join(`${name}.sock`)}`;
  const diag = (): string => hosts.map((h) => h.diagnostics()).join('');

  async function writeDetached(patterns: string[]): Promise<void> {
    const vol = cluster.volume(VOLUME);
    await vol.attach({ host: 'a', nbd: `unix:${tmp.join(`${VOLUME}.sock`)}` });
    await qemuIo(uri(VOLUME), patterns);
    // The engine's handle, read from a data engine in another process (over gRPC).
    const engine = await vol.engine();
    expect(engine, diag()).toMatchObject({ hostId: 'a', role: 'active', healthy: true, nbd: { uri: uri(VOLUME) } });
    expect(engine!.replicas.map((r) => r.hostId).sort()).toEqual(['a', 'b', 'c']);
    expect(engine!.nbdStats!.bytesWritten).toBeGreaterThan(0);
    await vol.detach();
  }

  it('snapshots, exports and clones a detached volume; each operation attaches it without frontend and detaches', async () => {
    await cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3 });
    await writeDetached(['write -P 0x31 0 2M', 'write -P 0x32 8M 1M']);
    const vol = cluster.volume(VOLUME);
    const started: string[] = [];
    cluster.on('data-engine-event', (host, e) => {
      if (e.type === 'engine-stopped') started.push(`${host}:stopped`);
    });

    const snap = await vol.createSnapshot('s1', { labels: { why: 'test' } });
    expect(snap).toMatchObject({ name: 's1', labels: { why: 'test' } });
    expect((await vol.status()).state).toBe('detached');
    expect(await vol.tickets()).toEqual([]);
    expect(started.length, 'the snapshot attached the volume and detached it').toBeGreaterThanOrEqual(1);

    // Writes after the snapshot are not in its export.
    await writeDetached(['write -P 0x33 0 1M']);
    const path = tmp.join('s1.raw');
    const exp = await vol.exportSnapshot('s1', { path, host: 'b' });
    expect(exp).toMatchObject({ hostId: 'b', sizeBytes: SIZE, copiedBytes: 3 * MiB });
    const raw = readFileSync(path);
    expect(raw.subarray(0, 2 * MiB).every((b) => b === 0x31)).toBe(true);
    expect(raw.subarray(8 * MiB, 9 * MiB).every((b) => b === 0x32)).toBe(true);
    expect(raw.subarray(2 * MiB, 8 * MiB).every((b) => b === 0)).toBe(true);
    expect((await vol.status()).state).toBe('detached');

    const clone = await cluster.volume(VOLUME).clone({ snapshot: 's1', name: 'ops-clone', replicas: 2 });
    expect(clone.copiedBytes).toBe(3 * MiB);
    expect(await clone.volume.status()).toMatchObject({ state: 'detached', replicaCount: 2 });
    expect((await vol.status()).state).toBe('detached');
    await cluster.volume('ops-clone').attach({ host: 'c', nbd: `unix:${tmp.join('ops-clone.sock')}` });
    await qemuIo(uri('ops-clone'), ['read -P 0x31 0 2M', 'read -P 0x32 8M 1M', 'read -P 0 2M 6M']);
    await cluster.volume('ops-clone').detach();
    expect((await vol.listSnapshots()).map((x) => x.name)).toEqual(['s1']);
    expect((await vol.status()).state).toBe('detached');
  });

  it('rebuilds a detached volume whose replica missed writes, then detaches', async () => {
    await cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3 });
    const vol = cluster.volume(VOLUME);
    await vol.attach({ host: 'a', nbd: `unix:${tmp.join(`${VOLUME}.sock`)}` });
    await qemuIo(uri(VOLUME), ['write -P 0x41 0 1M']);
    await hosts[2]!.crash();
    await qemuIo(uri(VOLUME), ['write -P 0x42 1M 1M']); // c misses this one
    await vol.detach();
    await hosts[2]!.start();
    await cluster.addHost(hosts[2]!.engine);
    const st = await vol.rebuild({ timeoutMs: 60_000 });
    expect(st.state, diag()).toBe('healthy');
    expect((await vol.status()).state).toBe('detached');
    expect(await vol.tickets()).toEqual([]);
    const list = st.replicas.map((r) => ({ host: hosts.find((h) => h.hostId === r.hostId)!, name: r.name }));
    const contents = await readReplicas(list, SIZE);
    expect(new Set(contents.map((c) => c.digest)).size, 'replicas differ after the rebuild').toBe(1);
  });
});
