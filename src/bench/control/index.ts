/**
 * The control-plane step of `mooring bench` (`--control`, issue 18): control operations per
 * second and their p50/p99 latency with the file store and with etcd.
 *
 * Two `mooring data-engine` processes on loopback and one etcd member (Debian etcd-server,
 * on loopback with its data in the scratch directory) serve three control planes in the
 * bench process, each with its own store: a FileStateStore, an EtcdStateStore, and an
 * EtcdStateStore under leadership (every write guarded by the leader's fencing token, as
 * several embedders run it). Each runs cycles of create, attach, snapshot, migrate (to the
 * other host, handed over and confirmed), detach and delete, one operation at a time, on
 * volumes of its own; the stores take turns cycle by cycle, so a burst of other load on a
 * shared machine weighs on all of them alike.
 */
import { join } from 'node:path';

import { Mooring } from '../../mooring.js';
import { FileStateStore } from '../../state/file-state-store.js';
import { EtcdStateStore } from '../../state/etcd-state-store.js';
import type { StateStore } from '../../state/state-store.js';
import { EtcdServer } from '../etcd-server.js';
import { spread } from '../migration.js';
import { BenchError } from '../processes.js';
import { startBenchHost, type BenchHost } from '../remote-hosts.js';
import type { TargetContext } from '../targets.js';
import { errorCode } from '../scale/curve.js';
import { CountingStore } from './counting-store.js';

/** The operations of a cycle, in the order they run. */
export const CONTROL_OPS = ['create', 'attach', 'snapshot', 'migrate', 'detach', 'delete'] as const;
export type ControlOp = (typeof CONTROL_OPS)[number];

/** The stores measured, in the report's order. */
export const CONTROL_STORES = ['file', 'etcd', 'etcd-leader'] as const;
export type ControlStoreId = (typeof CONTROL_STORES)[number];

export const CONTROL_STORE_LABELS: Record<ControlStoreId, string> = {
  file: 'file store',
  etcd: 'etcd',
  'etcd-leader': 'etcd, leader-guarded writes',
};

/** Small volumes: the control plane's cost does not depend on their size. */
const VOLUME_BYTES = 16 * 1024 ** 2;
/** Replicas of each volume: one on each host, so the migration target holds one. */
const REPLICAS = 2;

export interface ControlSettings {
  /** Measured cycles per store (one warm-up cycle each comes first, unmeasured). */
  cycles: number;
  /** First of the CONTROL_PORTS_USED loopback TCP ports. */
  basePort: number;
}

/** One operation on one store. */
export interface ControlOpFigures {
  op: ControlOp;
  count: number;
  /** Attempts that failed (not in count). */
  failed: number;
  /** count over the time the operations took (they run one at a time). */
  opsPerSec: number;
  p50Ms: number;
  p99Ms: number;
  /** Store calls one operation made (median): gets and lists, puts and deletes. */
  reads: number;
  writes: number;
}

/** An operation that failed (its cycle ended there). */
export interface ControlFailure {
  op: ControlOp;
  code: string;
  message: string;
}

export interface ControlStoreResult {
  store: ControlStoreId;
  ops: ControlOpFigures[];
  failures: ControlFailure[];
  /** A whole cycle, create to delete: median, ms. */
  cycleP50Ms: number;
}

export interface ControlResults {
  settings: ControlSettings;
  volumeBytes: number;
  replicas: number;
  /** `etcd --version`'s version, e.g. `etcd 3.4.23`. */
  etcdVersion: string;
  stores: ControlStoreResult[];
}

/** One store's control plane and its samples. */
interface Plane {
  id: ControlStoreId;
  mooring: Mooring;
  store: CountingStore;
  /** Per operation: its latency (ms) and its store reads and writes, one entry per cycle. */
  samples: Record<ControlOp, Array<{ ms: number; reads: number; writes: number }>>;
  /** Cycles completed whole: create to delete, ms. */
  cycles: number[];
  failures: ControlFailure[];
  /** The message of the last `warning` event of the plane's Mooring in this cycle. */
  lastWarning: string | undefined;
}

async function etcdVersion(ctx: TargetContext): Promise<string> {
  const r = await ctx.tracker.run('etcd', ['--version'], ctx.abort, { timeoutMs: 30_000 }).catch((err: unknown) => {
    if (ctx.abort.aborted) throw err;
    return undefined;
  });
  if (!r || r.code !== 0) throw new BenchError('BENCH_TOOL_MISSING', 'etcd is not installed (apt-get install etcd-server), or leave out --control');
  // "etcd Version: 3.4.23" → "etcd 3.4.23"
  return r.stdout.trim().split('\n')[0]!.replace(/^etcd Version:\s*/, 'etcd ');
}

/**
 * One cycle on volume `name`: every operation timed into the plane's samples (when
 * `record`). An operation that fails is recorded with its code (and the warning Mooring
 * emitted last, which often names the cause) and ends the cycle; what the cycle left is
 * detached and deleted if it can be, and the next cycle goes on with a volume of its own.
 */
