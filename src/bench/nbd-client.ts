// A small NBD client over node:net, written for the tests and the benchmark: it speaks the fixed newstyle
// handshake (optionally structured replies and base:allocation), pipelines requests and
// matches replies by cookie (they may come out of order). It also exposes the raw pieces
// (byte reader, frame builders, `rawRequest`) the bad-input tests use to send malformed
// traffic on purpose.
import net from 'node:net';
import tls from 'node:tls';

export const NBDMAGIC = 0x4e42444d41474943n;
export const IHAVEOPT = 0x49484156454f5054n;
export const OPT_REPLY_MAGIC = 0x0003e889045565a9n;
export const REQUEST_MAGIC = 0x25609513;
export const SIMPLE_REPLY_MAGIC = 0x67446698;
export const STRUCTURED_REPLY_MAGIC = 0x668e33ef;

export const OPT = {
  EXPORT_NAME: 1,
  ABORT: 2,
  LIST: 3,
  STARTTLS: 5,
  INFO: 6,
  GO: 7,
  STRUCTURED_REPLY: 8,
  LIST_META_CONTEXT: 9,
  SET_META_CONTEXT: 10,
  EXTENDED_HEADERS: 11,
} as const;

export const REP = {
  ACK: 1,
  SERVER: 2,
  INFO: 3,
  META_CONTEXT: 4,
  ERR_UNSUP: 0x80000001,
  ERR_POLICY: 0x80000002,
  ERR_INVALID: 0x80000003,
  ERR_PLATFORM: 0x80000004,
  ERR_TLS_REQD: 0x80000005,
  ERR_UNKNOWN: 0x80000006,
  ERR_SHUTDOWN: 0x80000007,
  ERR_BLOCK_SIZE_REQD: 0x80000008,
  ERR_TOO_BIG: 0x80000009,
} as const;

export const CMD = {
  READ: 0,
  WRITE: 1,
  DISC: 2,
  FLUSH: 3,
  TRIM: 4,
  CACHE: 5,
  WRITE_ZEROES: 6,
  BLOCK_STATUS: 7,
} as const;

export const CMD_FLAG = {
  FUA: 1 << 0,
  NO_HOLE: 1 << 1,
  DF: 1 << 2,
  REQ_ONE: 1 << 3,
  FAST_ZERO: 1 << 4,
} as const;

export const TX_FLAG = {
  HAS_FLAGS: 1 << 0,
  READ_ONLY: 1 << 1,
  SEND_FLUSH: 1 << 2,
  SEND_FUA: 1 << 3,
  ROTATIONAL: 1 << 4,
  SEND_TRIM: 1 << 5,
  SEND_WRITE_ZEROES: 1 << 6,
  SEND_DF: 1 << 7,
  CAN_MULTI_CONN: 1 << 8,
  SEND_CACHE: 1 << 10,
  SEND_FAST_ZERO: 1 << 11,
} as const;

export const ERRNO = {
  EPERM: 1,
  EIO: 5,
  ENOMEM: 12,
  EINVAL: 22,
  ENOSPC: 28,
  EOVERFLOW: 75,
  ENOTSUP: 95,
  ESHUTDOWN: 108,
} as const;

/** Where an NBD server listens: a unix socket path or a TCP host/port. */
export type NbdTarget = { socketPath: string } | { host: string; port: number };

/**
 * Parses `unix:/path`, `tcp:HOST:PORT`, `nbd+unix:///?socket=/path` or `nbd://HOST:PORT/`.
 */
export function parseTarget(spec: string): NbdTarget {
  if (spec.startsWith('unix:')) return { socketPath: spec.slice(5) };
  if (spec.startsWith('tcp:')) {
    const at = spec.lastIndexOf(':');
    return { host: spec.slice(4, at), port: Number(spec.slice(at + 1)) };
  }
  const u = new URL(spec);
  if (u.protocol === 'nbd+unix:') {
    const s = u.searchParams.get('socket');
    if (!s) throw new Error(`no socket in ${spec}`);
    return { socketPath: s };
  }
  if (u.protocol === 'nbd:') return { host: u.hostname, port: Number(u.port || 10809) };
  throw new Error(`unsupported NBD address ${spec}`);
}

