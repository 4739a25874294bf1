// A generated corpus of bad (and some good) NBD traffic, and the workers that play it
// against a server. Every case says what a correct server must do: a specific NBD error
// (or option error) reply, or dropping that connection; well-formed cases in between must
// still succeed with the right data. Deterministic: each worker has its own seeded PRNG.
//
// Volume layout the corpus assumes (see bad-input.test.ts): each transmission worker owns a
// HOME region it writes valid data to (checked on read-back and at the end); requests that
// may legitimately change data without success (rejected or torn writes) only aim at the
// SCRATCH region.
import net from 'node:net';
import {
  CMD,
  CMD_FLAG,
  connectSocket,
  ERRNO,
  goPayload,
  metaContextPayload,
  NbdClient,
  NbdClosedError,
  type NbdTarget,
  OPT,
  optionFrame,
  readGreeting,
  readOptionReply,
  REP,
  requestFrame,
  SocketReader,
  TX_FLAG,
} from './nbd-client.js';
import { Rng } from './pattern.js';

export const MiB = 1 << 20;
/** Requests larger than this are refused (the server's advertised maximum). */
export const MAX_REQUEST = 32 * MiB;

export interface FuzzLayout {
  sizeBytes: number;
  /** First byte of worker i's home region is homeBase + i * homeBytes. */
  homeBase: number;
  homeBytes: number;
  scratchBase: number;
  scratchBytes: number;
}

export interface FuzzTally {
  cases: number;
  /** Cases answered with the expected error (or success). */
  answered: number;
  /** Cases that ended in a dropped connection (allowed for bad input). */
  dropped: number;
  connections: number;
  /** Count per case kind, for the report. */
  kinds: Record<string, number>;
  failures: string[];
}

export function newTally(): FuzzTally {
  return { cases: 0, answered: 0, dropped: 0, connections: 0, kinds: {}, failures: [] };
}

/** Sums per-worker tallies (each worker counts its own quota). */
export function mergeTallies(all: FuzzTally[]): FuzzTally {
  const t = newTally();
  for (const x of all) {
    t.cases += x.cases;
    t.answered += x.answered;
    t.dropped += x.dropped;
    t.connections += x.connections;
    for (const [k, v] of Object.entries(x.kinds)) t.kinds[k] = (t.kinds[k] ?? 0) + v;
    t.failures.push(...x.failures);
  }
  t.failures = t.failures.slice(0, MAX_FAILURES);
  return t;
}

const REPLY_TIMEOUT_MS = 10_000;
const MAX_FAILURES = 50;

function fail(t: FuzzTally, msg: string): void {
  if (t.failures.length < MAX_FAILURES) t.failures.push(msg);
}

function count(t: FuzzTally, kind: string): void {
  t.cases++;
  t.kinds[kind] = (t.kinds[kind] ?? 0) + 1;
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T | 'timeout'> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve('timeout'), ms);
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

const errName = (e: number): string => Object.entries(ERRNO).find(([, v]) => v === e)?.[0] ?? String(e);

// ------------------------------------------------------------------------------------------
// Transmission phase: many cases per connection.
// ------------------------------------------------------------------------------------------

/** Flags a command may carry (given what was negotiated); every other bit must be refused. */
function validFlags(type: number, c: NbdClient): number {
  let f = CMD_FLAG.FUA; // valid on every command once SEND_FUA is advertised
  if (type === CMD.READ && c.transmissionFlags & TX_FLAG.SEND_DF) f |= CMD_FLAG.DF;
  if (type === CMD.WRITE_ZEROES) {
    f |= CMD_FLAG.NO_HOLE;
    if (c.transmissionFlags & TX_FLAG.SEND_FAST_ZERO) f |= CMD_FLAG.FAST_ZERO;
  }
  if (type === CMD.BLOCK_STATUS) f |= CMD_FLAG.REQ_ONE;
  return f;
}

interface Worker {
  id: number;
  rng: Rng;
  target: NbdTarget;
  layout: FuzzLayout;
  tally: FuzzTally;
  /** What this worker's home region holds (valid writes applied on success). */
  home: Buffer;
  client: NbdClient | null;
}

