/**
 * The documents an upgrade session keeps in the state store (seed 004's
 * DataEngineUpgradeManager and NodeDataEngineUpgrade): one session document, `current`,
 * and one per host it upgrades. Every step is written before it acts and after it ends, so
 * a restarted VM manager resumes where the last one stopped. Validated on read.
 *
 * @packageDocumentation
 */
import { isMooringErrorCode, type MooringErrorCode } from '../errors.js';
import { RecordFields } from '../state/record-fields.js';
import { NAME_PATTERN } from '../util/limits.js';

/** Schema of the upgrade documents (their own kinds; the cluster's keep schema 2). */
export const UPGRADE_SCHEMA_VERSION = 1;
/** Store kinds of the upgrade documents. */
export const UPGRADE_KIND = { session: 'upgrade-session', host: 'host-upgrade' } as const;
/** Key of the one session document of a cluster. */
export const UPGRADE_SESSION_KEY = 'current';
/** Hosts one session may list (a bound for hostile documents). */
export const UPGRADE_HOSTS_MAX = 1024;
/**
 * Volumes one host's document may list. A store value is at most 1 MiB
 * (docs/data-engine.md), and a volume's entry takes about 200 bytes.
 */
export const UPGRADE_VOLUMES_PER_HOST_MAX = 2000;

/** A session's state (seed 004: undefined → initializing → upgrading → completed | error); `cancelled` is Mooring's. */
export type UpgradeState = 'undefined' | 'initializing' | 'upgrading' | 'completed' | 'error' | 'cancelled';
export const UPGRADE_STATES: readonly UpgradeState[] = ['undefined', 'initializing', 'upgrading', 'completed', 'error', 'cancelled'];

/** A host's state in a session: the seed's steps, then its end; `pending` until its turn. */
export type HostUpgradeState =
  | 'pending'
  | 'initializing'
  | 'switching-over'
  | 'upgrading-instance-manager'
  | 'switching-back'
  | 'rebuilding-replica'
  | 'completed'
  | 'error'
  | 'cancelled';
export const HOST_UPGRADE_STATES: readonly HostUpgradeState[] = [
  'pending',
  'initializing',
  'switching-over',
  'upgrading-instance-manager',
  'switching-back',
  'rebuilding-replica',
  'completed',
  'error',
  'cancelled',
];
/** Host states that keep the host unschedulable (no new replicas, no replacements there). */
export const HOST_UPGRADE_ACTIVE: ReadonlySet<HostUpgradeState> = new Set(['initializing', 'switching-over', 'upgrading-instance-manager', 'switching-back', 'rebuilding-replica']);
/**
 * Host states in which its engines may be between two processes (an in-place hand-off):
 * an engine found stopped there is the upgrade controller's to bring back, not the
 * reconcile's to start again. (A restart's engines are started again by the reconcile, in
 * switching-back.)
 */
export const HOST_UPGRADE_HANDING_OFF: ReadonlySet<HostUpgradeState> = new Set(['switching-over']);
/** Session states after which nothing more happens. */
export const UPGRADE_FINISHED: ReadonlySet<UpgradeState> = new Set(['completed', 'error', 'cancelled']);

/**
 * How a host's data engine is replaced. `in-place`: the old process hands its engines, with
 * their NBD clients connected, to the new one on the same host (a pause, no reconnect).
 * `restart`: the old process stops (its engines drain and flush, NBD clients lose their
 * connection and reconnect), the new one starts on the same directory and addresses, and
 * the host's engines are started again at a new epoch.
 */
export type UpgradeMethod = 'in-place' | 'restart';
export const UPGRADE_METHODS: readonly UpgradeMethod[] = ['in-place', 'restart'];
/** What the embedder asks for: `auto` picks the method that disturbs no client, or refuses. */
export type UpgradeMethodChoice = 'auto' | UpgradeMethod;

/**
 * The new data engine: its version and how to start it, as the embedder's
 * {@link DataEngineLauncher} understands it (one of `command`, `path` or `package`).
 */
