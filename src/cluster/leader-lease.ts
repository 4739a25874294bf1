/**
 * Leadership among embedders sharing one StateStore (issue 18): at most one acts at a time,
 * and a deposed one cannot write. Built on compare-and-set and guarded writes only, so it
 * works over any store that has them (etcd, Kubernetes objects, the memory store in tests).
 *
 * Two documents, kind `leader`:
 * - `cluster`: `{holder, term}`. It changes only when leadership changes hands, so its
 *   version is the leader's **fencing token**: every write the leader makes carries it as
 *   a guard (`StateWriteOptions.guard`), and fails once another instance took over.
 * - `heartbeat`: `{holder, term, beat}`, rewritten by the leader every `leaseMs / 5`,
 *   guarded by the token.
 *
 * A follower takes over when it has seen neither document change for `leaseMs` of its own
 * monotonic clock (no wall clocks are compared across hosts), by a compare-and-set of
 * `cluster` to `{self, term + 1}`. The leader stops counting itself leader when no heartbeat
 * of its own succeeded for `renewDeadlineMs` (2/3 of the lease), measured from when the last
 * successful one was *sent*: it stops before any follower can take over, since a follower's
 * lease starts when it *sees* that heartbeat, later. And were clocks to disagree, the guard
 * still refuses a deposed leader's writes.
 *
 * Over a store with watches (etcd), every instance also watches `cluster`: a leader that
 * sees another holder there stops leading at once (not at its next heartbeat), and a
 * follower that sees it freed (a leader that closed) campaigns at once (not at its next
 * round, up to `leaseMs / 5` later). Rounds stay the timing of record: a missed change
 * only costs that wait.
 *
 * @packageDocumentation
 */
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';

import { MooringError, toMooringError } from '../errors.js';
import type { StateChange, StateGuard, StateStore, StateWatch, StoredObject } from '../state/state-store.js';
import { checkName } from '../util/validate.js';

/** How long a leader that stops renewing keeps leadership, as followers count, by default. */
export const DEFAULT_LEADER_LEASE_MS = 15_000;
/** The shortest lease accepted (heartbeats every lease / 5). */
export const LEADER_LEASE_MIN_MS = 500;
const KIND = 'leader';
const LEADER_KEY = 'cluster';
const HEARTBEAT_KEY = 'heartbeat';

/** Leadership among embedders sharing a store (`MooringOptions.leadership`, docs/leadership.md). */
export interface LeaderLeaseOptions {
  /** This instance's name among the embedders sharing the store (e.g. its host name); unique. */
  id: string;
  /** See {@link DEFAULT_LEADER_LEASE_MS}. */
  leaseMs?: number;
}

/** Who leads the cluster, as this embedder last saw it (`Mooring.leadership`). */
export interface LeaderStatus {
  /** Whether this instance leads now (its last heartbeat is younger than the renew deadline). */
  isLeader: boolean;
  /** The holder of the leadership document, or null if none was ever written. */
  holder: string | null;
  /** Its term: increases by 1 at every change of hands. */
  term: number;
}

interface LeaderDoc {
  holder: string;
  term: number;
}
interface HeartbeatDoc extends LeaderDoc {
  beat: number;
}

/** Events of {@link LeaderLease}. */
export interface LeaderLeaseEvents {
  /** This instance became leader. */
  elected: [term: number];
  /** This instance stopped leading: another took over, or its heartbeats failed too long. */
  deposed: [reason: MooringError];
}

/** Where the lease reads time (tests inject one). */
export interface LeaseClock {
  /** Monotonic ms. */
  now(): number;
}

/** See the module comment. */
export class LeaderLease extends EventEmitter<LeaderLeaseEvents> {
  readonly id: string;
  readonly leaseMs: number;
  readonly #store: StateStore;
  readonly #clock: LeaseClock;
  #timer: NodeJS.Timeout | null = null;
  #running: Promise<void> | null = null;
  #closed = false;
  #started = false;
  #watch: StateWatch | null = null;
  // As leader: the token, and the last good heartbeat and when it was sent.
  #token: StateGuard | null = null;
  #beat = { n: 0, sentAt: 0 };
  // As follower: the versions last seen, and since when (own clock).
  #seen = { leader: -1, heartbeat: -1, since: 0 };
  #last: LeaderDoc | null = null;

  constructor(store: StateStore, options: LeaderLeaseOptions, clock: LeaseClock = { now: () => performance.now() }) {
    super();
    this.id = checkName('leader id', options.id);
    const leaseMs = options.leaseMs ?? DEFAULT_LEADER_LEASE_MS;
    if (!Number.isSafeInteger(leaseMs) || leaseMs < LEADER_LEASE_MIN_MS) {
      throw new MooringError('INVALID_ARGUMENT', `leaseMs must be an integer of at least ${LEADER_LEASE_MIN_MS} (got ${String(leaseMs)})`);
    }
    this.leaseMs = leaseMs;
    this.#store = store;
    this.#clock = clock;
  }

  /** How long the leader goes on without a successful heartbeat before it stops leading. */
  get renewDeadlineMs(): number {
    return Math.floor((this.leaseMs * 2) / 3);
  }

