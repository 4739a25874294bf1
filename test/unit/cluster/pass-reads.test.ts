// The shape of the control loop's cost (issue 21): one pass over N attached volumes reads
// O(N) documents from the state store, not O(N²); a repair asked for by one volume's event
// reads as many whatever N. Counted through a store that counts what it returns; the ratio
// between two sizes is what is checked, never a time.
import { describe, expect, it, vi } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import type { StateListOptions, StateWriteOptions, StoredObject } from '../../../src/state/state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

// Every get counts, found or not (a miss is a round trip to the store too); a list counts
// as one call plus each document it returns.
class CountingStore extends MemoryStateStore {
  reads = 0;
  writes = 0;
  override async put<T>(kind: string, key: string, value: T, options?: StateWriteOptions): Promise<StoredObject<T>> {
    this.writes++;
    return super.put(kind, key, value, options);
  }
  override async delete(kind: string, key: string, options?: StateWriteOptions): Promise<void> {
    this.writes++;
    return super.delete(kind, key, options);
  }
  override async get<T>(kind: string, key: string): Promise<StoredObject<T> | null> {
    this.reads++;
    return super.get<T>(kind, key);
  }
  override async list<T>(kind: string, options?: StateListOptions): Promise<Array<StoredObject<T>>> {
    const out = await super.list<T>(kind, options);
    this.reads += 1 + out.length;
    return out;
  }
}

async function readsOfOnePass(volumes: number): Promise<{ reads: number; writes: number }> {
  const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
  const store = new CountingStore();
  const m = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
  try {
    for (let i = 0; i < volumes; i++) {
      const v = await m.createVolume({ name: `vol-${String(i).padStart(4, '0')}`, sizeBytes: 4096 * 16, replicas: 3 });
      await v.attach({ host: 'abc'[i % 3]! });
    }
    await m.repairOnce(); // settle
    store.reads = store.writes = 0;
    await m.repairOnce();
    return { reads: store.reads, writes: store.writes };
  } finally {
    await m.close();
  }
}

describe('the control loop pass', () => {
  it('reads a number of documents linear in the number of volumes', async () => {
    const { reads: small, writes: smallWrites } = await readsOfOnePass(10);
    const { reads: large, writes: largeWrites } = await readsOfOnePass(40);
    // Nothing changed since the settling pass: nothing is written.
    expect([smallWrites, largeWrites]).toEqual([0, 0]);
    // ×4 volumes: about ×4 reads; reading every replica record per volume made it ×16.
    console.log(`store reads (gets, lists and listed documents) by one pass: ${small} at 10 volumes, ${large} at 40`);
    expect(large / small, `${small} reads at 10 volumes, ${large} at 40`).toBeLessThan(5.5);
  });
});

// Documents read by the repair one volume's event asks for, among `volumes` attached ones
// (the full pass an hour away, so only the event path runs).
async function readsOfOneEventRepair(volumes: number): Promise<number> {
  const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
  const store = new CountingStore();
  const m = await Mooring.open({ store, hosts, repairIntervalMs: 3_600_000 });
  try {
    await vi.waitFor(() => expect(m.repairLoop.passes).toBe(1), { timeout: 10_000 });
    for (let i = 0; i < volumes; i++) {
      const v = await m.createVolume({ name: `vol-${String(i).padStart(4, '0')}`, sizeBytes: 4096 * 16, replicas: 3 });
      await v.attach({ host: 'abc'[i % 3]! });
    }
    store.reads = 0;
    hosts[0]!.emit({ type: 'replica-set-changed', volume: 'vol-0000', epoch: 1, generation: 2, rwReplicaIds: ['r0', 'r1', 'r2'] });
    await vi.waitFor(() => expect(m.repairLoop).toMatchObject({ eventRepairs: 1, pendingEventRepairs: 0 }), { timeout: 10_000 });
    await m.close(); // waits for the repair running
    return store.reads;
  } finally {
    await m.close();
  }
}

