// Conversions between the DataEngine types and the gRPC messages, and between MooringError
// and gRPC status (the code travels in trailing metadata, so the client rebuilds the same
// MooringError code the server saw).
import { Metadata, status as GrpcStatus, type ServiceError } from '@grpc/grpc-js';

import { MooringError, isMooringErrorCode, toMooringError, type MooringErrorCode } from '../../errors.js';
import { REPLICA_COUNT_MAX } from '../../util/limits.js';
import { describe } from '../../util/validate.js';
import type {
  BackingImageFileInfo,
  BackingImageFileRef,
  BackingImageFileState,
  DataEngineEvent,
  DataEngineInfo,
  EngineHandOver,
  EngineInfo,
  EngineReplicaRef,
  EngineSnapshotInfo,
  HostedReplicaInfo,
  RebuildProgress,
  RebuildResult,
  ReplicaBackingImage,
  SnapshotCopyResult,
} from '../data-engine.js';

/** Metadata keys carrying the MooringError across gRPC. */
export const ERROR_CODE_KEY = 'mooring-code';
export const ERROR_ERRNO_KEY = 'mooring-errno';
/** Longest error message sent (characters). */
const ERROR_MESSAGE_LENGTH_MAX = 4096;

const statusOf: Record<MooringErrorCode, GrpcStatus> = {
  INVALID_ARGUMENT: GrpcStatus.INVALID_ARGUMENT,
  NOT_FOUND: GrpcStatus.NOT_FOUND,
  ALREADY_EXISTS: GrpcStatus.ALREADY_EXISTS,
  IO_ERROR: GrpcStatus.INTERNAL,
  NO_SPACE: GrpcStatus.RESOURCE_EXHAUSTED,
  STALE_EPOCH: GrpcStatus.FAILED_PRECONDITION,
  CORRUPT_METADATA: GrpcStatus.DATA_LOSS,
  BUSY: GrpcStatus.ABORTED,
  CLOSED: GrpcStatus.FAILED_PRECONDITION,
  NO_HEALTHY_REPLICA: GrpcStatus.UNAVAILABLE,
  OUT_OF_RANGE: GrpcStatus.OUT_OF_RANGE,
  UNSUPPORTED: GrpcStatus.UNIMPLEMENTED,
  INVALID_STATE: GrpcStatus.FAILED_PRECONDITION,
  ADDRESS_IN_USE: GrpcStatus.FAILED_PRECONDITION,
  UNAVAILABLE: GrpcStatus.UNAVAILABLE,
  PROTOCOL_ERROR: GrpcStatus.INVALID_ARGUMENT,
  NO_QUORUM: GrpcStatus.UNAVAILABLE,
  UNAUTHENTICATED: GrpcStatus.UNAUTHENTICATED,
  READ_ONLY_FILESYSTEM: GrpcStatus.FAILED_PRECONDITION,
  PERMISSION_DENIED: GrpcStatus.PERMISSION_DENIED,
  CONFLICT: GrpcStatus.ABORTED,
  NOT_LEADER: GrpcStatus.FAILED_PRECONDITION,
  NATIVE_LOAD_FAILED: GrpcStatus.INTERNAL,
  SANLOCK_UNAVAILABLE: GrpcStatus.UNIMPLEMENTED,
  SANLOCK_DAEMON_UNAVAILABLE: GrpcStatus.UNAVAILABLE,
  LOCK_HELD: GrpcStatus.ABORTED,
  LOCK_VERSION_MISMATCH: GrpcStatus.ABORTED,
  HOST_ID_IN_USE: GrpcStatus.ALREADY_EXISTS,
  LOCKSPACE_NOT_JOINED: GrpcStatus.FAILED_PRECONDITION,
  CANCELLED: GrpcStatus.CANCELLED,
  PRECONDITION_FAILED: GrpcStatus.FAILED_PRECONDITION,
  CHECKSUM_MISMATCH: GrpcStatus.DATA_LOSS,
  DOWNLOAD_FAILED: GrpcStatus.UNAVAILABLE,
};

