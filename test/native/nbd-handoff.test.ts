// Hand-off of a live NBD export between two node processes (docs/nbd-frontend.md, "Hand-off
// of an export between processes"). Each process is test/native/nbd-handoff-peer.mjs with
// the real addon: O serves the export, N takes it over through a hand-off channel, and the
// clients live in this process (the in-repo NBD client, qemu-io, nbdinfo). What must hold:
// the client's socket never closes, every request is answered exactly once (the client
// treats a second answer for a cookie as a protocol violation and drops the socket), the
// data read back and the replica afterwards equal a model of every acknowledged write, and
// the connection keeps its id.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { CMD, ERRNO, NbdClient, NbdReplyError, SocketReader, requestFrame } from '../../src/bench/nbd-client.js';
import { KiB, MiB, Scratch, addon, assertDirsIdentical, nextEpoch, pattern, waitFor } from './helpers.js';

const PEER = join(__dirname, 'nbd-handoff-peer.mjs');
const SIZE = 16 * MiB;
/** Generous: these machines are shared, and a freeze that times out is a failure here. */
const FREEZE_TIMEOUT_MS = 10_000;

type Json = Record<string, unknown>;

/** A peer process, driven by JSON lines; its stderr goes to ours, prefixed. */
class Peer {
  private nextId = 1;
  private readonly calls = new Map<number, { resolve: (v: Json) => void; reject: (e: Error) => void; op: string }>();
  private readonly events: Json[] = [];
  private eventWaiters: Array<() => void> = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  private constructor(
    readonly name: string,
    readonly child: ChildProcess,
  ) {
    let buf = '';
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        this.onLine(line);
      }
    });
    child.stderr!.on('data', (d: Buffer) => process.stderr.write(`[${name} stderr] ${d.toString()}`));
    this.exited = new Promise((resolve) => {
      child.on('exit', (code, signal) => {
        for (const c of this.calls.values()) c.reject(new Error(`${name} exited (${code ?? signal}) during ${c.op}`));
        this.calls.clear();
        resolve({ code, signal });
      });
    });
  }

  /** `wrapper`: a command that runs node (e.g. prlimit). */
  static async start(name: string, wrapper: string[] = []): Promise<Peer> {
    const argv = [...wrapper, process.execPath, PEER];
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
    const p = new Peer(name, child);
    await p.waitEvent('ready', 30_000);
    return p;
  }

  private onLine(line: string): void {
    let msg: Json;
    try {
      msg = JSON.parse(line) as Json;
    } catch {
      process.stderr.write(`[${this.name} stdout] ${line}\n`);
      return;
    }
    if (typeof msg.event === 'string') {
      this.events.push(msg);
      const ws = this.eventWaiters;
      this.eventWaiters = [];
      for (const w of ws) w();
      return;
    }
    const c = this.calls.get(msg.id as number);
    if (!c) return;
    this.calls.delete(msg.id as number);
    if (msg.ok) c.resolve((msg.result ?? {}) as Json);
    else {
      const e = msg.error as { code: string; message: string };
      c.reject(Object.assign(new Error(`${this.name} ${c.op}: ${e.code}: ${e.message}`), { code: e.code }));
    }
  }

  call<T = Json>(op: string, args: Json = {}): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.calls.set(id, { resolve: resolve as (v: Json) => void, reject, op });
      this.child.stdin!.write(JSON.stringify({ id, op, ...args }) + '\n');
    });
  }

  async waitEvent(name: string, timeoutMs = 20_000): Promise<Json> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const e = this.events.find((x) => x.event === name);
      if (e) return e;
      if (Date.now() > until) throw new Error(`${this.name}: no '${name}' event within ${timeoutMs} ms`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, until - Date.now());
        this.eventWaiters.push(() => {
          clearTimeout(t);
          r();
        });
      });
    }
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.stdin!.end();  // the peer closes what it holds, then exits
    const r = await Promise.race([this.exited, new Promise<null>((res) => setTimeout(() => res(null), 20_000))]);
    if (r === null) this.child.kill('SIGKILL');
  }
}

interface Setup {
  s: Scratch;
  dir: string;
  sock: string;
  hsock: string;
  o: Peer;
  n: Peer;
}

