// The StateStore contract: what every store must do, run by the tests of each store
// (file and memory in state-store.test.ts, etcd in test/system/etcd-state-store.test.ts).
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { MooringError } from '../../../src/errors.js';
import { STATE_DOCUMENT_BYTES_MAX } from '../../../src/state/state-keys.js';
import type { StateChange, StateStore } from '../../../src/state/state-store.js';
import { codeOf } from '../../helpers/codes.js';

export function stateStoreContract(name: string, make: () => Promise<StateStore>): void {
  describe(`${name} (StateStore contract)`, () => {
    let store: StateStore;
    beforeEach(async () => {
      store = await make();
    });
    afterEach(async () => {
      await store.close();
    });

    it('puts, gets, lists in key order and deletes', async () => {
      expect(await store.get('volume', 'v1')).toBeNull();
      const a = await store.put('volume', 'v2', { size: 2 });
      expect(a).toEqual({ kind: 'volume', key: 'v2', version: 1, value: { size: 2 } });
      await store.put('volume', 'v1', { size: 1 });
      await store.put('engine', 'v1', { host: 'h1' });
      const b = await store.put('volume', 'v2', { size: 3 });
      expect(b.version).toBe(2);
      expect(await store.get('volume', 'v2')).toEqual({ kind: 'volume', key: 'v2', version: 2, value: { size: 3 } });
      expect((await store.list('volume')).map((d) => [d.key, d.version])).toEqual([
        ['v1', 1],
        ['v2', 2],
      ]);
      expect(await store.list('nothing-here')).toEqual([]);
      await store.delete('volume', 'v1');
      await store.delete('volume', 'v1');
      expect((await store.list('volume')).map((d) => d.key)).toEqual(['v2']);
      expect(await store.get('engine', 'v1')).not.toBeNull();
    });

    it('lists only the keys with a prefix when asked, in key order', async () => {
      for (const k of ['vol-a-r1', 'vol-a-r0', 'vol-ab-r0', 'vol-b-r0']) await store.put('replica', k, { k });
      expect((await store.list('replica', { prefix: 'vol-a-' })).map((d) => d.key)).toEqual(['vol-a-r0', 'vol-a-r1']);
      expect((await store.list('replica', { prefix: 'vol-a' })).map((d) => d.key)).toEqual(['vol-a-r0', 'vol-a-r1', 'vol-ab-r0']);
      expect(await store.list('replica', { prefix: 'none-' })).toEqual([]);
      expect(await store.list('replica', {})).toHaveLength(4);
    });

    it('returns copies: changing a value after put or get does not change the stored one', async () => {
      const value = { list: [1, 2] };
      const put = await store.put('volume', 'v', value);
      value.list.push(3);
      put.value.list.push(4);
      const got = await store.get<{ list: number[] }>('volume', 'v');
      expect(got!.value.list).toEqual([1, 2]);
      got!.value.list.push(5);
      expect((await store.get<{ list: number[] }>('volume', 'v'))!.value.list).toEqual([1, 2]);
    });

    it('compare-and-set: expectedVersion 0 creates only, N replaces only version N', async () => {
      await store.put('volume', 'v', 'a', { expectedVersion: 0 });
      expect(await codeOf(store.put('volume', 'v', 'b', { expectedVersion: 0 }))).toBe('CONFLICT');
      expect(await codeOf(store.put('volume', 'v', 'b', { expectedVersion: 2 }))).toBe('CONFLICT');
      expect((await store.put('volume', 'v', 'b', { expectedVersion: 1 })).version).toBe(2);
      expect(await codeOf(store.delete('volume', 'v', { expectedVersion: 1 }))).toBe('CONFLICT');
      expect((await store.get('volume', 'v'))!.value).toBe('b');
      await store.delete('volume', 'v', { expectedVersion: 2 });
      expect(await store.get('volume', 'v')).toBeNull();
      expect(await codeOf(store.delete('volume', 'v', { expectedVersion: 2 }))).toBe('CONFLICT');
      expect(await codeOf(store.put('volume', 'v', 'c', { expectedVersion: 1 }))).toBe('CONFLICT');
    });

    it('a CAS race has exactly one winner', async () => {
      await store.put('volume', 'v', { owner: 'none' });
      const racers = Array.from({ length: 20 }, (_, i) => store.put('volume', 'v', { owner: `h${i}` }, { expectedVersion: 1 }));
      const results = await Promise.allSettled(racers);
      const won = results.filter((r) => r.status === 'fulfilled');
      expect(won).toHaveLength(1);
      for (const r of results) if (r.status === 'rejected') expect((r.reason as MooringError).code).toBe('CONFLICT');
      const doc = await store.get<{ owner: string }>('volume', 'v');
      expect(doc!.version).toBe(2);
      expect(doc!.value).toEqual((won[0] as PromiseFulfilledResult<{ value: unknown }>).value.value);
    });

    it('a guarded write happens only while the guard document is at the guard version', async () => {
      const lead = await store.put('leader', 'cluster', { holder: 'a' });
      const guard = { kind: 'leader', key: 'cluster', version: lead.version };
      await store.put('volume', 'v', 1, { guard });
      await store.put('volume', 'v', 2, { guard, expectedVersion: 1 });
      await store.delete('volume', 'v', { guard });
      expect(await codeOf(store.put('volume', 'v', 2, { guard: { ...guard, version: 0 } }))).toBe('CONFLICT');
      await store.put('leader', 'cluster', { holder: 'b' }); // deposed
      const err = await store.put('volume', 'w', 3, { guard }).catch((e: MooringError) => e);
      expect(err).toMatchObject({ code: 'CONFLICT', details: { guard: true, version: lead.version + 1 } });
      expect(await codeOf(store.delete('volume', 'w', { guard }))).toBe('CONFLICT');
      expect(await store.get('volume', 'w')).toBeNull();
      expect(await codeOf(store.put('volume', 'w', 3, { guard: { kind: 'Bad', key: 'x', version: 1 } }))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(store.put('volume', 'w', 3, { guard: { ...guard, version: -1 } }))).toBe('INVALID_ARGUMENT');
    });

    it('a write racing the change of its guard either lands before it or fails', async () => {
      const lead = await store.put('leader', 'cluster', { holder: 'a' });
      const guard = { kind: 'leader', key: 'cluster', version: lead.version };
      const writes = Array.from({ length: 20 }, (_, i) => store.put('volume', `v${i}`, i, { guard }));
      const takeover = store.put('leader', 'cluster', { holder: 'b' }, { expectedVersion: lead.version });
      const results = await Promise.allSettled([...writes, takeover]);
      expect(results.at(-1)!.status).toBe('fulfilled');
      // Each write either landed (stored) or failed CONFLICT (not stored): never stored after a refusal.
      for (let i = 0; i < 20; i++) {
        const r = results[i]!;
        const stored = await store.get('volume', `v${i}`);
        if (r.status === 'fulfilled') expect(stored).not.toBeNull();
        else expect([(r.reason as MooringError).code, stored]).toEqual(['CONFLICT', null]);
      }
    });

    it('read-modify-write loops that retry on CONFLICT lose no increment', async () => {
      await store.put('counter', 'c', 0);
      const worker = async (): Promise<void> => {
        for (let attempt = 0; attempt < 100; attempt++) {
          const cur = (await store.get<number>('counter', 'c'))!;
          try {
            await store.put('counter', 'c', cur.value + 1, { expectedVersion: cur.version });
            return;
          } catch (err) {
            if ((err as MooringError).code !== 'CONFLICT') throw err;
          }
        }
        throw new Error('too many conflicts');
      };
      await Promise.all(Array.from({ length: 10 }, worker));
      expect((await store.get<number>('counter', 'c'))!.value).toBe(10);
    });

    it('refuses bad kinds, keys, versions and values with INVALID_ARGUMENT', async () => {
      for (const kind of ['', 'Volume', '../x', 'a/b', 'x'.repeat(64), 7]) {
        expect(await codeOf(store.get(kind as string, 'k'))).toBe('INVALID_ARGUMENT');
      }
      for (const key of ['', '.', '..', '../../etc/passwd', 'a/b', 'x'.repeat(64), 'a\0b', null]) {
        expect(await codeOf(store.put('volume', key as string, 1))).toBe('INVALID_ARGUMENT');
        expect(await codeOf(store.delete('volume', key as string))).toBe('INVALID_ARGUMENT');
      }
      expect(await codeOf(store.put('volume', 'k', 1, { expectedVersion: -1 }))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(store.put('volume', 'k', 1, { expectedVersion: 1.5 }))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(store.put('volume', 'k', undefined))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(store.put('volume', 'k', 10n))).toBe('INVALID_ARGUMENT');
      const cyclic: Record<string, unknown> = {};
      cyclic.self = cyclic;
      expect(await codeOf(store.put('volume', 'k', cyclic))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(store.put('volume', 'k', 'x'.repeat(STATE_DOCUMENT_BYTES_MAX)))).toBe('INVALID_ARGUMENT');
      expect(await store.get('volume', 'k')).toBeNull();
    });

    it('watch: hears the puts and deletes of its kind and key prefix, in order, until closed', async () => {
      if (!store.watch) throw new Error(`${name} has no watch`);
      const seen: Array<StateChange<unknown>> = [];
      const all: Array<StateChange<unknown>> = [];
      const w = await store.watch('volume', (c) => seen.push(c), { prefix: 'v' });
      const w2 = await store.watch('volume', (c) => all.push(c));
      await store.put('volume', 'v1', { n: 1 });
      await store.put('volume', 'x1', { n: 0 });
      await store.put('engine', 'v1', { n: 9 });
      await store.put('volume', 'v1', { n: 2 }, { expectedVersion: 1 });
      await store.delete('volume', 'v1', { expectedVersion: 2 });
      await store.delete('volume', 'v-never-there');
      const expected = [
        { type: 'put', kind: 'volume', key: 'v1', version: 1, value: { n: 1 } },
        { type: 'put', kind: 'volume', key: 'v1', version: 2, value: { n: 2 } },
        { type: 'delete', kind: 'volume', key: 'v1' },
      ];
      await vi.waitFor(() => expect(seen).toEqual(expected), { timeout: 10_000, interval: 20 });
      // Failed compare-and-sets change nothing and announce nothing.
      expect(await codeOf(store.put('volume', 'v1', 'no', { expectedVersion: 5 }))).toBe('CONFLICT');
      await w.close();
      await w.close();
      await store.put('volume', 'v2', { n: 3 });
      await vi.waitFor(() => expect(all.at(-1)).toEqual({ type: 'put', kind: 'volume', key: 'v2', version: 1, value: { n: 3 } }), { timeout: 10_000, interval: 20 });
      expect(all.map((c) => (c.type === 'resync' ? c.type : `${c.type} ${c.key}`))).toEqual(['put v1', 'put x1', 'put v1', 'delete v1', 'put v2']);
      expect(seen).toEqual(expected);
      // Each listener gets its own copy of a value.
      (all[0] as { value: { n: number } }).value.n = 99;
      expect(seen[0]).toEqual(expected[0]);
      await w2.close();
      expect(await codeOf(store.watch('Bad Kind', () => undefined))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(store.watch('volume', 'not a function' as never))).toBe('INVALID_ARGUMENT');
    });

    it('rejects calls after close with CLOSED', async () => {
      await store.close();
      await store.close();
      expect(await codeOf(store.get('volume', 'v'))).toBe('CLOSED');
      expect(await codeOf(store.put('volume', 'v', 1))).toBe('CLOSED');
    });
  });
}
