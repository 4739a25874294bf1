// Operations that attach a volume by themselves (attachment tickets, seed 002), with three
// `mooring data-engine` processes as hosts: a snapshot of a detached volume, its export to
// a raw file, a clone into a new volume, and a rebuild of a detached volume whose replica
// missed writes. Each attaches without frontend, does its work and detaches again.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

import { useHostCluster } from '../helpers/host-cluster.js';
import { readReplicas } from '../helpers/hosts.js';
import { qemuIo } from '../helpers/tools.js';

const MiB = 1 << 20;
const SIZE = 16 * MiB;
const VOLUME = 'ops-vol';

describe('three data-engine hosts, operations with their own tickets', () => {
  const env = useHostCluster({ hosts: 3, basePort: 17530, cluster: { repairIntervalMs: 0 } });

  const uri = (name: string): string => `nbd+unix:///?socket=${env.tmp.join(`${name}.sock`)}`;
  const diag = (): string => env.hosts.map((h) => h.diagnostics()).join('');

  async function writeDetached(patterns: string[]): Promise<void> {
    const vol = env.cluster.volume(VOLUME);
    await vol.attach({ host: 'a', nbd: `unix:${env.tmp.join(`${VOLUME}.sock`)}` });
    await qemuIo(uri(VOLUME), patterns);
    // The engine's handle, read from a data engine in another process (over gRPC).
    const engine = await vol.engine();
    expect(engine, diag()).toMatchObject({ hostId: 'a', role: 'active', healthy: true, nbd: { uri: uri(VOLUME) } });
    expect(engine!.replicas.map((r) => r.hostId).sort()).toEqual(['a', 'b', 'c']);
    expect(engine!.nbdStats!.bytesWritten).toBeGreaterThan(0);
    await vol.detach();
  }

  it('snapshots, exports and clones a detached volume; each operation attaches it without frontend and detaches', async () => {
    await env.cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3 });
    await writeDetached(['write -P 0x31 0 2M', 'write -P 0x32 8M 1M']);
    const vol = env.cluster.volume(VOLUME);
    const started: string[] = [];
    env.cluster.on('data-engine-event', (host, e) => {
      if (e.type === 'engine-stopped') started.push(`${host}:stopped`);
    });

    const snap = await vol.createSnapshot('s1', { labels: { why: 'test' } });
    expect(snap).toMatchObject({ name: 's1', labels: { why: 'test' } });
    expect((await vol.status()).state).toBe('detached');
    expect(await vol.tickets()).toEqual([]);
    expect(started.length, 'the snapshot attached the volume and detached it').toBeGreaterThanOrEqual(1);

    // Writes after the snapshot are not in its export.
    await writeDetached(['write -P 0x33 0 1M']);
    const path = env.tmp.join('s1.raw');
    const exp = await vol.exportSnapshot('s1', { path, host: 'b' });
    expect(exp).toMatchObject({ hostId: 'b', sizeBytes: SIZE, copiedBytes: 3 * MiB });
    const raw = readFileSync(path);
    expect(raw.subarray(0, 2 * MiB).every((b) => b === 0x31)).toBe(true);
    expect(raw.subarray(8 * MiB, 9 * MiB).every((b) => b === 0x32)).toBe(true);
    expect(raw.subarray(2 * MiB, 8 * MiB).every((b) => b === 0)).toBe(true);
    expect((await vol.status()).state).toBe('detached');

    const clone = await env.cluster.volume(VOLUME).clone({ snapshot: 's1', name: 'ops-clone', replicas: 2 });
    expect(clone.copiedBytes).toBe(3 * MiB);
    expect(await clone.volume.status()).toMatchObject({ state: 'detached', replicaCount: 2 });
    expect((await vol.status()).state).toBe('detached');
    await env.cluster.volume('ops-clone').attach({ host: 'c', nbd: `unix:${env.tmp.join('ops-clone.sock')}` });
    await qemuIo(uri('ops-clone'), ['read -P 0x31 0 2M', 'read -P 0x32 8M 1M', 'read -P 0 2M 6M']);
    await env.cluster.volume('ops-clone').detach();
    expect((await vol.listSnapshots()).map((x) => x.name)).toEqual(['s1']);
    expect((await vol.status()).state).toBe('detached');
  });

  it('rebuilds a detached volume whose replica missed writes, then detaches', async () => {
    await env.cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3 });
    const vol = env.cluster.volume(VOLUME);
    await vol.attach({ host: 'a', nbd: `unix:${env.tmp.join(`${VOLUME}.sock`)}` });
    await qemuIo(uri(VOLUME), ['write -P 0x41 0 1M']);
    await env.hosts[2]!.crash();
    await qemuIo(uri(VOLUME), ['write -P 0x42 1M 1M']); // c misses this one
    await vol.detach();
    await env.hosts[2]!.start();
    await env.cluster.addHost(env.hosts[2]!.engine);
    const st = await vol.rebuild({ timeoutMs: 60_000 });
    expect(st.state, diag()).toBe('healthy');
    expect((await vol.status()).state).toBe('detached');
    expect(await vol.tickets()).toEqual([]);
    const list = st.replicas.map((r) => ({ host: env.hosts.find((h) => h.hostId === r.hostId)!, name: r.name }));
    const contents = await readReplicas(list, SIZE);
    expect(new Set(contents.map((c) => c.digest)).size, 'replicas differ after the rebuild').toBe(1);
  });
});
