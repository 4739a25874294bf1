/**
 * Volumes per host and per cluster (issue 21): volumes are created and attached in one
 * growing population; at each size the figures are taken over everything created so far.
 *
 * - Host: one `mooring data-engine` process, 1-replica volumes attached there, each with an
 *   NBD export and one NBD client connected to it; create and attach times of the volumes
 *   added since the last size, listVolumes, status of one volume, and the process's threads,
 *   fds and RSS with every client connected.
 * - Cluster: three `mooring data-engine` processes, a file state store and the control loop
 *   at its default interval; 3-replica volumes attached round-robin. listVolumes, one full
 *   control-loop pass (Mooring.repairOnce), the embedding process's CPU with every volume
 *   idle, attach p99.
 */
import { join } from 'node:path';

import { Mooring } from '../../mooring.js';
import { FileStateStore } from '../../state/file-state-store.js';
import { MemoryStateStore } from '../../state/memory-state-store.js';
import { spread } from '../migration.js';
import { NbdClient } from '../nbd-client.js';
import { BenchError, sleep } from '../processes.js';
import { startBenchHost, type BenchHost } from '../remote-hosts.js';
import type { TargetContext } from '../targets.js';
import { columns, errorCode, growCurve, processFootprint, timeMs, type ScaleCurve, type ScaleFigures } from './curve.js';

/** Small volumes: their size does not matter to the control plane, only their number. */
const VOLUME_BYTES = 16 * 1024 ** 2;
/** Replica ports: 0 = any free one (the data engine reports the port it got). */
const ANY_PORT = 0;

export interface VolumeCurveSettings {
  sizes: readonly number[];
  stepTimeoutMs: number;
  /** Seconds the cluster's CPU is sampled with every volume idle. */
  idleCpuSec: number;
}

function volumeName(i: number): string {
  return `v${String(i).padStart(5, '0')}`;
}

/** Creates and attaches volumes previous..size-1; returns the create and attach times (ms). */
async function addVolumes(
  m: Mooring,
  previous: number,
  size: number,
  replicas: number,
  hostOf: (i: number) => string,
  ctx: TargetContext,
  nbdSocket?: (i: number) => string,
): Promise<{ create: number[]; attach: number[] }> {
  const create: number[] = [];
  const attach: number[] = [];
  for (let i = previous; i < size; i++) {
    if (ctx.abort.aborted) throw ctx.abort.reason;
    let what = 'creating';
    try {
      let t0 = performance.now();
      const v = await m.createVolume({ name: volumeName(i), sizeBytes: VOLUME_BYTES, replicas, ...(replicas === 1 ? { hosts: [hostOf(i)] } : {}) });
      create.push(performance.now() - t0);
      what = `attaching on ${hostOf(i)}`;
      t0 = performance.now();
      await v.attach({ host: hostOf(i), ...(nbdSocket ? { nbd: `unix:${nbdSocket(i)}` } : {}) });
      attach.push(performance.now() - t0);
    } catch (err) {
      // The code stays the error's; the message says which volume of how many.
      throw new BenchError(errorCode(err), `${what} volume ${i + 1} of ${size} (${volumeName(i)}): ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  return { create, attach };
}

export async function measureHostCurve(ctx: TargetContext, settings: VolumeCurveSettings): Promise<ScaleCurve> {
  let host: BenchHost | undefined;
  let m: Mooring | undefined;
  const clients: NbdClient[] = [];
  try {
    host = await startBenchHost(ctx, 0, ANY_PORT);
    const pid = host.child.pid!;
    const socket = (i: number): string => join(ctx.dir, `${volumeName(i)}.sock`);
    m = await Mooring.open({ store: new MemoryStateStore(), hosts: [host.engine], repairIntervalMs: 0 });
    const cluster = m;
    const points = await growCurve(settings.sizes, settings.stepTimeoutMs, ctx.log, ctx.abort, async (size, previous): Promise<ScaleFigures> => {
      const { create, attach } = await addVolumes(cluster, previous, size, 1, () => 'h0', ctx, socket);
      // One client per volume, each past its handshake (a read answered): the footprint
      // below counts one open NBD connection per volume.
      for (let i = previous; i < size; i++) {
        const c = await NbdClient.connect(`nbd+unix:///?socket=${socket(i)}`);
        clients.push(c);
        await c.read(0, 4096);
      }
      const a = spread(attach);
      const listMs = await timeMs(() => cluster.listVolumes(), 3);
      const statusMs = await timeMs(() => cluster.volume(volumeName(0)).status(), 5);
      const fp = processFootprint(pid);
      return { createMs: spread(create).median, attachP50Ms: a.median, attachP99Ms: a.p99, listMs, statusMs, ...fp };
    });
    return {
      id: 'host',
      title: 'Volumes per host',
      sizeLabel: 'volumes',
      method:
        'One `mooring data-engine` process; a control plane in the bench process (memory state store, no control loop) creates 1-replica ' +
        `${VOLUME_BYTES / 1024 ** 2} MiB volumes on it and attaches each with an NBD export on a unix socket, then connects one NBD client to each (a 4 KiB read answered). Create and attach are the ` +
        'median and p99 of the volumes added since the previous size; `listVolumes` is the median of 3 calls, the status of one volume of 5; ' +
        'threads (`/proc/PID/task`), fds (`/proc/PID/fd`) and RSS are the data-engine process\'s with every volume attached and every client connected.',
      columns: columns(['createMs', 'create ms (median)', 1], ['attachP50Ms', 'attach p50 ms', 1], ['attachP99Ms', 'attach p99 ms', 1], ['listMs', 'listVolumes ms', 1], ['statusMs', 'status ms', 2], ['threads', 'threads', 0], ['fds', 'fds', 0], ['rssMiB', 'RSS MiB', 1]),
      points,
    };
  } finally {
    for (const c of clients) c.destroy();
    await m?.close().catch(() => undefined);
    await host?.stop().catch(() => undefined);
  }
}

