// The fault tests' bench and rounds (docs/fault-tests.md). A bench is three `mooring
// data-engine` processes per lane, each in its own network namespace (helpers/netns.ts),
// and a Mooring over a FileStateStore in this process; it lives for one test file and is
// reused by every round. A round is one fault against one fresh 3-replica volume:
//   create + attach → two NBD clients write tracked data (FLUSH, FUA, requests in flight) →
//   the fault (the test file's function) → recover (everything thawed and healed, ERR
//   replicas re-added through the serving engine's data engine, stray engines gone) →
//   read everything back through the serving engine → the history checker over the whole
//   history (NBD's rules, then "every acknowledged write survives": no process crashes in
//   a round) → detach, all replicas identical → delete.
// Rounds are randomized from a seed that is printed; MOORING_FAULT_SEED replays one round
// (the same choices of hosts, fault points and workload; timing is the machine's).
import { EventEmitter } from 'node:events';
import { join } from 'node:path';
import { afterAll, beforeAll } from 'vitest';

import type { Mooring } from '../../../src/mooring.js';
import type { VolumeStatus } from '../../../src/volume/volume.js';
import { MooringError } from '../../../src/errors.js';
import type { FileStateStore } from '../../../src/state/file-state-store.js';
import { History, SECTOR, type Verdict } from '../helpers/history.js';
import { openCluster, readReplicas, type HostProcess } from '../helpers/hosts.js';
import { CMD, CMD_FLAG, NbdClient } from '../helpers/nbd-client.js';
import { NetLab, sweep } from '../helpers/netns.js';
import { Rng } from '../helpers/pattern.js';
import { chunkedDigest, loadAddon } from '../helpers/replicas.js';
import { TempDir } from '../helpers/tools.js';

export const MiB = 1 << 20;
/** Volume size of every round: small, so rebuilds and read-backs are cheap. */
export const VOLUME_BYTES = 16 * MiB;
/** Remote-replica I/O timeout of the engines the bench's cluster starts. */
export const IO_TIMEOUT_MS = 1000;
/** Upper bound of one round (every wait inside is bounded far below it). */
export const ROUND_TIMEOUT_MS = 150_000;

/** Host ids; lane i (rounds running side by side) uses hosts 3i..3i+2. */
const HOST_IDS = 'abcdefghi'.split('');
/** Rounds that run side by side, each on its own three hosts: MOORING_FAULT_LANES (default `fallback`, at most 3). */
export function laneCount(fallback: number): number {
  const v = process.env.MOORING_FAULT_LANES;
  if (process.env.MOORING_FAULT_SEED) return 1;
  if (v === undefined || v === '') return fallback;
  if (!/^[123]$/.test(v)) throw new Error(`MOORING_FAULT_LANES must be 1, 2 or 3 (got ${JSON.stringify(v)})`);
  return Number(v);
}

// ---------------------------------------------------------------------------------------
// Rounds and seeds

/** Rounds of one fault type: MOORING_FAULT_ROUNDS_<TYPE>, else MOORING_FAULT_ROUNDS, else `fallback`. */
export function roundCount(type: string, fallback: number): number {
  if (process.env.MOORING_FAULT_SEED) return 1;
  const v = process.env[`MOORING_FAULT_ROUNDS_${type.toUpperCase()}`] ?? process.env.MOORING_FAULT_ROUNDS;
  if (v === undefined || v === '') return fallback;
  if (!/^\d{1,4}$/.test(v) || Number(v) < 1) throw new Error(`MOORING_FAULT_ROUNDS must be a positive integer (got ${JSON.stringify(v)})`);
  return Number(v);
}

/** The seed of each round: MOORING_FAULT_SEED (one round), else consecutive from a random base. */
export function roundSeeds(count: number): number[] {
  const one = process.env.MOORING_FAULT_SEED;
  if (one) {
    if (!/^\d{1,9}$/.test(one)) throw new Error(`MOORING_FAULT_SEED must be an integer (got ${JSON.stringify(one)})`);
    return [Number(one)];
  }
  const base = Math.floor(Math.random() * 900_000_000) + 1;
  return Array.from({ length: count }, (_, i) => base + i);
}

/** vitest timeout of a test that runs `rounds` rounds. */
export function testTimeout(rounds: number): number {
  return rounds * ROUND_TIMEOUT_MS + 120_000;
}

// ---------------------------------------------------------------------------------------
// Waiting (always on a condition, always bounded)

