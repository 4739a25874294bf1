import { describe, expect, it } from 'vitest';

import {
  failureTimings,
  hostDeadSeconds,
  hostFailSeconds,
  lockspaceSizeBytes,
  renewalIntervalSeconds,
} from '../../../src/locks/timing.js';

describe('failure timings (seed 001)', () => {
  it('gives the seed example for io_timeout 10 s', () => {
    const t = failureTimings(10);
    // "60s < T1 < 80s, 120s < T2 < 140s, 60s < T3 < 120s, 120s < T4 < 170s", T5: 140..180 s.
    expect(t.t1HoldersKilled).toEqual({ minSeconds: 60, maxSeconds: 80 });
    expect(t.t2WatchdogReset).toEqual({ minSeconds: 120, maxSeconds: 140 });
    expect(t.t3MarkedFailed).toEqual({ minSeconds: 60, maxSeconds: 120 });
    expect(t.t4Recoverable).toEqual({ minSeconds: 120, maxSeconds: 170 });
    expect(t.t5FreeTreatedDead).toEqual({ minSeconds: 140, maxSeconds: 180 });
  });

  it('keeps the seed ordering T1 < T3 < T2 < T4 (by window start) for any io_timeout and scales with it', () => {
    for (const n of [1, 2, 5, 10, 20]) {
      const t = failureTimings(n);
      expect(t.t1HoldersKilled.maxSeconds).toBeLessThanOrEqual(t.t2WatchdogReset.minSeconds);
      expect(t.t3MarkedFailed.minSeconds).toBeLessThan(t.t4Recoverable.minSeconds);
      expect(t.t1HoldersKilled.minSeconds).toBe(6 * n);
      expect(t.t4Recoverable.maxSeconds).toBe(11 * n + 60);
    }
    expect(failureTimings(1, 30).t4Recoverable).toEqual({ minSeconds: 36, maxSeconds: 41 });
  });

  it('gives sanlock host thresholds: renew every 2N, fail after 8N, dead after 8N + 60', () => {
    expect(renewalIntervalSeconds(10)).toBe(20);
    expect(hostFailSeconds(10)).toBe(80);
    expect(hostDeadSeconds(10)).toBe(140);
    expect(hostDeadSeconds(1)).toBe(68);
  });

  it('sizes a lockspace at (maxLocks + 3) MiB', () => {
    expect(lockspaceSizeBytes(1000)).toBe(1003 * 1024 * 1024);
    expect(lockspaceSizeBytes(1)).toBe(4 * 1024 * 1024);
  });

  it('refuses nonsense', () => {
    expect(() => failureTimings(0)).toThrow(RangeError);
    expect(() => failureTimings(Number.NaN)).toThrow(RangeError);
    expect(() => hostDeadSeconds(1, -1)).toThrow(RangeError);
    expect(() => lockspaceSizeBytes(0)).toThrow(RangeError);
    expect(() => lockspaceSizeBytes(1.5)).toThrow(RangeError);
  });
});
