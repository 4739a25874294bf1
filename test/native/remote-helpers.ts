// Helpers for the remote-replica tests (test/native/remote-*.test.ts): replica servers
// over scratch roots, a raw client that speaks the replica protocol frame by frame
// (docs/replica-protocol.md) so tests can send exactly what they want, a frame-aware TCP
// proxy that can hold or swallow traffic, and test certificates made with the openssl CLI.
import { execFileSync } from 'node:child_process';
import { createHmac, randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';

import type { NativeEngine, NativeRemoteReplica, NativeReplicaServer, NativeTlsOptions } from '../../src/native/binding.js';
import { addon, engineOptions, MiB, type Scratch } from './helpers.js';

export const REQ_MAGIC = 0x3151524d;
export const REP_MAGIC = 0x3150524d;
export const REQ_HEADER = 48;
export const REP_HEADER = 40;

export const Op = {
  HELLO: 1,
  PING: 2,
  READ: 3,
  WRITE: 4,
  TRIM: 5,
  WRITE_ZEROES: 6,
  FLUSH: 7,
  BLOCK_STATUS: 8,
  CLAIM_EPOCH: 9,
  MARK_CLEAN: 10,
  LIST_LAYERS: 11,
  LAYER_EXTENTS: 12,
  READ_LAYER: 13,
  SNAPSHOT: 14,
  DELETE_SNAPSHOT: 15,
  REVERT: 16,
  ADOPT_CHAIN: 17,
  LAYER_DIGEST: 18,
  WRITE_LAYER: 19,
  UNMAP_LAYER: 20,
  FINISH_REBUILD: 21,
  ALLOCATED_BYTES: 22,
  SET_REPLICA_SET: 23,
  PEEK_REPLICA_SET: 24,
  GROW: 25,
  CLIENT_FEATURES: 26,
  AUTH: 27,
  AUTH_PROOF: 28,
  LAST_RW: 29,
} as const;

/** Code numbers as util/status.h lists them. */
export const CodeNum = {
  OK: 0,
  INVALID_ARGUMENT: 1,
  NOT_FOUND: 2,
  STALE_EPOCH: 6,
  UNSUPPORTED: 12,
  UNAVAILABLE: 15,
  PROTOCOL_ERROR: 16,
  UNAUTHENTICATED: 18,
} as const;

export interface Request {
  op: number;
  seq: bigint | number;
  flags?: number;
  epoch?: bigint | number;
  offset?: bigint | number;
  length?: bigint | number;
  payload?: Buffer;
  version?: number;
  magic?: number;
  reserved?: number;
  /** Lie about the payload length (the header says this; `payload` is what is sent). */
  payloadLen?: number;
}

export interface Reply {
  code: number;
  state: number;
  seq: bigint;
  errno: number;
  epoch: bigint;
  value: bigint;
  payload: Buffer;
}

export function encodeRequest(r: Request): Buffer {
  const payload = r.payload ?? Buffer.alloc(0);
  const h = Buffer.alloc(REQ_HEADER);
  h.writeUInt32LE(r.magic ?? REQ_MAGIC, 0);
  h.writeUInt8(r.version ?? 1, 4);
  h.writeUInt8(r.op, 5);
  h.writeUInt16LE(r.flags ?? 0, 6);
  h.writeBigUInt64LE(BigInt(r.seq), 8);
  h.writeBigUInt64LE(BigInt(r.epoch ?? 0), 16);
  h.writeBigUInt64LE(BigInt(r.offset ?? 0), 24);
  h.writeBigUInt64LE(BigInt(r.length ?? 0), 32);
  h.writeUInt32LE(r.payloadLen ?? payload.length, 40);
  h.writeUInt32LE(r.reserved ?? 0, 44);
  return Buffer.concat([h, payload]);
}

/** A u16-length-prefixed string, as the protocol encodes strings. */
/** Little-endian u16 / u64 as the protocol encodes them. */
export function u16(v: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16LE(v);
  return b;
}
export function u64(v: number | bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(v));
  return b;
}

/** A replica set as SET_REPLICA_SET carries it (docs/replica-protocol.md). */
export function replicaSetPayload(epoch: number, generation: number, members: string[], rw: string[]): Buffer {
  return Buffer.concat([u64(epoch), u64(generation), u16(members.length), ...members.map(wireStr), u16(rw.length), ...rw.map(wireStr)]);
}

export function wireStr(s: string | Buffer): Buffer {
  const b = Buffer.isBuffer(s) ? s : Buffer.from(s);
  const h = Buffer.alloc(2);
  h.writeUInt16LE(b.length);
  return Buffer.concat([h, b]);
}

