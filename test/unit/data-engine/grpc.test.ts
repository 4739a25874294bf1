// The gRPC server and client beyond the contract: bad input of every kind (raw garbage,
// undecodable protobuf, wrong wire types, oversized messages, unknown methods) gets a coded
// error and the server keeps serving; the loopback rule; mutual TLS; deadlines; the watch
// stream reconnecting after the server comes back.
import { execFileSync, spawn } from 'node:child_process';
import { lstat, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client, Metadata, credentials, status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';

import type { DataEngine, DataEngineEvent } from '../../../src/data-engine/data-engine.js';
import { fromGrpcError } from '../../../src/data-engine/grpc/codec.js';
import { DataEngineGrpcServer, GRPC_LIMITS } from '../../../src/data-engine/grpc/data-engine-grpc-server.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { MooringError } from '../../../src/errors.js';
import { FakeAddon } from '../fakes/fake-addon.js';

const MiB = 1024 * 1024;
const SERVICE = '/mooring.dataengine.v1.DataEngine';

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(MooringError);
    return (err as MooringError).code;
  }
  return 'resolved';
}

// A raw unary call with bytes we choose, through grpc-js's generic client.
function rawCall(target: string, method: string, body: Buffer): Promise<ServiceError | Buffer> {
  const client = new Client(target, credentials.createInsecure(), { 'grpc.max_send_message_length': 64 * MiB });
  return new Promise((res) => {
    client.makeUnaryRequest(
      `${SERVICE}/${method}`,
      (b: Buffer) => b,
      (b: Buffer) => b,
      body,
      new Metadata(),
      { deadline: Date.now() + 10_000 },
      (err, reply) => {
        client.close();
        res(err ?? reply!);
      },
    );
  });
}

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
    expect(await codeOf(remote.startEngine({ volume: 'v', replicas: [{ id: 7, hostId: 'h1', name: 'r0', address: null } as never] }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(remote.startEngine(null as never))).toBe('INVALID_ARGUMENT');
    await remote.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }] });
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

  it('the watch stream reconnects when the server comes back', async () => {
    const path = join(root, 'de.sock');
    server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${path}` });
    const remote = await RemoteDataEngine.connect({ address: `unix:${path}` });
    clients.push(remote);
    const events: DataEngineEvent[] = [];
    remote.watch((e) => events.push(e));
    await local.createReplica('r0', MiB);
    const cycle = async (volume: string): Promise<void> => {
      for (let i = 0; !events.some((e) => e.type === 'engine-stopped' && e.volume === volume); i++) {
        if (i >= 200) throw new Error(`no engine-stopped for ${volume} through the watch stream`);
        await local.startEngine({ volume, replicas: [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }] });
        await local.stopEngine(volume);
        await new Promise((r) => setTimeout(r, 25));
      }
    };
    await cycle('before');
    await server.close();
    server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${path}` });
    await cycle('after');
    expect(events.filter((e) => e.type === 'epoch-claimed' && e.volume === 'after').length).toBeGreaterThan(0);
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
  const ssl = (...args: string[]): void => void execFileSync('openssl', args, { cwd: dir, stdio: 'ignore' });
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
