/**
 * The documents a {@link Mooring} keeps in its {@link StateStore}: one per volume, replica,
 * engine and host, each with a spec (what is wanted) and a status (what was last seen),
 * like the Kubernetes objects Longhorn keeps, and one epoch counter per volume (the writer
 * epochs its engines are given; src/cluster/epochs.ts). Validated on read: a store may be
 * shared and its contents are treated as untrusted.
 *
 * @packageDocumentation
 */
import type { AccessMode } from '../attachment/attachment-reconciler.js';
import { checkParameters, checkTicketIdentity, type AttachmentTicket, type AttachmentTicketStatus, type Frontend } from '../attachment/attachment-ticket.js';
import { MooringError } from '../errors.js';
import { NAME_PATTERN, REPLICA_COUNT_MAX, REPLICA_COUNT_MIN, VOLUME_SIZE_MAX_BYTES } from '../util/limits.js';

/**
 * Schema version of the cluster documents. 1: volumes, replicas, engines, hosts. 2: attachment
 * tickets, access modes and migrations (a store of version 1 is upgraded when a cluster opens
 * it; see `Mooring.open`).
 */
export const CLUSTER_SCHEMA_VERSION = 2;

/** Store kinds used by a cluster. */
export const KIND = {
  volume: 'volume',
  replica: 'replica',
  engine: 'engine',
  host: 'host',
  attachment: 'attachment',
  migration: 'migration',
  /** A volume's epoch counter ({@link VolumeEpochRecord}); added without a schema change: a store without it opens as before. */
  volumeEpoch: 'volume-epoch',
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
  /** rwo: one host at a time; migratable: may live-migrate (block only). Schema 1: rwo. */
  accessMode: AccessMode;
  /** Where the attachment reconciler wants it attached (null: detached). */
  desiredHost: string | null;
  /** Where it is migrating to (null: not migrating). */
  migrationHost: string | null;
  /** The frontend of the engine on desiredHost. */
  frontend: Frontend;
  /** The frontend of the migration target. */
  migrationFrontend: Frontend;
  /** The backing image beneath its replicas (src/backing-image/); absent in records written before backing images: none. */
  backingImage?: string | null;
}

/** A volume's tickets and their statuses (Longhorn's VolumeAttachment). Key: the volume name. */
export interface AttachmentRecord {
  schema: number;
  volume: string;
  tickets: AttachmentTicket[];
  statuses: AttachmentTicketStatus[];
}

/** Steps of a migration, as recorded (docs/migration.md has the diagram). */
export type MigrationPhase = 'starting' | 'target-ready' | 'handing-over' | 'handed-over' | 'confirming' | 'rolling-back';

/** A migration in progress. Key: the volume name. */
export interface MigrationRecord {
  schema: number;
  volume: string;
  sourceHost: string;
  targetHost: string;
  phase: MigrationPhase;
  /**
   * The source engine's hand-over, recorded before the target activates (so a restart can
   * finish it). `generation` is 0 in records written before replica sets had generations.
   */
  handOver: { epoch: number; generation: number; rwReplicaIds: string[] } | null;
  /** Whether the target has claimed the volume (it may have written: a rollback then re-activates the source). */
  targetActivated: boolean;
  startedMs: number;
  updatedMs: number;
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
  /** The export address (null: none); kept beside `frontend` for schema-1 readers. */
  nbd: string | null;
  /** Whether the engine runs without export (schema 1: false). */
  frontendDisabled: boolean;
  /** Epoch last seen. */
  epoch: number;
  startedMs: number;
}

/**
 * The last writer epoch allocated for a volume (docs/single-writer.md). Key: the volume name.
 * Only ever raised, by compare-and-set, and written before the epoch is handed to an engine;
 * kept when the volume is deleted, so an engine of a later volume of the same name never
 * gets an epoch an earlier one held.
 */
