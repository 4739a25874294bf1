// An in-memory DataEngine for control-plane unit tests (Cluster): replicas and engines are
// records, a host can be made unreachable (every call rejects UNAVAILABLE), and replica
// modes can be set to drive repair decisions. It does no I/O.
import type {
  BackingImageDownloadOptions,
  BackingImageFileInfo,
  BackingImageFileRef,
  BackingImageWriteOptions,
  DataEngine,
  DataEngineEvent,
  DataEngineInfo,
  EngineHandOver,
  EngineInfo,
  EngineReplicaRef,
  EngineSnapshotInfo,
  EngineStartOptions,
  HostedReplicaInfo,
  RebuildResult,
  SnapshotCopyResult,
} from '../../../src/data-engine/data-engine.js';
import { MooringError } from '../../../src/errors.js';

interface FakeEngineState {
  volume: string;
  epoch: number;
  nbd: string | null;
  role: 'active' | 'standby';
  replicas: Array<EngineReplicaRef & { mode: 'RW' | 'WO' | 'ERR'; lastError: number }>;
}

/** Epochs are per volume and shared by all fake hosts, as replicas would make them. */
const epochs = new Map<string, number>();
/** Snapshots are per volume and shared by all fake hosts, as replicas would hold them. */
const snapshots = new Map<string, EngineSnapshotInfo[]>();

export class FakeDataEngine implements DataEngine {
  reachable = true;
  readonly replicas = new Map<string, { sizeBytes: number; inUse: boolean }>();
  readonly engines = new Map<string, FakeEngineState>();
  readonly calls: string[] = [];
  /** When set, addReplica rejects with this code. */
  failAddReplica: string | null = null;
  readonly #listeners = new Set<(e: DataEngineEvent) => void>();

  constructor(
    readonly hostId: string,
    readonly replicaAddress: string | null = `tcp:127.0.0.1:${7000 + hostId.charCodeAt(0)}`,
  ) {}

