// EtcdStateStore against a real etcd (Debian etcd-server, started here on loopback with a
// temporary data directory; ports 28210-28219): the StateStore contract, writers on two
// clients racing, watches across clients, etcd killed and started again mid-use, user and
// password auth, and TLS with client certificates.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { Etcd3 } from 'etcd3';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';

import { MooringError } from '../../src/errors.js';
import { EtcdStateStore } from '../../src/state/etcd-state-store.js';
import type { StateChange } from '../../src/state/state-store.js';
import { codeOf } from '../helpers/codes.js';
import { EtcdServer } from '../../src/bench/etcd-server.js';
import { makePki, type TestPki } from '../native/remote-helpers.js';
import { stateStoreContract } from '../unit/state/state-store-contract.js';

let server: EtcdServer;
let prefixes = 0;
const opened: EtcdStateStore[] = [];
// A store of its own prefix, so tests do not see each other's documents.
async function open(options: { timeoutMs?: number; prefix?: string } = {}): Promise<EtcdStateStore> {
  const s = await EtcdStateStore.open({ endpoints: [server.endpoint], prefix: options.prefix ?? `/t${++prefixes}/`, ...(options.timeoutMs ? { timeoutMs: options.timeoutMs } : {}) });
  opened.push(s);
  return s;
}

beforeAll(async () => {
  server = await EtcdServer.start(28210, 28211);
});
afterAll(async () => {
  await server?.destroy();
});
afterEach(async () => {
  await Promise.allSettled(opened.splice(0).map((s) => s.close()));
});

stateStoreContract('EtcdStateStore', () => open());

