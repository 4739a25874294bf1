// NBD over TLS (docs/nbd-frontend.md, "TLS"): an export given TLS material requires
// NBD_OPT_STARTTLS and a client certificate signed by its CA. Tested with QEMU's own NBD
// client (qemu-io and qemu-img with a tls-creds-x509 object), libnbd's (nbdinfo, nbdcopy with
// nbds:// URIs) and the test client; clients in the clear (told TLS is required), without a
// certificate or with one from another CA (refused in the TLS handshake) are not served; a hold answers FLUSHes through TLS; a TLS export is not handed
// off. TLS connections are read by the connection loops like the others: no thread each, and
// one that does not read its replies holds up no other.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../src/bench/nbd-client.js';
import { LocalEngine } from '../../src/engine/engine.js';
import type { NbdExport } from '../../src/nbd/nbd-export.js';
import { run } from '../system/helpers/tools.js';
import { MiB, Scratch, createReplicas, nextEpoch, pattern, threadTotal, threadsByName, waitFor, type ReplicaDir } from './helpers.js';
import { makePki, type TestPki } from './remote-helpers.js';

const SIZE = 64 * MiB;

/** A directory as QEMU's tls-creds-x509 and libnbd's tls-certificates read it. */
function credsDir(dir: string, ca: string, cert?: string, key?: string): string {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'ca-cert.pem'), ca);
  if (cert !== undefined) writeFileSync(join(dir, 'client-cert.pem'), cert);
  if (key !== undefined) writeFileSync(join(dir, 'client-key.pem'), key, { mode: 0o600 });
  return dir;
}

