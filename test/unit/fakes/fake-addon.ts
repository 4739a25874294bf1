// An in-memory NativeAddon for unit tests of the control plane. It keeps replica state in
// memory (keyed by directory) but creates the directories on disk, so Volume's file
// handling runs for real. Knobs let tests hold calls in flight and inject replica failures.
// Replica servers and remote endpoints are modelled too: a remote endpoint reaches the
// replica `name` under the root of the (running) fake replica server on its port, so two
// fake data engines in one test share replicas the way real hosts do over TCP.
import { mkdirSync, readdirSync, writeFileSync, existsSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';

import type {
  NativeReplicaBackingImage,
  NativeReplicaCreateOptions,
  NativeAddon,
  NativeEngine,
  NativeEngineEvent,
  NativeEngineOptions,
  NativeExtent,
  NativeHandOver,
  NativeImage,
  NativeLayerInfo,
  NativeNbdOptions,
  NativeNbdServer,
  NativeNbdStats,
  NativeRebuildResult,
  NativeRemoteReplica,
  NativeReplica,
  NativeReplicaEndpoint,
  NativeReplicaInfo,
  NativeReplicaMode,
  NativeReplicaServer,
  NativeReplicaSet,
  NativeReplicaServerGoAway,
  NativeReplicaServerOptions,
  NativeReplicaServerStats,
  NativeReplicaState,
  NativeSnapshotCopyResult,
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
  /** The volume's content when each snapshot was taken, by layer id (exportSnapshot, copySnapshotTo). */
  frozen?: Map<string, Buffer>;
  /** Recorded only (its data is not modelled). */
  backingImage?: NativeReplicaBackingImage;
  /** The replica set last stored on it (docs/single-writer.md), null for none. */
  replicaSet?: NativeReplicaSet | null;
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

/** Whether replica set a is newer than b (by epoch, then generation). */
function newer(a: NativeReplicaSet, b: NativeReplicaSet): boolean {
  return a.epoch !== b.epoch ? a.epoch > b.epoch : a.generation > b.generation;
}

/** The native id of an endpoint: the directory, or host:port/name. */
export function endpointId(ep: NativeReplicaEndpoint): string {
  return typeof ep === 'string' ? ep : `${ep.host}:${ep.port}/${ep.name}`;
}

export class FakeEngine implements NativeEngine {
  sizeBytes: number;
  closed = false;
  /** While set, data-path calls wait for it (to hold calls in flight). */
  gate: Promise<void> | undefined;
  readonly servers: FakeNbdServer[] = [];
  /** Native ids of the replicas (directories, or host:port/name), in slot order. */
  readonly replicaDirs: string[];
  /** Directory behind each id (undefined while an offline remote replica cannot be reached). */
  readonly dirOf = new Map<string, string | undefined>();
  readonly modes = new Map<string, NativeReplicaMode>();
  readonly lastErrors = new Map<string, number>();
  /** addReplica calls, in order (native ids). */
  readonly rebuilds: string[] = [];
  #rebuilding: { id: string; aborted: boolean; abort: () => void } | undefined;
  #epoch: number;
  /** Member name of each native id (options.members, by position; the id itself otherwise). */
  readonly memberOf = new Map<string, string>();
  #generation = 0;
  /** Serves nothing: opened as a standby, or after deactivate() (engine.h). */
  #standby: boolean;

  constructor(
    readonly addon: FakeAddon,
    endpoints: NativeReplicaEndpoint[],
    readonly onEvents: ((events: NativeEngineEvent[]) => void) | undefined,
    standby = false,
    epoch?: number,
    members?: string[],
  ) {
    this.replicaDirs = endpoints.map(endpointId);
    this.replicaDirs.forEach((id, i) => this.memberOf.set(id, members?.[i] ?? id));
    for (const ep of endpoints) this.dirOf.set(endpointId(ep), addon.resolve(ep));
    const reachable = this.replicaDirs.filter((id) => this.dirOf.get(id) !== undefined);
    if (reachable.length === 0) throw nativeError('NO_HEALTHY_REPLICA', 'no replica can be reached');
    const reps = reachable.map((id) => addon.replica(this.dirOf.get(id)!));
    this.sizeBytes = reps[0]!.sizeBytes;
    this.#standby = standby;
    if (standby) {
      // Claims nothing, marks nothing: only an unreachable replica is ERR.
      this.#epoch = 0;
      for (const id of this.replicaDirs) {
        const reachableNow = this.dirOf.get(id) !== undefined;
        this.modes.set(id, reachableNow ? 'RW' : 'ERR');
        if (!reachableNow) this.lastErrors.set(id, -107);
      }
      return;
    }
    // As engine.h Start (docs/single-writer.md): claim the given epoch on every reachable
    // replica, take the latest replica set, need a majority of its members, serve from its
    // RW members, commit the first set of this epoch.
    if (epoch === undefined || !(epoch > 0)) throw nativeError('INVALID_ARGUMENT', 'an engine needs an allocated epoch', 22);
    const maxEpoch = Math.max(...reps.map((r) => r.epoch));
    if (epoch <= maxEpoch) throw nativeError('STALE_EPOCH', `epoch ${epoch} is not above the replicas' ${maxEpoch}`, 116);
    let latest: NativeReplicaSet | null = null;
    for (const r of reps) if (r.replicaSet && (!latest || newer(r.replicaSet, latest))) latest = r.replicaSet;
    const reachableMembers = reachable.map((id) => this.memberOf.get(id)!);
    latest ??= {
      epoch: 0,
      generation: 0,
      members: this.replicaDirs.map((id) => this.memberOf.get(id)!),
      rw: reachable.filter((id) => addon.replica(this.dirOf.get(id)!).epoch === maxEpoch).map((id) => this.memberOf.get(id)!),
    };
    if (latest.members.filter((m) => reachableMembers.includes(m)).length * 2 <= latest.members.length) {
      throw nativeError('NO_QUORUM', 'a majority of the replicas cannot be claimed', 121);
    }
    this.#epoch = epoch;
    for (const id of this.replicaDirs) {
      const dir = this.dirOf.get(id);
      if (dir === undefined) {
        // A remote replica that cannot be reached opens as ERR (ENOTCONN).
        this.modes.set(id, 'ERR');
        this.lastErrors.set(id, -107);
        continue;
      }
      const r = addon.replica(dir);
      r.epoch = epoch;
      // Not RW in the latest replica set: it may lack acknowledged writes.
      this.modes.set(id, latest.rw.includes(this.memberOf.get(id)!) ? 'RW' : 'ERR');
      if (this.modes.get(id) === 'RW') r.clean = false;
    }
    if (this.#rw().length === 0) throw nativeError('NO_HEALTHY_REPLICA', 'no replica of the latest replica set can be used');
    this.onEvents?.([{ type: 'epoch-claimed', epoch: this.#epoch }, this.#commit(1)]);
  }

  /** Stores the replica set (members: every slot; rw: the RW ones) on every reachable replica. */
  #commit(generation: number): NativeEngineEvent {
    this.#generation = generation;
    const set: NativeReplicaSet = {
      epoch: this.#epoch,
      generation,
      members: this.replicaDirs.filter((d) => this.modes.get(d) !== 'WO').map((d) => this.memberOf.get(d)!),
      rw: this.replicaDirs.filter((d) => this.modes.get(d) === 'RW').map((d) => this.memberOf.get(d)!),
    };
    for (const d of this.replicaDirs) {
      const dir = this.dirOf.get(d);
      if (dir !== undefined && this.modes.get(d) !== 'ERR') this.addon.replica(dir).replicaSet = set;
    }
    return { type: 'replica-set-changed', epoch: set.epoch, generation, rwMembers: [...set.rw] };
  }

  #rw(): FakeReplica[] {
    return this.replicaDirs.filter((d) => this.modes.get(d) === 'RW').map((d) => this.addon.replica(this.dirOf.get(d)!));
  }

  /** Directories this engine holds open (for inspectReplica's user count). */
  openDirs(): string[] {
    if (this.closed) return [];
    return this.replicaDirs.filter((id) => this.modes.get(id) !== 'ERR').map((id) => this.dirOf.get(id)!);
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

  standby(): boolean {
    return this.#standby;
  }

  #refuseStandby(what: string): void {
    if (this.#standby) throw nativeError('INVALID_STATE', `engine ${what}: the engine is a standby`, 1);
  }

  /** As engine.h Deactivate: a rebuild is stopped (its target ERR), the RW replicas handed over. */
  async deactivate(): Promise<NativeHandOver> {
    await this.addon.tick();
    if (this.closed) throw nativeError('CLOSED', 'engine closed');
    if (this.#standby) throw nativeError('INVALID_STATE', 'engine is a standby already', 1);
    if (this.#rw().some((r) => r.epoch > this.#epoch)) throw nativeError('STALE_EPOCH', 'engine was fenced', 116);
    if (this.#rebuilding) this.#rebuilding.abort();
    for (const [id, mode] of this.modes) {
      if (mode !== 'WO') continue;
      this.modes.set(id, 'ERR');
      this.lastErrors.set(id, -1);
    }
    this.#standby = true;
    return { epoch: this.#epoch, generation: this.#generation, rwReplicaIds: this.replicaDirs.filter((d) => this.modes.get(d) === 'RW') };
  }

  /** As engine.h Activate: claims `epoch` on the replicas, the hand-over's RW ones stay RW, the others ERR. */
  async activate(h: NativeHandOver, epoch: number): Promise<void> {
    await this.addon.tick();
    if (this.closed) throw nativeError('CLOSED', 'engine closed');
    if (!this.#standby) throw nativeError('INVALID_STATE', 'engine is active already');
    const ids = new Set(h.rwReplicaIds);
    const candidates = this.replicaDirs.filter((d) => ids.has(d) && this.modes.get(d) !== 'ERR' && this.dirOf.get(d) !== undefined);
    if (candidates.length === 0) throw nativeError('NO_HEALTHY_REPLICA', 'none of the hand-over replicas can be used');
    const reachable = this.replicaDirs.filter((d) => this.dirOf.get(d) !== undefined);
    if (!(epoch > h.epoch)) throw nativeError('INVALID_ARGUMENT', 'the activation epoch must be above the hand-over\'s', 22);
    if (reachable.some((d) => this.addon.replica(this.dirOf.get(d)!).epoch > h.epoch)) {
      throw nativeError('STALE_EPOCH', 'a replica is past the hand-over epoch', 116);
    }
    this.#epoch = epoch;
    const events: NativeEngineEvent[] = [];
    for (const d of this.replicaDirs) {
      if (candidates.includes(d)) {
        const r = this.addon.replica(this.dirOf.get(d)!);
        r.epoch = this.#epoch;
        r.clean = false;
      } else if (this.modes.get(d) !== 'ERR') {
        this.modes.set(d, 'ERR');
        this.lastErrors.set(d, -5);
        events.push({ type: 'replica-error', replicaId: d, errno: -5, message: `${d} was not RW in the hand-over` });
      }
    }
    this.#standby = false;
    events.push({ type: 'epoch-claimed', epoch: this.#epoch }, this.#commit(1));
    this.onEvents?.(events);
  }

  replicas(): NativeReplicaState[] {
    return this.replicaDirs.map((d) => {
      const dir = this.dirOf.get(d);
      const r = dir === undefined ? undefined : this.addon.replica(dir);
      return {
        id: d,
        mode: this.modes.get(d)!,
        epoch: r?.epoch ?? 0,
        allocatedBytes: r ? r.data.reduce((n, b) => n + (b !== 0 ? 1 : 0), 0) : 0,
        lastError: this.lastErrors.get(d) ?? 0,
      };
    });
  }

  async read(offset: number, length: number): Promise<Buffer> {
    await this.#enter();
    this.#refuseStandby('read');
    return Buffer.from(this.#rw()[0]!.data.subarray(offset, offset + length));
  }

  async write(offset: number, data: Uint8Array, _fua?: boolean): Promise<void> {
    await this.#enter();
    this.#refuseStandby('write');
    for (const r of this.#rw()) Buffer.from(data).copy(r.data, offset);
  }

  async flush(): Promise<void> {
    await this.#enter();
    this.#refuseStandby('flush');
  }

  async trim(offset: number, length: number): Promise<void> {
    await this.#enter();
    this.#refuseStandby('trim');
    for (const r of this.#rw()) r.data.fill(0, offset, offset + length);
  }

  async writeZeroes(offset: number, length: number, _options?: NativeWriteZeroesOptions): Promise<void> {
    await this.#enter();
    this.#refuseStandby('writeZeroes');
    for (const r of this.#rw()) r.data.fill(0, offset, offset + length);
  }

  async blockStatus(offset: number, length: number): Promise<NativeExtent[]> {
    await this.#enter();
    this.#refuseStandby('blockStatus');
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
    this.#refuseStandby('snapshot');
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
      (r.frozen ??= new Map()).set(head.id, Buffer.from(r.data));
      r.layers.push({ ...head, id, parent: head.id, name: '', head: true, labels: {}, file: `layer-${id}.img`, allocatedBytes: 0 });
    }
  }

  async listSnapshots(name?: string): Promise<NativeLayerInfo[]> {
    await this.#enter();
    const all = this.#rw()[0]!.layers.map((l) => ({ ...l, labels: { ...l.labels } }));
    if (name === undefined) return all;
    // As the addon: the snapshot's layer and its ancestors up to its nearest visible one.
    const visible = (l: NativeLayerInfo): boolean => !l.head && !l.removed;
    let cur = all.find((l) => visible(l) && l.name === name);
    const out: NativeLayerInfo[] = [];
    for (let hops = 0; cur && hops <= all.length; hops++) {
      out.unshift(cur);
      if (hops > 0 && visible(cur)) break;
      const parent: string = cur.parent;
      cur = all.find((l) => l.id === parent);
    }
    return out;
  }

  async resize(sizeBytes: number): Promise<void> {
    await this.#enter();
    this.#refuseStandby('resize');
    if (sizeBytes % 4096 !== 0 || sizeBytes < this.sizeBytes) throw nativeError('INVALID_ARGUMENT', `cannot resize ${this.sizeBytes} bytes to ${sizeBytes}`, 22);
    if (this.#rebuilding) throw nativeError('BUSY', 'a replica is being rebuilt', 16);
    for (const r of this.#rw()) {
      r.data = Buffer.concat([r.data, Buffer.alloc(sizeBytes - r.data.length)]);
      r.sizeBytes = sizeBytes;
    }
    this.sizeBytes = sizeBytes;
  }

  async deleteSnapshot(name: string): Promise<void> {
    await this.#enter();
    this.#refuseStandby('deleteSnapshot');
    for (const r of this.#rw()) {
      const l = r.layers.find((x) => x.name === name && !x.removed && !x.head);
      if (!l) throw nativeError('NOT_FOUND', `snapshot ${name} not found`);
      l.removed = true;
    }
  }

  async revert(name: string): Promise<void> {
    await this.#enter();
    this.#refuseStandby('revert');
    for (const r of this.#rw()) {
      if (!r.layers.some((x) => x.name === name && !x.removed && !x.head)) throw nativeError('NOT_FOUND', `snapshot ${name} not found`);
    }
    // The content becomes the snapshot's again, as a new head on it does natively.
    for (const r of this.#rw()) {
      const l = r.layers.find((x) => x.name === name && !x.removed && !x.head)!;
      r.frozen?.get(l.id)?.copy(r.data);
    }
    this.addon.reverts.push(name);
  }

  /** The content of a live snapshot, as frozen when it was taken (NOT_FOUND otherwise). */
  #frozen(name: string): Buffer {
    const r = this.#rw()[0]!;
    const l = r.layers.find((x) => x.name === name && !x.removed && !x.head);
    const data = l ? r.frozen?.get(l.id) : undefined;
    if (!data) throw nativeError('NOT_FOUND', `no snapshot '${name}'`);
    return data;
  }

  /** Writes the frozen content to a new file (flag wx: ALREADY_EXISTS if it exists). */
  async exportSnapshot(name: string, path: string): Promise<NativeSnapshotCopyResult> {
    await this.#enter();
    if (!isAbsolute(path)) throw nativeError('INVALID_ARGUMENT', 'path must be an absolute path');
    const data = this.#frozen(name);
    try {
      writeFileSync(path, data, { flag: 'wx', mode: 0o600 });
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'EEXIST') throw nativeError('ALREADY_EXISTS', `${path} exists already`, 17);
      if (code === 'ENOENT') throw nativeError('INVALID_ARGUMENT', `the directory of ${path} does not exist`, 2);
      throw err;
    }
    return { sizeBytes: this.sizeBytes, copiedBytes: data.reduce((n, b) => n + (b !== 0 ? 1 : 0), 0), durationMs: 0 };
  }

  /** Copies the frozen content into every RW replica of another fake engine. */
  async copySnapshotTo(name: string, target: NativeEngine): Promise<NativeSnapshotCopyResult> {
    await this.#enter();
    if (!(target instanceof FakeEngine) || target === this) throw nativeError('INVALID_ARGUMENT', 'target must be another engine');
    if (target.closed) throw nativeError('CLOSED', 'the target engine is closed');
    if (target.sizeBytes !== this.sizeBytes) throw nativeError('INVALID_ARGUMENT', 'sizes differ');
    const data = this.#frozen(name);
    await target.write(0, data);
    return { sizeBytes: this.sizeBytes, copiedBytes: data.reduce((n, b) => n + (b !== 0 ? 1 : 0), 0), durationMs: 0 };
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
    if (this.#rebuilding) this.#rebuilding.abort();
    this.addon.events.push('engine-close');
    if (this.servers.some((s) => !s.closed)) throw new Error('fake: engine closed before its NBD servers');
    this.closed = true;
    // A standby wrote nothing; another engine may own the replicas.
    if (!this.#standby) for (const r of this.#rw()) r.clean = true;
  }

  /**
   * Rebuild as engine.h describes it: the target goes WO (rebuild-started), waits for
   * `addon.rebuildGate` if set, gets the first RW replica's data, goes RW
   * (rebuild-progress, rebuild-completed). An unreachable target fails with UNAVAILABLE
   * and is left ERR in its slot.
   */
  async addReplica(endpoint: NativeReplicaEndpoint, member: string): Promise<NativeRebuildResult> {
    await this.addon.tick();
    if (this.closed) throw nativeError('CLOSED', 'engine closed');
    this.#refuseStandby('addReplica');
    const id = endpointId(endpoint);
    this.rebuilds.push(id);
    if (this.#rebuilding) throw nativeError('BUSY', `a rebuild of ${this.#rebuilding.id} runs already`);
    const mode = this.modes.get(id);
    if (mode === 'RW' || mode === 'WO') throw nativeError('INVALID_STATE', `${id} is ${mode} already`);
    const source = this.#rw()[0];
    if (!source) throw nativeError('INVALID_STATE', 'no RW replica to rebuild from');
    if (!this.replicaDirs.includes(id)) this.replicaDirs.push(id);
    if (!this.memberOf.has(id)) this.memberOf.set(id, member);
    const dir = this.addon.resolve(endpoint);
    this.dirOf.set(id, dir);
    const figures = { replicaId: id, sentBytes: 0, scannedBytes: 0, totalBytes: source.sizeBytes };
    if (dir === undefined || this.addon.failRebuild?.test(id)) {
      this.modes.set(id, 'ERR');
      this.lastErrors.set(id, -107);
      this.onEvents?.([{ type: 'rebuild-failed', ...figures, errno: -107, message: `${id} cannot be reached` }]);
      throw nativeError('UNAVAILABLE', `replica ${id} cannot be reached`, 107);
    }
    const target = this.addon.replica(dir);
    this.modes.set(id, 'WO');
    let abort!: () => void;
    const aborted = new Promise<void>((res) => (abort = res));
    const run = {
      id,
      aborted: false,
      abort: () => {
        run.aborted = true;
        abort();
      },
    };
    this.#rebuilding = run;
    try {
      this.onEvents?.([{ type: 'rebuild-started', ...figures }]);
      this.addon.rebuildsRunning++;
      this.addon.rebuildsRunningMax = Math.max(this.addon.rebuildsRunningMax, this.addon.rebuildsRunning);
      try {
        // Removing the target or closing the engine aborts the copy, gate or not.
        if (this.addon.rebuildGate) await Promise.race([this.addon.rebuildGate, aborted]);
        await this.addon.tick();
      } finally {
        this.addon.rebuildsRunning--;
      }
      if (run.aborted || this.closed) {
        this.onEvents?.([{ type: 'rebuild-failed', ...figures, errno: -125, message: `rebuild of ${id} aborted` }]);
        throw nativeError('CLOSED', `rebuild of ${id} aborted`, 125);
      }
      let sent = 0;
      for (let i = 0; i < source.data.length; i++) if (source.data[i] !== target.data[i]) sent++;
      source.data.copy(target.data);
      target.epoch = this.#epoch;
      target.clean = false;
      this.modes.set(id, 'RW');
      this.lastErrors.delete(id);
      const done = { ...figures, sentBytes: sent, scannedBytes: source.sizeBytes };
      this.onEvents?.([this.#commit(this.#generation + 1), { type: 'rebuild-progress', ...done }, { type: 'rebuild-completed', ...done }]);
      return { scannedBytes: source.sizeBytes, sentBytes: sent, unmappedBytes: 0, durationMs: 1 };
    } finally {
      this.#rebuilding = undefined;
    }
  }

  async removeReplica(id: string, allowRw = false): Promise<void> {
    await this.addon.tick();
    const mode = this.modes.get(id);
    if (mode === undefined) throw nativeError('NOT_FOUND', `no replica ${id}`);
    if (mode === 'RW' && (!allowRw || [...this.modes.values()].filter((m) => m === 'RW').length < 2)) throw nativeError('INVALID_STATE', `${id} is RW`);
    if (this.#rebuilding?.id === id) this.#rebuilding.abort();
    this.replicaDirs.splice(this.replicaDirs.indexOf(id), 1);
    this.modes.delete(id);
    this.dirOf.delete(id);
  }

  /** Simulates an I/O failure on one replica: ERR, a replica set without it committed, events. */
  failReplica(dir: string, errno = 5): void {
    this.modes.set(dir, 'ERR');
    this.lastErrors.set(dir, -errno);
    const committed = this.#commit(this.#generation + 1);
    this.onEvents?.([{ type: 'replica-error', replicaId: dir, errno: -errno, message: `I/O error on ${dir}` }, committed]);
  }
}

export class FakeReplicaServer implements NativeReplicaServer {
  closed = false;
  constructor(
    readonly addon: FakeAddon,
    readonly options: NativeReplicaServerOptions,
    readonly port: number,
  ) {}
  stats(): NativeReplicaServerStats {
    return { connectionsTotal: 0, connectionsOpen: 0, requests: 0, staleEpochRefusals: 0, protocolErrors: 0, authFailures: 0, connectionsRefused: 0, handshakesDropped: 0, bytesRead: 0, bytesWritten: 0, inlineWrites: 0, inlineReads: 0, bufferBytes: 0, bufferBytesPeak: 0, bufferWaits: 0, spareBufferBytes: 0, spareBufferHits: 0 };
  }
  async close(): Promise<void> {
    this.closed = true;
    if (this.addon.replicaServers.get(this.port) === this) this.addon.replicaServers.delete(this.port);
  }
  /** No connections in the fake: nothing to hand over. */
  async goAway(_timeoutMs: number): Promise<NativeReplicaServerGoAway> {
    return { goaway: 0, timedOut: 0, closed: 0 };
  }
}

export class FakeAddon implements NativeAddon {
  readonly version = '0.1.0';
  /** Running replica servers by port. */
  readonly replicaServers = new Map<number, FakeReplicaServer>();
  /** While set, rebuilds wait for it after going WO. */
  rebuildGate: Promise<void> | undefined;
  /** Rebuilds of native ids that match fail as if the target could not be reached. */
  failRebuild: RegExp | undefined;
  /** Rebuilds running now, and the most that ever ran at once. */
  rebuildsRunning = 0;
  rebuildsRunningMax = 0;
  /** Extra users per directory (e.g. a replica served to an engine elsewhere). */
  readonly extraUsers = new Map<string, number>();
  #nextPort = 45_000;
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

  /** The directory an endpoint reaches, or undefined when its replica server is not running. */
  resolve(ep: NativeReplicaEndpoint): string | undefined {
    if (typeof ep === 'string') return ep;
    const server = this.replicaServers.get((ep as NativeRemoteReplica).port);
    if (!server) return undefined;
    const dir = join(server.options.root, ep.name);
    return this.#replicas.has(dir) ? dir : undefined;
  }

  /** Resolves on a later turn of the event loop, like a native completion. */
  tick(): Promise<void> {
    return new Promise((res) => setImmediate(res));
  }

  async createReplica(dir: string, sizeBytes: number, options?: NativeReplicaCreateOptions): Promise<void> {
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
      ...(options?.backingImage ? { backingImage: { ...options.backingImage } } : {}),
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
    for (const r of options.replicas) if (typeof r === 'string') this.replica(r);
    const e = new FakeEngine(this, options.replicas, options.onEvents, options.standby === true, options.epoch, options.members);
    this.engines.push(e);
    return e;
  }

  // Only what read-only inspection uses (metadata and layers); the data path is not modelled.
  async openReplica(dir: string): Promise<NativeReplica> {
    await this.tick();
    const r = this.replica(dir);
    if (this.engines.some((e) => !e.closed && e.openDirs().includes(dir))) throw nativeError('BUSY', `replica ${dir} is open`, 16);
    this.replicasOpened.push(dir);
    const unsupported = (): Promise<never> => Promise.reject(nativeError('UNSUPPORTED', 'fake addon: a directly opened replica only lists its layers'));
    return {
      id: dir,
      sizeBytes: r.sizeBytes,
      epoch: () => r.epoch,
      clean: () => r.clean,
      claimEpoch: unsupported,
      setReplicaSet: unsupported,
      lastRw: unsupported,
      grow: unsupported,
      read: unsupported,
      write: unsupported,
      flush: unsupported,
      blockStatus: unsupported,
      listLayers: async () => r.layers.map((l) => ({ ...l, labels: { ...l.labels } })),
      layerExtents: unsupported,
      allocatedBytes: async () => r.data.reduce((n, b) => n + (b !== 0 ? 1 : 0), 0),
      close: async () => undefined,
    };
  }

  /** Directories opened with openReplica, in order. */
  readonly replicasOpened: string[] = [];

  async inspectReplica(dir: string): Promise<NativeReplicaInfo> {
    await this.tick();
    const r = this.replica(dir);
    const users = this.engines.reduce((n, e) => n + e.openDirs().filter((d) => d === dir).length, 0) + (this.extraUsers.get(dir) ?? 0);
    return { sizeBytes: r.sizeBytes, epoch: r.epoch, clean: r.clean, rebuilding: false, allocatedBytes: r.data.reduce((n, b) => n + (b !== 0 ? 1 : 0), 0), backingImage: r.backingImage ?? null, users };
  }

  async openImage(path: string): Promise<NativeImage> {
    await this.tick();
    throw nativeError('UNSUPPORTED', `fake addon: images are not modelled (${path})`);
  }

  async startReplicaServer(options: NativeReplicaServerOptions): Promise<NativeReplicaServer> {
    await this.tick();
    const port = options.port && options.port > 0 ? options.port : this.#nextPort++;
    if (this.replicaServers.has(port)) throw nativeError('ADDRESS_IN_USE', `port ${port} in use`, 98);
    const s = new FakeReplicaServer(this, options, port);
    this.replicaServers.set(port, s);
    return s;
  }

  /** Forgets a replica's data, as if its disk were replaced (directory kept). */
  wipe(dir: string): void {
    const r = this.replica(dir);
    r.data.fill(0);
    r.epoch = 0;
  }

  /** Removes the record of a replica whose directory was deleted. */
  forget(dir: string): void {
    this.#replicas.delete(dir);
  }

  /** The most recently opened engine. */
  get engine(): FakeEngine {
    const e = this.engines[this.engines.length - 1];
    if (!e) throw new Error('fake: no engine opened');
    return e;
  }
}
