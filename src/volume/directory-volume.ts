/**
 * DirectoryVolume: a replicated block volume stored in one directory (volume.json + replica
 * directories), the layout of the first releases. Internal: the public API is `Mooring` and
 * its `Volume` handles; the `mooring serve/create/info/snapshot` commands still serve such
 * directories (docs/cli.md).
 *
 * While a DirectoryVolume is open it is attached on this host: it owns an {@link LocalEngine} over its
 * replicas, which holds the writer epoch. The DirectoryVolume allocates that epoch (an engine never
 * picks its own, docs/single-writer.md) from the counter in volume.json, which it writes
 * under the volume's lock before the engine claims the epoch.
 */
import { EventEmitter } from 'node:events';
import { mkdir, readdir, rm } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import type * as TE from 'typed-emitter';

import {
  LocalEngine,
  type EngineReplicaSpec,
  type EpochClaimedEvent,
  type Extent,
  type LifecycleState,
  type ReconciledEvent,
  type ReplicaErrorEvent,
  type ReplicaSetChangedEvent,
  type ReplicaStatus,
  type WriteOptions,
  type WriteZeroesOptions,
} from '../engine/engine.js';
import type { EngineSnapshotInfo } from '../data-engine/data-engine.js';
import { visibleSnapshots } from '../data-engine/snapshots.js';
import { MooringError, callNative, toMooringError } from '../errors.js';
import type { NativeAddon } from '../native/binding.js';
import { loadAddon } from '../native/load.js';
import type { NbdExport, NbdExportOptions } from '../nbd/nbd-export.js';
import { safeEmit } from '../util/emit.js';
import { directoryState, pathExists } from '../util/files.js';
import { NAME_PATTERN } from '../util/limits.js';
import { checkLabels, checkName, checkReplicaCount, checkVolumeSize, describe } from '../util/validate.js';
import { DEFAULT_REPLICA_COUNT } from '../cluster/volume-lifecycle.js';
import { VOLUME_LOCK_FILE, VolumeLock } from './volume-lock.js';
import {
  REPLICAS_SUBDIR,
  VOLUME_SPEC_FILE,
  newVolumeSpec,
  readVolumeSpec,
  replicaDir,
  writeVolumeSpec,
  type ReplicaErrorRecord,
  type VolumeSpec,
} from './volume-spec.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** File name of the default NBD socket inside the volume directory. */
export const DEFAULT_SOCKET_FILE = 'nbd.sock';
/** Replica count when none is given. */
export { DEFAULT_REPLICA_COUNT };
/**
 * Epochs one open tries: a STALE_EPOCH (a replica promised more than volume.json and the
 * replicas' metadata showed when the epoch was allocated) is tried again above it.
 */
export const OPEN_EPOCH_ATTEMPTS_MAX = 3;

/** Options of {@link DirectoryVolume.create}. */
export interface DirectoryVolumeCreateOptions {
  /** Directory to create the volume in; must be missing or empty. */
  dir: string;
  /** Size in bytes: a positive multiple of 4096, at most 2^53 - 4096. */
  sizeBytes: number;
  /** Number of replicas, 1..16 (default 3). */
  replicas?: number;
  /** Name ([A-Za-z0-9._-]{1,63}); default: the directory's name if valid, else "volume". */
  name?: string;
  /** The native addon (default: the one in this package). Tests inject a fake. */
  addon?: NativeAddon;
}

/** Options of {@link DirectoryVolume.open}. */
export interface DirectoryVolumeOpenOptions {
  /** The native addon (default: the one in this package). Tests inject a fake. */
  addon?: NativeAddon;
}

/** Options of {@link DirectoryVolume.export}: as {@link NbdExportOptions}; `nbd` defaults to `unix:DIR/nbd.sock`. */
export type DirectoryExportOptions = NbdExportOptions;

/** A snapshot as listed to users: the same shape a data engine lists. */
export type SnapshotInfo = EngineSnapshotInfo;

