// Fault (a): the engine's host is frozen (SIGSTOP) with writes in flight, past every
// timeout; the volume is taken over on another host (cluster.attach there); the frozen host
// resumes (SIGCONT) while its NBD clients keep sending. Invariants 1-2: nothing the old
// engine acknowledges after the takeover, and every durable write survives
// (docs/single-writer.md, docs/fault-tests.md).
import { describe, it } from 'vitest';

import { IO_TIMEOUT_MS, attachOn, connectClients, laneCount, roundCount, runRounds, testTimeout, until, useFaultBench, type RoundContext } from './harness.js';

// Default: the 50 rounds per fault type (docs/fault-tests.md); MOORING_FAULT_ROUNDS=N to change it.
const ROUNDS = roundCount('a', 50);
const LANES = laneCount(2);

/** Freeze the engine host, take over on another, resume the frozen one. */
export async function freezeTakeover(ctx: RoundContext): Promise<{ servingHost: string }> {
  const { bench, rng, workload, engineHost: x } = ctx;
  const y = rng.pick(ctx.hostIds.filter((h) => h !== x));
  await workload.waitAcks(rng.range(20, 400), { group: x, flush: true, timeoutMs: 30_000 });
  await until('writes in flight on the engine host', () => workload.inFlight(x) > 0, 10_000, () => workload.describe(), 1);
  bench.host(x).freeze();
  const frozeAt = Date.now();
  ctx.step(`froze ${x} with ${workload.inFlight(x)} requests in flight`);
  // The takeover waits for the control plane's probe of x (3 s) and the new engine's
  // connection to x's replica (the I/O timeout): the freeze outlasts both.
  const taken = await attachOn(ctx, y);
  const fence = ctx.history.fence(x, `${y} took over at epoch ${taken.epoch}`);
  ctx.step(`took over on ${y} (epoch ${taken.epoch}, ${taken.state}; fence t${fence})`);
  await connectClients(ctx, y, rng.range(1, 2));
  await workload.waitAcks(rng.range(0, 300), { group: y, flush: rng.chance(0.5), timeoutMs: 30_000 });
  ctx.step(`${y} acknowledged ${workload.acks(y)}; resume ${x} after ${((Date.now() - frozeAt) / 1000).toFixed(1)} s frozen (I/O timeout ${IO_TIMEOUT_MS} ms)`);
  bench.host(x).thaw();
  // The old clients keep sending until the cluster stops the stray engine (the round does
  // not stop them); y's clients write on meanwhile.
  return { servingHost: y };
}

describe('fault a: engine host frozen past every timeout, takeover, resume', () => {
  const bench = useFaultBench(LANES);
  it(`keeps every durable write and one writer over ${ROUNDS} randomized rounds`, async () => {
    await runRounds(bench, 'a', ROUNDS, freezeTakeover);
  }, testTimeout(ROUNDS));
});
