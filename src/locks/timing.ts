/**
 * Failure-recovery timings of VM HA with sanlock (Virtink's design), as pure functions of
 * a lockspace's io_timeout N and the watchdog fire timeout W (60 s). Times are seconds
 * after the failure happens; each is an open interval (min, max).
 *
 * Where they come from (sanlock 3.8): a host renews its delta lease every 2N, so a failure
 * lands 0..2N after the last good renewal. Its own daemon starts recovery (killing lock
 * holders) 8N after that renewal: T1. The watchdog resets the host W later if the holders
 * did not exit: T2. Other hosts see it FAIL 8N and DEAD 8N + W after its last renewal, and
 * a watcher polling every 2N notices up to 2N later: T3 (marked failed) and T4 (its VMs may
 * be rebuilt elsewhere). A host that left cleanly leaves a FREE lease; a watcher that treats
 * FREE as dead only after 8N + W from noticing it gives T5.
 *
 * @packageDocumentation
 */

/** sanlock's default watchdog fire timeout, seconds (60 s, as Virtink assumes). */
export const WATCHDOG_FIRE_TIMEOUT_SECONDS = 60;

/** An open interval of seconds after a failure. */
export interface TimingWindow {
  /** Lower bound (exclusive), seconds. */
  minSeconds: number;
  /** Upper bound (exclusive), seconds. */
  maxSeconds: number;
}

/**
 * When recovery steps happen after a failure, for one lockspace (T1..T5 of Virtink's VM HA
 * design): windows of seconds after the failure, derived from io_timeout N and the
 * watchdog fire timeout W.
 */
export interface FailureTimings {
  /** Storage failure on a host: its daemon starts killing the lock holders (6N, 8N). */
  t1HoldersKilled: TimingWindow;
  /** Storage failure: the watchdog resets the host if holders were not cleaned up (6N+W, 8N+W). */
  t2WatchdogReset: TimingWindow;
  /** Other hosts mark the host failed in this lockspace (6N, 12N). */
  t3MarkedFailed: TimingWindow;
  /** Other hosts see it dead and may rebuild its VMs (6N+W, 11N+W). */
  t4Recoverable: TimingWindow;
  /** Clean shutdown (lease FREE): treated as dead (8N+W, 12N+W). */
  t5FreeTreatedDead: TimingWindow;
}

function check(ioTimeoutSeconds: number, watchdogSeconds: number): void {
  if (!Number.isFinite(ioTimeoutSeconds) || ioTimeoutSeconds <= 0) throw new RangeError('ioTimeoutSeconds must be > 0');
  if (!Number.isFinite(watchdogSeconds) || watchdogSeconds < 0) throw new RangeError('watchdogSeconds must be >= 0');
}

/**
 * T1..T5 for io_timeout N and watchdog fire timeout W.
 *
 * @param ioTimeoutSeconds - the lockspace's io_timeout N
 * @param watchdogSeconds - the watchdog fire timeout W (default 60)
 */
export function failureTimings(
  ioTimeoutSeconds: number,
  watchdogSeconds: number = WATCHDOG_FIRE_TIMEOUT_SECONDS,
): FailureTimings {
  check(ioTimeoutSeconds, watchdogSeconds);
  const n = ioTimeoutSeconds;
  const w = watchdogSeconds;
  return {
    t1HoldersKilled: { minSeconds: 6 * n, maxSeconds: 8 * n },
    t2WatchdogReset: { minSeconds: 6 * n + w, maxSeconds: 8 * n + w },
    t3MarkedFailed: { minSeconds: 6 * n, maxSeconds: 12 * n },
    t4Recoverable: { minSeconds: 6 * n + w, maxSeconds: 11 * n + w },
    t5FreeTreatedDead: { minSeconds: 8 * n + w, maxSeconds: 12 * n + w },
  };
}

/** Seconds between delta-lease renewals (2N). */
export function renewalIntervalSeconds(ioTimeoutSeconds: number): number {
  check(ioTimeoutSeconds, 0);
  return 2 * ioTimeoutSeconds;
}

/** Seconds after its last renewal at which other hosts see a host FAIL (8N). */
export function hostFailSeconds(ioTimeoutSeconds: number): number {
  check(ioTimeoutSeconds, 0);
  return 8 * ioTimeoutSeconds;
}

/** Seconds after its last renewal at which other hosts see a host DEAD (8N + W). */
export function hostDeadSeconds(ioTimeoutSeconds: number, watchdogSeconds: number = WATCHDOG_FIRE_TIMEOUT_SECONDS): number {
  check(ioTimeoutSeconds, watchdogSeconds);
  return 8 * ioTimeoutSeconds + watchdogSeconds;
}

/**
 * Size in bytes of a lockspace for `maxLocks` locks, as Virtink sizes its volume:
 * (n + 3) MiB = 1 MiB of host (delta) leases, 2 MiB of resource index, 1 MiB per lock.
 */
export function lockspaceSizeBytes(maxLocks: number): number {
  if (!Number.isInteger(maxLocks) || maxLocks < 1) throw new RangeError('maxLocks must be an integer >= 1');
  return (maxLocks + 3) * 1024 * 1024;
}
