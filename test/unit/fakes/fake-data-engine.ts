// An in-memory DataEngine for control-plane unit tests (Mooring): replicas and engines are
// records, a host can be made unreachable (every call rejects UNAVAILABLE), and replica
// modes can be set to drive repair decisions. It does no disk I/O; backing image files are
// Buffers with the real rules (states, SHA-512, 3 reads per file, resume offsets, BUSY deletes).
// Epochs follow docs/single-writer.md: every replica keeps the highest epoch it promised and
// the last replica set committed to it; a start or activation claims the epoch it is given
// (STALE_EPOCH when a replica promised as much or more), never one of its own, and every
// epoch given is recorded in `epochsGiven` for the tests to check.
import type {
  BackingImageDownloadOptions,
  BackingImageFileInfo,
  BackingImageFileRef,
  BackingImageWriteOptions,
  DataEngine,
  DataEngineEvent,
  DataEngineInfo,
  EngineActivateOptions,
  EngineHandOver,
  EngineInfo,
  EngineReplicaRef,
  EngineSnapshotInfo,
  EngineStartOptions,
  HostedReplicaInfo,
  ReplicaBackingImage,
  ReplicaCreateOptions,
  RebuildResult,
  SnapshotCopyResult,
  ReplicaRemoveOptions,
} from '../../../src/data-engine/data-engine.js';
import { createHash } from 'node:crypto';

import { MooringError } from '../../../src/errors.js';

/** Reads open at once on one file, as the real data engine allows (more: BUSY). */
export const FAKE_READS_PER_FILE_MAX = 3;
/** Bytes per chunk of a fake read. */
export const FAKE_READ_CHUNK_BYTES = 4096;

/** One backing image file on a fake disk. */
export interface FakeImageFile {
  ref: BackingImageFileRef;
  state: BackingImageFileInfo['state'];
  message: string;
  sizeBytes: number;
  receivedBytes: number;
  chunks: Buffer[];
  checksum: string;
  format: 'raw' | 'qcow2' | null;
  virtualSizeBytes: number;
  running: boolean;
  cancelled: boolean;
  readers: number;
}

interface FakeEngineState {
  volume: string;
  sizeBytes: number;
  epoch: number;
  /** Generation of the replica set it last committed (0 for a standby that never was active). */
  generation: number;
  nbd: string | null;
  role: 'active' | 'standby';
  replicas: Array<EngineReplicaRef & { mode: 'RW' | 'WO' | 'ERR'; lastError: number }>;
}

/** One epoch handed to a fake data engine (whether or not the claim succeeded). */
export interface FakeEpochGiven {
  volume: string;
  hostId: string;
  call: 'startEngine' | 'activateEngine';
  epoch: number;
  /** The code it failed with, or null. */
  failed: string | null;
}

/** What a replica keeps (replica.json): its size, the highest epoch promised and the last replica set committed to it. */
interface FakeReplicaMeta {
  sizeBytes: number;
  epoch: number;
  set: { epoch: number; generation: number } | null;
}

/** Replica metadata by replica name (names are unique across the fake hosts), shared by all hosts as the replica protocol would make it. */
const replicaMeta = new Map<string, FakeReplicaMeta>();
/** The epoch each volume's writer claimed last (any fake host). */
const epochs = new Map<string, number>();
/** Every epoch handed to any fake host, in order. */
const epochLog: FakeEpochGiven[] = [];
/** Snapshots are per volume and shared by all fake hosts, as replicas would hold them. */
const snapshots = new Map<string, EngineSnapshotInfo[]>();

export class FakeDataEngine implements DataEngine {
  reachable = true;
  /** What info() reports; {@link restart} changes both. */
  instanceId = 'fake-1';
  version = 'fake';
  /** What info() reports as the disk's identity (replaceDisk() draws another). */
  diskId = '';
  readonly replicas = new Map<string, { sizeBytes: number; inUse: boolean; backingImage?: ReplicaBackingImage | null }>();
  readonly engines = new Map<string, FakeEngineState>();
  readonly calls: string[] = [];
  /** When set, addReplica rejects with this code. */
  failAddReplica: string | null = null;
  /** When set, resizeEngine rejects with this code and changes nothing. */
  failResize: string | null = null;
  /** Runs at the start of resizeEngine (a test looks at the cluster's state then). */
  onResize: (() => Promise<void>) | null = null;
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

