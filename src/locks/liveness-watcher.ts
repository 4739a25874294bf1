/**
 * LivenessWatcher: Virtink's host failure detector, per lockspace. It polls the host states the local
 * daemon reports (sanlock_get_hosts) and emits one typed event per change: a host turned
 * live, fail, dead, free or unknown. A host's state is per lockspace, so a host whose
 * access to one storage failed is dead in that lockspace and still live in another; run
 * one watcher per lockspace.
 *
 * When to act (Virtink's VM HA design, N = io_timeout): `fail` arrives between 6N and 12N after the
 * failure (T3: stop scheduling VMs with locks there); `dead` between 6N + 60 s and
 * 11N + 60 s (T4: the host's locks can be taken over, rebuild its HA VMs elsewhere).
 * A host that released its lease (a clean shutdown) is reported `free` at once and `dead`
 * only 8N + 60 s after that (T5, between 8N + 60 s and 12N + 60 s after the release), as a
 * crashed host would be, unless it joins again meanwhile.
 *
 * @packageDocumentation
 */
import { EventEmitter } from 'node:events';
import type * as TE from 'typed-emitter';

import { MooringError, isMooringError } from '../errors.js';
import { safeEmit } from '../util/emit.js';
import { diffHosts, type HostState, type HostStateChange, type HostStatus } from './host-state.js';
import { hostDeadSeconds, renewalIntervalSeconds } from './timing.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** Shortest poll interval accepted. */
export const POLL_INTERVAL_MS_MIN = 100;
/** Longest poll interval accepted. */
export const POLL_INTERVAL_MS_MAX = 600_000;

/** What a watcher needs of a lockspace (a {@link Lockspace} satisfies it). */
export interface WatchedLockspace {
  /** The lockspace's name. */
  readonly name: string;
  /** Its io_timeout (the default poll interval derives from it). */
  readonly ioTimeoutSeconds: number;
  /** Every host's state as the local daemon reports it. */
  hosts(): Promise<HostStatus[]>;
  /** Reports (once) that this host lost the lockspace; see Lockspace. */
  checkLost?(): Promise<string | undefined>;
}

/** Options of a {@link LivenessWatcher}. */
export interface LivenessWatcherOptions {
  /** The lockspace to watch (this host must have joined it). */
  lockspace: WatchedLockspace;
  /**
   * Poll interval (default: the renewal interval 2 × io_timeout, as Virtink's detector;
   * states cannot change faster than renewals arrive, so polling faster only narrows the
   * detection delay).
   */
  pollIntervalMs?: number;
  /** Host ids to report; default all. */
  hostIds?: number[];
  /**
   * Seconds after a host was seen releasing its lease (turning `free`) at which it is
   * reported `dead` if it did not join again (default 8N + 60 s, as a crashed host: the
   * seed's T5); null: never, a released host stays `free`.
   */
  freeIsDeadAfterSeconds?: number | null;
}

/** Longest `freeIsDeadAfterSeconds` accepted (a day). */
export const FREE_IS_DEAD_AFTER_SECONDS_MAX = 86_400;

/** A host changed state; `atMs` is when the watcher saw it (Date.now()). */
export interface HostEvent extends HostStateChange {
  /** When the watcher saw the change, ms since the Unix epoch. */
  atMs: number;
  /**
   * On a `dead` that follows a release (from `free`, see
   * {@link LivenessWatcherOptions.freeIsDeadAfterSeconds}): when the watcher saw the host
   * release its lease, ms since the Unix epoch.
   */
  releasedAtMs?: number;
}

/** Events of a {@link LivenessWatcher}. */
export type LivenessEvents = {
  /** Any state change (also emitted as the per-state events below). */
  change: (event: HostEvent) => void;
  /** A host is renewing its lease. */
  live: (event: HostEvent) => void;
  /** A host stopped renewing more than 8N ago: its daemon is stopping its lock holders. */
  fail: (event: HostEvent) => void;
  /**
   * A host stopped renewing more than 8N + 60 s ago, or released its lease
   * `freeIsDeadAfterSeconds` ago (`from: 'free'`, with `releasedAtMs`): its locks can be taken over.
   */
  dead: (event: HostEvent) => void;
  /** A host released its lease (left cleanly) or never held it. */
  free: (event: HostEvent) => void;
  /** Just joined: no renewal of this host seen yet. */
  unknown: (event: HostEvent) => void;
  /** A poll failed (the watcher keeps polling). */
  error: (err: MooringError) => void;
};

/**
 * Polls one lockspace's host states (as the local sanlock daemon reports them) and emits
 * one event per change. A host's state is per lockspace: run one watcher per lockspace.
 * `fail` comes 6N to 12N after a host failed (N = io_timeout: stop placing locked VMs
 * there), `dead` 6N + 60 s to 11N + 60 s after (its locks can be taken over: restart its
 * HA VMs elsewhere).
 */
export class LivenessWatcher extends (EventEmitter as new () => TypedEmitter<LivenessEvents>) {
  /** The lockspace watched. */
  readonly lockspace: WatchedLockspace;
  /** How often it polls. */
  readonly pollIntervalMs: number;
  readonly #hostIds: Set<number> | undefined;
  readonly #freeIsDeadAfterMs: number | null;
  #hosts = new Map<number, HostStatus>();
  // Hosts seen releasing their lease, not yet reported dead: when, and their last status.
  readonly #released = new Map<number, { atMs: number; host: HostStatus }>();
  // Hosts reported dead after a release (sanlock still says free, or forgot them).
  readonly #deadAfterRelease = new Set<number>();
  #timer: NodeJS.Timeout | undefined;
  #running = false;
  #polling: Promise<void> | undefined;

