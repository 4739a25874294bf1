import { EventEmitter } from 'node:events';
import type * as TE from 'typed-emitter';

import type { AccessMode } from '../attachment/attachment-reconciler.js';
import type { AttacherType, AttachmentParameters, AttachmentTicket, AttachmentTicketStatus, Frontend } from '../attachment/attachment-ticket.js';
import type { DataEngineEvent, EngineSnapshotInfo, RebuildProgress, SnapshotCopyResult } from '../data-engine/data-engine.js';
import { MooringError } from '../errors.js';
import type { Engine } from './engine.js';
import type { LockHandover } from '../locks/locked-process.js';
import type { Lockspace } from '../locks/lockspace.js';
import type { MigrationPhase } from '../cluster/cluster-records.js';
import type { VolumeSalvagedEvent } from '../mooring-options.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** Options of {@link Mooring.createVolume}. */
export interface VolumeCreateOptions {
  /** Volume name ([A-Za-z0-9._-]{1,63}), unique in the store. */
  name: string;
  /** Size in bytes: a positive multiple of 4096 (default with a backing image: its virtual size rounded up to 4096; never less than it). */
  sizeBytes?: number;
  /** Number of replicas, each on a different host (default 3, or the number of hosts offered when fewer). */
  replicas?: number;
  /** Hosts to place the replicas on (default: the hosts with the fewest replicas). */
  hosts?: string[];
  /** `rwo` (default): one host at a time; `migratable`: may live-migrate between hosts (block only). */
  accessMode?: AccessMode;
  /** A backing image (by name) beneath every replica: its file is delivered to each replica's host first (the volume waits for it). */
  backingImage?: string;
}

/** Options of {@link Volume.clone} (the clone has the source's size and backing image). */
export interface VolumeCloneOptions extends Omit<VolumeCreateOptions, 'sizeBytes' | 'backingImage'> {
  /** Snapshot of this volume to copy. */
  snapshot: string;
}

/** Options of {@link Volume.attach}. */
export interface AttachOptions {
  /** Host whose data engine runs the engine (default: this host, {@link Mooring.hostId}). */
  host?: string;
  /** NBD address to export on (default: none). */
  nbd?: string | null;
  /** Attach without frontend (no export; default false). */
  disableFrontend?: boolean;
  /** Who attaches: `api` (default) or `workload` (a VM). Both may start a migration. */
  attacher?: 'api' | 'workload';
  /** Ticket id (default `<attacher>-<host>`); attaching again with the same id updates it. */
  ticketId?: string;
  /** Recorded in the ticket's parameters (who had it attached before). */
  lastAttachedBy?: string | null;
  /** How long to wait for the ticket to be satisfied (default: the cluster's ticketWaitTimeoutMs). */
  timeoutMs?: number;
}

/** Options of {@link Volume.detach}. */
export interface DetachOptions {
  /** Host to detach from; omitted or '' detaches from every host. */
  host?: string;
  /** Only this ticket (of any attacher type); default: the `api` and `workload` tickets of `host`. */
  ticketId?: string;
}

/** A ticket and its status. */
export interface VolumeTicket extends AttachmentTicket {
  /** Whether the ticket is satisfied and why not, or null before the reconciler has looked at it. */
  status: AttachmentTicketStatus | null;
}

/** Options of {@link Volume.setTicket}: a raw ticket for an embedder's own attacher. */
export interface TicketOptions {
  /** Ticket id, unique per volume; setting it again updates the ticket. */
  id: string;
  /** Who asks: decides the ticket's priority (see {@link AttacherType}). */
  type: AttacherType;
  /** The host that should run the volume's engine. */
  host: string;
  /** Frontend wanted, NBD address and who had it before (defaults: any frontend, no address). */
  parameters?: Partial<AttachmentParameters>;
}

/**
 * Moves the disk locks of a VM with its volume (two {@link LockedProcess}es fit): at
 * hand-over the source releases and reports its leases, the target acquires them at those
 * versions. On rollback after hand-over they move back the same way.
 */
