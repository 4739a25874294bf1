// The gRPC server and client beyond the contract: bad input of every kind (raw garbage,
// undecodable protobuf, wrong wire types, oversized messages, unknown methods) gets a coded
// error and the server keeps serving; the loopback rule; mutual TLS; deadlines; the watch
// stream reconnecting after the server comes back; the writer epoch, quorumHoldMs, hand-over
// generation and replica-set-changed events carried intact, and garbage in them refused.
import { execFileSync, spawn } from 'node:child_process';
import { lstat, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect, createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { status, type ServiceError } from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';

import type { DataEngine, DataEngineEvent, EngineHandOver, EngineInfo, EngineStartOptions } from '../../../src/data-engine/data-engine.js';
import { eventFromMsg, eventToMsg, fromGrpcError, handOverFromMsg, handOverToMsg } from '../../../src/data-engine/grpc/codec.js';
import { DATA_ENGINE_PROTO } from '../../../src/data-engine/grpc/data-engine-proto.js';
import { DataEngineGrpcServer, GRPC_LIMITS } from '../../../src/data-engine/grpc/data-engine-grpc-server.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { FakeAddon } from '../fakes/fake-addon.js';
import { codeOf } from '../../helpers/codes.js';
import { rawCall } from './grpc-raw.js';

const MiB = 1024 * 1024;
const proto = protobuf.parse(DATA_ENGINE_PROTO, { keepCase: false }).root;

describe('DataEngine gRPC', () => {
  let root: string;
  let local: LocalDataEngine;
  let server: DataEngineGrpcServer | undefined;
  const clients: RemoteDataEngine[] = [];

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-grpc-'));
    local = await LocalDataEngine.start({ dir: join(root, 'de'), hostId: 'h1', addon: new FakeAddon(), replicaListen: null });
  });
  afterEach(async () => {
    await Promise.allSettled(clients.splice(0).map((c) => c.close()));
    await server?.close();
    server = undefined;
    await local.close();
    await rm(root, { recursive: true, force: true });
  });

  async function serveTcp(): Promise<{ target: string; remote: RemoteDataEngine }> {
    server = await DataEngineGrpcServer.start({ engine: local, listen: 'tcp:127.0.0.1:0' });
    expect(server.address).toMatch(/^tcp:127\.0\.0\.1:\d+$/);
    const remote = await RemoteDataEngine.connect({ address: server.address });
    clients.push(remote);
    return { target: server.address.slice('tcp:'.length), remote };
  }

  it('survives raw garbage on its TCP port and keeps serving', async () => {
    const { remote } = await serveTcp();
    const port = Number(server!.address.split(':')[2]);
    const junk = [
      Buffer.alloc(64 * 1024, 0xff),
      Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'),
      // The HTTP/2 preface, then a frame header claiming 16 MiB of payload, then noise.
      Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), Buffer.from([0xff, 0xff, 0xff, 0x00, 0x00, 0, 0, 0, 1]), Buffer.alloc(1000, 0xab)]),
    ];
    for (const bytes of junk) {
      await new Promise<void>((res) => {
        const s = connect(port, '127.0.0.1', () => s.end(bytes));
        s.on('data', () => undefined);
        s.on('error', () => res());
        s.on('close', () => res());
      });
    }
    expect((await remote.info()).hostId).toBe('h1');
  });

  it('answers undecodable protobuf and wrong wire types with coded errors', async () => {
    const { target, remote } = await serveTcp();
    const cases: Array<[string, Buffer]> = [
      // Field 1 (name) claims 0x7fff bytes; only 1 follows.
      ['CreateReplica', Buffer.from([0x0a, 0xff, 0xff, 0x01, 0x41])],
      // Field 2 (sizeBytes, a varint) sent as a length-delimited string.
      ['CreateReplica', Buffer.from([0x0a, 0x01, 0x61, 0x12, 0x03, 0x31, 0x32, 0x33])],
      // A varint that never ends.
      ['StartEngine', Buffer.alloc(32, 0xff)],
      // Wire type 7 does not exist.
      ['DeleteReplica', Buffer.from([0x0f, 0x00])],
      // Valid protobuf, but an empty name.
      ['DeleteReplica', Buffer.alloc(0)],
    ];
    for (const [method, body] of cases) {
      const reply = await rawCall(target, method, body);
      expect(reply, `${method} ${body.toString('hex')}`).not.toBeInstanceOf(Buffer);
      const err = reply as ServiceError;
      const code = err.metadata.get('mooring-code')[0];
      expect(['PROTOCOL_ERROR', 'INVALID_ARGUMENT']).toContain(code);
      expect(fromGrpcError(err, 'x').code).toBe(code);
    }
    expect((await remote.listReplicas()).length).toBe(0);
  });

  it('refuses messages over the size limit and unknown methods; the server keeps serving', async () => {
    const { target, remote } = await serveTcp();
    const big = await rawCall(target, 'DeleteReplica', Buffer.concat([Buffer.from([0x0a]), encodeVarint(GRPC_LIMITS.messageBytesMax + 16), Buffer.alloc(GRPC_LIMITS.messageBytesMax + 16, 0x61)]));
    expect((big as ServiceError).code).toBe(status.RESOURCE_EXHAUSTED);
    expect(fromGrpcError(big, 'x').code).toBe('INVALID_ARGUMENT');
    const unknown = await rawCall(target, 'FormatAllDisks', Buffer.alloc(0));
    expect((unknown as ServiceError).code).toBe(status.UNIMPLEMENTED);
    expect(fromGrpcError(unknown, 'x').code).toBe('UNSUPPORTED');
    // The client refuses to send an oversized request too.
    expect(await codeOf(remote.createReplica('x'.repeat(GRPC_LIMITS.messageBytesMax + 1), MiB))).toBe('INVALID_ARGUMENT');
    await remote.createReplica('still-fine', MiB);
    expect((await remote.listReplicas()).map((r) => r.name)).toEqual(['still-fine']);
  });

  it('carries error codes and bad argument types back as MooringErrors', async () => {
    const { remote } = await serveTcp();
    await remote.createReplica('r0', MiB);
    expect(await codeOf(remote.createReplica('r0', MiB))).toBe('ALREADY_EXISTS');
    expect(await codeOf(remote.createReplica('r1', -1))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(remote.createReplica('r1', 2 ** 60))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(remote.startEngine({ volume: 'v', replicas: [{ id: 7, hostId: 'h1', name: 'r0', address: null } as never], epoch: 1 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(remote.startEngine(null as never))).toBe('INVALID_ARGUMENT');
    await remote.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }], epoch: 1 });
    expect(await codeOf(remote.deleteReplica('r0'))).toBe('BUSY');
    expect(await codeOf(remote.removeReplica('v', 'r0'))).toBe('INVALID_STATE');
  });

  it('binds TCP to loopback only without TLS unless allowed; clients follow the same rule', async () => {
    expect(await codeOf(DataEngineGrpcServer.start({ engine: local, listen: 'tcp:0.0.0.0:0' }))).toBe('INVALID_ARGUMENT');
    server = await DataEngineGrpcServer.start({ engine: local, listen: 'tcp:0.0.0.0:0', allowInsecureRemote: true });
    expect(await codeOf(RemoteDataEngine.connect({ address: 'tcp:192.0.2.1:7000' }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(DataEngineGrpcServer.start({ engine: local, listen: 'ftp:x' }))).toBe('INVALID_ARGUMENT');
  });

  it('reports a data engine that is not there as UNAVAILABLE, and a call past its deadline too', async () => {
    expect(await codeOf(RemoteDataEngine.connect({ address: `unix:${join(root, 'nobody.sock')}`, timeoutMs: 500 }))).toBe('UNAVAILABLE');
    const stuck: DataEngine = {
      hostId: 'slow',
      info: async () => ({ hostId: 'slow', version: '0', dir: '/', replicaAddress: null, tls: false }),
      listReplicas: () => new Promise(() => undefined),
    } as unknown as DataEngine;
    server = await DataEngineGrpcServer.start({ engine: stuck, listen: `unix:${join(root, 'slow.sock')}` });
    const remote = await RemoteDataEngine.connect({ address: server.address, timeoutMs: 300 });
    clients.push(remote);
    expect(await codeOf(remote.listReplicas())).toBe('UNAVAILABLE');
  });

  it('replaces a stale socket file left by a killed server, but not a live one', async () => {
    const path = join(root, 'de.sock');
    server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${path}` });
    expect(await codeOf(DataEngineGrpcServer.start({ engine: local, listen: `unix:${path}` }))).toBe('ADDRESS_IN_USE');
    // A socket file whose server was SIGKILLed stays behind; the next server takes its place.
    const stalePath = join(root, 'stale.sock');
    const child = spawn(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(stalePath)}, () => console.log('up'))`], { stdio: ['ignore', 'pipe', 'ignore'] });
    await new Promise((r) => child.stdout!.once('data', r));
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    expect((await lstat(stalePath)).isSocket()).toBe(true);
    const second = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${stalePath}` });
    const remote = await RemoteDataEngine.connect({ address: second.address });
    expect(remote.hostId).toBe('h1');
    await remote.close();
    await second.close();
    await writeFile(join(root, 'plain'), 'x');
    expect(await codeOf(DataEngineGrpcServer.start({ engine: local, listen: `unix:${join(root, 'plain')}` }))).toBe('ADDRESS_IN_USE');
  });

  // Watches remote, creates replica r0 on the local engine, and returns cycle(volume): an
  // engine over r0 started and stopped (each at a new epoch, as an allocator would) until its
  // engine-stopped event has come through the watch stream (at most 200 tries).
  async function watchedCycles(remote: RemoteDataEngine, detail: () => string = () => ''): Promise<{ events: DataEngineEvent[]; cycle: (volume: string) => Promise<void> }> {
    const events: DataEngineEvent[] = [];
    remote.watch((e) => events.push(e));
    await local.createReplica('r0', MiB);
    let epoch = 0;
    const cycle = async (volume: string): Promise<void> => {
      for (let i = 0; !events.some((e) => e.type === 'engine-stopped' && e.volume === volume); i++) {
        if (i >= 200) throw new Error(`no engine-stopped for ${volume} through the watch stream${detail()}`);
        await local.startEngine({ volume, replicas: [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }], epoch: ++epoch });
        await local.stopEngine(volume);
        await new Promise((r) => setTimeout(r, 25));
      }
    };
    return { events, cycle };
  }

  it('the watch stream reconnects when the server comes back', async () => {
    const path = join(root, 'de.sock');
    server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${path}` });
    const remote = await RemoteDataEngine.connect({ address: `unix:${path}` });
    clients.push(remote);
    const { events, cycle } = await watchedCycles(remote);
    await cycle('before');
    await server.close();
    server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${path}` });
    await cycle('after');
    expect(events.filter((e) => e.type === 'epoch-claimed' && e.volume === 'after').length).toBeGreaterThan(0);
  });

  /**
   * A TCP relay to `port` whose connections can be silenced: their bytes dropped both ways,
   * the sockets left open (no FIN, no RST), as a partition or a host gone without a word.
   */
  async function silencingRelay(port: number): Promise<{ port: number; accepted: () => number; silence: () => void; close: () => Promise<void> }> {
    const open: Array<[Socket, Socket]> = [];
    const all: Socket[] = [];
    let accepted = 0;
    const relay = createServer((c) => {
      accepted++;
      const u = connect(port, '127.0.0.1');
      c.pipe(u);
      u.pipe(c);
      for (const [a, b] of [[c, u], [u, c]] as const) {
        a.on('error', () => b.destroy());
        a.on('close', () => b.destroy());
      }
      open.push([c, u]);
      all.push(c, u);
    });
    await new Promise<void>((r) => relay.listen(0, '127.0.0.1', r));
    return {
      port: (relay.address() as { port: number }).port,
      accepted: () => accepted,
      silence: () => {
        for (const [c, u] of open.splice(0)) {
          c.unpipe(u);
          u.unpipe(c);
          c.on('data', () => undefined);
          u.on('data', () => undefined);
        }
      },
      close: async () => {
        for (const sock of all) sock.destroy();
        await new Promise<void>((r) => relay.close(() => r()));
      },
    };
  }

  it('drops a connection that went silent (keepalive) and moves the watch stream to a new one', async () => {
    server = await DataEngineGrpcServer.start({ engine: local, listen: 'tcp:127.0.0.1:0' });
    const relay = await silencingRelay(Number(server.address.split(':')[2]));
    try {
      const remote = await RemoteDataEngine.connect({ address: `tcp:127.0.0.1:${relay.port}`, keepaliveMs: 300 });
      clients.push(remote);
      const { cycle } = await watchedCycles(remote, () => ` (relay connections: ${relay.accepted()})`);
      await cycle('before');
      const before = relay.accepted();
      relay.silence();
      // Without keepalive the stream would wait on the silent connection for good.
      await cycle('after');
      expect(relay.accepted(), 'the client dialled again').toBeGreaterThan(before);
      expect((await remote.info()).hostId).toBe('h1');
      expect(await codeOf(RemoteDataEngine.connect({ address: `tcp:127.0.0.1:${relay.port}`, keepaliveMs: 50 }))).toBe('INVALID_ARGUMENT');
    } finally {
      await relay.close();
    }
  });

  it('the server closes a client connection that went silent (its keepalive) and frees the watch stream it held', async () => {
    server = await DataEngineGrpcServer.start({ engine: local, listen: 'tcp:127.0.0.1:0', keepaliveMs: 300 });
    const relay = await silencingRelay(Number(server.address.split(':')[2]));
    try {
      // The client's own keepalive is an hour: only the server can find the connection dead.
      const remote = await RemoteDataEngine.connect({ address: `tcp:127.0.0.1:${relay.port}`, keepaliveMs: 3600_000 });
      clients.push(remote);
      const { cycle } = await watchedCycles(remote);
      await cycle('before');
      expect(server.watchStreams).toBe(1);
      relay.silence();
      // Without the server's PINGs the stream would hold its slot (one of 64) for good.
      const deadline = Date.now() + 20_000;
      while (server.watchStreams > 0) {
        if (Date.now() > deadline) throw new Error(`the silent client's watch stream is still open on the server after 20 s (keepalive 300 ms)`);
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(await codeOf(DataEngineGrpcServer.start({ engine: local, listen: 'tcp:127.0.0.1:0', keepaliveMs: 99 }))).toBe('INVALID_ARGUMENT');
    } finally {
      await relay.close();
    }
  });

  describe('writer epochs', () => {
    const info: EngineInfo = { volume: 'v', sizeBytes: MiB, epoch: 9, role: 'active', replicas: [], nbd: null };

    // A DataEngine that records what the server hands it: what crosses the wire, exactly.
    function recorder(): { de: DataEngine; seen: unknown[]; emit: (e: DataEngineEvent) => void } {
      const seen: unknown[] = [];
      const listeners = new Set<(e: DataEngineEvent) => void>();
      const de = {
        hostId: 'h1',
        info: async () => ({ hostId: 'h1', version: 'x', dir: '/x', replicaAddress: null, tls: false }),
        startEngine: async (o: EngineStartOptions) => (seen.push(o), { ...info, epoch: o.epoch ?? 0 }),
        activateEngine: async (v: string, h: EngineHandOver, o: { epoch: number }) => (seen.push({ volume: v, handOver: h, options: o }), { ...info, epoch: o.epoch }),
        deactivateEngine: async () => ({ epoch: 9, generation: 4, rwReplicaIds: ['r0', 'r2'] }),
        watch: (l: (e: DataEngineEvent) => void) => (listeners.add(l), () => listeners.delete(l)),
        close: async () => undefined,
      } as unknown as DataEngine;
      return { de, seen, emit: (e) => listeners.forEach((l) => l(e)) };
    }

    it('carries the epoch, quorumHoldMs, the hand-over generation and replica-set-changed both ways', async () => {
      const r = recorder();
      server = await DataEngineGrpcServer.start({ engine: r.de, listen: `unix:${join(root, 'rec.sock')}` });
      const remote = await RemoteDataEngine.connect({ address: server.address });
      clients.push(remote);
      const refs = [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }];
      expect((await remote.startEngine({ volume: 'v', replicas: refs, epoch: 2 ** 53 - 1, quorumHoldMs: 0 })).epoch).toBe(2 ** 53 - 1);
      await remote.startEngine({ volume: 'v', replicas: refs, epoch: 7 });
      await remote.startEngine({ volume: 'v', replicas: refs, standby: true });
      expect(await remote.deactivateEngine('v')).toEqual({ epoch: 9, generation: 4, rwReplicaIds: ['r0', 'r2'] });
      expect((await remote.activateEngine('v', { epoch: 9, generation: 4, rwReplicaIds: ['r0'] }, { epoch: 12 })).epoch).toBe(12);
      expect(r.seen).toEqual([
        { volume: 'v', replicas: refs, epoch: 2 ** 53 - 1, quorumHoldMs: 0 },
        { volume: 'v', replicas: refs, epoch: 7 },
        { volume: 'v', replicas: refs, standby: true },
        { volume: 'v', handOver: { epoch: 9, generation: 4, rwReplicaIds: ['r0'] }, options: { epoch: 12 } },
      ]);
      const events: DataEngineEvent[] = [];
      remote.watch((e) => events.push(e));
      const change: DataEngineEvent = { type: 'replica-set-changed', volume: 'v', epoch: 12, generation: 3, rwReplicaIds: ['r0', 'r1'] };
      for (let i = 0; events.length === 0; i++) {
        if (i >= 200) throw new Error('no event through the watch stream');
        r.emit(change);
        await new Promise((res) => setTimeout(res, 25));
      }
      expect(events[0]).toEqual(change);
    });

    it('refuses garbage in the new fields: client-side before sending, and server-side when a raw request carries it', async () => {
      const { target, remote } = await serveTcp();
      await local.createReplica('r0', MiB);
      const refs = [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }];
      for (const epoch of [0, -1, 1.5, 2 ** 53, '3', null]) {
        expect(await codeOf(remote.startEngine({ volume: 'v', replicas: refs, epoch } as never)), String(epoch)).toBe('INVALID_ARGUMENT');
      }
      for (const quorumHoldMs of [-1, 2 ** 32, 600_001, 0.5]) {
        expect(await codeOf(remote.startEngine({ volume: 'v', replicas: refs, epoch: 1, quorumHoldMs })), String(quorumHoldMs)).toBe('INVALID_ARGUMENT');
      }
      // No epoch (a client of the last release sends none): the data engine picks none.
      expect(await codeOf(remote.startEngine({ volume: 'v', replicas: refs }))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(remote.startEngine({ volume: 'v', replicas: refs, standby: true, epoch: 4 }))).toBe('INVALID_ARGUMENT');
      await remote.startEngine({ volume: 'v', replicas: refs, standby: true });
      const ho = { epoch: 1, generation: 1, rwReplicaIds: ['r0'] };
      for (const [h, o] of [
        [{ ...ho, generation: -1 }, { epoch: 2 }],
        [{ ...ho, generation: '1' }, { epoch: 2 }],
        [{ epoch: 1, rwReplicaIds: ['r0'] }, { epoch: 2 }],
        [ho, { epoch: 0 }],
        [ho, { epoch: 2 ** 53 }],
        [ho, {}],
        [ho, null],
      ] as const) {
        expect(await codeOf(remote.activateEngine('v', h as never, o as never)), JSON.stringify([h, o])).toBe('INVALID_ARGUMENT');
      }
      // The same garbage, sent raw: uint64 values beyond 2^53, an absent epoch.
      const raw = (type: string, v: object): Buffer => Buffer.from(proto.lookupType(`mooring.dataengine.v1.${type}`).encode(v).finish());
      const huge = (protobuf.util.Long as unknown as { fromString(s: string, unsigned: boolean): object }).fromString('18446744073709551615', true);
      const cases: Array<[string, Buffer]> = [
        ['StartEngine', raw('StartEngineRequest', { volume: 'w', replicas: refs, epoch: huge })],
        ['StartEngine', raw('StartEngineRequest', { volume: 'w', replicas: refs })],
        ['StartEngine', raw('StartEngineRequest', { volume: 'w', replicas: refs, epoch: 1, quorumHoldMs: 4_000_000_000, hasQuorumHoldMs: true })],
        ['StartEngine', raw('StartEngineRequest', { volume: 'w', replicas: refs, standby: true, epoch: 3 })],
        ['ActivateEngine', raw('ActivateEngineRequest', { volume: 'v', handOver: ho })],
        ['ActivateEngine', raw('ActivateEngineRequest', { volume: 'v', handOver: ho, epoch: huge })],
        ['ActivateEngine', raw('ActivateEngineRequest', { volume: 'v', handOver: { ...ho, generation: huge }, epoch: 5 })],
        ['ActivateEngine', raw('ActivateEngineRequest', { volume: 'v', handOver: { ...ho, epoch: huge }, epoch: 5 })],
      ];
      for (const [method, body] of cases) {
        const reply = await rawCall(target, method, body);
        expect(reply, `${method} ${body.toString('hex')}`).not.toBeInstanceOf(Buffer);
        expect((reply as ServiceError).metadata.get('mooring-code')[0], `${method} ${body.toString('hex')}`).toBe('INVALID_ARGUMENT');
      }
      // Nothing started or activated meanwhile; the server keeps serving.
      expect((await remote.listEngines()).map((e) => [e.volume, e.role])).toEqual([['v', 'standby']]);
    });

    it('round-trips hand-overs and replica-set-changed through the codec; an older peer\'s hand-over reads as generation 0', () => {
      const wire = (type: string, m: object): Record<string, unknown> => {
        const t = proto.lookupType(`mooring.dataengine.v1.${type}`);
        return t.toObject(t.decode(t.encode(m).finish()), { longs: Number, defaults: true });
      };
      const ho: EngineHandOver = { epoch: 2 ** 53 - 1, generation: 77, rwReplicaIds: ['r0', 'r3'] };
      expect(handOverFromMsg(wire('HandOver', handOverToMsg(ho)))).toEqual(ho);
      expect(handOverFromMsg(wire('HandOver', { epoch: 5, rwReplicaIds: ['r0'] }))).toEqual({ epoch: 5, generation: 0, rwReplicaIds: ['r0'] });
      const e: DataEngineEvent = { type: 'replica-set-changed', volume: 'v', epoch: 41, generation: 2, rwReplicaIds: ['r1'] };
      expect(eventFromMsg(wire('Event', eventToMsg(e)))).toEqual(e);
      expect(eventFromMsg(wire('Event', eventToMsg({ ...e, rwReplicaIds: [] })))).toEqual({ ...e, rwReplicaIds: [] });
      // Hostile shapes decode to something the caller can check, never throw.
      expect(eventFromMsg({ type: 'replica-set-changed', volume: 'v', epoch: 'x', rwReplicaIds: [1, ...Array.from({ length: 40 }, () => 'r')] })).toMatchObject({
        epoch: Number.NaN,
        generation: Number.NaN,
        rwReplicaIds: ['', ...Array.from({ length: 15 }, () => 'r')],
      });
      expect(handOverFromMsg(null)).toEqual({ epoch: Number.NaN, generation: Number.NaN, rwReplicaIds: [] });
    });
  });

  describe('mutual TLS', () => {
    let certs: Record<string, string>;
    beforeAll(async () => {
      certs = await makeCerts();
    });
    afterAll(async () => {
      await rm(certs.dir!, { recursive: true, force: true });
    });

    it('serves clients with a certificate of its CA, and no one else', async () => {
      const tls = { cert: certs.serverCert!, key: certs.serverKey!, ca: certs.ca! };
      server = await DataEngineGrpcServer.start({ engine: local, listen: 'tcp:127.0.0.1:0', tls });
      expect(server.tls).toBe(true);
      const good = await RemoteDataEngine.connect({ address: server.address, tls: { cert: certs.clientCert!, key: certs.clientKey!, ca: certs.ca! } });
      clients.push(good);
      expect(good.hostId).toBe('h1');
      // No client certificate at all (plain TCP).
      expect(await codeOf(RemoteDataEngine.connect({ address: server.address, timeoutMs: 2000 }))).toBe('UNAVAILABLE');
      // A certificate from another CA.
      expect(
        await codeOf(RemoteDataEngine.connect({ address: server.address, timeoutMs: 2000, tls: { cert: certs.otherCert!, key: certs.otherKey!, ca: certs.ca! } })),
      ).toBe('UNAVAILABLE');
      expect((await good.listReplicas()).length).toBe(0);
    });
  });
});