/** A gRPC error status (for callback(err) and stream 'error') carrying a MooringError's code. */
export function toGrpcError(err: unknown): Partial<ServiceError> {
  const e = toMooringError(err);
  const metadata = new Metadata();
  metadata.set(ERROR_CODE_KEY, e.code);
  if (e.errno !== undefined) metadata.set(ERROR_ERRNO_KEY, String(e.errno));
  return { code: statusOf[e.code], details: e.message.slice(0, ERROR_MESSAGE_LENGTH_MAX), metadata };
}

/**
 * Whether `err` (from {@link fromGrpcError}) is a server's UNIMPLEMENTED for a method it does
 * not know (a release before it), not an UNSUPPORTED a data engine raised.
 */
export function isUnimplementedMethod(err: unknown): boolean {
  if (!(err instanceof MooringError) || err.code !== 'UNSUPPORTED') return false;
  const c = err.cause as Partial<ServiceError> | undefined;
  return typeof c === 'object' && c !== null && c.code === GrpcStatus.UNIMPLEMENTED && !(c.metadata instanceof Metadata && c.metadata.get(ERROR_CODE_KEY).length > 0);
}

/**
 * The MooringError a gRPC failure stands for: the code the server sent when there is one,
 * else one derived from the gRPC status (a server that could not be reached is UNAVAILABLE).
 */
export function fromGrpcError(err: unknown, what: string): MooringError {
  const e = (typeof err === 'object' && err !== null ? err : {}) as Partial<ServiceError>;
  const sent = e.metadata instanceof Metadata ? e.metadata.get(ERROR_CODE_KEY)[0] : undefined;
  const errnoText = e.metadata instanceof Metadata ? e.metadata.get(ERROR_ERRNO_KEY)[0] : undefined;
  const errno = typeof errnoText === 'string' && /^\d{1,5}$/.test(errnoText) ? Number(errnoText) : undefined;
  let code: MooringErrorCode;
  if (isMooringErrorCode(sent)) code = sent;
  else {
    switch (e.code) {
      case GrpcStatus.UNAVAILABLE:
      case GrpcStatus.DEADLINE_EXCEEDED:
      case GrpcStatus.CANCELLED:
      case GrpcStatus.UNAUTHENTICATED:
        code = 'UNAVAILABLE';
        break;
      case GrpcStatus.UNIMPLEMENTED:
        code = 'UNSUPPORTED';
        break;
      case GrpcStatus.RESOURCE_EXHAUSTED:
        // Typically a message over the size limit.
        code = 'INVALID_ARGUMENT';
        break;
      default:
        code = 'PROTOCOL_ERROR';
    }
  }
  const detail = typeof e.details === 'string' && e.details.length > 0 ? e.details : (e as Error).message ?? String(err);
  return new MooringError(code, `${what}: ${detail}`, { cause: err, ...(errno === undefined ? {} : { errno }) });
}

// --- messages -----------------------------------------------------------------

/** Request objects as proto-loader decodes them (defaults filled in). */
export type Msg = Record<string, unknown>;

const str = (v: unknown): string => (typeof v === 'string' ? v : '');
const num = (v: unknown): number => (typeof v === 'number' ? v : Number.NaN);

export function infoToMsg(i: DataEngineInfo): Msg {
  return { hostId: i.hostId, version: i.version, dir: i.dir, replicaAddress: i.replicaAddress ?? '', tls: i.tls, instanceId: i.instanceId, diskId: i.diskId, features: i.features };
}
export function infoFromMsg(m: Msg): DataEngineInfo {
  return { hostId: str(m.hostId), version: str(m.version), dir: str(m.dir), replicaAddress: str(m.replicaAddress) || null, tls: m.tls === true, instanceId: str(m.instanceId), diskId: str(m.diskId).slice(0, 64), features: Array.isArray(m.features) ? (m.features as unknown[]).filter((f): f is string => typeof f === 'string').slice(0, 64) : [] };
}

export function hostedToMsg(r: HostedReplicaInfo): Msg {
  return { ...r, backingImage: r.backingImage ? replicaBackingImageToMsg(r.backingImage) : null };
}
export function hostedFromMsg(m: Msg): HostedReplicaInfo {
  return {
    name: str(m.name),
    sizeBytes: num(m.sizeBytes),
    epoch: num(m.epoch),
    clean: m.clean === true,
    rebuilding: m.rebuilding === true,
    allocatedBytes: num(m.allocatedBytes),
    inUse: m.inUse === true,
    backingImage: replicaBackingImageFromMsg(m.backingImage) ?? null,
  };
}