export interface MigrationLocks {
  /** The source VM's lock holder: it hands its leases over (and takes them back on rollback). */
  source: {
    /** Releases the leases and reports their versions. */
    handOver(): Promise<LockHandover>;
    /** Acquires the leases at the versions handed over. */
    takeOver(handover: LockHandover, lockspaces: Lockspace[]): Promise<void>;
  };
  /** The target VM's lock holder (registered, holding nothing): it takes the leases over. */
  target: {
    /** Releases the leases and reports their versions. */
    handOver(): Promise<LockHandover>;
    /** Acquires the leases at the versions handed over. */
    takeOver(handover: LockHandover, lockspaces: Lockspace[]): Promise<void>;
  };
  /** The lockspaces the leases live in (joined on both hosts). */
  lockspaces: Lockspace[];
}

/**
 * Embedder hooks of a migration; each may be async and runs inside the step (a throwing
 * `beforeHandOver` aborts the hand-over; the others only produce a `failed` event).
 */
export interface MigrationHooks {
  /** Before the source drains (e.g. wait for QEMU's `pre-switchover`). */
  beforeHandOver?: (m: MigrationInfo) => void | Promise<void>;
  /** After the target claimed the volume (e.g. `migrate-continue`). */
  afterHandOver?: (m: MigrationInfo) => void | Promise<void>;
  /** After the source engine is gone. */
  afterConfirm?: (m: MigrationInfo) => void | Promise<void>;
  /** After the volume is back on the source only. */
  afterRollback?: (m: MigrationInfo) => void | Promise<void>;
}

/** Options of {@link Volume.migrate}. */
export interface MigrateOptions {
  /** The target's NBD export (QEMU's destination connects to it; default none). */
  nbd?: string | null;
  /** Ticket id of the target attachment (default `<attacher>-<target>`). */
  ticketId?: string;
  /** Who attaches on the target: `api` (default) or `workload`. */
  attacher?: 'api' | 'workload';
  /** Called at the steps of this migration (and kept for later ones, as {@link Volume.setMigrationHooks}). */
  hooks?: MigrationHooks;
  /** Disk locks to carry with the volume at hand-over. */
  locks?: MigrationLocks;
}

/** A migration as reported. */
export interface MigrationInfo {
  /** The volume migrating. */
  volume: string;
  /** The host it moves from. */
  sourceHost: string;
  /** The host it moves to. */
  targetHost: string;
  /** The step it is at. */
  phase: MigrationPhase;
  /** Writer epoch the target claimed (0 before hand-over). */
  epoch: number;
}

/** Figures of a hand-over. */
export interface HandOverResult extends MigrationInfo {
  /** From the source's drain start to the target accepting writes. */
  pauseMs: number;
  /** Of which: the source draining and flushing. */
  drainMs: number;
  /** Replicas the target writes (the others are rebuilt). */
  rwReplicaIds: string[];
}

/** A replica as the cluster reports it. */
export interface VolumeReplicaStatus {
  /** Replica id within the volume (`r0`, `r1`, ...; a replacement gets a new id). */
  id: string;
  /** The host whose data engine holds it. */
  hostId: string;
  /** Its name on that data engine. */
  name: string;
  /** As the writing engine reports it; as last recorded (or `unknown`) when detached or unreachable. */
  mode: 'RW' | 'WO' | 'ERR' | 'unknown';
  /** Present while it is being rebuilt. */
  rebuild?: RebuildProgress;
}

/** A volume as the cluster reports it. */
export interface VolumeStatus {
  /** The volume's name. */
  name: string;
  /** Its UUID, given when it was created. */
  uuid: string;
  /** The size recorded: a resize writes it before the data grows, so it leads while a resize is under way or was cut short. */
  sizeBytes: number;
  /** How many replicas it should have (`healthy` needs that many RW). */
  replicaCount: number;
  /** `rwo` or `migratable`. */
  accessMode: AccessMode;
  /** The backing image beneath its replicas, or null. */
  backingImage: string | null;
  /** detached; healthy (all RW); degraded (some RW, fewer than wanted); faulted (no RW); unknown (engine host unreachable). */
  state: 'detached' | 'healthy' | 'degraded' | 'faulted' | 'unknown';
  /** Where it is attached (during a migration: the source, until confirmed). */
  attachedHost: string | null;
  /** The host whose engine writes (during a migration after hand-over: the target), or null. */
  writerHost: string | null;
  /** The frontend of the attached engine (null when detached). */
  frontend: Frontend | null;
  /** A migration in progress, or null. */
  migration: MigrationInfo | null;
  /** The writer epoch of its engine (0 when detached). */
  epoch: number;
  /** Its NBD export, or null. */
  nbd: {
    /** Where it listens: `unix:PATH` or `tcp:HOST:PORT`. */
    address: string;
    /** The NBD URI for clients (`nbd+unix:///?socket=PATH`, `nbd://HOST:PORT`). */
    uri: string;
  } | null;
  /** Its replicas. */
  replicas: VolumeReplicaStatus[];
}