export interface VolumeEpochRecord {
  schema: number;
  volume: string;
  /** The highest epoch handed out (0: none yet). */
  last: number;
  updatedMs: number;
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
    accessMode: 'rwo',
    desiredHost: null,
    migrationHost: null,
    frontend: { ...NO_FRONTEND_CHOSEN },
    migrationFrontend: { ...NO_FRONTEND_CHOSEN },
    backingImage: optName(v, 'backingImage', KIND.volume, key),
  };
  if (r.name !== key) fail(KIND.volume, key, `name ${r.name} does not match its key`);
  if (r.schema >= 2) {
    const mode = v['accessMode'];
    if (mode !== 'rwo' && mode !== 'migratable') fail(KIND.volume, key, 'accessMode is not rwo or migratable');
    r.accessMode = mode;
    r.desiredHost = optName(v, 'desiredHost', KIND.volume, key);
    r.migrationHost = optName(v, 'migrationHost', KIND.volume, key);
    r.frontend = frontendField(v, 'frontend', KIND.volume, key);
    r.migrationFrontend = frontendField(v, 'migrationFrontend', KIND.volume, key);
  }
  return r;
}

/** The frontend recorded before any ticket chose one. */
export const NO_FRONTEND_CHOSEN: Readonly<Frontend> = Object.freeze({ disabled: false, nbd: null });

/** The record of a volume just made: detached, no ticket has chosen a host or frontend yet. */
export function newVolumeRecord(v: Pick<VolumeRecord, 'name' | 'uuid' | 'sizeBytes' | 'replicaCount' | 'createdMs' | 'accessMode' | 'backingImage'>): VolumeRecord {
  return {
    schema: CLUSTER_SCHEMA_VERSION,
    ...v,
    desiredHost: null,
    migrationHost: null,
    frontend: { ...NO_FRONTEND_CHOSEN },
    migrationFrontend: { ...NO_FRONTEND_CHOSEN },
  };
}

/** The attachment record of a volume without tickets. */
export function emptyAttachmentRecord(volume: string): AttachmentRecord {
  return { schema: CLUSTER_SCHEMA_VERSION, volume, tickets: [], statuses: [] };
}

function optName(o: Record<string, unknown>, k: string, kind: string, key: string): string | null {
  const v = o[k];
  if (v === null || v === undefined) return null;
  return str(o, k, kind, key, NAME_PATTERN);
}

function frontendField(o: Record<string, unknown>, k: string, kind: string, key: string): Frontend {
  const v = o[k];
  if (!isObject(v) || typeof v['disabled'] !== 'boolean') fail(kind, key, `${k} is not a frontend`);
  const nbd = v['nbd'];
  if (nbd !== null && typeof nbd !== 'string') fail(kind, key, `${k}.nbd is not a string or null`);
  return { disabled: v['disabled'], nbd };
}

/** @internal */
export function parseAttachmentRecord(v: unknown, key: string): AttachmentRecord {
  if (!isObject(v)) fail(KIND.attachment, key, 'not an object');
  const tickets = v['tickets'];
  const statuses = v['statuses'];
  if (!Array.isArray(tickets) || tickets.length > ATTACHMENT_TICKETS_MAX) fail(KIND.attachment, key, `tickets is not a list of at most ${ATTACHMENT_TICKETS_MAX}`);
  if (!Array.isArray(statuses) || statuses.length > ATTACHMENT_TICKETS_MAX) fail(KIND.attachment, key, 'statuses is not a list');
  const r: AttachmentRecord = {
    schema: schemaOf(v, KIND.attachment, key),
    volume: str(v, 'volume', KIND.attachment, key, NAME_PATTERN),
    tickets: tickets.map((t: unknown) => {
      if (!isObject(t)) fail(KIND.attachment, key, 'a ticket is not an object');
      try {
        const { id, type } = checkTicketIdentity(t['id'], t['type']);
        return {
          id,
          type,
          hostId: str(t, 'hostId', KIND.attachment, key, NAME_PATTERN),
          parameters: checkParameters(t['parameters']),
          generation: int(t, 'generation', KIND.attachment, key, 1, Number.MAX_SAFE_INTEGER),
        };
      } catch (err) {
        if (err instanceof MooringError && err.code === 'INVALID_ARGUMENT') fail(KIND.attachment, key, err.message);
        throw err;
      }
    }),
    // Statuses are recomputed on every pass; only their shape is checked here.
    statuses: statuses.filter(isObject).map((s) => ({
      id: String(s['id']),
      satisfied: s['satisfied'] === true,
      conditions: Array.isArray(s['conditions']) ? (s['conditions'] as AttachmentTicketStatus['conditions']).slice(0, 8) : [],
      generation: typeof s['generation'] === 'number' ? s['generation'] : 0,
    })),
  };
  if (r.volume !== key) fail(KIND.attachment, key, 'volume does not match its key');
  if (new Set(r.tickets.map((t) => t.id)).size !== r.tickets.length) fail(KIND.attachment, key, 'two tickets share an id');
  return r;
}