/** Options of {@link DirectoryVolume.createSnapshot}. */
export interface CreateSnapshotOptions {
  /** Labels stored with the snapshot: at most 64, keys [A-Za-z0-9._/-]{1,128}, values up to 512 characters. */
  labels?: Record<string, string>;
}

/** A replica in {@link DirectoryVolumeStatus}. */
export interface DirectoryReplicaStatus extends ReplicaStatus {
  /** The last failure recorded for it in volume.json, if any. */
  lastError?: ReplicaErrorRecord;
}

/** Where the volume is exported. */
export interface ExportInfo {
  /** `unix:PATH` or `tcp:HOST:PORT` (bound port). */
  address: string;
  /** NBD URI for clients. */
  uri: string;
  /** Export name ('' = default). */
  exportName: string;
}

/** A snapshot of the volume's state. */
export interface DirectoryVolumeStatus {
  /** Volume name. */
  name: string;
  /** Volume UUID. */
  uuid: string;
  /** Absolute directory. */
  dir: string;
  /** Size in bytes. */
  sizeBytes: number;
  /** Lifecycle state. */
  state: LifecycleState;
  /** Writer epoch held by this host's engine. */
  epoch: number;
  /** True when every replica is RW. */
  healthy: boolean;
  /** The replicas. */
  replicas: DirectoryReplicaStatus[];
  /** The NBD export, or null. */
  exported: ExportInfo | null;
}

/** Events of a {@link Volume}. */
export type DirectoryVolumeEvents = {
  /** A replica failed an I/O and was dropped (recorded as ERR in volume.json). */
  'replica-error': (event: ReplicaErrorEvent) => void;
  /** The engine claimed its writer epoch (at open). */
  'epoch-claimed': (event: EpochClaimedEvent) => void;
  /** The engine committed a new replica set (at open, after dropping a failed replica): docs/single-writer.md. */
  'replica-set-changed': (event: ReplicaSetChangedEvent) => void;
  /** Replicas were reconciled. */
  reconciled: (event: ReconciledEvent) => void;
  /** The volume is now served over NBD. */
  exported: (info: ExportInfo) => void;
  /** The NBD export stopped. */
  unexported: (info: ExportInfo) => void;
  /** Something failed in the background (e.g. recording a replica's mode); the volume keeps serving. */
  warning: (error: MooringError) => void;
  /** The volume closed. */
  closed: () => void;
};

function checkDir(value: unknown): string {
  if (typeof value !== 'string' || value.length === 0 || value.includes('\0')) {
    throw new MooringError('INVALID_ARGUMENT', `dir must be a non-empty path (got ${describe(value)})`);
  }
  return resolve(value);
}

/**
 * A replicated block volume in a directory. Create one with {@link DirectoryVolume.create}, open an
 * existing one with {@link DirectoryVolume.open}, serve it with {@link DirectoryVolume.export}, and always
 * {@link DirectoryVolume.close} it: close drains calls in flight, stops the export and marks the
 * replicas clean.
 */
export class DirectoryVolume extends (EventEmitter as new () => TypedEmitter<DirectoryVolumeEvents>) {
  /** Absolute path of the volume directory. */
  readonly dir: string;
  readonly #spec: VolumeSpec;
  readonly #lock: VolumeLock;
  #engine: LocalEngine | null;
  #export: NbdExport | null = null;
  #exporting = false;
  #state: LifecycleState = 'open';
  #closing: Promise<void> | undefined;
  #persistChain: Promise<void> = Promise.resolve();

