/**
 * The systems the benchmark measures, by stable id (used on the command line and in the JSON).
 */

/** Every target the benchmark knows. */
export const ALL_TARGET_IDS = [
  'mooring-1',
  'mooring-3',
  'mooring-3-remote',
  'mooring-3-mixed',
  'qemu-raw',
  'qemu-qcow2',
  'qemu-raw-nocache',
  'nbdkit-file',
  'qemu-nbd-tcp',
  'qemu-quorum',
  'file-buffered',
  'file-direct',
] as const;

export type TargetId = (typeof ALL_TARGET_IDS)[number];

/**
 * The default run: qemu-nbd with cache=none is optional (Mooring serves through the page cache).
 * The replicated-path peers (issue 16) need nbdkit, qemu-storage-daemon and cc, which .ci/setup.sh installs.
 */
export const DEFAULT_TARGET_IDS: readonly TargetId[] = [
  'mooring-1',
  'mooring-3',
  'mooring-3-remote',
  'mooring-3-mixed',
  'qemu-raw',
  'qemu-qcow2',
  'nbdkit-file',
  'qemu-nbd-tcp',
  'qemu-quorum',
  'file-buffered',
  'file-direct',
];

/** Human labels for tables. */
export const TARGET_LABELS: Record<TargetId, string> = {
  'mooring-1': 'Mooring 1 replica',
  'mooring-3': 'Mooring 3 replicas',
  'mooring-3-remote': 'Mooring 3 remote replicas (loopback TCP)',
  'mooring-3-mixed': 'Mooring 3 replicas, 1 on the engine host + 2 remote (loopback TCP)',
  'qemu-raw': 'qemu-nbd raw (writeback)',
  'qemu-qcow2': 'qemu-nbd qcow2 (writeback)',
  'qemu-raw-nocache': 'qemu-nbd raw (cache=none, aio=native)',
  'nbdkit-file': 'nbdkit file plugin',
  'qemu-nbd-tcp': 'qemu-nbd raw over TCP (one remote copy)',
  'qemu-quorum': 'QEMU quorum over 3 qemu-nbd (TCP)',
  'file-buffered': 'file io_uring buffered (limit)',
  'file-direct': 'file io_uring direct=1',
};

/** Short column names for the compact summary table. */
export const TARGET_SHORT: Record<TargetId, string> = {
  'mooring-1': 'M1',
  'mooring-3': 'M3',
  'mooring-3-remote': 'M3 remote',
  'mooring-3-mixed': 'M3 mixed',
  'qemu-raw': 'qemu raw',
  'qemu-qcow2': 'qemu qcow2',
  'qemu-raw-nocache': 'qemu raw nocache',
  'nbdkit-file': 'nbdkit',
  'qemu-nbd-tcp': 'qemu tcp',
  'qemu-quorum': 'quorum',
  'file-buffered': 'file buf',
  'file-direct': 'file direct',
};

/** The peer every Mooring figure is divided by (same cache family: page cache). */
export const PEER_TARGET: TargetId = 'qemu-raw';
/** The physical limit every Mooring figure is divided by (buffered, to match Mooring). */
export const LIMIT_TARGET: TargetId = 'file-buffered';
