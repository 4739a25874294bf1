// Hostile traffic on the replica protocol: a generated, seeded corpus of several thousand
// cases (garbage, truncated frames, lying and huge lengths, unknown ops and flags, bad
// replica names and path escapes, malformed payloads of every op, a second HELLO) played
// over parallel raw connections while an engine keeps writing and verifying through the
// same server. Each case must get the right coded error reply or a dropped connection;
// the good client never sees an error; the server stays up and counts what it refused.
import { mkdirSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { Rng } from '../system/helpers/pattern.js';
import { addon, MiB, pattern, Scratch, engineOptions } from './helpers.js';
import { CodeNum, endpoint, Op, RawClient, replicaSetPayload, type Request, u16, u64, wireStr } from './remote-helpers.js';

const SIZE = 16 * MiB;
const SEED = 20260601;
const HS_WORKERS = 4;
const HS_CASES = 250; // per worker, one connection each
const TX_WORKERS = 6;
const TX_CASES = 800; // per worker, many per connection

type Expect = 'ok' | 'coded' | number; // a given code, any code, or OK
interface Tally {
  cases: number;
  answered: number;
  dropped: number;
  failures: string[];
}

const newTally = (): Tally => ({ cases: 0, answered: 0, dropped: 0, failures: [] });

/** Handshake cases: what the first bytes of a connection are, and what must happen. */
function handshakeCase(rng: Rng): { what: string; bytes: Buffer; want: 'drop' | number; end?: boolean } {
  const hello = (name: Buffer | string, extra: Partial<Request> = {}): Buffer =>
    Buffer.concat([
      (() => {
        const b = Buffer.isBuffer(name) ? name : Buffer.from(name);
        const h = Buffer.alloc(48);
        h.writeUInt32LE(extra.magic ?? 0x3151524d, 0);
        h.writeUInt8(extra.version ?? 1, 4);
        h.writeUInt8(extra.op ?? Op.HELLO, 5);
        h.writeUInt16LE(extra.flags ?? 0, 6);
        h.writeUInt32LE(extra.payloadLen ?? b.length, 40);
        return Buffer.concat([h, b]);
      })(),
    ]);
  switch (rng.int(12)) {
    case 0:
      return { what: 'garbage', bytes: rng.bytes(1 + rng.int(300)), want: 'drop' };
    case 1:
      return { what: 'truncated header', bytes: hello('fuzz').subarray(0, rng.int(48)), want: 'drop', end: true };
    case 2:
      return { what: 'truncated name', bytes: hello('fuzz').subarray(0, 49), want: 'drop', end: true };
    case 3: {
      const name = rng.pick(['..', '.', 'a/b', '../fuzz', '/etc', 'x'.repeat(64), 'nul\0x', 'sp ace', 'é', '%2e%2e', 'fuzz/..', '']);
      return { what: `bad name ${JSON.stringify(name)}`, bytes: hello(name), want: name.length > 63 || name === '' ? CodeNum.PROTOCOL_ERROR : CodeNum.INVALID_ARGUMENT };
    }
    case 4:
      return { what: 'symlink escaping the root', bytes: hello('escape'), want: CodeNum.INVALID_ARGUMENT };
    case 5:
      return { what: 'unknown replica', bytes: hello(`nope-${rng.int(1000)}`), want: CodeNum.NOT_FOUND };
    case 6:
      return { what: 'wrong version', bytes: hello('fuzz', { version: 2 + rng.int(250) }), want: CodeNum.PROTOCOL_ERROR };
    case 7: {
      // AUTH first to a server without a cluster secret: refused as such (replica-protocol.md).
      const op = 2 + rng.int(30);
      return { what: 'not HELLO first', bytes: hello('fuzz', { op }), want: op === Op.AUTH ? CodeNum.UNAUTHENTICATED : CodeNum.PROTOCOL_ERROR };
    }
    case 8:
      return { what: 'bad magic', bytes: hello('fuzz', { magic: (rng.u32() | 1) >>> 0 }), want: 'drop' };
    case 9:
      return { what: 'huge name length', bytes: hello('fuzz', { payloadLen: 64 + rng.int(0xffffff00) }), want: CodeNum.PROTOCOL_ERROR };
    case 10:
      return { what: 'HELLO flags', bytes: hello('fuzz', { flags: 1 + rng.int(0xfffe) }), want: CodeNum.PROTOCOL_ERROR };
    default:
      return { what: 'vanishing client', bytes: Buffer.alloc(0), want: 'drop', end: true };
  }
}

/** Transmission cases on an open connection to replica "fuzz" (epoch 0, nobody claims it). */
function txCase(rng: Rng, seq: number, home: number): { what: string; req: Request; want: Expect; verify?: Buffer } {
  const off = home + rng.int(64) * 4096;
  const PE = CodeNum.PROTOCOL_ERROR;
  switch (rng.int(27)) {
    case 0: {
      const data = rng.bytes(4096);
      return { what: 'good write', req: { op: Op.WRITE, seq, offset: off, length: 4096, payload: data }, want: 'ok' };
    }
    case 1:
      return { what: 'good read', req: { op: Op.READ, seq, offset: off, length: 4096 }, want: 'ok' };
    case 2:
      return { what: 'unknown op', req: { op: rng.pick([0, 27, 28, 99, 128, 255]), seq, payload: rng.bytes(rng.int(100)) }, want: PE };
    case 3:
      return { what: 'read beyond the I/O limit', req: { op: Op.READ, seq, offset: 0, length: 4 * MiB + 1 + rng.int(1e9) }, want: PE };
    case 4:
      return { what: 'read out of range', req: { op: Op.READ, seq, offset: SIZE - 4096 + 1 + rng.int(1e12), length: 4096 }, want: CodeNum.INVALID_ARGUMENT };
    case 5:
      return { what: 'write length lies', req: { op: Op.WRITE, seq, offset: off, length: 8192, payload: rng.bytes(4096) }, want: PE };
    case 6:
      return { what: 'unknown flags', req: { op: rng.pick([Op.READ, Op.FLUSH, Op.TRIM, Op.WRITE]), seq, flags: 16 << rng.int(12), offset: off, length: 0 }, want: PE };
    case 7:
      return { what: 'reserved bits', req: { op: Op.PING, seq, reserved: 1 + rng.int(1e9) }, want: PE };
    case 8:
      return { what: 'payload on READ', req: { op: Op.READ, seq, offset: off, length: 4096, payload: rng.bytes(1 + rng.int(64)) }, want: PE };
    case 9:
      return { what: 'string longer than its payload', req: { op: rng.pick([Op.LAYER_EXTENTS, Op.READ_LAYER, Op.DELETE_SNAPSHOT, Op.UNMAP_LAYER, Op.LAYER_DIGEST]), seq, payload: Buffer.from([0xff, 0x7f, 1, 2, 3]) }, want: PE };
    case 10:
      return { what: 'adopt chain with a lying count', req: { op: Op.ADOPT_CHAIN, seq, epoch: 1, payload: Buffer.concat([Buffer.from([0xff, 0xff, 0xff, 0xff]), rng.bytes(rng.int(200))]) }, want: PE };
    case 11:
      return { what: 'snapshot with too many labels', req: { op: Op.SNAPSHOT, seq, payload: Buffer.concat([wireStr('x'), Buffer.alloc(8), Buffer.from([0xff, 0xff])]) }, want: PE };
    case 12:
      return { what: 'digest range too large', req: { op: Op.LAYER_DIGEST, seq, offset: 0, length: 4 * MiB + 65536 * (1 + rng.int(100)), payload: wireStr('L000001') }, want: PE };
    case 13:
      return { what: 'second HELLO', req: { op: Op.HELLO, seq, payload: Buffer.from('fuzz') }, want: PE };
    case 14:
      return { what: 'block status payload size', req: { op: Op.BLOCK_STATUS, seq, offset: 0, length: 4096, payload: rng.bytes(rng.pick([0, 1, 3, 5, 9])) }, want: PE };
    case 15:
      return { what: 'trailing bytes', req: { op: Op.LAYER_EXTENTS, seq, payload: Buffer.concat([wireStr('L000001'), rng.bytes(1 + rng.int(20))]) }, want: PE };
    case 16:
      return { what: 'unknown layer', req: { op: Op.READ_LAYER, seq, offset: 0, length: 4096, payload: wireStr(`L9${rng.int(1e6)}`) }, want: 'coded' };
    case 17:
      return { what: 'write-layer length lies', req: { op: Op.WRITE_LAYER, seq, offset: 0, length: 4096, payload: Buffer.concat([wireStr('L000001'), rng.bytes(100)]) }, want: PE };
    case 18:
      return { what: 'ping with payload', req: { op: Op.PING, seq, payload: rng.bytes(1 + rng.int(10)) }, want: PE };
    case 19:
      // A count that lies, names that break the rules, or bytes that stop short.
      return { what: 'malformed replica set', req: { op: Op.SET_REPLICA_SET, seq, epoch: 1, payload: Buffer.concat([u64(1), u64(1), rng.pick([Buffer.from([0xff, 0xff]), Buffer.concat([u16(1), wireStr('../x'), u16(0)]), rng.bytes(rng.int(40))])]) }, want: PE };
    case 20:
      // Well formed, for an epoch this replica never promised: refused, nothing stored.
      return { what: 'replica set of an unclaimed epoch', req: { op: Op.SET_REPLICA_SET, seq, epoch: 7, payload: replicaSetPayload(7, 1 + rng.int(5), ['a', 'b', 'c'], ['a']) }, want: CodeNum.STALE_EPOCH };
    case 21:
      // Volumes only grow, in whole blocks: refused, the size stays (later cases rely on it).
      return { what: 'grow to a smaller or unaligned size', req: { op: Op.GROW, seq, length: rng.pick([0, 4096, SIZE - 4096, SIZE + 1 + rng.int(4095)]) }, want: CodeNum.INVALID_ARGUMENT };
    case 22:
      return { what: 'grow with a payload', req: { op: Op.GROW, seq, length: SIZE, payload: rng.bytes(1 + rng.int(16)) }, want: PE };
    case 23:
      return { what: 'last-rw with a payload', req: { op: Op.LAST_RW, seq, payload: rng.bytes(1 + rng.int(16)) }, want: PE };
    case 24:
      // SELF_RW belongs to SET_REPLICA_SET alone.
      return { what: 'self-rw flag on another op', req: { op: rng.pick([Op.READ, Op.FLUSH, Op.CLAIM_EPOCH, Op.LAST_RW]), seq, flags: 16, offset: 0, length: 0 }, want: PE };
    case 25:
      // MASKS_ONLY belongs to LAYER_DIGEST alone.
      return { what: 'masks-only flag on another op', req: { op: rng.pick([Op.READ, Op.FLUSH, Op.LAYER_EXTENTS, Op.READ_LAYER]), seq, flags: 32, offset: 0, length: 0 }, want: PE };
    default: {
      // Random header fields on a random op, small random payload: any coded answer.
      const op = 2 + rng.int(24);
      if ([Op.GROW, Op.CLAIM_EPOCH, Op.SET_REPLICA_SET, Op.MARK_CLEAN, Op.SNAPSHOT, Op.REVERT, Op.DELETE_SNAPSHOT, Op.ADOPT_CHAIN, Op.FINISH_REBUILD, Op.WRITE_LAYER, Op.UNMAP_LAYER, Op.TRIM, Op.WRITE_ZEROES, Op.WRITE].includes(op as never))
        return { what: 'random read-only op', req: { op: Op.BLOCK_STATUS, seq, offset: rng.int(SIZE * 2), length: rng.int(SIZE), payload: Buffer.from([0, 0, 0, 0]) }, want: 'coded' };
      return { what: `random op ${op}`, req: { op, seq, flags: rng.chance(0.5) ? 0 : rng.int(16), offset: rng.int(2 ** 40), length: rng.int(2 ** 24), payload: rng.bytes(rng.int(32)) }, want: 'coded' };
    }
  }
}

async function handshakeWorker(port: number, seed: number, n: number, t: Tally): Promise<void> {
  const rng = new Rng(seed);
  for (let i = 0; i < n; i++) {
    const c = handshakeCase(rng);
    t.cases++;
    const raw = await RawClient.connect(port);
    raw.sendRaw(c.bytes);
    if (c.end) raw.socket.end();
    if (c.want === 'drop') {
      // Garbage never opens a replica: the server drops it (or, for a few garbage bytes
      // that happen to look like a header, waits for more; then our end closes it).
      const closedInTime = await Promise.race([raw.closed.then(() => true), new Promise((r) => setTimeout(() => r(false), 300))]);
      if (!closedInTime) raw.close();
      if (raw.replies.some((r) => r.code === CodeNum.OK)) t.failures.push(`${c.what}: opened a replica`);
      t.dropped++;
      continue;
    }
    const r = await raw.next();
    raw.close();
    if (!r) {
      t.failures.push(`${c.what}: dropped without the expected code ${c.want}`);
      continue;
    }
    t.answered++;
    if (r.code !== c.want) t.failures.push(`${c.what}: code ${r.code}, wanted ${c.want} (${r.payload.toString()})`);
  }
}

async function txWorker(port: number, w: number, seed: number, n: number, t: Tally): Promise<void> {
  const rng = new Rng(seed);
  const home = 8 * MiB + w * 64 * 4096; // this worker's blocks of replica "fuzz"
  const model = new Map<number, Buffer>();
  let c = await RawClient.open(port, 'fuzz');
  let seq = 1;
  for (let i = 0; i < n; i++) {
    t.cases++;
    // Now and then a stream-breaking case: answered (or not) and the connection dropped.
    if (rng.chance(0.02)) {
      const kind = rng.int(3);
      if (kind === 0) c.send({ op: Op.WRITE, seq, offset: home, length: 4096, payloadLen: 16 * MiB + 1 + rng.int(1e9) });
      else if (kind === 1) c.send({ op: Op.PING, seq, magic: (rng.u32() | 1) >>> 0 });
      else c.send({ op: Op.PING, seq, version: 2 + rng.int(200) });
      const r = await c.reply(seq);
      await c.closed;
      if (r && r.code !== CodeNum.PROTOCOL_ERROR) t.failures.push(`stream-breaking case ${kind}: code ${r.code}`);
      if (kind === 1 && r) t.failures.push('bad magic was answered');
      t.dropped++;
      c = await RawClient.open(port, 'fuzz');
      seq++;
      continue;
    }
    const k = txCase(rng, seq, home);
    c.send(k.req);
    const r = await c.reply(seq);
    seq++;
    if (!r) {
      t.failures.push(`${k.what}: connection dropped (${c.badStream ?? 'closed'})`);
      c = await RawClient.open(port, 'fuzz');
      continue;
    }
    t.answered++;
    if (k.want === 'ok') {
      if (r.code !== CodeNum.OK) t.failures.push(`${k.what}: code ${r.code} ${r.payload.toString()}`);
      const o = Number(k.req.offset);
      if (k.req.op === Op.WRITE && r.code === CodeNum.OK) model.set(o, k.req.payload!);
      if (k.req.op === Op.READ && r.code === CodeNum.OK) {
        const want = model.get(o) ?? Buffer.alloc(4096);
        if (!r.payload.equals(want)) t.failures.push(`${k.what}: wrong data at ${o}`);
      }
    } else if (k.want === 'coded') {
      if (r.code > CodeNum.PROTOCOL_ERROR) t.failures.push(`${k.what}: unknown code ${r.code}`);
    } else if (r.code !== k.want) {
      t.failures.push(`${k.what}: code ${r.code}, wanted ${k.want} (${r.payload.toString()})`);
    }
  }
  c.close();
}

describe('bad input on the replica protocol', () => {
  let s: Scratch;
  beforeAll(() => {
    s = new Scratch('mooring-remote-bad-');
  });
  afterAll(() => s.cleanup());

  it('answers a corpus of thousands of hostile cases with coded errors or drops, while a good engine keeps working', async () => {
    const root = s.dir('root');
    await addon().createReplica(join(root, 'good'), SIZE);
    await addon().createReplica(join(root, 'fuzz'), SIZE);
    // A replica outside the root, reachable only through a symlink: must be refused.
    mkdirSync(s.path('outside'));
    await addon().createReplica(s.path('outside', 'r'), SIZE);
    symlinkSync(s.path('outside', 'r'), join(root, 'escape'));
    const server = await addon().startReplicaServer({ root });
    const port = server.port;
    const engine = await addon().openEngine(engineOptions({ replicas: [endpoint(port, 'good')] }));

    let fuzzing = true;
    let goodRounds = 0;
    const goodRng = new Rng(SEED ^ 7);
    const good = (async () => {
      while (fuzzing) {
        const off = goodRng.int(SIZE / 4096 - 16) * 4096;
        const data = pattern(goodRounds, 4096 * (1 + goodRng.int(16)));
        await engine.write(off, data);
        if (!(await engine.read(off, data.length)).equals(data)) throw new Error(`good engine read back wrong data at ${off}`);
        goodRounds++;
      }
    })();

    const tallies = Array.from({ length: HS_WORKERS + TX_WORKERS }, newTally);
    const started = Date.now();
    await Promise.all([
      ...Array.from({ length: HS_WORKERS }, (_, i) => handshakeWorker(port, SEED + i, HS_CASES, tallies[i]!)),
      ...Array.from({ length: TX_WORKERS }, (_, i) => txWorker(port, i, SEED + 100 + i, TX_CASES, tallies[HS_WORKERS + i]!)),
    ]);
    fuzzing = false;
    await good;
    const t = tallies.reduce((a, b) => ({
      cases: a.cases + b.cases,
      answered: a.answered + b.answered,
      dropped: a.dropped + b.dropped,
      failures: [...a.failures, ...b.failures],
    }));
    console.log(`replica protocol corpus: ${t.cases} cases in ${Date.now() - started} ms; answered ${t.answered}, dropped ${t.dropped}; good engine rounds ${goodRounds}`);
    expect(t.failures.slice(0, 20)).toEqual([]);
    expect(t.cases).toBeGreaterThanOrEqual(3000);
    expect(goodRounds).toBeGreaterThan(10);
    expect(engine.replicas()[0]!.mode).toBe('RW');

    const st = server.stats();
    expect(st.protocolErrors).toBeGreaterThan(1000);
    // The replica behind the symlink was never opened: it can be opened here exclusively.
    const outside = await addon().openReplica(s.path('outside', 'r'));
    await outside.close();
    await engine.close();
    await server.close();
  });
});