describe('NBD over TLS', () => {
  let s: Scratch;
  let pki: TestPki;
  let replicas: ReplicaDir[];
  let engine: LocalEngine;
  let exp: NbdExport;
  let port: number;
  let good: string;

  const qemuOpts = (dir: string): string[] => [
    '--object',
    `tls-creds-x509,id=tls0,endpoint=client,dir=${dir}`,
    '--image-opts',
    `driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=${port},tls-creds=tls0`,
  ];

  beforeAll(async () => {
    s = new Scratch('mooring-nbd-tls-');
    mkdirSync(s.path('pki'));
    pki = makePki(s.path('pki'));
    good = credsDir(s.path('good'), pki.ca, pki.clientCert, pki.clientKey);
    replicas = await createReplicas(s.path('replicas'), 1, SIZE);
    engine = await LocalEngine.open({ replicas, epoch: nextEpoch() });
    exp = await engine.exportNbd({ nbd: 'tcp:127.0.0.1:0', tls: { cert: pki.serverCert, key: pki.serverKey, ca: pki.ca } });
    port = exp.address.kind === 'tcp' ? exp.address.port : 0;
  });

  afterAll(async () => {
    await engine?.close().catch(() => undefined);
    s?.cleanup();
  });

  it('serves QEMU with a tls-creds-x509 object: writes and reads back', async () => {
    expect(exp.uri).toBe(`nbds://127.0.0.1:${port}/`);
    const io = await run('qemu-io', [...qemuOpts(good), '-c', 'write -P 0xa5 1M 3M', '-c', 'read -P 0xa5 1M 3M', '-c', 'read -P 0 0 1M']);
    expect(io.stdout + io.stderr).not.toMatch(/fail|error/i);
    const info = await run('qemu-img', ['info', '--output=json', ...qemuOpts(good)]);
    expect(JSON.parse(info.stdout)['virtual-size']).toBe(SIZE);
  });

  it('serves libnbd with nbds:// and the test client over STARTTLS: large transfers both ways', async () => {
    const info = await run('nbdinfo', ['--size', `nbds://127.0.0.1:${port}/?tls-certificates=${good}`]);
    expect(Number(info.stdout.trim())).toBe(SIZE);
    // 8 MiB replies go out as many TLS records; pipelined requests keep TLS's buffer non-empty.
    const c = await NbdClient.connect({ host: '127.0.0.1', port }, { tls: { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey } });
    try {
      const data = pattern(7, 8 * MiB);
      await c.write(16 * MiB, data);
      const parts = await Promise.all([0, 1, 2, 3].map((i) => c.read(16 * MiB + i * 2 * MiB, 2 * MiB)));
      expect(Buffer.concat(parts).equals(data)).toBe(true);
      expect((await c.read(16 * MiB, 8 * MiB)).equals(data)).toBe(true);
      await c.flush();
    } finally {
      await c.disconnect();
    }
    // nbdcopy reads the whole export through TLS; what it copies is what was written.
    const out = s.path('copy.raw');
    await run('nbdcopy', [`nbds://127.0.0.1:${port}/?tls-certificates=${good}`, out]);
    const copy = (await import('node:fs')).readFileSync(out);
    expect(copy.subarray(16 * MiB, 24 * MiB).equals(pattern(7, 8 * MiB))).toBe(true);
  });

  it('refuses clients in the clear, without a certificate, or with one from another CA', async () => {
    const plain = await run('nbdinfo', ['--size', `nbd://127.0.0.1:${port}/`], { allowFailure: true });
    expect(plain.code).not.toBe(0);
    expect(plain.stderr).toMatch(/requires TLS/);
    const plainQemu = await run('qemu-img', ['info', `nbd://127.0.0.1:${port}/`], { allowFailure: true });
    expect(plainQemu.code).not.toBe(0);
    expect(plainQemu.stderr).toMatch(/this export requires TLS/);

    const refusedBefore = exp.stats().protocolErrors;
    const noCert = credsDir(s.path('nocert'), pki.ca);
    const r1 = await run('qemu-io', [...qemuOpts(noCert), '-c', 'read 0 4k'], { allowFailure: true });
    expect(r1.code, r1.stdout + r1.stderr).not.toBe(0);
    const other = credsDir(s.path('other'), pki.ca, pki.otherClientCert, pki.otherClientKey);
    const r2 = await run('nbdinfo', ['--size', `nbds://127.0.0.1:${port}/?tls-certificates=${other}`], { allowFailure: true });
    expect(r2.code, r2.stdout + r2.stderr).not.toBe(0);
    // Both were refused by the server in their TLS handshake (not by the client's own checks).
    // The server counts a refusal after sending its alert: the client may exit first.
    await waitFor('both refusals to be counted', () => exp.stats().protocolErrors - refusedBefore >= 2);
    expect(exp.stats().protocolErrors - refusedBefore).toBe(2);
    // The export still serves the right client afterwards.
    await run('qemu-io', [...qemuOpts(good), '-c', 'read -P 0xa5 1M 4k']);
  });

  it('answers FLUSHes through TLS while held, and is never detached for a hand-off', async () => {
    const c = await NbdClient.connect({ host: '127.0.0.1', port }, { tls: { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey } });
    try {
      await c.write(0, Buffer.alloc(64 * 1024, 3));
      await exp.freeze(5000, { hold: true });
      // Held: a FLUSH at the head of the stream is answered, a READ waits for the unfreeze.
      await c.flush();
      let readDone = false;
      const read = c.read(0, 64 * 1024).then((b) => {
        readDone = true;
        return b;
      });
      expect(readDone).toBe(false);
      await expect(exp.detach()).rejects.toMatchObject({ code: 'UNSUPPORTED' });
      await exp.unfreeze();
      expect((await read).equals(Buffer.alloc(64 * 1024, 3))).toBe(true);
    } finally {
      await c.disconnect();
    }
  });

  it('reads TLS connections on the connection loops: no thread each, and a client that does not read stalls only itself', async () => {
    const tlsOpts = { tls: { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey } };
    const clients: NbdClient[] = [];
    const handshakesDone = () => waitFor('handshake threads to end', () => !threadsByName().has('mr-nbd-hello'), 5000);
    try {
      for (let i = 0; i < 2; i++) clients.push(await NbdClient.connect({ host: '127.0.0.1', port }, tlsOpts));
      await clients[1]!.write(0, Buffer.alloc(4096, 1)); // the loops and workers have started
      await handshakesDone();
      const before = threadsByName();
      for (let i = 2; i < 18; i++) {
        const c = await NbdClient.connect({ host: '127.0.0.1', port }, tlsOpts);
        clients.push(c);
        await c.write(8 * MiB + i * 4096, pattern(i, 4096));
      }
      await handshakesDone();
      const after = threadsByName();
      const grew = threadTotal(after) - threadTotal(before) - ((after.get('mr-nbd-io') ?? 0) - (before.get('mr-nbd-io') ?? 0));
      expect(after.has('mr-nbd-tls') || after.has('mr-nbd-conn'), 'no thread per TLS connection').toBe(false);
      expect(grew, `16 TLS connections: ${JSON.stringify(Object.fromEntries(after))}`).toBeLessThanOrEqual(4);

      // One stops reading: 8 x 1 MiB READ replies fill its socket and wait for EPOLLOUT.
      const stuck = clients[0]!;
      const want = pattern(5, 8 * MiB);
      await stuck.write(16 * MiB, want);
      stuck.socket.pause();
      const reads = Array.from({ length: 8 }, (_, k) => stuck.read(16 * MiB + k * MiB, MiB));
      await waitFor('its replies to wait in a full socket', () => (exp.ioStats()?.budgetUsedBytes ?? 0) >= 2 * MiB);
      for (let i = 2; i < 18; i++) {
        expect((await clients[i]!.read(8 * MiB + i * 4096, 4096)).equals(pattern(i, 4096))).toBe(true);
      }
      expect((exp.ioStats()?.budgetUsedBytes ?? 0), 'its replies still wait').toBeGreaterThan(0);
      stuck.socket.resume();
      const got = await Promise.all(reads);
      for (let k = 0; k < 8; k++) expect(got[k]!.equals(want.subarray(k * MiB, (k + 1) * MiB)), `read ${k}`).toBe(true);
    } finally {
      for (const c of clients) await c.disconnect().catch(() => undefined);
    }
  });
});
