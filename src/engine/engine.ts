/**
 * LocalEngine: the replicator of one volume running in this process (a wrapped native
 * engine); a data engine runs one per attached volume. Internal: embedders reach a
 * volume's engine through `Volume.engine()` (the `Engine` handle). It fans writes out to
 * every RW replica, spreads reads, fences stale writers by epoch and serves NBD.
 *
 * `mooring/internal` exports it for tools that manage replica directories themselves.
 */
import { EventEmitter } from 'node:events';
import { isAbsolute, resolve } from 'node:path';
import type * as TE from 'typed-emitter';

import { MooringError, callNative, callNativeSync, codeFromErrno, type MooringErrorCode } from '../errors.js';
import type {
  NativeAddon,
  NativeEngine,
  NativeEngineEvent,
  NativeExtent,
  NativeNbdHandOffRecord,
  NativeLayerInfo,
  NativeRebuildResult,
  NativeRemoteReplica,
  NativeReplicaEndpoint,
  NativeReplicaMode,
  NativeReplicaState,
  NativeSnapshotCopyResult,
  NativeWriteZeroesOptions,
} from '../native/binding.js';
import { loadAddon } from '../native/load.js';
import { parseNbdAddress } from '../nbd/nbd-address.js';
import { NbdExport, shareSocketWithGroup, toNativeNbdOptions, type NbdExportOptions } from '../nbd/nbd-export.js';
import { safeEmit } from '../util/emit.js';
import { QUORUM_HOLD_MS_MAX, REPLICA_COUNT_MAX, REPLICA_COUNT_MIN } from '../util/limits.js';
import { checkLabels, checkName, checkRange, checkVolumeSize, describe } from '../util/validate.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

// Replica ids accepted in a hand-over (an engine has at most 16 replicas; the native side
// accepts the same number).
const HAND_OVER_IDS_MAX = 64;


/** Options of removing a replica from an engine (DataEngine.removeReplica). */
export interface ReplicaRemoveOptions {
  /** Remove it even if it is RW, as long as another replica of the engine is RW (default false). */
  evenIfRw?: boolean;
}

/**
 * How the engine uses a replica: RW (read and written), WO (written only, being rebuilt), ERR (dropped).
 *
 * @useDeclaredType
 */
export type ReplicaMode = NativeReplicaMode;

/** One replica an engine opens. */
export interface EngineReplicaSpec {
  /** Stable id within the volume, e.g. `r0` ([A-Za-z0-9._-]{1,63}). */
  id: string;
  /** Absolute path of a local replica directory (give this or {@link EngineReplicaSpec.remote}). */
  path?: string;
  /** A replica on another host, reached through its replica server (give this or {@link EngineReplicaSpec.path}). */
  remote?: NativeRemoteReplica;
  /**
   * Address of the replica server holding a remote replica (`host:port`). Reserved for
   * remote replicas (a later release); giving it today fails with UNSUPPORTED.
   */
  address?: string;
}

/** Options of {@link LocalEngine.open}. */
export interface EngineOptions {
  /** The replicas, 1 to 16. Order matters: after an unclean stop the first RW replica is the reconcile source. */
  replicas: EngineReplicaSpec[];
  /** The native addon (default: the one shipped in this package). Tests inject a fake. */
  addon?: NativeAddon;
  /**
   * Open as a migration standby (default false): the replicas are opened (another engine
   * may be writing them) but no epoch is claimed, nothing is reconciled or changed, and
   * every read, write, flush and snapshot is refused with INVALID_STATE until
   * {@link LocalEngine.activate}. An NBD export of a standby answers its clients with EPERM.
   */
  standby?: boolean;
  /**
   * Salvage start (default false; not with `standby`; docs/salvage.md): the caller asserts
   * that the volume's replicas not given are gone for good. No majority of the latest
   * replica set is needed; with no reachable RW replica of it, the replica whose last RW
   * set is newest serves and the others are ERR. The epoch fence still holds. A `salvaged`
   * event names the source and whether writes may be missing.
   */
  salvage?: boolean;
  /**
   * The writer epoch this engine claims (required unless `standby`). It must be allocated
   * by the caller so that no other engine ever holds it (the cluster allocates it in its
   * store; see docs/single-writer.md), and be above every epoch the replicas promised, else
   * the open fails with STALE_EPOCH. The engine never raises it on its own.
   */
  epoch?: number;
  /**
   * How long a request waits when a change of the replica set (a failed replica dropped)
   * cannot reach a majority of the volume's replicas, before it fails with IO_ERROR
   * (default 15000 ms, 0 to 600000). It is never acknowledged meanwhile.
   */
  quorumHoldMs?: number;
}

/** Whether an engine serves I/O (`active`) or is a standby (opened as one, or handed over). */
export type EngineRole = 'active' | 'standby';

/**
 * What an engine hands to the next writer of its volume: {@link LocalEngine.deactivate}
 * returns it, {@link LocalEngine.activate} takes it.
 */
export interface HandOver {
  /** The writer epoch the deactivated engine held. */
  epoch: number;
  /** The generation of its last committed replica set (docs/single-writer.md). */
  generation: number;
  /** Ids ({@link EngineReplicaSpec.id}) of its RW replicas: identical, holding every acknowledged write, flushed. */
  rwReplicaIds: string[];
}

/** State of one replica as the engine sees it. */
export interface ReplicaStatus {
  /** The replica's id (from {@link EngineReplicaSpec.id}). */
  id: string;
  /** Where it lives: the directory, or `host:port/name` for a remote replica. */
  path: string;
  /** Current mode. */
  mode: ReplicaMode;
  /** Highest writer epoch claimed on it. */
  epoch: number;
  /** Real disk usage of all its layers, in bytes. */
  allocatedBytes: number;
  /** The errno (positive) that made it ERR, 0 otherwise. */
  lastErrno: number;
}

