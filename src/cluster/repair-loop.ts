/**
 * When the control plane repairs (issue 21): a periodic full pass, the safety net, whose
 * interval grows with its duration, and repairs of one volume at a time driven by what the
 * data engines report (a replica turned ERR, a rebuild failed, the RW set changed), by a
 * host offered again, or by a host that answers again after it did not (checked every
 * interval: a healed partition raises no event). Work per event is one volume's repair, not a pass over all of them.
 * What is repaired and how stays in the controllers; this only decides when.
 *
 * @packageDocumentation
 */
import { performance } from 'node:perf_hooks';

/**
 * The next full pass starts this many times the last pass's cost after it ended (or after
 * the configured interval, if that is longer): the loop then keeps the JS thread busy at
 * most 1 / (1 + 19) = 5 % of the time with passes, however many volumes there are (issue
 * 21's idle target), while the safety net still comes round within twenty pass durations
 * (a few seconds at a thousand volumes). Events repair in between. The
 * cost is the time the event loop was busy during the pass, not its wall-clock duration:
 * a pass that waits for a host that does not answer costs nothing and must not postpone
 * the next one (a takeover's leftovers are cleaned up by the next pass).
 */
export const PASS_DURATION_FACTOR = 19;
/**
 * How long a repair asked for by an event waits before it runs: the events of one failure
 * (a replica-error, then the replica-set change it causes, on every engine that used the
 * replica's host) arrive together and make one repair per volume.
 */
export const EVENT_REPAIR_DELAY_MS = 100;
/** Most volumes waiting for an event-driven repair; beyond it, requests are dropped (the next full pass covers them). */
export const EVENT_REPAIR_PENDING_MAX = 10_000;
/**
 * Hosts that did not answer are asked again at least this often (more often with a shorter
 * repair interval), however far away the next full pass is: one that answers again has its
 * volumes repaired without waiting for it.
 */
export const HOST_RECHECK_INTERVAL_MS = 2000;
/** setTimeout's largest delay (about 24.8 days). */
const TIMER_DELAY_MAX_MS = 2 ** 31 - 1;

/** The delay before the next full pass: max(interval, {@link PASS_DURATION_FACTOR} × the last pass's busy time). */
export function nextPassDelayMs(intervalMs: number, lastPassBusyMs: number): number {
  return Math.min(TIMER_DELAY_MAX_MS, Math.max(intervalMs, Math.ceil(PASS_DURATION_FACTOR * Math.max(0, lastPassBusyMs))));
}

/** Where the loop reads time (tests inject durations through it). */
export interface RepairLoopClock {
  /** A monotonic clock, in ms. */
  now(): number;
  /** How long the event loop has been busy so far, in ms (monotonic). */
  busyMs(): number;
}

const REAL_CLOCK: RepairLoopClock = {
  now: () => performance.now(),
  busyMs: () => performance.eventLoopUtilization().active,
};

/** What the repair loop did so far (`Mooring.repairLoop`). */
export interface RepairLoopStatus {
  /** Whether the loop runs (`repairIntervalMs` > 0 and not closed). */
  running: boolean;
  /** Full passes the loop ran. */
  passes: number;
  /** Duration of the last full pass of the loop, or null before the first ended. */
  lastPassDurationMs: number | null;
  /** How long the event loop was busy during it (what the next delay follows), or null. */
  lastPassBusyMs: number | null;
  /** Delay until the next full pass, as scheduled when the last one ended (null before). */
  nextPassDelayMs: number | null;
  /** Repairs of one volume run because of an event (after coalescing). */
  eventRepairs: number;
  /** Volumes waiting for an event-driven repair now. */
  pendingEventRepairs: number;
  /** Requests dropped because {@link EVENT_REPAIR_PENDING_MAX} volumes were waiting already. */
  droppedEventRepairs: number;
}

/** A full pass of the loop ended (the `repair-pass` event of a Mooring). */
export interface RepairPassEvent {
  /** How long it took. */
  durationMs: number;
  /** How long the event loop was busy meanwhile (waits for hosts do not count). */
  busyMs: number;
  /** When the next one starts, from now: max(repairIntervalMs, {@link PASS_DURATION_FACTOR} × busyMs). */
  nextDelayMs: number;
}

/** What the loop runs. */
export interface RepairLoopActions {
  /** One full pass. */
  pass(): Promise<void>;
  /**
   * Cheap checks run every interval (at most {@link HOST_RECHECK_INTERVAL_MS}), whatever the delay of the next full pass (hosts that
   * stopped answering are asked again; one that answers gets its volumes' repairs asked for).
   */
  tick(): Promise<void>;
  /** One volume's repair (in its turn). */
  repairVolume(volume: string): Promise<void>;
  /** Runs a batch of event-driven repairs (so a dead host is probed once per batch). */
  batch(fn: () => Promise<void>): Promise<void>;
  /** A pass or a repair failed (the loop goes on). */
  failed(err: unknown, what: string): void;
  /** A full pass ended. */
  passed(event: RepairPassEvent): void;
}