/** Splits a byte stream into frames of either direction. */
export class FrameSplitter {
  private buf: Buffer = Buffer.alloc(0);
  constructor(
    private readonly headerBytes: number,
    private readonly lenAt: number,
  ) {}
  /** Frames completed by `chunk`. Throws on a length beyond the protocol limit. */
  push(chunk: Buffer): Buffer[] {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out: Buffer[] = [];
    while (this.buf.length >= this.headerBytes) {
      const len = this.buf.readUInt32LE(this.lenAt);
      if (len > 16 * MiB) throw new Error(`frame payload ${len} beyond the protocol limit`);
      const total = this.headerBytes + len;
      if (this.buf.length < total) break;
      out.push(this.buf.subarray(0, total));
      this.buf = this.buf.subarray(total);
    }
    return out;
  }
}

export function decodeReply(f: Buffer): Reply {
  if (f.readUInt32LE(0) !== REP_MAGIC) throw new Error('bad reply magic');
  return {
    code: f.readUInt16LE(4),
    state: f.readUInt16LE(6),
    seq: f.readBigUInt64LE(8),
    errno: f.readInt32LE(16),
    epoch: f.readBigUInt64LE(24),
    value: f.readBigUInt64LE(32),
    payload: f.subarray(REP_HEADER, REP_HEADER + f.readUInt32LE(20)),
  };
}

/**
 * A raw protocol client: sends frames as given, collects replies. `closed` resolves when
 * the server drops the connection.
 */
export class RawClient {
  readonly replies: Reply[] = [];
  readonly closed: Promise<void>;
  private waiters: Array<() => void> = [];
  private splitter = new FrameSplitter(REP_HEADER, 20);
  private isClosed = false;
  badStream: string | null = null;

  private constructor(readonly socket: Socket) {
    socket.on('data', (d: Buffer) => {
      try {
        for (const f of this.splitter.push(d)) this.replies.push(decodeReply(f));
      } catch (e) {
        this.badStream = String(e);
        socket.destroy();
      }
      this.wake();
    });
    this.closed = new Promise((resolve) => {
      socket.on('close', () => {
        this.isClosed = true;
        this.wake();
        resolve();
      });
    });
    socket.on('error', () => {});
  }

  /** `localAddress`: the source address (another loopback address is another peer). */
  static connect(port: number, host = '127.0.0.1', localAddress?: string): Promise<RawClient> {
    return new Promise((resolve, reject) => {
      const s = createConnection({ port, host, ...(localAddress ? { localAddress } : {}) }, () => resolve(new RawClient(s)));
      s.once('error', reject);
      s.setNoDelay(true);
    });
  }

  /** Connects and opens `name`; throws unless the HELLO is answered OK. */
  static async open(port: number, name: string): Promise<RawClient> {
    const c = await RawClient.connect(port);
    c.send({ op: Op.HELLO, seq: 0, payload: Buffer.from(name) });
    const r = await c.next();
    if (!r || r.code !== 0) throw new Error(`HELLO ${name}: ${r ? `code ${r.code} ${r.payload.toString()}` : 'connection closed'}`);
    c.replies.length = 0;
    return c;
  }

  get isOpen(): boolean {
    return !this.isClosed;
  }

  send(...reqs: Request[]): void {
    this.sendRaw(Buffer.concat(reqs.map(encodeRequest)));
  }

