// When the control plane repairs (src/cluster/repair-loop.ts): the next full pass waits
// max(interval, PASS_DURATION_FACTOR × the last pass's busy time); event-driven repairs are
// coalesced per volume and cancelled by close. Timers are vitest's fake ones and pass
// durations come from an injected clock, so nothing here depends on the machine's speed.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { EVENT_REPAIR_DELAY_MS, EVENT_REPAIR_PENDING_MAX, HOST_RECHECK_INTERVAL_MS, PASS_DURATION_FACTOR, RepairLoop, nextPassDelayMs, type RepairPassEvent } from '../../../src/cluster/repair-loop.js';

// `passMs`: how long each pass takes, of which `busyMs` busy (the rest waiting for hosts).
function loop(intervalMs: number, passMs: () => number = () => 0, busyMs: () => number = passMs) {
  let clock = 0;
  let busy = 0;
  const repaired: string[] = [];
  const passes: RepairPassEvent[] = [];
  const failures: string[] = [];
  let batches = 0;
  let ticks = 0;
  let release: (() => void) | null = null;
  const l = new RepairLoop(
    intervalMs,
    {
      pass: async () => {
        clock += passMs();
        busy += busyMs();
      },
      tick: async () => {
        ticks++;
      },
      repairVolume: async (v) => {
        repaired.push(v);
        if (v === 'slow') await new Promise<void>((r) => (release = r));
        if (v === 'bad') throw new Error('boom');
      },
      batch: async (fn) => {
        batches++;
        await fn();
      },
      failed: (_err, what) => failures.push(what),
      passed: (e) => passes.push(e),
    },
    { now: () => clock, busyMs: () => busy },
  );
  return { l, repaired, passes, failures, batches: () => batches, ticks: () => ticks, release: () => release?.() };
}

describe('the next full pass', () => {
  it('waits max(interval, k × the last pass duration)', () => {
    expect(PASS_DURATION_FACTOR).toBeGreaterThanOrEqual(2);
    expect(nextPassDelayMs(2000, 0)).toBe(2000);
    expect(nextPassDelayMs(2000, 100)).toBe(2000); // k × 100 ms is under the interval
    expect(nextPassDelayMs(2000, 1000)).toBe(PASS_DURATION_FACTOR * 1000);
    expect(nextPassDelayMs(2000, 60_000)).toBe(PASS_DURATION_FACTOR * 60_000);
    expect(nextPassDelayMs(2000, 1e12)).toBe(2 ** 31 - 1); // setTimeout's bound
  });
});

