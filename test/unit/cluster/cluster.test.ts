// Mooring decisions over fake data engines and an in-memory state store: placement, attach
// (idempotent, BUSY elsewhere, takeover of an unreachable host), detach, delete, the repair
// loop (records modes, replaces a replica that stayed ERR once a spare host is offered,
// stops a stray engine), and a restart that finds everything again from the store.
import { afterEach, describe, expect, it } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

const SIZE = 64 * 4096;

describe('Mooring', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const c of open.splice(0)) await c.close();
  });

  async function setup(n = 3, opts: { replicaReplacementWaitMs?: number } = {}) {
    const hosts = Array.from({ length: n }, (_, i) => new FakeDataEngine('abcdefgh'[i]!));
    const store = new MemoryStateStore();
    const cluster = await Mooring.open({ store, hosts, repairIntervalMs: 0, ...opts });
    open.push(cluster);
    return { hosts, store, cluster };
  }

  it('places one replica per host and records the volume', async () => {
    const { hosts, cluster } = await setup(4);
    const st = await (await cluster.createVolume({ name: 'v1', sizeBytes: SIZE, replicas: 3 })).status();
    expect(st.state).toBe('detached');
    expect(new Set(st.replicas.map((r) => r.hostId)).size).toBe(3);
    // The least loaded hosts get the next volume's replicas.
    const st2 = await (await cluster.createVolume({ name: 'v2', sizeBytes: SIZE, replicas: 1 })).status();
    expect(st.replicas.map((r) => r.hostId)).not.toContain(st2.replicas[0]!.hostId);
    expect(hosts.reduce((n, h) => n + h.replicas.size, 0)).toBe(4);
    await expect(cluster.createVolume({ name: 'v1', sizeBytes: SIZE })).rejects.toMatchObject({ code: 'ALREADY_EXISTS' });
    await expect(cluster.createVolume({ name: 'v3', sizeBytes: SIZE, replicas: 5 })).rejects.toMatchObject({ code: 'UNAVAILABLE' });
    await expect(cluster.createVolume({ name: '../x', sizeBytes: SIZE })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('rolls back a create that fails on one host', async () => {
    const { hosts, cluster } = await setup(3);
    hosts[2]!.reachable = false;
    await expect(cluster.createVolume({ name: 'v', sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] })).rejects.toMatchObject({ code: 'UNAVAILABLE' });
    expect(hosts[0]!.replicas.size + hosts[1]!.replicas.size).toBe(0);
    expect(await cluster.listVolumes()).toEqual([]);
  });

  it('attaches, attaches again idempotently, refuses a second host, detaches', async () => {
    const { hosts, cluster } = await setup();
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE });
    const st = await cluster.volume('v').attach({ host: 'a', nbd: 'unix:/tmp/v.sock' });
    expect(st).toMatchObject({ state: 'healthy', attachedHost: 'a', epoch: 1 });
    expect(st.nbd?.address).toBe('unix:/tmp/v.sock');
    const refs = hosts[0]!.engines.get('v')!.replicas;
    expect(refs).toHaveLength(3);
    expect(refs.every((r) => r.address?.startsWith('tcp:'))).toBe(true);
    expect((await cluster.volume('v').attach({ host: 'a' })).epoch).toBe(1);
    await expect(cluster.volume('v').attach({ host: 'b' })).rejects.toMatchObject({ code: 'BUSY' });
    await expect(cluster.deleteVolume('v')).rejects.toMatchObject({ code: 'BUSY' });
    await cluster.volume('v').detach();
    expect(hosts[0]!.engines.size).toBe(0);
    expect((await cluster.volume('v').status()).state).toBe('detached');
    await cluster.deleteVolume('v');
    expect(hosts.every((h) => h.replicas.size === 0)).toBe(true);
    await expect(cluster.volume('v').status()).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it('reverts a snapshot only without a frontend: refused while exported, done by a ticket of its own when detached', async () => {
    const { hosts, cluster } = await setup(1);
    const v = await cluster.createVolume({ name: 'v', sizeBytes: SIZE });
    await v.attach({ host: 'a', nbd: 'unix:/tmp/v.sock' });
    await v.createSnapshot('s1');
    await expect(v.revertToSnapshot('s1')).rejects.toMatchObject({ code: 'INVALID_STATE', details: { host: 'a' } });
    expect(hosts[0]!.calls.filter((c) => c.startsWith('revertSnapshot'))).toEqual([]);
    await v.detach();
    await v.revertToSnapshot('s1');
    expect(hosts[0]!.calls.filter((c) => c.startsWith('revertSnapshot'))).toEqual(['revertSnapshot v s1']);
    await expect(v.revertToSnapshot('nope')).rejects.toMatchObject({ code: 'NOT_FOUND' });
    // The operation's own ticket is gone again: the volume is detached.
    expect((await v.status()).state).toBe('detached');
  });

  it('takes a volume over from an unreachable host with a newer epoch, then stops the stray engine', async () => {
    const { hosts, cluster } = await setup();
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE });
    await cluster.volume('v').attach({ host: 'a' });
    hosts[0]!.reachable = false;
    const events: unknown[] = [];
    cluster.on('engine-taken-over', (e) => events.push(e));
    const st = await cluster.volume('v').attach({ host: 'b' });
    expect(st.attachedHost).toBe('b');
    expect(st.epoch).toBeGreaterThan(1);
    expect(events).toEqual([{ volume: 'v', fromHost: 'a', toHost: 'b', epoch: st.epoch }]);
    // a comes back still running its old engine: the repair loop stops it.
    hosts[0]!.reachable = true;
    const stopped: unknown[] = [];
    cluster.on('stray-engine-stopped', (e) => stopped.push(e));
    await cluster.repairOnce();
    expect(hosts[0]!.engines.has('v')).toBe(false);
    expect(hosts[1]!.engines.has('v')).toBe(true);
    expect(stopped).toEqual([{ volume: 'v', hostId: 'a' }]);
  });

  it('replaces a replica that stays ERR beyond the wait, on a spare host offered later', async () => {
    const { hosts, cluster } = await setup(3, { replicaReplacementWaitMs: 50 });
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE, hosts: ['a', 'b', 'c'] });
    await cluster.volume('v').attach({ host: 'a' });
    hosts[2]!.reachable = false;
    hosts[0]!.setMode('v', 'r2', 'ERR');
    await cluster.repairOnce();
    expect((await cluster.volume('v').status()).state).toBe('degraded');
    // No spare host yet: nothing to do, even after the wait.
    await new Promise((r) => setTimeout(r, 80));
    await cluster.repairOnce();
    expect(hosts[0]!.engines.get('v')!.replicas.map((r) => r.id)).toEqual(['r0', 'r1', 'r2']);
    // A new host is offered: r2 is replaced there.
    const d = new FakeDataEngine('d');
    await cluster.addHost(d);
    const replaced: unknown[] = [];
    cluster.on('replica-replaced', (e) => replaced.push(e));
    await cluster.repairOnce();
    expect(replaced).toEqual([{ volume: 'v', oldReplicaId: 'r2', oldHostId: 'c', newReplicaId: 'r3', newHostId: 'd', sentBytes: 1234 }]);
    const st = await cluster.volume('v').status();
    expect(st.state).toBe('healthy');
    expect(st.replicas.map((r) => `${r.id}@${r.hostId}`)).toEqual(['r0@a', 'r1@b', 'r3@d']);
    expect(d.replicas.size).toBe(1);
  });

  it('does not replace a replica before the wait is over', async () => {
    const { hosts, cluster } = await setup(4, { replicaReplacementWaitMs: 60_000 });
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE, hosts: ['a', 'b', 'c'] });
    await cluster.volume('v').attach({ host: 'a' });
    hosts[0]!.setMode('v', 'r1', 'ERR');
    await cluster.repairOnce();
    await cluster.repairOnce();
    expect(hosts[3]!.replicas.size).toBe(0);
    expect((await cluster.volume('v').status()).replicas.find((r) => r.id === 'r1')?.mode).toBe('ERR');
  });

  it('cleans up a replacement whose rebuild fails', async () => {
    const { hosts, cluster } = await setup(4, { replicaReplacementWaitMs: 0 });
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE, hosts: ['a', 'b', 'c'] });
    await cluster.volume('v').attach({ host: 'a' });
    hosts[0]!.setMode('v', 'r1', 'ERR');
    hosts[0]!.failAddReplica = 'IO_ERROR';
    const warnings: unknown[] = [];
    cluster.on('warning', (e) => warnings.push(e));
    await cluster.repairOnce();
    expect(warnings).toHaveLength(1);
    expect(hosts[3]!.replicas.size).toBe(0);
    expect((await cluster.volume('v').status()).replicas.map((r) => r.id)).toEqual(['r0', 'r1', 'r2']);
  });

  it('finds volumes, replicas and the engine again after a restart (same store)', async () => {
    const { hosts, store, cluster } = await setup();
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE });
    await cluster.volume('v').attach({ host: 'c', nbd: 'unix:/tmp/c.sock' });
    await cluster.close();
    const again = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    open.push(again);
    const [v] = await again.listVolumes();
    expect(v).toMatchObject({ name: 'v', attachedHost: 'c', state: 'healthy' });
    await expect(again.volume('v').attach({ host: 'a' })).rejects.toMatchObject({ code: 'BUSY' });
  });

  it('reports a stored document that is not what it claims as CORRUPT_METADATA', async () => {
    const { store, cluster } = await setup();
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE });
    await store.put('volume', 'v', { schema: 1, name: 'v', uuid: 'x', sizeBytes: -1 });
    await expect(cluster.volume('v').status()).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
    await store.put('volume', 'v', { schema: 99, name: 'v' });
    await expect(cluster.volume('v').status()).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
  });

  it('refuses calls after close', async () => {
    const { cluster } = await setup();
    await cluster.close();
    await expect(cluster.createVolume({ name: 'v', sizeBytes: SIZE })).rejects.toMatchObject({ code: 'CLOSED' });
  });
});