async function ensureClient(w: Worker): Promise<NbdClient> {
  if (w.client && !w.client.isClosed) return w.client;
  w.client?.destroy();
  const structured = w.rng.chance(0.7);
  w.client = await NbdClient.connect(w.target, { structured, blockStatus: structured && w.rng.chance(0.8) });
  w.tally.connections++;
  return w.client;
}

/**
 * One request whose correct answer is known. `errnos` empty = must succeed; otherwise the
 * reply must carry one of them, or the server may drop the connection.
 */
async function expectReply(
  w: Worker,
  kind: string,
  type: number,
  flags: number,
  offset: bigint | number,
  length: number,
  payload: Buffer | undefined,
  errnos: number[],
  okAlso = false,
): Promise<{ data: Buffer | null; extents: { length: number; flags: number }[] } | null> {
  const c = await ensureClient(w);
  count(w.tally, kind);
  const what = `worker ${w.id} ${kind}: cmd ${type} flags 0x${flags.toString(16)} offset ${offset} length ${length}`;
  let r;
  try {
    r = await withTimeout(c.rawRequest(type, flags, offset, length, payload), REPLY_TIMEOUT_MS);
  } catch (e) {
    if (e instanceof NbdClosedError || c.isClosed) {
      if (c.protocolViolation) fail(w.tally, `${what}: server broke the protocol: ${c.protocolViolation}`);
      else if (errnos.length === 0) fail(w.tally, `${what}: valid request, but the server dropped the connection`);
      else w.tally.dropped++;
      return null;
    }
    throw e;
  }
  if (r === 'timeout') {
    fail(w.tally, `${what}: no reply within ${REPLY_TIMEOUT_MS} ms and connection still open`);
    c.destroy();
    return null;
  }
  if (r.error === 0 && errnos.length > 0 && !okAlso) {
    fail(w.tally, `${what}: expected ${errnos.map(errName).join('|')}, got success`);
  } else if (r.error !== 0 && !errnos.includes(r.error)) {
    fail(w.tally, `${what}: expected ${errnos.length ? errnos.map(errName).join('|') : 'success'}, got ${errName(r.error)}`);
  } else {
    w.tally.answered++;
  }
  return r.error === 0 ? r : null;
}

/** A valid write into the home region, then a read of it; the content must match. */
async function caseValidWriteRead(w: Worker): Promise<void> {
  const len = w.rng.pick([1, 7, 512, 4096, 5000, 65536]);
  const off = w.rng.int(w.layout.homeBytes - len);
  const abs = w.layout.homeBase + w.id * w.layout.homeBytes + off;
  const data = w.rng.bytes(len);
  const fua = w.rng.chance(0.2) ? CMD_FLAG.FUA : 0;
  const ok = await expectReply(w, 'valid-write', CMD.WRITE, fua, abs, len, data, []);
  if (!ok) return;
  data.copy(w.home, off);
  const rlen = w.rng.pick([len, Math.min(w.layout.homeBytes - off, len + 4096)]);
  const df = w.client!.transmissionFlags & TX_FLAG.SEND_DF && w.rng.chance(0.3) && rlen <= 65536 ? CMD_FLAG.DF : 0;
  const r = await expectReply(w, 'valid-read', CMD.READ, df, abs, rlen, undefined, []);
  if (r && !r.data?.equals(w.home.subarray(off, off + rlen))) {
    fail(w.tally, `worker ${w.id}: read back of ${abs}+${rlen} returned wrong data`);
  }
}

