// Backing image files over gRPC: RemoteDataEngine against DataEngineGrpcServer over a
// LocalDataEngine with the real addon. Every call (a 64 MiB streamed write and read among
// them), the backing-image-file events on the watch stream, createReplica's backingImage and
// HostedReplicaInfo.backingImage across the wire, resume after a broken upload, the reader
// limit, and hostile input (garbage, lying sizes, oversized messages) answered with codes.
import { createHash, randomUUID } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client, Metadata, credentials, type ServiceError } from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import type { DataEngineEvent } from '../../../src/data-engine/data-engine.js';
import { copyBackingImageFile, newCopyState } from '../../../src/backing-image/copy.js';
import { eventFromMsg, eventToMsg, hostedFromMsg, hostedToMsg } from '../../../src/data-engine/grpc/codec.js';
import { DataEngineGrpcServer } from '../../../src/data-engine/grpc/data-engine-grpc-server.js';
import { DATA_ENGINE_PROTO } from '../../../src/data-engine/grpc/data-engine-proto.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { MooringError } from '../../../src/errors.js';
import type { NativeAddon } from '../../../src/native/binding.js';
import { loadAddon } from '../../../src/native/load.js';
import { MiB, chunks as chunksOf, collect, errorOf, rawImage, sha } from '../backing-image/helpers.js';

const SERVICE = '/mooring.dataengine.v1.DataEngine';
const root = protobuf.parse(DATA_ENGINE_PROTO, { keepCase: false }).root;
const encode = (type: string, v: object): Buffer => Buffer.from(root.lookupType(`mooring.dataengine.v1.${type}`).encode(v).finish());
/** 4 MiB chunks: larger than a gRPC message, so the client splits them. */
const chunks = (b: Buffer, size = 4 * MiB): AsyncGenerator<Uint8Array> => chunksOf(b, size);

const codeOfError = (e: ServiceError): string | undefined => e.metadata?.get('mooring-code')[0] as string | undefined;

