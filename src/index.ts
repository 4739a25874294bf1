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

export { Volume, DEFAULT_REPLICA_COUNT, DEFAULT_SOCKET_FILE, OPEN_EPOCH_ATTEMPTS_MAX } from './volume/volume.js';
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
  RebuildEvent,
  RebuildFailedEvent,
  RebuildResult,
  LayerInfo,
  LifecycleState,
  ReconciledEvent,
  ReplicaErrorEvent,
  ReplicaMode,
  ReplicaSetChangedEvent,
  ReplicaStatus,
  SnapshotOptions,
  WriteOptions,
  WriteZeroesOptions,
} from './engine/engine.js';
// Hand-over (migration) of an Engine.
export type { EngineRole, HandOver } from './engine/engine.js';

export { NbdExport, NBD_LIMITS } from './nbd/nbd-export.js';
export type { NbdExportEvents, NbdExportOptions, NbdExportStats } from './nbd/nbd-export.js';
export { formatNbdAddress, nbdUri, parseNbdAddress } from './nbd/nbd-address.js';
export type { NbdAddress } from './nbd/nbd-address.js';

// --- many hosts: cluster, data engines, gRPC, state store ---
export { Cluster, DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS, DEFAULT_REPAIR_INTERVAL_MS, DEFAULT_REPLICA_REPLACEMENT_WAIT_MS, DEFAULT_TICKET_WAIT_TIMEOUT_MS, EPOCH_ATTEMPTS_MAX, HOST_PROBE_TIMEOUT_MS } from './cluster/cluster.js';
// Writer epochs: allocated by the control plane, never chosen by an engine (docs/single-writer.md).
export { EpochAllocator, EPOCH_ALLOCATION_ATTEMPTS_MAX } from './cluster/epochs.js';
export type {
  ClusterAttachOptions,
  ClusterCloneOptions,
  ClusterDetachOptions,
  ClusterEvents,
  ClusterOptions,
  ClusterReplicaStatus,
  ClusterVolumeCreateOptions,
  ClusterVolumeStatus,
  ReplicaReplacedEvent,
} from './cluster/cluster.js';
export { CLUSTER_SCHEMA_VERSION, ATTACHMENT_TICKETS_MAX } from './cluster/cluster-records.js';
export type { AttachmentRecord, EngineRecord, HostRecord, MigrationPhase, MigrationRecord, ReplicaRecord, VolumeEpochRecord, VolumeRecord } from './cluster/cluster-records.js';
export { ClusterVolume, Migration } from './cluster/cluster-volume.js';
export type {
  ClusterTicket,
  ClusterVolumeEvents,
  HandOverResult,
  MigrateOptions,
  MigrationHooks,
  MigrationInfo,
  MigrationLocks,
  TicketOptions,
  VolumeResizedEvent,
} from './cluster/cluster-volume.js';
// --- backing images (seed 003) ---
export { BackingImage } from './backing-image/backing-image.js';
export type { BackingImageCreateOptions, BackingImageEvents, BackingImageFileStatus, BackingImageStatus } from './backing-image/backing-image.js';
export type { BackingImageSource, BackingImageRecord, BackingImageDiskStatus } from './backing-image/backing-image-records.js';
export { BACKING_IMAGE_KIND, BACKING_IMAGE_SCHEMA_VERSION } from './backing-image/backing-image-records.js';
export { SENDS_PER_SOURCE_MAX, decideBackingImage } from './backing-image/backing-image-decide.js';
export type { BackingImageDecision, BackingImageDecisionInput, Delivery, DiskObservation } from './backing-image/backing-image-decide.js';
export { FIRST_FILE_ATTEMPTS_MAX } from './backing-image/backing-image-controller.js';
// --- attachment tickets ---
export { ATTACHER_PRIORITY, ATTACHER_TYPES, MIGRATING_ATTACHERS } from './attachment/attachment-ticket.js';
export type {
  AttacherType,
  AttachmentCondition,
  AttachmentConditionReason,
  AttachmentParameters,
  AttachmentTicket,
  AttachmentTicketStatus,
  FrontendRequirement,
  Frontend,
} from './attachment/attachment-ticket.js';
export { decideAttachment } from './attachment/attachment-reconciler.js';
export type { AccessMode, AttachmentDecision, AttachmentInput } from './attachment/attachment-reconciler.js';
export { LocalDataEngine, DATA_ENGINE_DEFAULTS, DATA_ENGINE_LIMITS, DATA_ENGINE_FILE, DATA_ENGINE_LOCK_FILE, DATA_ENGINE_REPLICAS_SUBDIR } from './data-engine/local-data-engine.js';
export type { LocalDataEngineOptions, DataEngineRepairOptions } from './data-engine/local-data-engine.js';
export type {
  DataEngine,
  DataEngineEvent,
  DataEngineInfo,
  EngineActivateOptions,
  EngineHandOver,
  EngineInfo,
  EngineReplicaInfo,
  EngineReplicaRef,
  EngineSnapshotInfo,
  EngineStartOptions,
  HostedReplicaInfo,
  RebuildProgress,
  RebuildResult as DataEngineRebuildResult,
  SnapshotCopyResult,
} from './data-engine/data-engine.js';
export type { DataEngineTlsOptions } from './data-engine/addresses.js';
export { BACKING_IMAGE_FILE_LIMITS, BACKING_IMAGES_SUBDIR } from './data-engine/backing-image-files.js';
export { DOWNLOAD_DEFAULTS, DOWNLOAD_LIMITS } from './backing-image/download.js';
export type { DownloadSettings as BackingImageDownloadSettings } from './backing-image/download.js';
export { DataEngineGrpcServer, GRPC_LIMITS } from './data-engine/grpc/data-engine-grpc-server.js';
export type { DataEngineGrpcServerOptions } from './data-engine/grpc/data-engine-grpc-server.js';
export { RemoteDataEngine, REMOTE_DATA_ENGINE_DEFAULTS } from './data-engine/grpc/remote-data-engine.js';
export type { RemoteDataEngineOptions } from './data-engine/grpc/remote-data-engine.js';
// Snapshot export and copy (Engine.exportSnapshot/copySnapshotTo, DataEngine snapshot calls).
export type { SnapshotCopyProgressEvent } from './engine/engine.js';
export { DATA_ENGINE_PROTO, DATA_ENGINE_SERVICE } from './data-engine/grpc/data-engine-proto.js';
export type { StateStore, StateWriteOptions, StoredObject } from './state/state-store.js';
export { FileStateStore, STATE_LOCK_FILE } from './state/file-state-store.js';
export type { FileStateStoreOptions } from './state/file-state-store.js';
export { MemoryStateStore } from './state/memory-state-store.js';
export { STATE_DOCUMENT_BYTES_MAX, STATE_KIND_PATTERN } from './state/state-keys.js';

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
  NativeRemoteReplica,
  NativeReplicaEndpoint,
  NativeTlsOptions,
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