/** O serving a fresh replica at `sock`, listening for its successor at `hsock`; N started. */
async function setup(): Promise<Setup> {
  const s = new Scratch('mooring-handoff-');
  const dir = s.path('r0');
  await addon().createReplica(dir, SIZE);
  const sock = s.path('nbd.sock');
  const hsock = s.path('handoff.sock');
  const [o, n] = await Promise.all([Peer.start('O'), Peer.start('N')]);
  await o.call('openEngine', { dir, epoch: nextEpoch() });
  await o.call('exportNbd', { nbd: { unixPath: sock } });
  await o.call('listen', { path: hsock });
  return { s, dir, sock, hsock, o, n };
}

interface HandOffResult {
  committed: boolean;
  pauseMs: number;
  sent: { connectionIds: number[]; pendingBytes: number; connectionsTotal: number };
  reply?: Json;
}

/** One whole hand-off O → N (the protocol is in nbd-handoff-peer.mjs). */
async function handOff(t: Setup, opts: { holdBeforeReady?: boolean } = {}): Promise<{ o: Promise<HandOffResult>; n: Promise<Json> }> {
  const accepted = t.o.call('accept', { timeoutMs: 20_000 });
  const n = t.n.call('takeOver', { path: t.hsock, dir: t.dir, epoch: nextEpoch(), timeoutMs: 20_000, ...opts });
  n.catch(() => {});  // observed by the caller, or the peer is killed on purpose
  await accepted;
  const o = t.o.call<HandOffResult>('handOff', { freezeTimeoutMs: FREEZE_TIMEOUT_MS, readyTimeoutMs: 30_000, spareEpoch: nextEpoch() });
  return { o, n };
}

async function teardown(t: Setup | undefined): Promise<void> {
  if (!t) return;
  await Promise.all([t.o.stop(), t.n.stop()]);
  t.s.cleanup();
}

/**
 * Queue-depth `workers` I/O from one NBD client: worker i owns the slice [i*slice, (i+1)*slice)
 * and alternates writes (recorded in the model when acknowledged) and reads checked against
 * the model, so concurrent requests never overlap and every read has one right answer.
 */
class Load {
  readonly model = Buffer.alloc(SIZE);
  ops = 0;
  stop = false;
  private seed: number;
  readonly done: Promise<void>;

  constructor(
    readonly client: NbdClient,
    readonly workers: number,
    seed: number,
    readonly sliceBytes = 512 * KiB,
  ) {
    this.seed = seed;
    this.done = Promise.all(Array.from({ length: workers }, (_, i) => this.worker(i))).then(() => {});
  }

  private rand(n: number): number {
    this.seed = (this.seed * 1103515245 + 12345) >>> 0;
    return this.seed % n;
  }

  private async worker(i: number): Promise<void> {
    const base = i * this.sliceBytes;
    while (!this.stop) {
      const len = (1 + this.rand(16)) * 4 * KiB;
      const off = base + this.rand(this.sliceBytes / (4 * KiB) - len / (4 * KiB) + 1) * 4 * KiB;
      if (this.rand(2) === 0) {
        const data = pattern(this.seed, len);
        await this.client.write(off, data);
        data.copy(this.model, off);
      } else {
        const got = await this.client.read(off, len);
        const want = this.model.subarray(off, off + len);
        if (!got.equals(want)) throw new Error(`worker ${i}: read ${off}+${len} differs from the model`);
      }
      this.ops++;
    }
  }
}

function fdCount(): number {
  return readdirSync('/proc/self/fd').length;
}