/** Every other case kind, chosen at random; all aim outside the home regions. */
async function caseBad(w: Worker): Promise<void> {
  const L = w.layout;
  const size = BigInt(L.sizeBytes);
  const scratch = L.scratchBase + w.rng.int(L.scratchBytes - 2 * MiB);
  const c = await ensureClient(w);
  const pastEndOffset = (len: number): bigint =>
    w.rng.pick([
      size - BigInt(len) + 1n + BigInt(w.rng.int(Math.max(1, len - 1))), // straddles the end
      size,
      size + BigInt(w.rng.int(1 << 30)),
      (1n << 63n) + BigInt(w.rng.u32()),
      (1n << 64n) - 1n - BigInt(w.rng.int(4096)), // offset + length wraps around 2^64
    ]);
  switch (w.rng.int(14)) {
    case 0: {
      const type = w.rng.pick([8, 9, 10, 31, 255, 256, 0x7fff, 0x8000, 0xffff, 8 + w.rng.int(0xfff7)]);
      await expectReply(w, 'unknown-command', type, 0, scratch, w.rng.int(65536), undefined, [ERRNO.EINVAL]);
      return;
    }
    case 1: {
      const type = w.rng.pick([CMD.READ, CMD.FLUSH, CMD.TRIM, CMD.CACHE, CMD.WRITE_ZEROES, CMD.BLOCK_STATUS]);
      const bad = ~validFlags(type, c) & 0xffff;
      let bit = 0;
      do bit = 1 << w.rng.int(16);
      while (!(bad & bit));
      const len = type === CMD.FLUSH ? 0 : 4096;
      await expectReply(w, 'bad-flags', type, bit | (validFlags(type, c) & w.rng.u32()), scratch, len, undefined, [ERRNO.EINVAL]);
      return;
    }
    case 2: {
      const bad = ~validFlags(CMD.WRITE, c) & 0xffff;
      let bit = 0;
      do bit = 1 << w.rng.int(16);
      while (!(bad & bit));
      const len = w.rng.pick([1, 512, 4096]);
      await expectReply(w, 'bad-flags-write', CMD.WRITE, bit, scratch, len, w.rng.bytes(len), [ERRNO.EINVAL]);
      return;
    }
    case 3: {
      const len = w.rng.pick([1, 512, 4096, 65536]);
      await expectReply(w, 'read-past-end', CMD.READ, 0, pastEndOffset(len), len, undefined, [ERRNO.EINVAL]);
      return;
    }
    case 4: {
      const len = w.rng.pick([1, 512, 4096]);
      await expectReply(w, 'write-past-end', CMD.WRITE, 0, pastEndOffset(len), len, w.rng.bytes(len), [ERRNO.ENOSPC, ERRNO.EINVAL]);
      return;
    }
    case 5: {
      const type = w.rng.pick([CMD.TRIM, CMD.WRITE_ZEROES, CMD.CACHE]);
      const len = w.rng.pick([1, 4096, 1 << 20]);
      await expectReply(w, 'range-past-end', type, 0, pastEndOffset(len), len, undefined, [ERRNO.EINVAL, ERRNO.ENOSPC]);
      return;
    }
    case 6: {
      const len = w.rng.pick([MAX_REQUEST + 1, MAX_REQUEST + 4096, 64 * MiB, 0x7fffffff, 0xffffffff]);
      await expectReply(w, 'read-too-big', CMD.READ, 0, w.rng.pick([0, scratch]), len, undefined, [ERRNO.EINVAL, ERRNO.EOVERFLOW, ERRNO.ENOMEM]);
      return;
    }
    case 7: {
      if (c.metaContextId === null) {
        await expectReply(w, 'block-status-unnegotiated', CMD.BLOCK_STATUS, 0, scratch, 4096, undefined, [ERRNO.EINVAL]);
      } else {
        const len = w.rng.pick([1, 4096]);
        await expectReply(w, 'block-status-past-end', CMD.BLOCK_STATUS, 0, pastEndOffset(len), len, undefined, [ERRNO.EINVAL]);
      }
      return;
    }
    case 8: {
      // Valid odds and ends: FUA on reads and flushes, CACHE, block status within the export.
      const pick = w.rng.int(4);
      if (pick === 0) await expectReply(w, 'fua-read', CMD.READ, CMD_FLAG.FUA, scratch, 4096, undefined, []);
      else if (pick === 1) await expectReply(w, 'flush', CMD.FLUSH, w.rng.chance(0.5) ? CMD_FLAG.FUA : 0, 0, 0, undefined, []);
      else if (pick === 2) await expectReply(w, 'cache', CMD.CACHE, 0, scratch, 65536, undefined, []);
      else if (c.metaContextId !== null) {
        const len = w.rng.range(1, 8 * MiB);
        const r = await expectReply(w, 'block-status', CMD.BLOCK_STATUS, w.rng.chance(0.5) ? CMD_FLAG.REQ_ONE : 0, w.rng.int(L.sizeBytes - len), len, undefined, []);
        if (r) {
          const sum = r.extents.reduce((a, e) => a + e.length, 0);
          if (r.extents.length === 0 || sum > len || r.extents.some((e) => e.length === 0)) {
            fail(w.tally, `worker ${w.id}: block status for ${len} bytes returned ${JSON.stringify(r.extents.slice(0, 8))} (sum ${sum})`);
          }
        }
      } else await expectReply(w, 'flush', CMD.FLUSH, 0, 0, 0, undefined, []);
      return;
    }
    case 9: {
      // Zero-length requests: harmless either way (success or EINVAL), never a hang or crash.
      const type = w.rng.pick([CMD.READ, CMD.WRITE, CMD.TRIM, CMD.WRITE_ZEROES]);
      await expectReply(w, 'zero-length', type, 0, scratch, 0, type === CMD.WRITE ? Buffer.alloc(0) : undefined, [ERRNO.EINVAL], true);
      return;
    }
    case 10: {
      // FLUSH with the reserved offset/length fields set.
      await expectReply(w, 'flush-nonzero-fields', CMD.FLUSH, 0, scratch, 4096, undefined, [ERRNO.EINVAL], true);
      return;
    }
    case 11: {
      // Valid trims and zeroes in scratch (content there is not modelled).
      const type = w.rng.pick([CMD.TRIM, CMD.WRITE_ZEROES]);
      const fl = type === CMD.WRITE_ZEROES && w.rng.chance(0.5) ? CMD_FLAG.NO_HOLE : 0;
      await expectReply(w, 'trim-zero', type, fl, scratch, w.rng.pick([1, 4096, 1 << 20]), undefined, []);
      return;
    }
    default:
      await caseValidWriteRead(w);
  }
}