/** Polls `check` every `everyMs` until it is true; throws `what` (plus `detail()`) after `timeoutMs`. */
export async function until(what: string, check: () => Promise<boolean> | boolean, timeoutMs: number, detail: () => string | Promise<string> = () => '', everyMs = 50): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let ok = false;
    let err = '';
    try {
      ok = await check();
    } catch (e) {
      err = ` (last check failed: ${(e as Error).message})`;
    }
    if (ok) return;
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${err}${await detail()}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

// ---------------------------------------------------------------------------------------
// The workload: NBD clients writing tracked data into a History

export interface ClientParams {
  /** Writes in flight (each writer loop keeps one). */
  depth: number;
  /** A FLUSH after this many acknowledged writes (one FLUSH in flight at most). */
  flushEvery: number;
  fuaChance: number;
}

export class TrackedClient {
  inFlight = 0;
  acked = 0;
  /** Date.now() of the last acknowledged write (or of the connect). */
  lastAckMs = Date.now();
  errors = 0;
  stopped = false;
  private loops: Promise<void> = Promise.resolve();
  constructor(
    readonly name: string,
    readonly group: string,
    readonly nbd: NbdClient,
  ) {}
  get closed(): boolean {
    return this.nbd.isClosed;
  }
  /** Resolves when every writer loop has ended. */
  get done(): Promise<void> {
    return this.loops;
  }
  setLoops(p: Promise<void>): void {
    this.loops = p;
  }
}

/** A write's outcome as the history records it: null = success, else why not. */
function outcome(p: Promise<{ error: number }>): Promise<string | null> {
  return p.then(
    (r) => (r.error === 0 ? null : `NBD error ${r.error}`),
    (e: unknown) => `connection lost: ${(e as Error).message}`,
  );
}

export class Workload extends EventEmitter {
  readonly clients: TrackedClient[] = [];
  /** Writes one client sends at most in one round (every loop is bounded). */
  static readonly OPS_MAX = 200_000;

  constructor(
    readonly history: History,
    readonly rng: Rng,
    readonly region: { offset: number; length: number },
  ) {
    super();
    this.setMaxListeners(100);
  }

  /** Connects a client to `uri` (its connection is of engine `group`) and starts writing. */
  async connect(name: string, group: string, uri: string, p: ClientParams): Promise<TrackedClient> {
    const nbd = await NbdClient.connect(uri, { timeoutMs: 10_000 });
    const c = new TrackedClient(name, group, nbd);
    this.history.client(name, group);
    this.clients.push(c);
    c.setLoops(this.run(c, p));
    return c;
  }

  private async run(c: TrackedClient, p: ClientParams): Promise<void> {
    const h = this.history;
    let ops = 0;
    let sinceFlush = 0;
    let flushing = false;
    const blocks = this.region.length / 4096;
    const writer = async (): Promise<void> => {
      while (!c.stopped && !c.closed && ops < Workload.OPS_MAX) {
        ops++;
        const len = this.rng.range(1, 8) * 4096;
        const off = this.region.offset + this.rng.int(blocks - len / 4096 + 1) * 4096;
        const fua = this.rng.chance(p.fuaChance);
        const { op, data } = h.beginWrite(c.name, off, len, fua);
        c.inFlight++;
        const err = await outcome(c.nbd.rawRequest(CMD.WRITE, fua ? CMD_FLAG.FUA : 0, off, len, data));
        c.inFlight--;
        h.end(op, err);
        if (err === null) {
          c.acked++;
          c.lastAckMs = Date.now();
          this.emit('ack', c);
          if (++sinceFlush >= p.flushEvery && !flushing) {
            sinceFlush = 0;
            flushing = true;
            const f = h.beginFlush(c.name);
            c.inFlight++;
            void outcome(c.nbd.rawRequest(CMD.FLUSH, 0, 0, 0)).then((ferr) => {
              c.inFlight--;
              h.end(f, ferr);
              flushing = false;
              if (ferr === null) this.emit('flush', c);
            });
          }
        } else {
          c.errors++;
          this.emit('error-reply', c);
          // The client keeps sending after an error (as a guest would retry), paced so a
          // refusing engine does not turn the loop into a busy spin.
          if (!c.closed) await new Promise((r) => setTimeout(r, 20));
        }
      }
    };
    await Promise.all(Array.from({ length: p.depth }, writer));
  }

  /** Acknowledged writes so far, of one group or all. */
  acks(group?: string): number {
    return this.clients.filter((c) => group === undefined || c.group === group).reduce((n, c) => n + c.acked, 0);
  }

  /** Milliseconds since any client of `group` had a write acknowledged. */
  sinceLastAck(group: string): number {
    const cs = this.clients.filter((c) => c.group === group);
    return Date.now() - Math.max(...cs.map((c) => c.lastAckMs));
  }

