// Leadership over a shared StateStore (src/cluster/leader-lease.ts): one leader, a quick
// hand-over on close, a takeover after the lease when the leader is cut off from the store,
// a cut-off leader that stops counting itself leader before anyone takes over, and writes
// of a deposed leader refused by the guard even when they reach the store late. Time is
// vitest's fake clock; the store is the memory store behind a per-instance "network" that
// can hold calls (a partition: they arrive when it heals) or fail them.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { DEFAULT_LEADER_LEASE_MS, LeaderLease } from '../../../src/cluster/leader-lease.js';
import { MooringError } from '../../../src/errors.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import type { StateStore } from '../../../src/state/state-store.js';

const LEASE = 1000;
const clock = { now: () => Date.now() };

// One instance's path to the shared store.
class Link {
  mode: 'up' | 'held' | 'failing' = 'up';
  #held: Array<() => void> = [];
  constructor(readonly store: MemoryStateStore) {}
  heal(): void {
    this.mode = 'up';
    for (const go of this.#held.splice(0)) go();
  }
  readonly view: StateStore = new Proxy({} as StateStore, {
    get: (_t, name: keyof StateStore) => async (...args: unknown[]) => {
      if (this.mode === 'failing') throw new MooringError('UNAVAILABLE', 'store unreachable');
      if (this.mode === 'held') await new Promise<void>((go) => this.#held.push(go));
      return (this.store[name] as (...a: unknown[]) => unknown).apply(this.store, args);
    },
  });
}

function cluster(n: number) {
  const store = new MemoryStateStore();
  const links = Array.from({ length: n }, () => new Link(store));
  const leases = links.map((l, i) => new LeaderLease(l.view, { id: `m${i}`, leaseMs: LEASE }, clock));
  const leaders = () => leases.filter((l) => l.isLeader).map((l) => l.id);
  return { store, links, leases, leaders };
}

// Advances fake time in small steps, checking at every step that at most one instance leads.
async function run(c: ReturnType<typeof cluster>, ms: number, step = 20): Promise<void> {
  for (let t = 0; t < ms; t += step) {
    await vi.advanceTimersByTimeAsync(step);
    expect(c.leaders().length, `leaders at ${Date.now()}: ${c.leaders().join(',')}`).toBeLessThanOrEqual(1);
  }
}

describe('LeaderLease', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('elects one leader among three, the others see it', async () => {
    const c = cluster(3);
    c.leases.forEach((l) => void l.start());
    await run(c, 3 * LEASE);
    expect(c.leaders()).toHaveLength(1);
    const [leader] = c.leaders();
    for (const l of c.leases) expect(l.status).toMatchObject({ holder: leader, term: 1 });
    await run(c, 5 * LEASE);
    expect(c.leaders()).toEqual([leader]); // heartbeats keep it
    await Promise.all(c.leases.map((l) => l.close()));
  });

  it('hands over at once when the leader closes', async () => {
    const c = cluster(2);
    void c.leases[0]!.start();
    await run(c, 100);
    expect(c.leaders()).toEqual(['m0']);
    void c.leases[1]!.start();
    await run(c, 3 * LEASE);
    expect(c.leaders()).toEqual(['m0']);
    await c.leases[0]!.close();
    await run(c, LEASE / 2); // well under a lease: the holder left it free
    expect(c.leaders()).toEqual(['m1']);
    expect(c.leases[1]!.status.term).toBe(2);
    await c.leases[1]!.close();
  });

  it('a leader cut off from the store stops leading before another takes over; its late writes are refused', async () => {
    const c = cluster(3);
    const deposed: MooringError[] = [];
    c.leases.forEach((l) => l.on('deposed', (e) => deposed.push(e)));
    c.leases.forEach((l) => void l.start());
    await run(c, 3 * LEASE);
    const old = c.leases.find((l) => l.isLeader)!;
    const guard = old.guard!;
    const link = c.links[c.leases.indexOf(old)]!;
    // Partitioned: its calls are held and reach the store when the partition heals.
    link.mode = 'held';
    const late = link.view.put('volume', 'v', { by: old.id }, { guard });
    await run(c, 4 * LEASE);
    const now = c.leaders();
    expect(now).toHaveLength(1);
    expect(now[0]).not.toBe(old.id);
    expect(old.isLeader).toBe(false);
    link.heal();
    expect(await late.catch((e: MooringError) => e.code)).toBe('CONFLICT');
    expect(await c.store.get('volume', 'v')).toBeNull();
    await run(c, 2 * LEASE);
    expect(deposed.map((e) => e.code)).toContain('CONFLICT');
    expect(c.leaders()).toEqual(now);
    await Promise.all(c.leases.map((l) => l.close()));
  });

  it('a leader whose store calls fail steps down after the renew deadline, and leads again when it is back alone', async () => {
    const c = cluster(1);
    const deposed: MooringError[] = [];
    c.leases[0]!.on('deposed', (e) => deposed.push(e));
    void c.leases[0]!.start();
    await run(c, 100);
    expect(c.leaders()).toEqual(['m0']);
    c.links[0]!.mode = 'failing';
    await run(c, c.leases[0]!.renewDeadlineMs + LEASE / 5 + 100);
    expect(c.leaders()).toEqual([]);
    expect(deposed.map((e) => e.code)).toEqual(['UNAVAILABLE']);
    c.links[0]!.heal();
    await run(c, 3 * LEASE);
    expect(c.leaders()).toEqual(['m0']);
    expect(c.leases[0]!.status.term).toBe(2);
    await c.leases[0]!.close();
  });

  it('never has two leaders through random partitions and failures (seed printed)', async () => {
    const seed = Number(process.env.MOORING_LEASE_SEED ?? Math.floor(Math.random() * 2 ** 31));
    console.log(`leader-lease random rounds: seed ${seed}`);
    let x = seed || 1;
    const rand = (n: number) => ((x = (x * 48271) % 2147483647), x % n);
    const c = cluster(3);
    c.leases.forEach((l) => void l.start());
    const terms: number[] = [];
    c.leases.forEach((l) => l.on('elected', (t) => terms.push(t)));
    for (let round = 0; round < 40; round++) {
      const link = c.links[rand(3)]!;
      const m = rand(3);
      if (m === 0) link.heal();
      else link.mode = m === 1 ? 'held' : 'failing';
      await run(c, 100 + rand(2 * LEASE));
    }
    c.links.forEach((l) => l.heal());
    await run(c, 4 * LEASE);
    expect(c.leaders(), `seed ${seed}`).toHaveLength(1);
    // Each term is won once.
    expect(new Set(terms).size, `seed ${seed}: terms ${terms.join(',')}`).toBe(terms.length);
    await Promise.all(c.leases.map((l) => l.close()));
  });

  it('refuses bad ids and leases', () => {
    const s = new MemoryStateStore();
    expect(() => new LeaderLease(s, { id: '../x' })).toThrow(MooringError);
    expect(() => new LeaderLease(s, { id: 'a', leaseMs: 10 })).toThrow(/leaseMs/);
    expect(new LeaderLease(s, { id: 'a' }).leaseMs).toBe(DEFAULT_LEADER_LEASE_MS);
  });
});

// With a store that watches (the memory store here, etcd in production), changes of the
// leadership document are acted on when they happen, not at the next round: rounds every
// lease / 5 = 2 min here, and the fake clock is advanced by far less.
describe('LeaderLease over a store with watches', () => {
  const LONG = 600_000;
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a follower takes over as soon as the leader closes; a leader stops leading as soon as another holds the document', async () => {
    const store = new MemoryStateStore();
    const a = new LeaderLease(store, { id: 'a', leaseMs: LONG }, clock);
    const b = new LeaderLease(store, { id: 'b', leaseMs: LONG }, clock);
    await a.start();
    await b.start();
    expect([a.isLeader, b.isLeader]).toEqual([true, false]);
    await a.close();
    await vi.advanceTimersByTimeAsync(50);
    expect(b.status).toEqual({ isLeader: true, holder: 'b', term: 2 });

    // Someone takes the document over from b (as a follower whose lease ran out would).
    const deposed: MooringError[] = [];
    b.on('deposed', (e) => deposed.push(e));
    const doc = (await store.get<{ holder: string; term: number }>('leader', 'cluster'))!;
    await store.put('leader', 'cluster', { holder: 'c', term: 3 }, { expectedVersion: doc.version });
    await vi.advanceTimersByTimeAsync(50);
    expect(b.isLeader).toBe(false);
    expect(deposed.map((e) => e.code)).toEqual(['CONFLICT']);
    expect(deposed[0]!.message).toMatch(/c holds the leadership now \(term 3\)/);
    await b.close();
  });
});
