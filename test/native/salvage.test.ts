// Salvage at engine start (docs/salvage.md), through the real addon: a start that the caller
// says is over the only replicas left needs no majority of the latest replica set, keeps
// the latest set's RW replicas when it reaches any, and otherwise serves from the replica
// whose last RW set is newest, which a replica records when an engine stores a set in which
// it is RW. It never bypasses the epoch fence.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { NativeEngine, NativeEngineEvent } from '../../src/native/binding.js';
import { addon, codeOf, createReplicas, MiB, nextEpoch, pattern, replicaDir, Scratch, waitFor, withReplica, type ReplicaDir } from './helpers.js';
import { deadPort } from './remote-helpers.js';

const SIZE = 4 * MiB;
const A = pattern(81, MiB);
const B = pattern(82, MiB);

describe('engine salvage start', () => {
  let s: Scratch;
  beforeAll(() => {
    s = new Scratch('mooring-salvage-');
  });
  afterAll(() => s.cleanup());

  async function open(replicas: ReplicaDir[], ids: string[], extra: { salvage?: boolean; epoch?: number } = {}): Promise<{ engine: NativeEngine; events: NativeEngineEvent[] }> {
    const events: NativeEngineEvent[] = [];
    const engine = await addon().openEngine({
      replicas: ids.map((id) => replicaDir(replicas, id)),
      members: ids,
      epoch: extra.epoch ?? nextEpoch(),
      onEvents: (e) => events.push(...(e as NativeEngineEvent[])),
      ...(extra.salvage !== undefined ? { salvage: extra.salvage } : {}),
    });
    return { engine, events };
  }

  /** The 'salvaged' event (events reach JS through a queue, maybe after openEngine resolved). */
  async function salvaged(events: NativeEngineEvent[]): Promise<NativeEngineEvent> {
    await waitFor('a salvaged event', () => events.some((x) => x.type === 'salvaged'));
    return events.find((x) => x.type === 'salvaged')!;
  }

  it('serves from the replica whose last RW set is newest when no reachable replica is RW in the latest set', async () => {
    const replicas = await createReplicas(s.path('rank'), 5, SIZE);
    const all = replicas.map((r) => r.id);
    {
      const { engine } = await open(replicas, all);
      await engine.write(0, A);
      await engine.close();
    }
    // What an engine of epoch e over five replicas leaves behind when r0 fails first (set e/2
    // without it), B is written, then r1 fails too (set e/3 without it), and both come back
    // while r2..r4 still serve: each stores e/3, in which neither is RW. r1 holds B, r0 does not.
    const e = nextEpoch();
    const set = (generation: number, rw: string[]) => ({ epoch: e, generation, members: all, rw });
    for (const id of all) {
      await withReplica(replicaDir(replicas, id), async (r) => {
        await r.claimEpoch(e);
        await r.setReplicaSet(set(1, all), true);
        if (id === 'r0') return;
        await r.setReplicaSet(set(2, all.slice(1)), true);
        await r.write(e, 0, B);
      });
    }
    for (const id of all) {
      await withReplica(replicaDir(replicas, id), (r) => r.setReplicaSet(set(3, ['r2', 'r3', 'r4']), id !== 'r0' && id !== 'r1'));
    }
    // r2..r4 are gone. The normal rules refuse: two of five members is no majority.
    expect(await codeOf(open(replicas, ['r0', 'r1']))).toBe('NO_QUORUM');
    // A salvage that may lose writes must claim every replica it is given: one that does
    // not answer might be the freshest.
    const silent = await addon().openEngine({
      replicas: [replicaDir(replicas, 'r0'), replicaDir(replicas, 'r1'), { host: '127.0.0.1', port: await deadPort(), name: 'vol' }],
      members: ['r0', 'r1', 'r2'],
      epoch: nextEpoch(),
      salvage: true,
    }).then(
      (x) => x.close().then(() => 'opened'),
      (err: { code?: string; message?: string }) => `${err.code}: ${err.message}`,
    );
    expect(silent).toMatch(/^NO_QUORUM: salvage: a replica given could not be claimed/);
    const { engine, events } = await open(replicas, ['r0', 'r1'], { salvage: true });
    try {
      // r1, although r0 comes first: its last RW set (e/2) is newer than r0's (e/1).
      expect(engine.replicas().map((r) => r.mode)).toEqual(['ERR', 'RW']);
      expect((await engine.read(0, MiB)).equals(B)).toBe(true);
      expect(await salvaged(events)).toMatchObject({ replicaId: replicaDir(replicas, 'r1'), lastRw: { epoch: e, generation: 2 }, complete: false, message: expect.stringMatching(/may be missing/) });
      await engine.write(MiB, A); // it serves writes too
    } finally {
      await engine.close();
    }
    // The committed set names only the given replicas: the next engine needs no salvage.
    const { engine: next } = await open(replicas, ['r0', 'r1']);
    try {
      expect(next.replicas().map((r) => r.mode)).toEqual(['ERR', 'RW']);
      expect((await next.read(0, MiB)).equals(B)).toBe(true);
    } finally {
      await next.close();
    }
  });

  it('keeps a reachable RW replica of the latest set, and says when the claim could not prove it complete', async () => {
    const replicas = await createReplicas(s.path('survivor'), 3, SIZE);
    const all = replicas.map((r) => r.id);
    const first = await open(replicas, all);
    await first.engine.write(0, A);
    const e1 = first.engine.epoch();
    await first.engine.close();
    // r0 and r1 are gone: alone, r2 is no majority of the three.
    expect(await codeOf(open(replicas, ['r2']))).toBe('NO_QUORUM');
    const { engine, events } = await open(replicas, ['r2'], { salvage: true });
    try {
      expect(engine.replicas().map((r) => r.mode)).toEqual(['RW']);
      expect((await engine.read(0, MiB)).equals(A)).toBe(true);
      expect(await salvaged(events)).toMatchObject({ replicaId: replicaDir(replicas, 'r2'), lastRw: { epoch: e1, generation: 1 }, complete: false });
    } finally {
      await engine.close();
    }
  });

  it('is a normal start when a majority answers with RW replicas of the latest set: all of them stay RW, complete', async () => {
    const replicas = await createReplicas(s.path('normal'), 3, SIZE);
    const all = replicas.map((r) => r.id);
    const first = await open(replicas, all);
    await first.engine.write(0, A);
    await first.engine.close();
    const { engine, events } = await open(replicas, all, { salvage: true });
    try {
      expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
      expect(await salvaged(events)).toMatchObject({ complete: true });
      expect((await engine.read(0, MiB)).equals(A)).toBe(true);
    } finally {
      await engine.close();
    }
  });

  it('never bypasses the epoch fence: an older epoch is refused, and the older engine still running is fenced', async () => {
    const replicas = await createReplicas(s.path('fence'), 3, SIZE);
    const all = replicas.map((r) => r.id);
    const older = await open(replicas, all);
    await older.engine.write(0, A);
    const newer = nextEpoch();
    // A salvage of r1 alone while the older engine still runs (the caller was wrong about
    // r0 and r2 being gone): it claims r1, so the older engine can no longer write.
    expect(await codeOf(addon().openEngine({ replicas: [replicaDir(replicas, 'r1')], members: ['r1'], epoch: 1, salvage: true }))).toBe('STALE_EPOCH');
    const { engine } = await open(replicas, ['r1'], { salvage: true, epoch: newer });
    try {
      expect(await codeOf(older.engine.write(0, B))).toBe('STALE_EPOCH');
      expect((await engine.read(0, MiB)).equals(A)).toBe(true);
    } finally {
      await engine.close();
      await older.engine.close().catch(() => undefined);
    }
    expect(await codeOf(addon().openEngine({ replicas: [replicaDir(replicas, 'r0')], members: ['r0'], standby: true, salvage: true }))).toBe('INVALID_ARGUMENT');
  });
});