/** Cases after which the connection is gone (by our doing or the server's). */
async function caseTerminal(w: Worker): Promise<void> {
  const c = await ensureClient(w);
  const L = w.layout;
  const scratch = L.scratchBase + w.rng.int(L.scratchBytes - 2 * MiB);
  const kind = w.rng.pick(['bad-magic', 'garbage', 'truncated-header', 'partial-write', 'write-too-big', 'vanish-with-reads', 'mutated-header', 'disc-with-reads'] as const);
  count(w.tally, kind);
  w.client = null;
  const what = `worker ${w.id} ${kind}`;
  const sock = c.socket;
  const reader = c.detach();
  switch (kind) {
    case 'bad-magic': {
      let magic = w.rng.u32();
      if (magic === 0x25609513) magic ^= 1;
      sock.write(requestFrame(CMD.READ, 0, 1n, BigInt(scratch), 4096, magic));
      if (await reader.waitClosed(REPLY_TIMEOUT_MS)) w.tally.dropped++;
      else fail(w.tally, `${what}: request with magic 0x${magic.toString(16)} did not drop the connection`);
      break;
    }
    case 'garbage': {
      const g = w.rng.bytes(w.rng.range(1, 300));
      if (g.length >= 4 && g.readUInt32BE(0) === 0x25609513) g[0] ^= 0xff;
      sock.write(g);
      if (g.length >= 28) {
        if (await reader.waitClosed(REPLY_TIMEOUT_MS)) w.tally.dropped++;
        else fail(w.tally, `${what}: ${g.length} garbage bytes did not drop the connection`);
      } else {
        // Fewer bytes than a header: the server waits for the rest; then we vanish.
        await new Promise((r) => setTimeout(r, 5));
        w.tally.dropped++;
      }
      break;
    }
    case 'truncated-header': {
      sock.write(requestFrame(CMD.READ, 0, 1n, BigInt(scratch), 4096).subarray(0, w.rng.range(1, 27)));
      w.tally.dropped++;
      break;
    }
    case 'partial-write': {
      const len = w.rng.pick([4096, 65536, 1 << 20]);
      sock.write(Buffer.concat([requestFrame(CMD.WRITE, 0, 1n, BigInt(scratch), len), w.rng.bytes(w.rng.int(len))]));
      await new Promise((r) => setTimeout(r, w.rng.int(3)));
      w.tally.dropped++;
      break;
    }
    case 'write-too-big': {
      // The payload never comes: the server may refuse at once, drop, or wait to discard it.
      const len = w.rng.pick([MAX_REQUEST + 1, 64 * MiB, 0xffffffff]);
      sock.write(requestFrame(CMD.WRITE, 0, 7n, BigInt(scratch), len));
      const closed = await reader.waitClosed(200);
      if (closed) w.tally.dropped++;
      else {
        // Either silence (discarding) or an error reply; anything but success is fine.
        const got = reader.peekReplyError();
        if (got === 0) fail(w.tally, `${what}: WRITE of ${len} bytes without payload was answered with success`);
        else w.tally.answered++;
      }
      break;
    }
    case 'vanish-with-reads': {
      const n = w.rng.range(1, 32);
      const frames: Buffer[] = [];
      for (let i = 0; i < n; i++) frames.push(requestFrame(CMD.READ, 0, BigInt(i + 1), BigInt(scratch + i * 65536), w.rng.pick([4096, 65536, 1 << 20])));
      sock.write(Buffer.concat(frames));
      await new Promise((r) => setTimeout(r, w.rng.int(2)));
      w.tally.dropped++;
      break;
    }
    case 'mutated-header': {
      // A valid READ with 1-3 bytes changed. Bytes 20-21 (offset bits 16-31 of the low word)
      // stay untouched, so a mutated request can only land in scratch or past the end.
      const f = requestFrame(CMD.READ, 0, 99n, BigInt(scratch), 4096);
      const positions = [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 15, 16, 17, 18, 19, 22, 23, 24, 25, 26, 27];
      for (let k = w.rng.range(1, 3); k > 0; k--) f[w.rng.pick(positions)] ^= 1 + w.rng.int(255);
      sock.write(f);
      await reader.waitClosed(50);
      w.tally.dropped++;
      break;
    }
    case 'disc-with-reads': {
      // DISC must answer what is in flight first, then close.
      const n = w.rng.range(1, 8);
      const frames: Buffer[] = [];
      for (let i = 0; i < n; i++) frames.push(requestFrame(CMD.READ, 0, BigInt(i + 1), BigInt(scratch), 4096));
      frames.push(requestFrame(CMD.DISC, 0, 1000n, 0n, 0));
      sock.write(Buffer.concat(frames));
      const replies = await countRepliesUntilClose(reader, n, c.structured, REPLY_TIMEOUT_MS);
      if (replies === 'timeout') fail(w.tally, `${what}: connection not closed ${REPLY_TIMEOUT_MS} ms after DISC`);
      else if (replies !== n) fail(w.tally, `${what}: ${replies} of ${n} reads answered before the server closed after DISC`);
      else w.tally.answered++;
      break;
    }
  }
  sock.destroy();
}