describe('NBD export hand-off between processes', () => {
  let t: Setup | undefined;
  beforeEach(async () => {
    t = await setup();
  });
  afterEach(async () => {
    await teardown(t);
    t = undefined;
  });

  it('keeps a client with 12 requests in flight connected: each answered once, data intact, same connection id', async () => {
    const seed = Date.now() % 100000;
    console.log(`nbd-handoff in-flight seed=${seed}`);
    const client = await NbdClient.connect({ socketPath: t!.sock });
    let socketClosed = false;
    client.socket.on('close', () => (socketClosed = true));
    const before = await t!.o.call<{ connectionIds: number[]; connectionsTotal: number }>('stats');
    expect(before.connectionIds).toEqual([1]);

    const load = new Load(client, 12, seed);
    await waitFor('some I/O before the hand-off', () => load.ops >= 100, 20_000);
    const h = await handOff(t!);
    const [res, taken] = await Promise.all([h.o, h.n]);
    expect(res.committed).toBe(true);
    expect(res.sent.connectionIds).toEqual([1]);
    expect((taken.record as Json).connectionIds).toEqual([1]);
    const opsAtCommit = load.ops;
    console.log(`nbd-handoff pause (freeze called to COMMIT sent): ${res.pauseMs.toFixed(1)} ms, adopt ${(taken.adoptMs as number).toFixed(1)} ms`);
    await waitFor('I/O through the new process', () => load.ops >= opsAtCommit + 200, 20_000);
    load.stop = true;
    await load.done;

    expect(client.protocolViolation).toBeNull();
    expect(client.isClosed).toBe(false);
    expect(socketClosed).toBe(false);
    const after = await t!.n.call<{ connectionIds: number[]; connectionsTotal: number; connectionsOpen: number }>('stats');
    expect(after.connectionIds).toEqual([1]);
    expect(after.connectionsTotal).toBe(before.connectionsTotal);

    // New clients are the new process's, and ids go on from where O left them.
    const second = await NbdClient.connect({ socketPath: t!.sock });
    expect((await t!.n.call<{ connectionIds: number[] }>('stats')).connectionIds).toEqual([1, 2]);
    expect((await second.read(0, 64 * KiB)).equals(load.model.subarray(0, 64 * KiB))).toBe(true);
    await second.disconnect();
    await client.disconnect();
    await t!.n.call('close');
    await assertDirsIdentical([t!.dir], load.model);
  });

  it('honours structured replies, base:allocation and a pre-resize size negotiated before the hand-off', async () => {
    const old = await NbdClient.connect({ socketPath: t!.sock });  // structured + base:allocation
    const simple = await NbdClient.connect({ socketPath: t!.sock }, { structured: false });
    expect(old.structured).toBe(true);
    expect(old.metaContextId).toBe(1);
    expect(old.sizeBytes).toBe(SIZE);
    await t!.o.call('resize', { sizeBytes: 2 * SIZE });
    const grown = await NbdClient.connect({ socketPath: t!.sock });
    expect(grown.sizeBytes).toBe(2 * SIZE);
    const data = pattern(7, 64 * KiB);
    await old.write(1 * MiB, data);

    const h = await handOff(t!);
    expect((await h.o).committed).toBe(true);
    await h.n;
    expect((await t!.n.call<{ connectionIds: number[] }>('stats')).connectionIds).toEqual([1, 2, 3]);

    // Block status still answers with context id 1, as negotiated with O.
    const ext = await old.blockStatus(0, 4 * MiB);
    expect(ext.length).toBeGreaterThan(1);
    expect(ext.reduce((a, e) => a + e.length, 0)).toBe(4 * MiB);
    expect(ext.find((e) => e.flags === 0)).toBeDefined();
    // Structured reads: holes come back as hole chunks (type 2), data as data chunks (type 1).
    const r = await old.rawRequest(CMD.READ, 0, 1 * MiB - 64 * KiB, 128 * KiB);
    expect(r.error).toBe(0);
    expect(r.chunkTypes).toEqual([2, 1]);
    expect(r.data!.subarray(64 * KiB).equals(data)).toBe(true);
    // Each connection keeps the size its own handshake gave.
    await expect(old.write(SIZE, pattern(8, 4 * KiB))).rejects.toMatchObject({ errno: ERRNO.ENOSPC });
    await grown.write(SIZE, pattern(8, 4 * KiB));
    // The client that never negotiated structured replies still gets simple ones.
    expect((await simple.read(1 * MiB, 64 * KiB)).equals(data)).toBe(true);
    await expect(simple.blockStatus(0, 4096)).rejects.toBeInstanceOf(NbdReplyError);
    for (const c of [old, simple, grown]) {
      expect(c.protocolViolation).toBeNull();
      await c.disconnect();
    }
  });

  it('handles a WRITE whose payload arrives after the freeze began', async () => {
    const c = await NbdClient.connect({ socketPath: t!.sock }, { structured: false });
    const raw = c.detach();  // from here on this test reads and writes the socket itself
    const payload = pattern(11, 256 * KiB);
    const header = requestFrame(CMD.WRITE, 0, 77n, BigInt(2 * MiB), payload.length);
    c.socket.write(Buffer.concat([header, payload.subarray(0, 100 * KiB)]));

    const h = await handOff(t!);
    await t!.o.waitEvent('freezing');
    // The freeze has begun once O stops accepting: a new client then waits in the backlog,
    // with no greeting (N greets it after the hand-off).
    const probe = await backlogProbe(t!.sock);
    let settled = false;
    void h.o.finally(() => (settled = true));
    expect(settled).toBe(false);  // it cannot finish: a WRITE is half received
    c.socket.write(payload.subarray(100 * KiB));
    const reply = await raw.readExact(16);
    expect(reply.readUInt32BE(4)).toBe(0);
    expect(reply.readBigUInt64BE(8)).toBe(77n);
    const res = await h.o;
    expect(res.committed).toBe(true);
    expect(res.sent.pendingBytes).toBe(0);
    await h.n;

    c.socket.write(requestFrame(CMD.READ, 0, 78n, BigInt(2 * MiB), payload.length));
    const r = await raw.readExact(16 + payload.length);
    expect(r.readUInt32BE(4)).toBe(0);
    expect(r.readBigUInt64BE(8)).toBe(78n);
    expect(r.subarray(16).equals(payload)).toBe(true);
    expect((await probe.readExact(18)).readBigUInt64BE(0)).toBe(0x4e42444d41474943n);  // N's greeting
    expect(raw.isEnded).toBe(false);
    c.destroy();
    probe.socket.destroy();
  });

  it('carries bytes read but not parsed (a request header cut in two) to the new process', async () => {
    const c = await NbdClient.connect({ socketPath: t!.sock }, { structured: false });
    await c.write(3 * MiB, pattern(12, 64 * KiB));
    const raw = c.detach();
    const read = requestFrame(CMD.READ, 0, 91n, BigInt(3 * MiB), 64 * KiB);
    // A whole FLUSH and the first 10 bytes of a READ, in one write: once the FLUSH is
    // answered, O's reader holds the 10 bytes (it read them with the FLUSH).
    c.socket.write(Buffer.concat([requestFrame(CMD.FLUSH, 0, 90n, 0n, 0), read.subarray(0, 10)]));
    expect((await raw.readExact(16)).readBigUInt64BE(8)).toBe(90n);

    const h = await handOff(t!);
    const res = await h.o;
    expect(res.committed).toBe(true);
    expect(res.sent.pendingBytes).toBe(10);
    await h.n;
    c.socket.write(read.subarray(10));
    const r = await raw.readExact(16 + 64 * KiB);
    expect(r.readUInt32BE(4)).toBe(0);
    expect(r.readBigUInt64BE(8)).toBe(91n);
    expect(r.subarray(16).equals(pattern(12, 64 * KiB))).toBe(true);
    c.destroy();
  });

  it('rolls back when the receiver is SIGKILLed before READY: O reopens with a spare epoch and serves the same connections', async () => {
    const seed = (Date.now() >> 3) % 100000;
    console.log(`nbd-handoff rollback seed=${seed}`);
    const client = await NbdClient.connect({ socketPath: t!.sock });
    let socketClosed = false;
    client.socket.on('close', () => (socketClosed = true));
    const load = new Load(client, 8, seed);
    await waitFor('I/O before the hand-off', () => load.ops >= 100, 20_000);
    const h = await handOff(t!, { holdBeforeReady: true });
    await t!.n.waitEvent('adopted');  // N holds every fd and the replica: kill it now
    t!.n.child.kill('SIGKILL');
    expect((await t!.n.exited).signal).toBe('SIGKILL');
    const res = await h.o;
    expect(res.committed).toBe(false);
    expect(res.reply).toMatchObject({ type: 'error', code: 'UNAVAILABLE' });
    const opsAtRollback = load.ops;
    await waitFor('I/O after the rollback', () => load.ops >= opsAtRollback + 200, 20_000);
    load.stop = true;
    await load.done;
    expect(client.protocolViolation).toBeNull();
    expect(socketClosed).toBe(false);
    expect((await t!.o.call<{ connectionIds: number[] }>('stats')).connectionIds).toEqual([1]);
    // New clients are served again too (the acceptor resumed).
    const second = await NbdClient.connect({ socketPath: t!.sock });
    expect((await second.read(0, 4 * KiB)).equals(load.model.subarray(0, 4 * KiB))).toBe(true);
    await second.disconnect();
    await client.disconnect();
    await t!.o.call('close');
    await assertDirsIdentical([t!.dir], load.model);
  });

  it('fails a freeze cleanly when a client does not read its replies, and the connection carries on', async () => {
    const c = await NbdClient.connect({ socketPath: t!.sock }, { structured: false });
    const raw = c.detach();
    c.socket.pause();  // stop reading: replies pile up in the server's output queue
    const n = 48;
    const parts: Buffer[] = [];
    for (let i = 0; i < n; i++) parts.push(requestFrame(CMD.READ, 0, BigInt(1000 + i), BigInt(i * 256 * KiB), 256 * KiB));
    const requestsBefore = (await t!.o.call<{ requests: number }>('stats')).requests;
    c.socket.write(Buffer.concat(parts));
    // The server has taken them (one recv() reads all 48 headers): a freeze asked before
    // that, on a loaded machine, would find the connection idle and succeed.
    const until = Date.now() + 10_000;
    while ((await t!.o.call<{ requests: number }>('stats')).requests === requestsBefore) {
      if (Date.now() > until) throw new Error('the server did not take the READs');
      await new Promise((r) => setTimeout(r, 10));
    }
    const t0 = Date.now();
    const err = await t!.o.call('freeze', { timeoutMs: 500 }).then(() => null, (e: { code: string }) => e);
    expect(err).toMatchObject({ code: 'BUSY' });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(450);
    c.socket.resume();
    const cookies = new Set<bigint>();
    for (let i = 0; i < n; i++) {
      const r = await raw.readExact(16 + 256 * KiB);
      expect(r.readUInt32BE(4)).toBe(0);
      cookies.add(r.readBigUInt64BE(8));
    }
    expect(cookies.size).toBe(n);  // each answered exactly once
    // Still the same connection, still served; the server accepts again and can freeze now.
    c.socket.write(requestFrame(CMD.FLUSH, 0, 5n, 0n, 0));
    expect((await raw.readExact(16)).readBigUInt64BE(8)).toBe(5n);
    const other = await NbdClient.connect({ socketPath: t!.sock });
    await other.disconnect();
    await t!.o.call('freeze', { timeoutMs: FREEZE_TIMEOUT_MS });
    await t!.o.call('unfreeze');
    c.socket.write(requestFrame(CMD.FLUSH, 0, 6n, 0n, 0));
    expect((await raw.readExact(16)).readBigUInt64BE(8)).toBe(6n);
    expect((await t!.o.call<{ connectionIds: number[] }>('stats')).connectionIds).toEqual([1]);
    c.destroy();
  });

  it('keeps an interactive qemu-io connected across the hand-off; nbdinfo --list works after', async () => {
    const qemu = spawn('qemu-io', ['-f', 'raw', `nbd+unix:///?socket=${t!.sock}`], { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    qemu.stdout.on('data', (d: Buffer) => (out += d.toString()));
    qemu.stderr.on('data', (d: Buffer) => process.stderr.write(`[qemu-io stderr] ${d.toString()}`));
    const exited = new Promise<number | null>((r) => qemu.on('exit', (code) => r(code)));
    const run = async (cmd: string, expectText: string): Promise<void> => {
      const from = out.length;
      qemu.stdin.write(cmd + '\n');
      await waitFor(`qemu-io: ${cmd}`, () => out.slice(from).includes(expectText), 20_000);
    };
    await run('write -P 0xab 0 1M', 'wrote 1048576/1048576');
    await waitFor('qemu-io connected', async () => (await t!.o.call<{ connectionIds: number[] }>('stats')).connectionIds.length === 1);
    const ids = (await t!.o.call<{ connectionIds: number[] }>('stats')).connectionIds;

    const h = await handOff(t!);
    expect((await h.o).committed).toBe(true);
    await h.n;
    expect((await t!.n.call<{ connectionIds: number[] }>('stats')).connectionIds).toEqual(ids);
    await run('read -P 0xab 0 1M', 'read 1048576/1048576');
    await run('write -P 0xcd 1M 1M', 'wrote 1048576/1048576');
    await run('read -P 0xcd 1M 1M', 'read 1048576/1048576');
    await run('flush', 'qemu-io>');
    qemu.stdin.write('quit\n');
    expect(await exited).toBe(0);
    expect(out).not.toMatch(/error|failed|Pattern verification/i);

    const list = spawnSync('nbdinfo', ['--list', `nbd+unix:///?socket=${t!.sock}`], { encoding: 'utf8', timeout: 30_000 });
    if (list.stderr) process.stderr.write(`[nbdinfo stderr] ${list.stderr}`);
    expect(list.status).toBe(0);
    expect(list.stdout).toMatch(/size:\s+16777216/);
  });
});

/**
 * A client that connected while the server does not accept: it gets no greeting within
 * 300 ms. Until the freeze has paused the acceptor, probes are greeted: those are closed at
 * once (a client left in its handshake would make the freeze fail, as documented).
 */
async function backlogProbe(path: string): Promise<SocketReader> {
  for (let i = 0; i < 50; i++) {
    const probe = await connectRaw(path);
    const greeted = await waitFor('a greeting', () => probe.peek().length > 0, 300).then(() => true, () => false);
    if (!greeted) return probe;
    probe.socket.destroy();
  }
  throw new Error(`the server at ${path} kept accepting: it never froze`);
}

/** A bare connection to `path` with a byte reader (no handshake). */
async function connectRaw(path: string): Promise<SocketReader> {
  const sock = await new Promise<net.Socket>((resolve, reject) => {
    const so = net.createConnection({ path });
    so.once('connect', () => resolve(so));
    so.once('error', reject);
  });
  return new SocketReader(sock);
}

describe('hand-off channel against a hostile peer', () => {
  const HOSTILE = join(__dirname, 'handoff-hostile-peer.py');
  const cases: Array<[string, RegExp]> = [
    ['bad-magic', /bad magic/],
    ['oversized', /2097152 bytes is over the limit/],
    ['too-many-fds', /5000 fds is over the limit/],
    ['fd-count', /announced 3 fds, carried 2/],
    ['message-with-fds', /\(message\) carries fds/],
    ['garbage-record', /NBD hand-off record: bad magic/],
    ['record-fd-count', /carries 1 fds for 1 connections \(expected 2\)/],
    ['record-not-socket', /the listening fd is not a socket/],
    ['truncated', /short message \(0 bytes\)/],
  ];

  it.each(cases)('%s: PROTOCOL_ERROR, the fds it carried closed, the channel broken', async (variant, message) => {
    const s = new Scratch('mooring-hostile-');
    try {
      const before = fdCount();
      const listener = await addon().handOff!.listen(s.path('h.sock'));
      const py = spawn('python3', [HOSTILE, s.path('h.sock'), variant], { stdio: ['ignore', 'inherit', 'pipe'] });
      py.stderr.on('data', (d: Buffer) => process.stderr.write(`[hostile ${variant} stderr] ${d.toString()}`));
      const exited = new Promise<number | null>((r) => py.on('exit', (code) => r(code)));
      const ch = await listener.accept(20_000);
      expect(ch.peerPid).toBe(py.pid);
      const err = await ch.receive(20_000).then(() => null, (e: { code: string; message: string }) => e);
      expect(err?.code).toBe('PROTOCOL_ERROR');
      expect(err?.message).toMatch(message);
      // Broken for good: the next call fails the same way, without reading.
      expect(await ch.receive(1000).then(() => null, (e: { code: string }) => e.code)).toBe('PROTOCOL_ERROR');
      ch.close();
      listener.close();
      expect(await exited).toBe(0);
      await waitFor('every fd of the hostile record closed', () => fdCount() === before, 5000);
    } finally {
      s.cleanup();
    }
  });

  it('a receiver out of fds (MSG_CTRUNC) refuses the record and closes the fds it did get', async () => {
    const s = new Scratch('mooring-hostile-');
    // A peer whose fd limit leaves room for some of the 200 fds sent, not all of them.
    const probe = await Peer.start('probe');
    const base = await probe.call<number>('fdCount');
    await probe.stop();
    const peer = await Peer.start('R', ['prlimit', `--nofile=${base + 60}`, '--']);
    try {
      await peer.call('listen', { path: s.path('h.sock') });
      const before = await peer.call<number>('fdCount');
      const accepted = peer.call('accept', { timeoutMs: 20_000 });
      const py = spawn('python3', [HOSTILE, s.path('h.sock'), 'many-fds'], { stdio: ['ignore', 'inherit', 'inherit'] });
      const exited = new Promise<number | null>((r) => py.on('exit', (code) => r(code)));
      await accepted;
      const err = await peer.call('receive', { timeoutMs: 20_000 }).then(() => null, (e: { code: string; message: string }) => e);
      expect(err?.code).toBe('PROTOCOL_ERROR');
      expect(err?.message).toMatch(/MSG_CTRUNC/);
      await peer.call('closeChannel');
      expect(await exited).toBe(0);
      await waitFor('the fds it received closed', async () => (await peer.call<number>('fdCount')) === before, 5000);
    } finally {
      await peer.stop();
      s.cleanup();
    }
  });
});