describe('EtcdStateStore (etcd)', () => {
  it('keeps documents as PREFIX<kind>/<key> with their JSON text, version = etcd version', async () => {
    const s = await open({ prefix: '/layout/' });
    await s.put('volume', 'disk-0', { sizeBytes: 4096 });
    await s.put('volume', 'disk-0', { sizeBytes: 8192 });
    const raw = new Etcd3({ hosts: server.endpoint });
    try {
      expect(await raw.get('/layout/volume/disk-0').string()).toBe('{"sizeBytes":8192}');
      // Another program's keys under the prefix that are no document keys are left alone.
      await raw.put('/layout/volume/a/b').value('{}');
      expect((await s.list('volume')).map((d) => [d.key, d.version])).toEqual([['disk-0', 2]]);
      await raw.put('/layout/volume/bad').value('{"half":');
      expect(await codeOf(s.get('volume', 'bad'))).toBe('CORRUPT_METADATA');
      expect(await codeOf(s.list('volume'))).toBe('CORRUPT_METADATA');
      await s.delete('volume', 'bad');
    } finally {
      raw.close();
    }
    // A second client sees the same documents and versions.
    const other = await open({ prefix: '/layout/' });
    expect(await other.get('volume', 'disk-0')).toEqual({ kind: 'volume', key: 'disk-0', version: 2, value: { sizeBytes: 8192 } });
  });

  it('lists more documents than one page, in key order, each once', async () => {
    const s = await open();
    const keys = Array.from({ length: 53 }, (_, i) => `vol-${String(i).padStart(3, '0')}`);
    const big = 'x'.repeat(200_000);
    for (const k of [...keys].reverse()) await s.put('volume', k, { k, big });
    const list = await s.list<{ k: string; big: string }>('volume');
    expect(list.map((d) => d.key)).toEqual(keys);
    expect(list.every((d) => d.value.k === d.key && d.value.big === big)).toBe(true);
    expect((await s.list('volume', { prefix: 'vol-04' })).map((d) => d.key)).toEqual(keys.slice(40, 50));
  });

  it('writers on two clients: compare-and-set has one winner, retried increments are all kept', async () => {
    const a = await open({ prefix: '/race/' });
    const b = await open({ prefix: '/race/' });
    await a.put('counter', 'c', 0);
    const worker = async (s: EtcdStateStore): Promise<void> => {
      for (let n = 0; n < 25; ) {
        const cur = (await s.get<number>('counter', 'c'))!;
        try {
          await s.put('counter', 'c', cur.value + 1, { expectedVersion: cur.version });
          n++;
        } catch (err) {
          if ((err as MooringError).code !== 'CONFLICT') throw err;
        }
      }
    };
    await Promise.all([worker(a), worker(b), worker(a), worker(b)]);
    const end = (await b.get<number>('counter', 'c'))!;
    expect(end.value).toBe(100);
    expect(end.version).toBe(101);
    const results = await Promise.allSettled([a, b, a, b].map((s, i) => s.put('counter', 'c', -i, { expectedVersion: 101 })));
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect((r.reason as MooringError).code).toBe('CONFLICT');
  });

  it('a watch hears the writes of another client', async () => {
    const a = await open({ prefix: '/watch/' });
    const b = await open({ prefix: '/watch/' });
    const seen: Array<StateChange<unknown>> = [];
    await a.watch('volume', (c) => seen.push(c));
    await b.put('volume', 'v', 1);
    await b.put('volume', 'v', 2);
    await b.delete('volume', 'v');
    await vi.waitFor(() => expect(seen.map((c) => (c.type === 'put' ? `put ${c.key}@${c.version}=${String(c.value)}` : `${c.type}`))).toEqual(['put v@1=1', 'put v@2=2', 'delete']), {
      timeout: 10_000,
      interval: 20,
    });
  });

  it('no etcd at the endpoint: open is UNAVAILABLE within the timeout, naming the endpoint', async () => {
    const err = await EtcdStateStore.open({ endpoints: ['http://127.0.0.1:28219'], timeoutMs: 500 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(MooringError);
    expect((err as MooringError).code).toBe('UNAVAILABLE');
    expect((err as MooringError).message).toContain('127.0.0.1:28219');
  });

  it('bad options are INVALID_ARGUMENT', async () => {
    for (const bad of [
      {},
      { endpoints: [] },
      { endpoints: ['ftp://x:1'] },
      { endpoints: ['127.0.0.1'] },
      { endpoints: ['127.0.0.1:99999'] },
      { endpoints: ['https://127.0.0.1:2379'] },
      { endpoints: ['127.0.0.1:2379'], prefix: '' },
      { endpoints: ['127.0.0.1:2379'], prefix: 'has space' },
      { endpoints: ['127.0.0.1:2379'], timeoutMs: 0 },
      { endpoints: ['127.0.0.1:2379'], auth: { username: '', password: 'x' } },
      { endpoints: ['127.0.0.1:2379'], tls: { ca: '' } },
      { endpoints: ['127.0.0.1:2379'], tls: { ca: 'x', cert: 'y' } },
    ]) {
      expect(await codeOf(EtcdStateStore.open(bad as never)), JSON.stringify(bad)).toBe('INVALID_ARGUMENT');
    }
  });

  it('etcd killed mid-use: calls fail UNAVAILABLE or wait; after the restart they succeed and a watch resyncs and resumes', async () => {
    const s = await open({ timeoutMs: 1000, prefix: '/restart/' });
    const patient = await open({ timeoutMs: 60_000, prefix: '/restart/' });
    await s.put('volume', 'v', { n: 1 });
    const seen: Array<StateChange<unknown>> = [];
    await s.watch('volume', (c) => seen.push(c));
    await server.kill();
    expect(await codeOf(s.get('volume', 'v'))).toBe('UNAVAILABLE');
    const err = await s.put('volume', 'v', { n: 2 }, { expectedVersion: 1 }).catch((e: unknown) => e);
    expect((err as MooringError).code).toBe('UNAVAILABLE');
    expect((err as MooringError).message).toContain(server.endpoint);
    // A call with a long timeout waits for etcd to come back.
    const waiting = patient.put('volume', 'v', { n: 3 }, { expectedVersion: 1 });
    await server.restart();
    expect((await waiting).version).toBe(2);
    expect(await s.get('volume', 'v')).toEqual({ kind: 'volume', key: 'v', version: 2, value: { n: 3 } });
    await s.put('volume', 'w', { n: 4 });
    await vi.waitFor(() => expect(seen.filter((c) => c.type === 'put').map((c) => (c as { key: string }).key)).toEqual(['v', 'w']), { timeout: 30_000, interval: 50 });
    expect(seen.some((c) => c.type === 'resync')).toBe(true);
  });

  it('a watch whose revisions etcd compacted while it was cut off starts again, resyncs and goes on', async () => {
    const s = await open({ prefix: '/compact/' });
    const seen: Array<StateChange<unknown>> = [];
    await s.watch('volume', (c) => seen.push(c));
    await s.put('volume', 'a', 1);
    await vi.waitFor(() => expect(seen).toHaveLength(1), { timeout: 10_000, interval: 20 });
    // etcd comes back where the store cannot reach it, takes writes and compacts them away.
    await server.kill();
    await server.restart(28218);
    const raw = new Etcd3({ hosts: server.endpointOn(28218) });
    try {
      await raw.put('/compact/volume/b').value('2');
      const res = await raw.kv.put({ key: Buffer.from('/compact/volume/c'), value: Buffer.from('3') });
      await raw.kv.compact({ revision: res.header.revision, physical: true });
    } finally {
      raw.close();
    }
    await server.kill();
    await server.restart();
    await vi.waitFor(() => expect(seen.some((c) => c.type === 'resync')).toBe(true), { timeout: 30_000, interval: 50 });
    await s.put('volume', 'd', 4);
    await vi.waitFor(() => expect(seen.at(-1)).toMatchObject({ type: 'put', key: 'd', version: 1, value: 4 }), { timeout: 30_000, interval: 50 });
    expect(seen.filter((c) => c.type === 'put').map((c) => (c as { key: string }).key)).toEqual(['a', 'd']);
    expect((await s.list('volume')).map((d) => d.key)).toEqual(['a', 'b', 'c', 'd']);
  });
});

describe('EtcdStateStore with user and password', () => {
  let authServer: EtcdServer;
  beforeAll(async () => {
    authServer = await EtcdServer.start(28214, 28215);
    await authServer.enableAuth('root-secret', 'mooring', 'app-secret', '/app/');
  });
  afterAll(async () => {
    await authServer?.destroy();
  });

  it('works with the right password; a wrong one is UNAUTHENTICATED; keys outside the role are PERMISSION_DENIED', async () => {
    const s = await EtcdStateStore.open({ endpoints: [authServer.endpoint], prefix: '/app/', auth: { username: 'mooring', password: 'app-secret' } });
    try {
      await s.put('volume', 'v', 1);
      expect((await s.get('volume', 'v'))!.value).toBe(1);
    } finally {
      await s.close();
    }
    expect(await codeOf(EtcdStateStore.open({ endpoints: [authServer.endpoint], prefix: '/app/', auth: { username: 'mooring', password: 'wrong' } }))).toBe('UNAUTHENTICATED');
    expect(await codeOf(EtcdStateStore.open({ endpoints: [authServer.endpoint], prefix: '/other/', auth: { username: 'mooring', password: 'app-secret' } }))).toBe('PERMISSION_DENIED');
    expect(await codeOf(EtcdStateStore.open({ endpoints: [authServer.endpoint], prefix: '/app/' }))).toBe('UNAUTHENTICATED');
  });
});

describe('EtcdStateStore over TLS', () => {
  let tlsServer: EtcdServer;
  let pki: TestPki;
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'mooring-etcd-pki-'));
    pki = makePki(dir);
    tlsServer = await EtcdServer.start(28212, 28213, { tls: { caFile: join(dir, 'ca1.crt'), certFile: join(dir, 'server.crt'), keyFile: join(dir, 'server.key'), clientCertAuth: true } });
  });
  afterAll(async () => {
    await tlsServer?.destroy();
    await rm(dir, { recursive: true, force: true });
  });

  it('works with the CA and a client certificate; without the certificate or with another CA it is UNAVAILABLE', async () => {
    const s = await EtcdStateStore.open({ endpoints: [tlsServer.endpoint], tls: { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey } });
    try {
      await s.put('volume', 'v', { tls: true });
      expect((await s.get('volume', 'v'))!.value).toEqual({ tls: true });
    } finally {
      await s.close();
    }
    expect(await codeOf(EtcdStateStore.open({ endpoints: [tlsServer.endpoint], tls: { ca: pki.ca }, timeoutMs: 1000 }))).toBe('UNAVAILABLE');
    expect(await codeOf(EtcdStateStore.open({ endpoints: [tlsServer.endpoint], tls: { ca: pki.otherCa, cert: pki.clientCert, key: pki.clientKey }, timeoutMs: 1000 }))).toBe('UNAVAILABLE');
    expect(await codeOf(EtcdStateStore.open({ endpoints: [tlsServer.endpoint.replace('https', 'http')], timeoutMs: 1000 }))).toBe('UNAVAILABLE');
  });
});