  /** Whether any client of `group` got an error reply. */
  errored(group: string): boolean {
    return this.clients.some((c) => c.group === group && c.errors > 0);
  }

  inFlight(group?: string): number {
    return this.clients.filter((c) => group === undefined || c.group === group).reduce((n, c) => n + c.inFlight, 0);
  }

  /** Waits until `group`'s clients have `n` more acknowledged writes and (if `flush`) a FLUSH answered meanwhile. */
  async waitAcks(n: number, opts: { group?: string; flush?: boolean; timeoutMs: number; detail?: () => string }): Promise<void> {
    const target = this.acks(opts.group) + n;
    let flushed = !opts.flush;
    const onFlush = (c: TrackedClient): void => {
      if (opts.group === undefined || c.group === opts.group) flushed = true;
    };
    this.on('flush', onFlush);
    try {
      await until(`${n} acknowledged writes${opts.flush ? ' and a FLUSH' : ''} on ${opts.group ?? 'any engine'}`, () => this.acks(opts.group) >= target && flushed, opts.timeoutMs, () => `${this.describe()}${opts.detail?.() ?? ''}`, 10);
    } finally {
      this.off('flush', onFlush);
    }
  }

  /** Stops the clients of a group (or all) from sending more; waits (bounded) for their loops. */
  async stop(group: string | undefined, timeoutMs: number): Promise<void> {
    const cs = this.clients.filter((c) => group === undefined || c.group === group);
    for (const c of cs) c.stopped = true;
    await until(`the writers of ${group ?? 'every client'} to end`, () => cs.every((c) => c.inFlight === 0 || c.closed), timeoutMs, () => this.describe(), 10);
  }

  /** Closes every connection. */
  destroy(): void {
    for (const c of this.clients) {
      c.stopped = true;
      c.nbd.destroy();
    }
  }

  describe(): string {
    return `\nclients: ${this.clients.map((c) => `${c.name}[${c.group}] acked ${c.acked} errors ${c.errors} in flight ${c.inFlight}${c.closed ? ' closed' : ''}`).join('; ')}`;
  }
}

// ---------------------------------------------------------------------------------------
// The bench: hosts in namespaces, the cluster

/** A control plane: a Mooring over a file state store. */
interface ControlPlane {
  cluster: Mooring;
  store: FileStateStore;
}

export class FaultBench {
  tmp!: TempDir;
  lab!: NetLab;
  hosts: HostProcess[] = [];
  readonly warnings: string[] = [];
  readonly log: string[] = [];
  /** Replica checks of finished rounds whose replicas were still held open. */
  readonly pending: PendingCheck[] = [];

  lanes = 1;
  // One control plane shared by every lane, or (clusterPerLane) one per lane over its own
  // hosts and state directory: a fault that closes its control plane leaves the other
  // lanes' rounds alone.
  #planes: ControlPlane[] = [];
  #perLane = false;

  /** Sweeps leftovers, builds the network, starts 3 hosts per lane, opens the cluster(s). */
  async open(lanes: number, opts: { clusterPerLane?: boolean } = {}): Promise<void> {
    sweep();
    this.lanes = lanes;
    this.#perLane = opts.clusterPerLane ?? false;
    this.tmp = new TempDir('mft-');
    this.lab = await NetLab.create(HOST_IDS.slice(0, 3 * lanes), this.tmp.path);
    this.hosts = this.lab.makeHosts(this.tmp.path);
    for (const h of this.hosts) await h.start();
    for (let p = 0; p < (this.#perLane ? lanes : 1); p++) this.#planes.push(await this.#openPlane(p));
  }

  /** The Mooring the rounds of `lane` use. */
  clusterOf(lane: number): Mooring {
    return this.#planes[this.#perLane ? lane : 0]!.cluster;
  }

  /** The state store under {@link clusterOf}. */
  storeOf(lane: number): FileStateStore {
    return this.#planes[this.#perLane ? lane : 0]!.store;
  }

  async #openPlane(p: number): Promise<ControlPlane> {
    const hosts = this.#perLane ? this.hosts.filter((h) => this.laneHosts(p).includes(h.hostId)) : this.hosts;
    const plane = await openCluster(this.#perLane ? this.tmp.join(`plane-${p}`) : this.tmp.path, hosts, {
      repairIntervalMs: 300,
      // Replicas are rebuilt in place, never replaced on another host (there is none).
      replicaReplacementWaitMs: 7 * 24 * 3600 * 1000,
      engineIoTimeoutMs: IO_TIMEOUT_MS,
      ticketWaitTimeoutMs: 30_000,
    });
    plane.cluster.on('warning', (e) => this.note(`cluster warning: ${e.code}: ${e.message}`, true));
    plane.cluster.on('engine-taken-over', (e) => this.note(`takeover of ${e.volume}: ${e.fromHost} → ${e.toHost} at epoch ${e.epoch}`));
    plane.cluster.on('stray-engine-stopped', (e) => this.note(`stray engine of ${e.volume} on ${e.hostId} stopped`));
    return plane;
  }

