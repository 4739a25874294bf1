// Writer epochs in the Mooring (docs/single-writer.md): every engine it starts or activates
// gets a new epoch from the volume's counter in the store (the fake data engines record each
// one given), strictly increasing across attach, takeover, migration hand-over, rollback,
// recovery after a restart and operations that attach a volume themselves; a start or
// activation refused with STALE_EPOCH (replicas that promised epochs the store never saw)
// is tried again above the epochs the replicas list; records of the last release still open.
import { afterEach, describe, expect, it } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { KIND, parseMigrationRecord } from '../../../src/cluster/cluster-records.js';
import { EpochAllocator } from '../../../src/cluster/epochs.js';
import type { EngineHandOver } from '../../../src/data-engine/data-engine.js';
import { MooringError } from '../../../src/errors.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine, type FakeEpochGiven } from '../fakes/fake-data-engine.js';

const SIZE = 64 * 4096;
let seq = 0;

describe('Mooring writer epochs', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const c of open.splice(0)) await c.close();
  });

  async function setup(opts: { accessMode?: 'rwo' | 'migratable' } = {}) {
    const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
    const store = new MemoryStateStore();
    const cluster = await Mooring.open({ store, hosts, repairIntervalMs: 0, ticketWaitTimeoutMs: 2000 });
    open.push(cluster);
    // The fake hosts share replica metadata by name and log epochs by volume: a name per test.
    const name = `ep${++seq}`;
    await cluster.createVolume({ name, sizeBytes: SIZE, accessMode: opts.accessMode ?? 'migratable' });
    return { hosts, store, cluster, name, vol: cluster.volume(name) };
  }

  const given = (name: string): FakeEpochGiven[] => FakeDataEngine.epochsGivenFor(name);
  const writers = (hosts: FakeDataEngine[], name: string): string[] =>
    hosts.filter((h) => h.engines.get(name)?.role === 'active' && h.engines.get(name)!.epoch === FakeDataEngine.epochOf(name)).map((h) => h.hostId);

  function expectFreshEpochs(log: FakeEpochGiven[]): void {
    const epochs = log.map((g) => g.epoch);
    for (let i = 1; i < epochs.length; i++) expect(epochs[i], `epoch #${i} of ${JSON.stringify(log)}`).toBeGreaterThan(epochs[i - 1]!);
  }

  it('hands a new, strictly higher epoch to every start and activation: attach, takeover, hand-over, rollback, confirm, operations, restart', async () => {
    const { hosts, store, cluster, name, vol } = await setup();
    const steps: Array<[string, number]> = [];
    const mark = (step: string): void => void steps.push([step, given(name).length]);

    await vol.attach({ host: 'a', nbd: 'unix:/run/a.sock' });
    mark('attach a');
    // Takeover from an unreachable host.
    hosts[0]!.reachable = false;
    await vol.attach({ host: 'b', nbd: 'unix:/run/b.sock' });
    hosts[0]!.reachable = true;
    await cluster.repairOnce(); // stops the stray engine on a
    mark('takeover b');
    // Migration b -> c: hand-over, then rollback after it (the source activates again).
    let m = await vol.migrate('c', { nbd: 'unix:/run/c.sock' });
    await m.handOver();
    mark('hand-over c');
    await m.rollback();
    mark('rollback b');
    // Migration b -> a, confirmed.
    m = await vol.migrate('a', { nbd: 'unix:/run/a.sock' });
    await m.confirm();
    mark('confirm a');
    await vol.detach({ host: '' });
    // An operation attaches the detached volume itself (no frontend), and detaches it.
    await vol.createSnapshot('s1');
    mark('snapshot');
    // A restarted control plane on the same store goes on above every epoch handed out.
    await cluster.close();
    const again = await Mooring.open({ store, hosts, repairIntervalMs: 0, ticketWaitTimeoutMs: 2000 });
    open.push(again);
    const st = await again.volume(name).attach({ host: 'c' });
    mark('restart, attach c');

    const log = given(name);
    expect(log.every((g) => g.failed === null), JSON.stringify(log)).toBe(true);
    expectFreshEpochs(log);
    expect(log.map((g) => [g.call, g.hostId])).toEqual([
      ['startEngine', 'a'],
      ['startEngine', 'b'],
      ['activateEngine', 'c'],
      ['activateEngine', 'b'],
      ['activateEngine', 'a'],
      ['startEngine', 'a'],
      ['startEngine', 'c'],
    ]);
    expect(steps.map(([s, n]) => [s, n])).toEqual([
      ['attach a', 1],
      ['takeover b', 2],
      ['hand-over c', 3],
      ['rollback b', 4],
      ['confirm a', 5],
      ['snapshot', 6],
      ['restart, attach c', 7],
    ]);
    // Standbys get none; the store's counter is the last epoch handed out, and it is the writer's.
    expect(st.epoch).toBe(log.at(-1)!.epoch);
    expect(await new EpochAllocator(store).last(name)).toBe(log.at(-1)!.epoch);
    expect(writers(hosts, name)).toEqual(['c']);
  });

  it('activates with a new epoch when it recovers an interrupted hand-over, to the source or to the target', async () => {
    const { hosts, store, cluster, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    await vol.migrate('b');
    // The process died between the source's drain and the target's claim.
    const ho = await hosts[0]!.deactivateEngine(name);
    const d = (await store.get<Record<string, unknown>>(KIND.migration, name))!;
    await store.put(KIND.migration, name, { ...d.value, phase: 'handing-over', handOver: ho });
    await cluster.close();
    const again = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    open.push(again);
    await again.repairOnce();
    expect(writers(hosts, name)).toEqual(['a']);

    // Again, with the source gone: the target activates from the recorded hand-over.
    const ho2 = await hosts[0]!.deactivateEngine(name);
    expect(ho2.generation).toBeGreaterThan(0);
    const d2 = (await store.get<Record<string, unknown>>(KIND.migration, name))!;
    await store.put(KIND.migration, name, { ...d2.value, phase: 'handing-over', handOver: ho2 });
    hosts[0]!.reachable = false;
    await again.repairOnce();
    expect(hosts[1]!.engines.get(name)?.role).toBe('active');
    const log = given(name);
    expect(log.map((g) => [g.call, g.hostId, g.failed])).toEqual([
      ['startEngine', 'a', null],
      ['activateEngine', 'a', null],
      ['activateEngine', 'b', null],
    ]);
    expectFreshEpochs(log);
  });

  it('starts above the epochs its replicas promised when the store never saw them (replicas of the last release)', async () => {
    const { hosts, store, name, vol } = await setup({ accessMode: 'rwo' });
    const replicas = await hosts[1]!.listReplicas();
    FakeDataEngine.setReplicaEpoch(replicas.find((r) => r.name.startsWith(`${name}-`))!.name, 41);
    const st = await vol.attach({ host: 'a' });
    expect(given(name).map((g) => [g.epoch, g.failed])).toEqual([
      [1, 'STALE_EPOCH'],
      [42, null],
    ]);
    expect(st.epoch).toBe(42);
    expect(await new EpochAllocator(store).last(name)).toBe(42);
    // The next engine goes on from there at once.
    await vol.detach({});
    expect((await vol.attach({ host: 'b' })).epoch).toBe(43);
    expect(given(name).at(-1)).toMatchObject({ epoch: 43, failed: null });
  });

  it('activates above the epoch a replica promised meanwhile, when the hand-over is still the latest replica set', async () => {
    const { hosts, store, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    const m = await vol.migrate('b');
    const target = hosts[1]!;
    const activate = target.activateEngine.bind(target);
    // Between the drain and the claim an engine the store never saw promised epoch 30 on a replica.
    let recorded: unknown = null;
    target.activateEngine = async (v: string, h: EngineHandOver, o: { epoch: number }) => {
      target.activateEngine = activate;
      recorded = parseMigrationRecord((await store.get(KIND.migration, name))!.value, name).handOver;
      FakeDataEngine.setReplicaEpoch((await target.listReplicas()).find((r) => r.name.startsWith(`${name}-`))!.name, 30);
      return activate(v, h, o);
    };
    const res = await m.handOver();
    expect(res.epoch).toBe(31);
    // The hand-over was recorded, generation included, before the target was activated.
    expect(recorded).toEqual({ epoch: 1, generation: 1, rwReplicaIds: ['r0', 'r1', 'r2'] });
    expect(given(name).map((g) => [g.call, g.epoch, g.failed])).toEqual([
      ['startEngine', 1, null],
      ['activateEngine', 2, 'STALE_EPOCH'],
      ['activateEngine', 31, null],
    ]);
    expect(writers(hosts, name)).toEqual(['b']);
  });

  it('tries at most 3 epochs, and does not retry a STALE_EPOCH no replica epoch explains', async () => {
    const { hosts, name, vol } = await setup({ accessMode: 'rwo' });
    const replica = (await hosts[2]!.listReplicas()).find((r) => r.name.startsWith(`${name}-`))!.name;
    // Each claim finds the replica already past it (another control plane racing ahead).
    const start = hosts[0]!.startEngine.bind(hosts[0]!);
    let bump = 100;
    hosts[0]!.startEngine = async (o) => {
      FakeDataEngine.setReplicaEpoch(replica, (bump += 100));
      return start(o);
    };
    await expect(vol.attach({ host: 'a', timeoutMs: 0 })).rejects.toMatchObject({ code: 'STALE_EPOCH' });
    expect(given(name).map((g) => [g.epoch, g.failed])).toEqual([
      [1, 'STALE_EPOCH'],
      [201, 'STALE_EPOCH'],
      [301, 'STALE_EPOCH'],
    ]);

    // A refusal that no listed epoch explains (no replica is at or above the epoch refused)
    // is not tried again.
    const other = await setup({ accessMode: 'rwo' });
    const tried: number[] = [];
    other.hosts[0]!.startEngine = async (o) => {
      tried.push(o.epoch!);
      throw new MooringError('STALE_EPOCH', `fake refusal of epoch ${String(o.epoch)}`);
    };
    await expect(other.vol.attach({ host: 'a', timeoutMs: 0 })).rejects.toMatchObject({ code: 'STALE_EPOCH' });
    expect(tried).toEqual([1]);
  });

  it('does not retry an activation whose hand-over was overtaken (no replica is above the epoch it claimed)', async () => {
    const { hosts, store, cluster, name, vol } = await setup();
    await vol.attach({ host: 'a' });
    await vol.migrate('b');
    const ho = await hosts[0]!.deactivateEngine(name);
    const d = (await store.get<Record<string, unknown>>(KIND.migration, name))!;
    // A hand-over that is not the latest replica set (another engine committed since).
    await store.put(KIND.migration, name, { ...d.value, phase: 'handing-over', handOver: { ...ho, generation: ho.generation + 5 } });
    const warnings: string[] = [];
    cluster.on('warning', (e) => warnings.push(e.code));
    await cluster.repairOnce();
    expect(warnings).toContain('STALE_EPOCH');
    expect(given(name).map((g) => [g.call, g.hostId, g.failed])).toEqual([
      ['startEngine', 'a', null],
      ['activateEngine', 'a', 'STALE_EPOCH'],
    ]);
  });

  it('opens records of the last release: a migration hand-over without a generation, a store without epoch counters', async () => {
    const rec = parseMigrationRecord(
      { schema: 2, volume: 'v', sourceHost: 'a', targetHost: 'b', phase: 'handing-over', handOver: { epoch: 7, rwReplicaIds: ['r0'] }, targetActivated: false, startedMs: 1, updatedMs: 2 },
      'v',
    );
    expect(rec.handOver).toEqual({ epoch: 7, generation: 0, rwReplicaIds: ['r0'] });
    expect(() => parseMigrationRecord({ schema: 2, volume: 'v', sourceHost: 'a', targetHost: 'b', phase: 'handing-over', handOver: { epoch: 7, generation: -1, rwReplicaIds: [] }, startedMs: 1, updatedMs: 2 }, 'v')).toThrow(
      expect.objectContaining({ code: 'CORRUPT_METADATA' }),
    );

    // A damaged counter stops the volume's starts (it is never reset), not the cluster.
    const { store, cluster, name, vol } = await setup({ accessMode: 'rwo' });
    await store.put(KIND.volumeEpoch, name, { schema: 2, volume: name, last: -4, updatedMs: 0 });
    await expect(vol.attach({ host: 'a', timeoutMs: 0 })).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
    expect(given(name)).toEqual([]);
    expect((await cluster.volume(name).status()).state).toBe('detached');
  });
});