/** A replica failed an I/O and was dropped (mode ERR); the volume keeps serving from the rest. */
export interface ReplicaErrorEvent {
  /** The replica's id. */
  replicaId: string;
  /** Its path. */
  path: string;
  /** The errno (positive) of the failure. */
  errno: number;
  /** The error code that errno maps to. */
  code: MooringErrorCode;
  /** What failed, from the engine. */
  message: string;
}

/**
 * A salvage start ({@link EngineOptions.salvage}) chose the replica it serves from
 * (docs/salvage.md).
 */
export interface SalvagedEvent {
  /** The source replica's id. */
  replicaId: string;
  /** The newest replica set in which the source was RW, or null when it recorded none. */
  lastRw: { epoch: number; generation: number } | null;
  /**
   * True when the start would have served without salvage (a majority of the latest set
   * claimed, one of its RW replicas kept): nothing acknowledged is lost. False: writes
   * acknowledged after `lastRw` may be missing.
   */
  complete: boolean;
  /** What was chosen and why, from the engine. */
  message: string;
}

/** The engine claimed its writer epoch on its replicas (at open, or when activated). */
export interface EpochClaimedEvent {
  /** The epoch claimed. */
  epoch: number;
}

/**
 * The engine committed a new replica set to a majority of the volume's replicas (at open,
 * when activated, after dropping a failed replica, when a rebuilt one became RW or one was
 * removed): see docs/single-writer.md.
 */
export interface ReplicaSetChangedEvent {
  /** The engine's epoch. */
  epoch: number;
  /** The replica set's generation within that epoch (1 at open or activation). */
  generation: number;
  /** Ids of the RW replicas in it. */
  rwReplicaIds: string[];
}

/** Replicas that were not closed cleanly were brought back in step at open. */
export interface ReconciledEvent {
  /** Bytes copied from the source replica. */
  bytes: number;
  /** What was done, from the engine. */
  message: string;
}

/** Figures of a rebuild (see {@link LocalEngine.addReplica}), carried by every rebuild event. */
export interface RebuildEvent {
  /** The replica being rebuilt. */
  replicaId: string;
  /** Data bytes written to it so far. */
  sentBytes: number;
  /** Allocated bytes compared so far. */
  scannedBytes: number;
  /** Allocated bytes to compare in all. */
  totalBytes: number;
}

/** A rebuild ended without making its replica RW. */
export interface RebuildFailedEvent extends RebuildEvent {
  /** The errno (positive) of the failure. */
  errno: number;
  /** The error code that errno maps to. */
  code: MooringErrorCode;
  /** What failed, from the engine. */
  message: string;
}

/**
 * What {@link LocalEngine.addReplica} did.
 *
 * @interface
 */
export type RebuildResult = NativeRebuildResult;

/** What {@link LocalEngine.exportSnapshot} and {@link LocalEngine.copySnapshotTo} did. */
export type SnapshotCopyResult = NativeSnapshotCopyResult;

/** Progress of {@link LocalEngine.exportSnapshot} or {@link LocalEngine.copySnapshotTo}, at least 64 MiB apart. */
export interface SnapshotCopyProgressEvent {
  /** The snapshot being read. */
  snapshot: string;
  /** Data bytes of the snapshot handled so far (read, then written, or found to be zeros). */
  copiedBytes: number;
  /** Data bytes the snapshot's layers hold in all. */
  totalBytes: number;
}

/**
 * Events of a {@link LocalEngine}. Events the native engine raises while it opens are collected
 * in {@link LocalEngine.openEvents} when they arrive before `LocalEngine.open` resolves; the native
 * side delivers events asynchronously, so they may also arrive (and be emitted) just after.
 */
export type EngineEvents = {
  /** A replica was dropped after an I/O failure. */
  'replica-error': (event: ReplicaErrorEvent) => void;
  /** A new writer epoch was claimed. */
  'epoch-claimed': (event: EpochClaimedEvent) => void;
  /** A salvage start chose its source replica (at open). */
  salvaged: (event: SalvagedEvent) => void;
  /** A new replica set was committed. */
  'replica-set-changed': (event: ReplicaSetChangedEvent) => void;
  /** Replicas were reconciled. */
  reconciled: (event: ReconciledEvent) => void;
  /** A rebuild began: the replica is WO (written, not read). */
  'rebuild-started': (event: RebuildEvent) => void;
  /** A rebuild advanced. */
  'rebuild-progress': (event: RebuildEvent) => void;
  /** A rebuild finished: the replica is RW. */
  'rebuild-completed': (event: RebuildEvent) => void;
  /** A rebuild failed or was aborted: the replica is ERR or gone. */
  'rebuild-failed': (event: RebuildFailedEvent) => void;
  /** A snapshot export or copy advanced. */
  'snapshot-copy-progress': (event: SnapshotCopyProgressEvent) => void;
  /** The engine closed; every call after this rejects with CLOSED. */
  closed: () => void;
};

/** Any engine event, tagged by type. */
export type EngineEvent =
  | ({ type: 'replica-error' } & ReplicaErrorEvent)
  | ({ type: 'epoch-claimed' } & EpochClaimedEvent)
  | ({ type: 'salvaged' } & SalvagedEvent)
  | ({ type: 'replica-set-changed' } & ReplicaSetChangedEvent)
  | ({ type: 'reconciled' } & ReconciledEvent)
  | ({ type: 'rebuild-started' | 'rebuild-progress' | 'rebuild-completed' } & RebuildEvent)
  | ({ type: 'rebuild-failed' } & RebuildFailedEvent)
  | ({ type: 'snapshot-copy-progress' } & SnapshotCopyProgressEvent);