/** Events of a volume's migrations. */
/** What an engine of the volume reported, with the host it runs on. */
export type VolumeEngineEvent = Exclude<DataEngineEvent, { type: 'backing-image-file' }> & {
  /** The host whose engine reported it. */
  hostId: string;
};

/**
 * The engine events of a volume, one event name per kind: replica errors, epochs claimed,
 * replica-set changes, rebuild start/progress/completion/failure, self-repair attempts,
 * engines stopped, activated and deactivated, snapshot copy progress. They come from
 * whichever host runs an engine of the volume (`hostId` says which).
 */
export type VolumeEngineEvents = {
  [K in VolumeEngineEvent['type']]: (event: Extract<VolumeEngineEvent, { type: K }>) => void;
};

/** A volume's recorded size changed ({@link Volume.resize}). */
export interface VolumeResizedEvent {
  /** The volume's name. */
  volume: string;
  /** Its recorded size before. */
  oldSizeBytes: number;
  /** Its recorded size now. */
  newSizeBytes: number;
}

/** Events of a volume: its migrations, resizes, and what its engines report. */
export type VolumeEvents = VolumeEngineEvents & {
  /** The volume's recorded size grew ({@link Volume.resize}, or an attach that finished a resize cut short). */
  resized: (e: VolumeResizedEvent) => void;
  /** A migration was recorded; the target's standby engine is starting. */
  'migration-started': (m: MigrationInfo) => void;
  /** The target's standby engine serves (its export exists; I/O waits for the hand-over). */
  'migration-target-ready': (m: MigrationInfo) => void;
  /** The target claimed the volume and writes; `pauseMs` and `drainMs` say how long it took. */
  'migration-handed-over': (m: HandOverResult) => void;
  /** The migration ended on the target; `automatic` when Mooring ended it by itself (source host lost after hand-over, or an interrupted confirm finished). */
  'migration-confirmed': (m: MigrationInfo & { automatic: boolean }) => void;
  /** The migration ended on the source; `automatic` when Mooring ended it by itself (target lost, or an interrupted rollback finished); `reason` says why. */
  'migration-rolled-back': (m: MigrationInfo & { automatic: boolean; reason: string }) => void;
  /** A step (`step`: e.g. `deactivate-source`, `locks`, `activate-target`, or a hook's name) failed with `error`. */
  'migration-failed': (m: MigrationInfo & { step: string; error: MooringError }) => void;
};

/** What a {@link Volume} asks of its cluster. @internal */
export interface VolumeOps {
  /** Where an attach without a host goes (this host), or null. */
  defaultHost(): string | null;
  engine(name: string): Promise<Engine | null>;
  clone(name: string, options: VolumeCloneOptions): Promise<{ volume: Volume; copiedBytes: number }>;
  attach(name: string, options: AttachOptions): Promise<VolumeStatus>;
  detach(name: string, options: DetachOptions): Promise<void>;
  status(name: string): Promise<VolumeStatus>;
  tickets(name: string): Promise<VolumeTicket[]>;
  setTicket(name: string, t: TicketOptions): Promise<VolumeTicket>;
  deleteTicket(name: string, id: string): Promise<void>;
  migrate(name: string, target: string, options: MigrateOptions): Promise<MigrationInfo>;
  migration(name: string): Promise<MigrationInfo | null>;
  handOver(name: string): Promise<HandOverResult>;
  /** `endsOn`: the host the volume runs on once it is confirmed (a call after that resolves). */
  confirm(name: string, endsOn?: string): Promise<void>;
  /** `endsOn`: the host the volume runs on once it is rolled back (a call after that resolves). */
  rollback(name: string, endsOn?: string): Promise<void>;
  setHooks(name: string, hooks: MigrationHooks | null, locks: MigrationLocks | null): void;
  createSnapshot(name: string, snapshot: string, labels: Record<string, string> | undefined): Promise<EngineSnapshotInfo>;
  listSnapshots(name: string): Promise<EngineSnapshotInfo[]>;
  deleteSnapshot(name: string, snapshot: string): Promise<void>;
  revertSnapshot(name: string, snapshot: string): Promise<void>;
  exportSnapshot(name: string, snapshot: string, options: { path: string; host?: string }): Promise<SnapshotCopyResult & { hostId: string }>;
  rebuild(name: string, options: { host?: string; timeoutMs?: number }): Promise<VolumeStatus>;
  salvage(name: string, options: { host?: string; timeoutMs?: number }): Promise<VolumeSalvagedEvent & { status: VolumeStatus }>;
  resize(name: string, sizeBytes: number): Promise<VolumeResizedEvent>;
}