describe('backing image files over gRPC', () => {
  let dir: string;
  let local: LocalDataEngine;
  let server: DataEngineGrpcServer;
  let remote: RemoteDataEngine;
  let target: string;
  let http: Server | undefined;

  async function setup(addon: NativeAddon = loadAddon()): Promise<void> {
    local = await LocalDataEngine.start({ dir: join(dir, 'de'), hostId: 'h1', addon, replicaListen: null, backingImageDownload: { retryFirstDelayMs: 10 } });
    server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${join(dir, 'de.sock')}` });
    remote = await RemoteDataEngine.connect({ address: server.address });
    target = `unix://${join(dir, 'de.sock')}`;
  }

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'mooring-grpc-bif-'));
  });
  afterEach(async () => {
    await remote?.close();
    await server?.close();
    await local?.close();
    if (http) await new Promise((r) => http!.close(r));
    http = undefined;
    await rm(dir, { recursive: true, force: true });
  });

  it('streams a 64 MiB write and read, and carries every call and the events', async () => {
    await setup();
    const events: DataEngineEvent[] = [];
    remote.watch((e) => events.push(e));
    await new Promise((r) => setTimeout(r, 100)); // the watch stream is open
    const body = rawImage(64 * MiB);
    const ref = { name: 'big', uuid: randomUUID() };
    let t0 = performance.now();
    const written = await remote.writeBackingImageFile(ref, { sizeBytes: body.length, expectedChecksum: sha(body) }, chunks(body));
    const writeMs = performance.now() - t0;
    expect(written).toMatchObject({ ...ref, state: 'ready', progress: 100, sizeBytes: body.length, receivedBytes: body.length, checksum: sha(body), format: 'raw', virtualSizeBytes: body.length, usedBy: [] });
    t0 = performance.now();
    let n = 0;
    const hash = createHash('sha512');
    for await (const c of remote.readBackingImageFile(ref)) {
      expect(c.length).toBeLessThanOrEqual(MiB);
      hash.update(c);
      n += c.length;
    }
    const readMs = performance.now() - t0;
    expect(n).toBe(body.length);
    expect(hash.digest('hex')).toBe(sha(body));
    console.log(`gRPC 64 MiB: write+verify ${writeMs.toFixed(0)} ms (${((64 / writeMs) * 1000).toFixed(0)} MiB/s), read ${readMs.toFixed(0)} ms (${((64 / readMs) * 1000).toFixed(0)} MiB/s)`);
    expect((await collect(remote.readBackingImageFile(ref, { offset: 63 * MiB + 5 }))).equals(body.subarray(63 * MiB + 5))).toBe(true);

    // A ready file is reused: the data engine answers at once and the client stops sending.
    t0 = performance.now();
    expect(await remote.writeBackingImageFile(ref, { sizeBytes: body.length }, chunks(body, MiB))).toEqual(written);
    expect(performance.now() - t0).toBeLessThan(writeMs);
    expect(await remote.listBackingImageFiles()).toEqual(await local.listBackingImageFiles());
    expect(await remote.backingImageFile(ref)).toEqual(written);
    expect(await remote.backingImageFile({ name: 'none', uuid: randomUUID() })).toBeNull();

    // Download, through the data engine's host.
    const small = rawImage(3 * MiB);
    http = createServer((_req, res) => {
      res.writeHead(200, { 'content-length': small.length });
      res.end(small);
    });
    await new Promise<void>((r) => http!.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/x`;
    const dref = { name: 'dl', uuid: randomUUID() };
    expect(await remote.downloadBackingImageFile(dref, { url, expectedChecksum: sha(small), startTimeoutMs: 5000, retries: 0 })).toMatchObject({ state: 'ready', checksum: sha(small) });
    const bad = await errorOf(remote.downloadBackingImageFile({ name: 'dl2', uuid: randomUUID() }, { url, expectedChecksum: sha(body) }));
    expect(bad.code).toBe('CHECKSUM_MISMATCH');
    expect(bad.message).toContain(sha(small));
    expect((await errorOf(remote.downloadBackingImageFile({ name: 'dl3', uuid: randomUUID() }, { url: url.replace('/x', '/y').replace(/:\d+\//, ':1/') , retries: 0 }))).code).toBe('DOWNLOAD_FAILED');

    // Export from a snapshot of a volume whose engine runs there.
    await remote.createReplica('v-r0', 4 * MiB);
    await remote.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'v-r0', address: null }], epoch: 1 });
    await remote.createSnapshot('v', 's1');
    const eref = { name: 'exp', uuid: randomUUID() };
    expect(await remote.exportSnapshotToBackingImageFile('v', 's1', eref, { expectedChecksum: sha(Buffer.alloc(4 * MiB)) })).toMatchObject({ state: 'ready', sizeBytes: 4 * MiB, format: 'raw' });

    // createReplica's backingImage crosses the wire, and comes back in the replica's info.
    const bi = { dir: `exp-${eref.uuid}`, format: 'raw' as const, virtualSizeBytes: 4 * MiB };
    expect((await remote.createReplica('r-bi', 4 * MiB, { backingImage: bi })).backingImage).toEqual(bi);
    expect((await remote.listReplicas()).find((r) => r.name === 'r-bi')?.backingImage).toEqual(bi);
    expect((await errorOf(remote.createReplica('r-bi', 4 * MiB, { backingImage: { ...bi, dir: `nope-${randomUUID()}` } }))).code).toBe('NOT_FOUND');
    expect((await errorOf(remote.createReplica('r-bi', 4 * MiB, { backingImage: { ...bi, format: 'vmdk' as 'raw' } }))).code).toBe('INVALID_ARGUMENT');
    expect((await errorOf(remote.createReplica('r-bi', 4 * MiB, { backingImage: { ...bi, virtualSizeBytes: 8 * MiB } }))).code).toBe('INVALID_ARGUMENT');

    // Cancel (nothing running: a no-op) and delete.
    await remote.cancelBackingImageFile(dref);
    await remote.deleteBackingImageFile(dref);
    expect(await remote.backingImageFile(dref)).toBeNull();

    await expect.poll(() => events.filter((e) => e.type === 'backing-image-file' && e.name === 'exp' && e.state === 'ready').length, { timeout: 5000 }).toBe(1);
    const bigEvents = events.filter((e): e is Extract<DataEngineEvent, { type: 'backing-image-file' }> => e.type === 'backing-image-file' && e.name === 'big');
    expect(bigEvents.slice(0, 2).map((e) => e.state)).toEqual(['pending', 'starting']);
    expect(bigEvents[0]).toMatchObject({ uuid: ref.uuid, progress: 0 });
    expect(bigEvents.at(-1)).toEqual({ type: 'backing-image-file', ...ref, state: 'ready', progress: 100, message: '', sizeBytes: body.length, receivedBytes: body.length, checksum: sha(body), format: 'raw', virtualSizeBytes: body.length });
    const progress = bigEvents.filter((e) => e.state === 'in-progress').map((e) => e.progress);
    expect(progress.length).toBeGreaterThan(3);
    expect(progress.length).toBeLessThanOrEqual(102);
  });

  it('copies a file from one data engine to another (read there, write here), resuming a broken copy', async () => {
    await setup();
    const body = rawImage(20 * MiB);
    const ref = { name: 'src', uuid: randomUUID() };
    await remote.writeBackingImageFile(ref, { sizeBytes: body.length, expectedChecksum: sha(body) }, chunks(body));
    const other = await LocalDataEngine.start({ dir: join(dir, 'de2'), hostId: 'h2', addon: loadAddon(), replicaListen: null });
    try {
      // The copy breaks after 7 MiB (the receiving side stops reading the sender's stream).
      async function* firstPart(): AsyncGenerator<Uint8Array> {
        let n = 0;
        for await (const c of remote.readBackingImageFile(ref)) {
          yield c;
          n += c.length;
          if (n >= 7 * MiB) throw new MooringError('UNAVAILABLE', 'link to h1 lost');
        }
      }
      expect((await errorOf(other.writeBackingImageFile(ref, { sizeBytes: body.length, expectedChecksum: sha(body) }, firstPart()))).code).toBe('UNAVAILABLE');
      const partial = (await other.backingImageFile(ref))!;
      expect(partial).toMatchObject({ state: 'failed', receivedBytes: 7 * MiB });
      const info = await other.writeBackingImageFile(
        ref,
        { sizeBytes: body.length, offset: partial.receivedBytes, expectedChecksum: sha(body) },
        remote.readBackingImageFile(ref, { offset: partial.receivedBytes }),
      );
      expect(info).toMatchObject({ state: 'ready', checksum: sha(body), format: 'raw' });
      // The sender's places are all free again.
      expect((await collect(remote.readBackingImageFile(ref))).length).toBe(body.length);
    } finally {
      await other.close();
    }
  });

  it('docs/data-engine.md shows the service exactly as the code defines it', async () => {
    const doc = await readFile(join(__dirname, '../../../docs/data-engine.md'), 'utf8');
    expect(doc).toContain('```proto\n' + DATA_ENGINE_PROTO + '```');
  });

  it('HostedReplicaInfo.backingImage and the event cross the codec intact', () => {
    const hosted = { name: 'r', sizeBytes: MiB, epoch: 1, clean: true, rebuilding: false, allocatedBytes: 0, inUse: false, backingImage: { dir: `a-${randomUUID()}`, format: 'qcow2' as const, virtualSizeBytes: 512 } };
    const wire = (type: string, m: object): Record<string, unknown> => root.lookupType(`mooring.dataengine.v1.${type}`).toObject(root.lookupType(`mooring.dataengine.v1.${type}`).decode(encode(type, m)), { longs: Number, defaults: true });
    expect(hostedFromMsg(wire('HostedReplica', hostedToMsg(hosted)))).toEqual(hosted);
    expect(hostedFromMsg(wire('HostedReplica', hostedToMsg({ ...hosted, backingImage: null })))).toEqual({ ...hosted, backingImage: null });
    const e: DataEngineEvent = { type: 'backing-image-file', name: 'a', uuid: randomUUID(), state: 'failed', progress: 40, message: 'CANCELLED: x', sizeBytes: 10, receivedBytes: 4, checksum: '', format: null, virtualSizeBytes: 0 };
    expect(eventFromMsg(wire('Event', eventToMsg(e)))).toEqual(e);
  });

  it('a broken upload keeps its partial file and resumes at its offset; at most 3 reads of one file', async () => {
    await setup();
    const body = rawImage(8 * MiB);
    const ref = { name: 'up', uuid: randomUUID() };
    async function* breaks(): AsyncGenerator<Uint8Array> {
      yield body.subarray(0, 3 * MiB);
      // Once those bytes are on the data engine's disk, the source breaks.
      for (let i = 0; i < 500 && (await local.backingImageFile(ref))?.receivedBytes !== 3 * MiB; i++) await new Promise((r) => setTimeout(r, 10));
      throw new MooringError('UNAVAILABLE', 'the source data engine went away');
    }
    const e = await errorOf(remote.writeBackingImageFile(ref, { sizeBytes: body.length }, breaks()));
    expect(e.message).toMatch(/went away/);
    await expect.poll(async () => (await remote.backingImageFile(ref))?.state, { timeout: 5000 }).toBe('failed');
    const partial = (await remote.backingImageFile(ref))!;
    expect(partial.receivedBytes).toBe(3 * MiB);
    expect((await errorOf(remote.writeBackingImageFile(ref, { sizeBytes: body.length, offset: MiB }, chunks(body.subarray(MiB))))).code).toBe('INVALID_ARGUMENT');
    // A stream that simply ends short: UNAVAILABLE, resumable.
    const short = await errorOf(remote.writeBackingImageFile(ref, { sizeBytes: body.length, offset: 3 * MiB }, chunks(body.subarray(3 * MiB, 5 * MiB))));
    expect(short.code).toBe('UNAVAILABLE');
    expect((await remote.backingImageFile(ref))!.receivedBytes).toBe(5 * MiB);
    expect(await remote.writeBackingImageFile(ref, { sizeBytes: body.length, offset: 5 * MiB, expectedChecksum: sha(body) }, chunks(body.subarray(5 * MiB)))).toMatchObject({ state: 'ready', checksum: sha(body) });

    // Three readers hold the file; a fourth is BUSY; a reader that stops early frees its place.
    // (The file is larger than what a stream buffers, so the readers are still reading.)
    const big = rawImage(48 * MiB);
    const bigRef = { name: 'big', uuid: randomUUID() };
    await remote.writeBackingImageFile(bigRef, { sizeBytes: big.length }, chunks(big));
    const readers = [0, 1, 2].map(() => remote.readBackingImageFile(bigRef)[Symbol.asyncIterator]());
    for (const r of readers) expect((await r.next()).done).toBe(false);
    expect((await errorOf(collect(remote.readBackingImageFile(bigRef)))).code).toBe('BUSY');
    await readers[0]!.return!(undefined);
    await expect.poll(async () => (await collect(remote.readBackingImageFile(bigRef)).catch(() => Buffer.alloc(0))).length, { timeout: 5000 }).toBe(big.length);
    for (const r of readers.slice(1)) await r.return!(undefined);
    expect((await errorOf(collect(remote.readBackingImageFile({ name: 'none', uuid: randomUUID() })))).code).toBe('NOT_FOUND');
  });

  it('answers hostile requests with coded errors and keeps serving', async () => {
    await setup();
    const client = new Client(target, credentials.createInsecure(), { 'grpc.max_send_message_length': 64 * MiB });
    const unary = (method: string, body: Buffer): Promise<ServiceError | Buffer> =>
      new Promise((res) => client.makeUnaryRequest(`${SERVICE}/${method}`, (b: Buffer) => b, (b: Buffer) => b, body, new Metadata(), { deadline: Date.now() + 10_000 }, (err, reply) => res(err ?? reply!)));
    const uuid = randomUUID();
    // Garbage may fail to decode (PROTOCOL_ERROR) or decode into nonsense (INVALID_ARGUMENT).
    const GARBAGE = 'PROTOCOL_ERROR|INVALID_ARGUMENT';
    const cases: Array<[string, Buffer, string]> = [
      ['GetBackingImageFile', Buffer.from([0x0a, 0xff, 0xff, 0x01, 0x41]), GARBAGE],
      ['DownloadBackingImageFile', Buffer.alloc(32, 0xff), GARBAGE],
      ['DownloadBackingImageFile', encode('DownloadBackingImageFileRequest', { url: 'http://x/' }), 'INVALID_ARGUMENT'],
      ['DownloadBackingImageFile', encode('DownloadBackingImageFileRequest', { ref: { name: '../../etc', uuid }, url: 'http://x/' }), 'INVALID_ARGUMENT'],
      ['DownloadBackingImageFile', encode('DownloadBackingImageFileRequest', { ref: { name: 'a', uuid: '../..' }, url: 'http://x/' }), 'INVALID_ARGUMENT'],
      ['DownloadBackingImageFile', encode('DownloadBackingImageFileRequest', { ref: { name: 'a', uuid }, url: 'file:///etc/shadow' }), 'INVALID_ARGUMENT'],
      ['DownloadBackingImageFile', encode('DownloadBackingImageFileRequest', { ref: { name: 'a', uuid }, url: 'http://x/', expectedChecksum: 'zz' }), 'INVALID_ARGUMENT'],
      ['DeleteBackingImageFile', encode('BackingImageFileRef', { name: '..', uuid }), 'INVALID_ARGUMENT'],
      ['CancelBackingImageFile', encode('BackingImageFileRef', { name: 'a/b', uuid }), 'INVALID_ARGUMENT'],
      ['ExportSnapshotToBackingImageFile', encode('ExportSnapshotToBackingImageFileRequest', { volume: 'v', snapshot: 's', ref: { name: 'a', uuid: 'x' } }), 'INVALID_ARGUMENT'],
      ['CreateReplica', encode('CreateReplicaRequest', { name: 'r', sizeBytes: MiB, backingImage: { dir: '../../../etc', format: 'raw', virtualSizeBytes: 1 } }), 'INVALID_ARGUMENT'],
    ];
    for (const [method, body, code] of cases) {
      const reply = await unary(method, body);
      expect(reply, method).not.toBeInstanceOf(Buffer);
      expect(code.split('|'), `${method} ${body.toString('hex').slice(0, 40)}`).toContain(codeOfError(reply as ServiceError));
    }
    // Client-streaming write: garbage, lying sizes, more bytes than declared, an oversized data message.
    const stream = (messages: Buffer[]): Promise<ServiceError | Buffer> =>
      new Promise((res) => {
        const call = client.makeClientStreamRequest(`${SERVICE}/WriteBackingImageFile`, (b: Buffer) => b, (b: Buffer) => b, new Metadata(), { deadline: Date.now() + 10_000 }, (err, reply) => res(err ?? reply!));
        for (const m of messages) call.write(m);
        call.end();
      });
    const head = (extra: object): Buffer => encode('WriteBackingImageFileMessage', { ref: { name: 'w', uuid }, sizeBytes: MiB, ...extra });
    const data = (n: number): Buffer => encode('WriteBackingImageFileMessage', { data: Buffer.alloc(n, 1) });
    const writes: Array<[string, Buffer[], string]> = [
      ['garbage first', [Buffer.alloc(16, 0xff)], GARBAGE],
      ['no message', [], 'INVALID_ARGUMENT'],
      ['no ref', [encode('WriteBackingImageFileMessage', { sizeBytes: 10 })], 'INVALID_ARGUMENT'],
      ['size 2^60', [head({ sizeBytes: 2 ** 60 })], 'INVALID_ARGUMENT'],
      ['size 0', [head({ sizeBytes: 0 })], 'INVALID_ARGUMENT'],
      ['offset beyond the partial', [head({ offset: 4096 })], 'INVALID_ARGUMENT'],
      ['more than declared', [head({}), data(MiB), data(10)], 'INVALID_ARGUMENT'],
      ['garbage later', [head({}), data(10), Buffer.alloc(8, 0xff)], 'PROTOCOL_ERROR|INVALID_ARGUMENT|UNAVAILABLE'],
      ['2 MiB message', [head({}), data(2 * MiB)], 'INVALID_ARGUMENT'],
      ['ends early', [head({}), data(100)], 'UNAVAILABLE'],
    ];
    for (const [what, messages, code] of writes) {
      const reply = await stream(messages);
      expect(reply, what).not.toBeInstanceOf(Buffer);
      expect(code.split('|'), what).toContain(codeOfError(reply as ServiceError));
    }
    // Server-streaming read with garbage.
    const readErr = await new Promise<ServiceError>((res) => {
      const call = client.makeServerStreamRequest(`${SERVICE}/ReadBackingImageFile`, (b: Buffer) => b, (b: Buffer) => b, Buffer.alloc(20, 0xff), new Metadata(), { deadline: Date.now() + 10_000 });
      call.on('data', () => undefined);
      call.on('error', (e: ServiceError) => res(e));
    });
    expect(GARBAGE.split('|')).toContain(codeOfError(readErr));
    client.close();
    // Still serving.
    expect((await remote.info()).hostId).toBe('h1');
    expect((await remote.listBackingImageFiles()).map((f) => f.name)).toEqual(['w']);
  });
});

// Version negotiation of the direct copy over the real service: a data engine whose server
// does not know PullBackingImageFile (as an earlier release; here an engine without the call,
// so the server leaves the method out) answers UNIMPLEMENTED, RemoteDataEngine reports it
// as UNSUPPORTED with details.unimplemented, and the controller's copy relays instead; a
// data engine that knows it pulls from the other one itself.
describe('PullBackingImageFile over gRPC', () => {
  let dir: string;
  const closers: Array<() => Promise<void>> = [];
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'mooring-grpc-pull-'));
  });
  afterEach(async () => {
    for (const c of closers.splice(0).reverse()) await c().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  });

  async function host(id: string, withPull: boolean): Promise<RemoteDataEngine> {
    const local = await LocalDataEngine.start({ dir: join(dir, id), hostId: id, addon: loadAddon(), replicaListen: null });
    closers.push(() => local.close());
    // Functions bound to the engine (its private fields), the pull left out when asked.
    const engine = withPull
      ? local
      : (new Proxy(local, {
          get: (t, p) => {
            if (p === 'pullBackingImageFile') return undefined;
            const v = Reflect.get(t, p, t) as unknown;
            return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
          },
        }) as LocalDataEngine);
    const server = await DataEngineGrpcServer.start({ engine, listen: `unix:${join(dir, `${id}.sock`)}` });
    closers.push(() => server.close());
    const remote = await RemoteDataEngine.connect({ address: server.address });
    closers.push(() => remote.close());
    return remote;
  }

  it('an engine without the call answers UNIMPLEMENTED (UNSUPPORTED, details.unimplemented) and the copy relays; one with it pulls', async () => {
    const src = await host('s', true);
    const old = await host('old', false);
    const neu = await host('new', true);
    const body = rawImage(6 * MiB);
    const ref = { name: 'neg', uuid: randomUUID() };
    const opts = { sizeBytes: body.length, offset: 0, expectedChecksum: sha(body) };
    await src.writeBackingImageFile(ref, opts, chunks(body));

    const e = await errorOf(old.pullBackingImageFile(ref, { ...opts, source: { address: src.address, hostId: 's' } }));
    expect(e.code).toBe('UNSUPPORTED');
    expect(e.details).toEqual({ unimplemented: 'PullBackingImageFile' });
    expect(await old.backingImageFile(ref)).toBeNull();

    const state = newCopyState();
    const relayed = await copyBackingImageFile(state, { engine: src, hostId: 's' }, old, ref, opts);
    expect(relayed.path).toBe('relay');
    expect(relayed.info).toMatchObject({ state: 'ready', checksum: sha(body) });
    expect(state.relayedBytes).toBe(body.length);

    const pulled = await copyBackingImageFile(state, { engine: src, hostId: 's' }, neu, ref, opts);
    expect(pulled.path).toBe('pull');
    expect(pulled.info).toMatchObject({ state: 'ready', checksum: sha(body) });
    expect(state.relayedBytes).toBe(body.length);
    expect((await collect(neu.readBackingImageFile(ref))).equals(body)).toBe(true);
  });

  it('a source that stops sending mid-file fails the pull UNAVAILABLE after the stall timeout; the pull resumes from the partial file', async () => {
    const srcLocal = await LocalDataEngine.start({ dir: join(dir, 's'), hostId: 's', addon: loadAddon(), replicaListen: null });
    closers.push(() => srcLocal.close());
    let stall = true;
    // The source's reads, stalled after 1 MiB while `stall` is set: alive, answering PINGs,
    // sending nothing (a stuck disk), until the call is cancelled.
    const engine = new Proxy(srcLocal, {
      get: (t, p) => {
        if (p === 'readBackingImageFile' && stall) {
          return async function* (r: unknown, o: { offset?: number }): AsyncGenerator<Uint8Array> {
            const it = t.readBackingImageFile(r as never, o)[Symbol.asyncIterator]();
            let sent = 0;
            for (;;) {
              const n = await it.next();
              if (n.done) return;
              yield n.value;
              sent += n.value.length;
              if (sent >= MiB) await new Promise(() => undefined);
            }
          };
        }
        const v = Reflect.get(t, p, t) as unknown;
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
      },
    }) as LocalDataEngine;
    const server = await DataEngineGrpcServer.start({ engine, listen: `unix:${join(dir, 's.sock')}` });
    closers.push(() => server.close());
    const target = await LocalDataEngine.start({ dir: join(dir, 't'), hostId: 't', addon: loadAddon(), replicaListen: null, backingImageDownload: { stallTimeoutMs: 500 } });
    closers.push(() => target.close());
    const body = rawImage(8 * MiB);
    const ref = { name: 'stall', uuid: randomUUID() };
    const opts = { sizeBytes: body.length, offset: 0, expectedChecksum: sha(body) };
    await srcLocal.writeBackingImageFile(ref, opts, chunks(body));
    const source = { address: server.address, hostId: 's' };

    const t0 = Date.now();
    const guard = new Promise<never>((_, rej) => setTimeout(() => rej(new Error('the pull from a stalled source was still waiting after 20 s')), 20_000));
    const e = await Promise.race([errorOf(target.pullBackingImageFile(ref, { ...opts, source })), guard]);
    expect(e.code).toBe('UNAVAILABLE');
    expect(e.message).toMatch(/ReadBackingImageFile sent nothing for 500 ms/);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(500);
    const partial = await target.backingImageFile(ref);
    expect(partial?.state).not.toBe('ready');
    expect(partial?.receivedBytes).toBeGreaterThanOrEqual(MiB);
    expect(partial?.receivedBytes).toBeLessThan(body.length);

    stall = false;
    const done = await target.pullBackingImageFile(ref, { ...opts, offset: partial!.receivedBytes, source });
    expect(done).toMatchObject({ state: 'ready', checksum: sha(body) });
    expect((await collect(target.readBackingImageFile(ref))).equals(body)).toBe(true);
    const remote = await RemoteDataEngine.connect({ address: server.address });
    closers.push(() => remote.close());
    expect((await errorOf(collect(remote.readBackingImageFile(ref, { stallTimeoutMs: 5 })))).code).toBe('INVALID_ARGUMENT');
  });
});
