/**
 * Starting and stopping what fio measures: `mooring serve`, qemu-nbd, or a plain file.
 */
import type { ChildProcess } from 'node:child_process';
import { closeSync, ftruncateSync, openSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import {
  BenchError,
  TailBuffer,
  sleep,
  stopChild,
  type ProcessTracker,
} from './processes.js';
import type { ReadyInfo } from '../cli/serve.js';
import { refOn, startBenchHost, type BenchHost } from './remote-hosts.js';
import { startNbdkit, startQemuNbdTcp, startQuorum } from './peers.js';
import type { TargetId } from './target-ids.js';

export type { ReadyInfo };

/**
 * Where fio sends its I/O. `preload` (NBD over TCP) is a shared object fio runs with in
 * LD_PRELOAD: the TCP_NODELAY shim, so that the client side of a TCP peer gets what its server gets.
 */
export type Endpoint =
  | { kind: 'nbd'; uri: string; preload?: string }
  | { kind: 'file'; path: string; direct: boolean };

/** One process serving a target, named for the cost table (e.g. 'engine host', 'replica h1'). */
export interface ServerProcess {
  name: string;
  pid: number;
}

/** A started target; `stop()` ends its processes (if any). Files are removed with the scratch dir. */
export interface RunningTarget {
  id: TargetId;
  endpoint: Endpoint;
  /**
   * Every process serving it, the one fio talks to first: CPU, switches and syscalls are
   * summed over all of them, RSS too. Empty for the file targets (fio does the I/O itself).
   */
  processes: ServerProcess[];
  /** Ends the target; `graceMs` overrides how long a server may take to drain and flush. */
  stop(graceMs?: number): Promise<void>;
}

/** How long a server may take to come up (a 3-replica create writes metadata thrice). */
const START_TIMEOUT_MS = 60_000;
/** SIGTERM grace: Mooring drains and fdatasyncs up to a few GiB of page cache on exit. */
const STOP_GRACE_MS = 60_000;
/** Poll interval while waiting for qemu-nbd's socket. */
const PROBE_INTERVAL_MS = 50;
/** Longest unix socket path (sun_path is 108 bytes including the NUL). */
const UNIX_PATH_MAX = 107;
const STDERR_TAIL_CHARS = 4000;

export interface TargetContext {
  tracker: ProcessTracker;
  abort: AbortSignal;
  /** This target's own empty directory inside the scratch dir. */
  dir: string;
  areaBytes: number;
  /** Absolute path of dist/cli.js (only the Mooring targets need it). */
  mooringCli: string | undefined;
  /** Verbose progress lines go here. */
  log: (line: string) => void;
  /** First TCP port of the run (--port-base): every step listens on fixed offsets from it. */
  portBase: number;
}

function checkSocketPath(path: string): void {
  if (Buffer.byteLength(path) > UNIX_PATH_MAX) {
    throw new BenchError(
      'INVALID_ARGUMENT',
      `socket path ${path} is longer than ${UNIX_PATH_MAX} bytes; use a shorter --dir`,
    );
  }
}

/** Creates (or empties) a sparse file of `sizeBytes`. */
export function createSparse(path: string, sizeBytes: number): void {
  const fd = openSync(path, 'w');
  try {
    ftruncateSync(fd, sizeBytes);
  } finally {
    closeSync(fd);
  }
}

function exitText(child: ChildProcess): string {
  return child.signalCode ? `was killed by ${child.signalCode}` : `exited with code ${child.exitCode}`;
}

/** Starts one target. */
export async function startTarget(id: TargetId, ctx: TargetContext): Promise<RunningTarget> {
  switch (id) {
    case 'mooring-1':
      return startMooring(id, 1, ctx.areaBytes, ctx);
    case 'mooring-3':
      return startMooringEngine(id, 'local', ctx);
    case 'mooring-3-remote':
      return startMooringEngine(id, 'remote', ctx);
    case 'mooring-3-mixed':
      return startMooringEngine(id, 'mixed', ctx);
    case 'qemu-raw':
      return startQemuNbd(id, 'raw', false, ctx);
    case 'qemu-qcow2':
      return startQemuNbd(id, 'qcow2', false, ctx);
    case 'qemu-raw-nocache':
      return startQemuNbd(id, 'raw', true, ctx);
    case 'nbdkit-file':
      return startNbdkit(id, ctx);
    case 'qemu-nbd-tcp':
      return startQemuNbdTcp(id, ctx);
    case 'qemu-quorum':
      return startQuorum(id, ctx);
    case 'file-buffered':
    case 'file-direct': {
      const path = join(ctx.dir, 'disk.raw');
      // Created at full size up front; the pre-write pass then fills it.
      createSparse(path, ctx.areaBytes);
      return {
        id,
        endpoint: { kind: 'file', path, direct: id === 'file-direct' },
        processes: [],
        stop: async () => {},
      };
    }
  }
}

/**
 * Starts `node CLI serve` on a fresh directory (one host, one replica) and waits for its
 * READY line. Exported for the RSS measurement, which serves a 1 TiB volume.
 */
export async function startMooring(
  id: TargetId,
  replicas: number,
  sizeBytes: number,
  ctx: TargetContext,
): Promise<RunningTarget> {
  if (!ctx.mooringCli) throw new BenchError('BENCH_NOT_BUILT', 'no Mooring CLI to serve with');
  const volumeDir = join(ctx.dir, 'volume');
  const socket = join(ctx.dir, 'nbd.sock');
  checkSocketPath(socket);
  const args = [
    ctx.mooringCli,
    'serve',
    '--dir', volumeDir,
    '--size', String(sizeBytes),
    '--replicas', String(replicas),
    '--nbd', `unix:${socket}`,
  ];
  ctx.log(`  start: node ${args.join(' ')}`);
  const child = ctx.tracker.spawn(process.execPath, args);
  const stderr = new TailBuffer(STDERR_TAIL_CHARS);
  child.stderr?.setEncoding('utf8').on('data', (d: string) => stderr.push(d));

  const ready = await waitForReady<ReadyInfo>(child, stderr, `mooring serve (${id})`, ctx, (info) => typeof info.uri === 'string');

  if (ready.replicas !== replicas || ready.sizeBytes !== sizeBytes) {
    await stopChild(child, STOP_GRACE_MS);
    throw new BenchError(
      'BENCH_TARGET_FAILED',
      `mooring serve reported ${ready.replicas} replicas / ${ready.sizeBytes} bytes, expected ${replicas} / ${sizeBytes}`,
    );
  }
  ctx.log(`  ready: ${ready.uri}`);
  return {
    id,
    endpoint: { kind: 'nbd', uri: ready.uri },
    processes: [{ name: 'mooring serve', pid: child.pid! }],
    stop: async (graceMs = STOP_GRACE_MS) => {
      await stopChild(child, graceMs);
      if (child.exitCode !== 0 && child.exitCode !== null) {
        ctx.log(`  warning: mooring serve (${id}) exited with code ${child.exitCode} on SIGTERM; stderr:\n${stderr}`);
      } else if (child.signalCode === 'SIGKILL') {
        ctx.log(`  warning: mooring serve (${id}) did not exit within ${graceMs / 1000} s of SIGTERM; killed`);
      }
    },
  };
}

/**
 * Replica ports of the 3-replica targets' hosts (127.0.0.101.. on loopback), from --port-base:
 * the targets run at once, so each has its own (the peers use offsets 4 to 7).
 */
const PORT_OFFSET = { remote: 0, local: 8, mixed: 9 } as const;
/** Data-engine processes of each 3-replica target (the engine's host first). */
const HOSTS_OF = { remote: 4, local: 1, mixed: 3 } as const;

/**
 * Three replicas under one engine, run by `mooring data-engine` processes on loopback: the
 * engine on h0 and its replicas either on h0 too (`local`: three replica directories on the
 * engine's host, the fan-out without a network), on h1..h3 (`remote`: every replica reached
 * over TCP, the replica protocol), or one on h0 and two on h1, h2 (`mixed`: the usual layout,
 * where reads stay on the engine's host); exported over NBD by h0.
 */
async function startMooringEngine(id: TargetId, where: 'local' | 'remote' | 'mixed', ctx: TargetContext): Promise<RunningTarget> {
  const hosts: BenchHost[] = [];
  const stopAll = async (): Promise<void> => {
    for (const h of hosts.reverse()) await h.stop();
  };
  try {
    for (let i = 0; i < HOSTS_OF[where]; i++) hosts.push(await startBenchHost(ctx, i, ctx.portBase + PORT_OFFSET[where] + i));
    const engineHost = hosts[0]!;
    const replicaHosts = where === 'local' ? [engineHost, engineHost, engineHost] : where === 'mixed' ? hosts : hosts.slice(1);
    const refs = [];
    for (const [i, h] of replicaHosts.entries()) {
      await h.engine.createReplica(`bench-r${i}`, ctx.areaBytes);
      refs.push(h === engineHost ? { id: `r${i}`, hostId: h.hostId, name: `bench-r${i}`, address: null } : refOn(h, `r${i}`, `bench-r${i}`));
    }
    const socket = join(ctx.dir, 'nbd.sock');
    checkSocketPath(socket);
    // The bench's own new replicas: the first and only engine over them gets epoch 1.
    const info = await engineHost.engine.startEngine({ volume: 'bench', replicas: refs, nbd: `unix:${socket}`, epoch: 1 });
    if (!info.nbd || info.replicas.some((r) => r.mode !== 'RW')) {
      throw new BenchError('BENCH_TARGET_FAILED', `remote engine did not start healthy: ${JSON.stringify(info)}`);
    }
    ctx.log(`  ready: ${info.nbd.uri} (engine on ${engineHost.hostId}, replicas on ${replicaHosts.map((h) => h.hostId).join(', ')})`);
    return {
      id,
      endpoint: { kind: 'nbd', uri: info.nbd.uri },
      // Each host once (the local variant's replicas live in the engine's process).
      processes: hosts.map((h, i) => ({ name: i === 0 ? `engine host ${h.hostId}` : `replica host ${h.hostId}`, pid: h.child.pid! })),
      stop: async () => {
        await engineHost.engine.stopEngine('bench').catch((err: unknown) => ctx.log(`  warning: stopping the remote engine: ${String(err)}`));
        await stopAll();
      },
    };
  } catch (err) {
    await stopAll();
    throw err;
  }
}

/**
 * Waits for the `READY {json}` line a Mooring CLI process (serve, data-engine) prints when it
 * serves; stops the child and throws BENCH_TARGET_FAILED if it exits, times out or prints
 * something malformed. `valid` checks the parsed object.
 */
export async function waitForReady<T>(
  child: ChildProcess,
  stderr: TailBuffer,
  label: string,
  ctx: Pick<TargetContext, 'abort'>,
  valid: (info: T) => boolean,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let pending = '';
    let settled = false;
    const finish = (err: unknown, info?: T): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      ctx.abort.removeEventListener('abort', onAbort);
      if (err) reject(err);
      else resolve(info!);
    };
    const onAbort = (): void => finish(ctx.abort.reason);
    const timer = setTimeout(
      () => finish(new BenchError('BENCH_TARGET_FAILED', `${label} printed no READY line within ${START_TIMEOUT_MS / 1000} s; stderr:\n${stderr}`)),
      START_TIMEOUT_MS,
    );
    ctx.abort.addEventListener('abort', onAbort, { once: true });
    child.once('error', (err) => finish(new BenchError('BENCH_TARGET_FAILED', `cannot start ${label}: ${err.message}`)));
    child.once('exit', () => {
      // Give stderr's last chunk a moment to arrive before reporting it.
      setTimeout(() => finish(new BenchError('BENCH_TARGET_FAILED', `${label} ${exitText(child)} before READY; stderr:\n${stderr}`)), 50);
    });
    child.stdout?.setEncoding('utf8').on('data', (d: string) => {
      pending += d;
      let nl: number;
      while ((nl = pending.indexOf('\n')) >= 0) {
        const line = pending.slice(0, nl).trim();
        pending = pending.slice(nl + 1);
        if (!line.startsWith('READY ')) continue;
        try {
          const info = JSON.parse(line.slice('READY '.length)) as T;
          if (!valid(info)) throw new Error('unexpected fields');
          finish(undefined, info);
        } catch (err) {
          finish(new BenchError('BENCH_TARGET_FAILED', `${label} printed a malformed READY line: ${line} (${String(err)})`));
        }
      }
      // Anything after READY is not part of the contract; do not accumulate it.
      if (settled) pending = '';
    });
  }).catch(async (err: unknown) => {
    await stopChild(child, 5_000);
    throw err;
  });
}

