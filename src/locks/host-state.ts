/**
 * Host states in a lockspace and the transitions a liveness watcher reports, as pure
 * functions (no daemon), so the state machine is unit-tested on its own.
 *
 * @packageDocumentation
 */

/**
 * A host's state in one lockspace, as sanlock's get_hosts reports it:
 * - `free`: its lease is released (clean leave) or was never taken;
 * - `unknown`: no renewal seen yet since this host joined (up to 8N);
 * - `live`: renewed within 8N;
 * - `fail`: no renewal for more than 8N (its own daemon is killing its lock holders);
 * - `dead`: no renewal for more than 8N + watchdog; its locks can be taken over.
 */
export type HostState = 'free' | 'unknown' | 'live' | 'fail' | 'dead';

/** sanlock's SANLK_HOST_* values (flags & 0xf) by state. */
export const SANLOCK_HOST_STATES: Readonly<Record<number, HostState>> = {
  1: 'unknown',
  2: 'free',
  3: 'live',
  4: 'fail',
  5: 'dead',
};

/** The state in sanlock host `flags`; an unexpected value reads as `unknown`. */
export function hostStateFromFlags(flags: number): HostState {
  return SANLOCK_HOST_STATES[flags & 0xf] ?? 'unknown';
}

/** One host in a lockspace. */
export interface HostStatus {
  /** Host id in the lockspace (1..2000). */
  hostId: number;
  /** Its state. */
  state: HostState;
  /** Incremented each time the host joins. */
  generation: number;
  /** Its last renewal, on its own clock (seconds; 0 when free). */
  timestamp: number;
  /** The io_timeout it renews with, seconds. */
  ioTimeoutSeconds: number;
}

/** A host changed state in a lockspace. */
export interface HostStateChange {
  /** The lockspace. */
  lockspace: string;
  /** The host. */
  hostId: number;
  /** Previous state; `undefined` the first time the host is seen. */
  from: HostState | undefined;
  /** New state. */
  to: HostState;
  /** The host's status now. */
  host: HostStatus;
}

/**
 * The changes from one get_hosts answer to the next. A host that disappears from the
 * answer (sanlock forgets hosts whose lease is free) is reported as turning `free`; a host
 * seen for the first time is reported with `from: undefined`. A new generation (the host
 * re-joined between two polls) whose state is unchanged is still reported, since the host
 * restarted in between. Ordered by host id.
 */
export function diffHosts(
  lockspace: string,
  before: ReadonlyMap<number, HostStatus>,
  after: readonly HostStatus[],
): HostStateChange[] {
  const changes: HostStateChange[] = [];
  const seen = new Set<number>();
  for (const host of [...after].sort((a, b) => a.hostId - b.hostId)) {
    seen.add(host.hostId);
    const prev = before.get(host.hostId);
    if (prev === undefined || prev.state !== host.state || (prev.generation !== host.generation && host.state === 'live'))
      changes.push({ lockspace, hostId: host.hostId, from: prev?.state, to: host.state, host });
  }
  for (const [hostId, prev] of [...before.entries()].sort((a, b) => a[0] - b[0])) {
    if (seen.has(hostId) || prev.state === 'free') continue;
    changes.push({ lockspace, hostId, from: prev.state, to: 'free', host: { ...prev, state: 'free', timestamp: 0 } });
  }
  return changes;
}
