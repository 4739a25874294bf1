// The backing image downloader against local HTTP servers made here with node's http (and a
// raw TCP server for answers http would refuse to send): a normal download, a server that
// ignores Range, one that never answers, one that stalls mid-body, one that drops the
// connection midway, one that sends more than it declared, HTTP errors, redirects, cancel,
// https with a self-signed CA given as `ca`, and both through a local forward proxy named by
// HTTP(S)_PROXY (and past it for NO_PROXY hosts).
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { createServer as createHttpServer, get as httpGet, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { connect as netConnect, createServer as createTcpServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { download, type DownloadOptions } from '../../../src/backing-image/download.js';
import { MiB, TestHttpServers, errorOf, rangeServe as serveRange, sha } from './helpers.js';

const BODY = randomBytes(3 * MiB + 123);
const SUM = sha(BODY);
// Quick retries, short timeouts: the behaviour under test, not the defaults.
const FAST = { retryFirstDelayMs: 10, retryMaxDelayMs: 50, startTimeoutMs: 2000, stallTimeoutMs: 2000 };

type Handler = (req: IncomingMessage, res: ServerResponse, n: number) => void;

const rangeServe = (req: IncomingMessage, res: ServerResponse): void => serveRange(req, res, BODY);

describe('download', () => {
  let dir: string;
  const http = new TestHttpServers();
  const requests = http.requests;
  const serve = (handler: Handler, server?: Server): Promise<string> => http.serve(handler, '/image.qcow2', server);

  async function get(url: string, extra: Partial<DownloadOptions> = {}): Promise<{ res: Awaited<ReturnType<typeof download>>; bytes: Buffer }> {
    const path = join(dir, 'image.part');
    const res = await download({ ...FAST, url, path, ...extra });
    return { res, bytes: await readFile(path) };
  }

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'mooring-dl-'));
    requests.length = 0;
  });
  afterEach(async () => {
    await http.closeAll();
    await rm(dir, { recursive: true, force: true });
  });

  it('downloads a file to disk with its SHA-512 and progress from Content-Length', async () => {
    const url = await serve((req, res) => rangeServe(req, res));
    const progress: Array<[number, number]> = [];
    let started = 0;
    const { res, bytes } = await get(url, { onProgress: (r, t) => progress.push([r, t]), onStart: () => started++ });
    expect(res).toEqual({ sizeBytes: BODY.length, checksum: SUM, attempts: 1 });
    expect(bytes.equals(BODY)).toBe(true);
    expect(started).toBe(1);
    expect(progress.at(-1)).toEqual([BODY.length, BODY.length]);
    expect(progress.every(([, t]) => t === BODY.length)).toBe(true);
    expect(requests[0]!.headers.range).toBeUndefined();
  });

  it('resumes with Range after the connection drops midway; the file is complete and correct', async () => {
    const url = await serve((req, res, n) => {
      if (n === 0) {
        res.writeHead(200, { 'content-length': BODY.length });
        res.write(BODY.subarray(0, MiB + 7), () => setTimeout(() => res.socket?.destroy(), 50));
        return;
      }
      rangeServe(req, res);
    });
    const { res, bytes } = await get(url);
    expect(res.attempts).toBe(2);
    expect(res.checksum).toBe(SUM);
    expect(bytes.equals(BODY)).toBe(true);
    const resumedFrom = Number(/^bytes=(\d+)-$/.exec(requests[1]!.headers.range ?? '')?.[1]);
    expect(resumedFrom).toBeGreaterThan(0);
    expect(resumedFrom).toBeLessThanOrEqual(MiB + 7);
  });

  it('resumes a partial file left on disk, hashing its prefix first', async () => {
    await writeFile(join(dir, 'image.part'), BODY.subarray(0, 2 * MiB));
    const url = await serve((req, res) => rangeServe(req, res));
    const { res, bytes } = await get(url);
    expect(requests[0]!.headers.range).toBe(`bytes=${2 * MiB}-`);
    expect(res.checksum).toBe(SUM);
    expect(bytes.equals(BODY)).toBe(true);
  });

  it('takes a 416 naming the size held as complete, and starts over on another 416', async () => {
    await writeFile(join(dir, 'image.part'), BODY);
    const url = await serve((req, res) => {
      const from = Number(/^bytes=(\d+)-$/.exec(req.headers.range ?? '')?.[1] ?? 0);
      if (from >= BODY.length) {
        res.writeHead(416, { 'content-range': `bytes */${BODY.length}` });
        res.end();
        return;
      }
      rangeServe(req, res);
    });
    expect((await get(url)).res).toEqual({ sizeBytes: BODY.length, checksum: SUM, attempts: 1 });
    // A partial file longer than the server's file: not satisfiable, start over from 0.
    await writeFile(join(dir, 'image.part'), Buffer.concat([BODY, Buffer.alloc(10)]));
    const { res, bytes } = await get(url);
    expect(res).toEqual({ sizeBytes: BODY.length, checksum: SUM, attempts: 2 });
    expect(bytes.equals(BODY)).toBe(true);
  });

  it('starts over when the server ignores Range and answers 200', async () => {
    await writeFile(join(dir, 'image.part'), Buffer.alloc(MiB, 0xee)); // not even the right prefix
    const url = await serve((_req, res) => {
      res.writeHead(200, { 'content-length': BODY.length });
      res.end(BODY);
    });
    const { res, bytes } = await get(url);
    expect(requests[0]!.headers.range).toBe(`bytes=${MiB}-`);
    expect(res).toEqual({ sizeBytes: BODY.length, checksum: SUM, attempts: 1 });
    expect(bytes.equals(BODY)).toBe(true);
  });

  it('fails an attempt that gets no response within startTimeoutMs, and retries', async () => {
    const url = await serve(() => undefined); // never answers
    const t0 = Date.now();
    const e = await errorOf(get(url, { startTimeoutMs: 150, retries: 2 }));
    expect(e.code).toBe('DOWNLOAD_FAILED');
    expect(e.message).toMatch(/no response within 150 ms \(attempt 3 of 3\)/);
    expect(requests.length).toBe(3);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(450);
  });

  it('fails an attempt stalled mid-body after stallTimeoutMs, then resumes', async () => {
    const url = await serve((req, res, n) => {
      if (n === 0) {
        res.writeHead(200, { 'content-length': BODY.length });
        res.write(BODY.subarray(0, MiB)); // and nothing more
        return;
      }
      rangeServe(req, res);
    });
    const { res, bytes } = await get(url, { stallTimeoutMs: 200 });
    expect(res.attempts).toBe(2);
    expect(bytes.equals(BODY)).toBe(true);
    expect(requests[1]!.headers.range).toMatch(/^bytes=\d+-$/);
  });

  it('gives up after the retries when the body keeps stalling', async () => {
    const url = await serve((_req, res) => {
      res.writeHead(200, { 'content-length': BODY.length });
      res.write(BODY.subarray(0, 1000));
    });
    const e = await errorOf(get(url, { stallTimeoutMs: 100, retries: 1 }));
    expect(e.code).toBe('DOWNLOAD_FAILED');
    expect(e.message).toMatch(/no data for 100 ms/);
    expect(requests.length).toBe(2);
  });

  it('names the HTTP status of an error and does not retry a 404', async () => {
    const url = await serve((_req, res) => {
      res.writeHead(404, 'Not Found');
      res.end('nope');
    });
    const e = await errorOf(get(url));
    expect(e.code).toBe('DOWNLOAD_FAILED');
    expect(e.message).toMatch(/HTTP 404 Not Found/);
    expect(requests.length).toBe(1);
  });

  it('retries a 503 with back-off', async () => {
    const url = await serve((req, res, n) => {
      if (n < 2) {
        res.writeHead(503);
        res.end();
        return;
      }
      rangeServe(req, res);
    });
    const { res } = await get(url);
    expect(res.attempts).toBe(3);
    expect(res.checksum).toBe(SUM);
  });

  it('fails a server that sends more bytes than its Content-Range declares', async () => {
    await writeFile(join(dir, 'image.part'), BODY.subarray(0, 10));
    // node's http would not send a body longer than its headers say: a raw TCP server does.
    const tcp = createTcpServer((s) => {
      s.once('data', () => {
        s.end(Buffer.concat([Buffer.from('HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-19/20\r\nContent-Length: 40\r\nConnection: close\r\n\r\n'), randomBytes(40)]));
      });
    });
    const port = await http.listen(tcp);
    const e = await errorOf(get(`http://127.0.0.1:${port}/x`));
    expect(e.code).toBe('DOWNLOAD_FAILED');
    expect(e.message).toMatch(/more than the 20 bytes it declared/);
    // Which bytes were wrong is unknown: nothing is kept.
    expect((await stat(join(dir, 'image.part'))).size).toBe(0);
  });

  it('follows redirects up to the limit', async () => {
    const url = await serve((req, res) => {
      if (req.url === '/image.qcow2') {
        res.writeHead(302, { location: '/moved/here' });
        res.end();
        return;
      }
      if (req.url === '/loop') {
        res.writeHead(307, { location: '/loop' });
        res.end();
        return;
      }
      rangeServe(req, res);
    });
    expect((await get(url)).res.checksum).toBe(SUM);
    const e = await errorOf(get(url.replace('/image.qcow2', '/loop'), { redirectsMax: 3 }));
    expect(e.code).toBe('DOWNLOAD_FAILED');
    expect(e.message).toMatch(/more than 3 redirects/);
  });

  it('refuses URLs that are not http or https', async () => {
    for (const url of ['ftp://example.com/x', 'file:///etc/passwd', 'not a url', '', 'javascript:alert(1)']) {
      expect((await errorOf(get(url))).code).toBe('INVALID_ARGUMENT');
    }
  });

  it('cancels mid-body with CANCELLED and keeps the partial file', async () => {
    const url = await serve((_req, res) => {
      res.writeHead(200, { 'content-length': BODY.length });
      res.write(BODY.subarray(0, MiB));
    });
    const ac = new AbortController();
    const p = get(url, {
      signal: ac.signal,
      onProgress: (r) => {
        if (r >= MiB) ac.abort();
      },
    });
    const e = await errorOf(p);
    expect(e.code).toBe('CANCELLED');
    expect((await stat(join(dir, 'image.part'))).size).toBe(MiB);
    // Cancel during the back-off wait too.
    const ac2 = new AbortController();
    const url404 = await serve((_req, res) => {
      res.writeHead(503);
      res.end();
    });
    const p2 = get(url404, { signal: ac2.signal, retryFirstDelayMs: 10_000 });
    setTimeout(() => ac2.abort(), 100);
    expect((await errorOf(p2)).code).toBe('CANCELLED');
  });

  describe('https', () => {
    let certs: { ca: string; cert: string; key: string };
    beforeEach(async () => {
      const ssl = (...args: string[]): void => void execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
      const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
      await writeFile(join(dir, 'ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
      ssl('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-subj', '/CN=test-ca', '-days', '2');
      ssl('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=server');
      ssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'server.crt', '-days', '2', '-extfile', 'ext');
      certs = { ca: await readFile(join(dir, 'ca.crt'), 'utf8'), cert: await readFile(join(dir, 'server.crt'), 'utf8'), key: await readFile(join(dir, 'server.key'), 'utf8') };
    });

    it('downloads from a server whose CA is given as `ca`, and refuses it (without retrying) otherwise', async () => {
      const server = createHttpsServer({ cert: certs.cert, key: certs.key });
      const url = (await serve((req, res) => rangeServe(req, res), server)).replace('http:', 'https:');
      const { res, bytes } = await get(url, { ca: certs.ca });
      expect(res.checksum).toBe(SUM);
      expect(bytes.equals(BODY)).toBe(true);
      await rm(join(dir, 'image.part'));
      const before = requests.length;
      const e = await errorOf(get(url, { retries: 3 }));
      expect(e.code).toBe('DOWNLOAD_FAILED');
      expect(e.message).toMatch(/certificate|CERT/i);
      expect(requests.length).toBe(before);
      expect(e.message).not.toMatch(/attempt 2/);
    });

    it('goes through HTTPS_PROXY with a CONNECT tunnel, TLS checked end to end; NO_PROXY hosts go direct', async () => {
      const server = createHttpsServer({ cert: certs.cert, key: certs.key });
      const url = (await serve((req, res) => rangeServe(req, res), server)).replace('http:', 'https:');
      const proxy = await startProxy();
      await withEnv({ HTTPS_PROXY: proxy.url, NO_PROXY: 'example.invalid' }, async () => {
        const { res, bytes } = await get(url, { ca: certs.ca });
        expect(res.checksum).toBe(SUM);
        expect(bytes.equals(BODY)).toBe(true);
        expect(proxy.seen).toEqual([`CONNECT ${new URL(url).host}`]);
        // The origin's certificate is still checked through the tunnel.
        await rm(join(dir, 'image.part'));
        expect((await errorOf(get(url))).message).toMatch(/certificate|CERT/i);
      });
      proxy.seen.length = 0;
      await rm(join(dir, 'image.part'), { force: true });
      await withEnv({ HTTPS_PROXY: proxy.url, NO_PROXY: '127.0.0.1' }, async () => {
        expect((await get(url, { ca: certs.ca })).res.checksum).toBe(SUM);
      });
      expect(proxy.seen).toEqual([]);
    });

    it('times out a proxy that never answers the CONNECT, and closes the tunnel it asked for', async () => {
      const url = (await serve((req, res) => rangeServe(req, res), createHttpsServer({ cert: certs.cert, key: certs.key }))).replace('http:', 'https:');
      let closed!: () => void;
      const tunnelClosed = new Promise<void>((r) => (closed = r));
      // It reads (and ignores) what it gets, so it sees the client close the tunnel.
      const silent = createTcpServer((sock) => sock.on('close', closed).on('error', () => undefined).resume());
      const port = await http.listen(silent as unknown as Server);
      await withEnv({ HTTPS_PROXY: `http://127.0.0.1:${port}` }, async () => {
        const e = await errorOf(get(url, { ca: certs.ca, startTimeoutMs: 300, retries: 0 }));
        expect(e.code).toBe('DOWNLOAD_FAILED');
        expect(e.message).toMatch(/no response within 300 ms/);
      });
      await tunnelClosed;
    });
  });

  it('goes through HTTP_PROXY for http URLs (absolute-form request) and says so when the proxy refuses', async () => {
    const url = await serve((req, res) => rangeServe(req, res));
    const proxy = await startProxy();
    await withEnv({ HTTP_PROXY: proxy.url }, async () => {
      const { res, bytes } = await get(url);
      expect(res.checksum).toBe(SUM);
      expect(bytes.equals(BODY)).toBe(true);
      expect(proxy.seen).toEqual([`GET ${url}`]);
    });
    // A proxy that is not there: the download fails with the proxy named, after its retries.
    await withEnv({ HTTP_PROXY: 'http://127.0.0.1:1' }, async () => {
      const e = await errorOf(get(url, { retries: 1 }));
      expect(e.code).toBe('DOWNLOAD_FAILED');
      expect(e.message).toMatch(/ECONNREFUSED/);
    });
  });

  // Runs fn with these environment variables set (and every other proxy variable unset).
  async function withEnv(vars: Record<string, string>, fn: () => Promise<void>): Promise<void> {
    const names = ['HTTP_PROXY', 'http_proxy', 'HTTPS_PROXY', 'https_proxy', 'NO_PROXY', 'no_proxy'];
    const saved = names.map((n) => [n, process.env[n]] as const);
    for (const n of names) delete process.env[n];
    Object.assign(process.env, vars);
    try {
      await fn();
    } finally {
      for (const [n, v] of saved) {
        if (v === undefined) delete process.env[n];
        else process.env[n] = v;
      }
    }
  }

  // A forward proxy on loopback: absolute-form GETs are fetched for the client, CONNECT opens
  // a tunnel. `seen` lists what it was asked.
  async function startProxy(): Promise<{ url: string; seen: string[] }> {
    const seen: string[] = [];
    const proxy = createHttpServer((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      const up = httpGet(req.url!, { headers: req.headers }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      });
      up.on('error', () => res.destroy());
    });
    proxy.on('connect', (req: IncomingMessage, client: Socket, head: Buffer) => {
      seen.push(`CONNECT ${req.url}`);
      const [host, port] = [req.url!.slice(0, req.url!.lastIndexOf(':')), Number(req.url!.slice(req.url!.lastIndexOf(':') + 1))];
      const up = netConnect(port, host, () => {
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        if (head.length > 0) up.write(head);
        up.pipe(client);
        client.pipe(up);
      });
      up.on('error', () => client.destroy());
      client.on('error', () => up.destroy());
    });
    const port = await http.listen(proxy);
    return { url: `http://127.0.0.1:${port}`, seen };
  }
});