export async function measureClusterCurve(ctx: TargetContext, settings: VolumeCurveSettings): Promise<ScaleCurve> {
  const hosts: BenchHost[] = [];
  let m: Mooring | undefined;
  let store: FileStateStore | undefined;
  try {
    for (let i = 0; i < 3; i++) hosts.push(await startBenchHost(ctx, i, ANY_PORT));
    store = await FileStateStore.open(join(ctx.dir, 'state'));
    // The control loop runs at its default interval, as an embedder's does.
    m = await Mooring.open({ store, hosts: hosts.map((h) => h.engine) });
    const cluster = m;
    const points = await growCurve(settings.sizes, settings.stepTimeoutMs, ctx.log, ctx.abort, async (size, previous): Promise<ScaleFigures> => {
      const { attach } = await addVolumes(cluster, previous, size, 3, (i) => `h${i % 3}`, ctx);
      const listMs = await timeMs(() => cluster.listVolumes(), 3);
      const passMs = await timeMs(() => cluster.repairOnce());
      const before = process.cpuUsage();
      const t0 = performance.now();
      await sleep(settings.idleCpuSec * 1000, ctx.abort);
      const used = process.cpuUsage(before);
      const idleCpuPct = ((used.user + used.system) / 1000 / (performance.now() - t0)) * 100;
      return { listMs, passMs, idleCpuPct, attachP99Ms: spread(attach).p99 };
    });
    return {
      id: 'cluster',
      title: 'Volumes per cluster',
      sizeLabel: 'volumes',
      method:
        'Three `mooring data-engine` processes on loopback; a control plane in the bench process over a file state store, its control loop at ' +
        `the default interval, creates 3-replica ${VOLUME_BYTES / 1024 ** 2} MiB volumes and attaches them round-robin on the three hosts. ` +
        '`listVolumes` is the median of 3 calls (a single call may meet the control loop\'s pass); the pass is one full control-loop pass (`Mooring.repairOnce()`: every attachment reconciled, every attached ' +
        `volume repaired, evictions, backing images); idle CPU is the bench process's user+system time (\`process.cpuUsage\`) over ${settings.idleCpuSec} s with every volume ` +
        'idle, in % of one core (the control loop, the gRPC clients and the file store all run in it); attach p99 is over the volumes added since the previous size.',
      columns: columns(['listMs', 'listVolumes ms', 1], ['passMs', 'full pass ms', 1], ['idleCpuPct', 'idle CPU % of a core', 1], ['attachP99Ms', 'attach p99 ms', 1]),
      points,
    };
  } finally {
    await m?.close().catch(() => undefined);
    await store?.close().catch(() => undefined);
    for (const h of hosts) await h.stop().catch(() => undefined);
  }
}