describe('Volume events', () => {
  it("carries its engines' events, typed, with the host they came from; other volumes' stay away", async () => {
    const hosts = ['a', 'b'].map((h) => new FakeDataEngine(h));
    const m = await Mooring.open({ store: new MemoryStateStore(), hosts, repairIntervalMs: 0 });
    try {
      const v = await m.createVolume({ name: 'ev', sizeBytes: SIZE, replicas: 2 });
      const seen: string[] = [];
      v.on('rebuild-progress', (e) => seen.push(`${e.hostId}:${e.type}:${e.replicaId}:${e.sentBytes}/${e.totalBytes}`));
      v.on('replica-error', (e) => seen.push(`${e.hostId}:${e.type}:${e.replicaId}:${e.errno}`));
      hosts[0]!.emit({ type: 'rebuild-progress', volume: 'ev', replicaId: 'r1', sentBytes: 10, scannedBytes: 20, totalBytes: 40 });
      hosts[1]!.emit({ type: 'replica-error', volume: 'ev', replicaId: 'r0', errno: 5, message: 'EIO' });
      hosts[0]!.emit({ type: 'replica-error', volume: 'other', replicaId: 'r0', errno: 28, message: 'ENOSPC' });
      expect(seen).toEqual(['a:rebuild-progress:r1:10/40', 'b:replica-error:r0:5']);
    } finally {
      await m.close();
    }
  });
});
