/**
 * The documents a {@link Cluster} keeps in its {@link StateStore}: one per volume, replica,
 * engine and host, each with a spec (what is wanted) and a status (what was last seen),
 * like the Kubernetes objects Longhorn keeps. Validated on read: a store may be shared
 * and its contents are treated as untrusted.
 *
 * @packageDocumentation
 */
import { MooringError } from '../errors.js';
import { NAME_PATTERN, REPLICA_COUNT_MAX, REPLICA_COUNT_MIN, VOLUME_SIZE_MAX_BYTES } from '../util/limits.js';

/** Schema version of the cluster documents. */
export const CLUSTER_SCHEMA_VERSION = 1;

/** Store kinds used by a cluster. */
export const KIND = {
  volume: 'volume',
  replica: 'replica',
  engine: 'engine',
  host: 'host',
} as const;

/** A volume: spec and the status last recorded. */
export interface VolumeRecord {
  schema: number;
  name: string;
  uuid: string;
  sizeBytes: number;
  /** Desired number of RW replicas. */
  replicaCount: number;
  createdMs: number;
}

/** Where a replica lives and how it was last seen. Key: its name (unique: volume prefix, id and a random part). */
export interface ReplicaRecord {
  schema: number;
  volume: string;
  /** Id within the volume (`r0`, `r1`, ...; a replacement gets a new id). */
  id: string;
  hostId: string;
  /** Replica name on that host's data engine; also its store key. */
  name: string;
  /** Last mode seen by the engine ('unknown' before the first attach). */
  mode: 'RW' | 'WO' | 'ERR' | 'unknown';
  /** When it was last seen ERR (ms since the epoch), for the replacement wait. */
  failedSinceMs: number | null;
  lastError: string | null;
}

/** Where a volume is attached. Key: the volume name. */
export interface EngineRecord {
  schema: number;
  volume: string;
  hostId: string;
  nbd: string | null;
  /** Epoch last seen. */
  epoch: number;
  startedMs: number;
}

/** How to reach a host's replica server. Key: the host id. */
export interface HostRecord {
  schema: number;
  hostId: string;
  replicaAddress: string | null;
  lastSeenMs: number;
}

function fail(kind: string, key: string, why: string): never {
  throw new MooringError('CORRUPT_METADATA', `state store: ${kind} ${key}: ${why}`, { details: { kind, key } });
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(o: Record<string, unknown>, k: string, kind: string, key: string, pattern?: RegExp): string {
  const v = o[k];
  if (typeof v !== 'string' || (pattern && !pattern.test(v))) fail(kind, key, `${k} is not a valid string`);
  return v;
}

function int(o: Record<string, unknown>, k: string, kind: string, key: string, min: number, max: number): number {
  const v = o[k];
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) fail(kind, key, `${k} is not an integer in [${min}, ${max}]`);
  return v;
}

function schemaOf(o: Record<string, unknown>, kind: string, key: string): number {
  const s = int(o, 'schema', kind, key, 1, Number.MAX_SAFE_INTEGER);
  if (s > CLUSTER_SCHEMA_VERSION) fail(kind, key, `schema ${s} is newer than this release understands (${CLUSTER_SCHEMA_VERSION})`);
  return s;
}

/** @internal */
export function parseVolumeRecord(v: unknown, key: string): VolumeRecord {
  if (!isObject(v)) fail(KIND.volume, key, 'not an object');
  const r: VolumeRecord = {
    schema: schemaOf(v, KIND.volume, key),
    name: str(v, 'name', KIND.volume, key, NAME_PATTERN),
    uuid: str(v, 'uuid', KIND.volume, key, /^[0-9a-f-]{36}$/),
    sizeBytes: int(v, 'sizeBytes', KIND.volume, key, 4096, VOLUME_SIZE_MAX_BYTES),
    replicaCount: int(v, 'replicaCount', KIND.volume, key, REPLICA_COUNT_MIN, REPLICA_COUNT_MAX),
    createdMs: int(v, 'createdMs', KIND.volume, key, 0, Number.MAX_SAFE_INTEGER),
  };
  if (r.name !== key) fail(KIND.volume, key, `name ${r.name} does not match its key`);
  return r;
}

const MODES = new Set(['RW', 'WO', 'ERR', 'unknown']);

/** @internal */
export function parseReplicaRecord(v: unknown, key: string): ReplicaRecord {
  if (!isObject(v)) fail(KIND.replica, key, 'not an object');
  const mode = v['mode'];
  if (typeof mode !== 'string' || !MODES.has(mode)) fail(KIND.replica, key, 'mode is not RW, WO, ERR or unknown');
  const failed = v['failedSinceMs'];
  const lastError = v['lastError'];
  const r: ReplicaRecord = {
    schema: schemaOf(v, KIND.replica, key),
    volume: str(v, 'volume', KIND.replica, key, NAME_PATTERN),
    id: str(v, 'id', KIND.replica, key, NAME_PATTERN),
    hostId: str(v, 'hostId', KIND.replica, key, NAME_PATTERN),
    name: str(v, 'name', KIND.replica, key, NAME_PATTERN),
    mode: mode as ReplicaRecord['mode'],
    failedSinceMs: failed === null || failed === undefined ? null : int(v, 'failedSinceMs', KIND.replica, key, 0, Number.MAX_SAFE_INTEGER),
    lastError: typeof lastError === 'string' ? lastError.slice(0, 4096) : null,
  };
  if (r.name !== key) fail(KIND.replica, key, 'name does not match its key');
  return r;
}

/** @internal */
export function parseEngineRecord(v: unknown, key: string): EngineRecord {
  if (!isObject(v)) fail(KIND.engine, key, 'not an object');
  const nbd = v['nbd'];
  if (nbd !== null && typeof nbd !== 'string') fail(KIND.engine, key, 'nbd is not a string or null');
  const r: EngineRecord = {
    schema: schemaOf(v, KIND.engine, key),
    volume: str(v, 'volume', KIND.engine, key, NAME_PATTERN),
    hostId: str(v, 'hostId', KIND.engine, key, NAME_PATTERN),
    nbd,
    epoch: int(v, 'epoch', KIND.engine, key, 0, Number.MAX_SAFE_INTEGER),
    startedMs: int(v, 'startedMs', KIND.engine, key, 0, Number.MAX_SAFE_INTEGER),
  };
  if (r.volume !== key) fail(KIND.engine, key, 'volume does not match its key');
  return r;
}

/** @internal */
export function parseHostRecord(v: unknown, key: string): HostRecord {
  if (!isObject(v)) fail(KIND.host, key, 'not an object');
  const addr = v['replicaAddress'];
  if (addr !== null && typeof addr !== 'string') fail(KIND.host, key, 'replicaAddress is not a string or null');
  const r: HostRecord = {
    schema: schemaOf(v, KIND.host, key),
    hostId: str(v, 'hostId', KIND.host, key, NAME_PATTERN),
    replicaAddress: addr,
    lastSeenMs: int(v, 'lastSeenMs', KIND.host, key, 0, Number.MAX_SAFE_INTEGER),
  };
  if (r.hostId !== key) fail(KIND.host, key, 'hostId does not match its key');
  return r;
}