  private constructor(dir: string, spec: VolumeSpec, lock: VolumeLock, engine: LocalEngine) {
    super();
    this.dir = dir;
    this.#spec = spec;
    this.#lock = lock;
    this.#engine = engine;
    engine.on('replica-error', (e) => this.#onReplicaError(e));
    engine.on('epoch-claimed', (e) => safeEmit(this, 'epoch-claimed', e));
    engine.on('replica-set-changed', (e) => safeEmit(this, 'replica-set-changed', e));
    engine.on('reconciled', (e) => safeEmit(this, 'reconciled', e));
  }

  /**
   * Creates a volume in `dir` (missing or empty) with `replicas` empty replicas and opens
   * it. volume.json is written last, so a crash mid-create leaves no half volume that
   * opens; whatever was created is removed when create fails.
   *
   * @throws MooringError INVALID_ARGUMENT, ALREADY_EXISTS (dir not empty), NO_SPACE, IO_ERROR, NATIVE_LOAD_FAILED
   */
  static async create(options: DirectoryVolumeCreateOptions): Promise<DirectoryVolume> {
    if (typeof options !== 'object' || options === null) {
      throw new MooringError('INVALID_ARGUMENT', `create options must be an object (got ${describe(options)})`);
    }
    const dir = checkDir(options.dir);
    const sizeBytes = checkVolumeSize(options.sizeBytes);
    const replicaCount = checkReplicaCount(options.replicas ?? DEFAULT_REPLICA_COUNT);
    const dirName = basename(dir);
    const name = checkName('volume name', options.name ?? (NAME_PATTERN.test(dirName) && dirName !== '..' ? dirName : 'volume'));
    const addon = options.addon ?? loadAddon();

    const state = await directoryState(dir);
    if (state === 'non-empty') {
      const hasSpec = await pathExists(join(dir, VOLUME_SPEC_FILE));
      throw new MooringError('ALREADY_EXISTS', hasSpec ? `a volume exists in ${dir} already` : `${dir} is not empty; a volume needs an empty or missing directory`, {
        details: { dir },
      });
    }
    if (state === 'missing') await mkdir(dir, { recursive: true }).catch((err: unknown) => Promise.reject(toMooringError(err, `creating ${dir}`)));
    const lock = await VolumeLock.acquire(dir);
    const spec = newVolumeSpec(name, sizeBytes, replicaCount);
    let specWritten = false;
    try {
      // Another creator may have filled the directory between our check and the lock.
      const entries = await readdir(dir);
      if (entries.some((e) => e !== VOLUME_LOCK_FILE)) {
        throw new MooringError('ALREADY_EXISTS', `${dir} was filled while the volume was being created`, { details: { dir } });
      }
    } catch (err) {
      await lock.release();
      throw toMooringError(err, `listing ${dir}`);
    }
    try {
      await mkdir(join(dir, REPLICAS_SUBDIR)).catch((err: unknown) => Promise.reject(toMooringError(err, `creating ${join(dir, REPLICAS_SUBDIR)}`)));
      // allSettled: the rollback below must not delete directories still being created.
      const created = await Promise.allSettled(
        spec.replicas.map((r) => {
          const path = replicaDir(dir, r);
          return callNative(() => addon.createReplica(path, sizeBytes), `creating replica ${r.id}`);
        }),
      );
      const failed = created.find((c): c is PromiseRejectedResult => c.status === 'rejected');
      if (failed) throw failed.reason;
      await writeVolumeSpec(dir, spec);
      specWritten = true;
      return await DirectoryVolume.#openLocked(dir, spec, lock, addon);
    } catch (err) {
      // Roll back to the empty (or missing) directory we started from.
      if (specWritten) await rm(join(dir, VOLUME_SPEC_FILE), { force: true }).catch(() => undefined);
      await rm(join(dir, REPLICAS_SUBDIR), { recursive: true, force: true }).catch(() => undefined);
      await lock.release();
      if (state === 'missing') await rm(dir, { recursive: true, force: true }).catch(() => undefined);
      throw err;
    }
  }

  /**
   * Opens the volume in `dir`: locks the directory against other openers, validates
   * volume.json, allocates the next writer epoch (above volume.json's counter and every epoch
   * the replicas promised, recorded in volume.json first) and starts the engine with it
   * (reconcile after an unclean stop). A volume.json of a release before allocated epochs has
   * no counter: the replicas' epochs alone say where to start.
   *
   * @throws MooringError NOT_FOUND, CORRUPT_METADATA, BUSY (open elsewhere), UNSUPPORTED, NO_HEALTHY_REPLICA, NATIVE_LOAD_FAILED
   */
  static async open(dir: string, options: DirectoryVolumeOpenOptions = {}): Promise<DirectoryVolume> {
    const abs = checkDir(dir);
    const addon = options.addon ?? loadAddon();
    const lock = await VolumeLock.acquire(abs).catch((err: unknown) => {
      // A missing directory reports as such, not as a lock failure.
      if (err instanceof MooringError && err.code === 'NOT_FOUND') {
        throw new MooringError('NOT_FOUND', `no volume at ${abs} (directory missing)`, { cause: err });
      }
      throw err;
    });
    try {
      const spec = await readVolumeSpec(abs);
      return await DirectoryVolume.#openLocked(abs, spec, lock, addon);
    } catch (err) {
      await lock.release();
      throw err;
    }
  }

  static async #openLocked(dir: string, spec: VolumeSpec, lock: VolumeLock, addon: NativeAddon): Promise<DirectoryVolume> {
    const remote = spec.replicas.find((r) => r.address !== undefined);
    if (remote) {
      throw new MooringError('UNSUPPORTED', `replica ${remote.id} is remote (${remote.address}); remote replicas are not supported by this release`);
    }
    const replicas: EngineReplicaSpec[] = spec.replicas.map((r) => ({ id: r.id, path: replicaDir(dir, r) }));
    let engine: LocalEngine | undefined;
    let floor = spec.lastEpoch ?? 0;
    for (let attempt = 1; engine === undefined; attempt++) {
      floor = Math.max(floor, await promisedEpochMax(addon, replicas));
      if (floor >= Number.MAX_SAFE_INTEGER) throw new MooringError('OUT_OF_RANGE', `volume ${spec.name}: no writer epoch is left above ${floor}`);
      const epoch = floor + 1;
      // Recorded before any replica sees it: no later open can hand it out again.
      spec.lastEpoch = epoch;
      await writeVolumeSpec(dir, spec);
      try {
        engine = await LocalEngine.open({ replicas, addon, epoch });
      } catch (err) {
        if (!(err instanceof MooringError && err.code === 'STALE_EPOCH') || attempt >= OPEN_EPOCH_ATTEMPTS_MAX) throw err;
        floor = epoch;
      }
    }
    const volume = new DirectoryVolume(dir, spec, lock, engine);
    for (const e of engine.openEvents) {
      if (e.type === 'replica-error') volume.#recordReplicaError(e);
    }
    volume.#syncModes();
    await volume.#persistChain;
    return volume;
  }