  #check(what: string): void {
    this.calls.push(what);
    if (!this.reachable) throw new MooringError('UNAVAILABLE', `host ${this.hostId} is unreachable`);
  }

  #engine(volume: string): FakeEngineState {
    const e = this.engines.get(volume);
    if (!e) throw new MooringError('NOT_FOUND', `no engine for ${volume} on ${this.hostId}`);
    return e;
  }

  async info(): Promise<DataEngineInfo> {
    this.#check('info');
    return { hostId: this.hostId, version: 'fake', dir: `/fake/${this.hostId}`, replicaAddress: this.replicaAddress, tls: false };
  }

  async createReplica(name: string, sizeBytes: number): Promise<HostedReplicaInfo> {
    this.#check(`createReplica ${name}`);
    if (this.replicas.has(name)) throw new MooringError('ALREADY_EXISTS', `replica ${name} exists`);
    this.replicas.set(name, { sizeBytes, inUse: false });
    return { name, sizeBytes, epoch: 0, clean: true, rebuilding: false, allocatedBytes: 0, inUse: false, backingImage: null };
  }

  async deleteReplica(name: string): Promise<void> {
    this.#check(`deleteReplica ${name}`);
    if (!this.replicas.has(name)) throw new MooringError('NOT_FOUND', `no replica ${name}`);
    this.replicas.delete(name);
  }

  async listReplicas(): Promise<HostedReplicaInfo[]> {
    this.#check('listReplicas');
    return [...this.replicas].map(([name, r]) => ({ name, sizeBytes: r.sizeBytes, epoch: 0, clean: true, rebuilding: false, allocatedBytes: 0, inUse: r.inUse, backingImage: null }));
  }

  async startEngine(options: EngineStartOptions): Promise<EngineInfo> {
    this.#check(`startEngine ${options.volume}`);
    if (this.engines.has(options.volume)) throw new MooringError('ALREADY_EXISTS', `engine for ${options.volume} runs`);
    const standby = options.standby === true;
    const epoch = standby ? 0 : (epochs.get(options.volume) ?? 0) + 1;
    if (!standby) epochs.set(options.volume, epoch);
    this.engines.set(options.volume, {
      volume: options.volume,
      epoch,
      nbd: options.nbd ?? null,
      role: standby ? 'standby' : 'active',
      replicas: options.replicas.map((r) => ({ ...r, mode: 'RW', lastError: 0 })),
    });
    return this.engineInfo(options.volume);
  }

  async stopEngine(volume: string): Promise<void> {
    this.#check(`stopEngine ${volume}`);
    this.#engine(volume);
    this.engines.delete(volume);
    this.emit({ type: 'engine-stopped', volume });
  }

  async engineInfo(volume: string): Promise<EngineInfo> {
    this.#check(`engineInfo ${volume}`);
    const e = this.#engine(volume);
    return {
      volume,
      sizeBytes: 4096,
      epoch: e.epoch,
      role: e.role,
      replicas: e.replicas.map((r) => ({ ...r })),
      nbd: e.nbd ? { address: e.nbd, uri: `nbd+unix:///?socket=${e.nbd.slice(5)}` } : null,
    };
  }

  async listEngines(): Promise<EngineInfo[]> {
    this.#check('listEngines');
    return Promise.all([...this.engines.keys()].map((v) => this.engineInfo(v)));
  }

  async addReplica(volume: string, replica: EngineReplicaRef): Promise<RebuildResult> {
    this.#check(`addReplica ${volume} ${replica.id}@${replica.hostId}`);
    const e = this.#engine(volume);
    if (this.failAddReplica) throw new MooringError(this.failAddReplica as 'IO_ERROR', 'fake rebuild failure');
    const slot = e.replicas.find((r) => r.id === replica.id);
    if (slot) Object.assign(slot, replica, { mode: 'RW', lastError: 0 });
    else e.replicas.push({ ...replica, mode: 'RW', lastError: 0 });
    return { replicaId: replica.id, scannedBytes: 0, sentBytes: 1234, unmappedBytes: 0, durationMs: 1 };
  }

  async removeReplica(volume: string, replicaId: string): Promise<void> {
    this.#check(`removeReplica ${volume} ${replicaId}`);
    const e = this.#engine(volume);
    const i = e.replicas.findIndex((r) => r.id === replicaId);
    if (i < 0) throw new MooringError('NOT_FOUND', `no replica ${replicaId}`);
    if (e.replicas[i]!.mode === 'RW') throw new MooringError('INVALID_STATE', `replica ${replicaId} is RW`);
    e.replicas.splice(i, 1);
  }

  /** The writer epoch replicas of `volume` last saw (any fake host). */
  static epochOf(volume: string): number {
    return epochs.get(volume) ?? 0;
  }

  async deactivateEngine(volume: string): Promise<EngineHandOver> {
    this.#check(`deactivateEngine ${volume}`);
    const e = this.#engine(volume);
    if (e.role !== 'active') throw new MooringError('INVALID_STATE', `engine of ${volume} on ${this.hostId} is standby`);
    if ((epochs.get(volume) ?? 0) > e.epoch) throw new MooringError('STALE_EPOCH', `engine of ${volume} on ${this.hostId} was fenced`);
    e.role = 'standby';
    this.emit({ type: 'engine-deactivated', volume, epoch: e.epoch });
    return { epoch: e.epoch, rwReplicaIds: e.replicas.filter((r) => r.mode === 'RW').map((r) => r.id) };
  }

  async activateEngine(volume: string, handOver: EngineHandOver): Promise<EngineInfo> {
    this.#check(`activateEngine ${volume}`);
    const e = this.#engine(volume);
    if (e.role !== 'standby') throw new MooringError('INVALID_STATE', `engine of ${volume} on ${this.hostId} is active`);
    // As the real engine: a hand-over works once; one overtaken by another claim is refused.
    if ((epochs.get(volume) ?? 0) > handOver.epoch) throw new MooringError('STALE_EPOCH', `hand-over of ${volume} at epoch ${handOver.epoch} was overtaken`);
    const rw = new Set(handOver.rwReplicaIds);
    if (!e.replicas.some((r) => rw.has(r.id))) throw new MooringError('NO_HEALTHY_REPLICA', `no RW replica in the hand-over of ${volume}`);
    for (const r of e.replicas) {
      r.mode = rw.has(r.id) ? 'RW' : 'ERR';
      r.lastError = rw.has(r.id) ? 0 : -5;
    }
    e.epoch = handOver.epoch + 1;
    epochs.set(volume, e.epoch);
    e.role = 'active';
    this.emit({ type: 'engine-activated', volume, epoch: e.epoch });
    return this.engineInfo(volume);
  }

  #active(volume: string): FakeEngineState {
    const e = this.#engine(volume);
    if (e.role !== 'active') throw new MooringError('INVALID_STATE', `engine of ${volume} on ${this.hostId} is standby`);
    return e;
  }

  async createSnapshot(volume: string, name: string, options: { labels?: Record<string, string> } = {}): Promise<EngineSnapshotInfo> {
    this.#check(`createSnapshot ${volume} ${name}`);
    this.#active(volume);
    const list = snapshots.get(volume) ?? [];
    if (list.some((x) => x.name === name)) throw new MooringError('ALREADY_EXISTS', `snapshot ${name} exists`);
    const snap: EngineSnapshotInfo = {
      name,
      id: `L${String(list.length + 1).padStart(6, '0')}`,
      parent: list.at(-1)?.name ?? null,
      createdMs: Date.now(),
      labels: { ...(options.labels ?? {}) },
      sizeBytes: 4096,
      allocatedBytes: 0,
      userCreated: true,
    };
    snapshots.set(volume, [...list, snap]);
    return snap;
  }

  async listSnapshots(volume: string): Promise<EngineSnapshotInfo[]> {
    this.#check(`listSnapshots ${volume}`);
    this.#engine(volume);
    return (snapshots.get(volume) ?? []).map((x) => ({ ...x }));
  }

  async deleteSnapshot(volume: string, name: string): Promise<void> {
    this.#check(`deleteSnapshot ${volume} ${name}`);
    this.#active(volume);
    const list = snapshots.get(volume) ?? [];
    if (!list.some((x) => x.name === name)) throw new MooringError('NOT_FOUND', `no snapshot ${name}`);
    snapshots.set(volume, list.filter((x) => x.name !== name));
  }

  async exportSnapshot(volume: string, snapshot: string, path: string): Promise<SnapshotCopyResult> {
    this.#check(`exportSnapshot ${volume} ${snapshot} ${path}`);
    this.#active(volume);
    if (!(snapshots.get(volume) ?? []).some((x) => x.name === snapshot)) throw new MooringError('NOT_FOUND', `no snapshot ${snapshot}`);
    return { sizeBytes: 4096, copiedBytes: 0, durationMs: 0 };
  }

  async copySnapshot(volume: string, snapshot: string, toVolume: string): Promise<SnapshotCopyResult> {
    this.#check(`copySnapshot ${volume} ${snapshot} ${toVolume}`);
    this.#active(volume);
    this.#active(toVolume);
    if (!(snapshots.get(volume) ?? []).some((x) => x.name === snapshot)) throw new MooringError('NOT_FOUND', `no snapshot ${snapshot}`);
    return { sizeBytes: 4096, copiedBytes: 0, durationMs: 0 };
  }

  /** Test control: set a replica's mode in a running engine. */
  setMode(volume: string, replicaId: string, mode: 'RW' | 'WO' | 'ERR'): void {
    const r = this.#engine(volume).replicas.find((x) => x.id === replicaId);
    if (!r) throw new Error(`fake: no replica ${replicaId} in ${volume}`);
    r.mode = mode;
    r.lastError = mode === 'ERR' ? -5 : 0;
  }

  // --- backing image files: STUB (issue 6 in progress; replaced by the implementation) ---
  listBackingImageFiles(): Promise<BackingImageFileInfo[]> {
    return Promise.resolve([]);
  }
  backingImageFile(_ref: BackingImageFileRef): Promise<BackingImageFileInfo | null> {
    return Promise.resolve(null);
  }
  downloadBackingImageFile(_ref: BackingImageFileRef, _options: BackingImageDownloadOptions): Promise<BackingImageFileInfo> {
    return Promise.reject(new MooringError('UNSUPPORTED', 'backing image files: not yet'));
  }
  writeBackingImageFile(_ref: BackingImageFileRef, _options: BackingImageWriteOptions, _data: AsyncIterable<Uint8Array>): Promise<BackingImageFileInfo> {
    return Promise.reject(new MooringError('UNSUPPORTED', 'backing image files: not yet'));
  }
  // eslint-disable-next-line require-yield
  async *readBackingImageFile(_ref: BackingImageFileRef, _options?: { offset?: number }): AsyncIterable<Uint8Array> {
    throw new MooringError('UNSUPPORTED', 'backing image files: not yet');
  }
  exportSnapshotToBackingImageFile(_volume: string, _snapshot: string, _ref: BackingImageFileRef, _options?: { expectedChecksum?: string }): Promise<BackingImageFileInfo> {
    return Promise.reject(new MooringError('UNSUPPORTED', 'backing image files: not yet'));
  }
  cancelBackingImageFile(_ref: BackingImageFileRef): Promise<void> {
    return Promise.resolve();
  }
  deleteBackingImageFile(_ref: BackingImageFileRef): Promise<void> {
    return Promise.resolve();
  }

  watch(listener: (event: DataEngineEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  emit(e: DataEngineEvent): void {
    for (const l of this.#listeners) l(e);
  }

  async close(): Promise<void> {}
}
