/**
 * Mooring: replicated block volumes for VM managers, served over NBD.
 *
 * ```ts
 * import { Volume } from 'mooring';
 * const volume = await Volume.create({ dir: '/var/lib/vm/disk0', sizeBytes: 10 * 2 ** 30, replicas: 3 });
 * const nbd = await volume.export();          // unix:/var/lib/vm/disk0/nbd.sock
 * console.log(nbd.uri);                       // nbd+unix:///?socket=/var/lib/vm/disk0/nbd.sock
 * await volume.close();
 * ```
 *
 * @packageDocumentation
 */
export { MooringError, MooringErrorCode, isMooringError, isMooringErrorCode } from './errors.js';
export type { MooringErrorOptions } from './errors.js';

export { Volume, DEFAULT_REPLICA_COUNT, DEFAULT_SOCKET_FILE } from './volume/volume.js';
export type {
  CreateSnapshotOptions,
  ExportInfo,
  SnapshotInfo,
  VolumeCreateOptions,
  VolumeEvents,
  VolumeExportOptions,
  VolumeOpenOptions,
  VolumeReplicaStatus,
  VolumeStatus,
} from './volume/volume.js';
export { VOLUME_SPEC_FILE, VOLUME_SPEC_FORMAT, VOLUME_SPEC_VERSION, parseVolumeSpec } from './volume/volume-spec.js';
export type { ReplicaErrorRecord, ReplicaSpec, VolumeSpec } from './volume/volume-spec.js';

export { Engine } from './engine/engine.js';
export type {
  EngineEvent,
  EngineEvents,
  EngineOptions,
  EngineReplicaSpec,
  EpochClaimedEvent,
  Extent,
  LayerInfo,
  LifecycleState,
  ReconciledEvent,
  ReplicaErrorEvent,
  ReplicaMode,
  ReplicaStatus,
  SnapshotOptions,
  WriteOptions,
  WriteZeroesOptions,
} from './engine/engine.js';

export { NbdExport, NBD_LIMITS } from './nbd/nbd-export.js';
export type { NbdExportEvents, NbdExportOptions, NbdExportStats } from './nbd/nbd-export.js';
export { formatNbdAddress, nbdUri, parseNbdAddress } from './nbd/nbd-address.js';
export type { NbdAddress } from './nbd/nbd-address.js';

export { formatBytes, parseSize } from './util/size.js';
export * as limits from './util/limits.js';

export type {
  NativeAddon,
  NativeEngine,
  NativeEngineEvent,
  NativeEngineOptions,
  NativeExtent,
  NativeLayerInfo,
  NativeNbdOptions,
  NativeNbdServer,
  NativeNbdStats,
  NativeReplica,
  NativeReplicaMode,
  NativeReplicaState,
  NativeWriteZeroesOptions,
} from './native/binding.js';

// --- locks (sanlock, seed 001): src/locks/ ---
export { Lockspace, LOCK_NAME_PATTERN, HOST_ID_MAX, MAX_LOCKS_MAX, DEFAULT_IO_TIMEOUT_SECONDS } from './locks/lockspace.js';
export type {
  HolderKilledEvent,
  JoinOptions,
  LockspaceCreateOptions,
  LockspaceEvents,
  LockspaceLostEvent,
  LockspaceOptions,
  LockspaceStatus,
  Membership,
} from './locks/lockspace.js';
export { Lock, LOCKS_PER_PROCESS_MAX } from './locks/lock.js';
export type { LockAcquireOptions, LockHolder, LockInfo } from './locks/lock.js';
export { LockedProcess } from './locks/locked-process.js';
export type {
  HeldLease,
  LockHandover,
  LockRequest,
  LockedProcessEvents,
  LockedProcessExit,
  LockedProcessOptions,
  RestrictMode,
} from './locks/locked-process.js';
export { LivenessWatcher } from './locks/liveness-watcher.js';
export type { HostEvent, LivenessEvents, LivenessWatcherOptions, WatchedLockspace } from './locks/liveness-watcher.js';
export { diffHosts, hostStateFromFlags } from './locks/host-state.js';
export type { HostState, HostStateChange, HostStatus } from './locks/host-state.js';
export {
  failureTimings,
  hostDeadSeconds,
  hostFailSeconds,
  lockspaceSizeBytes,
  renewalIntervalSeconds,
  WATCHDOG_FIRE_TIMEOUT_SECONDS,
} from './locks/timing.js';
export type { FailureTimings, TimingWindow } from './locks/timing.js';
export { sanlockError, sanlockErrorCode, sanlockRvName } from './locks/sanlock-errors.js';
export type {
  NativeDeltaLease,
  NativeSanlock,
  NativeSanlockDisk,
  NativeSanlockHost,
  NativeSanlockHostEvent,
  NativeSanlockLockspace,
  NativeSanlockResource,
  NativeSanlockRindex,
  NativeSanlockRv,
  NativeSanlockTarget,
} from './native/binding.js';
