// The hand-over calls of the DataEngine interface (startEngine({standby}), deactivateEngine,
// activateEngine with an allocated epoch, role, engine-activated/engine-deactivated,
// replica-set-changed), run against LocalDataEngine
// directly and against RemoteDataEngine over gRPC, with the real addon: two data engines
// ("hosts") in this process, each with its replica server, one replica on each. The source
// engine runs on host 1, the standby on host 2, each reaching the other host's replica over
// the replica protocol and its own replica directly (on host 2 that replica is also served
// to host 1's engine by host 2's replica server). I/O goes through the engines' NBD exports
// with a real NBD client.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { DataEngine, DataEngineEvent, EngineReplicaRef } from '../../../src/data-engine/data-engine.js';
import { DataEngineGrpcServer } from '../../../src/data-engine/grpc/data-engine-grpc-server.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { loadAddon } from '../../../src/native/load.js';
import { NbdClient, NbdReplyError } from '../../system/helpers/nbd-client.js';
import { codeOf } from '../../helpers/codes.js';

const MiB = 1024 * 1024;
/** NBD_EPERM on the wire. */
const NBD_EPERM = 1;

/** A promise and whether it has settled yet (without awaiting it). */
function outcome<T>(p: Promise<T>): { promise: Promise<T>; settled: boolean } {
  const o = { promise: p, settled: false };
  p.then(
    () => (o.settled = true),
    () => (o.settled = true),
  );
  return o;
}

async function nbdErrno(p: Promise<unknown>): Promise<number> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(NbdReplyError);
    return (err as NbdReplyError).errno;
  }
  return 0;
}

function bytes(seed: number, n: number): Buffer {
  const b = Buffer.alloc(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + seed * 7 + 1) & 0xff;
  return b;
}

interface Host {
  /** The DataEngine under test (local, or a gRPC client to it). */
  de: DataEngine;
  /** The in-process data engine behind it. */
  local: LocalDataEngine;
  replicaAddress: string;
  events: DataEngineEvent[];
}

interface Harness {
  root: string;
  hosts: [Host, Host];
  stop: () => Promise<void>;
}

