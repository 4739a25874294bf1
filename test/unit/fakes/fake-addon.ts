// An in-memory NativeAddon for unit tests of the control plane. It keeps replica state in
// memory (keyed by directory) but creates the directories on disk, so Volume's file
// handling runs for real. Knobs let tests hold calls in flight and inject replica failures.
import { mkdirSync, readdirSync, writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';

import type {
  NativeAddon,
  NativeEngine,
  NativeEngineEvent,
  NativeEngineOptions,
  NativeExtent,
  NativeLayerInfo,
  NativeNbdOptions,
  NativeNbdServer,
  NativeNbdStats,
  NativeReplica,
  NativeReplicaMode,
  NativeReplicaState,
  NativeWriteZeroesOptions,
} from '../../../src/native/binding.js';

import { fakeSanlock } from './fake-sanlock.js';

export function nativeError(code: string, message: string, errno?: number): Error {
  return Object.assign(new Error(message), { code, ...(errno === undefined ? {} : { errno }) });
}

interface FakeReplica {
  dir: string;
  sizeBytes: number;
  data: Buffer;
  epoch: number;
  clean: boolean;
  layers: NativeLayerInfo[];
  nextLayer: number;
}

export class FakeNbdServer implements NativeNbdServer {
  readonly port: number;
  closed = false;
  closeCalls = 0;
  constructor(readonly options: NativeNbdOptions) {
    this.port = options.tcpPort === 0 ? 40_000 + Math.floor(Math.random() * 1000) : (options.tcpPort ?? 0);
  }
  stats(): NativeNbdStats {
    return { connectionsTotal: 0, connectionsOpen: 0, requests: 0, bytesRead: 0, bytesWritten: 0, protocolErrors: 0 };
  }
  async close(): Promise<void> {
    this.closeCalls++;
    this.closed = true;
  }
}

export class FakeEngine implements NativeEngine {
  readonly sizeBytes: number;
  closed = false;
  /** While set, data-path calls wait for it (to hold calls in flight). */
  gate: Promise<void> | undefined;
  readonly servers: FakeNbdServer[] = [];
  readonly modes = new Map<string, NativeReplicaMode>();
  readonly lastErrors = new Map<string, number>();
  #epoch: number;

  constructor(
    readonly addon: FakeAddon,
    readonly replicaDirs: string[],
    readonly onEvents: ((events: NativeEngineEvent[]) => void) | undefined,
  ) {
    const reps = replicaDirs.map((d) => addon.replica(d));
    this.sizeBytes = reps[0]!.sizeBytes;
    const maxEpoch = Math.max(...reps.map((r) => r.epoch));
    this.#epoch = maxEpoch + 1;
    for (const r of reps) {
      // A replica fenced earlier (lower epoch than the newest) opens as ERR.
      this.modes.set(r.dir, r.epoch < maxEpoch ? 'ERR' : 'RW');
      if (this.modes.get(r.dir) === 'RW') {
        r.epoch = this.#epoch;
        r.clean = false;
      }
    }
    this.onEvents?.([{ type: 'epoch-claimed', epoch: this.#epoch }]);
  }

  #rw(): FakeReplica[] {
    return this.replicaDirs.filter((d) => this.modes.get(d) === 'RW').map((d) => this.addon.replica(d));
  }

  async #enter(): Promise<void> {
    if (this.closed) throw nativeError('CLOSED', 'engine closed');
    await this.addon.tick();
    if (this.gate) await this.gate;
    if (this.closed) throw nativeError('CLOSED', 'engine closed');
  }

  epoch(): number {
    return this.#epoch;
  }

  replicas(): NativeReplicaState[] {
    return this.replicaDirs.map((d) => {
      const r = this.addon.replica(d);
      return {
        id: d,
        mode: this.modes.get(d)!,
        epoch: r.epoch,
        allocatedBytes: r.data.reduce((n, b) => n + (b !== 0 ? 1 : 0), 0),
        lastError: this.lastErrors.get(d) ?? 0,
      };
    });
  }

  async read(offset: number, length: number): Promise<Buffer> {
    await this.#enter();
    return Buffer.from(this.#rw()[0]!.data.subarray(offset, offset + length));
  }

  async write(offset: number, data: Uint8Array, _fua?: boolean): Promise<void> {
    await this.#enter();
    for (const r of this.#rw()) Buffer.from(data).copy(r.data, offset);
  }

  async flush(): Promise<void> {
    await this.#enter();
  }

  async trim(offset: number, length: number): Promise<void> {
    await this.#enter();
    for (const r of this.#rw()) r.data.fill(0, offset, offset + length);
  }

  async writeZeroes(offset: number, length: number, _options?: NativeWriteZeroesOptions): Promise<void> {
    await this.#enter();
    for (const r of this.#rw()) r.data.fill(0, offset, offset + length);
  }

  async blockStatus(offset: number, length: number): Promise<NativeExtent[]> {
    await this.#enter();
    const data = this.#rw()[0]!.data;
    const out: NativeExtent[] = [];
    for (let at = offset; at < offset + length; ) {
      const end = Math.min(offset + length, (Math.floor(at / 4096) + 1) * 4096);
      const zero = data.subarray(at, end).every((b) => b === 0);
      const flags = zero ? 3 : 0;
      const last = out[out.length - 1];
      if (last && last.flags === flags) last.length += end - at;
      else out.push({ length: end - at, flags });
      at = end;
    }
    return out;
  }

  async snapshot(name: string, labels: Record<string, string>, userCreated: boolean): Promise<void> {
    await this.#enter();
    for (const r of this.#rw()) {
      if (r.layers.some((l) => l.name === name && !l.removed)) throw nativeError('ALREADY_EXISTS', `snapshot ${name} exists`);
      const head = r.layers.find((l) => l.head)!;
      const id = `L${String(r.nextLayer++).padStart(6, '0')}`;
      // The old head becomes the snapshot; a new head sits on it.
      head.head = false;
      head.name = name;
      head.labels = { ...labels };
      head.userCreated = userCreated;
      head.createdMs = Date.now();
      r.layers.push({ ...head, id, parent: head.id, name: '', head: true, labels: {}, file: `layer-${id}.img`, allocatedBytes: 0 });
    }
  }

  async listSnapshots(): Promise<NativeLayerInfo[]> {
    await this.#enter();
    return this.#rw()[0]!.layers.map((l) => ({ ...l, labels: { ...l.labels } }));
  }

  async deleteSnapshot(name: string): Promise<void> {
    await this.#enter();
    for (const r of this.#rw()) {
      const l = r.layers.find((x) => x.name === name && !x.removed && !x.head);
      if (!l) throw nativeError('NOT_FOUND', `snapshot ${name} not found`);
      l.removed = true;
    }
  }

  async revert(name: string): Promise<void> {
    await this.#enter();
    for (const r of this.#rw()) {
      if (!r.layers.some((x) => x.name === name && !x.removed && !x.head)) throw nativeError('NOT_FOUND', `snapshot ${name} not found`);
    }
    this.addon.reverts.push(name);
  }

  async exportNbd(options: NativeNbdOptions): Promise<NativeNbdServer> {
    await this.#enter();
    if (this.addon.busyAddresses.has(options.unixPath ?? `${options.tcpHost}:${options.tcpPort}`)) {
      throw nativeError('ADDRESS_IN_USE', 'address in use', 98);
    }
    const s = new FakeNbdServer(options);
    this.servers.push(s);
    return s;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.addon.events.push('engine-close');
    if (this.servers.some((s) => !s.closed)) throw new Error('fake: engine closed before its NBD servers');
    this.closed = true;
    for (const r of this.#rw()) r.clean = true;
  }

  /** Simulates an I/O failure on one replica: ERR, epoch bump on the others, event. */
  failReplica(dir: string, errno = 5): void {
    this.modes.set(dir, 'ERR');
    this.lastErrors.set(dir, -errno);
    this.#epoch++;
    for (const r of this.#rw()) r.epoch = this.#epoch;
    this.onEvents?.([
      { type: 'replica-error', replicaId: dir, errno: -errno, message: `I/O error on ${dir}` },
      { type: 'epoch-claimed', epoch: this.#epoch },
    ]);
  }
}

export class FakeAddon implements NativeAddon {
  readonly version = '0.1.0';
  /** sanlock as on a host without the library (test/unit/fakes/fake-sanlock.ts). */
  readonly sanlock = fakeSanlock();
  readonly engines: FakeEngine[] = [];
  readonly reverts: string[] = [];
  readonly events: string[] = [];
  readonly busyAddresses = new Set<string>();
  readonly #replicas = new Map<string, FakeReplica>();
  /** Fail createReplica for directories whose name matches. */
  failCreate: RegExp | undefined;

  replica(dir: string): FakeReplica {
    const r = this.#replicas.get(dir);
    if (!r) throw nativeError('NOT_FOUND', `no replica at ${dir}`, 2);
    return r;
  }

  /** Resolves on a later turn of the event loop, like a native completion. */
  tick(): Promise<void> {
    return new Promise((res) => setImmediate(res));
  }

  async createReplica(dir: string, sizeBytes: number): Promise<void> {
    await this.tick();
    if (this.failCreate?.test(dir)) throw nativeError('NO_SPACE', `no space for ${dir}`, 28);
    if (existsSync(dir) && readdirSync(dir).length > 0) throw nativeError('ALREADY_EXISTS', `${dir} not empty`, 17);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'replica.json'), '{"fake":true}\n');
    const now = Date.now();
    this.#replicas.set(dir, {
      dir,
      sizeBytes,
      data: Buffer.alloc(sizeBytes),
      epoch: 0,
      clean: true,
      nextLayer: 1,
      layers: [
        {
          id: 'L000000',
          file: 'layer-L000000.img',
          parent: '',
          name: '',
          head: true,
          removed: false,
          userCreated: true,
          createdMs: now,
          labels: {},
          sizeBytes,
          allocatedBytes: 0,
        },
      ],
    });
  }

  async openEngine(options: NativeEngineOptions): Promise<NativeEngine> {
    await this.tick();
    for (const d of options.replicas) this.replica(d);
    const e = new FakeEngine(this, options.replicas, options.onEvents);
    this.engines.push(e);
    return e;
  }

  async openReplica(dir: string): Promise<NativeReplica> {
    await this.tick();
    this.replica(dir);
    throw nativeError('UNSUPPORTED', 'fake addon: openReplica is not modelled');
  }

  /** The most recently opened engine. */
  get engine(): FakeEngine {
    const e = this.engines[this.engines.length - 1];
    if (!e) throw new Error('fake: no engine opened');
    return e;
  }
}