/**
 * A migration in progress: hand over, then confirm (the source goes away) or roll back (the
 * target goes away). Obtained from {@link Volume.migrate} or
 * {@link Volume.migration}; every method also works after a restart of the embedding
 * process, from the state store.
 */
export class Migration {
  readonly #ops: VolumeOps;

  /** @internal */
  constructor(
    /** The volume migrating. */
    readonly volume: string,
    /** The host it moves from. */
    readonly sourceHost: string,
    /** The host it moves to. */
    readonly targetHost: string,
    ops: VolumeOps,
  ) {
    this.#ops = ops;
  }

  /** The recorded state (null once confirmed or rolled back). */
  info(): Promise<MigrationInfo | null> {
    return this.#ops.migration(this.volume);
  }

  /**
   * Moves the writer: the source drains and flushes, locks move (if given), the target claims
   * a writer epoch newly allocated by the cluster and serves. From then on the source cannot change any replica. Call it
   * at QEMU's `pre-switchover`. Idempotent after success.
   *
   * @throws MooringError INVALID_STATE (no migration), LOCK_VERSION_MISMATCH/LOCK_HELD (the locks were refused: the source serves again and the migration stays target-ready), UNAVAILABLE
   */
  handOver(): Promise<HandOverResult> {
    return this.#ops.handOver(this.volume);
  }

  /**
   * Ends the migration on the target: hands over first if that has not happened, then stops
   * the source engine. Idempotent: once the volume runs on the target with no migration left
   * (this call, another one, or Mooring itself after the source host was lost past the
   * hand-over: `migration-confirmed` with `automatic`), it resolves.
   *
   * @throws MooringError INVALID_STATE (the migration ended otherwise, e.g. rolled back), UNAVAILABLE
   */
  confirm(): Promise<void> {
    return this.#ops.confirm(this.volume, this.targetHost);
  }

  /**
   * Ends the migration on the source: before hand-over the standby stops; after it the
   * target drains and the source claims a newly allocated epoch. Idempotent as
   * {@link Migration.confirm}: resolves once the volume runs on the source with no migration left.
   *
   * @throws MooringError INVALID_STATE (the migration ended otherwise, e.g. confirmed), UNAVAILABLE
   */
  rollback(): Promise<void> {
    return this.#ops.rollback(this.volume, this.sourceHost);
  }
}

/**
 * One volume, whatever hosts its replicas are on: attach and detach by tickets, live
 * migration with confirm and rollback, snapshots, clone, export and rebuild (these
 * operations attach a detached volume by themselves for their run), status and migration
 * events. Get it from {@link Mooring.volume} or {@link Mooring.createVolume}: one object per
 * name while the Mooring is open.
 */
export class Volume extends (EventEmitter as new () => TypedEmitter<VolumeEvents>) {
  readonly #ops: VolumeOps;

  /** @internal */
  constructor(
    /** The volume's name. */
    readonly name: string,
    ops: VolumeOps,
  ) {
    super();
    this.#ops = ops;
  }

  /**
   * Asks for the volume on a host with a ticket and waits until the ticket is satisfied.
   * Attached there already: returns the current state. RWO attached on another reachable
   * host: BUSY. Migratable attached elsewhere: starts a migration and returns once the target
   * engine serves (as a standby). Attached on a host that cannot be reached: takes the volume
   * over (the new engine's epoch fences the old one).
   *
   * @throws MooringError NOT_FOUND, BUSY, UNAVAILABLE, INVALID_ARGUMENT, NO_HEALTHY_REPLICA
   */
  attach(options: AttachOptions = {}): Promise<VolumeStatus> {
    if (typeof options !== 'object' || options === null) return this.#ops.attach(this.name, options);
    const host = options.host ?? this.#ops.defaultHost();
    if (host === null) return Promise.reject(new MooringError('INVALID_ARGUMENT', `attach of ${this.name} needs a host: this process runs no data engine (Mooring.open without dir)`));
    return this.#ops.attach(this.name, { ...options, host });
  }