  /** Closes the lane's cluster and its store (the VM manager stops), then opens both again over the same directory. */
  async reopenCluster(lane: number): Promise<void> {
    const p = this.#perLane ? lane : 0;
    await this.#planes[p]!.cluster.close();
    await this.#planes[p]!.store.close();
    this.#planes[p] = await this.#openPlane(p);
  }

  note(line: string, warning = false): void {
    const l = `${new Date().toISOString().slice(11, 23)} ${line}`;
    this.log.push(l);
    if (warning) this.warnings.push(l);
    if (this.log.length > 400) this.log.splice(0, this.log.length - 400);
  }

  host(id: string): HostProcess {
    const h = this.hosts.find((x) => x.hostId === id);
    if (!h) throw new Error(`no host ${id}`);
    return h;
  }

  /** The hosts of one lane. */
  laneHosts(lane: number): string[] {
    return HOST_IDS.slice(3 * lane, 3 * lane + 3);
  }

  /** Hosts (of `ids`, default all) back to normal: processes running, their links whole and unslowed. */
  restore(ids?: string[]): void {
    for (const h of this.hosts) if (!ids || ids.includes(h.hostId)) h.thaw();
    this.lab.heal(ids);
    for (const h of this.hosts) if (!ids || ids.includes(h.hostId)) this.lab.slow(h.hostId, null);
  }

  /** Host stderr tails, the lab's state, the cluster's recent events. */
  diagnostics(): string {
    return `${this.hosts.map((h) => h.diagnostics()).join('')}${this.lab.diagnostics()}\n--- bench log (last 60) ---\n${this.log.slice(-60).join('\n')}`;
  }

  async close(): Promise<void> {
    if (!this.lab) return;
    this.restore();
    for (const p of this.#planes) {
      await p.cluster.close().catch(() => undefined);
      await p.store.close().catch(() => undefined);
    }
    for (const h of this.hosts) await h.stop().catch(() => undefined);
    this.lab.destroy();
    this.tmp.cleanup();
  }
}

/**
 * A bench for the test file with `lanes` lanes: opened before its tests, closed (network
 * and all) after, whatever happened. `clusterPerLane`: a control plane per lane.
 */
export function useFaultBench(lanes: number, opts: { clusterPerLane?: boolean } = {}): FaultBench {
  const bench = new FaultBench();
  beforeAll(async () => {
    await bench.open(lanes, opts);
  }, 120_000);
  afterAll(async () => {
    await bench.close();
  }, 120_000);
  return bench;
}

// ---------------------------------------------------------------------------------------
// One round

export interface RoundContext {
  bench: FaultBench;
  /** The lane's control plane (another object after {@link FaultBench.reopenCluster}). */
  readonly cluster: Mooring;
  lane: number;
  seed: number;
  rng: Rng;
  volume: string;
  /** The three hosts of this round's lane (the volume's replicas are on them). */
  hostIds: string[];
  /** Heals the cuts touching this lane's hosts. */
  heal(): void;
  history: History;
  workload: Workload;
  /** The host the volume was attached to when the fault began. */
  engineHost: string;
  /** Client parameters drawn for this round. */
  params: ClientParams;
  nbdAddress(host: string): string;
  uri(host: string): string;
  /** What the round did, for its report line. */
  steps: string[];
  step(s: string): void;
}

export interface FaultOutcome {
  /** The host whose engine serves the volume after the fault. */
  servingHost: string;
}

export interface RoundOptions {
  accessMode?: 'rwo' | 'migratable';
}

export interface RoundResult {
  seed: number;
  ms: number;
  verdict: Verdict;
  steps: string[];
}

/** The whole tracked region: the volume. */
const REGION = { offset: 0, length: VOLUME_BYTES };

/**
 * Attaches `volume` on `host` with its NBD socket, as a VM manager would: a NO_QUORUM
 * refusal (the new engine reached no majority of the replicas in its I/O timeout; nothing
 * was served) is tried again, at most 5 times.
 */