export class NbdClosedError extends Error {
  constructor(message = 'NBD connection closed') {
    super(message);
    this.name = 'NbdClosedError';
  }
}

/** An NBD error reply (errno is the NBD error number). */
export class NbdReplyError extends Error {
  constructor(
    readonly errno: number,
    what: string,
  ) {
    super(`${what}: NBD error ${errno}`);
    this.name = 'NbdReplyError';
  }
}

/** Reads exact byte counts from a socket; resolves `null` on EOF (connection closed). */
export class SocketReader {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private ended = false;
  private waiter: (() => void) | null = null;
  error: Error | null = null;

  readonly #onData = (d: Buffer): void => {
    this.chunks.push(d);
    this.buffered += d.length;
    this.wake();
  };
  readonly #onEnd = (): void => {
    this.ended = true;
    this.wake();
  };
  readonly #onError = (e: Error): void => {
    this.error = e;
    this.ended = true;
    this.wake();
  };

  constructor(readonly socket: net.Socket) {
    socket.on('data', this.#onData);
    socket.on('end', this.#onEnd);
    socket.on('close', this.#onEnd);
    socket.on('error', this.#onError);
  }

  /** Stops reading the socket (before STARTTLS hands it to TLS); nothing may be buffered. */
  detach(): void {
    if (this.buffered !== 0) throw new Error(`${this.buffered} bytes received before the TLS handshake`);
    this.socket.off('data', this.#onData);
    this.socket.off('end', this.#onEnd);
    this.socket.off('close', this.#onEnd);
    this.socket.off('error', this.#onError);
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  get isEnded(): boolean {
    return this.ended && this.buffered === 0;
  }

  /** Exactly `n` bytes, or null if the peer closed first. */
  async read(n: number): Promise<Buffer | null> {
    while (this.buffered < n) {
      if (this.ended) return null;
      await new Promise<void>((r) => (this.waiter = r));
    }
    if (n === 0) return Buffer.alloc(0);
    // Join only as many chunks as this read needs (a long backlog is not re-copied).
    let have = 0;
    let k = 0;
    while (have < n) have += this.chunks[k++]!.length;
    const head = k === 1 ? this.chunks[0]! : Buffer.concat(this.chunks.slice(0, k), have);
    const out = head.subarray(0, n);
    const rest = head.subarray(n);
    this.chunks.splice(0, k, ...(rest.length ? [rest] : []));
    this.buffered -= n;
    return out;
  }

  /** Like read() but throws NbdClosedError on EOF. */
  async readExact(n: number): Promise<Buffer> {
    const b = await this.read(n);
    if (!b) throw new NbdClosedError(`connection closed while reading ${n} bytes`);
    return b;
  }

  /** Resolves true once the peer has closed (EOF), false after `ms` without EOF. */
  async waitClosed(ms: number): Promise<boolean> {
    const deadline = Date.now() + ms;
    while (!this.ended) {
      const left = deadline - Date.now();
      if (left <= 0) return false;
      await new Promise<void>((r) => {
        const t = setTimeout(r, left);
        this.waiter = () => {
          clearTimeout(t);
          r();
        };
      });
    }
    return true;
  }

  /** What has been received and not consumed yet (not consumed by this call either). */
  peek(): Buffer {
    return Buffer.concat(this.chunks);
  }

  /**
   * The error of the first transmission reply in the buffer: 0 = success, >0 = NBD error,
   * null = no complete reply header received yet.
   */
  peekReplyError(): number | null {
    const b = this.peek();
    if (b.length >= 16 && b.readUInt32BE(0) === SIMPLE_REPLY_MAGIC) return b.readUInt32BE(4);
    if (b.length >= 20 && b.readUInt32BE(0) === STRUCTURED_REPLY_MAGIC) {
      const type = b.readUInt16BE(6);
      if (type & 0x8000) return b.length >= 24 ? b.readUInt32BE(20) || ERRNO.EIO : ERRNO.EIO;
      return 0;
    }
    return null;
  }
}

export async function connectSocket(target: NbdTarget, timeoutMs = 10_000): Promise<net.Socket> {
  return await new Promise<net.Socket>((resolve, reject) => {
    const s = 'socketPath' in target ? net.createConnection({ path: target.socketPath }) : net.createConnection({ host: target.host, port: target.port });
    const t = setTimeout(() => {
      s.destroy();
      reject(new Error('connect timed out'));
    }, timeoutMs);
    s.once('connect', () => {
      clearTimeout(t);
      s.setNoDelay(true);
      resolve(s);
    });
    s.once('error', (e) => {
      clearTimeout(t);
      reject(e);
    });
  });
}

// ---- frame builders (exported for the bad-input tests) ----

/** Option request: IHAVEOPT, u32 option, u32 length, data (length may lie when given). */
export function optionFrame(option: number, data: Buffer = Buffer.alloc(0), lengthOverride?: number): Buffer {
  const h = Buffer.alloc(16);
  h.writeBigUInt64BE(IHAVEOPT, 0);
  h.writeUInt32BE(option >>> 0, 8);
  h.writeUInt32BE((lengthOverride ?? data.length) >>> 0, 12);
  return Buffer.concat([h, data]);
}

/** GO/INFO payload: u32 name length, name, u16 count, count x u16 info types. */
export function goPayload(name: string, infos: number[] = [], nameLengthOverride?: number): Buffer {
  const n = Buffer.from(name, 'utf8');
  const b = Buffer.alloc(4 + n.length + 2 + infos.length * 2);
  b.writeUInt32BE((nameLengthOverride ?? n.length) >>> 0, 0);
  n.copy(b, 4);
  b.writeUInt16BE(infos.length, 4 + n.length);
  infos.forEach((t, i) => b.writeUInt16BE(t, 6 + n.length + i * 2));
  return b;
}

/** SET/LIST_META_CONTEXT payload: u32 export length, export, u32 query count, queries. */
export function metaContextPayload(exportName: string, queries: string[]): Buffer {
  const parts: Buffer[] = [];
  const e = Buffer.from(exportName);
  const h = Buffer.alloc(4);
  h.writeUInt32BE(e.length);
  parts.push(h, e);
  const c = Buffer.alloc(4);
  c.writeUInt32BE(queries.length);
  parts.push(c);
  for (const q of queries) {
    const qb = Buffer.from(q);
    const l = Buffer.alloc(4);
    l.writeUInt32BE(qb.length);
    parts.push(l, qb);
  }
  return Buffer.concat(parts);
}

/** Transmission request header (28 bytes); offset as bigint so tests can send 2^64-1. */
export function requestFrame(type: number, flags: number, cookie: bigint, offset: bigint, length: number, magic = REQUEST_MAGIC): Buffer {
  const b = Buffer.alloc(28);
  b.writeUInt32BE(magic >>> 0, 0);
  b.writeUInt16BE(flags & 0xffff, 4);
  b.writeUInt16BE(type & 0xffff, 6);
  b.writeBigUInt64BE(cookie, 8);
  b.writeBigUInt64BE(offset, 16);
  b.writeUInt32BE(length >>> 0, 24);
  return b;
}

export interface OptionReply {
  option: number;
  type: number;
  data: Buffer;
}

/** Reads one option reply (throws on bad magic or EOF). */
export async function readOptionReply(reader: SocketReader): Promise<OptionReply> {
  const h = await reader.readExact(20);
  const magic = h.readBigUInt64BE(0);
  if (magic !== OPT_REPLY_MAGIC) throw new Error(`bad option reply magic 0x${magic.toString(16)}`);
  const len = h.readUInt32BE(16);
  if (len > 64 << 20) throw new Error(`option reply length ${len} is absurd`);
  return { option: h.readUInt32BE(8), type: h.readUInt32BE(12), data: await reader.readExact(len) };
}

/** Reads the server greeting; returns the handshake flags. */
export async function readGreeting(reader: SocketReader): Promise<number> {
  const g = await reader.readExact(18);
  if (g.readBigUInt64BE(0) !== NBDMAGIC) throw new Error('bad NBDMAGIC in greeting');
  if (g.readBigUInt64BE(8) !== IHAVEOPT) throw new Error('server is not newstyle (no IHAVEOPT)');
  return g.readUInt16BE(16);
}

export interface NbdConnectOptions {
  exportName?: string;
  /** Negotiate structured replies (default true). */
  structured?: boolean;
  /** Negotiate base:allocation (needs structured; default true). */
  blockStatus?: boolean;
  timeoutMs?: number;
  /**
   * NBD_OPT_STARTTLS first, then TLS with this material (PEM text; `cert`/`key` omitted:
   * no client certificate). `servername`: the name to check in the server's certificate
   * (default: none checked beyond the CA).
   */
  tls?: { ca: string; cert?: string; key?: string; servername?: string };
}

/** The TLS handshake on a socket that has just had STARTTLS acknowledged. */
async function startTls(socket: net.Socket, o: NonNullable<NbdConnectOptions['tls']>): Promise<tls.TLSSocket> {
  return await new Promise<tls.TLSSocket>((resolve, reject) => {
    const t = tls.connect({
      socket,
      ca: o.ca,
      ...(o.cert !== undefined ? { cert: o.cert, key: o.key } : {}),
      ...(o.servername !== undefined ? { servername: o.servername } : { checkServerIdentity: () => undefined }),
    });
    t.once('secureConnect', () => {
      t.off('error', reject);
      resolve(t);
    });
    t.once('error', reject);
  });
}

export interface BlockStatusExtent {
  length: number;
  flags: number;
}

export interface RawReply {
  /** NBD error number, 0 on success. */
  error: number;
  data: Buffer | null;
  extents: BlockStatusExtent[];
  /** Structured chunks seen (types), for tests that check reply shapes. */
  chunkTypes: number[];
}

interface Pending {
  type: number;
  offset: bigint;
  length: number;
  reply: RawReply;
  resolve: (r: RawReply) => void;
  reject: (e: Error) => void;
}

/** One negotiated NBD connection in the transmission phase. */
export class NbdClient {
  sizeBytes = 0;
  transmissionFlags = 0;
  structured = false;
  metaContextId: number | null = null;
  blockSize: { min: number; preferred: number; max: number } | null = null;
  private nextCookie = 1n;
  private pending = new Map<bigint, Pending>();
  private closedError: Error | null = null;
  /** Set when the server sent something that is not valid NBD (a server bug). */
  protocolViolation: string | null = null;
  private detached = false;
  /** Resolves when the reply loop ends (connection closed). */
  readonly done: Promise<void>;
  private doneResolve!: () => void;

  private constructor(
    readonly socket: net.Socket,
    readonly reader: SocketReader,
  ) {
    this.done = new Promise((r) => (this.doneResolve = r));
  }

  static async connect(target: NbdTarget | string, opts: NbdConnectOptions = {}): Promise<NbdClient> {
    const t = typeof target === 'string' ? parseTarget(target) : target;
    let socket: net.Socket = await connectSocket(t, opts.timeoutMs);
    let reader = new SocketReader(socket);
    let greeted = false;
    if (opts.tls) {
      try {
        await NbdClient.greet(socket, reader);
        socket.write(optionFrame(OPT.STARTTLS));
        const r = await readOptionReply(reader);
        if (r.type !== REP.ACK) throw new Error(`STARTTLS refused: reply type 0x${r.type.toString(16)} ${r.data.subarray(0, 200).toString()}`);
        reader.detach();
        socket = await startTls(socket, opts.tls);
        reader = new SocketReader(socket);
        greeted = true;
      } catch (e) {
        socket.destroy();
        throw e;
      }
    }
    const c = new NbdClient(socket, reader);
    try {
      await c.handshake(opts, greeted);
    } catch (e) {
      socket.destroy();
      throw e;
    }
    void c.replyLoop();
    return c;
  }

  private static async greet(socket: net.Socket, reader: SocketReader): Promise<void> {
    const hflags = await readGreeting(reader);
    const cflags = Buffer.alloc(4);
    cflags.writeUInt32BE(1 | (hflags & 2));
    socket.write(cflags);
  }

  private async handshake(opts: NbdConnectOptions, greeted: boolean): Promise<void> {
    const name = opts.exportName ?? '';
    if (!greeted) await NbdClient.greet(this.socket, this.reader);
    if (opts.structured ?? true) {
      this.socket.write(optionFrame(OPT.STRUCTURED_REPLY));
      const r = await readOptionReply(this.reader);
      if (r.type !== REP.ACK) throw new Error(`STRUCTURED_REPLY refused: reply type 0x${r.type.toString(16)}`);
      this.structured = true;
      if (opts.blockStatus ?? true) {
        this.socket.write(optionFrame(OPT.SET_META_CONTEXT, metaContextPayload(name, ['base:allocation'])));
        for (;;) {
          const m = await readOptionReply(this.reader);
          if (m.type === REP.META_CONTEXT) this.metaContextId = m.data.readUInt32BE(0);
          else if (m.type === REP.ACK) break;
          else throw new Error(`SET_META_CONTEXT failed: reply type 0x${m.type.toString(16)}`);
        }
      }
    }
    this.socket.write(optionFrame(OPT.GO, goPayload(name, [3])));
    for (;;) {
      const r = await readOptionReply(this.reader);
      if (r.type === REP.INFO) {
        const it = r.data.readUInt16BE(0);
        if (it === 0) {
          this.sizeBytes = Number(r.data.readBigUInt64BE(2));
          this.transmissionFlags = r.data.readUInt16BE(10);
        } else if (it === 3) {
          this.blockSize = { min: r.data.readUInt32BE(2), preferred: r.data.readUInt32BE(6), max: r.data.readUInt32BE(10) };
        }
      } else if (r.type === REP.ACK) {
        break;
      } else {
        throw new Error(`GO failed: reply type 0x${r.type.toString(16)} ${r.data.subarray(0, 200).toString()}`);
      }
    }
  }

  private fail(e: Error): void {
    if (!this.closedError) this.closedError = e;
    for (const p of this.pending.values()) p.reject(this.closedError);
    this.pending.clear();
  }

  private violation(msg: string): void {
    if (this.detached) {
      // The test took over the socket and sent something odd on purpose.
      this.fail(new NbdClosedError('detached'));
      return;
    }
    this.protocolViolation ??= msg;
    this.fail(new Error(`server protocol violation: ${msg}`));
    this.socket.destroy();
  }

  private async replyLoop(): Promise<void> {
    try {
      for (;;) {
        const m = await this.reader.read(4);
        if (!m) break;
        const magic = m.readUInt32BE(0);
        if (magic === SIMPLE_REPLY_MAGIC) {
          const h = await this.reader.readExact(12);
          const error = h.readUInt32BE(0);
          const cookie = h.readBigUInt64BE(4);
          const p = this.pending.get(cookie);
          if (!p) return this.violation(`simple reply for unknown cookie ${cookie}`);
          this.pending.delete(cookie);
          p.reply.error = error;
          if (error === 0 && p.type === CMD.READ) p.reply.data = await this.reader.readExact(p.length);
          p.resolve(p.reply);
        } else if (magic === STRUCTURED_REPLY_MAGIC) {
          if (!this.structured) return this.violation('structured reply without negotiation');
          const h = await this.reader.readExact(16);
          const flags = h.readUInt16BE(0);
          const type = h.readUInt16BE(2);
          const cookie = h.readBigUInt64BE(4);
          const len = h.readUInt32BE(12);
          const p = this.pending.get(cookie);
          if (!p) return this.violation(`structured chunk for unknown cookie ${cookie}`);
          if (len > (64 << 20)) return this.violation(`chunk length ${len}`);
          const body = await this.reader.readExact(len);
          p.reply.chunkTypes.push(type);
          if (type === 1) {
            const off = body.readBigUInt64BE(0) - p.offset;
            if (off < 0n || Number(off) + len - 8 > p.length) return this.violation('OFFSET_DATA outside the request');
            p.reply.data ??= Buffer.alloc(p.length);
            body.copy(p.reply.data, Number(off), 8);
          } else if (type === 2) {
            const off = body.readBigUInt64BE(0) - p.offset;
            const size = body.readUInt32BE(8);
            if (off < 0n || Number(off) + size > p.length) return this.violation('OFFSET_HOLE outside the request');
            p.reply.data ??= Buffer.alloc(p.length);
            p.reply.data.fill(0, Number(off), Number(off) + size);
          } else if (type === 5) {
            for (let i = 4; i + 8 <= body.length; i += 8) p.reply.extents.push({ length: body.readUInt32BE(i), flags: body.readUInt32BE(i + 4) });
          } else if (type & 0x8000) {
            p.reply.error ||= body.readUInt32BE(0) || ERRNO.EIO;
          } else if (type !== 0) {
            return this.violation(`unknown chunk type ${type}`);
          }
          if (flags & 1) {
            this.pending.delete(cookie);
            if (p.type === CMD.READ && p.reply.error === 0 && !p.reply.data) p.reply.data = Buffer.alloc(p.length);
            p.resolve(p.reply);
          }
        } else {
          return this.violation(`bad reply magic 0x${magic.toString(16)}`);
        }
      }
      this.fail(new NbdClosedError());
    } catch (e) {
      this.fail(e as Error);
    } finally {
      this.doneResolve();
    }
  }

  get isClosed(): boolean {
    return this.closedError !== null;
  }

  /**
   * Sends one request exactly as given (bad flags, types, offsets are allowed) and resolves
   * with the reply; rejects with NbdClosedError if the server drops the connection first.
   */
  rawRequest(type: number, flags: number, offset: bigint | number, length: number, payload?: Uint8Array, opts: { expectReply?: boolean; magic?: number } = {}): Promise<RawReply> {
    if (this.closedError) return Promise.reject(this.closedError);
    const cookie = this.nextCookie++;
    const off = BigInt(offset);
    const frame = requestFrame(type, flags, cookie, off, length, opts.magic);
    const reply: RawReply = { error: 0, data: null, extents: [], chunkTypes: [] };
    const result = new Promise<RawReply>((resolve, reject) => {
      if (opts.expectReply === false) resolve(reply);
      else this.pending.set(cookie, { type, offset: off, length, reply, resolve, reject });
    });
    if (payload) this.socket.write(Buffer.concat([frame, payload]));
    else this.socket.write(frame);
    return result;
  }

  private async checked(what: string, p: Promise<RawReply>): Promise<RawReply> {
    const r = await p;
    if (r.error !== 0) throw new NbdReplyError(r.error, what);
    return r;
  }

  async read(offset: number, length: number, flags = 0): Promise<Buffer> {
    const r = await this.checked(`READ ${offset}+${length}`, this.rawRequest(CMD.READ, flags, offset, length));
    return r.data ?? Buffer.alloc(length);
  }

  async write(offset: number, data: Uint8Array, flags = 0): Promise<void> {
    await this.checked(`WRITE ${offset}+${data.length}`, this.rawRequest(CMD.WRITE, flags, offset, data.length, data));
  }

  async flush(): Promise<void> {
    await this.checked('FLUSH', this.rawRequest(CMD.FLUSH, 0, 0, 0));
  }

  async trim(offset: number, length: number, flags = 0): Promise<void> {
    await this.checked(`TRIM ${offset}+${length}`, this.rawRequest(CMD.TRIM, flags, offset, length));
  }

  async writeZeroes(offset: number, length: number, flags = 0): Promise<void> {
    await this.checked(`WRITE_ZEROES ${offset}+${length}`, this.rawRequest(CMD.WRITE_ZEROES, flags, offset, length));
  }

  async blockStatus(offset: number, length: number, flags = 0): Promise<BlockStatusExtent[]> {
    const r = await this.checked(`BLOCK_STATUS ${offset}+${length}`, this.rawRequest(CMD.BLOCK_STATUS, flags, offset, length));
    return r.extents;
  }

  /** Polite close: NBD_CMD_DISC, then end the socket. */
  async disconnect(): Promise<void> {
    if (!this.closedError) {
      this.socket.write(requestFrame(CMD.DISC, 0, this.nextCookie++, 0n, 0));
      this.socket.end();
    }
    await Promise.race([this.done, new Promise((r) => setTimeout(r, 2000))]);
    this.socket.destroy();
  }

  /**
   * Hands the raw socket to the caller (who will send malformed traffic): the reply loop
   * stops judging what arrives, and a fresh reader sees everything from now on.
   */
  detach(): SocketReader {
    this.detached = true;
    return new SocketReader(this.socket);
  }

  /** Abrupt close (a client vanishing). */
  destroy(): void {
    this.socket.destroy();
  }
}