async function until(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 500; i++) {
    if (check()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function makeHarness(grpc: boolean): Promise<Harness> {
  const root = await mkdtemp(join(tmpdir(), 'mooring-deho-'));
  const closers: Array<() => Promise<void>> = [];
  const hosts: Host[] = [];
  for (const hostId of ['host-1', 'host-2']) {
    const local = await LocalDataEngine.start({
      dir: join(root, hostId),
      hostId,
      addon: loadAddon(),
      // Fast retries, so a repair that is (or is not) scheduled shows within the test.
      repair: { firstRetryMs: 50, maxRetryMs: 200 },
    });
    closers.push(() => local.close());
    let de: DataEngine = local;
    if (grpc) {
      const server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${join(root, `${hostId}.sock`)}` });
      const client = await RemoteDataEngine.connect({ address: server.address, timeoutMs: 20_000 });
      closers.push(() => server.close(), () => client.close());
      de = client;
    }
    const events: DataEngineEvent[] = [];
    de.watch((e) => events.push(e));
    if (grpc) {
      // The stream is live once it delivers: run a throwaway engine until its stop arrives.
      await local.createReplica('probe', MiB);
      for (let i = 0; !events.some((e) => e.type === 'engine-stopped'); i++) {
        if (i >= 100) throw new Error('the watch stream never delivered');
        await local.startEngine({ volume: 'probe', replicas: [{ id: 'p', hostId, name: 'probe', address: null }], epoch: i + 1 });
        await local.stopEngine('probe');
        await new Promise((r) => setTimeout(r, 20));
      }
      await local.deleteReplica('probe');
      events.length = 0;
    }
    hosts.push({ de, local, replicaAddress: (await local.info()).replicaAddress!, events });
  }
  return {
    root,
    hosts: hosts as [Host, Host],
    stop: async () => {
      for (const c of closers.reverse()) await c().catch(() => undefined);
      await rm(root, { recursive: true, force: true });
    },
  };
}

describe.each([
  ['LocalDataEngine', false],
  ['RemoteDataEngine over gRPC', true],
])('DataEngine hand-over: %s (real addon, two hosts)', (_name, grpc) => {
  let h: Harness;
  beforeAll(async () => {
    h = await makeHarness(grpc);
  });
  afterAll(async () => {
    await h?.stop();
  });
  // The epochs this test hands out, as the control plane allocates them: each once, rising.
  let lastEpoch = 0;
  const allocate = (): number => ++lastEpoch;

  function refs(volume: string): EngineReplicaRef[] {
    const [a, b] = h.hosts;
    return [
      { id: 'r0', hostId: 'host-1', name: `${volume}-r0`, address: a.replicaAddress },
      { id: 'r1', hostId: 'host-2', name: `${volume}-r1`, address: b.replicaAddress },
    ];
  }

  async function createVolume(volume: string, size: number): Promise<EngineReplicaRef[]> {
    const [a, b] = h.hosts;
    await a.de.createReplica(`${volume}-r0`, size);
    await b.de.createReplica(`${volume}-r1`, size);
    return refs(volume);
  }

  // A volume active on host 1 and a standby on host 2, both exported.
  async function sourceAndStandby(volume: string, size: number): Promise<{ srcSock: string; dstSock: string }> {
    const [a, b] = h.hosts;
    const replicas = await createVolume(volume, size);
    const srcSock = join(h.root, `${volume}-a.sock`);
    const dstSock = join(h.root, `${volume}-b.sock`);
    await a.de.startEngine({ volume, replicas, nbd: `unix:${srcSock}`, epoch: allocate() });
    await b.de.startEngine({ volume, replicas, nbd: `unix:${dstSock}`, standby: true });
    return { srcSock, dstSock };
  }

  it('hands a volume over between hosts: standby export refuses with EPERM, the target serves every write after activation, the source holds what it is sent and applies none of it', async () => {
    const [a, b] = h.hosts;
    const replicas = await createVolume('mig', 8 * MiB);
    const srcSock = join(h.root, 'mig-a.sock');
    const dstSock = join(h.root, 'mig-b.sock');
    const e1 = allocate();
    const src = await a.de.startEngine({ volume: 'mig', replicas, nbd: `unix:${srcSock}`, epoch: e1 });
    expect(src).toMatchObject({ role: 'active', epoch: e1, nbd: { address: `unix:${srcSock}` } });

    // Host 2's replica is served to host 1's engine and opened by host 2's standby too.
    const dst = await b.de.startEngine({ volume: 'mig', replicas, nbd: `unix:${dstSock}`, standby: true });
    expect(dst).toMatchObject({ volume: 'mig', role: 'standby', epoch: 0, sizeBytes: 8 * MiB, nbd: { address: `unix:${dstSock}` } });
    expect(dst.replicas.map((r) => [r.id, r.mode])).toEqual([['r0', 'RW'], ['r1', 'RW']]);
    expect((await b.de.listReplicas()).find((r) => r.name === 'mig-r1')).toMatchObject({ inUse: true });
    expect(await codeOf(b.de.deleteReplica('mig-r1'))).toBe('BUSY');
    expect((await b.de.listEngines()).map((e) => [e.volume, e.role])).toEqual([['mig', 'standby']]);

    const s = await NbdClient.connect({ socketPath: srcSock });
    const first = bytes(1, 128 * 1024);
    await s.write(MiB, first);
    await s.flush();
    // The standby's export accepts connections; its requests fail with NBD_EPERM.
    const d = await NbdClient.connect({ socketPath: dstSock });
    expect(d.sizeBytes).toBe(8 * MiB);
    expect(await nbdErrno(d.read(MiB, 4096))).toBe(NBD_EPERM);
    expect(await nbdErrno(d.write(0, bytes(2, 4096)))).toBe(NBD_EPERM);
    expect(await nbdErrno(d.flush())).toBe(NBD_EPERM);

    const hand = await a.de.deactivateEngine('mig');
    // The replica set committed at start (generation 1) is the one handed over.
    expect(hand).toEqual({ epoch: e1, generation: 1, rwReplicaIds: ['r0', 'r1'] });
    expect((await a.de.engineInfo('mig')).role).toBe('standby');
    await until(() => a.events.some((e) => e.type === 'engine-deactivated' && e.volume === 'mig' && e.epoch === src.epoch), 'engine-deactivated');
    // A FLUSH at the head of the stream is answered (all the source acknowledged was
    // flushed at the hand-over): QEMU flushes as it quits after a migration.
    await s.flush();
    // The source holds what its client sends now (a write, a read, and a flush behind
    // them): no reply until a rollback or, here, the stop after the confirm.
    const heldWrite = outcome(s.write(2 * MiB, bytes(3, 4096)));
    const heldRead = outcome(s.read(4 * MiB, 4096));
    const heldFlush = outcome(s.flush());

    const e2 = allocate();
    const active = await b.de.activateEngine('mig', hand, { epoch: e2 });
    expect(active).toMatchObject({ role: 'active', epoch: e2 });
    expect(active.replicas.map((r) => [r.id, r.mode])).toEqual([['r0', 'RW'], ['r1', 'RW']]);
    await until(() => b.events.some((e) => e.type === 'engine-activated' && e.volume === 'mig' && e.epoch === e2), 'engine-activated');
    await until(() => b.events.some((e) => e.type === 'epoch-claimed' && e.volume === 'mig' && e.epoch === e2), 'epoch-claimed');
    await until(
      () => b.events.some((e) => e.type === 'replica-set-changed' && e.volume === 'mig' && e.epoch === e2 && e.generation === 1 && e.rwReplicaIds.join() === 'r0,r1'),
      'replica-set-changed',
    );
    // The same connection, made while standby, now reads what host 1 wrote, and writes.
    expect((await d.read(MiB, first.length)).equals(first)).toBe(true);
    const second = bytes(4, 64 * 1024);
    await d.write(4 * MiB, second);
    await d.flush();
    // The held source write changed nothing.
    expect((await d.read(2 * MiB, 4096)).equals(Buffer.alloc(4096))).toBe(true);

    // Wrong states, coded. (A used hand-over is refused too, see below: its claim would
    // fence this writer first.)
    expect(await codeOf(a.de.deactivateEngine('mig'))).toBe('INVALID_STATE');
    expect(await codeOf(b.de.activateEngine('mig', hand, { epoch: allocate() }))).toBe('INVALID_STATE');
    expect(await codeOf(a.de.addReplica('mig', replicas[0]!))).toBe('INVALID_STATE');

    // The handed-over source stops without disturbing the target; its held requests end
    // with the connection, unanswered (not refused: an EPERM would be an I/O error in a guest).
    expect([heldWrite.settled, heldFlush.settled]).toEqual([false, false]);
    await a.de.stopEngine('mig');
    for (const held of [heldWrite, heldRead, heldFlush]) {
      const err = await held.promise.then(() => null, (e: unknown) => e);
      expect(err, 'a held request is never answered').toBeInstanceOf(Error);
      expect(err).not.toBeInstanceOf(NbdReplyError);
    }
    s.destroy();
    expect((await d.read(2 * MiB, 4096)).equals(Buffer.alloc(4096))).toBe(true);
    await d.write(5 * MiB, second);
    expect((await d.read(5 * MiB, second.length)).equals(second)).toBe(true);
    await d.disconnect();
    await b.de.stopEngine('mig');
    const clean = [...(await a.de.listReplicas()), ...(await b.de.listReplicas())].filter((r) => r.name.startsWith('mig-'));
    expect(clean.map((r) => [r.name, r.epoch, r.clean])).toEqual([
      ['mig-r0', e2, true],
      ['mig-r1', e2, true],
    ]);
  });

  it('rolls back after the target wrote: the target hands back, the source reads its writes', async () => {
    const [a, b] = h.hosts;
    const { srcSock, dstSock } = await sourceAndStandby('rb', 4 * MiB);
    const h1 = await a.de.deactivateEngine('rb');
    const e2 = allocate();
    await b.de.activateEngine('rb', h1, { epoch: e2 });
    const d = await NbdClient.connect({ socketPath: dstSock });
    const data = bytes(9, 32 * 1024);
    await d.write(MiB, data);
    await d.disconnect();
    const h2 = await b.de.deactivateEngine('rb');
    expect(h2).toEqual({ epoch: e2, generation: 1, rwReplicaIds: ['r0', 'r1'] });
    // The source's own hand-over is stale now: refused (its claim of e3 is harmless, no one writes).
    const e3 = allocate();
    expect(await codeOf(a.de.activateEngine('rb', h1, { epoch: e3 }))).toBe('STALE_EPOCH');
    // An epoch not above the hand-over's is not an allocated one.
    expect(await codeOf(a.de.activateEngine('rb', h2, { epoch: e2 }))).toBe('INVALID_ARGUMENT');
    const e4 = allocate();
    const back = await a.de.activateEngine('rb', h2, { epoch: e4 });
    expect(back).toMatchObject({ role: 'active', epoch: e4 });
    const s = await NbdClient.connect({ socketPath: srcSock });
    expect((await s.read(MiB, data.length)).equals(data)).toBe(true);
    await s.disconnect();
    await b.de.stopEngine('rb');
    await a.de.stopEngine('rb');
  });

  it('serves what the source held once a rollback makes it the writer again, in order, after what the target wrote', async () => {
    const [a, b] = h.hosts;
    const { srcSock, dstSock } = await sourceAndStandby('hold', 4 * MiB);
    const s = await NbdClient.connect({ socketPath: srcSock });
    // Writes in flight while the source deactivates: each is answered by the writer, or held.
    const early = Array.from({ length: 16 }, (_, i) => outcome(s.write(i * 4096, bytes(20 + i, 4096))));
    const h1 = await a.de.deactivateEngine('hold');
    // QEMU resumed the source VM by itself (migrate_cancel): its guest writes again.
    const late = outcome(s.write(MiB, bytes(5, 4096)));
    const lateRead = outcome(s.read(16 * 4096, 4096));
    await b.de.activateEngine('hold', h1, { epoch: allocate() });
    const d = await NbdClient.connect({ socketPath: dstSock });
    await d.write(MiB, bytes(6, 8192));
    await d.flush();
    await d.disconnect();
    expect(late.settled).toBe(false);
    const h2 = await b.de.deactivateEngine('hold');
    await a.de.activateEngine('hold', h2, { epoch: allocate() });
    // The held requests are served now: the write lands over the target's, the read answers.
    await late.promise;
    expect((await lateRead.promise).equals(Buffer.alloc(4096))).toBe(true);
    for (const [i, w] of early.entries()) {
      await w.promise;
      expect((await s.read(i * 4096, 4096)).equals(bytes(20 + i, 4096)), `early write ${i}`).toBe(true);
    }
    expect((await s.read(MiB, 4096)).equals(bytes(5, 4096))).toBe(true);
    expect((await s.read(MiB + 4096, 4096)).equals(bytes(6, 8192).subarray(4096))).toBe(true);
    await s.write(2 * MiB, bytes(7, 4096));
    await s.flush();
    await s.disconnect();
    await b.de.stopEngine('hold');
    await a.de.stopEngine('hold');
  });

  it('repairs nothing while standby, stops repairing at deactivate, and repairs the ERR replicas of the hand-over after activation', async () => {
    const [a, b] = h.hosts;
    const replicas = await createVolume('rep', 4 * MiB);
    // A third replica on a host that does not answer: ERR on both engines from the start.
    const gone: EngineReplicaRef = { id: 'r2', hostId: 'host-9', name: 'rep-r2', address: 'tcp:127.0.0.1:1' };
    const all = [...replicas, gone];
    await a.de.startEngine({ volume: 'rep', replicas: all, ioTimeoutMs: 500, epoch: allocate() });
    const dst = await b.de.startEngine({ volume: 'rep', replicas: all, standby: true, ioTimeoutMs: 500 });
    expect(dst.replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
    const repairs = (host: Host): number => host.events.filter((e) => e.type === 'repair-scheduled' && e.volume === 'rep').length;
    await until(() => repairs(a) >= 2, 'repairs on the active source');
    const hand = await a.de.deactivateEngine('rep');
    expect(hand.rwReplicaIds).toEqual(['r0', 'r1']);
    // Long enough for several retries at the 50..200 ms back-off: none come from either host.
    const atHandOver = repairs(a);
    await new Promise((r) => setTimeout(r, 600));
    expect(repairs(a)).toBe(atHandOver);
    expect(repairs(b)).toBe(0);

    const active = await b.de.activateEngine('rep', hand, { epoch: allocate() });
    expect(active.replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
    await until(() => repairs(b) >= 1, 'repairs on the activated target');
    expect(b.events.find((e) => e.type === 'repair-scheduled' && e.volume === 'rep')).toMatchObject({ replicaId: 'r2' });
    expect(repairs(a)).toBe(atHandOver);
    await a.de.stopEngine('rep');
    await b.de.stopEngine('rep');
  });

  it('refuses hand-over calls in the wrong state or for unknown volumes with coded errors', async () => {
    const [a, b] = h.hosts;
    const replicas = await createVolume('err', 4 * MiB);
    const some = { epoch: 1, generation: 1, rwReplicaIds: ['r0'] };
    expect(await codeOf(a.de.deactivateEngine('none'))).toBe('NOT_FOUND');
    expect(await codeOf(a.de.activateEngine('none', some, { epoch: 2 }))).toBe('NOT_FOUND');
    await a.de.startEngine({ volume: 'err', replicas, epoch: allocate() });
    await b.de.startEngine({ volume: 'err', replicas, standby: true });
    expect(await codeOf(b.de.deactivateEngine('err'))).toBe('INVALID_STATE');
    expect(await codeOf(a.de.activateEngine('err', some, { epoch: allocate() }))).toBe('INVALID_STATE');
    expect(await codeOf(b.de.addReplica('err', replicas[0]!))).toBe('INVALID_STATE');
    expect(await codeOf(b.de.activateEngine('err', { ...some, epoch: -1 }, { epoch: 2 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(b.de.activateEngine('err', { ...some, generation: -1 }, { epoch: 2 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(b.de.activateEngine('err', { epoch: 1, rwReplicaIds: ['r0'] } as never, { epoch: 2 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(b.de.activateEngine('err', { ...some, rwReplicaIds: ['../r0'] }, { epoch: 2 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(b.de.activateEngine('err', null as never, { epoch: 2 }))).toBe('INVALID_ARGUMENT');
    for (const epoch of [0, -3, 1.5, undefined]) expect(await codeOf(b.de.activateEngine('err', some, { epoch } as never))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(b.de.startEngine({ volume: 'other', replicas, standby: 'yes' as never }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(b.de.startEngine({ volume: 'other', replicas }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(b.de.startEngine({ volume: 'other', replicas, epoch: 0 }))).toBe('INVALID_ARGUMENT');
    // A hand-over naming no replica of the engine, and ones that are not the last writer's:
    // refused before anything is claimed, so the real hand-over still works afterwards.
    const hand = await a.de.deactivateEngine('err');
    expect(await codeOf(b.de.activateEngine('err', { ...hand, rwReplicaIds: [] }, { epoch: allocate() }))).toBe('NO_HEALTHY_REPLICA');
    expect(await codeOf(b.de.activateEngine('err', { ...hand, epoch: hand.epoch - 1 }, { epoch: allocate() }))).toBe('STALE_EPOCH');
    expect(await codeOf(b.de.activateEngine('err', { ...hand, generation: hand.generation + 1 }, { epoch: allocate() }))).toBe('STALE_EPOCH');
    expect(await codeOf(b.de.activateEngine('err', hand, { epoch: hand.epoch }))).toBe('INVALID_ARGUMENT');
    expect((await b.de.engineInfo('err')).role).toBe('standby');
    const promised = (await a.de.listReplicas()).filter((r) => r.name.startsWith('err-')).map((r) => r.epoch);
    expect(promised.every((e) => e === hand.epoch), `replica epochs ${promised} after refused activations`).toBe(true);
    await b.de.activateEngine('err', hand, { epoch: allocate() });
    // A standby that is stopped instead of activated: rollback before the hand-over.
    await a.de.stopEngine('err');
    await b.de.stopEngine('err');
    expect(await codeOf(b.de.deactivateEngine('err'))).toBe('NOT_FOUND');
  });
});

describe('the hold of a handed-over export (handOverHoldMs)', () => {
  async function handedOver(handOverHoldMs: number | undefined): Promise<{ s: NbdClient; stop: () => Promise<void> }> {
    const root = await mkdtemp(join(tmpdir(), 'mooring-hold-'));
    const de = await LocalDataEngine.start({ dir: join(root, 'h'), hostId: 'h', addon: loadAddon(), replicaListen: null, ...(handOverHoldMs !== undefined ? { handOverHoldMs } : {}) });
    await de.createReplica('v-r0', MiB);
    const sock = join(root, 'v.sock');
    await de.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h', name: 'v-r0', address: null }], nbd: `unix:${sock}`, epoch: 1 });
    const s = await NbdClient.connect({ socketPath: sock });
    await de.deactivateEngine('v');
    return {
      s,
      stop: async () => {
        s.destroy();
        await de.close();
        await rm(root, { recursive: true, force: true });
      },
    };
  }

  it('refuses what it held once the hold runs out, and at once with 0', async () => {
    for (const holdMs of [200, 0]) {
      const { s, stop } = await handedOver(holdMs);
      try {
        const t0 = performance.now();
        expect(await nbdErrno(s.write(0, bytes(1, 4096)))).toBe(NBD_EPERM);
        if (holdMs > 0) expect(performance.now() - t0).toBeGreaterThanOrEqual(holdMs - 20);
        expect(await nbdErrno(s.read(0, 4096))).toBe(NBD_EPERM);
      } finally {
        await stop();
      }
    }
  });

  it('refuses a hold that is not a whole number of ms up to a day', async () => {
    for (const handOverHoldMs of [-1, 1.5, 86_400_001, '10' as never]) {
      expect(await codeOf(LocalDataEngine.start({ dir: join(tmpdir(), 'mooring-hold-bad'), hostId: 'h', addon: loadAddon(), replicaListen: null, handOverHoldMs }))).toBe('INVALID_ARGUMENT');
    }
  });
});