function encodeVarint(n: number): Buffer {
  const out: number[] = [];
  while (n >= 0x80) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
}

// A CA, a server and a client certificate from it, and a client certificate from another CA.
async function makeCerts(): Promise<Record<string, string>> {
  const dir = await mkdtemp(join(tmpdir(), 'mooring-certs-'));
  const ssl = (...args: string[]): void => void execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  await writeFile(join(dir, 'ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  for (const ca of ['ca', 'other-ca']) ssl('req', '-x509', ...ec, '-keyout', `${ca}.key`, '-out', `${ca}.crt`, '-subj', `/CN=${ca}`, '-days', '2');
  for (const [name, ca] of [
    ['server', 'ca'],
    ['client', 'ca'],
    ['other', 'other-ca'],
  ] as const) {
    ssl('req', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${name}`);
    ssl('x509', '-req', '-in', `${name}.csr`, '-CA', `${ca}.crt`, '-CAkey', `${ca}.key`, '-CAcreateserial', '-out', `${name}.crt`, '-days', '2', '-extfile', 'ext');
  }
  const read = (f: string): Promise<string> => readFile(join(dir, f), 'utf8');
  return {
    dir,
    ca: await read('ca.crt'),
    serverCert: await read('server.crt'),
    serverKey: await read('server.key'),
    clientCert: await read('client.crt'),
    clientKey: await read('client.key'),
    otherCert: await read('other.crt'),
    otherKey: await read('other.key'),
  };
}
