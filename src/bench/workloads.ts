/**
 * The fio workloads of the benchmark. The same list runs against every target.
 */

export type FioRw = 'randread' | 'randwrite' | 'read' | 'write';

/** One fio job shape. */
export interface Workload {
  /** Stable id, e.g. `randread-4k-qd16-j1`. */
  id: string;
  /** Table label. */
  label: string;
  rw: FioRw;
  blockBytes: number;
  iodepth: number;
  numjobs: number;
  /** 4k random (judged by IOPS) or 1M sequential (judged by MiB/s). */
  family: 'random-4k' | 'seq-1m';
}

function random4k(rw: 'randread' | 'randwrite', iodepth: number, numjobs: number): Workload {
  return {
    id: `${rw}-4k-qd${iodepth}-j${numjobs}`,
    label: `4k ${rw} qd${iodepth} j${numjobs}`,
    rw,
    blockBytes: 4096,
    iodepth,
    numjobs,
    family: 'random-4k',
  };
}

/** qd8 is enough to keep a 1 MiB stream busy (and matches the earlier qemu measurements). */
const SEQ_IODEPTH = 8;

function seq1m(rw: 'read' | 'write'): Workload {
  return {
    id: `${rw}-1m-qd${SEQ_IODEPTH}`,
    label: `1M ${rw} qd${SEQ_IODEPTH}`,
    rw,
    blockBytes: 1024 * 1024,
    iodepth: SEQ_IODEPTH,
    numjobs: 1,
    family: 'seq-1m',
  };
}

/** qd16 is QEMU's NBD client maximum; qd32 and 4 jobs (4 connections) probe further. */
export const ALL_WORKLOADS: readonly Workload[] = [
  random4k('randread', 16, 1),
  random4k('randread', 32, 1),
  random4k('randread', 16, 4),
  random4k('randread', 32, 4),
  random4k('randwrite', 16, 1),
  random4k('randwrite', 32, 1),
  random4k('randwrite', 16, 4),
  random4k('randwrite', 32, 4),
  seq1m('read'),
  seq1m('write'),
];

export const QUICK_WORKLOAD_IDS: readonly string[] = [
  'randread-4k-qd16-j1',
  'randread-4k-qd32-j4',
  'randwrite-4k-qd16-j1',
  'randwrite-4k-qd32-j4',
  'read-1m-qd8',
  'write-1m-qd8',
];

export function isWrite(w: Workload): boolean {
  return w.rw === 'randwrite' || w.rw === 'write';
}

export function workloadById(id: string): Workload {
  const w = ALL_WORKLOADS.find((x) => x.id === id);
  if (!w) throw new Error(`unknown workload ${id}`);
  return w;
}
