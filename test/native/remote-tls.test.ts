// Mutual TLS on the replica protocol, through the real addon, with certificates made by
// the openssl CLI at test time: a client with a certificate from the server's CA works
// (name checked by DNS name or IP address); a client certificate from another CA, a wrong
// server name, a plain client against a TLS server and a TLS client against a plain
// server are all refused, so the engine opens that replica as ERR; bad PEM is a coded
// error at start.
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { NativeTlsOptions } from '../../src/native/binding.js';
import { addon, codeOf, MiB, pattern, Scratch } from './helpers.js';
import { closeAll, endpoint, makePki, RawClient, RemoteFixture, startHosts, type TestPki } from './remote-helpers.js';

const SIZE = 4 * MiB;

describe('replica protocol over mutual TLS', () => {
  let s: Scratch;
  let pki: TestPki;
  let serverTls: NativeTlsOptions;
  let clientTls: NativeTlsOptions;
  const f = new RemoteFixture();
  beforeAll(() => {
    s = new Scratch('mooring-remote-tls-');
    pki = makePki(s.dir('pki'));
    serverTls = { cert: pki.serverCert, key: pki.serverKey, ca: pki.ca };
    clientTls = { cert: pki.clientCert, key: pki.clientKey, ca: pki.ca, serverName: 'replica.test' };
  });
  afterEach(() => f.reset());
  afterAll(() => s.cleanup());

  it('serves an engine whose replicas present certificates from the right CA', async () => {
    f.hosts = await startHosts(s, 3, SIZE, 'vol', serverTls);
    const eps = f.hosts.map((h, i) =>
      endpoint(h.server.port, 'vol', { tls: { ...clientTls, serverName: i === 2 ? '127.0.0.1' : 'replica.test' } }),
    );
    const engine = await f.open(eps);
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    const data = pattern(3, 5 * MiB / 2);
    await engine.write(4096, data);
    await engine.flush();
    expect((await engine.read(4096, data.length)).equals(data)).toBe(true);
    await engine.snapshot('t', {}, true);
    expect((await engine.listSnapshots()).length).toBe(2);
    await engine.close();
    for (const h of f.hosts) {
      const st = h.server.stats();
      expect(st.bytesWritten).toBeGreaterThanOrEqual(data.length);
      expect(st.protocolErrors).toBe(0);
    }
    await closeAll(f.hosts);
    for (const h of f.hosts) {
      const r = await addon().openReplica(join(h.root, 'vol'));
      try {
        expect((await r.read(4096, data.length)).equals(data)).toBe(true);
      } finally {
        await r.close();
      }
    }
  });

  it('refuses a client certificate from another CA, a wrong server name, and plain/TLS mismatches', async () => {
    f.hosts = await startHosts(s, 1, SIZE, 'vol', serverTls);
    const [plainHost] = await startHosts(s, 1, SIZE, 'vol');
    f.hosts.push(plainHost!);
    const tlsPort = f.hosts[0]!.server.port;
    // One replica per refused endpoint, so every endpoint has its own id (host:port/name).
    // Good ones too, so that the engine claims a majority of its replicas and opens.
    for (const n of ['v1', 'v2', 'v3', 'g1', 'g2', 'g3', 'g4']) await addon().createReplica(join(f.hosts[0]!.root, n), SIZE);
    const otherCa: NativeTlsOptions = { cert: pki.otherClientCert, key: pki.otherClientKey, ca: pki.ca, serverName: 'replica.test' };
    const good = ['g1', 'g2', 'g3', 'g4'].map((n) => endpoint(tlsPort, n, { tls: clientTls }));
    const engine = await f.open([
      endpoint(tlsPort, 'vol', { tls: clientTls }),
      endpoint(tlsPort, 'v1', { tls: otherCa, ioTimeoutMs: 2000 }),
      endpoint(tlsPort, 'v2', { tls: { ...clientTls, serverName: 'not-the-server.test' }, ioTimeoutMs: 2000 }),
      endpoint(tlsPort, 'v3', { ioTimeoutMs: 2000 }), // plain client, TLS server
      endpoint(plainHost!.server.port, 'vol', { tls: clientTls, ioTimeoutMs: 2000 }), // TLS client, plain server
      ...good,
    ]);
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'ERR', 'ERR', 'ERR', 'ERR', 'RW', 'RW', 'RW', 'RW']);
    await engine.write(0, pattern(1, 4096));
    expect((await engine.read(0, 4096)).equals(pattern(1, 4096))).toBe(true);
    // The TLS server saw the bad peers and counted them; it still serves a good raw check.
    expect(f.hosts[0]!.server.stats().protocolErrors).toBeGreaterThanOrEqual(2);
    // A plain client speaking the protocol to the TLS server gets nothing it can use.
    const raw = await RawClient.connect(tlsPort);
    raw.send({ op: 1, seq: 0, payload: Buffer.from('vol') });
    await raw.closed;
    expect(raw.replies).toEqual([]);
  });

  it('rejects unusable TLS material at start with a coded error', async () => {
    const root = s.dir('badtls');
    expect(await codeOf(addon().startReplicaServer({ root, tls: { cert: 'not pem', key: pki.serverKey, ca: pki.ca } }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().startReplicaServer({ root, tls: { cert: pki.serverCert, key: pki.clientKey, ca: pki.ca } }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().startReplicaServer({ root, tls: { cert: pki.serverCert, key: pki.serverKey, ca: '' } }))).toBe('INVALID_ARGUMENT');
  });
});
