// Fault (b): the engine's host is partitioned from the replica hosts (its own NBD clients
// still reach it over their unix sockets), the volume is taken over on another host, then
// the partition heals. Sometimes the control plane loses the host at once, sometimes only
// after the engine has lost its replicas for a while (so the old engine runs cut off with
// clients writing). Invariants 1-2: an engine cut off from a majority holds, then fails, but
// never acknowledges; every durable write survives (docs/single-writer.md).
import { describe, it } from 'vitest';

import { IO_TIMEOUT_MS, attachOn, connectClients, laneCount, roundCount, runRounds, testTimeout, until, useFaultBench, type RoundContext } from './harness.js';

// Default: the 50 rounds per fault type (docs/fault-tests.md); MOORING_FAULT_ROUNDS=N to change it.
const ROUNDS = roundCount('b', 50);
const LANES = laneCount(2);

/** Partition the engine host, take over on another, heal. */
export async function partitionTakeover(ctx: RoundContext): Promise<{ servingHost: string }> {
  const { bench, rng, workload, engineHost: x } = ctx;
  const others = ctx.hostIds.filter((h) => h !== x);
  const y = rng.pick(others);
  await workload.waitAcks(rng.range(20, 400), { group: x, flush: true, timeoutMs: 30_000 });
  await until('writes in flight on the engine host', () => workload.inFlight(x) > 0, 10_000, () => workload.describe(), 1);
  if (rng.chance(0.5)) {
    // First the replica hosts only: the engine is cut off while the control plane still
    // sees it; its clients keep writing past its I/O timeout.
    bench.lab.cut([x], others);
    ctx.step(`cut ${x} from ${others.join(',')} with ${workload.inFlight(x)} requests in flight`);
    const seen = Date.now();
    // Until the engine has reacted: it dropped a replica (and, before the fix of issue 12,
    // went on alone), or its clients get errors, or nothing is acknowledged any more
    // (requests held) for twice the I/O timeout.
    let how = '';
    await until(
      `${x}'s engine to react to the cut`,
      async () => {
        if (workload.errored(x)) how = 'its clients got errors';
        else if (workload.sinceLastAck(x) > 2 * IO_TIMEOUT_MS && workload.inFlight(x) > 0) how = 'its requests are held';
        else if ((await bench.host(x).engine.engineInfo(ctx.volume)).replicas.some((r) => r.mode === 'ERR')) how = 'it dropped a replica';
        return how !== '';
      },
      IO_TIMEOUT_MS * 15,
      () => workload.describe(),
      50,
    );
    ctx.step(`${x} cut off for ${Date.now() - seen} ms, ${how} (acked ${workload.acks(x)} so far); now the control plane loses it too`);
    bench.lab.cut([x], ['ctl']);
  } else {
    bench.lab.isolate(x);
    ctx.step(`isolated ${x} (control plane too) with ${workload.inFlight(x)} requests in flight`);
  }
  const taken = await attachOn(ctx, y);
  const fence = ctx.history.fence(x, `${y} took over at epoch ${taken.epoch}`);
  ctx.step(`took over on ${y} (epoch ${taken.epoch}, ${taken.state}; fence t${fence})`);
  await connectClients(ctx, y, rng.range(1, 2));
  await workload.waitAcks(rng.range(0, 300), { group: y, flush: rng.chance(0.5), timeoutMs: 30_000 });
  ctx.step(`${y} acknowledged ${workload.acks(y)}, ${x}'s clients ${workload.acks(x)}; heal`);
  ctx.heal();
  return { servingHost: y };
}

describe('fault b: engine host partitioned from the replica hosts, takeover, heal', () => {
  const bench = useFaultBench(LANES);
  it(`keeps every durable write and one writer over ${ROUNDS} randomized rounds`, async () => {
    await runRounds(bench, 'b', ROUNDS, partitionTakeover);
  }, testTimeout(ROUNDS));
});