export async function attachOn(ctx: RoundContext, host: string, extra: { attacher?: 'api' | 'workload' } = {}): Promise<VolumeStatus> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await ctx.cluster.volume(ctx.volume).attach({ host, nbd: ctx.nbdAddress(host), ...extra });
    } catch (e) {
      if (!(e instanceof MooringError && e.code === 'NO_QUORUM') || attempt >= 5) throw e;
      ctx.step(`attach on ${host} refused (NO_QUORUM: ${e.message.split('\n')[0]}); again`);
    }
  }
}

/** Connects `n` tracked clients to the engine on `host`. */
export async function connectClients(ctx: RoundContext, host: string, n: number): Promise<TrackedClient[]> {
  const out: TrackedClient[] = [];
  const base = ctx.workload.clients.filter((c) => c.group === host).length;
  for (let i = 0; i < n; i++) out.push(await ctx.workload.connect(`${host}${base + i + 1}`, host, ctx.uri(host), ctx.params));
  return out;
}

/**
 * Waits (bounded) until the volume's engine runs on `serving` only: engines left elsewhere
 * (a fenced engine of a host that came back) are stopped by the cluster's repair loop.
 * The old engine's NBD connections close with it.
 */
export async function waitNoStrayEngine(ctx: RoundContext, serving: string, timeoutMs = 45_000): Promise<void> {
  const { bench, volume } = ctx;
  await until(
    `the cluster to stop every engine of ${volume} except the one on ${serving}`,
    async () => {
      for (const id of ctx.hostIds) {
        if (id === serving) continue;
        if ((await bench.host(id).engine.listEngines()).some((e) => e.volume === volume)) return false;
      }
      return true;
    },
    timeoutMs,
    async () => `${ctx.workload.describe()} | repair loop ${JSON.stringify(ctx.cluster.repairLoop)} | engines: ${(
      await Promise.all(ctx.hostIds.map(async (id) => `${id}=${await bench.host(id).engine.engineInfo(volume).then((e) => `epoch ${e.epoch} ${e.role}`, (e: Error) => e.message.slice(0, 80))}`))
    ).join(', ')}`,
    200,
  );
  // With its engine gone, the old connections have closed; their unanswered requests stay so.
  await until('the connections to stopped engines to close', () => ctx.workload.clients.every((c) => c.group === serving || c.closed || c.stopped), 10_000, () => ctx.workload.describe());
}

/**
 * Recovery: re-adds every ERR replica through the serving engine's data engine (the
 * self-repair supervisor would, after its back-off) until the volume is healthy on `serving`.
 */
export async function recover(ctx: RoundContext, serving: string, timeoutMs = 60_000): Promise<void> {
  const { bench, volume } = ctx;
  const deadline = Date.now() + timeoutMs;
  let last: VolumeStatus | null = null;
  let lastError = '';
  for (let attempt = 0; attempt < 200; attempt++) {
    last = await ctx.cluster.volume(volume).status();
    if (last.state === 'healthy' && last.writerHost === serving) return;
    if (Date.now() >= deadline) break;
    const engine = bench.host(serving).engine;
    const err = last.replicas.filter((r) => r.mode === 'ERR');
    for (const r of err) {
      const address = bench.host(r.hostId).ready?.replicaAddress ?? null;
      await engine.addReplica(volume, { id: r.id, hostId: r.hostId, name: r.name, address }).catch((e: unknown) => {
        lastError = `${r.id}@${r.hostId}: ${(e as Error).message}`;
      });
    }
    // A rebuild in progress (WO) finishes by itself: wait for the state to change.
    await until('the volume to change state', async () => (await ctx.cluster.volume(volume).status()).state === 'healthy', Math.max(0, Math.min(5000, deadline - Date.now())), () => '', 100).catch(() => undefined);
  }
  throw new Error(`volume ${volume} not healthy on ${serving} after ${timeoutMs} ms: ${JSON.stringify(last)}; last re-add error: ${lastError || 'none'}`);
}

/** Reads the tracked region back through a fresh connection to `host`, into the history. */
export async function readBack(ctx: RoundContext, host: string): Promise<void> {
  const c = await NbdClient.connect(ctx.uri(host), { timeoutMs: 10_000 });
  try {
    for (let off = REGION.offset; off < REGION.offset + REGION.length; off += MiB) {
      const sent = ctx.history.tick();
      const data = await c.read(off, Math.min(MiB, REGION.offset + REGION.length - off));
      ctx.history.recordRead(`check@${host}`, off, sent, data);
    }
  } finally {
    await c.disconnect();
  }
}

/**
 * Runs one round: `fault` gets the volume attached on a random host with two clients
 * writing, does its damage and returns where the volume is served. Throws with the seed,
 * the checker's verdict and the hosts' logs when anything is wrong.
 */
