// Host eviction and disk replacement over fake data engines (src/cluster/eviction-controller.ts):
// an evicted host's replicas move to a spare host, an attached volume's through its engine
// and a detached one's under a volume-eviction ticket that goes away after; nothing new is
// placed there until the eviction is cancelled; progress and end are reported. A host that
// comes back with another disk id has its replicas replaced at once, without the
// replacement wait.
import { afterEach, describe, expect, it } from 'vitest';

import { MooringError } from '../../../src/errors.js';
import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

const SIZE = 64 * 4096;

describe('host eviction', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const c of open.splice(0)) await c.close();
  });

  async function setup(n: number, opts: { replicaReplacementWaitMs?: number } = {}) {
    const hosts = Array.from({ length: n }, (_, i) => new FakeDataEngine('abcdefgh'[i]!));
    const cluster = await Mooring.open({ store: new MemoryStateStore(), hosts, repairIntervalMs: 0, ...opts });
    open.push(cluster);
    const events: [string, unknown][] = [];
    for (const e of ['host-eviction', 'host-evicted', 'disk-replaced', 'replica-replaced', 'warning'] as const) cluster.on(e, (x: unknown) => events.push([e, x]));
    return { hosts, cluster, events };
  }

  const placement = async (cluster: Mooring, v: string): Promise<string[]> => (await cluster.volume(v).status()).replicas.map((r) => r.hostId).sort();

  it('moves attached and detached volumes off the host, then reports it empty', async () => {
    const { hosts, cluster, events } = await setup(4);
    await cluster.createVolume({ name: 'att', sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] });
    await cluster.createVolume({ name: 'det', sizeBytes: SIZE, replicas: 2, hosts: ['b', 'c'] });
    await cluster.volume('att').attach({ host: 'a' });

    expect(await cluster.evictHost('c')).toEqual({ hostId: 'c', replicasLeft: 2, imageFilesLeft: 0 });
    // Nothing new goes to c meanwhile.
    const other = await cluster.createVolume({ name: 'new', sizeBytes: SIZE, replicas: 3 });
    expect((await other.status()).replicas.map((r) => r.hostId).sort()).toEqual(['a', 'b', 'd']);

    await cluster.repairOnce();
    expect(events.filter(([e]) => e === 'warning')).toEqual([]);
    expect(await placement(cluster, 'att')).toEqual(['a', 'b', 'd']);
    const detHosts = await placement(cluster, 'det');
    expect(detHosts).toHaveLength(2);
    expect(detHosts).not.toContain('c');
    expect(hosts[2]!.replicas.size).toBe(0);
    // The detached volume was attached only for the move, without frontend, and is detached again.
    expect(hosts.some((h) => h.calls.some((c) => c.startsWith('startEngine det')))).toBe(true);
    const det = await cluster.volume('det').status();
    expect(det.state).toBe('detached');
    expect(await cluster.volume('det').tickets()).toEqual([]);
    // The attached one stayed attached where it was.
    expect((await cluster.volume('att').status()).attachedHost).toBe('a');
    expect(events.filter(([e]) => e === 'replica-replaced').map(([, x]) => (x as { oldHostId: string }).oldHostId)).toEqual(['c', 'c']);
    expect(events).toContainEqual(['host-evicted', { hostId: 'c' }]);

    // Another pass does not report it again; cancelling makes c schedulable.
    const before = events.length;
    await cluster.repairOnce();
    expect(events.slice(before).filter(([e]) => e === 'host-evicted')).toEqual([]);
    await cluster.cancelHostEviction('c');
    const back = await cluster.createVolume({ name: 'back', sizeBytes: SIZE, replicas: 1 });
    expect((await back.status()).replicas[0]!.hostId).toBe('c');
  });

  it('waits with a volume that has no spare host, and reports what is left', async () => {
    const { cluster, events } = await setup(3);
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE, replicas: 3 });
    await cluster.evictHost('b');
    await cluster.repairOnce();
    expect(await placement(cluster, 'v')).toEqual(['a', 'b', 'c']);
    expect(events).toContainEqual(['host-eviction', { hostId: 'b', replicasLeft: 1, imageFilesLeft: 0 }]);
    const d = new FakeDataEngine('d');
    await cluster.addHost(d);
    await cluster.repairOnce();
    expect(await placement(cluster, 'v')).toEqual(['a', 'c', 'd']);
    expect(events).toContainEqual(['host-evicted', { hostId: 'b' }]);
  });

  it('a pass that added the new replica but could not retire the old one only retires it next time', async () => {
    const { hosts, cluster, events } = await setup(4);
    await cluster.createVolume({ name: 'v', sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] });
    await cluster.volume('v').attach({ host: 'a' });
    const engineHost = hosts[0]!;
    const remove = engineHost.removeReplica.bind(engineHost);
    engineHost.removeReplica = () => Promise.reject(new MooringError('UNAVAILABLE', 'the engine host is busy'));
    await cluster.evictHost('c');
    await cluster.repairOnce();
    expect(await placement(cluster, 'v')).toEqual(['a', 'b', 'c', 'd']); // added on d, c kept (still written)
    expect(events.some(([e, x]) => e === 'warning' && String((x as Error).message).includes('busy'))).toBe(true);
    engineHost.removeReplica = remove;
    await cluster.repairOnce();
    expect(await placement(cluster, 'v')).toEqual(['a', 'b', 'd']);
    expect(hosts[3]!.replicas.size).toBe(1); // no second new replica
    expect(events).toContainEqual(['host-evicted', { hostId: 'c' }]);
  });

  it('refuses a host that never answered, and bad ids', async () => {
    const { cluster } = await setup(2);
    await expect(cluster.evictHost('zz')).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(cluster.evictHost('../a')).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(cluster.cancelHostEviction('zz')).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
});

