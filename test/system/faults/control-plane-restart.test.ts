// Fault (f): the control plane restarts in the middle of a takeover. The engine's host is
// frozen or partitioned; an attach on another host starts the takeover; at a random point
// of it (at once, once the old engine record is gone, once the new engine runs, once the
// attach returned) the Mooring and its FileStateStore are closed and opened again over the
// same directory, as a restarted VM manager would; the new Mooring is asked to attach there
// again. Then the old host comes back with its clients still sending. Invariants 1-2.
import { describe, it } from 'vitest';

import { KIND } from '../../../src/cluster/cluster-records.js';
import { attachOn, connectClients, roundCount, runRounds, testTimeout, until, useFaultBench, type RoundContext } from './harness.js';

// Default: the 50 rounds per fault type (docs/fault-tests.md); MOORING_FAULT_ROUNDS=N to change it.
const ROUNDS = roundCount('f', 50);
// Two lanes, each with a control plane of its own: a restart closes only its lane's Mooring.
const LANES = 2;

const POINTS = ['at-once', 'old-record-gone', 'engine-on-target', 'attach-returned'] as const;

export async function controlPlaneRestart(ctx: RoundContext): Promise<{ servingHost: string }> {
  const { bench, rng, workload, engineHost: x, volume } = ctx;
  const y = rng.pick(ctx.hostIds.filter((h) => h !== x));
  const point = rng.pick(POINTS);
  const freeze = rng.chance(0.5);
  await workload.waitAcks(rng.range(20, 400), { group: x, flush: true, timeoutMs: 30_000 });
  await until('writes in flight on the engine host', () => workload.inFlight(x) > 0, 10_000, () => workload.describe(), 1);
  if (freeze) bench.host(x).freeze();
  else bench.lab.isolate(x);
  ctx.step(`${freeze ? 'froze' : 'isolated'} ${x} with ${workload.inFlight(x)} requests in flight; takeover on ${y}, control plane restarts ${point}`);

  const first = attachOn(ctx, y).then(
    (st) => `returned (epoch ${st.epoch})`,
    (e: unknown) => `failed: ${(e as Error).message.split('\n')[0]}`,
  );
  const store = bench.storeOf(ctx.lane);
  if (point === 'old-record-gone') {
    await until(`the engine record of ${volume} on ${x} to go`, async () => (await store.get<{ hostId: string }>(KIND.engine, volume))?.value.hostId !== x, 30_000);
  } else if (point === 'engine-on-target') {
    await until(`an engine of ${volume} on ${y}`, async () => (await bench.host(y).engine.listEngines()).some((e) => e.volume === volume), 30_000);
  } else if (point === 'attach-returned') {
    await first;
  }
  await bench.reopenCluster(ctx.lane);
  // The first attach ends either way (done, or refused by the closed cluster): bounded.
  let firstOutcome = '';
  void first.then((o) => (firstOutcome = o));
  await until('the interrupted attach to end', () => firstOutcome !== '', 60_000);
  ctx.step(`restarted the control plane; the first attach ${firstOutcome}`);

  const taken = await attachOn(ctx, y);
  const fence = ctx.history.fence(x, `${y} took over at epoch ${taken.epoch} (after the restart)`);
  ctx.step(`took over on ${y} (epoch ${taken.epoch}, ${taken.state}; fence t${fence})`);
  await connectClients(ctx, y, rng.range(1, 2));
  await workload.waitAcks(rng.range(0, 300), { group: y, flush: rng.chance(0.5), timeoutMs: 30_000 });
  ctx.step(`${y} acknowledged ${workload.acks(y)}; ${freeze ? 'resume' : 'heal'} ${x}`);
  if (freeze) bench.host(x).thaw();
  else ctx.heal();
  return { servingHost: y };
}

describe('fault f: control plane closed and reopened in the middle of a takeover', () => {
  const bench = useFaultBench(LANES, { clusterPerLane: true });
  it(`keeps every durable write and one writer over ${ROUNDS} randomized rounds`, async () => {
    await runRounds(bench, 'f', ROUNDS, controlPlaneRestart);
  }, testTimeout(ROUNDS));
});