describe('RepairLoop', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('schedules the next pass after k × a long pass, and after the interval after a short one', async () => {
    let duration = 1000;
    const t = loop(100, () => duration);
    t.l.start(0);
    await vi.advanceTimersByTimeAsync(0);
    expect(t.passes).toEqual([{ durationMs: 1000, busyMs: 1000, nextDelayMs: PASS_DURATION_FACTOR * 1000 }]);
    expect(t.l.status).toMatchObject({ running: true, passes: 1, lastPassDurationMs: 1000, lastPassBusyMs: 1000, nextPassDelayMs: PASS_DURATION_FACTOR * 1000 });
    duration = 5; // k × 5 ms is under the 100 ms interval
    await vi.advanceTimersByTimeAsync(PASS_DURATION_FACTOR * 1000 - 1);
    expect(t.passes).toHaveLength(1); // not back to back
    await vi.advanceTimersByTimeAsync(1);
    expect(t.passes).toHaveLength(2);
    expect(t.passes[1]).toEqual({ durationMs: 5, busyMs: 5, nextDelayMs: 100 });
    await vi.advanceTimersByTimeAsync(100);
    expect(t.passes).toHaveLength(3);
    await t.l.close();
  });

  it('ticks every interval while a long pass postponed the next one, and not after close', async () => {
    const t = loop(100, () => 10_000);
    t.l.start(0);
    await vi.advanceTimersByTimeAsync(0);
    expect(t.passes).toHaveLength(1); // the next pass is 40 s away
    await vi.advanceTimersByTimeAsync(1000);
    expect(t.passes).toHaveLength(1);
    expect(t.ticks()).toBe(10);
    await t.l.close();
    await vi.advanceTimersByTimeAsync(1000);
    expect(t.ticks()).toBe(10);
  });

  it('ticks at least every HOST_RECHECK_INTERVAL_MS with a long interval', async () => {
    const t = loop(3_600_000);
    t.l.start(0);
    await vi.advanceTimersByTimeAsync(3 * HOST_RECHECK_INTERVAL_MS);
    expect(t.ticks()).toBe(3);
    expect(t.passes).toHaveLength(1);
    await t.l.close();
  });

  it('does not postpone the next pass for a pass that mostly waited for hosts', async () => {
    const t = loop(100, () => 9000, () => 50);
    t.l.start(0);
    await vi.advanceTimersByTimeAsync(0);
    expect(t.passes).toEqual([{ durationMs: 9000, busyMs: 50, nextDelayMs: PASS_DURATION_FACTOR * 50 }]);
    await vi.advanceTimersByTimeAsync(PASS_DURATION_FACTOR * 50);
    expect(t.passes).toHaveLength(2);
    await t.l.close();
  });

  it('is off with interval 0: no pass, and requests are ignored', async () => {
    const t = loop(0);
    t.l.start(0);
    t.l.request('x');
    await vi.advanceTimersByTimeAsync(10 * EVENT_REPAIR_DELAY_MS);
    expect(t.passes).toHaveLength(0);
    expect(t.repaired).toEqual([]);
    expect(t.l.status.running).toBe(false);
  });

  it('repairs only the volumes asked for, once each however many requests came, in one batch', async () => {
    const t = loop(3_600_000);
    t.l.start(3_600_000);
    for (let i = 0; i < 50; i++) t.l.request('x');
    t.l.request('y');
    t.l.request('x');
    expect(t.l.status.pendingEventRepairs).toBe(2);
    await vi.advanceTimersByTimeAsync(EVENT_REPAIR_DELAY_MS - 1);
    expect(t.repaired).toEqual([]); // debounced
    await vi.advanceTimersByTimeAsync(1);
    expect(t.repaired).toEqual(['x', 'y']);
    expect(t.batches()).toBe(1);
    expect(t.l.status).toMatchObject({ eventRepairs: 2, pendingEventRepairs: 0, passes: 0 });
    await t.l.close();
  });

  it('repairs a volume again when asked during its repair; a failure is reported and the rest go on', async () => {
    const t = loop(3_600_000);
    t.l.start(3_600_000);
    t.l.request('slow');
    t.l.request('bad');
    await vi.advanceTimersByTimeAsync(EVENT_REPAIR_DELAY_MS);
    expect(t.repaired).toEqual(['slow']);
    t.l.request('slow'); // arrived while it was being repaired: may post-date what it saw
    t.l.request('z');
    t.release();
    await vi.advanceTimersByTimeAsync(0);
    await vi.waitFor(() => expect(t.repaired).toEqual(['slow', 'bad', 'slow'])); // in the order asked
    t.release();
    await vi.waitFor(() => expect(t.repaired).toEqual(['slow', 'bad', 'slow', 'z']));
    expect(t.failures).toEqual(['repairing bad']);
    await t.l.close();
  });

  it('drops requests beyond the pending bound (the full pass covers them)', async () => {
    const t = loop(3_600_000);
    t.l.start(3_600_000);
    for (let i = 0; i <= EVENT_REPAIR_PENDING_MAX; i++) t.l.request(`v${i}`);
    expect(t.l.status).toMatchObject({ pendingEventRepairs: EVENT_REPAIR_PENDING_MAX, droppedEventRepairs: 1 });
    await t.l.close();
    expect(t.l.status.pendingEventRepairs).toBe(0);
  });

  it('close cancels pending repairs and the next pass, and waits for the repair running', async () => {
    const t = loop(100);
    t.l.start(0);
    await vi.advanceTimersByTimeAsync(0);
    expect(t.passes).toHaveLength(1);
    t.l.request('x');
    await t.l.close();
    await vi.advanceTimersByTimeAsync(10_000);
    expect(t.repaired).toEqual([]);
    expect(t.passes).toHaveLength(1);
    expect(t.l.status.running).toBe(false);

    const u = loop(3_600_000);
    u.l.start(3_600_000);
    u.l.request('slow');
    u.l.request('y');
    await vi.advanceTimersByTimeAsync(EVENT_REPAIR_DELAY_MS);
    let closed = false;
    const closing = u.l.close().then(() => (closed = true));
    await vi.advanceTimersByTimeAsync(0);
    expect(closed).toBe(false); // 'slow' still runs
    u.release();
    await closing;
    expect(u.repaired).toEqual(['slow']); // 'y' was cancelled
    u.l.request('z');
    await vi.advanceTimersByTimeAsync(10 * EVENT_REPAIR_DELAY_MS);
    expect(u.repaired).toEqual(['slow']);
  });
});
