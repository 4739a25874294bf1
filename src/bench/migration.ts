/**
 * Migration measurements: three `mooring data-engine` processes on loopback, a
 * migratable 3-replica volume migrated back and forth between h0 and h1 (each round: migrate,
 * hand over, confirm), with a client writing 4 KiB blocks one at a time throughout.
 *
 * - Hand-over: from the source's drain start to the target accepting writes
 *   (`HandOverResult.pauseMs`), and the drain part of it.
 * - Client pause: the client writes to the source's export until a write fails (the source
 *   handed over), then to the target's until one succeeds: last acknowledged write on the
 *   source → first acknowledged on the target. QEMU pauses the guest around the hand-over,
 *   so this is the storage's share of the switch-over downtime.
 * - Peer: the same client pause when the export is moved the way a hypervisor without a
 *   migratable storage layer moves it: qemu-nbd serving one raw file stops on one socket and
 *   starts on another (a shared file, as with NFS).
 */
import { join } from 'node:path';

import { Mooring } from '../mooring.js';
import { MemoryStateStore } from '../state/memory-state-store.js';
import { NbdClient } from './nbd-client.js';
import { BenchError, stopChild } from './processes.js';
import { startBenchHost, type BenchHost } from './remote-hosts.js';
import { createSparse, type TargetContext } from './targets.js';

/** Replica ports of the migration hosts (distinct from the rebuild and remote-target ones). */
const MIGRATION_PORT_OFFSET = 60;
/** Volume size: small, the hand-over does not depend on it. */
const VOLUME_BYTES = 64 * 1024 * 1024;
/** Writes after the first one on the target before a round ends. */
const WRITES_AFTER_SWITCH = 16;
/** Steady writes on the source before the hand-over starts. */
const WARMUP_MS = 30;
/** Rounds of the qemu-nbd peer (each starts a process). */
const PEER_ROUNDS = 10;
/** How long qemu-nbd may take to accept connections. */
const PEER_START_TIMEOUT_MS = 10_000;

/** Median, 99th percentile and maximum of a series, in ms. */
export interface Spread {
  median: number;
  p99: number;
  max: number;
}

export interface MigrationResults {
  rounds: number;
  handOverMs: Spread;
  drainMs: Spread;
  clientPauseMs: Spread;
  /** qemu-nbd moved from one socket to another over one file. */
  peer: { name: string; rounds: number; clientPauseMs: Spread };
}

export function spread(xs: number[]): Spread {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q: number): number => s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)] ?? 0;
  return { median: at(0.5), p99: at(0.99), max: s.at(-1) ?? 0 };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

// Writes 4 KiB blocks one at a time to `from` until the hand-over (`moved`) or a failure,
// then to the client `to()` gives until WRITES_AFTER_SWITCH succeeded there. Returns last
// ack on `from` → first ack on the new one. The source holds the write it receives after
// the hand-over (for a rollback): the confirm drops it.
async function writeThrough(from: NbdClient, to: () => Promise<NbdClient>, moved: Promise<void>): Promise<{ pauseMs: number; next: NbdClient }> {
  const block = Buffer.alloc(4096, 0x5a);
  let off = 0;
  let lastAck = 0;
  let handedOver = false;
  void moved.then(() => (handedOver = true));
  while (!handedOver) {
    const acked = await Promise.race([from.write(off, block).then(() => true), moved.then(() => false)]).catch(() => false);
    if (!acked) break; // handed over (the write is held), or the export went away
    lastAck = performance.now();
    off = (off + 4096) % VOLUME_BYTES;
  }
  let next: NbdClient | null = null;
  while (!next) next = await to().catch(() => null); // the new export may not listen yet
  let firstAck = 0;
  let after = 0;
  while (after < WRITES_AFTER_SWITCH) {
    try {
      await next.write(off, block);
      if (firstAck === 0) firstAck = performance.now();
      after++;
      off = (off + 4096) % VOLUME_BYTES;
    } catch {
      // not active yet: try again at once (a paused guest would retry on resume)
    }
  }
  return { pauseMs: firstAck - lastAck, next };
}