/** Counts complete READ(4096) replies (simple or structured) until EOF. */
async function countRepliesUntilClose(reader: SocketReader, expected: number, structured: boolean, ms: number): Promise<number | 'timeout'> {
  const deadline = Date.now() + ms;
  let done = 0;
  const run = async (): Promise<number> => {
    for (;;) {
      const m = await reader.read(4);
      if (!m) return done;
      if (m.readUInt32BE(0) === 0x67446698) {
        const h = await reader.read(12);
        if (!h) return done;
        if (h.readUInt32BE(0) === 0 && !(await reader.read(4096))) return done;
        done++;
      } else if (m.readUInt32BE(0) === 0x668e33ef && structured) {
        const h = await reader.read(16);
        if (!h) return done;
        if (!(await reader.read(h.readUInt32BE(12)))) return done;
        if (h.readUInt16BE(0) & 1) done++;
      } else {
        return -1;
      }
      if (done > expected) return done;
    }
  };
  const r = await withTimeout(run(), Math.max(1, deadline - Date.now()));
  return r;
}

/** Plays `cases` transmission-phase cases on one worker. */
export async function runTransmissionWorker(id: number, seed: number, target: NbdTarget, layout: FuzzLayout, cases: number, tally: FuzzTally): Promise<Buffer> {
  const w: Worker = { id, rng: new Rng(seed), target, layout, tally, home: Buffer.alloc(layout.homeBytes), client: null };
  const start = tally.cases;
  while (tally.cases - start < cases && tally.failures.length < MAX_FAILURES) {
    const p = w.rng.u32() / 2 ** 32;
    if (p < 0.2) await caseValidWriteRead(w);
    else if (p < 0.97) await caseBad(w);
    else await caseTerminal(w);
  }
  w.client?.destroy();
  return w.home;
}

