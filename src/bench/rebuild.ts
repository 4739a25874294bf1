/**
 * Rebuild measurements: three `mooring data-engine` processes on loopback, an
 * engine on h0 with one replica on h1 (the rebuild source) and one on h0, the volume
 * filled through NBD.
 *
 * - Full rebuild: an empty replica on h2 is added; throughput = bytes sent / time, against
 *   the disk's own sequential write rate (fio, 1 MiB writes to a file, fsync at the end:
 *   a rebuild ends with an fdatasync too).
 * - Incremental rebuild: h2 is killed (SIGKILL), `changed` bytes of unique 4 KiB blocks are
 *   written while it is down, h2 restarts and its replica is re-added: bytes sent against
 *   bytes changed.
 */
import { rmSync } from 'node:fs';
import { join } from 'node:path';

import type { DataEngine } from '../data-engine/data-engine.js';
import { runFio, type FioJob } from './fio.js';
import { BenchError } from './processes.js';
import { startBenchHost, refOn, type BenchHost } from './remote-hosts.js';
import { createSparse, type TargetContext } from './targets.js';

/** Replica ports of the rebuild hosts (127.0.0.101.. on loopback; distinct from the remote target's). */
const REBUILD_PORT_OFFSET = 30;
/** Bytes of unique 4 KiB blocks written while the replica is down (capped at the area). */
const INCREMENTAL_CHANGED_BYTES = 64 * 1024 * 1024;

export interface RebuildResults {
  /** Bytes the volume holds (allocated on the source). */
  volumeBytes: number;
  full: { sentBytes: number; durationMs: number; mibPerSec: number };
  /** fio sequential write to a file on the same filesystem, fsync at the end. */
  diskSeqWriteMibPerSec: number;
  incremental: { changedBytes: number; sentBytes: number; durationMs: number };
}

async function fill(ctx: TargetContext, uri: string, areaBytes: number): Promise<void> {
  const job: FioJob = { name: 'fill', endpoint: { kind: 'nbd', uri }, options: ['rw=write', 'bs=1M', 'iodepth=8', 'numjobs=1', `size=${areaBytes}`], expectedSec: 600 };
  await runFio(job, 'write', ctx.tracker, ctx.abort);
}