/** See the module comment. */
export class RepairLoop {
  readonly #intervalMs: number;
  readonly #act: RepairLoopActions;
  readonly #clock: RepairLoopClock;
  #started = false;
  #closed = false;
  #passTimer: NodeJS.Timeout | null = null;
  #tickTimer: NodeJS.Timeout | null = null;
  #ticking: Promise<void> | null = null;
  #passing: Promise<void> | null = null;
  #eventTimer: NodeJS.Timeout | null = null;
  #draining: Promise<void> | null = null;
  // Insertion-ordered and keyed by volume: many events for one volume make one entry.
  readonly #pending = new Set<string>();
  readonly #status = { passes: 0, lastPassDurationMs: null as number | null, lastPassBusyMs: null as number | null, nextPassDelayMs: null as number | null, eventRepairs: 0, droppedEventRepairs: 0 };

  constructor(intervalMs: number, actions: RepairLoopActions, clock: RepairLoopClock = REAL_CLOCK) {
    this.#intervalMs = intervalMs;
    this.#act = actions;
    this.#clock = clock;
  }

  /** Starts the loop: the first pass after `firstDelayMs`. Does nothing when the interval is 0 (the loop is off). */
  start(firstDelayMs = 0): void {
    if (this.#intervalMs <= 0 || this.#closed || this.#started) return;
    this.#started = true;
    this.#schedulePass(firstDelayMs);
    this.#scheduleTick();
  }

  #scheduleTick(): void {
    this.#tickTimer = setTimeout(() => {
      this.#tickTimer = null;
      this.#ticking = this.#act
        .tick()
        .catch((err: unknown) => this.#act.failed(err, 'checking hosts that did not answer'))
        .finally(() => {
          this.#ticking = null;
          if (!this.#closed) this.#scheduleTick();
        });
    }, Math.min(this.#intervalMs, HOST_RECHECK_INTERVAL_MS));
    this.#tickTimer.unref();
  }

  /** What the loop did so far (a copy). */
  get status(): RepairLoopStatus {
    return { running: this.#started && !this.#closed, ...this.#status, pendingEventRepairs: this.#pending.size };
  }

  /** Asks for a repair of `volume` soon (coalesced with other requests for it). No-op while the loop does not run. */
  request(volume: string): void {
    if (!this.#started || this.#closed || this.#pending.has(volume)) return;
    if (this.#pending.size >= EVENT_REPAIR_PENDING_MAX) {
      this.#status.droppedEventRepairs++;
      return;
    }
    this.#pending.add(volume);
    // A running drain takes it in its turn; otherwise the first request of a burst arms the timer.
    this.#arm();
  }

  #arm(): void {
    if (this.#draining || this.#eventTimer || this.#closed || this.#pending.size === 0) return;
    this.#eventTimer = setTimeout(() => {
      this.#eventTimer = null;
      this.#draining = this.#drain().finally(() => {
        this.#draining = null;
        this.#arm(); // anything asked for after the drain's last look
      });
    }, EVENT_REPAIR_DELAY_MS);
    this.#eventTimer.unref();
  }

  /** Stops: cancels the pending repairs and the next pass, and waits for what runs now. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#pending.clear();
    for (const t of [this.#passTimer, this.#eventTimer, this.#tickTimer]) if (t) clearTimeout(t);
    this.#passTimer = this.#eventTimer = this.#tickTimer = null;
    await Promise.all([this.#passing, this.#draining, this.#ticking]);
  }

  async #drain(): Promise<void> {
    await this.#act
      .batch(async () => {
        for (let v = this.#first(); v !== null && !this.#closed; v = this.#first()) {
          this.#pending.delete(v);
          this.#status.eventRepairs++;
          await this.#act.repairVolume(v).catch((err: unknown) => this.#act.failed(err, `repairing ${v}`));
        }
      })
      .catch((err: unknown) => this.#act.failed(err, 'event-driven repairs'));
  }

  #first(): string | null {
    for (const v of this.#pending) return v;
    return null;
  }

  #schedulePass(delayMs: number): void {
    this.#passTimer = setTimeout(() => {
      this.#passTimer = null;
      this.#passing = this.#runPass().finally(() => {
        this.#passing = null;
      });
    }, delayMs);
    this.#passTimer.unref();
  }

  async #runPass(): Promise<void> {
    const started = this.#clock.now();
    const busyBefore = this.#clock.busyMs();
    await this.#act.pass().catch((err: unknown) => this.#act.failed(err, 'repair loop'));
    if (this.#closed) return;
    const durationMs = Math.max(0, this.#clock.now() - started);
    // Busy time counts what else ran on the JS thread meanwhile too: it errs on the long side.
    const busyMs = Math.min(durationMs, Math.max(0, this.#clock.busyMs() - busyBefore));
    const nextDelayMs = nextPassDelayMs(this.#intervalMs, busyMs);
    Object.assign(this.#status, { passes: this.#status.passes + 1, lastPassDurationMs: durationMs, lastPassBusyMs: busyMs, nextPassDelayMs: nextDelayMs });
    this.#schedulePass(nextDelayMs);
    this.#act.passed({ durationMs, busyMs, nextDelayMs });
  }
}
