/**
 * Upgrade measurements: three `mooring data-engine` processes on loopback that may exec their
 * successor, a 3-replica volume attached on h0, and a client writing 4 KiB blocks at random
 * offsets, 16 at a time, throughout. One upgrade session per hand-off (`hosts: [h]`).
 *
 * - In place, engine host: the session hands h0's process over to a successor while the
 *   client stays connected. The pause is the longest stretch without any write acknowledged
 *   that overlaps the session (the client's view), next to the export's frozen time that
 *   the data engine reports (`handed-off`).
 * - In place, replica hosts: the same for h1 and h2, whose replica servers tell the engine's
 *   connections to go away and come back.
 * - Fallback (`restart`): h0's process is stopped and a new one started; the client's
 *   connection drops and it connects again at once, as QEMU does with `reconnect-delay`.
 * - Peer: qemu-nbd over one raw file stopped and started again on the same socket, with the
 *   same client (what restarting a plain NBD server costs a client).
 * A quiet stretch of the same writes before the first session gives the longest gap between
 * acknowledgements with nothing happening, to read the pauses against.
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';

import { DATA_ENGINE_LOCK_FILE } from '../data-engine/local-data-engine.js';
import { Mooring } from '../mooring.js';
import { packageVersion } from '../native/load.js';
import { MemoryStateStore } from '../state/memory-state-store.js';
import type { UpgradeMethod } from '../upgrade/upgrade-records.js';
import { processAlive } from '../util/processes.js';
import { spread, startQemuNbd, type Spread } from './migration.js';
import { NbdClient } from './nbd-client.js';
import { BenchError, stopChild } from './processes.js';
import { startBenchHost, type BenchHost } from './remote-hosts.js';
import { createSparse, type TargetContext } from './targets.js';

/** Replica ports of the upgrade hosts (distinct from the migration, rebuild and remote-target ones). */
const UPGRADE_PORT_OFFSET = 80;
const VOLUME_BYTES = 64 * 1024 * 1024;
const BLOCK = 4096;
const QUEUE_DEPTH = 16;
/** Writes at steady state before the first session, for the baseline gap. */
const QUIET_MS = 2_000;
/** Restarts measured for the fallback and for the peer (each costs a process start). */
const RESTART_ROUNDS = 5;
const STEP_TIMEOUT_MS = 120_000;
/** A client that makes no progress this long means the target is gone. */
const PROGRESS_TIMEOUT_MS = 60_000;

export interface UpgradeResults {
  /** In-place hand-offs of the engine's host: the pause around the hand-off, the export's frozen time, the longest over the whole session (its snapshot included). */
  engineHost: { handOffs: number; clientPauseMs: Spread; frozenMs: Spread; sessionPauseMs: Spread };
  /** In-place hand-offs of hosts holding replicas only. */
  replicaHosts: { handOffs: number; clientPauseMs: Spread; frozenMs: Spread };
  /** Client connections that dropped during the in-place sessions (0 when nothing reconnected). */
  reconnects: number;
  /** Writes that failed during the in-place sessions. */
  writeErrors: number;
  /** The longest gap between acknowledgements in a quiet stretch (`quietMs`) before any session. */
  quietGapMs: number;
  quietMs: number;
  /** Sessions with method `restart`: the client reconnects to the same socket. */
  restart: { rounds: number; clientPauseMs: Spread };
  peer: { name: string; rounds: number; clientPauseMs: Spread };
}

/**
 * Random 4 KiB writes at queue depth 16 through one socket, recording when each one is
 * acknowledged; a dropped connection is counted and connected again at once.
 */
class Writer {
  readonly acks: number[] = [];
  errors = 0;
  reconnects = 0;
  #client: NbdClient;
  #reconnecting: Promise<void> | null = null;
  #stop = false;
  #lanes: Promise<void>[] = [];

  private constructor(
    private readonly socket: string,
    client: NbdClient,
  ) {
    this.#client = client;
  }