// ------------------------------------------------------------------------------------------
// Handshake phase: one connection per session, several option cases per session.
// ------------------------------------------------------------------------------------------

const KNOWN_OPTIONS = new Set<number>([1, 2, 3, 5, 6, 7, 8, 9, 10, 11]);

interface HsSession {
  rng: Rng;
  sock: net.Socket;
  reader: SocketReader;
  tally: FuzzTally;
  id: string;
}

/** Sends an option and checks the reply type; returns false if the connection is gone. */
async function option(s: HsSession, kind: string, frame: Buffer, accept: (type: number) => boolean, expectText: string, dropOk: boolean): Promise<boolean> {
  count(s.tally, kind);
  s.sock.write(frame);
  let type: number;
  try {
    const r = await withTimeout(readFinalOptionReply(s.reader), REPLY_TIMEOUT_MS);
    if (r === 'timeout') {
      fail(s.tally, `${s.id} ${kind}: no option reply within ${REPLY_TIMEOUT_MS} ms`);
      return false;
    }
    type = r;
  } catch (e) {
    if (e instanceof NbdClosedError) {
      if (dropOk) s.tally.dropped++;
      else fail(s.tally, `${s.id} ${kind}: server dropped the connection, expected ${expectText}`);
      return false;
    }
    fail(s.tally, `${s.id} ${kind}: ${(e as Error).message}`);
    return false;
  }
  if (accept(type)) s.tally.answered++;
  else fail(s.tally, `${s.id} ${kind}: option reply type 0x${type.toString(16)}, expected ${expectText}`);
  return true;
}

/** Reads option replies up to the final one (ACK or an error); returns its type. */
async function readFinalOptionReply(reader: SocketReader): Promise<number> {
  for (;;) {
    const r = await readOptionReply(reader);
    if (r.type === REP.ACK || r.type & 0x80000000) return r.type;
  }
}

const isErr = (t: number): boolean => (t & 0x80000000) !== 0;