export interface NewDataEngine {
  /** The version it reports (checked once it runs: `DataEngineInfo.version`). */
  version: string;
  /** The command line that runs it (argv), e.g. `['/opt/mooring-0.2/bin/mooring']`. */
  command?: string[];
  /** A directory holding the package to run. */
  path?: string;
  /** An npm package spec (name@version). */
  package?: string;
}

/** A coded error as recorded. */
export interface RecordedError {
  /** Its {@link MooringErrorCode}. */
  code: MooringErrorCode;
  /** Its message, for people. */
  message: string;
}

/** What an upgrade session was asked to do. */
export interface UpgradeSpec {
  /** Hosts in the order they are upgraded (all offered hosts when the embedder named none). */
  hosts: string[];
  /** The new data engine. */
  dataEngine: NewDataEngine;
  /** The method asked for. */
  method: UpgradeMethodChoice;
  /** How long one wait of a host's step may take (the new process answering, the volumes healthy again). */
  stepTimeoutMs: number;
}

/** A session as reported (the document without its bookkeeping). */
export interface UpgradeSessionInfo {
  /** The session's id (a UUID). */
  id: string;
  /** What it was asked to do. */
  spec: UpgradeSpec;
  /** Where it is. */
  state: UpgradeState;
  /** Paused: the step in progress finishes, then nothing moves until resumed. */
  paused: boolean;
  /** Cancel asked: hosts not started are left alone; a host not yet restarted is put back. */
  cancelRequested: boolean;
  /** The host being upgraded, or null. */
  upgradingHost: string | null;
  /** Why it ended in `error`, else null. */
  error: RecordedError | null;
  /** When it was started (ms since the epoch). */
  createdMs: number;
  /** When its document last changed. */
  updatedMs: number;
}

/** The session document. */
export interface UpgradeSessionRecord extends UpgradeSessionInfo {
  schema: number;
  /** Which control plane drives the session, and until when (a lease renewed while it runs). */
  ownerId: string;
  leaseUntilMs: number;
}

/** One volume on a host being upgraded. */
export interface VolumeUpgradeStatus {
  /** `engine`: its engine runs on the host (it may hold replicas there too); `replica`: only replicas. */
  role: 'engine' | 'replica';
  /** The snapshot taken before the host was touched, or null until taken. */
  snapshot: string | null;
  /** `listed` → `snapshotted` → `healthy` (every replica RW again, or detached). */
  state: 'listed' | 'snapshotted' | 'healthy';
}

/** One host's part of a session (seed 004's NodeDataEngineUpgrade status). */
export interface HostUpgradeStatus {
  /** The host. */
  hostId: string;
  /** Its step, or how it ended. */
  state: HostUpgradeState;
  /** How its data engine is replaced. */
  method: UpgradeMethod;
  /** Why that method (what `auto` saw). */
  methodReason: string;
  /** The data engine that ran before (`DataEngineInfo.instanceId`), once seen. */
  instanceBefore: string | null;
  /** Its version. */
  versionBefore: string | null;
  /** The version that runs after the upgrade. */
  versionAfter: string | null;
  /** The volumes with their engine or a replica on the host, by name. */
  volumes: Record<string, VolumeUpgradeStatus>;
  /** Why it ended in `error`, else null. */
  error: RecordedError | null;
  /** When its turn began (ms since the epoch). */
  startedMs: number | null;
  /** When it ended. */
  doneMs: number | null;
}

/** A host's document. Key: the host id. */
export interface HostUpgradeRecord extends HostUpgradeStatus {
  schema: number;
  /** The session it belongs to. */
  session: string;
}

// NAME_PATTERN without `.` and `..` (what checkName allows).
const NAME = new RegExp(`^(?!\\.\\.?$)${NAME_PATTERN.source.slice(1)}`);
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const MS_MAX = Number.MAX_SAFE_INTEGER;
const TEXT_MAX = 1024;

function schemaOf(f: RecordFields): number {
  const s = f.int('schema', 1, MS_MAX);
  if (s > UPGRADE_SCHEMA_VERSION) f.fail(`schema ${s} is newer than this release understands (${UPGRADE_SCHEMA_VERSION})`);
  return s;
}

