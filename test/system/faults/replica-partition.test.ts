// Fault (c): a replica host (not the engine's) is partitioned, with writes in flight; the
// engine keeps serving from the majority (its own replica and the third); the partition
// heals and the cut-off replica is rebuilt. Sometimes the control plane loses that host too,
// sometimes only the engine does. Invariants 1 and 3: every durable write survives, the
// stale replica is never read, all replicas end identical.
import { describe, it } from 'vitest';

import { IO_TIMEOUT_MS, laneCount, roundCount, runRounds, testTimeout, until, useFaultBench, type RoundContext } from './harness.js';

// Default: the 50 rounds per fault type (docs/fault-tests.md); MOORING_FAULT_ROUNDS=N to change it.
const ROUNDS = roundCount('c', 50);
const LANES = laneCount(2);

/** Partition one replica host, keep writing, heal. */
export async function replicaPartition(ctx: RoundContext): Promise<{ servingHost: string }> {
  const { bench, rng, workload, engineHost: x } = ctx;
  const r = rng.pick(ctx.hostIds.filter((h) => h !== x));
  await workload.waitAcks(rng.range(20, 400), { group: x, flush: true, timeoutMs: 30_000 });
  await until('writes in flight', () => workload.inFlight(x) > 0, 10_000, () => workload.describe(), 1);
  if (rng.chance(0.5)) {
    bench.lab.isolate(r);
    ctx.step(`isolated replica host ${r} (control plane too) with ${workload.inFlight(x)} requests in flight`);
  } else {
    bench.lab.cut([r], [x]);
    ctx.step(`cut replica host ${r} from engine host ${x} with ${workload.inFlight(x)} requests in flight`);
  }
  // Writes go on past the engine's I/O timeout: it drops the replica and serves from the others.
  await until(`${x}'s engine to drop ${r}'s replica`, async () => (await bench.host(x).engine.engineInfo(ctx.volume)).replicas.some((rep) => rep.hostId === r && rep.mode === 'ERR'), IO_TIMEOUT_MS * 15, () => workload.describe(), 50);
  await workload.waitAcks(rng.range(1, 400), { group: x, flush: true, timeoutMs: 30_000 });
  ctx.step(`${x} acknowledged ${workload.acks(x)} with ${r} cut off; heal`);
  ctx.heal();
  return { servingHost: x };
}

describe('fault c: a replica host partitioned, then healed', () => {
  const bench = useFaultBench(LANES);
  it(`keeps every durable write and rebuilds the replica over ${ROUNDS} randomized rounds`, async () => {
    await runRounds(bench, 'c', ROUNDS, replicaPartition);
  }, testTimeout(ROUNDS));
});