  /**
   * A watcher of `options.lockspace` (usually from {@link Lockspace.watch}); it polls once
   * {@link LivenessWatcher.start} is called.
   *
   * @throws MooringError INVALID_ARGUMENT (pollIntervalMs out of range)
   */
  constructor(options: LivenessWatcherOptions) {
    super();
    this.lockspace = options.lockspace;
    const dflt = renewalIntervalSeconds(options.lockspace.ioTimeoutSeconds) * 1000;
    const ms = options.pollIntervalMs ?? dflt;
    if (!Number.isInteger(ms) || ms < POLL_INTERVAL_MS_MIN || ms > POLL_INTERVAL_MS_MAX)
      throw new MooringError('INVALID_ARGUMENT', `pollIntervalMs must be an integer in [${POLL_INTERVAL_MS_MIN}, ${POLL_INTERVAL_MS_MAX}]`);
    this.pollIntervalMs = ms;
    this.#hostIds = options.hostIds ? new Set(options.hostIds) : undefined;
    const free = options.freeIsDeadAfterSeconds === undefined ? hostDeadSeconds(options.lockspace.ioTimeoutSeconds) : options.freeIsDeadAfterSeconds;
    if (free !== null && (typeof free !== 'number' || !Number.isFinite(free) || free < 0 || free > FREE_IS_DEAD_AFTER_SECONDS_MAX))
      throw new MooringError('INVALID_ARGUMENT', `freeIsDeadAfterSeconds must be null or a number of seconds in [0, ${FREE_IS_DEAD_AFTER_SECONDS_MAX}]`);
    this.#freeIsDeadAfterMs = free === null ? null : free * 1000;
  }

  /** The states seen at the last poll. */
  get hosts(): ReadonlyMap<number, HostStatus> {
    return this.#hosts;
  }

  /** The state of `hostId` at the last poll (undefined if never seen); `dead` once a released host was reported dead. */
  state(hostId: number): HostState | undefined {
    if (this.#deadAfterRelease.has(hostId)) return 'dead';
    // sanlock forgets a released host; it is still free here until its T5.
    return this.#hosts.get(hostId)?.state ?? (this.#released.has(hostId) ? 'free' : undefined);
  }

  /** Starts polling (the first poll runs at once). Idempotent. */
  start(): this {
    if (this.#running) return this;
    this.#running = true;
    this.#schedule(0);
    return this;
  }

  /** Stops polling and waits for a poll in flight. Idempotent. */
  async stop(): Promise<void> {
    this.#running = false;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#polling;
  }

  /** Polls once now and emits the changes; returns them. */
  async poll(): Promise<HostEvent[]> {
    let hosts: HostStatus[];
    try {
      hosts = await this.lockspace.hosts();
    } catch (err) {
      if (isMooringError(err, 'LOCKSPACE_NOT_JOINED')) await this.lockspace.checkLost?.().catch(() => undefined);
      throw err;
    }
    if (this.#hostIds) hosts = hosts.filter((h) => this.#hostIds!.has(h.hostId));
    const atMs = Date.now();
    const changes: HostEvent[] = diffHosts(this.lockspace.name, this.#hosts, hosts).map((c) => ({ ...c, atMs }));
    const next = new Map<number, HostStatus>();
    for (const h of hosts) next.set(h.hostId, h);
    this.#hosts = next;
    for (const c of changes) this.#track(c);
    changes.push(...this.#releasedNowDead(atMs));
    for (const c of changes) {
      safeEmit(this, 'change', c);
      safeEmit(this, c.to, c);
    }
    return changes;
  }

  // A release starts the clock of the seed's T5; any other state (joined again, or seen
  // failing or dead by sanlock itself) stops it.
  #track(c: HostEvent): void {
    if (c.to === 'free' && c.from !== undefined && c.from !== 'free') {
      if (c.from === 'dead') this.#deadAfterRelease.add(c.hostId);
      else this.#released.set(c.hostId, { atMs: c.atMs, host: c.host });
    } else if (c.to !== 'free') {
      this.#released.delete(c.hostId);
      this.#deadAfterRelease.delete(c.hostId);
    }
  }

  #releasedNowDead(atMs: number): HostEvent[] {
    if (this.#freeIsDeadAfterMs === null) return [];
    const out: HostEvent[] = [];
    for (const [hostId, r] of this.#released) {
      if (atMs - r.atMs < this.#freeIsDeadAfterMs) continue;
      this.#released.delete(hostId);
      this.#deadAfterRelease.add(hostId);
      out.push({ lockspace: this.lockspace.name, hostId, from: 'free', to: 'dead', host: { ...r.host, state: 'free' }, atMs, releasedAtMs: r.atMs });
    }
    return out.sort((a, b) => a.hostId - b.hostId);
  }

  #schedule(delayMs: number): void {
    this.#timer = setTimeout(() => {
      this.#polling = this.poll()
        .then(
          () => undefined,
          (err: unknown) => {
            if (this.listenerCount('error') > 0) safeEmit(this, 'error', err);
          },
        )
        .finally(() => {
          this.#polling = undefined;
          if (this.#running) this.#schedule(this.pollIntervalMs);
        });
    }, delayMs);
    this.#timer.unref();
  }
}