export async function runRound(bench: FaultBench, lane: number, type: string, seed: number, fault: (ctx: RoundContext) => Promise<FaultOutcome>, opts: RoundOptions = {}): Promise<RoundResult> {
  const t0 = Date.now();
  const rng = new Rng(seed);
  const hostIds = bench.laneHosts(lane);
  const volume = `ft${type}-${seed}`;
  const history = new History(seed);
  // The workload draws from its own generator: the fault's choices stay those of the seed
  // whatever the timing of the writers.
  const workload = new Workload(history, new Rng(seed ^ 0x5bd1e995), REGION);
  const engineHost = rng.pick(hostIds);
  const params: ClientParams = { depth: rng.range(2, 8), flushEvery: rng.range(4, 40), fuaChance: rng.pick([0, 0.05, 0.2]) };
  const steps: string[] = [];
  const ctx: RoundContext = {
    bench,
    get cluster() {
      return bench.clusterOf(lane);
    },
    lane,
    seed,
    rng,
    volume,
    hostIds,
    heal: () => bench.lab.heal(hostIds),
    history,
    workload,
    engineHost,
    params,
    nbdAddress: (h) => `unix:${bench.tmp.join(`${volume}-${h}.sock`)}`,
    uri: (h) => `nbd+unix:///?socket=${bench.tmp.join(`${volume}-${h}.sock`)}`,
    steps,
    step: (s) => {
      const line = `+${((Date.now() - t0) / 1000).toFixed(1)}s ${s}`;
      steps.push(line);
      bench.note(`[${type} ${seed}] ${line}`);
    },
  };
  const fail = (what: string, err?: unknown): Error =>
    new Error(
      `fault ${type}, seed ${seed} (replay: MOORING_FAULT_SEED=${seed}): ${what}${err ? `: ${(err as Error).stack ?? String(err)}` : ''}\nsteps: ${steps.join(' → ')}${workload.describe()}${bench.diagnostics()}`,
    );
  let verdict: Verdict | null = null;
  // A host whose data engine died (in an earlier round of this lane) is a failure; it is
  // restarted so that later rounds (survey mode) have their hosts.
  for (const id of hostIds) {
    const h = bench.host(id);
    if (h.proc?.alive) continue;
    const why = h.diagnostics();
    await h.start();
    await ctx.cluster.addHost(h.engine);
    throw fail(`the data engine of host ${id} had died before this round (restarted now)${why}`);
  }
  try {
    await ctx.cluster.createVolume({ name: volume, sizeBytes: VOLUME_BYTES, replicas: 3, hosts: hostIds, accessMode: opts.accessMode ?? 'rwo' });
    const st = await attachOn(ctx, engineHost, opts.accessMode === 'migratable' ? { attacher: 'workload' } : {});
    if (st.state !== 'healthy') throw new Error(`attach on ${engineHost}: ${JSON.stringify(st)}`);
    ctx.step(`attached on ${engineHost} (epoch ${st.epoch}; clients depth ${params.depth}, FLUSH every ${params.flushEvery}, FUA ${params.fuaChance})`);
    await connectClients(ctx, engineHost, 2);
    const out = await fault(ctx);
    bench.restore(hostIds);
    // The serving engine's clients write on through the recovery (rebuilds under load) in
    // half the rounds; in the others they stop here, so that what they would overwrite
    // (e.g. writes a cut-off engine acknowledged) stays for the checker to see.
    if (rng.chance(0.5)) {
      await workload.stop(out.servingHost, 30_000);
      ctx.step(`recover on ${out.servingHost} (its clients stopped)`);
    } else {
      ctx.step(`recover on ${out.servingHost} (its clients writing)`);
    }
    await waitNoStrayEngine(ctx, out.servingHost);
    await recover(ctx, out.servingHost);
    await workload.stop(undefined, 30_000);
    workload.destroy();
    await readBack(ctx, out.servingHost);
    verdict = history.check();
    ctx.step(`checked: ${verdict.ok ? 'ok' : 'VIOLATIONS'}`);
    if (!verdict.ok) throw fail(`the history checker found violations\n${verdict.summary}\n${await whatReplicasHold(ctx, verdict)}`);
    // No process crashed in a round (freezes and partitions only), so invariant 1 asks
    // more than NBD: every acknowledged write survives, flushed or not.
    const strict = history.check({ ackedIsDurable: true });
    if (!strict.ok) throw fail(`acknowledged writes lost although no process crashed (invariant 1; each was acknowledged, none was flushed)\n${strict.summary}\n${await whatReplicasHold(ctx, strict)}`);
    // Every replica holds what the engine served: checked once the volume is detached and
    // no replica server holds a replica open any more (a connection cut by a partition
    // stays open on the server's side until its idle timeout, 30 s): now if possible,
    // else by a later round or at the end (checkPending).
    const served = await readWhole(ctx.uri(out.servingHost));
    const list = (await ctx.cluster.volume(volume).status()).replicas.map((r) => ({ host: bench.host(r.hostId), name: r.name }));
    await ctx.cluster.volume(volume).detach();
    const pending: PendingCheck = { lane, volume, seed, servedBy: out.servingHost, want: chunkedDigest(served), list, fail: (what) => fail(what), since: Date.now() };
    if (!(await checkReplicas(bench, pending))) bench.pending.push(pending);
  } catch (err) {
    if (err instanceof Error && err.message.startsWith(`fault ${type}, seed ${seed}`)) throw err;
    throw fail('the round failed', err);
  } finally {
    workload.destroy();
    bench.restore(hostIds);
  }
  return { seed, ms: Date.now() - t0, verdict: verdict!, steps };
}