  /** Volume name. */
  get name(): string {
    return this.#spec.name;
  }

  /** Volume UUID, fixed at creation. */
  get uuid(): string {
    return this.#spec.uuid;
  }

  /** Size in bytes. */
  get sizeBytes(): number {
    return this.#spec.sizeBytes;
  }

  /** Number of replicas. */
  get replicaCount(): number {
    return this.#spec.replicas.length;
  }

  /** 'open', 'closing' or 'closed'. */
  get state(): LifecycleState {
    return this.#state;
  }

  /** The writer epoch held by this host's engine. */
  get epoch(): number {
    return this.#open().epoch;
  }

  /** The engine serving this volume on this host while it is open (attached); null once closed. */
  get engine(): LocalEngine | null {
    return this.#engine;
  }

  /** The running NBD export, or null. */
  get exported(): NbdExport | null {
    return this.#export;
  }

  /** Reads `length` bytes (1 B .. 32 MiB) at `offset`. */
  read(offset: number, length: number): Promise<Buffer> {
    return this.#with((e) => e.read(offset, length));
  }

  /** Writes `data` (1 B .. 32 MiB) at `offset`; resolves once every RW replica has it. Do not modify `data` until then. */
  write(offset: number, data: Uint8Array, options?: WriteOptions): Promise<void> {
    return this.#with((e) => e.write(offset, data, options));
  }

  /** Makes every write that completed before this call durable. */
  flush(): Promise<void> {
    return this.#with((e) => e.flush());
  }