/** Tickets per volume. */
export const ATTACHMENT_TICKETS_MAX = 64;

const PHASES = new Set(['starting', 'target-ready', 'handing-over', 'handed-over', 'confirming', 'rolling-back']);

/** @internal */
export function parseMigrationRecord(v: unknown, key: string): MigrationRecord {
  if (!isObject(v)) fail(KIND.migration, key, 'not an object');
  const phase = v['phase'];
  if (typeof phase !== 'string' || !PHASES.has(phase)) fail(KIND.migration, key, 'phase is not a migration phase');
  const h = v['handOver'];
  let handOver: MigrationRecord['handOver'] = null;
  if (h !== null && h !== undefined) {
    if (!isObject(h) || !Array.isArray(h['rwReplicaIds']) || h['rwReplicaIds'].length > REPLICA_COUNT_MAX) fail(KIND.migration, key, 'handOver is not a hand-over');
    const ids = h['rwReplicaIds'] as unknown[];
    if (!ids.every((x) => typeof x === 'string' && NAME_PATTERN.test(x))) fail(KIND.migration, key, 'handOver.rwReplicaIds holds a bad id');
    handOver = {
      epoch: int(h, 'epoch', KIND.migration, key, 0, Number.MAX_SAFE_INTEGER),
      // Absent in records of releases before replica-set generations.
      generation: h['generation'] === undefined ? 0 : int(h, 'generation', KIND.migration, key, 0, Number.MAX_SAFE_INTEGER),
      rwReplicaIds: ids as string[],
    };
  }
  const r: MigrationRecord = {
    schema: schemaOf(v, KIND.migration, key),
    volume: str(v, 'volume', KIND.migration, key, NAME_PATTERN),
    sourceHost: str(v, 'sourceHost', KIND.migration, key, NAME_PATTERN),
    targetHost: str(v, 'targetHost', KIND.migration, key, NAME_PATTERN),
    phase: phase as MigrationPhase,
    handOver,
    targetActivated: v['targetActivated'] === true,
    startedMs: int(v, 'startedMs', KIND.migration, key, 0, Number.MAX_SAFE_INTEGER),
    updatedMs: int(v, 'updatedMs', KIND.migration, key, 0, Number.MAX_SAFE_INTEGER),
  };
  if (r.volume !== key) fail(KIND.migration, key, 'volume does not match its key');
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
    frontendDisabled: v['frontendDisabled'] === true,
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

/** @internal */
export function parseVolumeEpochRecord(v: unknown, key: string): VolumeEpochRecord {
  if (!isObject(v)) fail(KIND.volumeEpoch, key, 'not an object');
  const r: VolumeEpochRecord = {
    schema: schemaOf(v, KIND.volumeEpoch, key),
    volume: str(v, 'volume', KIND.volumeEpoch, key, NAME_PATTERN),
    last: int(v, 'last', KIND.volumeEpoch, key, 0, Number.MAX_SAFE_INTEGER),
    updatedMs: int(v, 'updatedMs', KIND.volumeEpoch, key, 0, Number.MAX_SAFE_INTEGER),
  };
  if (r.volume !== key) fail(KIND.volumeEpoch, key, 'volume does not match its key');
  return r;
}