/** One run of the allocation map (NBD base:allocation). */
export interface Extent {
  /** Volume offset where it starts. */
  offset: number;
  /** Length in bytes. */
  length: number;
  /** No storage allocated. */
  hole: boolean;
  /** Reads as zeros. */
  zero: boolean;
}

/** Options of {@link LocalEngine.write}. */
export interface WriteOptions {
  /** Forced unit access: durable on every replica when the call resolves. */
  fua?: boolean;
}

/**
 * Options of {@link LocalEngine.writeZeroes}.
 *
 * @interface
 */
export type WriteZeroesOptions = NativeWriteZeroesOptions;

/**
 * One layer of the volume's chain: a snapshot, or the head (the writable top). The native
 * layer info without its file name, and with the parent named `parentId`.
 */
export interface LayerInfo extends Omit<NativeLayerInfo, 'file' | 'parent'> {
  /** Parent layer id, '' for the bottom layer. */
  parentId: string;
}

/** Options of {@link LocalEngine.createSnapshot}. */
export interface SnapshotOptions {
  /** Labels stored with the snapshot (at most 64). */
  labels?: Record<string, string>;
  /** @internal Snapshots taken by Mooring itself pass false. */
  userCreated?: boolean;
}

/** Lifecycle state of an engine or volume. */
export type LifecycleState = 'open' | 'closing' | 'closed';

// A replica spec once checked: `path` is what the native engine calls the replica (its
// directory, or host:port/name for a remote one), `endpoint` what it is opened with.
interface ResolvedReplica {
  id: string;
  path: string;
  endpoint: NativeReplicaEndpoint;
}

function checkReplicaSpec(r: unknown, what: string): ResolvedReplica {
  if (typeof r !== 'object' || r === null) throw new MooringError('INVALID_ARGUMENT', `${what} must be an object`);
  const spec = r as Partial<EngineReplicaSpec>;
  const id = checkName(`${what}.id`, spec.id);
  if (spec.address !== undefined) {
    throw new MooringError('UNSUPPORTED', `replica ${id}: address ${describe(spec.address)} is reserved; give a remote replica as \`remote\``);
  }
  if (spec.remote !== undefined) {
    if (spec.path !== undefined) throw new MooringError('INVALID_ARGUMENT', `${what}: give path or remote, not both`);
    const rem = spec.remote as Partial<NativeRemoteReplica> | null;
    if (typeof rem !== 'object' || rem === null || typeof rem.host !== 'string' || rem.host.length === 0 || typeof rem.port !== 'number') {
      throw new MooringError('INVALID_ARGUMENT', `${what}.remote must be {host, port, name, tls?, ioTimeoutMs?} (got ${describe(rem)})`);
    }
    const name = checkName(`${what}.remote.name`, rem.name);
    // The native side checks port, TLS and timeout bounds; the id it reports is this.
    return { id, path: `${rem.host}:${rem.port}/${name}`, endpoint: { ...(rem as NativeRemoteReplica) } };
  }
  if (typeof spec.path !== 'string' || !isAbsolute(spec.path) || spec.path.includes('\0')) {
    throw new MooringError('INVALID_ARGUMENT', `${what}.path must be an absolute path (got ${describe(spec.path)})`);
  }
  const path = resolve(spec.path);
  return { id, path, endpoint: path };
}

function checkReplicaSpecs(value: unknown): ResolvedReplica[] {
  if (!Array.isArray(value) || value.length < REPLICA_COUNT_MIN || value.length > REPLICA_COUNT_MAX) {
    throw new MooringError('INVALID_ARGUMENT', `replicas must be an array of ${REPLICA_COUNT_MIN}..${REPLICA_COUNT_MAX} replica specs (got ${describe(value)})`);
  }
  const ids = new Set<string>();
  const paths = new Set<string>();
  return value.map((r: unknown, i) => {
    const spec = checkReplicaSpec(r, `replicas[${i}]`);
    if (ids.has(spec.id)) throw new MooringError('INVALID_ARGUMENT', `replica id ${spec.id} appears twice`);
    if (paths.has(spec.path)) throw new MooringError('INVALID_ARGUMENT', `replica path ${spec.path} appears twice`);
    ids.add(spec.id);
    paths.add(spec.path);
    return spec;
  });
}

function toExtents(offset: number, native: NativeExtent[]): Extent[] {
  let at = offset;
  return native.map((e) => {
    const out = { offset: at, length: e.length, hole: (e.flags & 1) !== 0, zero: (e.flags & 2) !== 0 };
    at += e.length;
    return out;
  });
}

/** A native layer as {@link LayerInfo} (no file name; parent as `parentId`). */
export function toLayer(l: NativeLayerInfo): LayerInfo {
  return {
    id: l.id,
    parentId: l.parent,
    name: l.name,
    head: l.head,
    removed: l.removed,
    userCreated: l.userCreated,
    createdMs: l.createdMs,
    labels: { ...l.labels },
    sizeBytes: l.sizeBytes,
    allocatedBytes: l.allocatedBytes,
  };
}

/**
 * The replicator of one volume. Open it with {@link LocalEngine.open}; close it with
 * {@link LocalEngine.close}, which waits for calls in flight and closes its NBD exports first.
 */