/** Migrates a volume `rounds` times between two hosts; every host is stopped when it returns or throws. */
export async function measureMigration(ctx: TargetContext, rounds: number): Promise<MigrationResults> {
  const hosts: BenchHost[] = [];
  let cluster: Mooring | null = null;
  const clients: NbdClient[] = [];
  try {
    for (let i = 0; i < 3; i++) hosts.push(await startBenchHost(ctx, i, ctx.portBase + MIGRATION_PORT_OFFSET + i));
    cluster = await Mooring.open({ store: new MemoryStateStore(), hosts: hosts.map((h) => h.engine), repairIntervalMs: 0 });
    const name = 'mig';
    await cluster.createVolume({ name, sizeBytes: VOLUME_BYTES, replicas: 3, accessMode: 'migratable', hosts: ['h0', 'h1', 'h2'] });
    const vol = cluster.volume(name);
    const sock = (h: string, i: number): string => join(ctx.dir, `${h}-${i}.sock`);
    let here = 'h0';
    let socket = sock(here, 0);
    await vol.attach({ host: here, nbd: `unix:${socket}` });
    const handOver: number[] = [];
    const drain: number[] = [];
    const pause: number[] = [];
    for (let i = 1; i <= rounds; i++) {
      if (ctx.abort.aborted) throw new BenchError('BENCH_INTERRUPTED', 'interrupted');
      const there = here === 'h0' ? 'h1' : 'h0';
      const next = sock(there, i);
      const m = await vol.migrate(there, { nbd: `unix:${next}` });
      const src = await NbdClient.connect(`nbd+unix:///?socket=${socket}`);
      clients.push(src);
      let handedOver!: () => void;
      const moved = new Promise<void>((r) => (handedOver = r));
      const load = writeThrough(src, async () => {
        const c = await NbdClient.connect(`nbd+unix:///?socket=${next}`);
        clients.push(c);
        return c;
      }, moved);
      await sleep(WARMUP_MS);
      const ho = await m.handOver();
      handedOver();
      const { pauseMs } = await load;
      for (const c of clients.splice(0)) c.destroy();
      await m.confirm();
      handOver.push(ho.pauseMs);
      drain.push(ho.drainMs);
      pause.push(pauseMs);
      here = there;
      socket = next;
    }
    await vol.detach();
    const ours = { rounds, handOverMs: spread(handOver), drainMs: spread(drain), clientPauseMs: spread(pause) };
    ctx.log(
      `  hand-over: median ${ours.handOverMs.median.toFixed(1)} ms, p99 ${ours.handOverMs.p99.toFixed(1)} ms; ` +
        `client pause: median ${ours.clientPauseMs.median.toFixed(1)} ms, p99 ${ours.clientPauseMs.p99.toFixed(1)} ms (${rounds} migrations)`,
    );
    const peer = await measurePeer(ctx);
    ctx.log(`  qemu-nbd moved between sockets: client pause median ${peer.clientPauseMs.median.toFixed(1)} ms`);
    return { ...ours, peer };
  } finally {
    for (const c of clients) c.destroy();
    await cluster?.close().catch(() => undefined);
    for (const h of hosts) await h.stop().catch(() => undefined);
  }
}

/** Starts qemu-nbd on `socket` over a raw image (with `extraArgs`) and waits until it accepts connections. */
export async function startQemuNbd(ctx: TargetContext, image: string, socket: string, extraArgs: string[] = []): Promise<ReturnType<TargetContext['tracker']['spawn']>> {
  const child = ctx.tracker.spawn('qemu-nbd', ['-f', 'raw', '-t', '-e', '2', ...extraArgs, '-k', socket, image]);
  child.stdout?.resume();
  child.stderr?.resume();
  const deadline = Date.now() + PEER_START_TIMEOUT_MS;
  for (;;) {
    try {
      const c = await NbdClient.connect(`nbd+unix:///?socket=${socket}`, { timeoutMs: 200 });
      c.destroy();
      return child;
    } catch {
      if (Date.now() > deadline || child.exitCode !== null) {
        await stopChild(child, 2000);
        throw new BenchError('BENCH_TARGET_FAILED', `qemu-nbd did not accept connections on ${socket}`);
      }
      await sleep(2);
    }
  }
}

async function measurePeer(ctx: TargetContext): Promise<MigrationResults['peer']> {
  const image = join(ctx.dir, 'peer.raw');
  createSparse(image, VOLUME_BYTES);
  const pause: number[] = [];
  let socket = join(ctx.dir, 'peer-0.sock');
  let child = await startQemuNbd(ctx, image, socket);
  try {
    for (let i = 1; i <= PEER_ROUNDS; i++) {
      const src = await NbdClient.connect(`nbd+unix:///?socket=${socket}`);
      const next = join(ctx.dir, `peer-${i}.sock`);
      let handedOver!: () => void;
      const moved = new Promise<void>((r) => (handedOver = r));
      const load = writeThrough(src, async () => {
        const c = await NbdClient.connect(`nbd+unix:///?socket=${next}`);
        return c;
      }, moved);
      await sleep(WARMUP_MS);
      // The move: the old export stops (flushing), the new one starts over the same file.
      handedOver();
      const old = child;
      await stopChild(old, 10_000);
      child = await startQemuNbd(ctx, image, next);
      const { pauseMs, next: c } = await load;
      src.destroy();
      c.destroy();
      pause.push(pauseMs);
      socket = next;
    }
  } finally {
    await stopChild(child, 5000);
  }
  return { name: 'qemu-nbd stopped and started on another socket over one raw file', rounds: PEER_ROUNDS, clientPauseMs: spread(pause) };
}