describe('an event-driven repair', () => {
  it('reads as many documents whatever the number of volumes', async () => {
    const small = await readsOfOneEventRepair(10);
    const large = await readsOfOneEventRepair(40);
    console.log(`store documents read by one event-driven repair: ${small} at 10 volumes, ${large} at 40`);
    expect(small).toBeGreaterThan(0);
    // ×4 volumes: the same reads (a little slack); reading a list of every volume's records would make it ×2 or more.
    expect(large / small, `${small} reads at 10 volumes, ${large} at 40`).toBeLessThan(1.5);
  });
});

// Calls one full pass makes to the data engines, over `volumes` attached 3-replica volumes
// on `hostCount` hosts: by kind (engineInfo, listEngines...).
async function callsOfOnePass(volumes: number, hostCount: number): Promise<Map<string, number>> {
  const hosts = Array.from({ length: hostCount }, (_, i) => new FakeDataEngine(`h${i}`));
  const m = await Mooring.open({ store: new MemoryStateStore(), hosts, repairIntervalMs: 0 });
  try {
    for (let i = 0; i < volumes; i++) {
      const v = await m.createVolume({ name: `vol-${String(i).padStart(4, '0')}`, sizeBytes: 4096 * 16, replicas: 3 });
      await v.attach({ host: hosts[i % hostCount]!.hostId });
    }
    await m.repairOnce(); // settle
    for (const h of hosts) h.calls.length = 0;
    await m.repairOnce();
    const byKind = new Map<string, number>();
    for (const c of hosts.flatMap((h) => h.calls)) byKind.set(c.split(' ')[0]!, (byKind.get(c.split(' ')[0]!) ?? 0) + 1);
    return byKind;
  } finally {
    await m.close();
  }
}

describe('the data-engine calls of a pass', () => {
  it('ask each volume of its engine host, not of every host: the leftover-engine check lists each host once', async () => {
    const volumes = 20;
    const few = await callsOfOnePass(volumes, 3);
    const many = await callsOfOnePass(volumes, 9);
    const total = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
    console.log(`data-engine calls of one pass over ${volumes} volumes: 3 hosts ${JSON.stringify(Object.fromEntries(few))}, 9 hosts ${JSON.stringify(Object.fromEntries(many))}`);
    // Probing every host for every volume made engineInfo calls grow ×3 with ×3 hosts.
    expect(many.get('engineInfo'), 'engineInfo calls at 9 hosts').toBe(few.get('engineInfo'));
    // Nothing changed: each host's engines are listed once and no volume is asked about on its own.
    expect(few.get('engineInfo') ?? 0, 'engineInfo calls of a pass with nothing to repair').toBe(0);
    expect(few.get('listEngines'), 'listEngines calls at 3 hosts').toBe(3);
    expect(many.get('listEngines') ?? 0, 'listEngines calls at 9 hosts').toBeLessThanOrEqual(9);
    expect(total(many) - total(few), 'calls added by 6 more hosts').toBeLessThanOrEqual(2 * 6);
  });
});

describe('listVolumes', () => {
  it('asks each host for its engines once, never one call per volume, and reads each kind of record once', async () => {
    const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
    const store = new CountingStore();
    const m = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
    try {
      for (let i = 0; i < 30; i++) {
        const v = await m.createVolume({ name: `vol-${String(i).padStart(4, '0')}`, sizeBytes: 4096 * 16, replicas: 3 });
        if (i % 2 === 0) await v.attach({ host: 'abc'[i % 3]! });
      }
      for (const h of hosts) h.calls.length = 0;
      store.reads = 0;
      const list = await m.listVolumes();
      expect(list).toHaveLength(30);
      expect(list.filter((v) => v.state === 'healthy')).toHaveLength(15);
      const calls = hosts.flatMap((h) => h.calls);
      expect(calls.filter((c) => c.startsWith('engineInfo'))).toEqual([]);
      expect(calls.filter((c) => c === 'listEngines')).toHaveLength(3);
      // 30 volumes, 90 replicas, 15 engines, no migration: the documents, no document twice.
      expect(store.reads).toBeLessThanOrEqual(30 + 90 + 15 + 4);
    } finally {
      await m.close();
    }
  });
});
