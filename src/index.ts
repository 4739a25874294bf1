/**
 * Mooring: replicated block volumes for VM managers, served over NBD.
 *
 * ```ts
 * import { Mooring } from 'mooring';
 * const mooring = await Mooring.open({ dir: '/var/lib/mooring' }); // store + this host's data engine
 * const disk = await mooring.createVolume({ name: 'disk0', sizeBytes: 10 * 2 ** 30 });
 * const st = await disk.attach({ nbd: 'unix:/run/disk0.sock' }); // on this host
 * console.log(st.nbd?.uri);                  // nbd+unix:///?socket=/run/disk0.sock
 * await mooring.close();
 * ```
 *
 * The main entry exports classes, `MooringError` and its codes, types, and one `limits`
 * object; decision functions, schema constants, gRPC definitions, helpers and the `Native*`
 * types of the addon are in `mooring/internal` (src/internal.ts).
 *
 * @packageDocumentation
 */
export { MooringError, MooringErrorCode, isMooringError, isMooringErrorCode } from './errors.js';
export type { MooringErrorOptions } from './errors.js';




// --- the entry point and its volumes ---
export { Mooring } from './mooring.js';
export type { MooringEvents, MooringOptions, RepairLoopStatus, RepairPassEvent, ReplicaReplacedEvent, VolumeSalvagedEvent } from './mooring.js';
export type { HostEvictionProgress } from './cluster/eviction-controller.js';
export type { LeaderLeaseOptions, LeaderStatus } from './cluster/leader-lease.js';
export type { Logger, LogFn } from './util/logger.js';
export type { DirectoryImport } from './volume/directory-import.js';
export { Volume, Migration } from './volume/volume.js';
export { Engine } from './volume/engine.js';
export type { EngineReplica } from './volume/engine.js';
export type { EngineNbdStats } from './data-engine/data-engine.js';
export type {
  AttachOptions,
  DetachOptions,
  HandOverResult,
  MigrateOptions,
  MigrationHooks,
  MigrationInfo,
  MigrationLocks,
  TicketOptions,
  VolumeCloneOptions,
  VolumeCreateOptions,
  VolumeEngineEvent,
  VolumeEngineEvents,
  VolumeEvents,
  VolumeReplicaStatus,
  VolumeResizedEvent,
  VolumeStatus,
  VolumeTicket,
} from './volume/volume.js';
export type { MigrationPhase } from './cluster/cluster-records.js';
// --- backing images ---
export type { HandOffEpochs, HandOffProcessResult } from './data-engine/process-handoff.js';
export { UpgradeSession } from './upgrade/upgrade-session.js';
export type {
  DataEngineLauncher,
  HostUpgradeState,
  HostUpgradeStatus,
  NewDataEngine,
  RecordedError,
  UpgradeBlock,
  UpgradeBlockCode,
  UpgradeMethod,
  UpgradeMethodChoice,
  UpgradeOptions,
  UpgradeSessionEvents,
  UpgradeSessionInfo,
  UpgradeSessionStatus,
  UpgradeSpec,
  UpgradeState,
  VolumeUpgradeStatus,
} from './upgrade/upgrade-session.js';
export { BackingImage } from './backing-image/backing-image.js';
export type { BackingImageCreateOptions, BackingImageEvents, BackingImageFileStatus, BackingImageStatus } from './backing-image/backing-image.js';
export type { BackingImageSource, BackingImageRecord, BackingImageDiskStatus } from './backing-image/backing-image-records.js';
export type { BackingImageDecision, BackingImageDecisionInput, Delivery, DiskObservation } from './backing-image/backing-image-decide.js';
// --- attachment tickets ---
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
export type { AccessMode, AttachmentDecision, AttachmentInput } from './attachment/attachment-reconciler.js';
export { LocalDataEngine } from './data-engine/local-data-engine.js';
export type { LocalDataEngineOptions, DataEngineRepairOptions, EngineIoStats, LocalDataEngineIoStats, NbdIoStats, NbdOpStats } from './data-engine/local-data-engine.js';
export type { ReplicaServerStats } from './native/replica-server-stats.js';
// --- metrics (Prometheus, prom-client) ---
export { MooringMetrics, DataEngineMetrics } from './metrics/index.js';
export type { MooringMetricsOptions, MetricsOptions } from './metrics/index.js';
export type {
  BackingImageDownloadOptions,
  BackingImageFileInfo,
  BackingImageFileRef,
  BackingImageFileState,
  BackingImagePullOptions,
  BackingImageWriteOptions,
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
  ReplicaBackingImage,
  ReplicaCreateOptions,
  ReplicaRemoveOptions,
  SnapshotCopyResult,
} from './data-engine/data-engine.js';
export type { DataEngineTlsOptions } from './data-engine/addresses.js';
export type { DownloadSettings as BackingImageDownloadSettings } from './backing-image/download.js';
export { DataEngineGrpcServer } from './data-engine/grpc/data-engine-grpc-server.js';
export type { DataEngineGrpcServerOptions } from './data-engine/grpc/data-engine-grpc-server.js';
export { RemoteDataEngine } from './data-engine/grpc/remote-data-engine.js';
export { generateClusterSecret, readClusterSecretFile } from './data-engine/cluster-secret.js';
export type { RemoteDataEngineOptions } from './data-engine/grpc/remote-data-engine.js';
export type {
  StateChange,
  StateDeleteChange,
  StateGuard,
  StateListOptions,
  StatePutChange,
  StateResyncChange,
  StateStore,
  StateWatch,
  StateWriteOptions,
  StoredObject,
} from './state/state-store.js';
export { FileStateStore } from './state/file-state-store.js';
export type { FileStateStoreOptions } from './state/file-state-store.js';
export { MemoryStateStore } from './state/memory-state-store.js';
export { EtcdStateStore } from './state/etcd-state-store.js';
export type { EtcdAuthOptions, EtcdStateStoreOptions, EtcdTlsOptions } from './state/etcd-connection.js';

// Every named default and bound of the public API, re-exported from where each is declared.
export * as limits from './limits.js';


// --- locks (sanlock): src/locks/ ---
export { Lockspace } from './locks/lockspace.js';
export type {
  HolderKilledEvent,
  JoinOptions,
  LockspaceCreateOptions,
  LockspaceEvents,
  LockspaceHeldLock,
  LockspaceLostEvent,
  LockspaceOptions,
  LockspaceStatus,
  LockspaceUser,
  Membership,
} from './locks/lockspace.js';
export { Lock } from './locks/lock.js';
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
export type { HostState, HostStateChange, HostStatus } from './locks/host-state.js';
export type { FailureTimings, TimingWindow } from './locks/timing.js';
