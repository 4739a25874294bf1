/**
 * The systems the benchmark measures, by stable id (used on the command line and in the JSON).
 */

/** Every target the benchmark knows. */
export const ALL_TARGET_IDS = [
  'mooring-1',
  'mooring-3',
  'mooring-3-remote',
  'qemu-raw',
  'qemu-qcow2',
  'qemu-raw-nocache',
  'file-buffered',
  'file-direct',
] as const;

export type TargetId = (typeof ALL_TARGET_IDS)[number];

/** The default run: qemu-nbd with cache=none is optional (Mooring serves through the page cache). */
export const DEFAULT_TARGET_IDS: readonly TargetId[] = [
  'mooring-1',
  'mooring-3',
  'mooring-3-remote',
  'qemu-raw',
  'qemu-qcow2',
  'file-buffered',
  'file-direct',
];

/** Human labels for tables. */
export const TARGET_LABELS: Record<TargetId, string> = {
  'mooring-1': 'Mooring 1 replica',
  'mooring-3': 'Mooring 3 replicas',
  'mooring-3-remote': 'Mooring 3 remote replicas (loopback TCP)',
  'qemu-raw': 'qemu-nbd raw (writeback)',
  'qemu-qcow2': 'qemu-nbd qcow2 (writeback)',
  'qemu-raw-nocache': 'qemu-nbd raw (cache=none, aio=native)',
  'file-buffered': 'file io_uring buffered (limit)',
  'file-direct': 'file io_uring direct=1',
};

/** Short column names for the compact summary table. */
export const TARGET_SHORT: Record<TargetId, string> = {
  'mooring-1': 'M1',
  'mooring-3': 'M3',
  'mooring-3-remote': 'M3 remote',
  'qemu-raw': 'qemu raw',
  'qemu-qcow2': 'qemu qcow2',
  'qemu-raw-nocache': 'qemu raw nocache',
  'file-buffered': 'file buf',
  'file-direct': 'file direct',
};

/** The peer every Mooring figure is divided by (same cache family: page cache). */
export const PEER_TARGET: TargetId = 'qemu-raw';
/** The physical limit every Mooring figure is divided by (buffered, to match Mooring). */
export const LIMIT_TARGET: TargetId = 'file-buffered';