export function replicaBackingImageToMsg(b: ReplicaBackingImage): Msg {
  return { dir: b.dir, format: b.format, virtualSizeBytes: b.virtualSizeBytes };
}
/** A replica's backing image as sent, or undefined when unset (shape only; the data engine validates values). */
export function replicaBackingImageFromMsg(m: unknown): ReplicaBackingImage | undefined {
  if (typeof m !== 'object' || m === null) return undefined;
  const b = m as Msg;
  return { dir: str(b.dir), format: str(b.format) as ReplicaBackingImage['format'], virtualSizeBytes: num(b.virtualSizeBytes) };
}

// --- backing image files ---------------------------------------------------------

const FILE_STATES: ReadonlySet<string> = new Set(['pending', 'starting', 'in-progress', 'ready', 'failed', 'unknown']);

export function fileRefToMsg(r: BackingImageFileRef): Msg {
  return { name: r.name, uuid: r.uuid };
}
/** A ref as sent (shape only; the data engine validates it). */
export function fileRefFromMsg(m: unknown): BackingImageFileRef {
  const r = (typeof m === 'object' && m !== null ? m : {}) as Msg;
  return { name: str(r.name), uuid: str(r.uuid) };
}

export function fileToMsg(f: BackingImageFileInfo): Msg {
  return { ...f, format: f.format ?? '', usedBy: [...f.usedBy] };
}
export function fileFromMsg(m: Msg): BackingImageFileInfo {
  // A state this client does not know (a newer server) reads as unknown.
  const state = (typeof m.state === 'string' && FILE_STATES.has(m.state) ? m.state : 'unknown') as BackingImageFileState;
  return {
    name: str(m.name),
    uuid: str(m.uuid),
    state,
    progress: num(m.progress),
    message: str(m.message),
    sizeBytes: num(m.sizeBytes),
    receivedBytes: num(m.receivedBytes),
    checksum: str(m.checksum),
    format: m.format === 'raw' || m.format === 'qcow2' ? m.format : null,
    virtualSizeBytes: num(m.virtualSizeBytes),
    usedBy: Array.isArray(m.usedBy) ? m.usedBy.map(str) : [],
  };
}

export function refToMsg(r: EngineReplicaRef): Msg {
  return { id: r.id, hostId: r.hostId, name: r.name, address: r.address ?? '' };
}
export function refFromMsg(m: unknown): EngineReplicaRef {
  const r = (typeof m === 'object' && m !== null ? m : {}) as Msg;
  return { id: str(r.id), hostId: str(r.hostId), name: str(r.name), address: str(r.address) || null };
}

function progressToMsg(p: RebuildProgress): Msg {
  return { sentBytes: p.sentBytes, scannedBytes: p.scannedBytes, totalBytes: p.totalBytes };
}
function progressFromMsg(m: unknown): RebuildProgress {
  const p = (typeof m === 'object' && m !== null ? m : {}) as Msg;
  return { sentBytes: num(p.sentBytes), scannedBytes: num(p.scannedBytes), totalBytes: num(p.totalBytes) };
}

