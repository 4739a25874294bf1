/**
 * `mooring/internal`: the machinery under the main entry that the repository's own tools,
 * tests and benchmarks reach for, kept off the public surface: the pure decision functions
 * of the controllers, schema and on-disk layout constants, the gRPC service definition,
 * parsing and formatting helpers, the sanlock timing formulas and the `Native*` types of the
 * addon. Nothing here is a stable API; types of the public API come from `mooring`.
 *
 * @packageDocumentation
 */

// --- volume directories of the first releases (volume.json + replicas/), imported by Mooring.open ---
export { VOLUME_SPEC_FILE, VOLUME_SPEC_FORMAT, VOLUME_SPEC_VERSION, parseVolumeSpec } from './volume/volume-spec.js';

// --- the engine of one volume in this process (a data engine runs one per attached volume) ---
export { LocalEngine } from './engine/engine.js';
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
  SalvagedEvent,
  SnapshotOptions,
  WriteOptions,
  WriteZeroesOptions,
} from './engine/engine.js';
export type { EngineRole, HandOver, SnapshotCopyProgressEvent } from './engine/engine.js';

// --- NBD exports of an engine in this process ---
export { NbdExport } from './nbd/nbd-export.js';
export type { NbdExportEvents, NbdExportOptions, NbdExportStats } from './nbd/nbd-export.js';
export type { NbdAddress } from './nbd/nbd-address.js';

// --- helpers ---
export { formatNbdAddress, nbdUri, parseNbdAddress } from './nbd/nbd-address.js';
export { formatBytes, parseSize } from './util/size.js';

// --- cluster: store schema, writer epochs, attachment decisions ---
export { EPOCH_ATTEMPTS_MAX, HOST_PROBE_TIMEOUT_MS } from './mooring.js';
// Writer epochs: allocated by the control plane, never chosen by an engine (docs/single-writer.md).
export { EpochAllocator, EPOCH_ALLOCATION_ATTEMPTS_MAX } from './cluster/epochs.js';
export { CLUSTER_SCHEMA_VERSION } from './cluster/cluster-records.js';
export { ATTACHER_PRIORITY, ATTACHER_TYPES, MIGRATING_ATTACHERS } from './attachment/attachment-ticket.js';
export { decideAttachment } from './attachment/attachment-reconciler.js';

// --- backing images: store schema and decisions ---
export { BACKING_IMAGE_KIND, BACKING_IMAGE_SCHEMA_VERSION } from './backing-image/backing-image-records.js';
export { SENDS_PER_SOURCE_MAX, decideBackingImage } from './backing-image/backing-image-decide.js';
export { FIRST_FILE_ATTEMPTS_MAX } from './backing-image/backing-image-controller.js';

// --- data engines: directory layout and the gRPC service ---
export { DATA_ENGINE_FILE, DATA_ENGINE_LOCK_FILE, DATA_ENGINE_REPLICAS_SUBDIR } from './data-engine/local-data-engine.js';
export { BACKING_IMAGES_SUBDIR } from './data-engine/backing-image-files.js';
export { DATA_ENGINE_PROTO, DATA_ENGINE_SERVICE } from './data-engine/grpc/data-engine-proto.js';
export { STATE_LOCK_FILE } from './state/file-state-store.js';

// --- locks (sanlock): host states, timings, error mapping ---
export { diffHosts, hostStateFromFlags } from './locks/host-state.js';
export {
  failureTimings,
  hostDeadSeconds,
  hostFailSeconds,
  lockspaceSizeBytes,
  renewalIntervalSeconds,
  WATCHDOG_FIRE_TIMEOUT_SECONDS,
} from './locks/timing.js';
export { sanlockError, sanlockErrorCode, sanlockRvName } from './locks/sanlock-errors.js';
export { parseHostLeases, parseRindex } from './locks/lease-area.js';
export type { HostLeaseRecord, RindexRecord } from './locks/lease-area.js';

// --- the native addon's interface (src/native/binding.ts) ---
export type {
  NativeAddon,
  NativeDeltaLease,
  NativeEngine,
  NativeEngineEvent,
  NativeEngineOptions,
  NativeExtent,
  NativeLayerInfo,
  NativeNbdOptions,
  NativeNbdServer,
  NativeNbdStats,
  NativeRemoteReplica,
  NativeReplica,
  NativeReplicaEndpoint,
  NativeReplicaMode,
  NativeReplicaState,
  NativeSanlock,
  NativeSanlockDisk,
  NativeSanlockHost,
  NativeSanlockHostEvent,
  NativeSanlockLockspace,
  NativeSanlockResource,
  NativeSanlockRindex,
  NativeSanlockRv,
  NativeSanlockTarget,
  NativeTlsOptions,
  NativeWriteZeroesOptions,
} from './native/binding.js';