export class LocalEngine extends (EventEmitter as new () => TypedEmitter<EngineEvents>) {
  /** Events that arrived while the engine opened (epoch claimed, salvage, reconcile, fenced replicas); later ones are emitted. */
  readonly openEvents: readonly EngineEvent[];
  readonly #native: NativeEngine;
  readonly #addon: NativeAddon;
  // Changes as replicas are added and removed (addReplica, removeReplica).
  #specs: ResolvedReplica[];
  readonly #exports = new Set<NbdExport>();
  #state: LifecycleState = 'open';
  #inFlight = 0;
  #drained: (() => void) | undefined;
  #closing: Promise<void> | undefined;

  private constructor(native: NativeEngine, addon: NativeAddon, specs: ResolvedReplica[], openEvents: EngineEvent[]) {
    super();
    this.#native = native;
    this.#addon = addon;
    this.#specs = specs;
    this.openEvents = openEvents;
  }

  /** Volume size in bytes ({@link LocalEngine.resize} grows it). */
  get sizeBytes(): number {
    return this.#native.sizeBytes;
  }

  /**
   * Opens an engine over local replica directories: claims a new writer epoch on every
   * replica (fencing any older engine) and reconciles replicas that were not closed cleanly.
   * With `standby` it does neither (see {@link EngineOptions.standby}).
   *
   * @throws MooringError INVALID_ARGUMENT, STALE_EPOCH, NO_QUORUM (no majority of the latest
   *   replica set answered; see {@link EngineOptions.salvage}), UNSUPPORTED (remote replicas), NO_HEALTHY_REPLICA,
   *   CORRUPT_METADATA, NATIVE_LOAD_FAILED, ...
   */
  static async open(options: EngineOptions): Promise<LocalEngine> {
    if (typeof options !== 'object' || options === null) {
      throw new MooringError('INVALID_ARGUMENT', `engine options must be an object (got ${describe(options)})`);
    }
    const specs = checkReplicaSpecs(options.replicas);
    if (options.standby !== undefined && typeof options.standby !== 'boolean') {
      throw new MooringError('INVALID_ARGUMENT', `standby must be a boolean (got ${describe(options.standby)})`);
    }
    const standby = options.standby === true;
    if (options.salvage !== undefined && typeof options.salvage !== 'boolean') {
      throw new MooringError('INVALID_ARGUMENT', `salvage must be a boolean (got ${describe(options.salvage)})`);
    }
    const salvage = options.salvage === true;
    if (salvage && standby) {
      throw new MooringError('INVALID_ARGUMENT', 'salvage and standby exclude each other: a salvage start claims its epoch and serves (docs/salvage.md)');
    }
    const epoch = checkEpoch('epoch', options.epoch, !standby);
    let quorumHoldMs: number | undefined;
    if (options.quorumHoldMs !== undefined) {
      if (typeof options.quorumHoldMs !== 'number' || !Number.isSafeInteger(options.quorumHoldMs) || options.quorumHoldMs < 0 || options.quorumHoldMs > QUORUM_HOLD_MS_MAX) {
        throw new MooringError('INVALID_ARGUMENT', `quorumHoldMs must be an integer from 0 to ${QUORUM_HOLD_MS_MAX} (got ${describe(options.quorumHoldMs)})`);
      }
      quorumHoldMs = options.quorumHoldMs;
    }
    const addon = options.addon ?? loadAddon();
    // Events may arrive before openEngine resolves; hold them until the LocalEngine exists.
    const early: EngineEvent[] = [];
    let engine: LocalEngine | undefined;
    const onEvents = (events: NativeEngineEvent[]): void => {
      for (const raw of events) {
        const event = normalizeEvent(raw, engine ? engine.#specs : specs);
        if (event === undefined) continue;
        if (engine) engine.#dispatch(event);
        else early.push(event);
      }
    };
    const native = await callNative(
      () =>
        addon.openEngine({
          replicas: specs.map((s) => s.endpoint),
          members: specs.map((s) => s.id),
          onEvents,
          ...(standby ? { standby } : {}),
          ...(salvage ? { salvage } : {}),
          ...(epoch !== undefined ? { epoch } : {}),
          ...(quorumHoldMs !== undefined ? { quorumHoldMs } : {}),
        }),
      `opening ${standby ? 'a standby engine' : salvage ? 'a salvage engine' : 'engine'} over ${specs.map((s) => s.id).join(', ')}`,
    );
    engine = new LocalEngine(native, addon, specs, early);
    return engine;
  }

  /** 'open', 'closing' (draining; new calls are refused) or 'closed'. */
  get state(): LifecycleState {
    return this.#state;
  }

  /** The writer epoch this engine holds (a standby: the one it held before handing over, or 0). */
  get epoch(): number {
    this.#assertOpen();
    return callNativeSync(() => this.#native.epoch(), 'engine epoch');
  }

  /** `active`, or `standby` while it serves nothing (opened as a standby, or handed over). */
  get role(): EngineRole {
    this.#assertOpen();
    return callNativeSync(() => this.#native.standby(), 'engine role') ? 'standby' : 'active';
  }

  /** The NBD exports currently serving this engine. */
  get exports(): readonly NbdExport[] {
    return [...this.#exports];
  }

  /** The replicas and their modes, epochs and disk usage. */
  replicas(): ReplicaStatus[] {
    this.#assertOpen();
    const states = callNativeSync(() => this.#native.replicas(), 'engine replicas');
    return states.map((s, i) => this.#toStatus(s, i));
  }

  /** Reads `length` bytes (1 B .. 32 MiB) at `offset`. */
  read(offset: number, length: number): Promise<Buffer> {
    return this.#call('read', () => {
      checkRange(offset, length, this.sizeBytes);
      return this.#native.read(offset, length);
    });
  }

  /**
   * Writes `data` (1 B .. 32 MiB, any alignment) at `offset`; resolves when every RW replica
   * has it. Do not modify `data` until the promise settles.
   */
  write(offset: number, data: Uint8Array, options: WriteOptions = {}): Promise<void> {
    return this.#call('write', () => {
      if (!(data instanceof Uint8Array)) {
        throw new MooringError('INVALID_ARGUMENT', `data must be a Buffer or Uint8Array (got ${describe(data)})`);
      }
      checkRange(offset, data.byteLength, this.sizeBytes);
      return this.#native.write(offset, data, options.fua === true);
    });
  }

  /** Makes everything written before this call durable on every RW replica. */
  flush(): Promise<void> {
    return this.#call('flush', () => this.#native.flush());
  }

  /** Discards a range (any length inside the volume): it may read as anything afterwards (zeros today) and its space is released. */
  trim(offset: number, length: number): Promise<void> {
    return this.#call('trim', () => {
      checkRange(offset, length, this.sizeBytes, Number.MAX_SAFE_INTEGER);
      return this.#native.trim(offset, length);
    });
  }

