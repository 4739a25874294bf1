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
import { RecordFields, isObject } from '../state/record-fields.js';
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
  /** The disk id its data engine last reported ('' unknown: never seen, or an older data engine). */
  diskId: string;
  /** An eviction was asked for: its replicas and image files move to other hosts. */
  evicting: boolean;
}

function schemaOf(f: RecordFields): number {
  const s = f.int('schema', 1, Number.MAX_SAFE_INTEGER);
  if (s > CLUSTER_SCHEMA_VERSION) f.fail(`schema ${s} is newer than this release understands (${CLUSTER_SCHEMA_VERSION})`);
  return s;
}

/** @internal */
export function parseVolumeRecord(v: unknown, key: string): VolumeRecord {
  const f: RecordFields = new RecordFields(KIND.volume, key, v);
  const r: VolumeRecord = {
    schema: schemaOf(f),
    name: f.str('name', NAME_PATTERN),
    uuid: f.str('uuid', /^[0-9a-f-]{36}$/),
    sizeBytes: f.int('sizeBytes', 4096, VOLUME_SIZE_MAX_BYTES),
    replicaCount: f.int('replicaCount', REPLICA_COUNT_MIN, REPLICA_COUNT_MAX),
    createdMs: f.int('createdMs', 0, Number.MAX_SAFE_INTEGER),
    accessMode: 'rwo',
    desiredHost: null,
    migrationHost: null,
    frontend: { ...NO_FRONTEND_CHOSEN },
    migrationFrontend: { ...NO_FRONTEND_CHOSEN },
    backingImage: f.optStr('backingImage', NAME_PATTERN),
  };
  if (r.name !== key) f.fail(`name ${r.name} does not match its key`);
  if (r.schema >= 2) {
    const mode = f.raw('accessMode');
    if (mode !== 'rwo' && mode !== 'migratable') f.fail('accessMode is not rwo or migratable');
    r.accessMode = mode;
    r.desiredHost = f.optStr('desiredHost', NAME_PATTERN);
    r.migrationHost = f.optStr('migrationHost', NAME_PATTERN);
    r.frontend = frontendField(f, 'frontend');
    r.migrationFrontend = frontendField(f, 'migrationFrontend');
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

function frontendField(f: RecordFields, k: string): Frontend {
  const o = f.obj(k);
  const nbd = o.raw('nbd');
  if (nbd !== null && typeof nbd !== 'string') f.fail(`${k}.nbd is not a string or null`);
  return { disabled: o.bool('disabled'), nbd };
}

/** @internal */
export function parseAttachmentRecord(v: unknown, key: string): AttachmentRecord {
  const f: RecordFields = new RecordFields(KIND.attachment, key, v);
  const tickets = f.list('tickets', ATTACHMENT_TICKETS_MAX);
  const statuses = f.list('statuses', ATTACHMENT_TICKETS_MAX);
  const r: AttachmentRecord = {
    schema: schemaOf(f),
    volume: f.str('volume', NAME_PATTERN),
    tickets: tickets.map((raw, i) => {
      const t = new RecordFields(KIND.attachment, key, raw, `tickets[${i}]`);
      try {
        const { id, type } = checkTicketIdentity(t.raw('id'), t.raw('type'));
        const heldBy = t.optStr('heldBy', NAME_PATTERN);
        return { id, type, hostId: t.str('hostId', NAME_PATTERN), parameters: checkParameters(t.raw('parameters')), generation: t.int('generation', 1, Number.MAX_SAFE_INTEGER), ...(heldBy === null ? {} : { heldBy }) };
      } catch (err) {
        if (err instanceof MooringError && err.code === 'INVALID_ARGUMENT') f.fail(err.message);
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
  if (r.volume !== key) f.fail('volume does not match its key');
  if (new Set(r.tickets.map((t) => t.id)).size !== r.tickets.length) f.fail('two tickets share an id');
  return r;
}

/** Tickets per volume. */
export const ATTACHMENT_TICKETS_MAX = 64;

const PHASES = new Set(['starting', 'target-ready', 'handing-over', 'handed-over', 'confirming', 'rolling-back']);

/** @internal */
export function parseMigrationRecord(v: unknown, key: string): MigrationRecord {
  const f: RecordFields = new RecordFields(KIND.migration, key, v);
  const phase = f.raw('phase');
  if (typeof phase !== 'string' || !PHASES.has(phase)) f.fail('phase is not a migration phase');
  const h = f.optObj('handOver');
  let handOver: MigrationRecord['handOver'] = null;
  if (h) {
    const ids = h.list('rwReplicaIds', REPLICA_COUNT_MAX);
    if (!ids.every((x) => typeof x === 'string' && NAME_PATTERN.test(x))) f.fail('handOver.rwReplicaIds holds a bad id');
    handOver = {
      epoch: h.int('epoch', 0, Number.MAX_SAFE_INTEGER),
      // Absent in records of releases before replica-set generations.
      generation: h.raw('generation') === undefined ? 0 : h.int('generation', 0, Number.MAX_SAFE_INTEGER),
      rwReplicaIds: ids as string[],
    };
  }
  const r: MigrationRecord = {
    schema: schemaOf(f),
    volume: f.str('volume', NAME_PATTERN),
    sourceHost: f.str('sourceHost', NAME_PATTERN),
    targetHost: f.str('targetHost', NAME_PATTERN),
    phase: phase as MigrationPhase,
    handOver,
    targetActivated: f.raw('targetActivated') === true,
    startedMs: f.int('startedMs', 0, Number.MAX_SAFE_INTEGER),
    updatedMs: f.int('updatedMs', 0, Number.MAX_SAFE_INTEGER),
  };
  if (r.volume !== key) f.fail('volume does not match its key');
  return r;
}

// One collator for every sort by replica id: localeCompare with options builds one per call,
// which made sorting each volume's replicas a large part of a pass over many volumes.
const REPLICA_ID_ORDER = new Intl.Collator('en', { numeric: true });

/** Orders replica records by id, numerically (r2 before r10). */
export function byReplicaId(a: { id: string }, b: { id: string }): number {
  return REPLICA_ID_ORDER.compare(a.id, b.id);
}

const MODES = new Set(['RW', 'WO', 'ERR', 'unknown']);

/** @internal */
export function parseReplicaRecord(v: unknown, key: string): ReplicaRecord {
  const f: RecordFields = new RecordFields(KIND.replica, key, v);
  const mode = f.raw('mode');
  if (typeof mode !== 'string' || !MODES.has(mode)) f.fail('mode is not RW, WO, ERR or unknown');
  const lastError = f.raw('lastError');
  const r: ReplicaRecord = {
    schema: schemaOf(f),
    volume: f.str('volume', NAME_PATTERN),
    id: f.str('id', NAME_PATTERN),
    hostId: f.str('hostId', NAME_PATTERN),
    name: f.str('name', NAME_PATTERN),
    mode: mode as ReplicaRecord['mode'],
    failedSinceMs: f.optInt('failedSinceMs', 0, Number.MAX_SAFE_INTEGER),
    lastError: typeof lastError === 'string' ? lastError.slice(0, 4096) : null,
  };
  if (r.name !== key) f.fail('name does not match its key');
  return r;
}

/** @internal */
export function parseEngineRecord(v: unknown, key: string): EngineRecord {
  const f: RecordFields = new RecordFields(KIND.engine, key, v);
  const nbd = f.raw('nbd');
  if (nbd !== null && typeof nbd !== 'string') f.fail('nbd is not a string or null');
  const r: EngineRecord = {
    schema: schemaOf(f),
    volume: f.str('volume', NAME_PATTERN),
    hostId: f.str('hostId', NAME_PATTERN),
    nbd,
    frontendDisabled: f.raw('frontendDisabled') === true,
    epoch: f.int('epoch', 0, Number.MAX_SAFE_INTEGER),
    startedMs: f.int('startedMs', 0, Number.MAX_SAFE_INTEGER),
  };
  if (r.volume !== key) f.fail('volume does not match its key');
  return r;
}

/** @internal */
export function parseHostRecord(v: unknown, key: string): HostRecord {
  const f: RecordFields = new RecordFields(KIND.host, key, v);
  const addr = f.raw('replicaAddress');
  if (addr !== null && typeof addr !== 'string') f.fail('replicaAddress is not a string or null');
  const diskId = f.raw('diskId');
  const r: HostRecord = {
    schema: schemaOf(f),
    hostId: f.str('hostId', NAME_PATTERN),
    replicaAddress: addr,
    lastSeenMs: f.int('lastSeenMs', 0, Number.MAX_SAFE_INTEGER),
    diskId: typeof diskId === 'string' ? diskId.slice(0, 64) : '',
    evicting: f.raw('evicting') === true,
  };
  if (r.hostId !== key) f.fail('hostId does not match its key');
  return r;
}

/** @internal */
export function parseVolumeEpochRecord(v: unknown, key: string): VolumeEpochRecord {
  const f: RecordFields = new RecordFields(KIND.volumeEpoch, key, v);
  const r: VolumeEpochRecord = {
    schema: schemaOf(f),
    volume: f.str('volume', NAME_PATTERN),
    last: f.int('last', 0, Number.MAX_SAFE_INTEGER),
    updatedMs: f.int('updatedMs', 0, Number.MAX_SAFE_INTEGER),
  };
  if (r.volume !== key) f.fail('volume does not match its key');
  return r;
}
