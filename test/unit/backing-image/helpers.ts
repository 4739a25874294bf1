// Helpers shared by the backing image tests: image bytes, their SHA-512, streams of chunks,
// an HTTP handler that honours Range the standard way, and local HTTP servers to serve them.
import { createHash, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Server, Socket } from 'node:net';
import { expect } from 'vitest';

import { MooringError } from '../../../src/errors.js';

export const MiB = 1024 * 1024;

/** Random bytes that read as a raw image (no foreign-format magic at the start). */
export function rawImage(size: number): Buffer {
  const b = randomBytes(size);
  b.fill(0, 0, 512);
  return b;
}

/** SHA-512 in hex. */
export const sha = (b: Uint8Array): string => createHash('sha512').update(b).digest('hex');

/** The MooringError a promise rejects with (fails the test if it resolves). */
export async function errorOf(p: Promise<unknown>): Promise<MooringError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(MooringError);
    return err as MooringError;
  }
  throw new Error('resolved');
}

/** `b` as a stream of chunks of `size` bytes. */
export async function* chunks(b: Buffer, size = 256 * 1024): AsyncGenerator<Uint8Array> {
  for (let o = 0; o < b.length; o += size) yield b.subarray(o, Math.min(b.length, o + size));
}

/** Everything a stream yields, concatenated. */
export async function collect(it: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of it) parts.push(Buffer.from(c));
  return Buffer.concat(parts);
}

/** Answers with `body`: 206 from the start of a `Range: bytes=N-` request, else 200. */
export function rangeServe(req: IncomingMessage, res: ServerResponse, body: Buffer): void {
  const m = /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
  if (m) {
    const from = Number(m[1]);
    res.writeHead(206, { 'content-length': body.length - from, 'content-range': `bytes ${from}-${body.length - 1}/${body.length}` });
    res.end(body.subarray(from));
    return;
  }
  res.writeHead(200, { 'content-length': body.length });
  res.end(body);
}

/** A request handler of {@link TestHttpServers.serve}; `n` counts the requests of that server from 0. */
export type TestHttpHandler = (req: IncomingMessage, res: ServerResponse, n: number) => void;

/**
 * Local servers of one test file on 127.0.0.1: every HTTP request is recorded in
 * `requests`, and {@link TestHttpServers.closeAll} ends the servers and their connections
 * (a stalled response would otherwise keep a server open).
 */
export class TestHttpServers {
  readonly requests: IncomingMessage[] = [];
  readonly #servers: Server[] = [];
  readonly #sockets = new Set<Socket>();

  /** Serves `handler` on `server` (default: a new http server); resolves to the URL of `path` on it. */
  async serve(handler: TestHttpHandler, path: string, server: Server = createServer()): Promise<string> {
    let n = 0;
    server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      this.requests.push(req);
      handler(req, res, n++);
    });
    await this.listen(server);
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}${path}`;
  }

  /** Listens on a free loopback port with any server (a raw TCP one too), tracked for closeAll. */
  async listen(server: Server): Promise<number> {
    server.on('connection', (s: Socket) => {
      this.#sockets.add(s);
      s.on('close', () => this.#sockets.delete(s));
    });
    this.#servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return (server.address() as AddressInfo).port;
  }

  async closeAll(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await Promise.all(this.#servers.splice(0).map((s) => new Promise((r) => s.close(r))));
  }
}
