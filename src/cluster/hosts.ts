/**
 * The data engines a control plane is offered, and how it asks them whether they answer:
 * every decision about a host goes through {@link Hosts.probe} or {@link Hosts.reachable},
 * each bounded by {@link HOST_PROBE_TIMEOUT_MS}.
 *
 * @packageDocumentation
 */
import { AsyncLocalStorage } from 'node:async_hooks';

import type { DataEngine, DataEngineEvent, DataEngineInfo, EngineInfo } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import { sleep, withTimeout } from '../util/async.js';

/** How long a call to a data engine may take before its host counts as unreachable for a decision. */
export const HOST_PROBE_TIMEOUT_MS = 3000;

/**
 * While a data engine stops an engine (drains its NBD clients, flushes: this may take
 * long), how often the control plane checks that the host still answers.
 */
export const STOP_LIVENESS_INTERVAL_MS = 1000;

/** A volume's engine on a host: its info, or whether it is stopped or the host unreachable. */
export type EngineProbe = EngineInfo | 'stopped' | 'unreachable';

// What one pass learned about the hosts: those found down, and the volumes each runs an
// engine of (one listEngines() per host per pass, read at the first ask).
interface PassContext {
  down: Set<string>;
  engines: Map<string, Promise<Map<string, EngineInfo> | null>>;
  ended: boolean;
  /** A full pass: {@link Hosts.listedEngine} answers from the listing. */
  full: boolean;
}

/** The offered data engines by host id, each watched for events while offered. */
export class Hosts {
  readonly #hosts = new Map<string, { engine: DataEngine; unwatch: () => void }>();
  // Hosts found unreachable during the pass the caller runs in (none outside a pass). Each
  // pass has its own: a full pass and a batch of event-driven repairs may overlap, and a
  // host that comes back must be probed again by the next one, however they overlap.
  // Work a pass started that outlives it (a background task) inherits the context: `ended`
  // makes it probe again like any call outside a pass.
  readonly #pass = new AsyncLocalStorage<PassContext>();
  // Hosts that did not answer a probe, until {@link answeringAgain} finds them back: a host
  // that returns without restarting (a partition healed, a freeze ended) raises no event.
  readonly #unanswered = new Set<string>();
  // The passes running now: a host that answers again is forgotten as down by each.
  readonly #live = new Set<PassContext>();

  constructor(private readonly onEvent: (hostId: string, event: DataEngineEvent) => void) {}

  /** Host ids offered. */
  get ids(): string[] {
    return [...this.#hosts.keys()];
  }

  /** Every offered host with its data engine. */
  entries(): [string, DataEngine][] {
    return [...this.#hosts].map(([id, h]) => [id, h.engine]);
  }

  has(hostId: string): boolean {
    return this.#hosts.has(hostId);
  }

  /** The data engine of a host, or null if it is not offered. */
  get(hostId: string): DataEngine | null {
    return this.#hosts.get(hostId)?.engine ?? null;
  }

  /**
   * The data engine of a host.
   *
   * @throws MooringError NOT_FOUND (not a host of this control plane)
   */
  engineOf(hostId: string): DataEngine {
    const h = this.#hosts.get(hostId);
    if (!h) throw new MooringError('NOT_FOUND', `host ${hostId} is not a host of this cluster (known: ${this.ids.join(', ') || 'none'})`);
    return h.engine;
  }

  /** Offers a data engine under its host id (a new handle for the same host replaces the old one). */
  set(hostId: string, engine: DataEngine): void {
    const old = this.#hosts.get(hostId);
    if (old?.engine === engine) return;
    old?.unwatch();
    const unwatch = engine.watch((e) => this.onEvent(hostId, e));
    this.#hosts.set(hostId, { engine, unwatch });
  }

  /** Withdraws a host (no error if it was not offered). */
  delete(hostId: string): void {
    this.#hosts.get(hostId)?.unwatch();
    this.#hosts.delete(hostId);
  }

  /** Withdraws every host. */
  clear(): void {
    for (const h of this.#hosts.values()) h.unwatch();
    this.#hosts.clear();
  }

  /**
   * Runs one pass of the control loop. A host that does not answer once during the pass
   * counts as unreachable for the rest of it: a pass over a thousand volumes of a dead host
   * waits for one probe timeout, not a thousand. Also runs a batch of event-driven repairs.
   */
  duringPass<T>(pass: () => Promise<T>, opts: { full?: boolean } = {}): Promise<T> {
    const ctx: PassContext = { down: new Set(), engines: new Map(), ended: false, full: opts.full ?? false };
    this.#live.add(ctx);
    return this.#pass.run(ctx, async () => {
      try {
        return await pass();
      } finally {
        ctx.ended = true;
        this.#live.delete(ctx);
      }
    });
  }

  // What the caller's pass found down (null outside a pass, or after it ended).
  #downThisPass(): Set<string> | null {
    const ctx = this.#pass.getStore();
    return ctx && !ctx.ended ? ctx.down : null;
  }

