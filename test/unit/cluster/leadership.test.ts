// Several embedders over one store (MooringOptions.leadership, docs/leadership.md): one
// leads and acts, the others read and refuse control operations with NOT_LEADER naming the
// leader; when the leader closes or loses the store, another takes over and carries on
// with the same volumes; the old one can no longer write. Fake data engines shared by the
// embedders (each watches them), a memory store behind a per-embedder link that can fail.
import { afterEach, describe, expect, it, vi } from 'vitest';

import { MooringError } from '../../../src/errors.js';
import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import type { StateStore } from '../../../src/state/state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

const LEASE_MS = 600;
const SIZE = 64 * 4096;
const WAIT = { timeout: 10_000, interval: 20 };

// One embedder's path to the shared store; `down` makes every call fail UNAVAILABLE.
function link(store: MemoryStateStore): { view: StateStore; down: boolean } {
  const l = {
    down: false,
    view: new Proxy({} as StateStore, {
      get: (_t, name: keyof StateStore) => async (...args: unknown[]) => {
        if (l.down && name !== 'close') throw new MooringError('UNAVAILABLE', 'store unreachable');
        return (store[name] as (...a: unknown[]) => unknown).apply(store, args);
      },
    }),
  };
  return l;
}

async function codeOf(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => 'ok',
    (e: MooringError) => e.code,
  );
}

describe('leadership among embedders sharing a store', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const m of open.splice(0)) await m.close().catch(() => undefined);
  });

  async function embedders(n: number) {
    const store = new MemoryStateStore();
    const hosts = ['a', 'b', 'c'].map((h) => new FakeDataEngine(h));
    const links = Array.from({ length: n }, () => link(store));
    const ms: Mooring[] = [];
    for (let i = 0; i < n; i++) {
      const m = await Mooring.open({ store: links[i]!.view, hosts, repairIntervalMs: 100, leadership: { id: `vm${i}`, leaseMs: LEASE_MS } });
      open.push(m);
      ms.push(m);
    }
    return { store, hosts, links, ms };
  }

  it('the first leads and acts; the others read and refuse control operations with NOT_LEADER', async () => {
    const { ms } = await embedders(2);
    const [m0, m1] = ms as [Mooring, Mooring];
    expect(m0.leadership).toMatchObject({ isLeader: true, holder: 'vm0', term: 1 });
    expect(m1.leadership).toMatchObject({ isLeader: false, holder: 'vm0' });
    await m0.createVolume({ name: 'v', sizeBytes: SIZE, replicas: 3 });
    await m0.volume('v').attach({ host: 'a' });
    // Reads on the follower see the leader's volumes.
    expect((await m1.listVolumes()).map((v) => v.name)).toEqual(['v']);
    expect((await m1.volume('v').status()).attachedHost).toBe('a');
    const err = await m1.createVolume({ name: 'w', sizeBytes: SIZE }).catch((e: MooringError) => e);
    expect(err).toMatchObject({ code: 'NOT_LEADER', details: { leader: 'vm0', term: 1 } });
    expect(await codeOf(m1.volume('v').detach())).toBe('NOT_LEADER');
    expect(await codeOf(m1.deleteVolume('v'))).toBe('NOT_LEADER');
    expect(await codeOf(m1.volume('v').createSnapshot('s'))).toBe('NOT_LEADER');
    expect((await m0.listVolumes()).map((v) => v.name)).toEqual(['v']);
    // Only the leader repairs.
    await vi.waitFor(() => expect(m0.repairLoop.passes).toBeGreaterThan(2), WAIT);
  });

  it('when the leader closes, another takes over at once and carries on with the same volumes', async () => {
    const { ms, hosts } = await embedders(3);
    const [m0, m1, m2] = ms as [Mooring, Mooring, Mooring];
    await m0.createVolume({ name: 'v', sizeBytes: SIZE, replicas: 3 });
    await m0.volume('v').attach({ host: 'a' });
    const changes: Array<{ who: string; isLeader: boolean }> = [];
    for (const m of [m1, m2]) m.on('leadership', (s) => changes.push({ who: m === m1 ? 'vm1' : 'vm2', isLeader: s.isLeader }));
    await m0.close();
    await vi.waitFor(() => expect([m1, m2].filter((m) => m.leadership!.isLeader)).toHaveLength(1), WAIT);
    const leader = m1.leadership!.isLeader ? m1 : m2;
    expect(leader.leadership!.term).toBe(2);
    expect(changes).toEqual([{ who: leader === m1 ? 'vm1' : 'vm2', isLeader: true }]);
    // The new leader moves the volume; the follower still refuses.
    await leader.volume('v').detach();
    await leader.volume('v').attach({ host: 'b' });
    expect([...hosts[1]!.engines.keys()]).toEqual(['v']);
    expect(hosts[0]!.engines.size).toBe(0);
    const follower = leader === m1 ? m2 : m1;
    expect(await codeOf(follower.volume('v').detach())).toBe('NOT_LEADER');
  });

  it('a leader that loses the store stops leading before another takes over, and cannot write after', async () => {
    const { ms, links } = await embedders(2);
    const [m0, m1] = ms as [Mooring, Mooring];
    await m0.createVolume({ name: 'v', sizeBytes: SIZE, replicas: 3 });
    const deposed: boolean[] = [];
    m0.on('leadership', (s) => deposed.push(s.isLeader));
    links[0]!.down = true;
    // At every moment at most one leads.
    await vi.waitFor(() => {
      expect([m0, m1].filter((m) => m.leadership!.isLeader).length).toBeLessThanOrEqual(1);
      expect(m1.leadership!.isLeader).toBe(true);
    }, WAIT);
    expect(deposed).toEqual([false]);
    expect(m0.leadership!.isLeader).toBe(false);
    links[0]!.down = false;
    // Back on the store, the old leader is a follower: refused before anything is written.
    expect(await codeOf(m0.createVolume({ name: 'late', sizeBytes: SIZE }))).toBe('NOT_LEADER');
    await vi.waitFor(() => expect(m0.leadership).toMatchObject({ isLeader: false, holder: 'vm1', term: 2 }), WAIT);
    await m1.createVolume({ name: 'w', sizeBytes: SIZE, replicas: 3 });
    expect((await m0.listVolumes()).map((v) => v.name)).toEqual(['v', 'w']);
  });

  it('refuses a bad leadership option', async () => {
    const store = new MemoryStateStore();
    expect(await codeOf(Mooring.open({ store, leadership: { id: '../x' } }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(Mooring.open({ store, leadership: { id: 'a', leaseMs: 1 } }))).toBe('INVALID_ARGUMENT');
  });
});