/** Where an NBD server listens: a unix socket or a TCP address. */
export type NbdAddress = { path: string } | { host: string; port: number };

/** The URI fio (libnbd) connects to for `addr`, default export. */
export function nbdUri(addr: NbdAddress): string {
  return 'path' in addr ? `nbd+unix:///?socket=${addr.path}` : `nbd://${addr.host}:${addr.port}/`;
}

/** Connects to `addr` and resolves true once the NBD greeting ('NBDMAGIC') arrives. */
function probeNbd(addr: NbdAddress): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(addr);
    let got = '';
    const done = (ok: boolean): void => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(2_000, () => done(false));
    sock.on('error', () => done(false));
    sock.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      if (got.length >= 8) done(got.startsWith('NBDMAGIC'));
    });
    sock.on('end', () => done(false));
  });
}

async function startQemuNbd(
  id: TargetId,
  format: 'raw' | 'qcow2',
  noCache: boolean,
  ctx: TargetContext,
): Promise<RunningTarget> {
  const image = join(ctx.dir, `disk.${format}`);
  if (format === 'raw') {
    createSparse(image, ctx.areaBytes);
  } else {
    const r = await ctx.tracker.run('qemu-img', ['create', '-q', '-f', 'qcow2', image, String(ctx.areaBytes)], ctx.abort);
    if (r.code !== 0) throw new BenchError('BENCH_TARGET_FAILED', `qemu-img create failed (${r.code}): ${r.stderr}`);
  }
  return { id, ...(await serveQemuNbd(id, image, format, noCache ? ['--cache=none', '--aio=native'] : [], ctx)) };
}