async function cycle(p: Plane, name: string, dir: string, record: boolean): Promise<void> {
  const taken: Partial<Record<ControlOp, { ms: number; reads: number; writes: number }>> = {};
  let current: ControlOp = 'create';
  const timed = async <T>(op: ControlOp, fn: () => Promise<T>): Promise<T> => {
    current = op;
    const { reads, writes } = p.store;
    const t0 = performance.now();
    const out = await fn();
    taken[op] = { ms: performance.now() - t0, reads: p.store.reads - reads, writes: p.store.writes - writes };
    return out;
  };
  const m = p.mooring;
  const t0 = performance.now();
  p.lastWarning = undefined;
  try {
    const v = await timed('create', () => m.createVolume({ name, sizeBytes: VOLUME_BYTES, replicas: REPLICAS, accessMode: 'migratable', hosts: ['h0', 'h1'] }));
    await timed('attach', () => v.attach({ host: 'h0', nbd: `unix:${join(dir, `${name}-h0.sock`)}` }));
    await timed('snapshot', () => v.createSnapshot('s1'));
    await timed('migrate', async () => {
      const mig = await v.migrate('h1', { nbd: `unix:${join(dir, `${name}-h1.sock`)}` });
      await mig.handOver();
      await mig.confirm();
    });
    await timed('detach', () => v.detach());
    await timed('delete', () => m.deleteVolume(name));
  } catch (err) {
    const message = `${current} of ${name}: ${err instanceof Error ? err.message : String(err)}${p.lastWarning ? ` (last warning: ${p.lastWarning})` : ''}`;
    p.failures.push({ op: current, code: errorCode(err), message });
    await m.volume(name).detach().catch(() => undefined);
    await m.deleteVolume(name).catch(() => undefined);
    return;
  } finally {
    if (record) for (const op of CONTROL_OPS) if (taken[op]) p.samples[op].push(taken[op]);
  }
  if (record) p.cycles.push(performance.now() - t0);
}

function figures(p: Plane): ControlStoreResult {
  return {
    store: p.id,
    ops: CONTROL_OPS.map((op) => {
      const xs = p.samples[op];
      const s = spread(xs.map((x) => x.ms));
      const total = xs.reduce((a, x) => a + x.ms, 0);
      return {
        op,
        count: xs.length,
        failed: p.failures.filter((f) => f.op === op).length,
        opsPerSec: total > 0 ? (xs.length * 1000) / total : 0,
        p50Ms: s.median,
        p99Ms: s.p99,
        reads: spread(xs.map((x) => x.reads)).median,
        writes: spread(xs.map((x) => x.writes)).median,
      };
    }),
    cycleP50Ms: spread(p.cycles).median,
    failures: p.failures,
  };
}

/** Runs the cycles on every store; every process it started is stopped when it returns or throws. */
export async function measureControl(ctx: TargetContext, settings: ControlSettings): Promise<ControlResults> {
  const version = await etcdVersion(ctx);
  const hosts: BenchHost[] = [];
  const stores: StateStore[] = [];
  const planes: Plane[] = [];
  let etcd: EtcdServer | undefined;
  try {
    const base = settings.basePort;
    etcd = await EtcdServer.start(base, base + 1, { parentDir: ctx.dir, spawn: (cmd, args, o) => ctx.tracker.spawn(cmd, args, o) });
    ctx.log(`  etcd (${version}) serving at ${etcd.endpoint}`);
    for (let i = 0; i < 2; i++) hosts.push(await startBenchHost(ctx, i, base + 2 + i));
    const engines = hosts.map((h) => h.engine);
    for (const id of CONTROL_STORES) {
      const store =
        id === 'file'
          ? await FileStateStore.open(join(ctx.dir, 'state'))
          : await EtcdStateStore.open({ endpoints: [etcd.endpoint], prefix: `/bench-${id}/` });
      stores.push(store);
      const counted = new CountingStore(store);
      // No control loop: only the operations measured touch the store.
      const mooring = await Mooring.open({ store: counted, hosts: engines, repairIntervalMs: 0, ...(id === 'etcd-leader' ? { leadership: { id: 'bench' } } : {}) });
      const plane: Plane = { id, mooring, store: counted, samples: { create: [], attach: [], snapshot: [], migrate: [], detach: [], delete: [] }, cycles: [], failures: [], lastWarning: undefined };
      mooring.on('warning', (e) => (plane.lastWarning = `${e.code}: ${e.message}`));
      planes.push(plane);
    }
    // Names per store: the control planes share the data engines, never a volume.
    const name = (p: Plane, i: number): string => `${p.id}-${String(i).padStart(4, '0')}`;
    for (const p of planes) await cycle(p, name(p, 0), ctx.dir, false);
    for (let i = 1; i <= settings.cycles; i++) {
      if (ctx.abort.aborted) throw ctx.abort.reason;
      // The first store of a cycle rotates, so none always runs right after another.
      for (let k = 0; k < planes.length; k++) {
        const p = planes[(i + k) % planes.length]!;
        await cycle(p, name(p, i), ctx.dir, true);
      }
    }
    const results = planes.map(figures);
    for (const r of results) {
      ctx.log(`  ${CONTROL_STORE_LABELS[r.store]}: ` + r.ops.map((o) => `${o.op} p50 ${o.p50Ms.toFixed(1)} ms`).join(', '));
    }
    return { settings, volumeBytes: VOLUME_BYTES, replicas: REPLICAS, etcdVersion: version, stores: results };
  } finally {
    for (const p of planes) await p.mooring.close().catch(() => undefined);
    for (const s of stores) await s.close().catch(() => undefined);
    for (const h of hosts) await h.stop().catch(() => undefined);
    await etcd?.destroy().catch(() => undefined);
  }
}
