// Fault (d): fault (a) or (b) during a rebuild. A replica host is cut off while the clients
// write, so its replica misses data; the partition heals with that host's link slowed
// (tc tbf), so the engine's rebuild of it takes seconds; while it runs, the engine's host
// is frozen or partitioned and the volume is taken over, sometimes on the host whose
// replica was half rebuilt. Invariant 3: a replica that missed writes is never read before
// it is rebuilt; invariants 1-2 as in (a) and (b).
import { describe, it } from 'vitest';

import type { EngineInfo } from '../../../src/data-engine/data-engine.js';
import { IO_TIMEOUT_MS, attachOn, connectClients, laneCount, roundCount, runRounds, testTimeout, until, useFaultBench, type RoundContext } from './harness.js';

// Default: the issue's 50 rounds per fault type (docs/fault-tests.md); MOORING_FAULT_ROUNDS=N to change it.
const ROUNDS = roundCount('d', 50);
const LANES = laneCount(2);

/** Make a replica stale, start its rebuild over a slow link, then freeze or partition the engine host and take over. */
export async function rebuildTakeover(ctx: RoundContext): Promise<{ servingHost: string }> {
  const { bench, rng, workload, engineHost: x, volume } = ctx;
  const others = ctx.hostIds.filter((h) => h !== x);
  const r = rng.pick(others);
  const engine = bench.host(x).engine;
  const replicaOf = (info: EngineInfo): EngineInfo['replicas'][number] | undefined => info.replicas.find((rep) => rep.hostId === r);
  await workload.waitAcks(rng.range(20, 200), { group: x, flush: true, timeoutMs: 30_000 });

  // 1. r misses writes.
  bench.lab.isolate(r);
  await until(`${x}'s engine to drop ${r}'s replica`, async () => replicaOf(await engine.engineInfo(volume))?.mode === 'ERR', IO_TIMEOUT_MS * 15, () => workload.describe(), 50);
  await workload.waitAcks(rng.range(200, 600), { group: x, flush: true, timeoutMs: 30_000 });
  // 2. r comes back over a slow link; its rebuild starts (ours, or the self-repair's).
  const rate = `${rng.range(4, 12)}mbit`;
  bench.lab.slow(r, rate);
  ctx.heal();
  const ref = (await engine.engineInfo(volume)).replicas.find((rep) => rep.hostId === r)!;
  void engine.addReplica(volume, { id: ref.id, hostId: ref.hostId, name: ref.name, address: ref.address }).catch((e: unknown) => bench.note(`[d ${ctx.seed}] rebuild of ${r}: ${(e as Error).message}`));
  let seen = '';
  await until(`the rebuild of ${r}'s replica to be under way`, async () => {
    const rep = replicaOf(await engine.engineInfo(volume));
    seen = `${rep?.mode} ${JSON.stringify(rep?.rebuild ?? null)}`;
    return rep?.mode === 'WO' || rep?.mode === 'RW';
  }, 30_000, () => `${workload.describe()}\nlast seen: ${seen}`, 10);
  if (replicaOf(await engine.engineInfo(volume))?.mode !== 'WO') throw new Error(`${r}'s replica was rebuilt before the fault (${seen}): the link slowdown did not hold it`);
  ctx.step(`${r} missed writes, rebuild under way at ${rate} (${seen})`);

  // 3. The engine host fails mid-rebuild.
  const y = rng.pick(others);
  await until('writes in flight on the engine host', () => workload.inFlight(x) > 0, 10_000, () => workload.describe(), 1);
  const freeze = rng.chance(0.5);
  if (freeze) bench.host(x).freeze();
  else bench.lab.isolate(x);
  ctx.step(`${freeze ? 'froze' : 'isolated'} ${x} mid-rebuild with ${workload.inFlight(x)} requests in flight; take over on ${y}${y === r ? ' (the half-rebuilt host)' : ''}`);
  const taken = await attachOn(ctx, y);
  const fence = ctx.history.fence(x, `${y} took over at epoch ${taken.epoch}`);
  ctx.step(`took over on ${y} (epoch ${taken.epoch}, ${taken.state}, replicas ${taken.replicas.map((rep) => `${rep.hostId}:${rep.mode}`).join(' ')}; fence t${fence})`);
  if (rng.chance(0.5)) bench.lab.slow(r, null);
  await connectClients(ctx, y, rng.range(1, 2));
  await workload.waitAcks(rng.range(0, 200), { group: y, flush: rng.chance(0.5), timeoutMs: 30_000 });
  ctx.step(`${y} acknowledged ${workload.acks(y)}; ${freeze ? 'resume' : 'heal'} ${x}`);
  if (freeze) bench.host(x).thaw();
  else ctx.heal();
  bench.lab.slow(r, null);
  return { servingHost: y };
}

describe('fault d: engine host frozen or partitioned during a rebuild, takeover', () => {
  const bench = useFaultBench(LANES);
  it(`keeps every durable write, one writer and never reads the half-rebuilt replica over ${ROUNDS} randomized rounds`, async () => {
    await runRounds(bench, 'd', ROUNDS, rebuildTakeover);
  }, testTimeout(ROUNDS));
});
