// Fault (e): a migration hand-over with I/O in flight on both sides. The volume is
// migratable; a migration to another host starts (Mooring migrate, or an attach on the
// second host), clients connect to the target's standby export (refused until the
// hand-over) while the source's clients keep writing; then one of:
// - hand-over and confirm;
// - hand-over, the target writes, roll back (the source becomes the writer again);
// - hand-over, the source host freezes, confirm (by the cluster or by us), the source resumes;
// - attach-driven: detach from the source (confirms), or from the target before the
//   hand-over (rolls back).
// Invariants 1-2: one writer at a time (a standby, or an engine that handed over,
// acknowledges nothing), every durable write survives.
import { describe, it } from 'vitest';

import { MooringError } from '../../../src/errors.js';
import { attachOn, connectClients, laneCount, roundCount, runRounds, testTimeout, until, useFaultBench, type RoundContext } from './harness.js';

// Default: the 50 rounds per fault type (docs/fault-tests.md); MOORING_FAULT_ROUNDS=N to change it.
const ROUNDS = roundCount('e', 50);
const LANES = laneCount(2);

const VARIANTS = ['confirm', 'rollback', 'frozen-source', 'tickets-confirm', 'tickets-rollback'] as const;

/** The migration is over (by our call or by the cluster's repair loop): tolerate the loser of that race. */
async function endOrAlreadyEnded(ctx: RoundContext, call: () => Promise<void>): Promise<void> {
  try {
    await call();
  } catch (e) {
    if (!(e instanceof MooringError && e.code === 'INVALID_STATE' && (await ctx.cluster.volume(ctx.volume).status()).migration === null)) throw e;
    ctx.step('(the cluster had ended the migration already)');
  }
}

export async function migrationHandOver(ctx: RoundContext): Promise<{ servingHost: string }> {
  const { bench, rng, workload, engineHost: x, history, volume } = ctx;
  const y = rng.pick(ctx.hostIds.filter((h) => h !== x));
  const variant = rng.pick(VARIANTS);
  const vol = ctx.cluster.volume(volume);
  ctx.step(`variant ${variant}, ${x} → ${y}`);
  await workload.waitAcks(rng.range(20, 300), { group: x, flush: true, timeoutMs: 30_000 });

  const tickets = variant.startsWith('tickets');
  const m = tickets ? null : await vol.migrate(y, { nbd: ctx.nbdAddress(y), attacher: 'workload' });
  if (tickets) await attachOn(ctx, y, { attacher: 'workload' });
  // y's standby serves nothing until the hand-over.
  history.fence(y, 'standby');
  await connectClients(ctx, y, rng.range(1, 2));
  await workload.waitAcks(rng.range(10, 200), { group: x, timeoutMs: 30_000 });
  await until('writes in flight on the source', () => workload.inFlight(x) > 0, 10_000, () => workload.describe(), 1);
  ctx.step(`standby on ${y}, ${workload.inFlight(x)} requests in flight on ${x}`);

  if (variant === 'tickets-rollback') {
    await ctx.cluster.volume(volume).detach({ host: y });
    ctx.step(`detached ${y}: rolled back before the hand-over`);
    await workload.waitAcks(rng.range(0, 200), { group: x, flush: true, timeoutMs: 30_000 });
    return { servingHost: x };
  }
  if (variant === 'tickets-confirm') {
    history.unfence(y, 'hand-over by detach from the source');
    await ctx.cluster.volume(volume).detach({ host: x });
    history.fence(x, 'handed over and confirmed');
    ctx.step(`detached ${x}: handed over and confirmed`);
    await workload.waitAcks(rng.range(0, 200), { group: y, flush: true, timeoutMs: 30_000 });
    return { servingHost: y };
  }

  history.unfence(y, 'hand-over');
  const ho = await m!.handOver();
  history.fence(x, `handed over to ${y} at epoch ${ho.epoch}`);
  ctx.step(`handed over (epoch ${ho.epoch}, pause ${ho.pauseMs.toFixed(0)} ms)`);
  if (variant === 'frozen-source') {
    // x's clients keep sending after the hand-over (their requests are refused or held).
    await until('requests in flight on the source', () => workload.inFlight(x) > 0, 10_000, () => workload.describe(), 1);
    bench.host(x).freeze();
    ctx.step(`froze ${x} with ${workload.inFlight(x)} requests in flight`);
  }
  await workload.waitAcks(rng.range(0, 300), { group: y, flush: rng.chance(0.5), timeoutMs: 30_000 });
  if (variant === 'rollback') {
    history.unfence(x, 'rollback');
    await m!.rollback();
    history.fence(y, 'rolled back');
    ctx.step(`rolled back to ${x} (${y} acknowledged ${workload.acks(y)})`);
    await workload.waitAcks(rng.range(0, 200), { group: x, flush: true, timeoutMs: 30_000 });
    return { servingHost: x };
  }
  if (variant === 'frozen-source') {
    // Confirm stops the source engine: a stop that waits on a host that no longer answers
    // is given up on (the source is fenced: the target's epoch is claimed on every replica),
    // so the confirm ends with x still frozen, and x's engine is stopped by the repair loop
    // once x answers again (its clients still sending meanwhile).
    await endOrAlreadyEnded(ctx, () => m!.confirm());
    ctx.step(`confirmed with ${x} frozen (${y} acknowledged ${workload.acks(y)})`);
    await workload.waitAcks(rng.range(0, 200), { group: y, timeoutMs: 30_000 });
    bench.host(x).thaw();
    ctx.step(`resumed ${x}`);
    return { servingHost: y };
  }
  await endOrAlreadyEnded(ctx, () => m!.confirm());
  ctx.step(`confirmed (${y} acknowledged ${workload.acks(y)})`);
  return { servingHost: y };
}

describe('fault e: migration hand-over with I/O in flight', () => {
  const bench = useFaultBench(LANES);
  it(`keeps every durable write and one writer over ${ROUNDS} randomized rounds`, async () => {
    await runRounds(bench, 'e', ROUNDS, migrationHandOver, { accessMode: 'migratable' });
  }, testTimeout(ROUNDS));
});