  /**
   * Withdraws tickets and detaches where none is left. During a migration, detaching the
   * source confirms it and detaching the target rolls it back.
   *
   * @throws MooringError NOT_FOUND, UNAVAILABLE (the engine's host cannot be reached)
   */
  detach(options: DetachOptions = {}): Promise<void> {
    return this.#ops.detach(this.name, options);
  }

  /**
   * The engine that writes the volume now (during a migration after hand-over: the
   * target's), as its data engine reports it: host, epoch, replicas and their modes,
   * rebuild progress, NBD export and its counters. Null when detached (or while its engine
   * is being started again after its data engine restarted).
   *
   * @throws MooringError NOT_FOUND, UNAVAILABLE (the engine's host does not answer)
   */
  engine(): Promise<Engine | null> {
    return this.#ops.engine(this.name);
  }

  /** State, replicas, export, migration and tickets. */
  status(): Promise<VolumeStatus> {
    return this.#ops.status(this.name);
  }

  /** Every ticket with its status. */
  tickets(): Promise<VolumeTicket[]> {
    return this.#ops.tickets(this.name);
  }

  /** Creates or updates a ticket of any attacher type (does not wait for it). */
  setTicket(ticket: TicketOptions): Promise<VolumeTicket> {
    return this.#ops.setTicket(this.name, ticket);
  }

  /** Deletes a ticket (no error if missing) and reconciles. */
  deleteTicket(id: string): Promise<void> {
    return this.#ops.deleteTicket(this.name, id);
  }