  /** The volume's engine on a host: its info, or whether it is stopped or the host unreachable. */
  async probe(hostId: string, volume: string): Promise<EngineProbe> {
    const h = this.#hosts.get(hostId);
    if (!h || this.#downThisPass()?.has(hostId)) return 'unreachable';
    try {
      return await withTimeout(h.engine.engineInfo(volume), HOST_PROBE_TIMEOUT_MS, `engine of ${volume} on ${hostId}`);
    } catch (err) {
      if (toMooringError(err).code === 'NOT_FOUND') return 'stopped';
      this.#markDown(hostId);
      return 'unreachable';
    }
  }

  /**
   * Whether a host may run an engine of the volume: in a pass, from the host's engines as
   * listed once in that pass (an engine started since is not seen: the caller looks for
   * leftovers, which are older); outside a pass, or when the listing failed, true (probe it).
   */
  async mayRunEngine(hostId: string, volume: string): Promise<boolean> {
    const ctx = this.#pass.getStore();
    if (!ctx || ctx.ended || !this.#hosts.has(hostId)) return true;
    return (await this.#listedInPass(ctx, hostId))?.has(volume) ?? true;
  }

  /**
   * In a full pass (`duringPass(fn, { full: true })`), the volume's engine on a host as the
   * host listed it once in that pass: one `listEngines` per host per pass instead of one
   * `engineInfo` per volume. It may be older than what the pass did since, so it only ever
   * says that an engine runs, and callers act on it only when it shows nothing to do (they
   * {@link probe} before acting). Undefined outside a full pass, when the host does not list
   * the volume, or when the listing failed: then probe.
   */
  async listedEngine(hostId: string, volume: string): Promise<EngineInfo | undefined> {
    const ctx = this.#pass.getStore();
    if (!ctx || ctx.ended || !ctx.full || !this.#hosts.has(hostId) || ctx.down.has(hostId)) return undefined;
    return (await this.#listedInPass(ctx, hostId))?.get(volume);
  }

  // The host's engines, listed at the first ask in the pass (null: down, or did not answer).
  #listedInPass(ctx: PassContext, hostId: string): Promise<Map<string, EngineInfo> | null> {
    let listed = ctx.engines.get(hostId);
    if (!listed) {
      listed = ctx.down.has(hostId) ? Promise.resolve(null) : this.engines(hostId, { markDown: false });
      ctx.engines.set(hostId, listed);
    }
    return listed;
  }

  /**
   * A probe for many volumes at once ({@link probe}'s answers): each host is asked for all
   * its engines once (`listEngines`, bounded by {@link HOST_PROBE_TIMEOUT_MS}), at the first
   * volume asked about there, instead of once per volume.
   */
  listingProbe(): (hostId: string, volume: string) => Promise<EngineProbe> {
    const listed = new Map<string, Promise<Map<string, EngineInfo> | null>>();
    return async (hostId, volume) => {
      let p = listed.get(hostId);
      if (!p) {
        p = this.engines(hostId, { markDown: true });
        listed.set(hostId, p);
      }
      const engines = await p;
      return engines ? (engines.get(volume) ?? 'stopped') : 'unreachable';
    };
  }

  /**
   * The engines a host runs, by volume (`listEngines`, bounded by {@link HOST_PROBE_TIMEOUT_MS}),
   * or null when the host is unknown or did not answer (then counted as down in the current
   * pass if `markDown`).
   */
  async engines(hostId: string, opts: { markDown: boolean }): Promise<Map<string, EngineInfo> | null> {
    const h = this.#hosts.get(hostId);
    if (!h) return null;
    try {
      const es = await withTimeout(h.engine.listEngines(), HOST_PROBE_TIMEOUT_MS, `engines of ${hostId}`);
      return new Map(es.map((e) => [e.volume, e]));
    } catch {
      if (opts.markDown) this.#markDown(hostId);
      return null;
    }
  }

  /** Whether a host answers and runs the volume's engine. */
  async probeEngine(hostId: string, volume: string): Promise<'running' | 'stopped' | 'unreachable'> {
    const p = await this.probe(hostId, volume);
    return typeof p === 'string' ? p : 'running';
  }

  /**
   * Stops the volume's engine on a host, for as long as the stop takes while the host
   * answers: a stop drains and flushes (the data engine's call has a long deadline), but a
   * host that stops answering meanwhile (frozen, cut off) is given up on with UNAVAILABLE
   * after one failed probe (about {@link STOP_LIVENESS_INTERVAL_MS} + {@link HOST_PROBE_TIMEOUT_MS});
   * the stop may still complete there. Every stop the control plane makes goes through here,
   * so that none holds a volume's turn on a host that is gone.
   */
  async stopEngine(hostId: string, volume: string): Promise<void> {
    const h = this.#hosts.get(hostId);
    if (!h) throw new MooringError('UNAVAILABLE', `host ${hostId} is not a host of this cluster`);
    let done = false;
    const stop = h.engine.stopEngine(volume).finally(() => (done = true));
    stop.catch(() => undefined);
    while (!done) {
      await Promise.race([stop.catch(() => undefined), sleep(STOP_LIVENESS_INTERVAL_MS)]);
      if (done) break;
      const answers = await withTimeout(h.engine.info(), HOST_PROBE_TIMEOUT_MS, `host ${hostId}`).then(
        () => true,
        () => false,
      );
      if (!answers && !done) {
        this.#markDown(hostId);
        throw new MooringError('UNAVAILABLE', `host ${hostId} stopped answering while stopping the engine of ${volume}; the stop may still complete there`);
      }
    }
    await stop;
  }

  /** Whether a host's data engine answers. */
  async reachable(hostId: string): Promise<boolean> {
    const h = this.#hosts.get(hostId);
    if (!h || this.#downThisPass()?.has(hostId)) return false;
    try {
      await withTimeout(h.engine.info(), HOST_PROBE_TIMEOUT_MS, `host ${hostId}`);
      return true;
    } catch {
      this.#markDown(hostId);
      return false;
    }
  }

  #markDown(hostId: string): void {
    this.#downThisPass()?.add(hostId);
    this.#unanswered.add(hostId);
  }

  /** Counts a host as not answering (an {@link answeringAgain} call finds it when it does). */
  unanswered(hostId: string): void {
    this.#unanswered.add(hostId);
  }

  /**
   * The hosts that did not answer a probe since the last call and answer now (each probed
   * once, in parallel, bounded by {@link HOST_PROBE_TIMEOUT_MS}), with what they answered;
   * they are forgotten until a probe finds them down again, by the passes running now too.
   * Hosts no longer offered are forgotten.
   */
  async answeringAgain(): Promise<Array<{ hostId: string; info: DataEngineInfo }>> {
    const ids = [...this.#unanswered];
    const back = await Promise.all(
      ids.map(async (hostId) => {
        const h = this.#hosts.get(hostId);
        if (!h) {
          this.#unanswered.delete(hostId);
          return null;
        }
        const info = await withTimeout(h.engine.info(), HOST_PROBE_TIMEOUT_MS, `host ${hostId}`).catch(() => null);
        if (info) {
          this.#unanswered.delete(hostId);
          // A long batch of event repairs takes in the repairs this asks for: it must probe the host again.
          for (const ctx of this.#live) {
            ctx.down.delete(hostId);
            ctx.engines.delete(hostId);
          }
        }
        return info ? { hostId, info } : null;
      }),
    );
    return back.filter((b) => b !== null);
  }
}