  /** A new process on the same directory and addresses: its engines are gone, its replicas stay. */
  restart(version = this.version): void {
    this.engines.clear();
    this.version = version;
    this.instanceId = `fake-${Number(this.instanceId.slice(5)) + 1}`;
  }

  /** The host's disk was replaced: a new process over an empty directory with a new disk id. */
  replaceDisk(diskId: string): void {
    this.restart();
    for (const name of this.replicas.keys()) replicaMeta.delete(name);
    this.replicas.clear();
    this.files.clear();
    this.diskId = diskId;
  }

  async info(): Promise<DataEngineInfo> {
    this.#check('info');
    return { hostId: this.hostId, version: this.version, dir: `/fake/${this.hostId}`, replicaAddress: this.replicaAddress, tls: false, instanceId: this.instanceId, diskId: this.diskId, features: [] };
  }

  async createReplica(name: string, sizeBytes: number, options: ReplicaCreateOptions = {}): Promise<HostedReplicaInfo> {
    this.#check(`createReplica ${name}${options.backingImage ? ` over ${options.backingImage.dir}` : ''}`);
    if (this.replicas.has(name)) throw new MooringError('ALREADY_EXISTS', `replica ${name} exists`);
    const bi = options.backingImage ?? null;
    if (bi) {
      const f = this.files.get(bi.dir);
      if (!f) throw new MooringError('NOT_FOUND', `no backing image file ${bi.dir} on ${this.hostId}`);
      if (f.state !== 'ready') throw new MooringError('INVALID_STATE', `backing image file ${bi.dir} on ${this.hostId} is ${f.state}`);
      if (bi.virtualSizeBytes > sizeBytes) throw new MooringError('INVALID_ARGUMENT', `backing image ${bi.dir} is larger than replica ${name}`);
    }
    this.replicas.set(name, { sizeBytes, inUse: false, backingImage: bi ? { ...bi } : null });
    replicaMeta.set(name, { sizeBytes, epoch: 0, set: null });
    return { name, sizeBytes, epoch: 0, clean: true, rebuilding: false, allocatedBytes: 0, inUse: false, backingImage: bi ? { ...bi } : null };
  }

  async deleteReplica(name: string): Promise<void> {
    this.#check(`deleteReplica ${name}`);
    if (!this.replicas.has(name)) throw new MooringError('NOT_FOUND', `no replica ${name}`);
    this.replicas.delete(name);
    replicaMeta.delete(name);
  }

  async growReplica(name: string, sizeBytes: number): Promise<HostedReplicaInfo> {
    this.#check(`growReplica ${name} ${sizeBytes}`);
    const r = this.replicas.get(name);
    const m = replicaMeta.get(name);
    if (!r || !m) throw new MooringError('NOT_FOUND', `no replica ${name}`);
    if (r.inUse || [...this.engines.values()].some((e) => e.replicas.some((x) => x.name === name))) throw new MooringError('BUSY', `replica ${name} is in use`);
    if (sizeBytes < m.sizeBytes) throw new MooringError('INVALID_ARGUMENT', `replica ${name} has ${m.sizeBytes} bytes: it can grow, not shrink to ${sizeBytes}`);
    m.sizeBytes = r.sizeBytes = sizeBytes;
    return (await this.listReplicas()).find((x) => x.name === name)!;
  }

  async listReplicas(): Promise<HostedReplicaInfo[]> {
    this.#check('listReplicas');
    return [...this.replicas].map(([name, r]) => ({ name, sizeBytes: replicaMeta.get(name)?.sizeBytes ?? r.sizeBytes, epoch: replicaMeta.get(name)?.epoch ?? 0, clean: true, rebuilding: false, allocatedBytes: 0, inUse: r.inUse, backingImage: r.backingImage ? { ...r.backingImage } : null }));
  }

