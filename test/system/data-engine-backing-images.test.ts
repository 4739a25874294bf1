// Backing image files on a real `mooring data-engine` process, over gRPC: an https download
// trusted through NODE_EXTRA_CA_CERTS (the process's own CA path), a SIGKILL of the process
// mid-download, and after the restart the ready file verified again, the partial file
// reported failed with its bytes, and the download resumed with Range to a correct file.
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { RemoteDataEngine } from '../../src/data-engine/grpc/remote-data-engine.js';
import { killAllServers, startCliProcess, type MooringServer } from './helpers/serve.js';
import { TempDir } from './helpers/tools.js';

const MiB = 1024 * 1024;
const sha = (b: Uint8Array): string => createHash('sha512').update(b).digest('hex');

describe('backing image files on a mooring data-engine process', () => {
  let tmp: TempDir;
  let server: Server;
  const sockets = new Set<Socket>();
  const ranges: Array<string | undefined> = [];
  let stallAfterBytes = 0;
  const body = randomBytes(24 * MiB);
  body.fill(0, 0, 512);

  beforeAll(async () => {
    tmp = new TempDir('mooring-bif-');
    const ssl = (...args: string[]): void => void execFileSync('openssl', args, { cwd: tmp.path, stdio: 'pipe' });
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    writeFileSync(tmp.join('ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
    ssl('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-subj', '/CN=test-ca', '-days', '2');
    ssl('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=server');
    ssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'server.crt', '-days', '2', '-extfile', 'ext');
    server = createServer({ cert: readFileSync(tmp.join('server.crt')), key: readFileSync(tmp.join('server.key')) }, (req: IncomingMessage, res: ServerResponse) => {
      ranges.push(req.headers.range);
      const m = /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
      const from = m ? Number(m[1]) : 0;
      res.writeHead(m ? 206 : 200, { 'content-length': body.length - from, ...(m ? { 'content-range': `bytes ${from}-${body.length - 1}/${body.length}` } : {}) });
      if (stallAfterBytes > 0) res.write(body.subarray(from, from + stallAfterBytes)); // then nothing
      else res.end(body.subarray(from));
    });
    server.on('connection', (s: Socket) => {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  });
  afterAll(async () => {
    await killAllServers();
    for (const s of sockets) s.destroy();
    await new Promise((r) => server.close(r));
    tmp.cleanup();
  });

  async function startProcess(): Promise<{ proc: MooringServer; de: RemoteDataEngine }> {
    const sock = tmp.join('de.sock');
    const proc = await startCliProcess(
      ['data-engine', '--dir', tmp.join('de'), '--host-id', 'h1', '--listen', `unix:${sock}`, '--replica-listen', 'none'],
      'mooring data-engine',
      30_000,
      { ...process.env, NODE_EXTRA_CA_CERTS: tmp.join('ca.crt') },
    );
    return { proc, de: await RemoteDataEngine.connect({ address: `unix:${sock}`, timeoutMs: 20_000 }) };
  }

  it('downloads over https, survives SIGKILL mid-download, verifies and resumes after the restart', async () => {
    const url = `https://127.0.0.1:${(server.address() as AddressInfo).port}/image.raw`;
    let { proc, de } = await startProcess();
    const ready = { name: 'base', uuid: randomUUID() };
    expect(await de.downloadBackingImageFile(ready, { url, expectedChecksum: sha(body) })).toMatchObject({ state: 'ready', checksum: sha(body), format: 'raw', virtualSizeBytes: body.length });

    // A second download stalls after 5 MiB; the process is killed while it waits.
    stallAfterBytes = 5 * MiB;
    const partial = { name: 'part', uuid: randomUUID() };
    const pending = de.downloadBackingImageFile(partial, { url, expectedChecksum: sha(body) }).catch((e: unknown) => e);
    await expect.poll(async () => (await de.backingImageFile(partial))?.receivedBytes, { timeout: 10_000 }).toBe(5 * MiB);
    proc.child.kill('SIGKILL');
    await proc.exited;
    expect(await pending).toMatchObject({ code: 'UNAVAILABLE' });
    await de.close();

    ({ proc, de } = await startProcess());
    const after = await de.listBackingImageFiles();
    expect(after.find((f) => f.name === 'part')).toMatchObject({ state: 'failed', receivedBytes: 5 * MiB });
    await expect.poll(async () => (await de.backingImageFile(ready))?.state, { timeout: 10_000 }).toBe('ready');
    stallAfterBytes = 0;
    ranges.length = 0;
    const done = await de.downloadBackingImageFile(partial, { url, expectedChecksum: sha(body) });
    expect(done).toMatchObject({ state: 'ready', checksum: sha(body) });
    expect(ranges).toEqual([`bytes=${5 * MiB}-`]);
    expect(readFileSync(join(tmp.join('de'), 'backing-images', `part-${partial.uuid}`, 'image')).equals(body)).toBe(true);
    await de.close();
  });
});