/**
 * Serves an existing image with qemu-nbd on `ctx.dir/nbd.sock` (writeback cache unless
 * `extraArgs` say otherwise) and waits until it accepts NBD connections. `label` names it
 * in messages. Used by the qemu targets and by the backing-image comparison (`-r`).
 */
export async function serveQemuNbd(
  label: string,
  image: string,
  format: 'raw' | 'qcow2',
  extraArgs: string[],
  ctx: TargetContext,
): Promise<Omit<RunningTarget, 'id'>> {
  const socket = join(ctx.dir, 'nbd.sock');
  checkSocketPath(socket);
  // -t: keep serving after a client disconnects; -e 8: fio numjobs=4 opens 4 connections.
  return serveNbd(label, 'qemu-nbd', ['-f', format, '-t', '-e', '8', '-k', socket, ...extraArgs, image], { path: socket }, ctx);
}

/**
 * Starts an NBD server (`command args`, optionally with `env` added) and waits until `addr`
 * greets with NBDMAGIC; a server that exits or stays silent for a minute fails the target.
 */
export async function serveNbd(
  label: string,
  command: string,
  args: string[],
  addr: NbdAddress,
  ctx: TargetContext,
  env: Record<string, string> = {},
): Promise<Omit<RunningTarget, 'id'>> {
  if ('path' in addr) checkSocketPath(addr.path);
  const envText = Object.entries(env).map(([k, v]) => `${k}=${v} `).join('');
  ctx.log(`  start: ${envText}${command} ${args.join(' ')}`);
  const child = ctx.tracker.spawn(command, args, Object.keys(env).length > 0 ? { env: { ...process.env, ...env } } : {});
  const stderr = new TailBuffer(STDERR_TAIL_CHARS);
  child.stderr?.setEncoding('utf8').on('data', (d: string) => stderr.push(d));
  child.stdout?.resume();
  let spawnError: Error | undefined;
  child.once('error', (err) => {
    spawnError = err;
  });

  const deadline = Date.now() + START_TIMEOUT_MS;
  try {
    for (;;) {
      if (spawnError) {
        throw new BenchError(
          (spawnError as NodeJS.ErrnoException).code === 'ENOENT' ? 'BENCH_TOOL_MISSING' : 'BENCH_TARGET_FAILED',
          `cannot start ${command}: ${spawnError.message}`,
        );
      }
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new BenchError('BENCH_TARGET_FAILED', `${command} (${label}) ${exitText(child)}; stderr:\n${stderr}`);
      }
      if (await probeNbd(addr)) break;
      if (Date.now() > deadline) {
        throw new BenchError('BENCH_TARGET_FAILED', `${command} (${label}) did not accept connections within ${START_TIMEOUT_MS / 1000} s; stderr:\n${stderr}`);
      }
      await sleep(PROBE_INTERVAL_MS, ctx.abort);
    }
  } catch (err) {
    await stopChild(child, 5_000);
    throw err;
  }
  const uri = nbdUri(addr);
  ctx.log(`  ready: ${uri}`);
  return {
    endpoint: { kind: 'nbd', uri },
    processes: [{ name: command, pid: child.pid! }],
    stop: async (graceMs = STOP_GRACE_MS) => {
      await stopChild(child, graceMs);
    },
  };
}
