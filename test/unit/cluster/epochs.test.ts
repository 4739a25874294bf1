// EpochAllocator (src/cluster/epochs.ts) on FileStateStore and MemoryStateStore: epochs are
// unique under concurrent allocators, above `atLeast`, recorded before they are returned
// (so a reopened store goes on above them), and a damaged or exhausted counter is refused
// rather than reset.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { KIND, parseVolumeEpochRecord } from '../../../src/cluster/cluster-records.js';
import { EPOCH_ALLOCATION_ATTEMPTS_MAX, EpochAllocator } from '../../../src/cluster/epochs.js';
import { MooringError } from '../../../src/errors.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import type { StateStore, StateWriteOptions, StoredObject } from '../../../src/state/state-store.js';
import { codeOf } from '../../helpers/codes.js';

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), 'mooring-epochs-'));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

const stores: Array<[string, () => Promise<StateStore>]> = [
  ['FileStateStore', () => FileStateStore.open({ dir: join(root, 'store') })],
  ['MemoryStateStore', async () => new MemoryStateStore()],
];

describe.each(stores)('EpochAllocator on %s', (_name, make) => {
  let store: StateStore;
  beforeEach(async () => {
    store = await make();
  });
  afterEach(async () => {
    await store.close();
  });

  it('allocates 1, 2, 3 per volume, each recorded in the volume-epoch document before it is returned', async () => {
    const a = new EpochAllocator(store);
    expect(await a.last('v')).toBeNull();
    expect(await a.allocate('v')).toBe(1);
    expect(await a.allocate('v')).toBe(2);
    expect(await a.allocate('w')).toBe(1);
    expect(await a.allocate('v')).toBe(3);
    expect(await a.last('v')).toBe(3);
    const d = (await store.get<unknown>(KIND.volumeEpoch, 'v'))!;
    expect(parseVolumeEpochRecord(d.value, d.key)).toMatchObject({ schema: 2, volume: 'v', last: 3 });
    expect(d.version).toBe(3);
  });

  it('gives 20 concurrent allocations, from one allocator and from two, 20 distinct epochs', async () => {
    const one = new EpochAllocator(store);
    const got = await Promise.all(Array.from({ length: 20 }, () => one.allocate('v')));
    expect(new Set(got).size).toBe(20);
    expect([...got].sort((x, y) => x - y)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));

    // Two control planes on one store: neither ever gets an epoch the other got.
    const [p, q] = [new EpochAllocator(store), new EpochAllocator(store)];
    const both = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 === 0 ? p : q).allocate('w', i % 3 === 0 ? 5 : 0)));
    expect(new Set(both).size).toBe(20);
    expect(Math.min(...both)).toBeGreaterThan(0);
    expect(await p.last('w')).toBe(Math.max(...both));
  });

  it('allocates above atLeast, and never below what it handed out', async () => {
    const a = new EpochAllocator(store);
    expect(await a.allocate('v', 41)).toBe(42);
    expect(await a.allocate('v', 10)).toBe(43);
    expect(await a.allocate('v', 43)).toBe(44);
    expect(await a.allocate('v', 0)).toBe(45);
  });

  it('refuses bad arguments, a damaged counter (never reset) and an exhausted one', async () => {
    const a = new EpochAllocator(store);
    for (const bad of [-1, 1.5, Number.NaN, Number.MAX_SAFE_INTEGER + 2, '3', null]) {
      expect(await codeOf(a.allocate('v', bad as never)), String(bad)).toBe('INVALID_ARGUMENT');
    }
    expect(await codeOf(a.allocate('../v'))).toBe('INVALID_ARGUMENT');
    for (const damaged of [{ schema: 2, volume: 'v', last: 'x', updatedMs: 0 }, { schema: 2, volume: 'other', last: 3, updatedMs: 0 }, { schema: 99, volume: 'v', last: 3, updatedMs: 0 }, [], 7]) {
      await store.put(KIND.volumeEpoch, 'v', damaged);
      expect(await codeOf(a.allocate('v')), JSON.stringify(damaged)).toBe('CORRUPT_METADATA');
      expect(await codeOf(a.last('v'))).toBe('CORRUPT_METADATA');
    }
    await store.put(KIND.volumeEpoch, 'v', { schema: 2, volume: 'v', last: Number.MAX_SAFE_INTEGER - 1, updatedMs: 0 });
    expect(await a.allocate('v')).toBe(Number.MAX_SAFE_INTEGER);
    expect(await codeOf(a.allocate('v'))).toBe('OUT_OF_RANGE');
    expect(await codeOf(a.allocate('w', Number.MAX_SAFE_INTEGER))).toBe('OUT_OF_RANGE');
  });
});

describe('EpochAllocator', () => {
  it('goes on above every epoch it handed out after the store is reopened (a restarted control plane)', async () => {
    const dir = join(root, 'store');
    let store = await FileStateStore.open({ dir });
    const before = await Promise.all(Array.from({ length: 5 }, () => new EpochAllocator(store).allocate('v')));
    await store.close();
    store = await FileStateStore.open({ dir });
    try {
      const a = new EpochAllocator(store);
      expect(await a.last('v')).toBe(5);
      expect(await a.allocate('v')).toBe(Math.max(...before) + 1);
    } finally {
      await store.close();
    }
  });

  it('gives up with CONFLICT after a bounded number of lost races', async () => {
    const inner = new MemoryStateStore();
    let puts = 0;
    // Every write finds that another allocator wrote first.
    const racing: StateStore = {
      get: (k, key) => inner.get(k, key),
      list: (k) => inner.list(k),
      put: async <T,>(k: string, key: string, value: T, options?: StateWriteOptions): Promise<StoredObject<T>> => {
        puts++;
        const cur = await inner.get(k, key);
        await inner.put(k, key, { schema: 2, volume: key, last: ((cur?.value as { last?: number } | undefined)?.last ?? 0) + 1, updatedMs: 0 });
        return inner.put(k, key, value, options);
      },
      delete: (k, key, o) => inner.delete(k, key, o),
      close: () => inner.close(),
    };
    const err = await new EpochAllocator(racing).allocate('v').catch((e: unknown) => e as MooringError);
    expect(err).toMatchObject({ code: 'CONFLICT' });
    expect(puts).toBe(EPOCH_ALLOCATION_ATTEMPTS_MAX);
    // Whatever the winners took, the counter only went up.
    expect(await new EpochAllocator(inner).allocate('v')).toBe(EPOCH_ALLOCATION_ATTEMPTS_MAX + 1);
  });
});