  async startEngine(options: EngineStartOptions): Promise<EngineInfo> {
    this.#check(`startEngine ${options.volume}`);
    const standby = options.standby === true;
    if (standby ? options.epoch !== undefined : !isEpoch(options.epoch)) {
      throw new MooringError('INVALID_ARGUMENT', `epoch ${String(options.epoch)}: required (a positive integer) unless standby, and none for a standby`);
    }
    if (this.engines.has(options.volume)) throw new MooringError('ALREADY_EXISTS', `engine for ${options.volume} runs`);
    const names = options.replicas.map((r) => r.name);
    let generation = 0;
    if (!standby) {
      const epoch = options.epoch!;
      this.#given(options.volume, 'startEngine', epoch, () => claim(names, epoch));
      commit(names, epoch, 1);
      epochs.set(options.volume, epoch);
      generation = 1;
    }
    this.engines.set(options.volume, {
      volume: options.volume,
      // The size rule (engine.h): the largest size a replica recorded; a start grows the others to it.
      sizeBytes: settleSize(names, !standby),
      epoch: standby ? 0 : options.epoch!,
      generation,
      nbd: options.nbd ?? null,
      role: standby ? 'standby' : 'active',
      replicas: options.replicas.map((r) => ({ ...r, mode: 'RW', lastError: 0 })),
    });
    return this.engineInfo(options.volume);
  }

  /** Every epoch handed to this data engine, in order. */
  readonly epochsGiven: FakeEpochGiven[] = [];

  /** The epochs handed to any fake host for `volume`, in order (failed claims included). */
  static epochsGivenFor(volume: string): FakeEpochGiven[] {
    return epochLog.filter((e) => e.volume === volume).map((e) => ({ ...e }));
  }

