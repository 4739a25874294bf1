// The shape of the control loop's cost (issue 21): one pass over N attached volumes reads
// O(N) documents from the state store, not O(N²). Counted through a store that counts what
// it returns; the ratio between two sizes is what is checked, never a time.
import { describe, expect, it } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import type { StateListOptions, StoredObject } from '../../../src/state/state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

// Every get counts, found or not (a miss is a round trip to the store too); a list counts
// as one call plus each document it returns.
class CountingStore extends MemoryStateStore {
  reads = 0;
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

async function readsOfOnePass(volumes: number): Promise<number> {
  const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
  const store = new CountingStore();
  const m = await Mooring.open({ store, hosts, repairIntervalMs: 0 });
  try {
    for (let i = 0; i < volumes; i++) {
      const v = await m.createVolume({ name: `vol-${String(i).padStart(4, '0')}`, sizeBytes: 4096 * 16, replicas: 3 });
      await v.attach({ host: 'abc'[i % 3]! });
    }
    await m.repairOnce(); // settle
    store.reads = 0;
    await m.repairOnce();
    return store.reads;
  } finally {
    await m.close();
  }
}

describe('the control loop pass', () => {
  it('reads a number of documents linear in the number of volumes', async () => {
    const small = await readsOfOnePass(10);
    const large = await readsOfOnePass(40);
    // ×4 volumes: about ×4 reads; reading every replica record per volume made it ×16.
    console.log(`store reads (gets, lists and listed documents) by one pass: ${small} at 10 volumes, ${large} at 40`);
    expect(large / small, `${small} reads at 10 volumes, ${large} at 40`).toBeLessThan(5.5);
  });
});
