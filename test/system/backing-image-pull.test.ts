// A backing image file copied data engine to data engine (issue 16, docs/backing-images.md
// "Delivery"): real `mooring data-engine` processes, a and b with the cluster's secret, c
// without it (--insecure).
// - the controller's copy (copyBackingImageFile) makes b pull the file from a: b's file is
//   ready with the image's SHA-512, no byte was relayed through this process and this
//   process never opened a's read stream; the bytes came over the replica protocol from a's
//   replica server (a announces `backing-file-read`; b's log says which way it pulled);
// - b killed (SIGKILL) mid-pull keeps its partial file; after its restart the pull resumes
//   from that offset ("receiving from byte N") and ends verified;
// - a wrong expected checksum fails b's file (CHECKSUM_MISMATCH, state failed);
// - c, which does not know the secret, is refused by a (UNAUTHENTICATED), promptly; a
//   source address that is another data engine than the one named is refused too;
// - between hosts (gRPC and the replica protocol on TCP with mutual TLS and the secret, as
//   across machines): t2 pulls from t1 with the certificate its replica connections use, the
//   bytes over the replica protocol; t3, whose certificate another CA signed, is refused (the
//   TLS handshake fails: UNAVAILABLE) and has no file.
import { createHash, randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { createReadStream, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { copyBackingImageFile, newCopyState } from '../../src/backing-image/copy.js';
import type { BackingImageFileRef, DataEngine, DataEngineEvent } from '../../src/data-engine/data-engine.js';
import { MooringError } from '../../src/errors.js';
import { RemoteDataEngine } from '../../src/data-engine/grpc/remote-data-engine.js';
import { HostProcess } from './helpers/hosts.js';
import { killAllServers, startCliProcess, type MooringServer } from './helpers/serve.js';
import { TempDir } from './helpers/tools.js';

const MiB = 1 << 20;
const SIZE = 256 * MiB;
/** Progress of b's pull at which b is killed. */
const KILL_AT_PERCENT = 5;
const BASE_PORT = 29420;

async function sha512File(path: string): Promise<string> {
  const h = createHash('sha512');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

async function errorOf(p: Promise<unknown>): Promise<MooringError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(MooringError);
    return err as MooringError;
  }
  throw new Error('the call succeeded; it should have failed');
}

describe('backing image files pulled data engine to data engine', () => {
  const tmp = new TempDir('mooring-pull-');
  const host = (id: string, i: number, insecure = false): HostProcess =>
    new HostProcess({ hostId: id, dir: join(tmp.path, id), ip: `127.0.0.${31 + i}`, replicaPort: BASE_PORT + i, ...(insecure ? { insecure: true } : {}) });
  const a = host('a', 0);
  const b = host('b', 1);
  const c = host('c', 2, true);
  const ref: BackingImageFileRef = { name: 'base', uuid: '00000000-0000-4000-8000-0000000000b1' };
  let checksum = '';
  const diag = (): string => [a, b, c].map((h) => h.diagnostics()).join('');

  beforeAll(async () => {
    await Promise.all([a.start(), b.start(), c.start()]);
    // Random bytes read as a raw image (no other format's magic at the start).
    const image = join(tmp.path, 'image.raw');
    const hash = createHash('sha512');
    writeFileSync(image, '');
    for (let at = 0; at < SIZE; at += 16 * MiB) {
      const chunk = randomBytes(16 * MiB);
      if (at === 0) chunk.fill(0, 0, 512);
      hash.update(chunk);
      writeFileSync(image, chunk, { flag: 'a' });
    }
    checksum = hash.digest('hex');
    await a.engine.writeBackingImageFile(ref, { sizeBytes: SIZE, offset: 0, expectedChecksum: checksum }, createReadStream(image));
  }, 120_000);

  afterAll(async () => {
    for (const h of [a, b, c]) await h.stop().catch(() => undefined);
    await killAllServers();
    tmp.cleanup();
  });

  it('copies a to b directly: b pulls, nothing is relayed through this process', async () => {
    let readsHere = 0;
    // a as the controller sees it: its address, and a read stream that counts if opened here.
    const source = {
      address: a.engine.address,
      readBackingImageFile: (r: BackingImageFileRef, o?: { offset?: number }) => {
        readsHere++;
        return a.engine.readBackingImageFile(r, o);
      },
    } as unknown as DataEngine;
    const state = newCopyState();
    const out = await copyBackingImageFile(state, { engine: source, hostId: 'a' }, b.engine, ref, { sizeBytes: SIZE, offset: 0, expectedChecksum: checksum });
    expect(out.path, diag()).toBe('pull');
    expect(out.info.state).toBe('ready');
    expect(out.info.checksum).toBe(checksum);
    expect(state.relayedBytes).toBe(0);
    expect(readsHere).toBe(0);
    expect(b.proc!.stderr, diag()).toContain(`pulling backing image file ${ref.name}-${ref.uuid} from a at byte 0 over the replica protocol`);
    // The bytes on b's disk are the image's.
    expect(await sha512File(join(b.opts.dir, 'backing-images', `${ref.name}-${ref.uuid}`, 'image'))).toBe(checksum);
    await b.engine.deleteBackingImageFile(ref);
  }, 120_000);

  it('resumes a pull from the partial file of a target killed mid-pull', async () => {
    const seen = new Promise<void>((resolve) => {
      const off = b.engine.watch((e: DataEngineEvent) => {
        if (e.type === 'backing-image-file' && e.uuid === ref.uuid && e.state === 'in-progress' && e.progress >= KILL_AT_PERCENT) {
          off();
          resolve();
        }
      });
    });
    const pull = b.engine.pullBackingImageFile!(ref, { sizeBytes: SIZE, offset: 0, expectedChecksum: checksum, source: { address: a.engine.address, hostId: 'a' } });
    pull.catch(() => undefined);
    await seen;
    await b.crash();
    expect((await errorOf(pull)).code).toBe('UNAVAILABLE');
    await b.start();
    const partial = await b.engine.backingImageFile(ref);
    expect(partial?.state, diag()).toBe('failed');
    expect(partial!.receivedBytes, 'the pull was killed after some bytes arrived').toBeGreaterThan(0);
    expect(partial!.receivedBytes, 'the pull had not ended when b was killed').toBeLessThan(SIZE);

    const messages: string[] = [];
    const off = b.engine.watch((e) => {
      if (e.type === 'backing-image-file' && e.uuid === ref.uuid) messages.push(e.message);
    });
    const out = await copyBackingImageFile(newCopyState(), { engine: a.engine, hostId: 'a' }, b.engine, ref, { sizeBytes: SIZE, offset: partial!.receivedBytes, expectedChecksum: checksum });
    off();
    expect(out.path).toBe('pull');
    expect(out.info.state).toBe('ready');
    expect(out.info.checksum).toBe(checksum);
    expect(messages, 'the pull resumed at the partial file').toContain(`receiving from byte ${partial!.receivedBytes}`);
    await b.engine.deleteBackingImageFile(ref);
  }, 180_000);

  it('fails the target file on a wrong checksum (CHECKSUM_MISMATCH)', async () => {
    const wrong = createHash('sha512').update('not this image').digest('hex');
    const e = await errorOf(b.engine.pullBackingImageFile!(ref, { sizeBytes: SIZE, offset: 0, expectedChecksum: wrong, source: { address: a.engine.address, hostId: 'a' } }));
    expect(e.code).toBe('CHECKSUM_MISMATCH');
    const f = await b.engine.backingImageFile(ref);
    expect(f?.state).toBe('failed');
    expect(f?.message).toMatch(/^CHECKSUM_MISMATCH/);
    await b.engine.deleteBackingImageFile(ref);
  }, 120_000);

  it('is refused by a source that does not accept the target credentials, and by another data engine than the one named', async () => {
    const e = await errorOf(c.engine.pullBackingImageFile!(ref, { sizeBytes: SIZE, offset: 0, expectedChecksum: checksum, source: { address: a.engine.address, hostId: 'a' } }));
    expect(e.code, e.message).toBe('UNAUTHENTICATED');
    expect(e.message).toContain('source data engine a');
    expect(await c.engine.backingImageFile(ref)).toBeNull();
    const wrongHost = await errorOf(b.engine.pullBackingImageFile!(ref, { sizeBytes: SIZE, offset: 0, expectedChecksum: checksum, source: { address: a.engine.address, hostId: 'x' } }));
    expect(wrongHost.code).toBe('INVALID_ARGUMENT');
    expect(wrongHost.message).toContain('is data engine a, not the source x');
  }, 60_000);

  it('pulls with mutual TLS between hosts, and a host of another CA is refused', async () => {
    const ssl = (...args: string[]): void => void execFileSync('openssl', args, { cwd: tmp.path, stdio: 'pipe' });
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    for (const ca of ['ca', 'other-ca']) ssl('req', '-x509', ...ec, '-keyout', `${ca}.key`, '-out', `${ca}.crt`, '-subj', `/CN=${ca}`, '-days', '2');
    const hosts: Array<{ id: string; ca: string }> = [
      { id: 't1', ca: 'ca' },
      { id: 't2', ca: 'ca' },
      { id: 't3', ca: 'other-ca' },
    ];
    const procs: MooringServer[] = [];
    const clients: RemoteDataEngine[] = [];
    try {
      for (const [i, h] of hosts.entries()) {
        ssl('req', ...ec, '-keyout', `${h.id}.key`, '-out', `${h.id}.csr`, '-subj', `/CN=${h.id}`);
        ssl('x509', '-req', '-in', `${h.id}.csr`, '-CA', `${h.ca}.crt`, '-CAkey', `${h.ca}.key`, '-CAcreateserial', '-out', `${h.id}.crt`, '-days', '2');
        const grpc = `tcp:127.0.0.${41 + i}:${BASE_PORT + 10 + i}`;
        procs.push(
          await startCliProcess(
            [
              'data-engine', '--dir', join(tmp.path, h.id), '--host-id', h.id, '--listen', grpc,
              '--replica-listen', `tcp:127.0.0.${41 + i}:${BASE_PORT + 20 + i}`,
              '--tls-cert', join(tmp.path, `${h.id}.crt`), '--tls-key', join(tmp.path, `${h.id}.key`), '--tls-ca', join(tmp.path, `${h.ca}.crt`),
              '--cluster-secret-file', a.clusterSecretFile!,
            ],
            `data-engine ${h.id}`,
          ),
        );
        // The test's client of each host holds a certificate of that host's CA.
        const tls = { cert: readFileSync(join(tmp.path, `${h.id}.crt`), 'utf8'), key: readFileSync(join(tmp.path, `${h.id}.key`), 'utf8'), ca: readFileSync(join(tmp.path, `${h.ca}.crt`), 'utf8') };
        clients.push(await RemoteDataEngine.connect({ address: grpc, tls, clusterSecret: a.clusterSecret!, timeoutMs: 10_000 }));
      }
      const [t1, t2, t3] = clients as [RemoteDataEngine, RemoteDataEngine, RemoteDataEngine];
      const small = 8 * MiB;
      const bytes = randomBytes(small);
      bytes.fill(0, 0, 512);
      const sum = createHash('sha512').update(bytes).digest('hex');
      const r2: BackingImageFileRef = { name: 'tls', uuid: '00000000-0000-4000-8000-0000000000b2' };
      await t1.writeBackingImageFile(r2, { sizeBytes: small, offset: 0, expectedChecksum: sum }, (async function* () {
        yield bytes;
      })());
      const state = newCopyState();
      const out = await copyBackingImageFile(state, { engine: t1, hostId: 't1' }, t2, r2, { sizeBytes: small, offset: 0, expectedChecksum: sum });
      expect(out.path, procs.map((p) => p.diagnostics()).join('')).toBe('pull');
      expect(out.info.checksum).toBe(sum);
      expect(state.relayedBytes).toBe(0);
      expect(procs[1]!.stderr, procs[1]!.diagnostics()).toContain(`pulling backing image file ${r2.name}-${r2.uuid} from t1 at byte 0 over the replica protocol`);
      const refused = await errorOf(t3.pullBackingImageFile(r2, { sizeBytes: small, offset: 0, expectedChecksum: sum, source: { address: t1.address, hostId: 't1' } }));
      expect(refused.code, refused.message).toBe('UNAVAILABLE');
      expect(refused.message).toContain('source data engine t1');
      expect(await t3.backingImageFile(r2)).toBeNull();
    } finally {
      for (const c of clients) await c.close();
      for (const p of procs) await p.stop().catch(() => undefined);
    }
  }, 120_000);
});