describe('disk replacement', () => {
  it('replaces the replicas of a host that came back with another disk at once', async () => {
    const hosts = ['a', 'b', 'c', 'd'].map((h) => new FakeDataEngine(h));
    hosts.forEach((h, i) => (h.diskId = `0000000${i}-0000-4000-8000-000000000000`));
    // A replacement wait of an hour: only the disk's new identity makes it immediate.
    const cluster = await Mooring.open({ store: new MemoryStateStore(), hosts, repairIntervalMs: 0, replicaReplacementWaitMs: 3_600_000 });
    try {
      const events: [string, unknown][] = [];
      cluster.on('disk-replaced', (e) => events.push(['disk-replaced', e]));
      await cluster.createVolume({ name: 'v', sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] });
      await cluster.volume('v').attach({ host: 'a' });
      const lost = (await cluster.volume('v').status()).replicas.find((r) => r.hostId === 'b')!;

      // The same host id, the same disk: nothing happens.
      await cluster.addHost(hosts[1]!);
      expect(events).toEqual([]);

      hosts[1]!.replaceDisk('11111111-0000-4000-8000-000000000000');
      hosts[0]!.setMode('v', lost.id, 'ERR'); // what the engine sees: its replica on b is gone
      await cluster.addHost(hosts[1]!);
      expect(events).toHaveLength(1);
      expect(events[0]![1]).toMatchObject({ hostId: 'b', oldDiskId: '00000001-0000-4000-8000-000000000000', newDiskId: '11111111-0000-4000-8000-000000000000' });
      expect((events[0]![1] as { lostReplicas: string[] }).lostReplicas).toHaveLength(1);
      await cluster.repairOnce();
      const after = (await cluster.volume('v').status()).replicas;
      expect(after.map((r) => r.hostId).sort()).toEqual(['a', 'c', 'd']);
    } finally {
      await cluster.close();
    }
  });

  it('does not treat an unknown disk id (an older data engine) as a replacement', async () => {
    const hosts = ['a', 'b'].map((h) => new FakeDataEngine(h));
    hosts[1]!.diskId = '00000001-0000-4000-8000-000000000000';
    const cluster = await Mooring.open({ store: new MemoryStateStore(), hosts, repairIntervalMs: 0 });
    try {
      const events: unknown[] = [];
      cluster.on('disk-replaced', (e) => events.push(e));
      await cluster.createVolume({ name: 'v', sizeBytes: SIZE, replicas: 2 });
      hosts[1]!.diskId = ''; // downgraded to a release without disk ids
      await cluster.addHost(hosts[1]!);
      hosts[1]!.diskId = '00000001-0000-4000-8000-000000000000';
      await cluster.addHost(hosts[1]!);
      expect(events).toEqual([]);
      expect((await cluster.volume('v').status()).replicas.every((r) => r.mode !== 'ERR')).toBe(true);
    } finally {
      await cluster.close();
    }
  });
});