  /**
   * Starts campaigning: a first round at once (the promise resolves after it: this
   * instance leads if nobody did, or knows who does), then one every lease / 5.
   */
  async start(): Promise<void> {
    if (this.#closed || this.#timer || this.#running || this.#started) return;
    this.#started = true;
    // A store that cannot watch, or a watch that fails to start, leaves the rounds alone to do it.
    this.#watch = (await this.#store.watch?.<LeaderDoc>(KIND, (c) => this.#changed(c), { prefix: LEADER_KEY }).catch(() => null)) ?? null;
    if (this.#closed) await this.#watch?.close();
    this.#running = this.#round().catch(() => undefined);
    await this.#running;
    this.#running = null;
    if (!this.#closed) this.#schedule(Math.max(1, Math.floor(this.leaseMs / 5)));
  }

  /** Who leads, as last seen. */
  get status(): LeaderStatus {
    return { isLeader: this.isLeader, holder: this.#last?.holder ?? null, term: this.#last?.term ?? 0 };
  }

  /** Whether this instance leads now. */
  get isLeader(): boolean {
    return this.#token !== null && this.#clock.now() - this.#beat.sentAt < this.renewDeadlineMs;
  }

  /**
   * The guard every write of the leader carries (the leadership document at the version
   * this instance wrote), or null when it does not lead.
   */
  get guard(): StateGuard | null {
    return this.isLeader ? this.#token : null;
  }

  /** Stops campaigning; a leader hands leadership over at once (the next follower need not wait the lease). Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#watch?.close();
    await this.#running;
    const token = this.#token;
    if (!token) return;
    this.#depose(new MooringError('CLOSED', `${this.id} closed`));
    // An empty holder: free for the taking. Fails harmlessly if another took over already.
    await this.#store.put<LeaderDoc>(KIND, LEADER_KEY, { holder: '', term: this.#last?.term ?? 0 }, { expectedVersion: token.version }).catch(() => undefined);
  }

  // A change of `cluster` seen by the watch (see the module comment).
  #changed(c: StateChange<LeaderDoc>): void {
    if (this.#closed || (c.type !== 'resync' && c.key !== LEADER_KEY)) return;
    if (c.type === 'put' && this.#token && c.version > this.#token.version) {
      this.#depose(new MooringError('CONFLICT', `${this.id} was deposed: ${c.value.holder || 'nobody'} holds the leadership now (term ${c.value.term})`));
    }
    if (!this.#token && (c.type !== 'put' || c.value.holder === '')) this.#roundNow();
  }

  // Runs a round now instead of at the scheduled time (unless one runs already).
  #roundNow(): void {
    if (!this.#timer || this.#running) return;
    clearTimeout(this.#timer);
    this.#schedule(0);
  }

  #schedule(delayMs: number): void {
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#running = this.#round()
        .catch(() => undefined)
        .finally(() => {
          this.#running = null;
          if (!this.#closed) this.#schedule(Math.max(1, Math.floor(this.leaseMs / 5)));
        });
    }, delayMs);
    this.#timer.unref();
  }

  async #round(): Promise<void> {
    if (this.#token) await this.#renew();
    else await this.#campaign();
  }

  async #renew(): Promise<void> {
    const token = this.#token!;
    const sentAt = this.#clock.now();
    try {
      // The guard alone decides: a heartbeat of the previous holder that landed before the takeover does not matter.
      await this.#store.put<HeartbeatDoc>(KIND, HEARTBEAT_KEY, { holder: this.id, term: this.#last!.term, beat: this.#beat.n + 1 }, { guard: token });
      this.#beat = { n: this.#beat.n + 1, sentAt };
    } catch (err) {
      const e = toMooringError(err, 'renewing leadership');
      if (e.code === 'CONFLICT') this.#depose(new MooringError('CONFLICT', `${this.id} was deposed: ${e.message}`, { cause: e }));
      else if (!this.isLeader) this.#depose(new MooringError('UNAVAILABLE', `${this.id} could not renew its leadership for ${this.renewDeadlineMs} ms: ${e.message}`, { cause: e }));
    }
  }

  #depose(reason: MooringError): void {
    if (!this.#token) return;
    this.#token = null;
    this.#seen = { leader: -1, heartbeat: -1, since: 0 };
    this.emit('deposed', reason);
  }

  async #campaign(): Promise<void> {
    const [leader, hb] = await Promise.all([this.#store.get<LeaderDoc>(KIND, LEADER_KEY), this.#store.get<HeartbeatDoc>(KIND, HEARTBEAT_KEY)]);
    this.#last = leader ? { holder: leader.value.holder, term: leader.value.term } : null;
    const now = this.#clock.now();
    const lv = leader?.version ?? 0;
    const hv = hb?.version ?? 0;
    if (lv !== this.#seen.leader || hv !== this.#seen.heartbeat) {
      const first = this.#seen.leader === -1;
      this.#seen = { leader: lv, heartbeat: hv, since: now };
      // A holder seen for the first time gets a whole lease, unless there is none.
      if (first && leader && leader.value.holder !== '') return;
    }
    const free = !leader || leader.value.holder === '';
    if (!free && now - this.#seen.since < this.leaseMs) return;
    await this.#takeOver(leader, hb);
  }

  async #takeOver(leader: StoredObject<LeaderDoc> | null, hb: StoredObject<HeartbeatDoc> | null): Promise<void> {
    const term = (leader?.value.term ?? 0) + 1;
    const sentAt = this.#clock.now();
    let won: StoredObject<LeaderDoc>;
    try {
      won = await this.#store.put<LeaderDoc>(KIND, LEADER_KEY, { holder: this.id, term }, { expectedVersion: leader?.version ?? 0 });
    } catch (err) {
      if (toMooringError(err).code === 'CONFLICT') return; // another won: follow it
      throw err;
    }
    this.#token = { kind: KIND, key: LEADER_KEY, version: won.version };
    this.#last = { holder: this.id, term };
    this.#beat = { n: hb?.value.beat ?? 0, sentAt };
    this.emit('elected', term);
    await this.#renew();
  }
}