async function handshakeSession(id: string, seed: number, target: NbdTarget, tally: FuzzTally, goodRead: (c: NbdClient) => Promise<void>): Promise<void> {
  const rng = new Rng(seed);
  const sock = await connectSocket(target);
  tally.connections++;
  const reader = new SocketReader(sock);
  const s: HsSession = { rng, sock, reader, tally, id };
  try {
    await readGreeting(reader);
    const kind = rng.int(10);
    if (kind === 0) {
      // Unknown client flag bits: the server must close without negotiating.
      count(tally, 'bad-client-flags');
      const flags = (rng.u32() | (1 << (2 + rng.int(30)))) >>> 0;
      const b = Buffer.alloc(4);
      b.writeUInt32BE(flags);
      sock.write(Buffer.concat([b, optionFrame(OPT.LIST)]));
      if (await reader.waitClosed(REPLY_TIMEOUT_MS)) tally.dropped++;
      else fail(tally, `${id}: client flags 0x${flags.toString(16)} accepted`);
      return;
    }
    if (kind === 1) {
      // Vanish during the handshake: after the greeting, or mid-option.
      count(tally, 'handshake-vanish');
      if (rng.chance(0.5)) sock.write(Buffer.concat([Buffer.from([0, 0, 0, 3]), optionFrame(OPT.GO, goPayload('', [])).subarray(0, rng.range(1, 20))]));
      tally.dropped++;
      return;
    }
    sock.write(Buffer.from([0, 0, 0, 3])); // FIXED_NEWSTYLE | NO_ZEROES
    if (kind === 2) {
      // Wrong option magic: drop.
      count(tally, 'bad-option-magic');
      const f = optionFrame(OPT.GO, goPayload('', []));
      f[rng.int(8)] ^= 1 + rng.int(255);
      sock.write(f);
      if (await reader.waitClosed(REPLY_TIMEOUT_MS)) tally.dropped++;
      else fail(tally, `${id}: option with bad magic did not drop the connection`);
      return;
    }
    if (kind === 3) {
      // Garbage instead of options.
      count(tally, 'handshake-garbage');
      sock.write(rng.bytes(rng.range(16, 200)));
      if (await reader.waitClosed(REPLY_TIMEOUT_MS)) tally.dropped++;
      else fail(tally, `${id}: garbage options did not drop the connection`);
      return;
    }
    if (kind === 4) {
      // An option whose length is huge: the server may refuse (TOO_BIG/INVALID) or drop; it
      // must not wait forever holding memory. We send nothing more and vanish.
      count(tally, 'option-length-huge');
      sock.write(optionFrame(rng.pick([OPT.GO, OPT.INFO, OPT.LIST, 4242]), Buffer.alloc(0), rng.pick([0xffffffff, 0x7fffffff, 64 << 20])));
      await reader.waitClosed(100);
      tally.dropped++;
      return;
    }
    if (kind === 5 && rng.chance(0.5)) {
      // EXPORT_NAME (the old way in, QEMU's fallback): size + flags, no zeroes (we asked
      // NO_ZEROES), then transmission with simple replies.
      count(tally, 'export-name-ok');
      sock.write(optionFrame(OPT.EXPORT_NAME, Buffer.alloc(0)));
      const info = await reader.readExact(10);
      const size = info.readBigUInt64BE(0);
      const flags = info.readUInt16BE(8);
      if (!(flags & TX_FLAG.HAS_FLAGS) || size === 0n) {
        fail(tally, `${id}: EXPORT_NAME reply size ${size} flags 0x${flags.toString(16)}`);
        return;
      }
      sock.write(requestFrame(CMD.READ, 0, 5n, 0n, 512));
      const h = await withTimeout(reader.readExact(16 + 512), REPLY_TIMEOUT_MS);
      if (h === 'timeout' || h.readUInt32BE(0) !== 0x67446698 || h.readUInt32BE(4) !== 0 || h.readBigUInt64BE(8) !== 5n) {
        fail(tally, `${id}: READ after EXPORT_NAME: ${h === 'timeout' ? 'no reply' : h.subarray(0, 16).toString('hex')}`);
      } else tally.answered++;
      return;
    }
    if (kind === 5) {
      // EXPORT_NAME with an unknown name: no error path, the server must close.
      count(tally, 'export-name-unknown');
      sock.write(optionFrame(OPT.EXPORT_NAME, Buffer.from(`nope-${rng.u32()}`)));
      if (await reader.waitClosed(REPLY_TIMEOUT_MS)) tally.dropped++;
      else fail(tally, `${id}: EXPORT_NAME of an unknown export did not close the connection`);
      return;
    }
    // A run of options with known answers, then (sometimes) GO and a good read.
    let structured = false;
    const n = rng.range(1, 12);
    for (let i = 0; i < n; i++) {
      const k = rng.int(11);
      let alive = true;
      if (k <= 2) {
        let opt = 0;
        do opt = rng.pick([0, 4, 12, 13, 100, 0x7fffffff, 0x80000000, 0xffffffff, rng.u32()]);
        while (KNOWN_OPTIONS.has(opt));
        alive = await option(s, 'unknown-option', optionFrame(opt, rng.bytes(rng.int(64))), (t) => t === REP.ERR_UNSUP, 'ERR_UNSUP', false);
      } else if (k === 3) {
        // GO/INFO whose name length runs past the option.
        const name = `x${rng.u32()}`;
        const p = goPayload(name, [], name.length + rng.range(1, 1000));
        alive = await option(s, 'name-length-lies', optionFrame(rng.pick([OPT.INFO, OPT.GO]), p), (t) => t === REP.ERR_INVALID, 'ERR_INVALID', true);
      } else if (k === 4) {
        // INFO whose info-request count runs past the option.
        const p = goPayload('', [0, 1]);
        p.writeUInt16BE(rng.range(3, 0xffff), 4);
        alive = await option(s, 'info-count-lies', optionFrame(OPT.INFO, p), (t) => t === REP.ERR_INVALID, 'ERR_INVALID', true);
      } else if (k === 5) {
        // Options that take no data, sent with data.
        const opt = rng.pick([OPT.STRUCTURED_REPLY, OPT.LIST]);
        alive = await option(s, 'unexpected-option-data', optionFrame(opt, rng.bytes(rng.range(1, 32))), (t) => t === REP.ERR_INVALID, 'ERR_INVALID', true);
      } else if (k === 6) {
        alive = await option(s, 'info-unknown-export', optionFrame(OPT.INFO, goPayload(`no-such-${rng.u32()}`, [])), (t) => t === REP.ERR_UNKNOWN, 'ERR_UNKNOWN', true);
      } else if (k === 7) {
        alive = await option(s, 'list', optionFrame(OPT.LIST), (t) => t === REP.ACK, 'ACK', false);
      } else if (k === 8) {
        if (structured) {
          // Meta context queries: lying lengths are invalid; unknown namespaces select nothing.
          if (rng.chance(0.5)) {
            const p = metaContextPayload('', ['base:allocation']);
            p.writeUInt32BE(rng.range(1000, 0xffffffff), rng.pick([0, 4]));
            alive = await option(s, 'meta-context-lies', optionFrame(OPT.SET_META_CONTEXT, p), (t) => t === REP.ERR_INVALID, 'ERR_INVALID', true);
          } else {
            alive = await option(s, 'meta-context-unknown', optionFrame(rng.pick([OPT.SET_META_CONTEXT, OPT.LIST_META_CONTEXT]), metaContextPayload('', [`x-fuzz${rng.u32()}:thing`])), (t) => t === REP.ACK, 'ACK', false);
          }
        } else {
          alive = await option(s, 'meta-context-before-structured', optionFrame(OPT.SET_META_CONTEXT, metaContextPayload('', ['base:allocation'])), isErr, 'an error (structured replies not negotiated)', true);
        }
      } else if (k === 9) {
        // Again after it was negotiated: ACK or ERR_INVALID are both seen in practice.
        const again = structured;
        alive = await option(s, 'structured-reply', optionFrame(OPT.STRUCTURED_REPLY), (t) => t === REP.ACK || (again && t === REP.ERR_INVALID), again ? 'ACK or ERR_INVALID' : 'ACK', false);
        structured = true;
      } else {
        alive = await option(s, 'starttls', optionFrame(OPT.STARTTLS), isErr, 'an error (no TLS)', true);
      }
      if (!alive) return;
    }
    const end = rng.int(3);
    if (end === 0) {
      count(tally, 'abort');
      sock.write(optionFrame(OPT.ABORT));
      const r = await withTimeout(reader.waitClosed(REPLY_TIMEOUT_MS), REPLY_TIMEOUT_MS + 1000);
      if (r === true) tally.answered++;
      else fail(tally, `${id}: ABORT did not close the connection`);
    } else if (end === 1) {
      // Finish with a real GO on a fresh client and a checked read: still serving.
      sock.destroy();
      count(tally, 'good-client-after');
      const c = await NbdClient.connect(target, { structured: rng.chance(0.5) });
      tally.connections++;
      try {
        await goodRead(c);
        tally.answered++;
      } catch (e) {
        fail(tally, `${id}: good client failed after bad handshakes: ${(e as Error).message}`);
      } finally {
        await c.disconnect();
      }
    }
  } catch (e) {
    if (!(e instanceof NbdClosedError)) fail(tally, `${id}: ${(e as Error).message}`);
  } finally {
    sock.destroy();
  }
}

/** Runs handshake sessions until `cases` cases were played. */
export async function runHandshakeWorker(id: number, seed: number, target: NbdTarget, cases: number, tally: FuzzTally, goodRead: (c: NbdClient) => Promise<void>): Promise<void> {
  const rng = new Rng(seed);
  const start = tally.cases;
  let n = 0;
  while (tally.cases - start < cases && tally.failures.length < MAX_FAILURES) {
    await handshakeSession(`hs-worker ${id} session ${n++}`, rng.u32(), target, tally, goodRead);
  }
}
