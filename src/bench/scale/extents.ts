/**
 * Extents (issue 21): one 1-replica volume written every other 4 KiB block, so each write is
 * an extent of its own, grown to each size; at each size the volume is detached and
 * attached again (its replica reopened, the extent index rebuilt from the layer file) and
 * the data-engine process's RSS is read against its RSS with the volume empty.
 */
import { join } from 'node:path';

import { Mooring } from '../../mooring.js';
import { MemoryStateStore } from '../../state/memory-state-store.js';
import { runFio, type FioJob } from '../fio.js';
import { startBenchHost, type BenchHost } from '../remote-hosts.js';
import type { Endpoint, TargetContext } from '../targets.js';
import { growCurve, processFootprint, timeMs, columns, type ScaleCurve, type ScaleFigures } from './curve.js';

const BLOCK = 4096;
/** One written block, one hole: every write its own extent. */
const STRIDE = 2 * BLOCK;
/** A generous bound on fio's time for a million 4 KiB writes on a slow disk. */
const WRITE_SEC_PER_MILLION = 1200;

export interface ExtentCurveSettings {
  sizes: readonly number[];
  stepTimeoutMs: number;
}

/** Writes extents [from, to): one 4 KiB block every STRIDE bytes. */
function extentsJob(endpoint: Endpoint, from: number, to: number): FioJob {
  return {
    name: 'extents',
    endpoint,
    options: [`rw=write:${STRIDE - BLOCK}`, `bs=${BLOCK}`, 'iodepth=16', 'numjobs=1', `offset=${from * STRIDE}`, `size=${(to - from) * STRIDE}`],
    expectedSec: Math.ceil(((to - from) / 1e6) * WRITE_SEC_PER_MILLION) + 60,
  };
}

export async function measureExtentCurve(ctx: TargetContext, settings: ExtentCurveSettings): Promise<ScaleCurve> {
  let host: BenchHost | undefined;
  let m: Mooring | undefined;
  try {
    host = await startBenchHost(ctx, 0, 0);
    const pid = host.child.pid!;
    m = await Mooring.open({ store: new MemoryStateStore(), hosts: [host.engine], repairIntervalMs: 0 });
    const largest = Math.max(...settings.sizes);
    const v = await m.createVolume({ name: 'extents', sizeBytes: largest * STRIDE, replicas: 1, hosts: ['h0'] });
    const socket = join(ctx.dir, 'extents.sock');
    const attach = () => v.attach({ host: 'h0', nbd: `unix:${socket}` });
    await attach();
    // The baseline after a reopen too, as every figure below is.
    await v.detach({ host: 'h0' });
    await attach();
    const emptyRss = processFootprint(pid).rssMiB;
    const endpoint: Endpoint = { kind: 'nbd', uri: `nbd+unix:///?socket=${socket}` };
    const points = await growCurve(settings.sizes, settings.stepTimeoutMs, ctx.log, ctx.abort, async (size, previous): Promise<ScaleFigures> => {
      await runFio(extentsJob(endpoint, previous, size), 'write', ctx.tracker, ctx.abort);
      await v.detach({ host: 'h0' });
      const reopenMs = await timeMs(attach);
      const rssMiB = processFootprint(pid).rssMiB;
      return { reopenMs, rssMiB, rssBytesPerExtent: ((rssMiB - emptyRss) * 1024 ** 2) / size };
    });
    return {
      id: 'extents',
      title: 'Extents',
      sizeLabel: 'extents',
      method:
        'One 1-replica volume on one `mooring data-engine` process, exported over NBD; fio writes one 4 KiB block every 8 KiB (`rw=write:4k`, qd16), ' +
        'so each write is an extent of its own, up to each size. Then the volume is detached and attached again: reopen is the attach (the replica ' +
        'opened and its extent index rebuilt from the layer file). RSS is the data-engine process\'s after the reopen; per extent is its growth over the ' +
        'RSS with the volume empty after a reopen of its own, divided by the extents (at small sizes this is noise: the allocator keeps and returns memory in larger pieces).',
      columns: columns(['reopenMs', 'reopen ms', 1], ['rssMiB', 'RSS MiB', 1], ['rssBytesPerExtent', 'RSS bytes per extent', 1]),
      points,
    };
  } finally {
    await m?.close().catch(() => undefined);
    await host?.stop().catch(() => undefined);
  }
}