/** Measures full and incremental rebuilds; every host is stopped when it returns or throws. */
export async function measureRebuild(ctx: TargetContext): Promise<RebuildResults> {
  const hosts: BenchHost[] = [];
  try {
    for (let i = 0; i < 3; i++) hosts.push(await startBenchHost(ctx, i, ctx.portBase + REBUILD_PORT_OFFSET + i));
    const [h0, h1, h2] = hosts as [BenchHost, BenchHost, BenchHost];
    const size = ctx.areaBytes;
    await h1.engine.createReplica('rb-r0', size);
    // A second replica, on the engine's host: with r1 it makes three, so the volume keeps a
    // majority (and serves) while h2 is down (docs/single-writer.md). r0 stays the first RW
    // replica, so the rebuilds read from h1 over TCP as before.
    await h0.engine.createReplica('rb-r2', size);
    const socket = join(ctx.dir, 'nbd.sock');
    // The bench's own new replicas: the first and only engine over them gets epoch 1.
    const info = await h0.engine.startEngine({ volume: 'rb', replicas: [refOn(h1, 'r0', 'rb-r0'), refOn(h0, 'r2', 'rb-r2')], nbd: `unix:${socket}`, epoch: 1 });
    const uri = info.nbd!.uri;
    await fill(ctx, uri, size);
    ctx.log(`  filled ${size / 1024 ** 2} MiB through NBD`);

    // Full rebuild into an empty replica on h2.
    await h2.engine.createReplica('rb-r1', size);
    const full = await h0.engine.addReplica('rb', refOn(h2, 'r1', 'rb-r1'));
    const mibPerSec = full.sentBytes / 1024 ** 2 / (full.durationMs / 1000);
    ctx.log(`  full rebuild: ${(full.sentBytes / 1024 ** 2).toFixed(0)} MiB in ${(full.durationMs / 1000).toFixed(2)} s = ${mibPerSec.toFixed(0)} MiB/s`);

    // The disk's own sequential write rate, for comparison.
    const seq = { mibPerSec: await diskSeqWriteMibPerSec(ctx, size) };
    ctx.log(`  disk sequential write: ${seq.mibPerSec.toFixed(0)} MiB/s`);

    // Incremental: h2 dies, unique blocks change, h2 comes back.
    await h2.crash();
    const changed = Math.min(INCREMENTAL_CHANGED_BYTES, size / 2);
    await runFio(
      {
        name: 'changes-while-down',
        endpoint: { kind: 'nbd', uri },
        // A random map (the default) makes every 4 KiB block written at most once.
        options: ['rw=randwrite', 'bs=4k', 'iodepth=16', 'numjobs=1', `size=${size}`, `io_size=${changed}`, 'randrepeat=1'],
        expectedSec: 600,
      },
      'write',
      ctx.tracker,
      ctx.abort,
    );
    const completed = rebuildCompleted(h0.engine, 'rb', 'r1');
    const back = await startBenchHost(ctx, 2, ctx.portBase + REBUILD_PORT_OFFSET + 2);
    hosts[2] = back;
    // The engine's data engine re-adds a replica whose host came back by itself; asking as
    // well is harmless (a second request for the same replica is refused while one runs).
    await h0.engine.addReplica('rb', refOn(back, 'r1', 'rb-r1')).catch(() => undefined);
    const inc = await completed;
    ctx.log(`  incremental rebuild: ${(changed / 1024 ** 2).toFixed(0)} MiB changed, ${(inc.sentBytes / 1024 ** 2).toFixed(1)} MiB sent (${(inc.sentBytes / changed).toFixed(2)}x)`);
    await h0.engine.stopEngine('rb');
    return {
      volumeBytes: size,
      full: { sentBytes: full.sentBytes, durationMs: full.durationMs, mibPerSec },
      diskSeqWriteMibPerSec: seq.mibPerSec,
      incremental: { changedBytes: changed, sentBytes: inc.sentBytes, durationMs: inc.durationMs },
    };
  } finally {
    for (const h of hosts.reverse()) await h.stop().catch(() => undefined);
  }
}

/** fio sequential 1 MiB writes of `sizeBytes` to a file in the scratch directory, fsync at the end (a rebuild or a copy ends with one too). */
export async function diskSeqWriteMibPerSec(ctx: TargetContext, sizeBytes: number): Promise<number> {
  const file = join(ctx.dir, 'seq.raw');
  createSparse(file, sizeBytes);
  const seq = await runFio(
    { name: 'disk-seq-write', endpoint: { kind: 'file', path: file, direct: false }, options: ['rw=write', 'bs=1M', 'iodepth=8', 'numjobs=1', `size=${sizeBytes}`, 'end_fsync=1'], expectedSec: 600 },
    'write',
    ctx.tracker,
    ctx.abort,
  );
  rmSync(file, { force: true });
  return seq.mibPerSec;
}

/** Longest wait for the incremental rebuild to finish. */
const REBUILD_WAIT_MS = 600_000;

/** Resolves with the figures of the next rebuild-completed event of `replicaId`; rejects on rebuild-failed or after REBUILD_WAIT_MS. */
function rebuildCompleted(engine: DataEngine, volume: string, replicaId: string): Promise<{ sentBytes: number; durationMs: number }> {
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      unwatch();
      reject(new BenchError('BENCH_TARGET_FAILED', `no rebuild of ${replicaId} completed within ${REBUILD_WAIT_MS / 1000} s`));
    }, REBUILD_WAIT_MS);
    const unwatch = engine.watch((e) => {
      if (!('replicaId' in e) || e.volume !== volume || e.replicaId !== replicaId) return;
      if (e.type === 'rebuild-completed') {
        clearTimeout(timer);
        unwatch();
        resolve({ sentBytes: e.sentBytes, durationMs: Date.now() - started });
      } else if (e.type === 'rebuild-failed') {
        // The self-repair retries; only the deadline ends the wait.
      }
    });
  });
}
