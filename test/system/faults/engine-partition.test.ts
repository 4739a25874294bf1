// Fault (b): the engine's host is partitioned from the replica hosts (its own NBD clients
// still reach it over their unix sockets), the volume is taken over on another host, then
// the partition heals. Sometimes the control plane loses the host at once, sometimes only
// after the engine has lost its replicas for a while (so the old engine runs cut off with
// clients writing). Invariants 1-2: an engine cut off from a majority holds, then fails, but
// never acknowledges; every durable write survives (docs/single-writer.md).
import { describe, it } from 'vitest';

import { IO_TIMEOUT_MS, attachOn, connectClients, roundCount, runRounds, testTimeout, until, useFaultBench, type RoundContext } from './harness.js';

const ROUNDS = roundCount('b', 6);

/** Partition the engine host, take over on another, heal. */
export async function partitionTakeover(ctx: RoundContext): Promise<{ servingHost: string }> {
  const { bench, rng, workload, engineHost: x } = ctx;
  const others = bench.hosts.map((h) => h.hostId).filter((h) => h !== x);
  const y = rng.pick(others);
  await workload.waitAcks(rng.range(20, 400), { group: x, flush: true, timeoutMs: 30_000 });
  await until('writes in flight on the engine host', () => workload.inFlight(x) > 0, 10_000, () => workload.describe(), 1);
  if (rng.chance(0.5)) {
    // First the replica hosts only: the engine is cut off while the control plane still
    // sees it; its clients keep writing past its I/O timeout.
    bench.lab.cut([x], others);
    ctx.step(`cut ${x} from ${others.join(',')} with ${workload.inFlight(x)} requests in flight`);
    const seen = Date.now();
    await until(`${x}'s engine to notice (its I/O timeout)`, async () => (await bench.host(x).engine.engineInfo(ctx.volume)).replicas.some((r) => r.mode === 'ERR'), IO_TIMEOUT_MS * 10, () => workload.describe(), 50).catch(
      (e: unknown) => ctx.step(`(${x}'s engine reported no ERR replica: ${(e as Error).message.split('\n')[0]})`),
    );
    ctx.step(`${x} cut off for ${Date.now() - seen} ms (acked ${workload.acks(x)} so far); now the control plane loses it too`);
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
  bench.lab.heal();
  return { servingHost: y };
}

describe('fault b: engine host partitioned from the replica hosts, takeover, heal', () => {
  const bench = useFaultBench();
  it(`keeps every durable write and one writer over ${ROUNDS} randomized rounds`, async () => {
    await runRounds(bench, 'b', ROUNDS, partitionTakeover);
  }, testTimeout(ROUNDS));
});