  /** Discards a range (any length inside the volume) and releases its space. */
  trim(offset: number, length: number): Promise<void> {
    return this.#with((e) => e.trim(offset, length));
  }

  /** Makes a range (any length inside the volume) read as zeros. */
  writeZeroes(offset: number, length: number, options?: WriteZeroesOptions): Promise<void> {
    return this.#with((e) => e.writeZeroes(offset, length, options));
  }

  /** Allocation map of a range: extents in order from `offset`; a bounded count (65,536), so they may end early. */
  blockStatus(offset: number, length: number): Promise<Extent[]> {
    return this.#with((e) => e.blockStatus(offset, length));
  }

  /**
   * Takes a snapshot (O(1), no data copied) and returns it as listed.
   *
   * @throws MooringError INVALID_ARGUMENT (name, labels), ALREADY_EXISTS
   */
  async createSnapshot(name: string, options: CreateSnapshotOptions = {}): Promise<SnapshotInfo> {
    checkName('snapshot name', name);
    const labels = checkLabels(options.labels);
    const engine = this.#open();
    await engine.createSnapshot(name, { labels });
    const found = (await this.listSnapshots()).find((s) => s.name === name);
    if (!found) throw new MooringError('IO_ERROR', `snapshot ${name} was created but is not listed`);
    return found;
  }

  /** The snapshots users see, oldest first: deleted-but-kept layers and the head are hidden. */
  async listSnapshots(): Promise<SnapshotInfo[]> {
    const layers = await this.#open().listLayers();
    return visibleSnapshots(layers);
  }

  /**
   * Deletes a snapshot; its data merges into its child and its space is reclaimed.
   *
   * @throws MooringError NOT_FOUND
   */
  deleteSnapshot(name: string): Promise<void> {
    return this.#with((e) => e.deleteSnapshot(name));
  }

  /**
   * Makes the volume's content that of snapshot `name`. Refused with INVALID_STATE while
   * the volume is exported: clients would see their disk change under them.
   *
   * @throws MooringError INVALID_STATE, NOT_FOUND
   */
  async revertToSnapshot(name: string): Promise<void> {
    checkName('snapshot name', name);
    const engine = this.#open();
    if (this.#export !== null || this.#exporting) {
      throw new MooringError('INVALID_STATE', `cannot revert ${this.name} to ${name} while it is exported at ${this.#export?.addressString ?? '(starting)'}; close the export first`);
    }
    await engine.revert(name);
  }