export function engineToMsg(e: EngineInfo): Msg {
  return {
    volume: e.volume,
    sizeBytes: e.sizeBytes,
    epoch: e.epoch,
    role: e.role,
    replicas: e.replicas.map((r) => ({
      ref: refToMsg(r),
      mode: r.mode,
      lastError: r.lastError,
      ...(r.rebuild ? { rebuild: progressToMsg(r.rebuild) } : {}),
    })),
    ...(e.nbd ? { nbd: { address: e.nbd.address, uri: e.nbd.uri } } : {}),
    ...(e.nbdStats ? { nbdStats: { ...e.nbdStats } } : {}),
  };
}
export function engineFromMsg(m: Msg): EngineInfo {
  const nbd = m.nbd as Msg | null | undefined;
  const stats = m.nbdStats as Msg | null | undefined;
  return {
    volume: str(m.volume),
    sizeBytes: num(m.sizeBytes),
    epoch: num(m.epoch),
    // An older server sends no role: its engines are all active.
    role: m.role === 'standby' ? 'standby' : 'active',
    replicas: (Array.isArray(m.replicas) ? (m.replicas as Msg[]) : []).map((r) => {
      const mode = r.mode === 'RW' || r.mode === 'WO' ? r.mode : 'ERR';
      return {
        ...refFromMsg(r.ref),
        mode,
        lastError: num(r.lastError),
        ...(r.rebuild ? { rebuild: progressFromMsg(r.rebuild) } : {}),
      };
    }),
    nbd: nbd ? { address: str(nbd.address), uri: str(nbd.uri) } : null,
    nbdStats: stats
      ? {
          connectionsTotal: num(stats.connectionsTotal),
          connectionsOpen: num(stats.connectionsOpen),
          requests: num(stats.requests),
          bytesRead: num(stats.bytesRead),
          bytesWritten: num(stats.bytesWritten),
          protocolErrors: num(stats.protocolErrors),
        }
      : null,
  };
}

export function handOverToMsg(h: EngineHandOver): Msg {
  return { epoch: h.epoch, generation: h.generation, rwReplicaIds: [...h.rwReplicaIds] };
}
/** A hand-over as sent (shape only; the data engine validates the values). */
export function handOverFromMsg(m: unknown): EngineHandOver {
  const h = (typeof m === 'object' && m !== null ? m : {}) as Msg;
  return { epoch: num(h.epoch), generation: num(h.generation), rwReplicaIds: Array.isArray(h.rwReplicaIds) ? h.rwReplicaIds.map(str) : [] };
}

export function rebuildResultToMsg(r: RebuildResult): Msg {
  return { ...r };
}
export function rebuildResultFromMsg(m: Msg): RebuildResult {
  return {
    replicaId: str(m.replicaId),
    scannedBytes: num(m.scannedBytes),
    sentBytes: num(m.sentBytes),
    unmappedBytes: num(m.unmappedBytes),
    durationMs: num(m.durationMs),
  };
}

export function eventToMsg(e: DataEngineEvent): Msg {
  if (e.type === 'backing-image-file') {
    const { type, ...info } = e;
    return { type, file: fileToMsg({ ...info, usedBy: [] }) };
  }
  const m: Msg = { type: e.type, volume: e.volume };
  switch (e.type) {
    case 'replica-error':
      Object.assign(m, { replicaId: e.replicaId, errno: e.errno, message: e.message });
      break;
    case 'epoch-claimed':
      m.epoch = e.epoch;
      break;
    case 'salvaged':
      Object.assign(m, { replicaId: e.replicaId, epoch: e.lastRw?.epoch ?? 0, generation: e.lastRw?.generation ?? 0, complete: e.complete, message: e.message });
      break;
    case 'replica-set-changed':
      Object.assign(m, { epoch: e.epoch, generation: e.generation, rwReplicaIds: [...e.rwReplicaIds] });
      break;
    case 'rebuild-started':
    case 'rebuild-progress':
    case 'rebuild-completed':
      Object.assign(m, { replicaId: e.replicaId, progress: progressToMsg(e) });
      break;
    case 'rebuild-failed':
      Object.assign(m, { replicaId: e.replicaId, progress: progressToMsg(e), code: e.code, message: e.message });
      break;
    case 'repair-scheduled':
      Object.assign(m, { replicaId: e.replicaId, attempt: e.attempt, delayMs: e.delayMs, code: e.code, message: e.message });
      break;
    case 'engine-stopped':
      break;
    case 'engine-activated':
    case 'engine-deactivated':
      m.epoch = e.epoch;
      break;
    case 'snapshot-copy-progress':
      Object.assign(m, { snapshot: e.snapshot, copiedBytes: e.copiedBytes, totalBytes: e.totalBytes });
      break;
  }
  return m;
}

