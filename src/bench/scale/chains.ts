/**
 * Snapshot chain depth (issue 21): one 1-replica volume is written whole, then grown a
 * snapshot at a time, each followed by one 4 KiB write into the new head at a spread-out
 * offset; a flat volume gets the same writes without snapshots, so both hold the same data.
 * Most blocks live in the bottom layer: a read that walked the chain would cost the most.
 * At each depth fio reads 4 KiB at random (qd16) from both, in alternated rounds.
 */
import { join } from 'node:path';

import { Mooring } from '../../mooring.js';
import { MemoryStateStore } from '../../state/memory-state-store.js';
import { prewriteJob, runFio, workloadJob } from '../fio.js';
import { spread } from '../migration.js';
import { NbdClient } from '../nbd-client.js';
import { startBenchHost, type BenchHost } from '../remote-hosts.js';
import type { Endpoint, TargetContext } from '../targets.js';
import { workloadById } from '../workloads.js';
import { growCurve, processFootprint, columns, type ScaleCurve, type ScaleFigures } from './curve.js';

const BLOCK = 4096;
/** Snapshot times reported at a depth: the last this many taken to reach it. */
const SNAPSHOT_SAMPLES = 10;
const READ_WORKLOAD = 'randread-4k-qd16-j1';
/** Rounds of reads at each depth (each flat, chained, chained, flat). */
const CHAIN_READ_ROUNDS = 3;

export interface ChainCurveSettings {
  depths: readonly number[];
  stepTimeoutMs: number;
  areaBytes: number;
  runtimeSec: number;
}

function nbd(socket: string): Endpoint {
  return { kind: 'nbd', uri: `nbd+unix:///?socket=${socket}` };
}

export async function measureChainCurve(ctx: TargetContext, settings: ChainCurveSettings): Promise<ScaleCurve> {
  let host: BenchHost | undefined;
  let m: Mooring | undefined;
  const clients: NbdClient[] = [];
  try {
    host = await startBenchHost(ctx, 0, 0);
    const pid = host.child.pid!;
    m = await Mooring.open({ store: new MemoryStateStore(), hosts: [host.engine], repairIntervalMs: 0 });
    const endpoints: Endpoint[] = [];
    for (const name of ['flat', 'chain']) {
      const v = await m.createVolume({ name, sizeBytes: settings.areaBytes, replicas: 1, hosts: ['h0'] });
      const socket = join(ctx.dir, `${name}.sock`);
      await v.attach({ host: 'h0', nbd: `unix:${socket}` });
      endpoints.push(nbd(socket));
      await runFio(prewriteJob(nbd(socket), settings.areaBytes), 'write', ctx.tracker, ctx.abort);
      clients.push(await NbdClient.connect(`nbd+unix:///?socket=${socket}`));
    }
    const [flat, chain] = clients as [NbdClient, NbdClient];
    const chained = m.volume('chain');
    const block = Buffer.alloc(BLOCK, 0x5a);
    const blocks = settings.areaBytes / BLOCK;
    const read = workloadById(READ_WORKLOAD);
    const points = await growCurve(settings.depths, settings.stepTimeoutMs, ctx.log, ctx.abort, async (depth, previous): Promise<ScaleFigures> => {
      const snapMs: number[] = [];
      for (let k = previous; k < depth; k++) {
        if (ctx.abort.aborted) throw ctx.abort.reason;
        const t0 = performance.now();
        await chained.createSnapshot(`s${k}`);
        snapMs.push(performance.now() - t0);
        // A prime stride spreads the writes over the whole area.
        const offset = ((k * 7919) % blocks) * BLOCK;
        await chain.write(offset, block);
        await flat.write(offset, block);
      }
      const job = (e: Endpoint) => workloadJob(read, e, settings.areaBytes, settings.runtimeSec, 0);
      // Rounds of flat, chained, chained, flat: a drift in the machine's load weighs on both
      // alike within a round, and the median of the rounds' ratios leaves out a round that met
      // a burst of other work (these machines are shared).
      const iops = async (e: Endpoint): Promise<number> => (await runFio(job(e), 'read', ctx.tracker, ctx.abort)).iops;
      const rounds: Array<{ flat: number; chain: number }> = [];
      for (let r = 0; r < CHAIN_READ_ROUNDS; r++) {
        const [f1, c1, c2, f2] = [await iops(endpoints[0]!), await iops(endpoints[1]!), await iops(endpoints[1]!), await iops(endpoints[0]!)];
        rounds.push({ flat: (f1 + f2) / 2, chain: (c1 + c2) / 2 });
      }
      const flatIops = spread(rounds.map((r) => r.flat)).median;
      const chainIops = spread(rounds.map((r) => r.chain)).median;
      const ratio = spread(rounds.map((r) => r.chain / r.flat)).median;
      const { fds } = processFootprint(pid);
      return {
        chainIops,
        flatIops,
        ratio,
        snapshotMs: snapMs.length > 0 ? spread(snapMs.slice(-SNAPSHOT_SAMPLES)).median : undefined,
        fds,
      };
    });
    return {
      id: 'depth',
      title: 'Snapshot chain depth',
      sizeLabel: 'depth (snapshots)',
      method:
        `Two 1-replica ${settings.areaBytes / 1024 ** 2} MiB volumes on one \`mooring data-engine\` process, each exported over NBD and written whole ` +
        '(fio 1 MiB sequential). The chained one is then grown one snapshot at a time, each followed by one 4 KiB write into the new head; the ' +
        'flat one gets the same writes without snapshots, so both hold the same data (nearly all of it in the chain\'s bottom layer). At each ' +
        `depth fio (nbd engine) reads 4 KiB at random, qd16, ${settings.runtimeSec} s a run, in ${CHAIN_READ_ROUNDS} rounds of flat, chained, chained, flat (so a drift in the ` +
        `machine's load weighs on both alike); a round's IOPS are each volume's mean of its two runs; the table gives the median over the rounds of each volume's IOPS and of the round's chained/flat ratio. Snapshot create is the median of the last ${SNAPSHOT_SAMPLES} snapshots taken to reach the depth; fds are the data-engine process's (both volumes).`,
      columns: columns(['chainIops', 'chained IOPS', 0], ['flatIops', 'flat IOPS', 0], ['ratio', 'chained/flat', 2], ['snapshotMs', 'snapshot create ms', 1], ['fds', 'fds', 0]),
      points,
    };
  } finally {
    for (const c of clients) c.destroy();
    await m?.close().catch(() => undefined);
    await host?.stop().catch(() => undefined);
  }
}
