// Mooring tickets and migration over fake data engines: the flows of seed 000 (attach on B
// migrates, detach A confirms, detach B rolls back), migrate()/handOver()/confirm()/rollback()
// with events and hooks in order, locks moved at hand-over, the crash cases (target host
// lost → rollback, source host lost after hand-over → stays on the target, restart of the
// embedding process mid-migration), operations that attach a detached volume themselves,
// and the upgrade of a schema-1 store.
import { afterEach, describe, expect, it } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { KIND } from '../../../src/cluster/cluster-records.js';
import { MooringError } from '../../../src/errors.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

const SIZE = 64 * 4096;
let seq = 0;

describe('Mooring tickets and migration', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const c of open.splice(0)) await c.close();
  });

  async function setup(opts: { accessMode?: 'rwo' | 'migratable' } = {}) {
    const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
    const store = new MemoryStateStore();
    const cluster = await Mooring.open({ store, hosts, repairIntervalMs: 0, ticketWaitTimeoutMs: 2000 });
    open.push(cluster);
    const name = `vol${++seq}`;
    await cluster.createVolume({ name, sizeBytes: SIZE, accessMode: opts.accessMode ?? 'migratable' });
    return { hosts, store, cluster, name, vol: cluster.volume(name) };
  }

  const active = (hosts: FakeDataEngine[], name: string) =>
    hosts.filter((h) => h.engines.get(name)?.role === 'active' && h.engines.get(name)!.epoch === FakeDataEngine.epochOf(name)).map((h) => h.hostId);

  it('RWO: same host returns the current state, another host is BUSY, detach with no host detaches everywhere', async () => {
    const { hosts, cluster, name, vol } = await setup({ accessMode: 'rwo' });
    const st = await vol.attach({ host: 'a', nbd: 'unix:/run/a.sock' });
    expect(st).toMatchObject({ attachedHost: 'a', accessMode: 'rwo', frontend: { disabled: false, nbd: 'unix:/run/a.sock' } });
    expect((await vol.attach({ host: 'a', nbd: 'unix:/run/a.sock' })).epoch).toBe(st.epoch);
    await expect(vol.attach({ host: 'b' })).rejects.toMatchObject({ code: 'BUSY' });
    expect((await vol.tickets()).map((t) => [t.id, t.hostId, t.status?.satisfied])).toEqual([['api-a', 'a', true]]);
    await expect(vol.migrate('b')).rejects.toMatchObject({ code: 'INVALID_STATE' });
    await vol.detach({ host: '' });
    expect(hosts[0]!.engines.size).toBe(0);
    expect((await cluster.volume(name).status()).state).toBe('detached');
    expect(await vol.tickets()).toEqual([]);
  });

  it('attach on B migrates, detach from A confirms (seed 000)', async () => {
    const { hosts, name, vol } = await setup();
    await vol.attach({ host: 'a', attacher: 'workload', nbd: 'unix:/run/a.sock' });
    const events: string[] = [];
    for (const e of ['migration-started', 'migration-target-ready', 'migration-handed-over', 'migration-confirmed', 'migration-rolled-back', 'migration-failed'] as const) {
      vol.on(e, () => events.push(e));
    }
    const st = await vol.attach({ host: 'b', attacher: 'workload', nbd: 'unix:/run/b.sock' });
    expect(st.migration).toMatchObject({ sourceHost: 'a', targetHost: 'b', phase: 'target-ready' });
    expect(hosts[1]!.engines.get(name)).toMatchObject({ role: 'standby', nbd: 'unix:/run/b.sock' });
    expect(active(hosts, name)).toEqual(['a']);
    expect((await vol.tickets()).every((t) => t.status?.satisfied)).toBe(true);
    await vol.detach({ host: 'a' });
    expect(events).toEqual(['migration-started', 'migration-target-ready', 'migration-handed-over', 'migration-confirmed']);
    expect(hosts[0]!.engines.has(name)).toBe(false);
    expect(active(hosts, name)).toEqual(['b']);
    const after = await vol.status();
    expect(after).toMatchObject({ attachedHost: 'b', writerHost: 'b', migration: null, frontend: { nbd: 'unix:/run/b.sock' } });
  });

  it('detach from B rolls back, before and after hand-over', async () => {
    const { hosts, name, vol } = await setup();
    await vol.attach({ host: 'a', nbd: 'unix:/run/a.sock' });
    await vol.attach({ host: 'b', nbd: 'unix:/run/b.sock' });
    await vol.detach({ host: 'b' });
    expect(hosts[1]!.engines.has(name)).toBe(false);
    expect(active(hosts, name)).toEqual(['a']);
    const epochBefore = FakeDataEngine.epochOf(name);

    const m = await vol.migrate('b', { nbd: 'unix:/run/b.sock' });
    const ho = await m.handOver();
    expect(ho.epoch).toBeGreaterThan(epochBefore);
    expect(active(hosts, name)).toEqual(['b']);
    expect(hosts[0]!.engines.get(name)!.role).toBe('standby');
    const rolled: unknown[] = [];
    vol.on('migration-rolled-back', (e) => rolled.push(e));
    await vol.detach({ host: 'b' });
    expect(rolled).toEqual([expect.objectContaining({ automatic: false, sourceHost: 'a', targetHost: 'b' })]);
    // The source claimed a newer epoch than the target's.
    expect(active(hosts, name)).toEqual(['a']);
    expect(FakeDataEngine.epochOf(name)).toBeGreaterThan(ho.epoch);
    expect(hosts[1]!.engines.has(name)).toBe(false);
  });

  it('runs hooks in order and moves locks at hand-over; a refused lock rolls back to the source', async () => {
    const { hosts, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    const log: string[] = [];
    const carrier = (who: string, refuse = false) => ({
      handOver: async () => {
        log.push(`${who}.handOver`);
        return { leases: [] } as never;
      },
      takeOver: async () => {
        log.push(`${who}.takeOver`);
        if (refuse) throw new MooringError('LOCK_VERSION_MISMATCH', 'another host took the lease');
      },
    });
    const hooks = {
      beforeHandOver: () => void log.push('beforeHandOver'),
      afterHandOver: () => void log.push(`afterHandOver:${active(hosts, name).join()}`),
      afterConfirm: () => void log.push('afterConfirm'),
      afterRollback: () => void log.push('afterRollback'),
    };
    const refused = await vol.migrate('b', { hooks, locks: { source: carrier('src'), target: carrier('tgt', true), lockspaces: [] } });
    await expect(refused.handOver()).rejects.toMatchObject({ code: 'LOCK_VERSION_MISMATCH' });
    expect(log).toEqual(['beforeHandOver', 'src.handOver', 'tgt.takeOver', 'src.takeOver']);
    expect(active(hosts, name)).toEqual(['a']);
    expect((await refused.info())?.phase).toBe('target-ready');
    await refused.rollback();
    expect(log.at(-1)).toBe('afterRollback');

    log.length = 0;
    const m = await vol.migrate('b', { hooks, locks: { source: carrier('src'), target: carrier('tgt'), lockspaces: [] } });
    await m.confirm(); // hands over first
    expect(log).toEqual(['beforeHandOver', 'src.handOver', 'tgt.takeOver', 'afterHandOver:b', 'afterConfirm']);
    expect(await m.info()).toBeNull();
    expect((await vol.status()).attachedHost).toBe('b');
    // Confirmed (by this call, another, or the control loop): confirm again resolves and
    // changes nothing; a rollback now is refused, and so is an older handle's rollback.
    await m.confirm();
    expect(log.filter((l) => l === 'afterConfirm')).toHaveLength(1);
    await expect(m.rollback()).rejects.toMatchObject({ code: 'INVALID_STATE' });
    await expect(refused.rollback()).rejects.toMatchObject({ code: 'INVALID_STATE' });
    expect((await vol.status()).attachedHost).toBe('b');
  });

  it('migrates a degraded volume: the ERR replica stays ERR on the target', async () => {
    const { hosts, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    hosts[0]!.setMode(name, 'r2', 'ERR');
    const m = await vol.migrate('b');
    const ho = await m.handOver();
    expect(ho.rwReplicaIds).toEqual(['r0', 'r1']);
    expect(hosts[1]!.engines.get(name)!.replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
    await m.confirm();
  });

  it('rolls back by itself when the target host is lost, before and after hand-over', async () => {
    const { hosts, cluster, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    await vol.migrate('b');
    const rolled: Array<{ automatic: boolean; reason: string }> = [];
    vol.on('migration-rolled-back', (e) => rolled.push(e));
    hosts[1]!.reachable = false;
    await cluster.repairOnce();
    expect(rolled).toEqual([expect.objectContaining({ automatic: true })]);
    expect(await vol.migration()).toBeNull();
    expect(active(hosts, name)).toEqual(['a']);
    // Its ticket went with it: the volume does not start migrating again.
    expect((await vol.tickets()).map((t) => t.hostId)).toEqual(['a']);

    hosts[1]!.reachable = true;
    hosts[1]!.engines.clear();
    const m = await vol.migrate('c');
    await m.handOver();
    hosts[2]!.reachable = false;
    await cluster.repairOnce();
    expect(rolled).toHaveLength(2);
    expect(hosts[0]!.engines.get(name)!.role).toBe('active');
    expect(hosts[0]!.engines.get(name)!.epoch).toBe(FakeDataEngine.epochOf(name));
    expect((await vol.status()).writerHost).toBe('a');
  });

  it('stays on the target when the source host is lost after hand-over', async () => {
    const { hosts, cluster, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    const m = await vol.migrate('b');
    await m.handOver();
    const confirmed: Array<{ automatic: boolean }> = [];
    vol.on('migration-confirmed', (e) => confirmed.push(e));
    hosts[0]!.reachable = false;
    await cluster.repairOnce();
    expect(confirmed).toEqual([expect.objectContaining({ automatic: true })]);
    expect((await vol.status()).attachedHost).toBe('b');
    expect((await vol.tickets()).map((t) => t.hostId)).toEqual(['b']);
    expect(active(hosts, name)).toEqual(['b']);
    // The embedder's own confirm, racing the loop's, finds it done.
    await m.confirm();
    expect(confirmed).toHaveLength(1);
  });

  it('serves again from the source when the process died after the source drained, before the hand-over was recorded', async () => {
    const { hosts, store, cluster, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    await vol.migrate('b');
    const before = hosts[0]!.engines.get(name)!.epoch;
    // The hand-over's first step, and nothing recorded: the record still says target-ready.
    await hosts[0]!.deactivateEngine(name);
    await cluster.close();
    expect(active(hosts, name)).toEqual([]);
    const again = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    open.push(again);
    const warnings: string[] = [];
    again.on('warning', (e) => warnings.push(e.message));
    await again.repairOnce();
    // A fresh source engine writes, at a newer epoch; the migration waits, target-ready.
    expect(active(hosts, name)).toEqual(['a']);
    expect(hosts[0]!.engines.get(name)!.epoch).toBeGreaterThan(before);
    expect(hosts[1]!.engines.get(name)!.role).toBe('standby');
    expect((await (await again.volume(name).migration())!.info())?.phase).toBe('target-ready');
    expect(warnings.some((w) => w.includes('never recorded'))).toBe(true);
    // And it goes on: confirmed, it ends on the target.
    await again.volume(name).migration().then((x) => x!.confirm());
    expect(active(hosts, name)).toEqual(['b']);
  });

  it('resumes after a restart of the embedding process, in each phase', async () => {
    const { hosts, store, cluster, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    await vol.migrate('b');
    await cluster.close();
    const again = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    open.push(again);
    const m = await again.volume(name).migration();
    expect(m).not.toBeNull();
    await m!.handOver();
    await again.close();

    // Interrupted in the middle of a hand-over: the source had drained, the target had not claimed.
    const third = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    open.push(third);
    await third.volume(name).migration().then((x) => x!.rollback());
    expect(active(hosts, name)).toEqual(['a']);
    const m2 = await third.volume(name).migrate('b');
    const ho = await hosts[0]!.deactivateEngine(name);
    const d = (await store.get<Record<string, unknown>>(KIND.migration, name))!;
    await store.put(KIND.migration, name, { ...d.value, phase: 'handing-over', handOver: ho });
    await third.close();
    const fourth = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    open.push(fourth);
    await fourth.repairOnce();
    // Undone to the source (the embedder's hand-over call was lost with the process).
    expect(active(hosts, name)).toEqual(['a']);
    expect((await (await fourth.volume(name).migration())!.info())?.phase).toBe('target-ready');
    await fourth.volume(name).migration().then((x) => x!.confirm());
    expect(active(hosts, name)).toEqual(['b']);
    expect(m2.targetHost).toBe('b');
  });

  it('attaches a detached volume for a snapshot without frontend, and detaches it again', async () => {
    const { hosts, name, vol } = await setup();
    const calls: string[] = [];
    for (const h of hosts) h.watch((e) => calls.push(`${h.hostId}:${e.type}`));
    const snap = await vol.createSnapshot('s1', { labels: { k: 'v' } });
    expect(snap).toMatchObject({ name: 's1', labels: { k: 'v' } });
    expect(hosts[0]!.calls.filter((c) => c.startsWith('startEngine') || c.startsWith('createSnapshot') || c.startsWith('stopEngine'))).toEqual([
      `startEngine ${name}`,
      `createSnapshot ${name} s1`,
      `stopEngine ${name}`,
    ]);
    expect((await vol.status()).state).toBe('detached');
    expect(await vol.tickets()).toEqual([]);
    // Attached: the snapshot runs on the attached engine with a ticket that accepts any frontend.
    await vol.attach({ host: 'b', nbd: 'unix:/run/b.sock' });
    await vol.createSnapshot('s2');
    expect(hosts[1]!.engines.get(name)!.nbd).toBe('unix:/run/b.sock');
    expect((await vol.listSnapshots()).map((s) => s.name)).toEqual(['s1', 's2']);
    const exp = await vol.exportSnapshot('s1', { path: '/tmp/x.raw' });
    expect(exp.hostId).toBe('b');
    expect((await vol.tickets()).map((t) => t.id)).toEqual(['api-b']);
  });

  it('clones a snapshot into a new volume, both attached on one host for the copy', async () => {
    const { hosts, cluster, name, vol } = await setup();
    await vol.createSnapshot('s1');
    for (const h of hosts) h.calls.length = 0;
    const clone = await vol.clone({ snapshot: 's1', name: `${name}-clone`, replicas: 2 });
    expect(await clone.volume.status()).toMatchObject({ name: `${name}-clone`, state: 'detached', replicaCount: 2 });
    const copier = hosts.find((h) => h.calls.some((c) => c.startsWith('copySnapshot')))!;
    expect(copier.calls.filter((c) => c.startsWith('startEngine'))).toEqual([`startEngine ${name}`, `startEngine ${name}-clone`]);
    expect(hosts.every((h) => h.engines.size === 0)).toBe(true);
    await expect(vol.clone({ snapshot: 'missing', name: `${name}-bad` })).rejects.toMatchObject({ code: 'NOT_FOUND' });
    expect((await cluster.listVolumes()).map((v) => v.name)).not.toContain(`${name}-bad`);
  });

  it('upgrades a schema-1 store: an attached volume gets an api ticket and stays attached', async () => {
    const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
    const store = new MemoryStateStore();
    const uuid = '00000000-0000-4000-8000-000000000001';
    await store.put(KIND.volume, 'old1', { schema: 1, name: 'old1', uuid, sizeBytes: SIZE, replicaCount: 1, createdMs: 1 });
    await store.put(KIND.volume, 'old2', { schema: 1, name: 'old2', uuid, sizeBytes: SIZE, replicaCount: 1, createdMs: 1 });
    await store.put(KIND.replica, 'old1-r0-x', { schema: 1, volume: 'old1', id: 'r0', hostId: 'a', name: 'old1-r0-x', mode: 'RW', failedSinceMs: null, lastError: null });
    await store.put(KIND.replica, 'old2-r0-x', { schema: 1, volume: 'old2', id: 'r0', hostId: 'b', name: 'old2-r0-x', mode: 'RW', failedSinceMs: null, lastError: null });
    await store.put(KIND.engine, 'old1', { schema: 1, volume: 'old1', hostId: 'a', nbd: 'unix:/run/old1.sock', epoch: 3, startedMs: 1 });
    // The engine the last release started (it chose epoch 3 itself).
    await hosts[0]!.startEngine({ volume: 'old1', replicas: [{ id: 'r0', hostId: 'a', name: 'old1-r0-x', address: null }], nbd: 'unix:/run/old1.sock', epoch: 3 });
    const cluster = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    open.push(cluster);
    const t1 = await cluster.volume('old1').tickets();
    expect(t1).toEqual([expect.objectContaining({ id: 'api-a', type: 'api', hostId: 'a', parameters: expect.objectContaining({ nbd: 'unix:/run/old1.sock' }) })]);
    await cluster.repairOnce();
    expect((await cluster.volume('old1').tickets())[0]!.status?.satisfied).toBe(true);
    expect(hosts[0]!.calls.filter((c) => c.startsWith('startEngine') || c.startsWith('stopEngine'))).toEqual(['startEngine old1']);
    expect((await cluster.volume('old1').status()).accessMode).toBe('rwo');
    expect(await cluster.volume('old2').tickets()).toEqual([]);
    expect(((await store.get<{ schema: number }>(KIND.volume, 'old2'))!.value).schema).toBe(2);
    // Idempotent: a second open changes nothing.
    const v = (await store.get(KIND.attachment, 'old1'))!.version;
    const c2 = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    open.push(c2);
    expect((await store.get(KIND.attachment, 'old1'))!.version).toBe(v);
  });
});