/** The event a message stands for, or undefined for a type this client does not know (a newer server). */
export function eventFromMsg(m: Msg): DataEngineEvent | undefined {
  const volume = str(m.volume);
  const replicaId = str(m.replicaId);
  switch (m.type) {
    case 'replica-error':
      return { type: 'replica-error', volume, replicaId, errno: num(m.errno), message: str(m.message) };
    case 'epoch-claimed':
      return { type: 'epoch-claimed', volume, epoch: num(m.epoch) };
    case 'salvaged': {
      const epoch = num(m.epoch);
      return { type: 'salvaged', volume, replicaId, lastRw: epoch === 0 ? null : { epoch, generation: num(m.generation) }, complete: m.complete === true, message: str(m.message) };
    }
    case 'replica-set-changed':
      return {
        type: 'replica-set-changed',
        volume,
        epoch: num(m.epoch),
        generation: num(m.generation),
        rwReplicaIds: Array.isArray(m.rwReplicaIds) ? m.rwReplicaIds.slice(0, REPLICA_COUNT_MAX).map(str) : [],
      };
    case 'rebuild-started':
    case 'rebuild-progress':
    case 'rebuild-completed':
      return { type: m.type, volume, replicaId, ...progressFromMsg(m.progress) };
    case 'rebuild-failed':
      return { type: 'rebuild-failed', volume, replicaId, code: str(m.code), message: str(m.message), ...progressFromMsg(m.progress) };
    case 'repair-scheduled':
      return { type: 'repair-scheduled', volume, replicaId, attempt: num(m.attempt), delayMs: num(m.delayMs), code: str(m.code), message: str(m.message) };
    case 'engine-stopped':
      return { type: 'engine-stopped', volume };
    case 'engine-activated':
    case 'engine-deactivated':
      return { type: m.type, volume, epoch: num(m.epoch) };
    case 'snapshot-copy-progress':
      return { type: 'snapshot-copy-progress', volume, snapshot: str(m.snapshot), copiedBytes: num(m.copiedBytes), totalBytes: num(m.totalBytes) };
    case 'backing-image-file': {
      if (typeof m.file !== 'object' || m.file === null) return undefined;
      const { usedBy: _unused, ...info } = fileFromMsg(m.file as Msg);
      return { type: 'backing-image-file', ...info };
    }
    default:
      return undefined;
  }
}

// --- snapshots ---------------------------------------------------------------

export function snapshotToMsg(x: EngineSnapshotInfo): Msg {
  return { ...x, parent: x.parent ?? '', labels: { ...x.labels } };
}
export function snapshotFromMsg(m: Msg): EngineSnapshotInfo {
  return {
    name: str(m.name),
    id: str(m.id),
    parent: str(m.parent) || null,
    createdMs: num(m.createdMs),
    labels: labelsFromMsg(m.labels),
    sizeBytes: num(m.sizeBytes),
    allocatedBytes: num(m.allocatedBytes),
    userCreated: m.userCreated === true,
  };
}

/** A labels map as decoded (an object of strings; anything else is dropped). */
export function labelsFromMsg(v: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (typeof v !== 'object' || v === null) return out;
  for (const [k, x] of Object.entries(v as Record<string, unknown>)) if (typeof x === 'string') out[k] = x;
  return out;
}

export function copyResultToMsg(r: SnapshotCopyResult): Msg {
  return { sizeBytes: r.sizeBytes, copiedBytes: r.copiedBytes, durationMs: r.durationMs };
}
export function copyResultFromMsg(m: Msg): SnapshotCopyResult {
  return { sizeBytes: num(m.sizeBytes), copiedBytes: num(m.copiedBytes), durationMs: num(m.durationMs) };
}

/**
 * A request's uint64 field that must hold a safe integer (proto3 gives 0 when absent): a
 * value above 2^53 arrives as an inexact number and is refused rather than rounded.
 */
export function requestUint(m: Msg, field: string): number {
  const v = m[field];
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
    throw new MooringError('INVALID_ARGUMENT', `${field} must be an integer from 0 to 2^53 - 1 (got ${describe(v)})`);
  }
  return v;
}

/** A request field that must be a string (proto3 gives '' when absent). */
export function requestString(m: Msg, field: string): string {
  const v = m[field];
  if (typeof v !== 'string') throw new MooringError('INVALID_ARGUMENT', `${field} must be a string (got ${describe(v)})`);
  return v;
}
