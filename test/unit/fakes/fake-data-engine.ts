// An in-memory DataEngine for control-plane unit tests (Cluster): replicas and engines are
// records, a host can be made unreachable (every call rejects UNAVAILABLE), and replica
// modes can be set to drive repair decisions. It does no I/O.
import type {
  DataEngine,
  DataEngineEvent,
  DataEngineInfo,
  EngineInfo,
  EngineReplicaRef,
  EngineStartOptions,
  HostedReplicaInfo,
  RebuildResult,
} from '../../../src/data-engine/data-engine.js';
import { MooringError } from '../../../src/errors.js';

interface FakeEngineState {
  volume: string;
  epoch: number;
  nbd: string | null;
  replicas: Array<EngineReplicaRef & { mode: 'RW' | 'WO' | 'ERR'; lastError: number }>;
}

/** Epochs are per volume and shared by all fake hosts, as replicas would make them. */
const epochs = new Map<string, number>();

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
    return { name, sizeBytes, epoch: 0, clean: true, rebuilding: false, allocatedBytes: 0, inUse: false };
  }

  async deleteReplica(name: string): Promise<void> {
    this.#check(`deleteReplica ${name}`);
    if (!this.replicas.has(name)) throw new MooringError('NOT_FOUND', `no replica ${name}`);
    this.replicas.delete(name);
  }

  async listReplicas(): Promise<HostedReplicaInfo[]> {
    this.#check('listReplicas');
    return [...this.replicas].map(([name, r]) => ({ name, sizeBytes: r.sizeBytes, epoch: 0, clean: true, rebuilding: false, allocatedBytes: 0, inUse: r.inUse }));
  }

  async startEngine(options: EngineStartOptions): Promise<EngineInfo> {
    this.#check(`startEngine ${options.volume}`);
    if (this.engines.has(options.volume)) throw new MooringError('ALREADY_EXISTS', `engine for ${options.volume} runs`);
    const epoch = (epochs.get(options.volume) ?? 0) + 1;
    epochs.set(options.volume, epoch);
    this.engines.set(options.volume, {
      volume: options.volume,
      epoch,
      nbd: options.nbd ?? null,
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

  /** Test control: set a replica's mode in a running engine. */
  setMode(volume: string, replicaId: string, mode: 'RW' | 'WO' | 'ERR'): void {
    const r = this.#engine(volume).replicas.find((x) => x.id === replicaId);
    if (!r) throw new Error(`fake: no replica ${replicaId} in ${volume}`);
    r.mode = mode;
    r.lastError = mode === 'ERR' ? -5 : 0;
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