  /**
   * Serves the volume over NBD (default `unix:DIR/nbd.sock`). One export at a time; close
   * it with {@link NbdExport.close} or by closing the volume.
   *
   * @throws MooringError INVALID_STATE (already exported), INVALID_ARGUMENT, ADDRESS_IN_USE
   */
  async export(options: DirectoryExportOptions = {}): Promise<NbdExport> {
    const engine = this.#open();
    if (this.#export !== null || this.#exporting) {
      throw new MooringError('INVALID_STATE', `${this.name} is already exported${this.#export ? ` at ${this.#export.addressString}` : ''}`);
    }
    this.#exporting = true;
    try {
      const exp = await engine.exportNbd({ ...options, nbd: options.nbd ?? `unix:${join(this.dir, DEFAULT_SOCKET_FILE)}` });
      const info: ExportInfo = { address: exp.addressString, uri: exp.uri, exportName: exp.exportName };
      this.#export = exp;
      exp.once('closed', () => {
        if (this.#export === exp) this.#export = null;
        safeEmit(this, 'unexported', info);
      });
      safeEmit(this, 'exported', info);
      return exp;
    } finally {
      this.#exporting = false;
    }
  }

  /** Size, epoch, replicas (mode, epoch, allocated bytes, last error) and the export. */
  async status(): Promise<DirectoryVolumeStatus> {
    const engine = this.#open();
    const replicas = engine.replicas().map((r): DirectoryReplicaStatus => {
      const rec = this.#spec.replicas.find((s) => s.id === r.id)?.lastError;
      return rec ? { ...r, lastError: { ...rec } } : r;
    });
    const exp = this.#export;
    return {
      name: this.name,
      uuid: this.uuid,
      dir: this.dir,
      sizeBytes: this.sizeBytes,
      state: this.#state,
      epoch: engine.epoch,
      healthy: replicas.every((r) => r.mode === 'RW'),
      replicas,
      exported: exp ? { address: exp.addressString, uri: exp.uri, exportName: exp.exportName } : null,
    };
  }

  /**
   * Closes the volume: refuses new calls (CLOSED), stops the NBD export (drains and
   * flushes), closes the engine (waits for calls in flight, flushes, marks replicas clean),
   * records replica modes and unlocks the directory. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= this.#doClose();
    return this.#closing;
  }

  async #doClose(): Promise<void> {
    this.#state = 'closing';
    const errors: unknown[] = [];
    if (this.#export) await this.#export.close().catch((err: unknown) => errors.push(err));
    if (this.#engine) {
      // Modes seen last are worth recording even if close fails below.
      try {
        this.#syncModes();
      } catch {
        // The engine may already be unusable; its close reports why.
      }
      await this.#engine.close().catch((err: unknown) => errors.push(err));
    }
    await this.#persistChain;
    await this.#lock.release();
    this.#engine = null;
    this.#state = 'closed';
    safeEmit(this, 'closed');
    if (errors.length > 0) throw errors[0];
  }

  #open(): LocalEngine {
    if (this.#state !== 'open' || this.#engine === null) {
      throw new MooringError('CLOSED', `volume ${this.name} is ${this.#state}`);
    }
    return this.#engine;
  }

  // Runs an engine call, turning a closed volume into a rejection (not a throw).
  #with<T>(call: (engine: LocalEngine) => Promise<T>): Promise<T> {
    try {
      return call(this.#open());
    } catch (err) {
      return Promise.reject(err);
    }
  }

  #onReplicaError(e: ReplicaErrorEvent): void {
    this.#recordReplicaError(e);
    safeEmit(this, 'replica-error', e);
  }

  #recordReplicaError(e: ReplicaErrorEvent): void {
    const r = this.#spec.replicas.find((s) => s.id === e.replicaId);
    if (!r) return;
    r.mode = 'ERR';
    r.lastError = { errno: e.errno, code: e.code, message: e.message.slice(0, 4096), atMs: Date.now() };
    this.#persist();
  }

  // Copies the engine's view of replica modes into volume.json when they differ.
  #syncModes(): void {
    if (!this.#engine || this.#engine.state !== 'open') return;
    let changed = false;
    for (const r of this.#engine.replicas()) {
      const s = this.#spec.replicas.find((x) => x.id === r.id);
      if (s && s.mode !== r.mode) {
        s.mode = r.mode;
        changed = true;
      }
    }
    if (changed) this.#persist();
  }

  // Serialised writes of volume.json: each writes the latest spec; a failure is reported
  // as a warning (the engine's own epochs still protect the data, invariant 3).
  #persist(): void {
    this.#persistChain = this.#persistChain.then(() =>
      writeVolumeSpec(this.dir, this.#spec).catch((err: unknown) => {
        safeEmit(this, 'warning', toMooringError(err, `recording replica modes of ${this.name}`));
      }),
    );
  }
}

// The highest epoch the replicas promised, as their metadata says (a replica that cannot be
// read counts 0: the engine opens it ERR, or refuses the epoch and the open tries again).
async function promisedEpochMax(addon: NativeAddon, replicas: EngineReplicaSpec[]): Promise<number> {
  const epochs = await Promise.all(
    replicas.map(async (r) => {
      if (r.path === undefined) return 0;
      const info = await callNative(() => addon.inspectReplica(r.path!), `inspecting replica ${r.id}`).catch(() => undefined);
      return info && Number.isSafeInteger(info.epoch) && info.epoch > 0 ? info.epoch : 0;
    }),
  );
  return Math.max(0, ...epochs);
}
