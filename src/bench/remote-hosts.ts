/**
 * Several `mooring data-engine` processes on loopback, as hosts for the benchmark: the
 * 3-remote-replica target (an engine on one host, its three replicas on three others,
 * reached over TCP) and the rebuild measurements.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import type { DataEngine, EngineReplicaRef } from '../data-engine/data-engine.js';
import { processClusterSecret } from '../data-engine/cluster-secret.js';
import { RemoteDataEngine } from '../data-engine/grpc/remote-data-engine.js';
import { BenchError, TailBuffer, stopChild, waitForExit } from './processes.js';
import { waitForReady, type TargetContext } from './targets.js';

/** How long a data engine may take to drain and flush on SIGTERM. */
const STOP_GRACE_MS = 60_000;
const STDERR_TAIL_CHARS = 4000;
/** First loopback address used; host i listens on 127.0.0.(BASE + i). */
const LOOPBACK_BASE = 101;

interface DataEngineReady {
  hostId: string;
  replicaAddress: string | null;
}

/** One data-engine process and a gRPC client to it. */
export interface BenchHost {
  hostId: string;
  dir: string;
  child: ChildProcess;
  engine: DataEngine;
  replicaAddress: string | null;
  stderr: TailBuffer;
  /** SIGKILL (a crash); the client is closed. */
  crash(): Promise<void>;
  /** SIGTERM and wait (clean stop). */
  stop(): Promise<void>;
}

/** Starts host `hostId` in `dir` with its replica server on 127.0.0.(101 + index):port; `extraArgs` go to `mooring data-engine`. */
export async function startBenchHost(ctx: TargetContext, index: number, port: number, extraArgs: string[] = []): Promise<BenchHost> {
  if (!ctx.mooringCli) throw new BenchError('BENCH_NOT_BUILT', 'no Mooring CLI to start data engines with');
  const hostId = `h${index}`;
  const dir = join(ctx.dir, hostId);
  mkdirSync(dir, { recursive: true });
  const socket = join(dir, 'grpc.sock');
  // The bench's hosts and its own process share one cluster secret (this process's, which
  // its in-process engines use too), given to each data engine as a 0600 file.
  const secretFile = join(ctx.dir, 'cluster.secret');
  if (!existsSync(secretFile)) writeFileSync(secretFile, processClusterSecret(), { mode: 0o600 });
  const args = [
    ctx.mooringCli,
    'data-engine',
    '--dir',
    dir,
    '--host-id',
    hostId,
    '--listen',
    `unix:${socket}`,
    '--replica-listen',
    `tcp:127.0.0.${LOOPBACK_BASE + index}:${port}`,
    '--cluster-secret-file',
    secretFile,
    ...extraArgs,
  ];
  ctx.log(`  start: node ${args.join(' ')}`);
  const child = ctx.tracker.spawn(process.execPath, args);
  const stderr = new TailBuffer(STDERR_TAIL_CHARS);
  child.stderr?.setEncoding('utf8').on('data', (d: string) => stderr.push(d));
  const ready = await waitForReady<DataEngineReady>(child, stderr, `mooring data-engine (${hostId})`, ctx, (i) => i.hostId === hostId);
  let engine: DataEngine;
  try {
    engine = await RemoteDataEngine.connect({ address: `unix:${socket}`, timeoutMs: 60_000, clusterSecret: processClusterSecret() });
  } catch (err) {
    await stopChild(child, 5_000);
    throw new BenchError('BENCH_TARGET_FAILED', `cannot reach data engine ${hostId}: ${String(err)}`);
  }
  return {
    hostId,
    dir,
    child,
    engine,
    replicaAddress: ready.replicaAddress,
    stderr,
    crash: async () => {
      await engine.close().catch(() => undefined);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await waitForExit(child);
    },
    stop: async () => {
      await engine.close().catch(() => undefined);
      await stopChild(child, STOP_GRACE_MS);
    },
  };
}

/** A replica reference for an engine on another host. */
export function refOn(host: BenchHost, id: string, name: string): EngineReplicaRef {
  return { id, hostId: host.hostId, name, address: host.replicaAddress };
}