  static async start(socket: string): Promise<Writer> {
    const w = new Writer(socket, await NbdClient.connect(`nbd+unix:///?socket=${socket}`));
    const block = Buffer.alloc(BLOCK, 0x6d);
    w.#lanes = Array.from({ length: QUEUE_DEPTH }, async () => {
      while (!w.#stop) {
        const client = w.#client;
        try {
          await client.write(Math.floor(Math.random() * (VOLUME_BYTES / BLOCK)) * BLOCK, block);
          w.acks.push(performance.now());
        } catch {
          w.errors++;
          await w.#reconnect(client);
        }
      }
    });
    return w;
  }

  // Every lane that saw `failed` fail waits for one new connection.
  #reconnect(failed: NbdClient): Promise<void> {
    if (this.#client !== failed) return Promise.resolve();
    this.#reconnecting ??= (async () => {
      failed.destroy();
      this.reconnects++;
      for (;;) {
        if (this.#stop) return;
        const c = await NbdClient.connect(`nbd+unix:///?socket=${this.socket}`, { timeoutMs: 200 }).catch(() => null);
        if (c) {
          this.#client = c;
          return;
        }
        await new Promise((r) => setTimeout(r, 2));
      }
    })().finally(() => (this.#reconnecting = null));
    return this.#reconnecting;
  }

  /** The longest stretch without an acknowledgement that overlaps [from, to]. */
  longestGap(from: number, to: number): number {
    let gap = 0;
    for (let i = 1; i < this.acks.length; i++) {
      const a = this.acks[i - 1]!;
      const b = this.acks[i]!;
      if (b >= from && a <= to) gap = Math.max(gap, b - a);
    }
    return gap;
  }

  /** Waits until `n` more writes were acknowledged. */
  async progress(n: number): Promise<void> {
    const target = this.acks.length + n;
    const deadline = Date.now() + PROGRESS_TIMEOUT_MS;
    while (this.acks.length < target) {
      if (Date.now() > deadline) throw new BenchError('BENCH_TARGET_FAILED', `no write acknowledged on ${this.socket} for ${PROGRESS_TIMEOUT_MS / 1000} s`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  async stop(): Promise<void> {
    this.#stop = true;
    await Promise.all(this.#lanes);
    this.#client.destroy();
  }
}

// The process that owns a host's directory now: after an in-place hand-off, the successor.
function directoryOwner(host: BenchHost): number | null {
  try {
    return (JSON.parse(readFileSync(join(host.dir, DATA_ENGINE_LOCK_FILE), 'utf8')) as { pid: number }).pid;
  } catch {
    return null;
  }
}

async function stopSuccessor(host: BenchHost): Promise<void> {
  const pid = directoryOwner(host);
  if (pid === null || pid === host.child.pid || pid === process.pid) return;
  const alive = (): boolean => processAlive(pid);
  if (!alive()) return;
  process.kill(pid, 'SIGTERM');
  const deadline = Date.now() + 30_000;
  while (alive() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  if (alive()) process.kill(pid, 'SIGKILL');
}

/** Runs `handOffs` in-place sessions of h0, half as many of h1/h2, restarts, and the peer. */
export async function measureUpgrade(ctx: TargetContext, handOffs: number): Promise<UpgradeResults> {
  const cli = ctx.mooringCli!;
  // The successor's command must lie under the prefix the data engines allow.
  const prefix = dirname(dirname(cli));
  const hosts: BenchHost[] = [];
  let cluster: Mooring | null = null;
  let writer: Writer | null = null;
  try {
    for (let i = 0; i < 3; i++) hosts.push(await startBenchHost(ctx, i, ctx.portBase + UPGRADE_PORT_OFFSET + i, ['--allow-successor-exec', prefix]));
    cluster = await Mooring.open({ store: new MemoryStateStore(), hosts: hosts.map((h) => h.engine), repairIntervalMs: 500 });
    await cluster.createVolume({ name: 'up', sizeBytes: VOLUME_BYTES, replicas: 3, hosts: ['h0', 'h1', 'h2'] });
    const socket = join(ctx.dir, 'up.sock');
    await cluster.volume('up').attach({ host: 'h0', nbd: `unix:${socket}` });
    writer = await Writer.start(socket);
    const quietFrom = performance.now();
    await new Promise((r) => setTimeout(r, QUIET_MS));
    const quietGapMs = writer.longestGap(quietFrom, performance.now());

    const session = async (host: string, method: UpgradeMethod): Promise<{ pauseMs: number; frozenMs: number; sessionPauseMs: number }> => {
      if (ctx.abort.aborted) throw new BenchError('BENCH_INTERRUPTED', 'interrupted');
      await writer!.progress(QUEUE_DEPTH * 4);
      const from = performance.now();
      const reconnectsBefore = writer!.reconnects;
      const errorsBefore = writer!.errors;
      const s = await cluster!.startUpgrade({ hosts: [host], method, dataEngine: { version: packageVersion(), command: [process.execPath, cli] }, stepTimeoutMs: STEP_TIMEOUT_MS });
      let frozenMs = NaN;
      // The hand-off itself: from the host's switching-over to the process handed over (the
      // session also snapshots the volume first, a pause of its own, reported apart).
      let switchAt = NaN;
      let handedAt = NaN;
      s.on('host-state-changed', (e) => {
        if (e.state === 'switching-over') switchAt = performance.now();
      });
      s.on('handed-off', (e) => {
        frozenMs = e.pauseMs;
        handedAt = performance.now();
      });
      const done = await s.done();
      if (done.state !== 'completed') throw new BenchError('BENCH_TARGET_FAILED', `upgrade session of ${host} ended ${done.state}`);
      // The pause may end after the session does (the client's next acknowledgement).
      await writer!.progress(QUEUE_DEPTH * 4);
      const pauseTo = performance.now();
      const sessionPauseMs = writer!.longestGap(from, pauseTo);
      // A restart's pause is its reconnect, in a later step: the whole session's counts.
      const pauseMs = method === 'restart' || Number.isNaN(switchAt) || Number.isNaN(handedAt) ? sessionPauseMs : writer!.longestGap(switchAt, handedAt);
      ctx.log(
        `  ${host} ${method}: session ${(performance.now() - from).toFixed(0)} ms, client pause ${pauseMs.toFixed(1)} ms (whole session ${sessionPauseMs.toFixed(1)} ms)` +
          `${Number.isNaN(frozenMs) ? '' : `, export frozen ${frozenMs.toFixed(1)} ms`}; ${writer!.reconnects - reconnectsBefore} reconnects, ${writer!.errors - errorsBefore} failed writes`,
      );
      // A client that had to connect again during an in-place hand-off is a failure to explain.
      if (method === 'in-place' && writer!.reconnects > reconnectsBefore) {
        for (const h of hosts) ctx.log(`  ${h.hostId} stderr (tail):\n${h.stderr.toString()}`);
      }
      // The session's snapshot goes, as an embedder drops it once the upgrade is done: each
      // round would otherwise add a layer, and an engine's start grows with its layers.
      for (const snap of await cluster!.volume('up').listSnapshots()) {
        if (snap.name.startsWith('upgrade-')) await cluster!.volume('up').deleteSnapshot(snap.name);
      }
      return { pauseMs, frozenMs, sessionPauseMs };
    };

    const engine = { pause: [] as number[], frozen: [] as number[], session: [] as number[] };
    const replica = { pause: [] as number[], frozen: [] as number[] };
    for (let i = 0; i < handOffs; i++) {
      const r = await session('h0', 'in-place');
      engine.pause.push(r.pauseMs);
      engine.frozen.push(r.frozenMs);
      engine.session.push(r.sessionPauseMs);
      if (i % 2 === 1) {
        const rr = await session(i % 4 === 1 ? 'h1' : 'h2', 'in-place');
        replica.pause.push(rr.pauseMs);
        replica.frozen.push(rr.frozenMs);
      }
    }
    const reconnects = writer.reconnects;
    const writeErrors = writer.errors;
    ctx.log(
      `  in place, engine host: client pause median ${spread(engine.pause).median.toFixed(1)} ms, max ${spread(engine.pause).max.toFixed(1)} ms over ${handOffs} hand-offs; ` +
        `${reconnects} reconnects, ${writeErrors} write errors; quiet gap ${quietGapMs.toFixed(1)} ms`,
    );
    const restart: number[] = [];
    for (let i = 0; i < Math.min(RESTART_ROUNDS, handOffs); i++) restart.push((await session('h0', 'restart')).pauseMs);
    ctx.log(`  restart (client reconnects): client pause median ${spread(restart).median.toFixed(1)} ms`);
    await writer.stop();
    writer = null;
    const peer = await measurePeer(ctx);
    ctx.log(`  qemu-nbd restarted on its socket: client pause median ${peer.clientPauseMs.median.toFixed(1)} ms`);
    return {
      engineHost: { handOffs, clientPauseMs: spread(engine.pause), frozenMs: spread(engine.frozen), sessionPauseMs: spread(engine.session) },
      replicaHosts: { handOffs: replica.pause.length, clientPauseMs: spread(replica.pause), frozenMs: spread(replica.frozen) },
      reconnects,
      writeErrors,
      quietGapMs,
      quietMs: QUIET_MS,
      restart: { rounds: restart.length, clientPauseMs: spread(restart) },
      peer,
    };
  } finally {
    await writer?.stop().catch(() => undefined);
    await cluster?.close().catch(() => undefined);
    for (const h of hosts) {
      await h.stop().catch(() => undefined);
      await stopSuccessor(h).catch(() => undefined);
    }
  }
}

async function measurePeer(ctx: TargetContext): Promise<UpgradeResults['peer']> {
  const image = join(ctx.dir, 'peer.raw');
  createSparse(image, VOLUME_BYTES);
  const socket = join(ctx.dir, 'peer.sock');
  let child = await startQemuNbd(ctx, image, socket);
  const writer = await Writer.start(socket);
  const pause: number[] = [];
  try {
    for (let i = 0; i < RESTART_ROUNDS; i++) {
      await writer.progress(QUEUE_DEPTH * 4);
      const from = performance.now();
      await stopChild(child, 10_000);
      child = await startQemuNbd(ctx, image, socket);
      await writer.progress(QUEUE_DEPTH * 4);
      pause.push(writer.longestGap(from, performance.now()));
    }
  } finally {
    await writer.stop();
    await stopChild(child, 5000);
  }
  return { name: 'qemu-nbd over one raw file, stopped and started again on the same socket', rounds: RESTART_ROUNDS, clientPauseMs: spread(pause) };
}
