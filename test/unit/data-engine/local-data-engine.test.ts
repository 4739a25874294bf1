// LocalDataEngine against the fake addon: directory ownership, replicas, engines, remote
// replicas through a second data engine's replica server, and self-repair.
import { mkdtemp, readFile, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import type { DataEngineEvent, EngineReplicaRef } from '../../../src/data-engine/data-engine.js';
import { LocalDataEngine, type LocalDataEngineOptions } from '../../../src/data-engine/local-data-engine.js';
import { REPLICA_RELEASE_WAIT_MS } from '../../../src/data-engine/replica-grow.js';
import { MooringError } from '../../../src/errors.js';
import { FakeAddon } from '../fakes/fake-addon.js';
import { codeOf } from '../../helpers/codes.js';

const MiB = 1024 * 1024;

/** Collects events and waits for one that matches. */
class EventLog {
  readonly events: DataEngineEvent[] = [];
  readonly #waiters: Array<{ match: (e: DataEngineEvent) => boolean; resolve: (e: DataEngineEvent) => void }> = [];
  constructor(de: LocalDataEngine) {
    de.watch((e) => {
      this.events.push(e);
      for (const w of [...this.#waiters]) {
        if (w.match(e)) {
          this.#waiters.splice(this.#waiters.indexOf(w), 1);
          w.resolve(e);
        }
      }
    });
  }
  /** The first event seen so far that matches, or the next one to arrive. */
  next(match: (e: DataEngineEvent) => boolean): Promise<DataEngineEvent> {
    const seen = this.events.find(match);
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve) => this.#waiters.push({ match, resolve }));
  }
  of(type: DataEngineEvent['type']): DataEngineEvent[] {
    return this.events.filter((e) => e.type === type);
  }
}

describe('LocalDataEngine', () => {
  let root: string;
  let addon: FakeAddon;
  const running: LocalDataEngine[] = [];

  async function start(hostId: string, extra: Partial<LocalDataEngineOptions> = {}): Promise<LocalDataEngine> {
    const de = await LocalDataEngine.start({ dir: join(root, hostId), hostId, addon, ...extra });
    running.push(de);
    return de;
  }

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-de-'));
    addon = new FakeAddon();
  });
  afterEach(async () => {
    await Promise.allSettled(running.splice(0).map((d) => d.close()));
    await rm(root, { recursive: true, force: true });
  });

  describe('its directory', () => {
    it('records its host id, locks the directory, and serves replicas on loopback by default', async () => {
      const de = await start('h1');
      const info = await de.info();
      expect(info).toMatchObject({ hostId: 'h1', dir: join(root, 'h1'), tls: false });
      expect(info.replicaAddress).toMatch(/^tcp:127\.0\.0\.1:\d+$/);
      const server = addon.replicaServers.get(Number(info.replicaAddress!.split(':')[2]));
      expect(server?.options).toMatchObject({ root: join(root, 'h1', 'replicas'), host: '127.0.0.1', port: 0 });
      expect((await readdir(join(root, 'h1'))).sort()).toEqual(['data-engine.json', 'data-engine.lock', 'replicas']);
      expect(JSON.parse(await readFile(join(root, 'h1', 'data-engine.json'), 'utf8'))).toMatchObject({ hostId: 'h1' });
      expect(await codeOf(LocalDataEngine.start({ dir: join(root, 'h1'), hostId: 'h1', addon }))).toBe('BUSY');
      await de.close();
      expect(server!.closed).toBe(true);
      // Another host id for the same directory is refused: others know its replicas as h1's.
      expect(await codeOf(LocalDataEngine.start({ dir: join(root, 'h1'), hostId: 'h2', addon }))).toBe('INVALID_ARGUMENT');
      const again = await start('h1', { replicaListen: null });
      expect((await again.info()).replicaAddress).toBeNull();
    });

    it('refuses a non-loopback replica server without TLS unless allowInsecureRemote', async () => {
      const err = await LocalDataEngine.start({ dir: join(root, 'x'), hostId: 'x', addon, replicaListen: 'tcp:0.0.0.0:0' }).catch((e: unknown) => e);
      expect((err as MooringError).code).toBe('INVALID_ARGUMENT');
      expect((err as MooringError).message).toMatch(/loopback/);
      const de = await start('x', { replicaListen: 'tcp:0.0.0.0:0', allowInsecureRemote: true });
      expect((await de.info()).replicaAddress).toMatch(/^tcp:0\.0\.0\.0:\d+$/);
    });

    it('refuses an NBD export on a non-loopback TCP address (NBD has no TLS here) unless allowInsecureRemote', async () => {
      const de = await start('h1', { replicaListen: null });
      await de.createReplica('r0', MiB);
      const replicas = [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }];
      for (const nbd of ['tcp:0.0.0.0:0', 'tcp:0:0', 'tcp:[::]:0', 'tcp:192.0.2.1:10809']) {
        const err = (await de.startEngine({ volume: 'v', replicas, nbd, epoch: 1 }).catch((e: unknown) => e)) as MooringError;
        expect(err.code, nbd).toBe('INVALID_ARGUMENT');
        expect(err.message).toMatch(/not a loopback address/);
      }
      // Refused before anything started: no engine, no export.
      expect(await de.listEngines()).toEqual([]);
      expect(addon.engines).toHaveLength(0);
      let epoch = 0;
      for (const nbd of ['tcp:127.0.0.1:0', 'tcp:localhost:0', 'tcp:[::1]:0']) {
        await de.startEngine({ volume: 'v', replicas, nbd, epoch: ++epoch });
        await de.stopEngine('v');
      }
      const open = await start('h2', { replicaListen: null, allowInsecureRemote: true });
      await open.createReplica('r0', MiB);
      const info = await open.startEngine({ volume: 'v', replicas: [{ ...replicas[0]!, hostId: 'h2' }], nbd: 'tcp:0.0.0.0:0', epoch: 1 });
      expect(info.nbd?.address).toMatch(/^tcp:0\.0\.0\.0:\d+$/);
    });

    it('checks its options', async () => {
      const bad: Array<Partial<LocalDataEngineOptions>> = [
        { hostId: '../x' },
        { replicaListen: 'unix:/tmp/x' },
        { replicaListen: 'tcp:127.0.0.1:70000' },
        { maxConcurrentRebuilds: 0 },
        { maxConcurrentRebuilds: 65 },
        { maxConcurrentSnapshotCopies: 0 },
        { maxConcurrentSnapshotCopies: 17 },
        { repair: { firstRetryMs: 5 } },
        { repair: { firstRetryMs: 2000, maxRetryMs: 1000 } },
        { tls: { cert: 'x', key: 'y', ca: 'z' } },
      ];
      for (const b of bad) {
        expect(await codeOf(LocalDataEngine.start({ dir: join(root, 'o'), hostId: 'o', addon, ...b })), JSON.stringify(b)).toBe('INVALID_ARGUMENT');
      }
    });
  });

  describe('replicas', () => {
    it('creates, lists and deletes replicas under DIR/replicas', async () => {
      const de = await start('h1', { replicaListen: null });
      const created = await de.createReplica('vol-a-r0', MiB);
      expect(created).toEqual({ name: 'vol-a-r0', sizeBytes: MiB, epoch: 0, clean: true, rebuilding: false, allocatedBytes: 0, inUse: false, backingImage: null });
      await de.createReplica('vol-b-r0', 2 * MiB);
      expect(await codeOf(de.createReplica('vol-a-r0', MiB))).toBe('ALREADY_EXISTS');
      expect((await de.listReplicas()).map((r) => [r.name, r.sizeBytes])).toEqual([
        ['vol-a-r0', MiB],
        ['vol-b-r0', 2 * MiB],
      ]);
      await de.deleteReplica('vol-a-r0');
      expect(await readdir(join(root, 'h1', 'replicas'))).toEqual(['vol-b-r0']);
      expect(await codeOf(de.deleteReplica('vol-a-r0'))).toBe('NOT_FOUND');
      for (const name of ['', '..', 'a/b', 'x'.repeat(64)]) expect(await codeOf(de.createReplica(name, MiB))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(de.createReplica('odd', 1000))).toBe('INVALID_ARGUMENT');
    });

    it('leaves nothing behind when creating fails', async () => {
      const de = await start('h1', { replicaListen: null });
      addon.failCreate = /full/;
      expect(await codeOf(de.createReplica('full', MiB))).toBe('NO_SPACE');
      expect(await readdir(join(root, 'h1', 'replicas'))).toEqual([]);
    });

    it('refuses to delete a replica in use: by an engine here, or served elsewhere', async () => {
      const de = await start('h1', { replicaListen: null });
      await de.createReplica('r0', MiB);
      await de.createReplica('r1', MiB);
      await de.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }], epoch: 1 });
      expect(await codeOf(de.deleteReplica('r0'))).toBe('BUSY');
      expect((await de.listReplicas()).find((r) => r.name === 'r0')!.inUse).toBe(true);
      addon.extraUsers.set(join(root, 'h1', 'replicas', 'r1'), 1);
      expect(await codeOf(de.deleteReplica('r1'))).toBe('BUSY');
      await de.stopEngine('v');
      await de.deleteReplica('r0');
    });

    it('deletes a replica the replica server lets go of within the release wait (an engine elsewhere just stopped)', async () => {
      const de = await start('h1', { replicaListen: null });
      await de.createReplica('r1', MiB);
      const path = join(root, 'h1', 'replicas', 'r1');
      addon.extraUsers.set(path, 1);
      const deleting = de.deleteReplica('r1');
      setTimeout(() => addon.extraUsers.delete(path), REPLICA_RELEASE_WAIT_MS / 4);
      await deleting;
      expect((await de.listReplicas()).map((r) => r.name)).toEqual([]);
    });
  });

  describe('engines', () => {
    it('starts an engine over local replicas with an NBD export, reports it, and stops it (drained, clean)', async () => {
      const de = await start('h1', { replicaListen: null });
      const log = new EventLog(de);
      await de.createReplica('r0', MiB);
      await de.createReplica('r1', MiB);
      const refs: EngineReplicaRef[] = [
        { id: 'r0', hostId: 'h1', name: 'r0', address: null },
        { id: 'r1', hostId: 'h1', name: 'r1', address: null },
      ];
      const nbd = `unix:${join(root, 'v.sock')}`;
      const info = await de.startEngine({ volume: 'v', replicas: refs, nbd, epoch: 1 });
      expect(info).toMatchObject({ volume: 'v', sizeBytes: MiB, epoch: 1, nbd: { address: nbd } });
      expect(info.replicas.map((r) => [r.id, r.mode, r.lastError])).toEqual([
        ['r0', 'RW', 0],
        ['r1', 'RW', 0],
      ]);
      expect(addon.engine.servers[0]!.options.unixPath).toBe(join(root, 'v.sock'));
      expect(await codeOf(de.startEngine({ volume: 'v', replicas: refs, epoch: 1 }))).toBe('ALREADY_EXISTS');
      expect(await codeOf(de.startEngine({ volume: 'w', replicas: [refs[0]!], epoch: 1 }))).toBe('BUSY');
      expect(await codeOf(de.startEngine({ volume: 'w', replicas: [{ id: 'r0', hostId: 'h1', name: 'nope', address: null }], epoch: 1 }))).toBe('NOT_FOUND');
      expect((await de.listEngines()).map((e) => e.volume)).toEqual(['v']);
      await de.stopEngine('v');
      expect(addon.engine.servers[0]!.closed).toBe(true);
      expect(addon.engine.closed).toBe(true);
      expect((await de.listReplicas()).every((r) => r.clean && !r.inUse)).toBe(true);
      expect(log.of('engine-stopped')).toEqual([{ type: 'engine-stopped', volume: 'v' }]);
      expect(log.of('epoch-claimed')).toEqual([{ type: 'epoch-claimed', volume: 'v', epoch: 1 }]);
      expect(await codeOf(de.engineInfo('v'))).toBe('NOT_FOUND');
      expect(await codeOf(de.stopEngine('v'))).toBe('NOT_FOUND');
    });

    it('checks start options', async () => {
      const de = await start('h1', { replicaListen: null });
      const ok = { id: 'r0', hostId: 'h1', name: 'r0', address: null };
      const bad: unknown[] = [
        { volume: '..', replicas: [ok], epoch: 1 },
        { volume: 'v', replicas: [], epoch: 1 },
        { volume: 'v', replicas: [ok, ok], epoch: 1 },
        { volume: 'v', replicas: [{ ...ok, id: 'r1', hostId: 'h2', address: null }], epoch: 1 },
        { volume: 'v', replicas: [{ ...ok, hostId: 'h2', address: 'tcp:127.0.0.1:0' }], epoch: 1 },
        { volume: 'v', replicas: [{ ...ok, hostId: 'h2', address: 12 }], epoch: 1 },
        { volume: 'v', replicas: [ok], ioTimeoutMs: 1, epoch: 1 },
        { volume: 'v', replicas: [ok], nbd: 7, epoch: 1 },
        // The epoch is the caller's to allocate: required, a positive safe integer; none for a standby.
        { volume: 'v', replicas: [ok] },
        ...[0, -1, 1.5, '2', null, Number.MAX_SAFE_INTEGER + 1, Number.NaN].map((epoch) => ({ volume: 'v', replicas: [ok], epoch })),
        { volume: 'v', replicas: [ok], standby: true, epoch: 3 },
        ...[-1, 600_001, 1.5, '100'].map((quorumHoldMs) => ({ volume: 'v', replicas: [ok], epoch: 1, quorumHoldMs })),
      ];
      for (const b of bad) expect(await codeOf(de.startEngine(b as never)), JSON.stringify(b)).toBe('INVALID_ARGUMENT');
      // Nothing was opened.
      expect(addon.engines).toEqual([]);
    });

    it('hands the engine the epoch and quorumHoldMs its caller gave, and forwards the replica sets it commits', async () => {
      const de = await start('h1', { replicaListen: null });
      const log = new EventLog(de);
      await de.createReplica('r0', MiB);
      await de.createReplica('r1', MiB);
      const given: unknown[] = [];
      const openEngine = addon.openEngine.bind(addon);
      addon.openEngine = async (options) => {
        given.push({ epoch: options.epoch, quorumHoldMs: options.quorumHoldMs, standby: options.standby, members: options.members });
        const e = await openEngine(options);
        // The fake, as the native engine, committed generation 1 at open; then one after a drop.
        options.onEvents?.([{ type: 'replica-set-changed', epoch: options.epoch ?? 0, generation: 2, rwMembers: ['r0'] }]);
        return e;
      };
      const refs: EngineReplicaRef[] = [
        { id: 'r0', hostId: 'h1', name: 'r0', address: null },
        { id: 'r1', hostId: 'h1', name: 'r1', address: null },
      ];
      await de.startEngine({ volume: 'v', replicas: refs, epoch: 17, quorumHoldMs: 0 });
      await de.stopEngine('v');
      await de.startEngine({ volume: 'v', replicas: refs, standby: true });
      expect(given).toEqual([
        { epoch: 17, quorumHoldMs: 0, standby: undefined, members: ['r0', 'r1'] },
        { epoch: undefined, quorumHoldMs: undefined, standby: true, members: ['r0', 'r1'] },
      ]);
      await log.next((e) => e.type === 'replica-set-changed' && e.generation === 2);
      expect(log.of('replica-set-changed').slice(0, 2)).toEqual([
        { type: 'replica-set-changed', volume: 'v', epoch: 17, generation: 1, rwReplicaIds: ['r0', 'r1'] },
        { type: 'replica-set-changed', volume: 'v', epoch: 17, generation: 2, rwReplicaIds: ['r0'] },
      ]);
    });

    it('close() stops every engine, then refuses calls with CLOSED', async () => {
      const de = await start('h1', { replicaListen: null });
      const log = new EventLog(de);
      await de.createReplica('r0', MiB);
      await de.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }], epoch: 1 });
      await de.close();
      await de.close();
      expect(addon.engine.closed).toBe(true);
      expect(log.of('engine-stopped')).toHaveLength(1);
      expect(await codeOf(de.listReplicas())).toBe('CLOSED');
      // The directory is free again.
      await start('h1', { replicaListen: null });
    });
  });

  describe('remote replicas and self-repair', () => {
    const repair = { firstRetryMs: 10, maxRetryMs: 40 };

    async function twoHosts(): Promise<{ a: LocalDataEngine; b: LocalDataEngine; refs: EngineReplicaRef[]; bPort: number }> {
      const a = await start('a', { repair });
      const b = await start('b', { repair });
      await a.createReplica('v-r0', MiB);
      await b.createReplica('v-r1', MiB);
      const bAddress = (await b.info()).replicaAddress!;
      return {
        a,
        b,
        bPort: Number(bAddress.split(':')[2]),
        refs: [
          { id: 'r0', hostId: 'a', name: 'v-r0', address: null },
          { id: 'r1', hostId: 'b', name: 'v-r1', address: bAddress },
        ],
      };
    }

    it('reaches a replica on another data engine through its replica server', async () => {
      const { a, refs, bPort } = await twoHosts();
      const info = await a.startEngine({ volume: 'v', replicas: refs, ioTimeoutMs: 2000, epoch: 1 });
      expect(info.replicas.map((r) => r.mode)).toEqual(['RW', 'RW']);
      expect(addon.engine.replicaDirs).toEqual([join(root, 'a', 'replicas', 'v-r0'), `127.0.0.1:${bPort}/v-r1`]);
      await addon.engine.write(0, Buffer.from('hello'));
      expect(addon.replica(join(root, 'b', 'replicas', 'v-r1')).data.subarray(0, 5).toString()).toBe('hello');
    });

    it('re-adds a replica that went ERR once its host is back, with growing back-off, without being asked', async () => {
      const { a, b, refs, bPort } = await twoHosts();
      const log = new EventLog(a);
      await a.startEngine({ volume: 'v', replicas: refs, epoch: 1 });
      // Host b goes away, and the engine's next I/O to its replica fails.
      await b.close();
      addon.engine.failReplica(`127.0.0.1:${bPort}/v-r1`, 107);
      await addon.engine.write(4096, Buffer.from('written while b was down'));
      // Attempts fail while b is down; the delays grow to the cap.
      await log.next((e) => e.type === 'repair-scheduled' && e.attempt === 4);
      const delays = log.of('repair-scheduled').map((e) => (e as { delayMs: number }).delayMs);
      expect(delays.slice(0, 4)).toEqual([10, 20, 40, 40]);
      expect(log.of('replica-error')).toHaveLength(1);
      expect((await a.engineInfo('v')).replicas[1]!.mode).toBe('ERR');
      // b comes back on the same address: the next attempt rebuilds the replica.
      const completed = log.next((e) => e.type === 'rebuild-completed');
      await start('b', { replicaListen: `tcp:127.0.0.1:${bPort}`, repair });
      expect(await completed).toMatchObject({ type: 'rebuild-completed', volume: 'v', replicaId: 'r1' });
      expect((await a.engineInfo('v')).replicas.map((r) => r.mode)).toEqual(['RW', 'RW']);
      expect(addon.replica(join(root, 'b', 'replicas', 'v-r1')).data.subarray(4096, 4096 + 24).toString()).toBe('written while b was down');
      expect(log.of('rebuild-started').length).toBeGreaterThanOrEqual(1);
    });

    it('starts with an unreachable replica as ERR and repairs it when its host starts', async () => {
      const { a, b, refs, bPort } = await twoHosts();
      // A third replica, so that the engine still reaches a majority without b.
      await a.createReplica('v-r2', MiB);
      const all = [...refs, { id: 'r2', hostId: 'a', name: 'v-r2', address: null }];
      await b.close();
      const log = new EventLog(a);
      const info = await a.startEngine({ volume: 'v', replicas: all, epoch: 1 });
      expect(info.replicas.map((r) => r.mode)).toEqual(['RW', 'ERR', 'RW']);
      await log.next((e) => e.type === 'repair-scheduled');
      const completed = log.next((e) => e.type === 'rebuild-completed');
      await start('b', { replicaListen: `tcp:127.0.0.1:${bPort}`, repair });
      await completed;
      expect((await a.engineInfo('v')).replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    });

    it('does not repair when repair is disabled', async () => {
      // Short delays, so that an enabled supervisor would have acted within the wait below.
      const a = await start('a', { repair: { enabled: false, firstRetryMs: 10, maxRetryMs: 10 } });
      const b = await start('b');
      await a.createReplica('v-r0', MiB);
      await a.createReplica('v-r2', MiB);
      await b.createReplica('v-r1', MiB);
      const address = (await b.info()).replicaAddress;
      await b.close();
      const log = new EventLog(a);
      await a.startEngine({
        volume: 'v',
        replicas: [{ id: 'r0', hostId: 'a', name: 'v-r0', address: null }, { id: 'r1', hostId: 'b', name: 'v-r1', address }, { id: 'r2', hostId: 'a', name: 'v-r2', address: null }],
        epoch: 1,
      });
      await new Promise((r) => setTimeout(r, 100));
      expect(log.of('repair-scheduled')).toEqual([]);
      expect(addon.engine.rebuilds).toEqual([]);
    });

    it('bounds rebuilds across engines by maxConcurrentRebuilds; the others wait their turn', async () => {
      const a = await start('a', { maxConcurrentRebuilds: 2, repair });
      const log = new EventLog(a);
      let open!: () => void;
      addon.rebuildGate = new Promise((r) => (open = r));
      const started: string[] = [];
      a.watch((e) => {
        if (e.type === 'rebuild-started') started.push(e.volume);
      });
      const adds: Array<Promise<unknown>> = [];
      for (const v of ['v1', 'v2', 'v3']) {
        await a.createReplica(`${v}-r0`, MiB);
        await a.createReplica(`${v}-r1`, MiB);
        await a.startEngine({ volume: v, replicas: [{ id: 'r0', hostId: 'a', name: `${v}-r0`, address: null }], epoch: 1 });
        const add = a.addReplica(v, { id: 'r1', hostId: 'a', name: `${v}-r1`, address: null });
        add.catch(() => undefined);
        adds.push(add);
      }
      await log.next(() => log.of('rebuild-started').length === 2);
      // Every addReplica has registered its replica (the third is queued, not running)...
      for (let i = 0; i < 1000; i++) {
        const infos = await a.listEngines();
        if (infos.every((e) => e.replicas.length === 2)) break;
        await new Promise((r) => setImmediate(r));
      }
      // ...and any third rebuild that would wrongly start has had time to get there.
      for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
      expect(addon.rebuildsRunning).toBe(2);
      expect(started).toHaveLength(2);
      const waiting = (await a.engineInfo(['v1', 'v2', 'v3'].find((v) => !started.includes(v))!)).replicas[1]!;
      expect(waiting.mode).toBe('ERR');
      open();
      const results = await Promise.all(adds);
      expect(results).toHaveLength(3);
      expect(addon.rebuildsRunningMax).toBe(2);
      for (const v of ['v1', 'v2', 'v3']) expect((await a.engineInfo(v)).replicas.map((r) => r.mode)).toEqual(['RW', 'RW']);
    });

    it('addReplica rebuilds a new replica and reports what it did; removeReplica refuses RW and stops repairs', async () => {
      const { a, b, refs } = await twoHosts();
      const log = new EventLog(a);
      await a.startEngine({ volume: 'v', replicas: [refs[0]!], epoch: 1 });
      await addon.engine.write(0, Buffer.alloc(8192, 7));
      const result = await a.addReplica('v', refs[1]!);
      expect(result).toMatchObject({ replicaId: 'r1', sentBytes: 8192, scannedBytes: MiB });
      expect(log.of('rebuild-started')).toMatchObject([{ volume: 'v', replicaId: 'r1' }]);
      expect(log.of('rebuild-completed')).toMatchObject([{ volume: 'v', replicaId: 'r1', sentBytes: 8192 }]);
      expect((await a.engineInfo('v')).replicas.map((r) => [r.id, r.hostId, r.mode])).toEqual([
        ['r0', 'a', 'RW'],
        ['r1', 'b', 'RW'],
      ]);
      expect(await codeOf(a.removeReplica('v', 'r1'))).toBe('INVALID_STATE');
      expect(await codeOf(a.removeReplica('v', 'r9'))).toBe('NOT_FOUND');
      // b goes down; r1 fails; removing it ends the repairs.
      await b.close();
      addon.engine.failReplica(addon.engine.replicaDirs[1]!);
      await log.next((e) => e.type === 'repair-scheduled');
      await a.removeReplica('v', 'r1');
      const attempts = addon.engine.rebuilds.length;
      await new Promise((r) => setTimeout(r, 100));
      expect(addon.engine.rebuilds.length).toBe(attempts);
      expect((await a.engineInfo('v')).replicas.map((r) => r.id)).toEqual(['r0']);
    });

    it('addReplica under a new address (its host came back elsewhere) rebuilds there, not at the old one', async () => {
      const { a, b, refs, bPort } = await twoHosts();
      const log = new EventLog(a);
      await a.startEngine({ volume: 'v', replicas: refs, epoch: 1 });
      await b.close();
      addon.engine.failReplica(`127.0.0.1:${bPort}/v-r1`, 107);
      await addon.engine.write(4096, Buffer.from('written while b was away'));
      await log.next((e) => e.type === 'repair-scheduled');
      // b comes back under another replica server address; the old one stays dead.
      const b2 = await start('b', { repair });
      const moved = (await b2.info()).replicaAddress!;
      expect(moved).not.toBe(refs[1]!.address);
      const result = await a.addReplica('v', { ...refs[1]!, address: moved });
      expect(result).toMatchObject({ replicaId: 'r1' });
      expect((await a.engineInfo('v')).replicas.map((r) => [r.id, r.mode, r.address])).toEqual([
        ['r0', 'RW', null],
        ['r1', 'RW', moved],
      ]);
      expect(addon.engine.replicaDirs[1]).toBe(`${moved.slice('tcp:'.length)}/v-r1`);
      expect(addon.replica(join(root, 'b', 'replicas', 'v-r1')).data.subarray(4096, 4096 + 24).toString()).toBe('written while b was away');
    });

    it('repairs nothing for a standby; deactivate stops a repair in flight for good; activation repairs what is ERR', async () => {
      const { a, b, refs: own } = await twoHosts();
      const refs: EngineReplicaRef[] = [{ ...own[0]!, address: (await a.info()).replicaAddress }, own[1]!];
      const logA = new EventLog(a);
      const logB = new EventLog(b);
      // A third replica whose host never answers: ERR on every engine.
      const gone: EngineReplicaRef = { id: 'r2', hostId: 'z', name: 'v-r2', address: 'tcp:127.0.0.1:1' };
      await a.startEngine({ volume: 'v', replicas: [...refs, gone], epoch: 1 });
      const source = addon.engine;
      const standby = await b.startEngine({ volume: 'v', replicas: [...refs, gone], standby: true });
      expect(standby).toMatchObject({ role: 'standby', epoch: 0 });
      expect(standby.replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
      expect(await codeOf(b.addReplica('v', gone))).toBe('INVALID_STATE');
      // r1 fails on the source and its repair holds in the middle of the rebuild.
      addon.rebuildGate = new Promise(() => undefined);
      source.failReplica(source.replicaDirs[1]!);
      await logA.next((e) => e.type === 'rebuild-started' && e.replicaId === 'r1');
      const hand = await a.deactivateEngine('v');
      expect(hand.rwReplicaIds).toEqual(['r0']);
      expect(await codeOf(a.addReplica('v', refs[1]!))).toBe('INVALID_STATE');
      const scheduled = logA.of('repair-scheduled').length;
      const attempts = source.rebuilds.length;
      // Many back-off periods (10..40 ms): no attempt and no schedule on either host.
      await new Promise((r) => setTimeout(r, 200));
      expect(logA.of('repair-scheduled')).toHaveLength(scheduled);
      expect(source.rebuilds).toHaveLength(attempts);
      expect(logB.of('repair-scheduled')).toEqual([]);

      // Rolled back onto the source: it repairs r1 and r2 again, as after a start. The
      // activation claims the epoch it is given, never one of its own.
      addon.rebuildGate = undefined;
      expect(hand).toMatchObject({ epoch: 1, generation: expect.any(Number) });
      for (const epoch of [undefined, 0, -2, 2.5]) expect(await codeOf(a.activateEngine('v', hand, { epoch } as never)), String(epoch)).toBe('INVALID_ARGUMENT');
      expect(await codeOf(a.activateEngine('v', hand, undefined as never))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(a.activateEngine('v', { epoch: hand.epoch, rwReplicaIds: hand.rwReplicaIds } as never, { epoch: 5 }))).toBe('INVALID_ARGUMENT');
      const back = await a.activateEngine('v', hand, { epoch: 5 });
      expect(back).toMatchObject({ role: 'active', epoch: 5 });
      await logA.next((e) => e.type === 'rebuild-completed' && e.replicaId === 'r1');
      expect(logA.of('engine-activated')).toEqual([{ type: 'engine-activated', volume: 'v', epoch: 5 }]);
      expect(logA.events.filter((e) => e.type === 'repair-scheduled' && e.replicaId === 'r2').length).toBeGreaterThan(0);
      expect(logB.of('repair-scheduled')).toEqual([]);
      expect((await b.engineInfo('v')).role).toBe('standby');
    });

    it('stopEngine aborts a rebuild in flight instead of waiting for it', async () => {
      const { a, refs } = await twoHosts();
      addon.rebuildGate = new Promise(() => undefined);
      await a.startEngine({ volume: 'v', replicas: [refs[0]!], epoch: 1 });
      const add = a.addReplica('v', refs[1]!);
      const log = new EventLog(a);
      await new Promise((r) => setTimeout(r, 10));
      // The gate never opens: only the abort lets stop finish.
      addon.rebuildGate = undefined;
      await a.stopEngine('v');
      expect(await codeOf(add)).not.toBe('resolved');
      expect(log.of('engine-stopped')).toHaveLength(1);
    });
  });

  describe('snapshots', () => {
    it('creates, lists and deletes through the engine, as users see snapshots', async () => {
      const de = await start('h1', { replicaListen: null });
      await de.createReplica('v-r0', MiB);
      await de.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'v-r0', address: null }], epoch: 1 });
      const s1 = await de.createSnapshot('v', 's1', { labels: { a: 'b' } });
      expect(s1).toMatchObject({ name: 's1', parent: null, labels: { a: 'b' }, userCreated: true });
      await de.createSnapshot('v', 's2');
      expect((await de.listSnapshots('v')).map((x) => [x.name, x.parent])).toEqual([
        ['s1', null],
        ['s2', 's1'],
      ]);
      await de.deleteSnapshot('v', 's1');
      // The deleted layer is kept (the fake marks it removed) but no longer listed, and s2's
      // parent is the nearest visible one.
      expect((await de.listSnapshots('v')).map((x) => [x.name, x.parent])).toEqual([['s2', null]]);
      expect(await codeOf(de.createSnapshot('v', 's2'))).toBe('ALREADY_EXISTS');
      expect(await codeOf(de.createSnapshot('v', 's3', { labels: { 'no spaces': 'x' } }))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(de.deleteSnapshot('v', 's1'))).toBe('NOT_FOUND');
      expect(await codeOf(de.listSnapshots('w'))).toBe('NOT_FOUND');
    });

    it('answers a new snapshot from its own layers, not a listing of the whole chain, with the parent past removed ones', async () => {
      const de = await start('h1', { replicaListen: null });
      await de.createReplica('v-r0', MiB);
      await de.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'v-r0', address: null }], epoch: 1 });
      await de.createSnapshot('v', 's1');
      await de.createSnapshot('v', 's2');
      await de.deleteSnapshot('v', 's2'); // kept under the head, removed
      const engine = addon.engine;
      const asked: Array<string | undefined> = [];
      const list = engine.listSnapshots.bind(engine);
      engine.listSnapshots = (name?: string) => {
        asked.push(name);
        return list(name);
      };
      const s3 = await de.createSnapshot('v', 's3', { labels: { k: 'v' } });
      expect(s3).toMatchObject({ name: 's3', parent: 's1', labels: { k: 'v' } });
      // Only the snapshot's own layers were asked for: a cost independent of the chain's depth.
      expect(asked).toEqual(['s3']);
      expect((await de.listSnapshots('v')).find((x) => x.name === 's3')).toEqual(s3);
    });

    it('runs at most maxConcurrentSnapshotCopies exports and copies at once; the others wait their turn', async () => {
      const de = await start('h1', { replicaListen: null, maxConcurrentSnapshotCopies: 1 });
      for (const n of ['v-r0', 'w-r0']) await de.createReplica(n, MiB);
      await de.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'v-r0', address: null }], epoch: 1 });
      const source = addon.engine;
      await de.startEngine({ volume: 'w', replicas: [{ id: 'r0', hostId: 'h1', name: 'w-r0', address: null }], epoch: 1 });
      await source.write(0, Buffer.from('hello'));
      await de.createSnapshot('v', 's');
      const started: string[] = [];
      const exportSnapshot = source.exportSnapshot.bind(source);
      const copySnapshotTo = source.copySnapshotTo.bind(source);
      source.exportSnapshot = (name, path) => (started.push('export'), exportSnapshot(name, path));
      source.copySnapshotTo = (name, target) => (started.push('copy'), copySnapshotTo(name, target));
      let open!: () => void;
      source.gate = new Promise<void>((r) => (open = r));
      const first = de.exportSnapshot('v', 's', join(root, 's.raw'));
      const second = de.copySnapshot('v', 's', 'w');
      for (let i = 0; i < 20; i++) await addon.tick();
      expect(started).toEqual(['export']);
      open();
      source.gate = undefined;
      await first;
      expect((await second).sizeBytes).toBe(MiB);
      expect(started).toEqual(['export', 'copy']);
      expect((await readFile(join(root, 's.raw'))).subarray(0, 5).toString()).toBe('hello');
      expect(await codeOf(de.copySnapshot('v', 's', 'v'))).toBe('INVALID_ARGUMENT');
    });
  });
});