  // Records an epoch given, then runs its claim (which may throw).
  #given(volume: string, call: FakeEpochGiven['call'], epoch: number, body: () => void): void {
    const entry: FakeEpochGiven = { volume, hostId: this.hostId, call, epoch, failed: null };
    this.epochsGiven.push(entry);
    epochLog.push(entry);
    try {
      body();
    } catch (err) {
      entry.failed = (err as MooringError).code;
      throw err;
    }
  }

  /** The size a replica records now (any host). */
  static replicaSize(name: string): number | undefined {
    return replicaMeta.get(name)?.sizeBytes;
  }

  /** Sets the size a replica records, as a resize cut short by a crash would leave it. */
  static setReplicaSize(name: string, sizeBytes: number): void {
    const m = replicaMeta.get(name);
    if (!m) throw new Error(`no fake replica ${name}`);
    m.sizeBytes = sizeBytes;
  }

  /** Sets the epoch a replica promised, as a replica written by a release whose engines chose their epochs would hold. */
  static setReplicaEpoch(name: string, epoch: number): void {
    const m = replicaMeta.get(name);
    if (!m) throw new Error(`no fake replica ${name}`);
    m.epoch = epoch;
  }

  async stopEngine(volume: string): Promise<void> {
    this.#check(`stopEngine ${volume}`);
    this.#engine(volume);
    this.engines.delete(volume);
    this.emit({ type: 'engine-stopped', volume });
  }

  async engineInfo(volume: string): Promise<EngineInfo> {
    this.#check(`engineInfo ${volume}`);
    return this.#info(volume);
  }

  #info(volume: string): EngineInfo {
    const e = this.#engine(volume);
    return {
      volume,
      sizeBytes: e.sizeBytes,
      epoch: e.epoch,
      role: e.role,
      replicas: e.replicas.map((r) => ({ ...r })),
      nbd: e.nbd ? { address: e.nbd, uri: `nbd+unix:///?socket=${e.nbd.slice(5)}` } : null,
    };
  }

  async listEngines(): Promise<EngineInfo[]> {
    this.#check('listEngines');
    return [...this.engines.keys()].map((v) => this.#info(v));
  }

  async addReplica(volume: string, replica: EngineReplicaRef): Promise<RebuildResult> {
    this.#check(`addReplica ${volume} ${replica.id}@${replica.hostId}`);
    const e = this.#engine(volume);
    if (this.failAddReplica) throw new MooringError(this.failAddReplica as 'IO_ERROR', 'fake rebuild failure');
    // The target takes the engine's size with the chain it adopts.
    const target = replicaMeta.get(replica.name);
    if (target) target.sizeBytes = e.sizeBytes;
    const slot = e.replicas.find((r) => r.id === replica.id);
    if (slot) Object.assign(slot, replica, { mode: 'RW', lastError: 0 });
    else e.replicas.push({ ...replica, mode: 'RW', lastError: 0 });
    // The rebuilt replica joins the replica set: a commit of the next generation.
    if (e.role === 'active') {
      const meta = replicaMeta.get(replica.name);
      if (meta) meta.epoch = Math.max(meta.epoch, e.epoch);
      e.generation++;
      commit(e.replicas.map((r) => r.name), e.epoch, e.generation);
    }
    return { replicaId: replica.id, scannedBytes: 0, sentBytes: 1234, unmappedBytes: 0, durationMs: 1 };
  }

  async resizeEngine(volume: string, sizeBytes: number): Promise<EngineInfo> {
    this.#check(`resizeEngine ${volume} ${sizeBytes}`);
    await this.onResize?.();
    const e = this.#active(volume);
    if (this.failResize) throw new MooringError(this.failResize as 'IO_ERROR', 'fake resize failure');
    if (sizeBytes % 4096 !== 0 || sizeBytes < e.sizeBytes) throw new MooringError('INVALID_ARGUMENT', `cannot resize ${e.sizeBytes} bytes to ${sizeBytes}`);
    for (const r of e.replicas) {
      const m = replicaMeta.get(r.name);
      if (r.mode === 'RW' && m) m.sizeBytes = sizeBytes;
    }
    e.sizeBytes = sizeBytes;
    return this.engineInfo(volume);
  }

  async removeReplica(volume: string, replicaId: string, options: ReplicaRemoveOptions = {}): Promise<void> {
    this.#check(`removeReplica ${volume} ${replicaId}`);
    const e = this.#engine(volume);
    const i = e.replicas.findIndex((r) => r.id === replicaId);
    if (i < 0) throw new MooringError('NOT_FOUND', `no replica ${replicaId}`);
    const otherRw = e.replicas.some((r, j) => j !== i && r.mode === 'RW');
    if (e.replicas[i]!.mode === 'RW' && !(options.evenIfRw && otherRw)) throw new MooringError('INVALID_STATE', `replica ${replicaId} is RW`);
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
    if (e.replicas.some((r) => (replicaMeta.get(r.name)?.epoch ?? 0) > e.epoch)) throw new MooringError('STALE_EPOCH', `engine of ${volume} on ${this.hostId} was fenced`);
    e.role = 'standby';
    this.emit({ type: 'engine-deactivated', volume, epoch: e.epoch });
    return { epoch: e.epoch, generation: e.generation, rwReplicaIds: e.replicas.filter((r) => r.mode === 'RW').map((r) => r.id) };
  }

  async activateEngine(volume: string, handOver: EngineHandOver, options: EngineActivateOptions): Promise<EngineInfo> {
    this.#check(`activateEngine ${volume}`);
    if (!isEpoch(options?.epoch)) throw new MooringError('INVALID_ARGUMENT', `activate needs {epoch}, a positive integer (got ${String(options?.epoch)})`);
    const e = this.#engine(volume);
    if (e.role !== 'standby') throw new MooringError('INVALID_STATE', `engine of ${volume} on ${this.hostId} is active`);
    const epoch = options.epoch;
    if (epoch <= handOver.epoch) throw new MooringError('INVALID_ARGUMENT', `activation epoch ${epoch} must be allocated above the hand-over's ${handOver.epoch}`);
    const names = e.replicas.map((r) => r.name);
    const rw = new Set(handOver.rwReplicaIds);
    this.#given(volume, 'activateEngine', epoch, () => {
      claim(names, epoch);
      // As the real engine: a hand-over works once; one overtaken by another engine is refused.
      const latest = latestSet(names);
      if (!latest || latest.epoch !== handOver.epoch || latest.generation !== handOver.generation) {
        throw new MooringError('STALE_EPOCH', `the hand-over of ${volume} (${handOver.epoch}/${handOver.generation}) is not the latest replica set (${latest ? `${latest.epoch}/${latest.generation}` : 'none'})`);
      }
      if (!e.replicas.some((r) => rw.has(r.id))) throw new MooringError('NO_HEALTHY_REPLICA', `no RW replica in the hand-over of ${volume}`);
    });
    for (const r of e.replicas) {
      r.mode = rw.has(r.id) ? 'RW' : 'ERR';
      r.lastError = rw.has(r.id) ? 0 : -5;
    }
    commit(names, epoch, 1);
    e.sizeBytes = settleSize(e.replicas.filter((r) => r.mode === 'RW').map((r) => r.name), true);
    e.epoch = epoch;
    e.generation = 1;
    epochs.set(volume, epoch);
    e.role = 'active';
    this.emit({ type: 'engine-activated', volume, epoch });
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

  async revertSnapshot(volume: string, name: string): Promise<void> {
    this.#check(`revertSnapshot ${volume} ${name}`);
    this.#active(volume);
    const list = snapshots.get(volume) ?? [];
    if (!list.some((x) => x.name === name)) throw new MooringError('NOT_FOUND', `no snapshot ${name}`);
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

  // --- backing image files: a model of the real calls (files as Buffers per host) ---

  /** Test control: how a download of `url` gets its bytes (default: DOWNLOAD_FAILED). */
  fetchUrl: ((url: string) => AsyncIterable<Uint8Array>) | null = null;
  /** Test control: awaited before each chunk a read yields (throttles sends). */
  beforeReadChunk: (() => Promise<void>) | null = null;
  /** Largest number of reads open at once on one file, per `<name>-<uuid>` (for the 3-sends rule). */
  readonly maxReadsSeen = new Map<string, number>();
  /** Every write call: `<dir> offset=<n>`. */
  readonly writes: string[] = [];
  readonly files = new Map<string, FakeImageFile>();

  #file(ref: BackingImageFileRef): FakeImageFile | undefined {
    return this.files.get(`${ref.name}-${ref.uuid}`);
  }

  #infoOf(f: FakeImageFile): BackingImageFileInfo {
    const dir = `${f.ref.name}-${f.ref.uuid}`;
    const usedBy = [...this.replicas].filter(([, r]) => r.backingImage?.dir === dir).map(([n]) => n);
    return {
      name: f.ref.name,
      uuid: f.ref.uuid,
      state: f.state,
      progress: f.state === 'ready' ? 100 : f.sizeBytes > 0 ? Math.floor((f.receivedBytes * 100) / f.sizeBytes) : 0,
      message: f.message,
      sizeBytes: f.sizeBytes,
      receivedBytes: f.receivedBytes,
      checksum: f.state === 'ready' ? f.checksum : '',
      format: f.state === 'ready' ? f.format : null,
      virtualSizeBytes: f.state === 'ready' ? f.virtualSizeBytes : 0,
      usedBy,
    };
  }

  #emitFile(f: FakeImageFile): void {
    const { usedBy: _u, ...rest } = this.#infoOf(f);
    this.emit({ type: 'backing-image-file', ...rest });
  }

  async listBackingImageFiles(): Promise<BackingImageFileInfo[]> {
    this.#check('listBackingImageFiles');
    return [...this.files.values()].map((f) => this.#infoOf(f));
  }

  async backingImageFile(ref: BackingImageFileRef): Promise<BackingImageFileInfo | null> {
    this.#check(`backingImageFile ${ref.name}`);
    const f = this.#file(ref);
    return f ? this.#infoOf(f) : null;
  }

  // Runs one preparation of a file from `data` starting at `offset`: the shared core of
  // download, write (upload or copy) and export, as the real data engine does it.
  async #prepare(ref: BackingImageFileRef, sizeBytes: number, offset: number, expectedChecksum: string | undefined, data: AsyncIterable<Uint8Array>): Promise<BackingImageFileInfo> {
    const dir = `${ref.name}-${ref.uuid}`;
    let f = this.files.get(dir);
    if (f?.state === 'ready') return this.#infoOf(f);
    if (f?.running) throw new MooringError('BUSY', `a preparation of ${dir} runs on ${this.hostId}`);
    if (offset !== 0 && (!f || f.receivedBytes !== offset)) {
      throw new MooringError('INVALID_ARGUMENT', `offset ${offset} of ${dir} must be 0 or the partial's ${f?.receivedBytes ?? 0} bytes`);
    }
    if (!f) {
      f = { ref: { ...ref }, state: 'pending', message: '', sizeBytes, receivedBytes: 0, chunks: [], checksum: '', format: null, virtualSizeBytes: 0, running: false, cancelled: false, readers: 0 };
      this.files.set(dir, f);
    }
    if (offset === 0) {
      f.chunks = [];
      f.receivedBytes = 0;
    }
    f.sizeBytes = sizeBytes;
    f.running = true;
    f.cancelled = false;
    f.state = 'starting';
    f.message = '';
    this.#emitFile(f);
    const file = f;
    try {
      for await (const chunk of data) {
        if (file.cancelled) throw new MooringError('CANCELLED', `preparation of ${dir} was cancelled`);
        if (!this.reachable) throw new MooringError('UNAVAILABLE', `host ${this.hostId} went away`);
        if (this.files.get(dir) !== file) throw new MooringError('CANCELLED', `${dir} was deleted`);
        if (sizeBytes > 0 && file.receivedBytes + chunk.byteLength > sizeBytes) throw new MooringError('INVALID_ARGUMENT', `${dir}: more than the declared ${sizeBytes} bytes`);
        file.chunks.push(Buffer.from(chunk));
        file.receivedBytes += chunk.byteLength;
        file.state = 'in-progress';
        this.#emitFile(file);
      }
      if (file.cancelled) throw new MooringError('CANCELLED', `preparation of ${dir} was cancelled`);
      if (sizeBytes > 0 && file.receivedBytes < sizeBytes) throw new MooringError('IO_ERROR', `${dir}: the stream ended at ${file.receivedBytes} of ${sizeBytes} bytes`);
      const bytes = Buffer.concat(file.chunks);
      const sum = createHash('sha512').update(bytes).digest('hex');
      if (expectedChecksum !== undefined && expectedChecksum !== '' && expectedChecksum !== sum) {
        // A wrong file cannot be resumed: its bytes go.
        file.chunks = [];
        file.receivedBytes = 0;
        throw new MooringError('CHECKSUM_MISMATCH', `${dir}: SHA-512 ${sum} is not the expected ${expectedChecksum}`);
      }
      file.chunks = [bytes];
      file.sizeBytes = bytes.length;
      file.checksum = sum;
      const qcow2 = bytes.length >= 32 && bytes.readUInt32BE(0) === 0x514649fb;
      file.format = qcow2 ? 'qcow2' : 'raw';
      file.virtualSizeBytes = qcow2 ? Number(bytes.readBigUInt64BE(24)) : bytes.length;
      file.state = 'ready';
      file.message = '';
      this.#emitFile(file);
      return this.#infoOf(file);
    } catch (err) {
      const e = err instanceof MooringError ? err : new MooringError('IO_ERROR', `${dir}: ${String(err)}`, { cause: err });
      // A partial file stays for a resume (offset = receivedBytes).
      file.state = 'failed';
      file.message = e.message;
      if (this.files.get(dir) === file) this.#emitFile(file);
      throw e;
    } finally {
      file.running = false;
    }
  }

  async downloadBackingImageFile(ref: BackingImageFileRef, options: BackingImageDownloadOptions): Promise<BackingImageFileInfo> {
    this.#check(`downloadBackingImageFile ${ref.name} ${options.url}`);
    const fetchUrl = this.fetchUrl;
    const source: AsyncIterable<Uint8Array> = fetchUrl
      ? fetchUrl(options.url)
      : (async function* () {
          yield* [];
          throw new MooringError('DOWNLOAD_FAILED', `fake: no server for ${options.url}`);
        })();
    try {
      return await this.#prepare(ref, 0, 0, options.expectedChecksum, source);
    } catch (err) {
      if (err instanceof MooringError && (err.code === 'CHECKSUM_MISMATCH' || err.code === 'CANCELLED' || err.code === 'BUSY')) throw err;
      throw new MooringError('DOWNLOAD_FAILED', `download of ${options.url} failed: ${(err as Error).message}`, { cause: err });
    }
  }

  async writeBackingImageFile(ref: BackingImageFileRef, options: BackingImageWriteOptions, data: AsyncIterable<Uint8Array>): Promise<BackingImageFileInfo> {
    this.#check(`writeBackingImageFile ${ref.name} offset=${options.offset ?? 0}`);
    this.writes.push(`${ref.name}-${ref.uuid} offset=${options.offset ?? 0}`);
    if (!Number.isSafeInteger(options.sizeBytes) || options.sizeBytes <= 0) throw new MooringError('INVALID_ARGUMENT', `sizeBytes must be a positive integer (got ${options.sizeBytes})`);
    return this.#prepare(ref, options.sizeBytes, options.offset ?? 0, options.expectedChecksum, data);
  }

  async *readBackingImageFile(ref: BackingImageFileRef, options: { offset?: number } = {}): AsyncIterable<Uint8Array> {
    this.#check(`readBackingImageFile ${ref.name}`);
    const dir = `${ref.name}-${ref.uuid}`;
    const f = this.#file(ref);
    if (!f) throw new MooringError('NOT_FOUND', `no backing image file ${dir} on ${this.hostId}`);
    if (f.state !== 'ready') throw new MooringError('INVALID_STATE', `${dir} on ${this.hostId} is ${f.state}`);
    if (f.readers >= FAKE_READS_PER_FILE_MAX) throw new MooringError('BUSY', `${dir} on ${this.hostId} has ${f.readers} reads open`);
    f.readers++;
    this.maxReadsSeen.set(dir, Math.max(this.maxReadsSeen.get(dir) ?? 0, f.readers));
    try {
      const bytes = f.chunks[0]!;
      for (let at = options.offset ?? 0; at < bytes.length; at += FAKE_READ_CHUNK_BYTES) {
        if (this.beforeReadChunk) await this.beforeReadChunk();
        if (!this.reachable) throw new MooringError('UNAVAILABLE', `host ${this.hostId} went away`);
        yield bytes.subarray(at, Math.min(bytes.length, at + FAKE_READ_CHUNK_BYTES));
      }
    } finally {
      f.readers--;
    }
  }

  async exportSnapshotToBackingImageFile(volume: string, snapshot: string, ref: BackingImageFileRef, options: { expectedChecksum?: string } = {}): Promise<BackingImageFileInfo> {
    this.#check(`exportSnapshotToBackingImageFile ${volume} ${snapshot} ${ref.name}`);
    this.#active(volume);
    if (!(snapshots.get(volume) ?? []).some((x) => x.name === snapshot)) throw new MooringError('NOT_FOUND', `no snapshot ${snapshot}`);
    // The fake's volume content: a pattern named after the volume and snapshot.
    const bytes = Buffer.alloc(8192, `${volume}@${snapshot}`);
    return this.#prepare(ref, bytes.length, 0, options.expectedChecksum, (async function* () {
      yield bytes;
    })());
  }

  async cancelBackingImageFile(ref: BackingImageFileRef): Promise<void> {
    this.#check(`cancelBackingImageFile ${ref.name}`);
    const f = this.#file(ref);
    if (f?.running) f.cancelled = true;
  }

  async deleteBackingImageFile(ref: BackingImageFileRef): Promise<void> {
    this.#check(`deleteBackingImageFile ${ref.name}`);
    const dir = `${ref.name}-${ref.uuid}`;
    const f = this.files.get(dir);
    if (!f) return;
    const users = [...this.replicas].filter(([, r]) => r.backingImage?.dir === dir).map(([n]) => n);
    if (users.length > 0) throw new MooringError('BUSY', `${dir} on ${this.hostId} is used by ${users.join(', ')}`);
    f.cancelled = true;
    this.files.delete(dir);
  }

  /** Test control: a file made ready directly (as if prepared earlier). */
  putReadyFile(ref: BackingImageFileRef, bytes: Buffer): void {
    const sum = createHash('sha512').update(bytes).digest('hex');
    this.files.set(`${ref.name}-${ref.uuid}`, { ref: { ...ref }, state: 'ready', message: '', sizeBytes: bytes.length, receivedBytes: bytes.length, chunks: [bytes], checksum: sum, format: 'raw', virtualSizeBytes: bytes.length, running: false, cancelled: false, readers: 0 });
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

function isEpoch(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 1;
}

// ClaimEpoch on every replica: each that promised less promises `epoch`; one that promised
// as much or more refuses, and the claim fails with STALE_EPOCH (the others keep the promise).
function claim(names: string[], epoch: number): void {
  let refused = 0;
  for (const n of names) {
    const m = replicaMeta.get(n);
    if (!m) continue; // a replica that is gone cannot be reached
    if (m.epoch >= epoch) refused = Math.max(refused, m.epoch);
    else m.epoch = epoch;
  }
  if (refused > 0) throw new MooringError('STALE_EPOCH', `epoch ${epoch} is not above the epoch ${refused} a replica promised`);
}

/** The size rule of the real engine: the largest size the replicas recorded; with `grow`, the smaller ones are grown to it. */
function settleSize(names: string[], grow: boolean): number {
  const size = Math.max(0, ...names.map((n) => replicaMeta.get(n)?.sizeBytes ?? 0));
  if (grow) for (const n of names) if (replicaMeta.has(n)) replicaMeta.get(n)!.sizeBytes = size;
  return size;
}

function commit(names: string[], epoch: number, generation: number): void {
  for (const n of names) {
    const m = replicaMeta.get(n);
    if (m && m.epoch === epoch) m.set = { epoch, generation };
  }
}

function latestSet(names: string[]): { epoch: number; generation: number } | null {
  let best: { epoch: number; generation: number } | null = null;
  for (const n of names) {
    const s = replicaMeta.get(n)?.set;
    if (s && (!best || s.epoch > best.epoch || (s.epoch === best.epoch && s.generation > best.generation))) best = s;
  }
  return best;
}
