// The repair controller alone, over the shared state layer and fake data engines: it
// records replica modes, replaces a replica that stayed ERR past the wait on a host holding
// none of the volume's replicas (one per step), leaves it alone before the wait, and stops
// an engine of the volume left on another host. And the loop's pass asks a host that does
// not answer once, not once per volume.
import { describe, expect, it } from 'vitest';

import { KIND, type ReplicaRecord } from '../../../src/cluster/cluster-records.js';
import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';
import { controlFixture } from './control-fixture.js';

describe('RepairController', () => {
  it('replaces a replica that stayed ERR on a spare host, records it and deletes the old one', async () => {
    const { fakes, state, attachment, repair, events, newVolume } = await controlFixture(['a', 'b', 'c', 'd']);
    const v = await newVolume('rwo', ['a', 'b', 'c']);
    await attachment.attach(v, { host: 'a' });
    fakes[0]!.setMode(v, 'r1', 'ERR');
    await state.serial(v, async () => repair.repair((await state.engineRecord(v))!));
    expect(events).toContainEqual(['replica-replaced', { volume: v, oldReplicaId: 'r1', oldHostId: 'b', newReplicaId: 'r3', newHostId: 'd', sentBytes: 1234 }]);
    expect((await state.replicas(v)).map((r) => `${r.id}@${r.hostId}:${r.mode}`)).toEqual(['r0@a:RW', 'r2@c:RW', 'r3@d:RW']);
    expect(fakes[1]!.replicas.size).toBe(0);
    expect(fakes[3]!.replicas.size).toBe(1);
  });

  it('only records the ERR mode (and since when) before the wait is over', async () => {
    const { fakes, state, store, attachment, repair, newVolume } = await controlFixture(['a', 'b', 'c', 'd'], { replacementWaitMs: 60_000 });
    const v = await newVolume('rwo', ['a', 'b', 'c']);
    await attachment.attach(v, { host: 'a' });
    fakes[0]!.setMode(v, 'r2', 'ERR');
    await state.serial(v, async () => repair.repair((await state.engineRecord(v))!));
    const r2 = (await state.replicas(v)).find((r) => r.id === 'r2')!;
    expect(r2.mode).toBe('ERR');
    expect(r2.failedSinceMs).toBeGreaterThan(0);
    expect(fakes[3]!.replicas.size).toBe(0);
    expect((await store.get<ReplicaRecord>(KIND.replica, r2.name))?.value.mode).toBe('ERR');
  });

  it('stops an engine of the volume found on a host it is not attached to', async () => {
    const { fakes, state, attachment, repair, events, newVolume } = await controlFixture();
    const v = await newVolume();
    await attachment.attach(v, { host: 'a' });
    // A leftover on c (a takeover while c could not be reached).
    await fakes[2]!.startEngine({ volume: v, replicas: await state.refs(v), epoch: 99 });
    await state.serial(v, async () => repair.repair((await state.engineRecord(v))!));
    expect(fakes[2]!.engines.has(v)).toBe(false);
    expect(fakes[0]!.engines.has(v)).toBe(true);
    expect(events).toContainEqual(['stray-engine-stopped', { volume: v, hostId: 'c' }]);
  });
});

describe('the control loop at scale', () => {
  it('asks a host that does not answer once per pass, however many volumes it holds', async () => {
    const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
    const m = await Mooring.open({ store: new MemoryStateStore(), hosts, repairIntervalMs: 0 });
    try {
      for (let i = 0; i < 12; i++) {
        const v = await m.createVolume({ name: `s${i}`, sizeBytes: 4096 * 16, replicas: 1, hosts: ['b'] });
        await v.attach({ host: 'a' });
      }
      hosts[0]!.reachable = false;
      hosts[0]!.calls.length = 0;
      await m.repairOnce();
      // One probe found it away; the other volumes of the pass did not wait on it again.
      expect(hosts[0]!.calls.filter((c) => c.startsWith('engineInfo') || c === 'info')).toHaveLength(1);
      // The next pass asks again (the host may be back).
      hosts[0]!.calls.length = 0;
      await m.repairOnce();
      expect(hosts[0]!.calls.length).toBeGreaterThanOrEqual(1);
      expect(hosts[0]!.calls.length).toBeLessThan(12);
    } finally {
      await m.close();
    }
  });
});