  /** Makes a range (any length inside the volume) read as zeros. */
  writeZeroes(offset: number, length: number, options: WriteZeroesOptions = {}): Promise<void> {
    return this.#call('writeZeroes', () => {
      checkRange(offset, length, this.sizeBytes, Number.MAX_SAFE_INTEGER);
      return this.#native.writeZeroes(offset, length, {
        mayTrim: options.mayTrim !== false,
        fastOnly: options.fastOnly === true,
        fua: options.fua === true,
      });
    });
  }

  /**
   * The allocation map of a range (any length inside the volume): extents in order from
   * `offset`, at least one. The count is bounded (65,536), so the extents may end before
   * `offset + length`; ask again from where they end.
   */
  blockStatus(offset: number, length: number): Promise<Extent[]> {
    return this.#call('blockStatus', async () => {
      checkRange(offset, length, this.sizeBytes, Number.MAX_SAFE_INTEGER);
      return toExtents(offset, await this.#native.blockStatus(offset, length));
    });
  }

  /** Takes a snapshot named `name` on every RW replica (O(1), no data copied). */
  createSnapshot(name: string, options: SnapshotOptions = {}): Promise<void> {
    return this.#call('createSnapshot', () => {
      checkName('snapshot name', name);
      const labels = checkLabels(options.labels);
      return this.#native.snapshot(name, labels, options.userCreated !== false);
    });
  }

  /**
   * Grows the volume while it serves: every RW replica records the new size durably, then
   * the engine takes it, so nothing is written past the old end before every RW replica has
   * the room. NBD connections opened from then on see the new size; connections negotiated
   * before keep theirs (docs/nbd-frontend.md, "Resize"). The same size does nothing.
   *
   * @throws MooringError INVALID_ARGUMENT (smaller, or not a multiple of 4096 up to the
   *   volume limit), BUSY (a rebuild runs), UNSUPPORTED (a replica's server predates resize),
   *   INVALID_STATE (standby), STALE_EPOCH, NO_QUORUM, CLOSED
   */
  resize(sizeBytes: number): Promise<void> {
    return this.#call('resize', () => {
      checkVolumeSize(sizeBytes);
      if (sizeBytes < this.sizeBytes) {
        throw new MooringError('INVALID_ARGUMENT', `the volume has ${this.sizeBytes} bytes: it can grow, not shrink to ${sizeBytes} (shrinking would cut off data the guest wrote)`, {
          details: { sizeBytes, currentSizeBytes: this.sizeBytes },
        });
      }
      return this.#native.resize(sizeBytes);
    });
  }

  /** Every layer of the chain (bottom first, as the first RW replica lists them), including removed ones and the head. */
  listLayers(): Promise<LayerInfo[]> {
    return this.#call('listLayers', async () => (await this.#native.listSnapshots()).map(toLayer));
  }

  /**
   * The layers one snapshot's info needs: its own and its ancestors up to its nearest visible
   * one (bottom first; empty when there is no such snapshot). Unlike listLayers, its cost does
   * not grow with the chain's depth (for a local first replica).
   */
  snapshotLayers(name: string): Promise<LayerInfo[]> {
    return this.#call('snapshotLayers', async () => (await this.#native.listSnapshots(name)).map(toLayer));
  }

  /** Deletes a snapshot; its data merges into its child and its space is reclaimed. */
  deleteSnapshot(name: string): Promise<void> {
    return this.#call('deleteSnapshot', () => {
      checkName('snapshot name', name);
      return this.#native.deleteSnapshot(name);
    });
  }

  /**
   * Makes the volume's content that of snapshot `name` (a new head on top of it). Refused
   * with INVALID_STATE while the engine is exported: clients would see data change under them.
   */
  revert(name: string): Promise<void> {
    return this.#call('revert', () => {
      checkName('snapshot name', name);
      if (this.#exports.size > 0) {
        throw new MooringError('INVALID_STATE', `cannot revert to ${name} while exported over NBD; close the export first`);
      }
      return this.#native.revert(name);
    });
  }

  /**
   * Rebuild: adds a replica (new, or an ERR one coming back under the same id) write-only,
   * copies what it lacks and makes it RW; resolves when it is RW. Progress arrives as
   * rebuild-* events. One rebuild per engine at a time (BUSY otherwise).
   *
   * @throws MooringError INVALID_ARGUMENT, INVALID_STATE (no RW replica, or it is RW/WO already), BUSY, UNAVAILABLE, ...
   */
  addReplica(spec: EngineReplicaSpec): Promise<RebuildResult> {
    return this.#call('addReplica', async () => {
      const resolved = checkReplicaSpec(spec, 'replica');
      const clash = this.#specs.find((s) => s.id !== resolved.id && s.path === resolved.path);
      if (clash) throw new MooringError('INVALID_ARGUMENT', `replica ${resolved.path} is already in the engine as ${clash.id}`);
      // Known before the native call, so its rebuild events name it.
      const at = this.#specs.findIndex((s) => s.id === resolved.id);
      if (at >= 0) this.#specs[at] = resolved;
      else this.#specs.push(resolved);
      return this.#native.addReplica(resolved.endpoint, resolved.id);
    });
  }

  /**
   * Removes a replica that is not RW (aborting its rebuild if it is WO) and closes it; with
   * `evenIfRw`, a RW one too while another replica is RW (a healthy replica moved away).
   *
   * @throws MooringError NOT_FOUND, INVALID_STATE (it is RW, or the only RW one)
   */
  removeReplica(id: string, options: ReplicaRemoveOptions = {}): Promise<void> {
    return this.#call('removeReplica', async () => {
      checkName('replica id', id);
      const spec = this.#specs.find((s) => s.id === id);
      if (!spec) throw new MooringError('NOT_FOUND', `replica ${id} is not in this engine`);
      await this.#native.removeReplica(spec.path, options.evenIfRw === true);
      this.#specs = this.#specs.filter((s) => s !== spec);
    });
  }

  /**
   * Migration hand-over, source side: stops a running rebuild (its replica is left ERR,
   * for the next writer to rebuild), waits for calls in flight, flushes every RW replica
   * and becomes a standby: every later read, write or flush fails with INVALID_STATE
   * (NBD clients get EPERM). The replicas are not marked clean (the next writer owns them).
   *
   * @throws MooringError INVALID_STATE (standby already), STALE_EPOCH (fenced: another
   *   engine owns the volume), BUSY (a deactivate runs), IO_ERROR (the last RW replica
   *   failed its flush; the engine stays active)
   */
  deactivate(): Promise<HandOver> {
    return this.#call('deactivate', async () => {
      const h = await this.#native.deactivate();
      return { epoch: h.epoch, generation: h.generation, rwReplicaIds: h.rwReplicaIds.map((id) => matchSpec(id, -1, this.#specs)?.id ?? id) };
    });
  }

  /**
   * Migration hand-over, target side (or the source taking the volume back): claims
   * `options.epoch` (allocated by the caller, as for {@link EngineOptions.epoch}) on the
   * replicas, checks that the volume's latest replica set is the hand-over's, commits a new
   * one with the hand-over's RW replicas (every other replica is ERR) and serves I/O from
   * then on, like an engine that was opened active. A hand-over works once: when another
   * engine activated from it, or took the volume since, this fails with STALE_EPOCH and the
   * engine stays standby. Nothing is reconciled: the deactivated engine left the replicas
   * identical.
   *
   * @throws MooringError INVALID_STATE (active already), STALE_EPOCH, NO_QUORUM (a
   *   majority of the replicas cannot be reached), NO_HEALTHY_REPLICA (none of the
   *   hand-over's replicas could be claimed), INVALID_ARGUMENT
   */
  activate(handOver: HandOver, options: { epoch: number }): Promise<void> {
    return this.#call('activate', async () => {
      const h = handOver as Partial<HandOver> | null;
      if (
        typeof h !== 'object' || h === null || !Array.isArray(h.rwReplicaIds) ||
        typeof h.epoch !== 'number' || !Number.isSafeInteger(h.epoch) || h.epoch < 0 ||
        typeof h.generation !== 'number' || !Number.isSafeInteger(h.generation) || h.generation < 0
      ) {
        throw new MooringError('INVALID_ARGUMENT', `handOver must be {epoch, generation, rwReplicaIds} (got ${describe(handOver)})`);
      }
      const epoch = checkEpoch('epoch', (options as { epoch?: unknown } | undefined)?.epoch, true) as number;
      if (h.rwReplicaIds.length > HAND_OVER_IDS_MAX) {
        throw new MooringError('INVALID_ARGUMENT', `handOver.rwReplicaIds lists ${h.rwReplicaIds.length} ids, at most ${HAND_OVER_IDS_MAX} are accepted`);
      }
      // Spec ids to the names the native engine knows its replicas by (slot order is kept
      // on both sides, see matchSpec). Ids of replicas this engine lacks are dropped.
      const nativeIds = callNativeSync(() => this.#native.replicas(), 'engine replicas').map((s, i) => ({
        nativeId: s.id,
        id: matchSpec(s.id, i, this.#specs)?.id ?? s.id,
      }));
      const wanted = new Set(h.rwReplicaIds.map((id, i) => checkName(`handOver.rwReplicaIds[${i}]`, id)));
      await this.#native.activate({ epoch: h.epoch, generation: h.generation, rwReplicaIds: nativeIds.filter((x) => wanted.has(x.id)).map((x) => x.nativeId) }, epoch);
    });
  }

  /** Serves the engine over NBD. Closing the engine closes the export first. */
  exportNbd(options: NbdExportOptions): Promise<NbdExport> {
    return this.#call('exportNbd', async () => {
      const { address, exportName, native, socketGroup } = toNativeNbdOptions(options);
      const server = await this.#native.exportNbd(native);
      const exp = new NbdExport(server, address, exportName, native.readOnly === true, native.tls !== undefined);
      if (socketGroup !== undefined && address.kind === 'unix') {
        await shareSocketWithGroup(address.path, socketGroup).catch(async (err: unknown) => {
          await exp.close().catch(() => undefined);
          throw err;
        });
      }
      return this.#own(exp);
    });
  }

  /**
   * Serves this engine through an export handed over by another engine (`NbdExport.detach`,
   * here or in another process): same socket, same client connections, same negotiated
   * options. It is frozen until `NbdExport.unfreeze()` (once the hand-off is committed: the
   * old side may still take it back until then).
   *
   * @throws MooringError UNSUPPORTED (an addon without hand-off), INVALID_STATE (a record used twice), PROTOCOL_ERROR (a bad record), CLOSED
   */
  adoptNbd(record: NativeNbdHandOffRecord, options: { bufferBytesMax?: number } = {}): Promise<NbdExport> {
    return this.#call('adoptNbd', async () => {
      if (!this.#addon.adoptNbdServer) throw new MooringError('UNSUPPORTED', 'this addon cannot adopt an NBD export');
      const server = await this.#addon.adoptNbdServer(record, this.#native, options.bufferBytesMax === undefined ? undefined : { bufferBytesMax: options.bufferBytesMax });
      const address = parseNbdAddress(record.unixPath !== '' ? `unix:${record.unixPath}` : `tcp:0.0.0.0:${record.tcpPort}`);
      return this.#own(new NbdExport(server, address, record.exportName, false));
    });
  }

  /**
   * Rollback of a hand-off: serves this engine (a new one over the same replicas, say) through
   * an export that was frozen and detached from another engine of this process.
   *
   * @throws MooringError INVALID_STATE (the export is not detached), CLOSED
   */
  resumeExport(exp: NbdExport): Promise<void> {
    return this.#call('resumeExport', async () => {
      if (!exp.detached) throw new MooringError('INVALID_STATE', `NBD export ${exp.addressString} was not detached`);
      await exp.unfreeze(this.#native);
      this.#own(exp);
    });
  }

  // This engine closes the export when it closes, until the export closes or is detached.
  #own(exp: NbdExport): NbdExport {
    this.#exports.add(exp);
    exp.once('closed', () => this.#exports.delete(exp));
    exp.once('detached', () => this.#exports.delete(exp));
    return exp;
  }

  /**
   * Writes the content of snapshot `name` — the volume as it read when the snapshot was
   * taken — into a new sparse raw image at `path` (absolute; its directory must exist, the
   * file must not). Only data is written; holes and blocks of zeros stay holes. The file is
   * fsynced before the promise resolves, and removed if the export fails. While it runs,
   * deleting or reverting snapshots of this engine fails with BUSY. Progress arrives as
   * snapshot-copy-progress events. {@link LocalEngine.close} cuts it short (CLOSED).
   *
   * @throws MooringError ALREADY_EXISTS, INVALID_ARGUMENT (relative path, missing directory),
   *   NOT_FOUND (no such snapshot), NO_SPACE, IO_ERROR, CLOSED
   */
  exportSnapshot(name: string, path: string): Promise<SnapshotCopyResult> {
    return this.#copy('exportSnapshot', () => {
      checkName('snapshot name', name);
      if (typeof path !== 'string' || !isAbsolute(path) || path.includes('\0')) {
        throw new MooringError('INVALID_ARGUMENT', `export path must be an absolute path (got ${describe(path)})`);
      }
      return this.#native.exportSnapshot(name, path);
    });
  }

  /**
   * Writes the content of snapshot `name` into `target`, another open engine of the same
   * size, through the target's replicated write path (every replica of the target gets it),
   * zeroing whatever the snapshot does not hold, and flushes the target: a clone. If it
   * fails, the target holds part of the content. As {@link LocalEngine.exportSnapshot}, it keeps
   * snapshots of this engine from being deleted or reverted while it runs.
   *
   * @throws MooringError INVALID_ARGUMENT (the same engine, sizes differ), NOT_FOUND, CLOSED, NO_SPACE, IO_ERROR
   */
  copySnapshotTo(name: string, target: LocalEngine): Promise<SnapshotCopyResult> {
    return this.#copy('copySnapshotTo', () => {
      checkName('snapshot name', name);
      if (!(target instanceof LocalEngine)) throw new MooringError('INVALID_ARGUMENT', `target must be a LocalEngine (got ${describe(target)})`);
      if (target === this) throw new MooringError('INVALID_ARGUMENT', 'a snapshot cannot be copied into its own engine');
      if (target.#state !== 'open') throw new MooringError('CLOSED', `the target engine is ${target.#state}`);
      if (target.sizeBytes !== this.sizeBytes) {
        throw new MooringError('INVALID_ARGUMENT', `the target engine's size ${target.sizeBytes} differs from ${this.sizeBytes}`);
      }
      return this.#native.copySnapshotTo(name, target.#native);
    });
  }

  /**
   * Closes the engine: refuses new calls (CLOSED), closes its NBD exports (which drain and
   * flush) while waiting for calls in flight, then flushes, marks the replicas clean and
   * closes them. Snapshot exports and copies in flight are not waited for: once close()
   * has resolved they read none of this engine's replicas any more, and they fail with CLOSED
   * (a partial export file is removed). Idempotent: later calls return the same promise.
   */
  close(): Promise<void> {
    this.#closing ??= this.#doClose();
    return this.#closing;
  }

  async #doClose(): Promise<void> {
    this.#state = 'closing';
    const drained =
      this.#inFlight === 0
        ? Promise.resolve()
        : new Promise<void>((res) => {
            this.#drained = res;
          });
    const results = await Promise.allSettled([...[...this.#exports].map((e) => e.close()), drained]);
    // An exportNbd that was in flight when close began has added its export by now.
    results.push(...(await Promise.allSettled([...this.#exports].map((e) => e.close()))));
    const nativeResult = await callNative(() => this.#native.close(), 'closing engine').then(
      () => undefined,
      (err: unknown) => err,
    );
    this.#state = 'closed';
    safeEmit(this, 'closed');
    const firstFailure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (nativeResult !== undefined) throw nativeResult;
    if (firstFailure) throw firstFailure.reason;
  }

  #assertOpen(): void {
    if (this.#state !== 'open') throw new MooringError('CLOSED', `engine is ${this.#state}`);
  }

  // Counts the call in flight so close() can wait for it; validation errors thrown by
  // `body` reject the promise rather than throwing synchronously.
  #call<T>(what: string, body: () => Promise<T>): Promise<T> {
    if (this.#state !== 'open') return Promise.reject(new MooringError('CLOSED', `engine is ${this.#state} (${what})`));
    this.#inFlight++;
    return callNative(body, what).finally(() => {
      this.#inFlight--;
      if (this.#inFlight === 0 && this.#drained) this.#drained();
    });
  }

  // A snapshot export or copy: refused once closing, but not counted in #inFlight, so
  // close() does not wait for a copy of hours (see close()).
  #copy<T>(what: string, body: () => Promise<T>): Promise<T> {
    if (this.#state !== 'open') return Promise.reject(new MooringError('CLOSED', `engine is ${this.#state} (${what})`));
    return callNative(body, what);
  }

  #dispatch(event: EngineEvent): void {
    const { type, ...payload } = event;
    safeEmit(this, type, payload);
  }

  #toStatus(s: NativeReplicaState, index: number): ReplicaStatus {
    const spec = matchSpec(s.id, index, this.#specs);
    return {
      id: spec?.id ?? s.id,
      path: spec?.path ?? s.id,
      mode: s.mode,
      epoch: s.epoch,
      allocatedBytes: s.allocatedBytes,
      lastErrno: Math.abs(s.lastError),
    };
  }
}

// An epoch handed to the engine: a positive safe integer (required), or absent when not.
function checkEpoch(what: string, value: unknown, required: boolean): number | undefined {
  if (value === undefined && !required) return undefined;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) {
    throw new MooringError('INVALID_ARGUMENT', `${what} must be a positive integer allocated for this engine (got ${describe(value)}); see docs/single-writer.md`);
  }
  return value;
}

// The native side names a replica by its directory; map that back to the spec (exact path,
// then resolved path, then position, which the native side keeps).
function matchSpec(nativeId: string, index: number, specs: readonly ResolvedReplica[]): ResolvedReplica | undefined {
  return (
    specs.find((s) => s.path === nativeId) ??
    (isAbsolute(nativeId) ? specs.find((s) => s.path === resolve(nativeId)) : undefined) ??
    (index >= 0 ? specs[index] : undefined)
  );
}

// Unknown event types (a newer addon) are dropped rather than emitted untyped.
function normalizeEvent(raw: NativeEngineEvent, specs: readonly ResolvedReplica[]): EngineEvent | undefined {
  switch (raw.type) {
    case 'replica-error': {
      const spec = matchSpec(raw.replicaId, -1, specs);
      const errno = Math.abs(raw.errno);
      return {
        type: 'replica-error',
        replicaId: spec?.id ?? raw.replicaId,
        path: spec?.path ?? raw.replicaId,
        errno,
        code: codeFromErrno(errno),
        message: raw.message,
      };
    }
    case 'epoch-claimed':
      return { type: 'epoch-claimed', epoch: raw.epoch };
    case 'salvaged':
      return {
        type: 'salvaged',
        replicaId: matchSpec(raw.replicaId, -1, specs)?.id ?? raw.replicaId,
        lastRw: raw.lastRw === null ? null : { epoch: raw.lastRw.epoch, generation: raw.lastRw.generation },
        complete: raw.complete,
        message: raw.message,
      };
    case 'replica-set-changed':
      return { type: 'replica-set-changed', epoch: raw.epoch, generation: raw.generation, rwReplicaIds: [...raw.rwMembers] };
    case 'reconciled':
      return { type: 'reconciled', bytes: raw.bytes, message: raw.message };
    case 'rebuild-started':
    case 'rebuild-progress':
    case 'rebuild-completed': {
      const figures = { replicaId: matchSpec(raw.replicaId, -1, specs)?.id ?? raw.replicaId, sentBytes: raw.sentBytes, scannedBytes: raw.scannedBytes, totalBytes: raw.totalBytes };
      return { type: raw.type, ...figures };
    }
    case 'rebuild-failed': {
      const errno = Math.abs(raw.errno);
      return {
        type: 'rebuild-failed',
        replicaId: matchSpec(raw.replicaId, -1, specs)?.id ?? raw.replicaId,
        sentBytes: raw.sentBytes,
        scannedBytes: raw.scannedBytes,
        totalBytes: raw.totalBytes,
        errno,
        code: codeFromErrno(errno),
        message: raw.message,
      };
    }
    case 'snapshot-copy-progress':
      return { type: 'snapshot-copy-progress', snapshot: raw.snapshot, copiedBytes: raw.copiedBytes, totalBytes: raw.totalBytes };
    default:
      return undefined;
  }
}