function errorOf(f: RecordFields, k: string): RecordedError | null {
  const e: RecordFields | null = f.optObj(k);
  if (!e) return null;
  const code = e.str('code');
  if (!isMooringErrorCode(code)) return e.fail(`${k}.code is not an error code`);
  return { code, message: e.str('message', undefined, TEXT_MAX) };
}

/** @internal */
export function parseNewDataEngine(f: RecordFields): NewDataEngine {
  const out: NewDataEngine = { version: f.str('version', /^\S+$/, 128) };
  const command = f.raw('command');
  if (command !== undefined) {
    const argv = f.list('command', 64);
    if (argv.length === 0 || argv.some((a) => typeof a !== 'string' || a.length > 4096 || a.includes('\0'))) f.fail('command is not a list of strings');
    out.command = argv as string[];
  }
  if (f.raw('path') !== undefined) out.path = f.str('path', /^\/[^\0]*$/);
  if (f.raw('package') !== undefined) out.package = f.str('package', /^[^\s\0]+$/, 256);
  if ([out.command, out.path, out.package].filter((x) => x !== undefined).length !== 1) f.fail('dataEngine needs exactly one of command, path or package');
  return out;
}

/** @internal */
export function parseUpgradeSessionRecord(v: unknown, key: string): UpgradeSessionRecord {
  const f = new RecordFields(UPGRADE_KIND.session, key, v);
  const spec = f.obj('spec');
  const hosts = spec.list('hosts', UPGRADE_HOSTS_MAX);
  if (hosts.some((h) => typeof h !== 'string' || !NAME.test(h)) || new Set(hosts).size !== hosts.length) spec.fail('spec.hosts is not a list of distinct host ids');
  return {
    schema: schemaOf(f),
    id: f.str('id', UUID),
    spec: {
      hosts: hosts as string[],
      dataEngine: parseNewDataEngine(spec.obj('dataEngine')),
      method: spec.oneOf('method', ['auto', ...UPGRADE_METHODS] as const),
      stepTimeoutMs: spec.int('stepTimeoutMs', 1, MS_MAX),
    },
    state: f.oneOf('state', UPGRADE_STATES),
    paused: f.bool('paused'),
    cancelRequested: f.bool('cancelRequested'),
    upgradingHost: f.optStr('upgradingHost', NAME),
    error: errorOf(f, 'error'),
    ownerId: f.str('ownerId', UUID),
    leaseUntilMs: f.int('leaseUntilMs', 0, MS_MAX),
    createdMs: f.int('createdMs', 0, MS_MAX),
    updatedMs: f.int('updatedMs', 0, MS_MAX),
  };
}

/** @internal */
export function parseHostUpgradeRecord(v: unknown, key: string): HostUpgradeRecord {
  const f = new RecordFields(UPGRADE_KIND.host, key, v);
  const volumes: Record<string, VolumeUpgradeStatus> = {};
  const vf = f.obj('volumes');
  for (const name of f.mapKeys('volumes', UPGRADE_VOLUMES_PER_HOST_MAX, NAME)) {
    const e = vf.obj(name);
    volumes[name] = { role: e.oneOf('role', ['engine', 'replica'] as const), snapshot: e.optStr('snapshot', NAME), state: e.oneOf('state', ['listed', 'snapshotted', 'healthy'] as const) };
  }
  const r: HostUpgradeRecord = {
    schema: schemaOf(f),
    session: f.str('session', UUID),
    hostId: f.str('hostId', NAME),
    state: f.oneOf('state', HOST_UPGRADE_STATES),
    method: f.oneOf('method', UPGRADE_METHODS),
    methodReason: f.str('methodReason', undefined, TEXT_MAX),
    instanceBefore: f.optStr('instanceBefore', undefined, 128),
    versionBefore: f.optStr('versionBefore', undefined, 128),
    versionAfter: f.optStr('versionAfter', undefined, 128),
    volumes,
    error: errorOf(f, 'error'),
    startedMs: f.optInt('startedMs', 0, MS_MAX),
    doneMs: f.optInt('doneMs', 0, MS_MAX),
  };
  if (r.hostId !== key) f.fail('hostId does not match its key');
  return r;
}