/**
 * For a failure message: what each replica holds (whose write, by the sector stamps) at the
 * first violations, read from the replica files once the volume is detached.
 */
async function whatReplicasHold(ctx: RoundContext, verdict: Verdict): Promise<string> {
  const { bench, cluster, volume, history } = ctx;
  try {
    const st = await cluster.volume(volume).status();
    await cluster.volume(volume).detach();
    const offsets = [...new Set(verdict.violations.filter((v) => v.kind !== 'dual-writer').slice(0, 4).map((v) => v.offset))];
    const lines: string[] = [];
    for (const r of st.replicas) {
      const dir = join(bench.host(r.hostId).opts.dir, 'replicas', r.name);
      let replica;
      try {
        replica = await loadAddon().openReplica(dir);
      } catch (e) {
        lines.push(`  ${r.id}@${r.hostId} (${r.mode}): not readable now: ${(e as Error).message}`);
        continue;
      }
      try {
        const seen: string[] = [];
        for (const off of offsets) {
          const stamp = History.stamp(await replica.read(off, SECTOR));
          seen.push(`byte ${off}: ${stamp && stamp.history === history.id ? `write #${stamp.writeId}` : 'no write'}`);
        }
        lines.push(`  ${r.id}@${r.hostId} (${r.mode}): ${seen.join(', ')}`);
      } finally {
        await replica.close();
      }
    }
    return `replicas after the round (engine ${st.writerHost}, epoch ${st.epoch}):\n${lines.join('\n')}`;
  } catch (e) {
    return `replicas not read: ${(e as Error).message}`;
  }
}

/** A replica check left for later (its replicas were still held open). */
export interface PendingCheck {
  lane: number;
  volume: string;
  seed: number;
  servedBy: string;
  want: string;
  list: Array<{ host: HostProcess; name: string }>;
  fail: (what: string) => Error;
  since: number;
}

// Compares every replica with what was served, then deletes the volume. False if a replica
// is still held open by its replica server (try again later); throws on a difference.
async function checkReplicas(bench: FaultBench, p: PendingCheck): Promise<boolean> {
  let contents;
  try {
    contents = await readReplicas(p.list, VOLUME_BYTES);
  } catch (e) {
    if (/already open/.test((e as Error).message)) return false;
    throw p.fail(`reading the replicas after the round: ${(e as Error).message}`);
  }
  const differ = contents.filter((c) => c.digest !== p.want).map((c) => c.id);
  if (contents.length !== 3 || differ.length > 0) throw p.fail(`replicas differ from what ${p.servedBy} served after repair: ${differ.join(', ')} (of ${contents.length})`);
  // A host just healed or resumed may still be reconnecting (its old connection dropped by
  // the client's keepalive during the fault): as documented, delete again once it answers.
  await until(`${p.volume} deleted`, async () => {
    try {
      await bench.clusterOf(p.lane).deleteVolume(p.volume);
      return true;
    } catch (e) {
      if ((e as { code?: string }).code === 'UNAVAILABLE') return false;
      throw e;
    }
  }, 30_000, () => '', 250);
  return true;
}

/** Runs the replica checks left by earlier rounds; with `waitMs`, waits (bounded) until all are done. */
export async function checkPending(bench: FaultBench, waitMs = 0): Promise<void> {
  const deadline = Date.now() + waitMs;
  for (let pass = 0; pass < 1000; pass++) {
    const todo = bench.pending.splice(0);
    for (const p of todo) if (!(await checkReplicas(bench, p))) bench.pending.push(p);
    if (bench.pending.length === 0 || Date.now() >= deadline) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  if (waitMs > 0 && bench.pending.length > 0) {
    const p = bench.pending[0]!;
    throw p.fail(`replicas of ${bench.pending.map((x) => x.volume).join(', ')} still held open ${((Date.now() - p.since) / 1000).toFixed(0)} s after the round`);
  }
}

async function readWhole(uri: string): Promise<Buffer> {
  const c = await NbdClient.connect(uri, { timeoutMs: 10_000 });
  try {
    const out = Buffer.alloc(c.sizeBytes);
    for (let off = 0; off < c.sizeBytes; off += MiB) (await c.read(off, Math.min(MiB, c.sizeBytes - off))).copy(out, off);
    return out;
  } finally {
    await c.disconnect();
  }
}

// After a failed round (survey mode only): the volume goes, whatever state it is in.
async function discardVolume(bench: FaultBench, lane: number, volume: string): Promise<void> {
  bench.restore(bench.laneHosts(lane));
  const cluster = bench.clusterOf(lane);
  await cluster.volume(volume).detach().catch(() => undefined);
  for (const id of bench.laneHosts(lane)) await bench.host(id).engine.stopEngine(volume).catch(() => undefined);
  await cluster.deleteVolume(volume).catch((e: unknown) => bench.note(`discarding ${volume}: ${(e as Error).message}`, true));
}

/**
 * Runs the rounds of one fault type: the bench's lanes side by side, each lane's rounds one
 * after another; prints one line per round and a summary. The first failing round fails the
 * test (the other lanes finish their current round and start no more), unless
 * MOORING_FAULT_SURVEY=1: then every round runs and the test fails at the end, listing every
 * failing seed (to measure how often a fault finds a bug).
 */
export async function runRounds(bench: FaultBench, type: string, rounds: number, fault: (ctx: RoundContext) => Promise<FaultOutcome>, opts: RoundOptions = {}): Promise<RoundResult[]> {
  const survey = process.env.MOORING_FAULT_SURVEY === '1';
  const seeds = roundSeeds(rounds);
  const results: RoundResult[] = [];
  const failures: Array<{ seed: number; message: string }> = [];
  const t0 = Date.now();
  const times: number[] = [];
  let next = 0;
  let done = 0;
  const lane = async (l: number): Promise<void> => {
    while (next < seeds.length && (survey || failures.length === 0)) {
      try {
        await checkPending(bench);
      } catch (err) {
        // The message names the round (seed) whose replicas differ.
        failures.push({ seed: -1, message: (err as Error).message });
        continue;
      }
      // Another lane may have taken the last seed while this one awaited the check.
      if (next >= seeds.length) break;
      const seed = seeds[next++]!;
      const r0 = Date.now();
      try {
        const r = await runRound(bench, l, type, seed, fault, opts);
        results.push(r);
        console.log(`fault ${type} round ${++done}/${seeds.length} seed ${seed} (lane ${l}): ${(r.ms / 1000).toFixed(1)} s, ${r.steps.join(' → ')}; ${JSON.stringify(r.verdict.stats)}`);
      } catch (err) {
        const message = (err as Error).message;
        failures.push({ seed, message });
        console.log(`fault ${type} round ${++done}/${seeds.length} seed ${seed} (lane ${l}): FAILED in ${((Date.now() - r0) / 1000).toFixed(1)} s: ${message.split('\n').slice(0, 4).join(' | ').slice(0, 1500)}`);
        if (survey) await discardVolume(bench, l, `ft${type}-${seed}`);
      }
      times.push(Date.now() - r0);
    }
  };
  await Promise.all(Array.from({ length: bench.lanes }, (_, l) => lane(l)));
  try {
    await checkPending(bench, 60_000);
  } catch (err) {
    failures.push({ seed: -1, message: (err as Error).message });
  }
  times.sort((a, b) => a - b);
  const wall = (Date.now() - t0) / 1000;
  console.log(
    `fault ${type}: ${done} rounds (${failures.length} failed) in ${wall.toFixed(1)} s on ${bench.lanes} lane(s): ${(wall / Math.max(1, done)).toFixed(1)} s of wall time per round; one round median ${(times[times.length >> 1]! / 1000).toFixed(1)} s, max ${(times[times.length - 1]! / 1000).toFixed(1)} s`,
  );
  if (failures.length > 0) {
    const seedsOf = failures.map((f) => (f.seed >= 0 ? String(f.seed) : (/seed (\d+)/.exec(f.message)?.[1] ?? '?'))).join(', ');
    throw new Error(`fault ${type}: ${failures.length} of ${done} rounds failed: seeds ${seedsOf}\nfirst:\n${failures[0]!.message}`);
  }
  return results;
}