  /**
   * Starts a live migration to `targetHost` (migratable volumes, attached with frontend):
   * a standby engine starts there over the same replicas, exported at `options.nbd`.
   * Resolves once it serves; then {@link Migration.handOver}, and {@link Migration.confirm} or
   * {@link Migration.rollback}.
   *
   * @throws MooringError INVALID_STATE (not attached, RWO, frontend disabled, migrating elsewhere), NOT_FOUND, UNAVAILABLE
   */
  async migrate(targetHost: string, options: MigrateOptions = {}): Promise<Migration> {
    const m = await this.#ops.migrate(this.name, targetHost, options);
    return new Migration(this.name, m.sourceHost, m.targetHost, this.#ops);
  }

  /** The migration in progress (e.g. after a restart), or null. */
  async migration(): Promise<Migration | null> {
    const m = await this.#ops.migration(this.name);
    return m ? new Migration(this.name, m.sourceHost, m.targetHost, this.#ops) : null;
  }

  /** Hooks (and locks) for migrations started by tickets rather than {@link migrate}; null clears them. Kept in memory only. */
  setMigrationHooks(hooks: MigrationHooks | null, locks: MigrationLocks | null = null): void {
    this.#ops.setHooks(this.name, hooks, locks);
  }

  /**
   * Creates a new volume from a snapshot of this one (same size and backing image): both
   * attach themselves on one host (this volume's attached host, or its first reachable
   * replica host; frontends off unless it is attached), the snapshot's data is written
   * through the new volume's engine, and both detach again (this one stays attached if it was).
   *
   * @throws MooringError NOT_FOUND (no such snapshot), ALREADY_EXISTS, UNAVAILABLE, INVALID_ARGUMENT
   */
  clone(options: VolumeCloneOptions): Promise<{
    /** The new volume (detached, unless this one was attached). */
    volume: Volume;
    /** Data bytes written into it. */
    copiedBytes: number;
  }> {
    return this.#ops.clone(this.name, options);
  }

  /** Takes a snapshot; a detached volume attaches itself (frontend disabled) for it and detaches again. */
  createSnapshot(name: string, options: { labels?: Record<string, string> } = {}): Promise<EngineSnapshotInfo> {
    return this.#ops.createSnapshot(this.name, name, options.labels);
  }

  /** Snapshots, bottom first (a detached volume attaches itself to list them). */
  listSnapshots(): Promise<EngineSnapshotInfo[]> {
    return this.#ops.listSnapshots(this.name);
  }

  /** Deletes a snapshot (a detached volume attaches itself for it). */
  deleteSnapshot(name: string): Promise<void> {
    return this.#ops.deleteSnapshot(this.name, name);
  }

  /**
   * Makes the volume's content that of snapshot `name` (a new head on top of it). Refused while
   * the volume is attached with a frontend: its NBD clients would see their disk change
   * under them. A detached volume attaches itself (frontend disabled) for it.
   *
   * @throws MooringError INVALID_STATE (attached with a frontend), NOT_FOUND
   */
  revertToSnapshot(name: string): Promise<void> {
    return this.#ops.revertSnapshot(this.name, name);
  }

  /**
   * Writes the volume as of a snapshot into a raw file on the host that runs its engine (the
   * attached host; for a detached volume `host`, default the first replica's host, where it
   * attaches itself without frontend).
   */
  exportSnapshot(snapshot: string, options: { path: string; host?: string }): Promise<SnapshotCopyResult & {
    /** The host the file was written on. */
    hostId: string;
  }> {
    return this.#ops.exportSnapshot(this.name, snapshot, options);
  }

  /**
   * Brings every replica back to RW: a detached volume attaches itself (frontend disabled) on
   * `host` (default: the first reachable replica host), waits until its engine has rebuilt or
   * replaced the broken replicas, and detaches.
   */
  rebuild(options: { host?: string; timeoutMs?: number } = {}): Promise<VolumeStatus> {
    return this.#ops.rebuild(this.name, options);
  }

  /**
   * Brings the volume back when none of its RW replicas is left (docs/salvage.md): the
   * replicas whose hosts answer are claimed, the one holding the newest data serves (every
   * acknowledged write, when the replica set's rules can prove it: `complete`), the others
   * are rebuilt from it, and the replicas of hosts that do not answer are replaced. Calling
   * it asserts that those hosts are gone for good: if one still ran an engine over them, it
   * could go on writing there. Runs under a `salvage` ticket on `host` (default: where the
   * volume's tickets want it, else a replica host that answers) and waits until the volume
   * is healthy; it stays attached for the tickets that want it. A running engine of the
   * volume is stopped first (its clients reconnect): on a volume that still has a majority
   * and a RW replica this is a restart that loses nothing (`complete`). A
   * `volume-salvaged` event on the {@link Mooring} reports the same.
   *
   * @throws MooringError INVALID_STATE (it migrates), NO_HEALTHY_REPLICA (no replica host answers), NO_QUORUM (a replica host stopped answering during the start: try again), UNAVAILABLE (not healthy within `timeoutMs`; the salvage itself is done), NOT_FOUND, BUSY
   */
  salvage(options: { host?: string; timeoutMs?: number } = {}): Promise<VolumeSalvagedEvent & {
    /** The volume's status once healthy. */
    status: VolumeStatus;
  }> {
    return this.#ops.salvage(this.name, options);
  }

  /**
   * Grows the volume to `sizeBytes` (docs/cluster.md, "Resize"). Attached, it grows live:
   * every RW replica records the new size durably, then the engine and its NBD export take
   * it, and writes past the old end are refused until then. NBD connections opened from
   * then on (nbdinfo, a reconnecting QEMU) see the new size; a connection negotiated before
   * keeps its size, so a running QEMU needs a new connection and `block_resize` before its
   * guest sees it (docs/nbd-frontend.md, "Resize"). Detached, each replica grows through its
   * data engine. The size is recorded first: a resize that fails part-way is finished by
   * calling it again, or when the volume is next attached. Emits `resized`. The same size
   * does nothing (or finishes an interrupted resize).
   *
   * @throws MooringError INVALID_ARGUMENT (smaller: volumes only grow; not a multiple of
   *   4096; above the volume limit), INVALID_STATE (migrating), NOT_FOUND, BUSY (a rebuild
   *   runs: ask again when it is done), UNAVAILABLE, UNSUPPORTED (a data engine of a release
   *   without resize)
   */
  resize(sizeBytes: number): Promise<VolumeResizedEvent> {
    return this.#ops.resize(this.name, sizeBytes);
  }
}