  sendRaw(b: Buffer): void {
    if (!this.isClosed) this.socket.write(b);
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Waits until `cond` holds or the connection closes; false if it closed first. */
  async until(cond: () => boolean, timeoutMs = 20_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (!cond()) {
      if (this.isClosed) return cond();
      if (Date.now() > deadline) throw new Error(`raw client: timed out after ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 200);
      });
    }
    return true;
  }

  /** The next reply (removed from the list), or null when the connection closed. */
  async next(): Promise<Reply | null> {
    await this.until(() => this.replies.length > 0);
    return this.replies.shift() ?? null;
  }

  /** The reply with `seq` once it arrives (removed), or null when the connection closed. */
  async reply(seq: number | bigint): Promise<Reply | null> {
    const s = BigInt(seq);
    await this.until(() => this.replies.some((r) => r.seq === s));
    const i = this.replies.findIndex((r) => r.seq === s);
    return i < 0 ? null : this.replies.splice(i, 1)[0]!;
  }

  close(): void {
    this.socket.destroy();
  }
}

/**
 * The replica protocol's authentication as docs/replica-protocol.md describes it, written
 * here from the document (not from the C++): K = HMAC-SHA256(secret, key label); a proof
 * is HMAC-SHA256(K, direction label | client nonce | server nonce).
 */
export function authProof(secret: Buffer, who: 'server' | 'client', nc: Buffer, ns: Buffer): Buffer {
  const k = createHmac('sha256', secret).update('mooring replica protocol v1').digest();
  return createHmac('sha256', k).update(Buffer.concat([Buffer.from(`mooring replica auth v1 ${who}`), nc, ns])).digest();
}

/**
 * Runs AUTH and AUTH_PROOF on a raw client with `secret` (the proof may be spoiled on
 * purpose with `spoil`). Returns the AUTH_PROOF reply (null if the connection closed), and
 * whether the server's proof was right.
 */
export async function rawAuthenticate(c: RawClient, secret: Buffer, spoil = false): Promise<{ serverProved: boolean; reply: Reply | null }> {
  const nc = randomBytes(32);
  c.send({ op: Op.AUTH, seq: 0, payload: nc });
  const r = await c.next();
  if (!r || r.code !== 0) return { serverProved: false, reply: r };
  const ns = r.payload.subarray(0, 32);
  const serverProved = r.payload.length === 64 && r.payload.subarray(32).equals(authProof(secret, 'server', nc, ns));
  const proof = authProof(secret, 'client', nc, ns);
  if (spoil) proof[0]! ^= 1;
  c.send({ op: Op.AUTH_PROOF, seq: 0, payload: proof });
  return { serverProved, reply: await c.next() };
}

/** Replica roots served by replica servers: one "host" each. */
export interface Host {
  root: string;
  server: NativeReplicaServer;
}

/** Starts `n` replica servers, each over its own root holding one replica named `name`. */
export async function startHosts(s: Scratch, n: number, sizeBytes: number, name = 'vol', tls?: NativeTlsOptions, clusterSecret?: Buffer): Promise<Host[]> {
  const hosts: Host[] = [];
  for (let i = 0; i < n; i++) {
    const root = s.dir(`host${i}-${Math.random().toString(36).slice(2, 8)}`);
    await addon().createReplica(join(root, name), sizeBytes);
    hosts.push({ root, server: await addon().startReplicaServer({ root, tls, ...(clusterSecret ? { clusterSecret } : {}) }) });
  }
  return hosts;
}

/** A port nothing listens on (bound, read, closed). */
export async function deadPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

export function endpoint(port: number, name = 'vol', extra: Partial<NativeRemoteReplica> = {}): NativeRemoteReplica {
  return { host: '127.0.0.1', port, name, ...extra };
}

export async function closeAll(hosts: Host[]): Promise<void> {
  await Promise.allSettled(hosts.map((h) => h.server.close()));
}

/** The replica servers and engines of one test, closed by reset() (an afterEach). */
export class RemoteFixture {
  hosts: Host[] = [];
  private engines: NativeEngine[] = [];

  /** An engine over these replicas, closed at reset() unless the test closed it first. */
  async open(replicas: NativeRemoteReplica[]): Promise<NativeEngine> {
    const e = await addon().openEngine(engineOptions({ replicas }));
    this.engines.push(e);
    return e;
  }

  async reset(): Promise<void> {
    for (const e of this.engines.splice(0)) await e.close().catch(() => {});
    await closeAll(this.hosts);
    this.hosts = [];
  }
}

/** LocalEngine events, collected. */
export function collectEvents(): { events: Array<{ type: string; replicaId?: string; errno?: number }>; onEvents: (e: unknown[]) => void } {
  const events: Array<{ type: string; replicaId?: string; errno?: number }> = [];
  return { events, onEvents: (e) => events.push(...(e as typeof events)) };
}

export function modeOf(engine: NativeEngine, id: string): string {
  const r = engine.replicas().find((x) => x.id === id);
  if (!r) throw new Error(`no replica ${id}`);
  return r.mode;
}

/**
 * A TCP proxy that understands frame boundaries in both directions. `hold` keeps replies
 * back (released by `release()`); `blackhole` swallows everything and answers nothing,
 * keeping the sockets open (a peer that stopped without closing); `stall` also stops
 * reading, so the client's socket fills up (a partitioned peer whose TCP takes no data).
 */
export class FrameProxy {
  mode: 'pass' | 'hold' | 'blackhole' | 'stall' = 'pass';
  /** Requests forwarded whose reply has not been forwarded, now and at most. */
  outstanding = 0;
  maxOutstanding = 0;
  private held: Array<{ to: Socket; frame: Buffer }> = [];
  private server: Server;
  port = 0;
  /** Requests forwarded, by opcode ({@link Op}). */
  readonly ops = new Map<number, number>();
  /** Bytes received from clients, forwarded or not. */
  received = 0;
  /** Called when a client connection of the proxy is closed by the client. */
  onClientClose: (() => void) | null = null;
  /** Sees each request frame (header and payload) the proxy receives from a client. */
  onRequest: ((frame: Buffer) => void) | null = null;
  /** Rewrites each reply frame (header and payload) before it is passed on; `n` counts the connection's replies from 0 (the HELLO reply). */
  rewriteReply: ((frame: Buffer, n: number) => Buffer) | null = null;
  private sockets = new Set<Socket>();
  private clients = new Set<Socket>();
  private reading = true;

  constructor(private readonly targetPort: number) {
    this.server = createServer((client) => {
      const upstream = createConnection({ port: this.targetPort, host: '127.0.0.1' });
      client.setNoDelay(true);
      upstream.setNoDelay(true);
      if (!this.reading) client.pause();
      this.clients.add(client);
      client.on('close', () => this.clients.delete(client));
      this.sockets.add(client);
      this.sockets.add(upstream);
      const up = new FrameSplitter(REQ_HEADER, 40);
      const down = new FrameSplitter(REP_HEADER, 20);
      let replies = 0;
      client.on('data', (d: Buffer) => {
        this.received += d.length;
        if (this.mode === 'stall') client.pause();
        for (const f of up.push(d)) {
          this.onRequest?.(f);
          if (this.mode === 'blackhole' || this.mode === 'stall') continue;
          this.outstanding++;
          this.maxOutstanding = Math.max(this.maxOutstanding, this.outstanding);
          this.ops.set(f.readUInt8(5), (this.ops.get(f.readUInt8(5)) ?? 0) + 1);
          upstream.write(f);
        }
      });
      upstream.on('data', (d: Buffer) => {
        for (const raw of down.push(d)) {
          const f = this.rewriteReply ? this.rewriteReply(raw, replies) : raw;
          replies++;
          if (this.mode === 'blackhole' || this.mode === 'stall') continue;
          if (this.mode === 'hold') {
            this.held.push({ to: client, frame: f });
            continue;
          }
          this.outstanding--;
          client.write(f);
        }
      });
      const end = (): void => {
        client.destroy();
        upstream.destroy();
      };
      client.on('close', () => {
        this.onClientClose?.();
        end();
      });
      upstream.on('close', end);
      client.on('error', () => {});
      upstream.on('error', () => {});
    });
  }

  async start(): Promise<number> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
    return this.port;
  }

  /**
   * Stops reading requests (in any mode), so the client's socket fills up as a congested
   * peer's would; {@link resumeReading} reads and forwards them again, none lost.
   */
  pauseReading(): void {
    this.reading = false;
    for (const c of this.clients) c.pause();
  }

  resumeReading(): void {
    this.reading = true;
    for (const c of this.clients) c.resume();
  }

  /** Back to pass mode; held replies go out in order. */
  release(): void {
    this.mode = 'pass';
    for (const h of this.held.splice(0)) {
      this.outstanding--;
      h.to.write(h.frame);
    }
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** A TCP server that accepts and then never says anything. */
export async function silentServer(): Promise<{ port: number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  const srv = createServer((s) => {
    sockets.add(s);
    s.on('error', () => {});
  });
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  return {
    port: (srv.address() as { port: number }).port,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => srv.close(() => resolve()));
    },
  };
}

export interface TestPki {
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  /** A client certificate and key signed by a different CA. */
  otherCa: string;
  otherClientCert: string;
  otherClientKey: string;
}

/** A CA, a server certificate for 127.0.0.1 / "replica.test", and client certificates, by the openssl CLI. */
export function makePki(dir: string): TestPki {
  const ossl = (...args: string[]): void => {
    execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  };
  const ca = (name: string): void => {
    ossl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '2', '-subj', `/CN=${name}`,
      '-keyout', `${name}.key`, '-out', `${name}.crt`);
  };
  const leaf = (name: string, signer: string, ext: string): void => {
    ossl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.csr`);
    writeFileSync(join(dir, `${name}.ext`), ext);
    ossl('x509', '-req', '-in', `${name}.csr`, '-CA', `${signer}.crt`, '-CAkey', `${signer}.key`, '-CAcreateserial', '-days', '2',
      '-extfile', `${name}.ext`, '-out', `${name}.crt`);
  };
  ca('ca1');
  ca('ca2');
  leaf('server', 'ca1', 'subjectAltName=DNS:replica.test,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
  leaf('client', 'ca1', 'extendedKeyUsage=clientAuth\n');
  leaf('other', 'ca2', 'extendedKeyUsage=clientAuth\n');
  const rd = (f: string): string => readFileSync(join(dir, f), 'utf8');
  return {
    ca: rd('ca1.crt'),
    serverCert: rd('server.crt'),
    serverKey: rd('server.key'),
    clientCert: rd('client.crt'),
    clientKey: rd('client.key'),
    otherCa: rd('ca2.crt'),
    otherClientCert: rd('other.crt'),
    otherClientKey: rd('other.key'),
  };
}
