// GOAWAY through the real addon (docs/replica-protocol.md, "GOAWAY"): a replica server that
// goes away hands its clients over to a successor on the same address. A client that
// announced GOAWAY drains, reconnects within its ioTimeoutMs and carries on: no I/O error,
// the replica stays RW, no rebuild, the replicas identical afterwards. A client that did not
// announce it (an older release, played by a proxy that zeroes the server's feature bits)
// never sees a GOAWAY and loses its connection as before (ERR); so does one whose server
// never comes back, once ioTimeoutMs has passed.
import { type ChildProcess, spawn } from 'node:child_process';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { NativeEngine, NativeRemoteReplica, NativeTlsOptions } from '../../src/native/binding.js';
import { NbdClient } from '../system/helpers/nbd-client.js';
import { addon, MiB, pattern, replicaImage, Scratch, waitFor, engineOptions } from './helpers.js';
import {
  closeAll,
  collectEvents,
  endpoint,
  FrameProxy,
  FrameSplitter,
  type Host,
  makePki,
  modeOf,
  Op,
  RawClient,
  REP_HEADER,
  REP_MAGIC,
  REQ_HEADER,
  startHosts,
} from './remote-helpers.js';

const SIZE = 8 * MiB;
const BLOCK = 4096;
const FEATURE_GROW = 1n;
const FEATURE_GOAWAY = 2n;
const FEATURE_LAST_RW = 4n;
const FEATURE_DIGEST_MASKS = 8n;
const CODE_GOAWAY = 0x100;
const CLIENT_FEATURES = 26;
const PEER = join(dirname(fileURLToPath(import.meta.url)), 'replica-server-peer.mjs');

/**
 * A replica server in its own process (replica-server-peer.mjs), as on another host: engine
 * calls held in this process must not stand in the way of the server's own calls.
 */
class ServerPeer {
  private next = 0;
  private waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private exited: Promise<void>;
  port = 0;
  private constructor(private readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const m = JSON.parse(line) as { id: number; ok: boolean; result?: unknown; error?: { code: string; message: string } };
      const w = this.waiting.get(m.id);
      this.waiting.delete(m.id);
      if (m.ok) w?.resolve(m.result);
      else w?.reject(Object.assign(new Error(m.error!.message), { code: m.error!.code }));
    });
    child.stderr!.on('data', (d: Buffer) => process.stderr.write(d));
    this.exited = new Promise((resolve) => child.on('exit', () => resolve()));
  }

  static async start(root: string, port = 0, tls?: NativeTlsOptions): Promise<ServerPeer> {
    const p = new ServerPeer(spawn(process.execPath, [PEER], { stdio: ['pipe', 'pipe', 'pipe'] }));
    p.port = ((await p.call('start', { root, port, tls })) as { port: number }).port;
    return p;
  }

  call(op: string, args: Record<string, unknown> = {}): Promise<unknown> {
    const id = ++this.next;
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      this.child.stdin!.write(JSON.stringify({ id, op, ...args }) + '\n');
    });
  }

  goAway(timeoutMs: number): Promise<{ goaway: number; timedOut: number; closed: number }> {
    return this.call('goAway', { timeoutMs }) as Promise<{ goaway: number; timedOut: number; closed: number }>;
  }

  stats(): Promise<{ connectionsOpen: number; requests: number; bytesWritten: number; protocolErrors: number }> {
    return this.call('stats') as Promise<{ connectionsOpen: number; requests: number; bytesWritten: number; protocolErrors: number }>;
  }

  private stopping: Promise<void> | null = null;
  /** Closes the server and ends the process. Idempotent. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      await this.call('close').catch(() => undefined);
      this.child.stdin!.end();
      await this.exited;
    })();
    return this.stopping;
  }
}

/**
 * A proxy in front of a real server that can hold replies and inject a GOAWAY itself, and
 * passes half-closes through: a client can be sent a GOAWAY while requests it sent are
 * still unanswered. Records the seq of every request frame, by connection.
 */
class GoAwayProxy {
  readonly conns: Array<{ seqs: bigint[]; held: Buffer[]; hold: boolean; halfClosed: boolean; closed: boolean; client: Socket }> = [];
  private server: Server;
  private sockets = new Set<Socket>();
  port = 0;
  constructor(targetPort: number) {
    this.server = createServer({ allowHalfOpen: true }, (client) => {
      const upstream = createConnection({ port: targetPort, host: '127.0.0.1', allowHalfOpen: true });
      const c = { seqs: [] as bigint[], held: [] as Buffer[], hold: false, halfClosed: false, closed: false, client };
      this.conns.push(c);
      for (const so of [client, upstream]) {
        this.sockets.add(so);
        so.setNoDelay(true);
        so.on('error', () => {});
      }
      const up = new FrameSplitter(REQ_HEADER, 40);
      const down = new FrameSplitter(REP_HEADER, 20);
      client.on('data', (d: Buffer) => {
        for (const f of up.push(d)) {
          c.seqs.push(f.readBigUInt64LE(8));
          upstream.write(f);
        }
      });
      upstream.on('data', (d: Buffer) => {
        for (const f of down.push(d)) {
          if (c.hold) c.held.push(f);
          else client.write(f);
        }
      });
      client.on('end', () => {
        c.halfClosed = !c.closed;
        upstream.end();
      });
      upstream.on('end', () => client.end());
      client.on('close', () => {
        c.closed = true;
        upstream.destroy();
      });
      upstream.on('close', () => client.destroy());
    });
  }
  async start(): Promise<number> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
    return this.port;
  }
  goAway(i: number): void {
    const f = Buffer.alloc(REP_HEADER);
    f.writeUInt32LE(REP_MAGIC, 0);
    f.writeUInt16LE(CODE_GOAWAY, 4);
    this.conns[i]!.client.write(f);
  }
  release(i: number): void {
    const c = this.conns[i]!;
    c.hold = false;
    for (const f of c.held.splice(0)) c.client.write(f);
  }
  async close(): Promise<void> {
    for (const so of this.sockets) so.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

describe('replica server GOAWAY', () => {
  let s: Scratch;
  let hosts: Host[] = [];
  const cleanups: Array<() => Promise<void>> = [];
  beforeAll(() => {
    s = new Scratch('mooring-goaway-');
  });
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
    await closeAll(hosts);
    hosts = [];
  });
  afterAll(() => s.cleanup());

  async function open(eps: NativeRemoteReplica[], onEvents?: (e: unknown[]) => void): Promise<NativeEngine> {
    const e = await addon().openEngine(engineOptions({ replicas: eps, onEvents }));
    cleanups.push(() => e.close());
    return e;
  }

  /**
   * `workers` loops, each over its own 64-block region: write a block, read it back and
   * compare, so that writes and reads are in flight together (qd = workers). Any error or
   * mismatch rejects.
   */
  function io(engine: Pick<NativeEngine, 'write' | 'read'> | NbdClient, model: Buffer, workers: number): { rounds: () => number; stop: () => Promise<void> } {
    let stop = false;
    let rounds = 0;
    const loops = Array.from({ length: workers }, async (_, w) => {
      for (let k = 0; !stop; k++) {
        const off = (w * 64 + (k % 64)) * BLOCK;
        const data = pattern(w * 1_000_000 + k, BLOCK);
        await engine.write(off, data);
        data.copy(model, off);
        const back = await engine.read(off, BLOCK);
        if (!back.equals(data)) throw new Error(`worker ${w}: read back differs at ${off}`);
        rounds++;
      }
    });
    return {
      rounds: () => rounds,
      stop: async () => {
        stop = true;
        await Promise.all(loops);
      },
    };
  }

  async function expectIdentical(roots: string[], model: Buffer): Promise<void> {
    for (const root of roots) {
      const r = await addon().openReplica(join(root, 'vol'));
      try {
        const img = await replicaImage(r);
        expect(img.findIndex((b, i) => b !== model[i]), `replica ${root}`).toBe(-1);
      } finally {
        await r.close();
      }
    }
  }

  it('speaks the protocol: the bit in HELLO, CLIENT_FEATURES, GOAWAY only to a client that announced it, answers until the half-close', async () => {
    hosts = await startHosts(s, 1, SIZE);
    const h = hosts[0]!;
    const announced = await RawClient.connect(h.server.port);
    announced.send({ op: Op.HELLO, seq: 0, payload: Buffer.from('vol') });
    const hello = await announced.next();
    expect(hello?.code).toBe(0);
    expect(hello!.payload.readBigUInt64LE(8)).toBe(FEATURE_GROW | FEATURE_GOAWAY | FEATURE_LAST_RW | FEATURE_DIGEST_MASKS);
    // Unknown bits are ignored: the reply names the ones both know.
    announced.send({ op: CLIENT_FEATURES, seq: 0, length: FEATURE_GOAWAY | (1n << 40n) });
    const cf = await announced.next();
    expect([cf?.code, cf?.seq, cf?.value]).toEqual([0, 0n, FEATURE_GOAWAY]);
    announced.send({ op: CLIENT_FEATURES, seq: 7, length: FEATURE_GOAWAY });
    expect((await announced.reply(7))?.code, 'only once').toBe(16);

    const silent = await RawClient.open(h.server.port, 'vol'); // never announces it
    silent.send({ op: Op.PING, seq: 1 });
    expect((await silent.reply(1))?.code).toBe(0);

    const going = h.server.goAway(10_000);
    const ga = await announced.next();
    expect([ga?.seq, ga?.code, ga?.payload.length]).toEqual([0n, CODE_GOAWAY, 0]);
    // Requests that cross the GOAWAY are still answered, until the client half-closes.
    announced.send({ op: Op.PING, seq: 8 }, { op: Op.READ, seq: 9, offset: 0, length: BLOCK });
    expect((await announced.reply(8))?.code).toBe(0);
    const read = await announced.reply(9);
    expect([read?.code, read?.payload.length]).toEqual([0, BLOCK]);
    expect(announced.isOpen).toBe(true);
    announced.socket.end(); // half-close
    await announced.closed;
    await silent.closed; // closed without a GOAWAY
    expect(silent.replies.some((r) => r.code === CODE_GOAWAY)).toBe(false);
    expect(await going).toEqual({ goaway: 1, timedOut: 0, closed: 1 });
    expect(h.server.stats().connectionsOpen).toBe(0);
    expect(h.server.stats().protocolErrors, 'the second CLIENT_FEATURES only').toBe(1);
  });

  it('closes a GOAWAY connection whose client never half-closes once the timeout passes', async () => {
    hosts = await startHosts(s, 1, SIZE);
    const c = await RawClient.open(hosts[0]!.server.port, 'vol');
    c.send({ op: CLIENT_FEATURES, seq: 1, length: FEATURE_GOAWAY });
    expect((await c.reply(1))?.value).toBe(FEATURE_GOAWAY);
    const t0 = Date.now();
    expect(await hosts[0]!.server.goAway(300)).toEqual({ goaway: 0, timedOut: 1, closed: 0 });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
    await c.closed;
    expect(c.replies.some((r) => r.seq === 0n && r.code === CODE_GOAWAY)).toBe(true);
  });

  /** A root holding replica `vol`, served by a server in its own process. */
  async function peerHost(tls?: NativeTlsOptions): Promise<{ root: string; peer: ServerPeer }> {
    const root = s.dir(`peer-${Math.random().toString(36).slice(2, 8)}`);
    await addon().createReplica(join(root, 'vol'), SIZE);
    const peer = await ServerPeer.start(root, 0, tls);
    cleanups.push(() => peer.stop());
    return { root, peer };
  }

  for (const tls of [false, true]) {
    it(`moves an engine to a successor server with I/O in flight${tls ? ' (mutual TLS)' : ''}: no error, the replica stays RW, no rebuild, data identical`, async () => {
      hosts = await startHosts(s, 2, SIZE);
      let serverTls: NativeTlsOptions | undefined;
      let clientTls: NativeTlsOptions | undefined;
      if (tls) {
        const pki = makePki(s.dir(`pki-${Math.random().toString(36).slice(2, 8)}`));
        serverTls = { cert: pki.serverCert, key: pki.serverKey, ca: pki.ca };
        clientTls = { cert: pki.clientCert, key: pki.clientKey, ca: pki.ca, serverName: 'replica.test' };
      }
      const victim = await peerHost(serverTls);
      const ev = collectEvents();
      const engine = await open(
        [endpoint(hosts[0]!.server.port), endpoint(victim.peer.port, 'vol', clientTls ? { tls: clientTls } : {}), endpoint(hosts[1]!.server.port)],
        ev.onEvents,
      );
      const id = `127.0.0.1:${victim.peer.port}/vol`;
      const model = Buffer.alloc(SIZE);
      const load = io(engine, model, 12);
      await waitFor('I/O flowing', () => load.rounds() > 100);
      ev.events.length = 0; // from here on: none of the events a lost replica causes

      expect(await victim.peer.goAway(5_000)).toEqual({ goaway: 1, timedOut: 0, closed: 0 });
      await victim.peer.stop(); // closes its listening socket: connects are refused until the successor listens
      const next = await ServerPeer.start(victim.root, victim.peer.port, serverTls);
      cleanups.push(() => next.stop());
      const atStart = load.rounds();
      await waitFor('the client reconnected to the successor', async () => (await next.stats()).connectionsOpen === 1, 8_000);
      await waitFor('I/O continues through the successor', async () => load.rounds() > atStart + 200 && (await next.stats()).bytesWritten > 0, 10_000);
      await load.stop(); // no request failed
      expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
      expect(modeOf(engine, id)).toBe('RW');
      const bad = ev.events.filter((e) => e.type === 'replica-error' || e.type.startsWith('rebuild') || e.type === 'replica-set-changed');
      expect(JSON.stringify(bad), 'no ERR, no rebuild, no new replica set').toBe('[]');
      expect((await next.stats()).protocolErrors).toBe(0);
      expect((await engine.read(0, 12 * 64 * BLOCK)).equals(model.subarray(0, 12 * 64 * BLOCK))).toBe(true);
      await engine.close();
      cleanups.length = 0;
      await next.stop();
      await closeAll(hosts);
      await expectIdentical([hosts[0]!.root, victim.root, hosts[1]!.root], model);
    });
  }

  // Three hosts, the second behind a GoAwayProxy; an engine over them, its events collected.
  async function behindGoAwayProxy(): Promise<{ proxy: GoAwayProxy; ev: ReturnType<typeof collectEvents>; engine: NativeEngine }> {
    hosts = await startHosts(s, 3, SIZE);
    const proxy = new GoAwayProxy(hosts[1]!.server.port);
    const port = await proxy.start();
    cleanups.push(() => proxy.close());
    const ev = collectEvents();
    const engine = await open([endpoint(hosts[0]!.server.port), endpoint(port), endpoint(hosts[2]!.server.port)], ev.onEvents);
    return { proxy, ev, engine };
  }

  it('a GOAWAY that arrives with requests unanswered: the client waits for them, half-closes, resends nothing, holds its callers', async () => {
    const { proxy, ev, engine } = await behindGoAwayProxy();
    const model = Buffer.alloc(SIZE);
    const load = io(engine, model, 8);
    await waitFor('I/O flowing', () => load.rounds() > 50);
    ev.events.length = 0;
    const first = proxy.conns[0]!;
    first.hold = true;
    await waitFor('replies held', () => first.held.length >= 4);
    proxy.goAway(0);
    const seqsAtGoAway = first.seqs.length;
    const rounds = load.rounds();
    expect(first.halfClosed, 'not while requests it sent are unanswered').toBe(false);
    proxy.release(0);
    await waitFor('the client half-closed the first connection', () => first.halfClosed);
    await waitFor('the client reconnected', () => proxy.conns.length === 2);
    await waitFor('I/O continues', () => load.rounds() > rounds + 100);
    await load.stop(); // no request failed
    const second = proxy.conns[1]!;
    expect(second.seqs.length).toBeGreaterThan(0);
    // Frames sent after the GOAWAY on the first connection: at most those of a batch the
    // sender had already taken; nothing sent on both connections.
    expect(first.seqs.length - seqsAtGoAway).toBeLessThanOrEqual(64);
    const onFirst = new Set(first.seqs.filter((q) => q !== 0n));
    expect(second.seqs.filter((q) => q !== 0n && onFirst.has(q)), 'nothing resent').toEqual([]);
    expect(Math.min(...second.seqs.filter((q) => q !== 0n).map(Number))).toBeGreaterThan(Math.max(...[...onFirst].map(Number)));
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    expect(JSON.stringify(ev.events.filter((e) => e.type === 'replica-error' || e.type.startsWith('rebuild')))).toBe('[]');
    expect((await engine.read(0, 8 * 64 * BLOCK)).equals(model.subarray(0, 8 * 64 * BLOCK))).toBe(true);
  });

  it('over NBD, where writes and reads wait on no thread: a GOAWAY with requests unanswered, and every request queued meanwhile is sent after the reconnect', async () => {
    const { proxy, ev, engine } = await behindGoAwayProxy();
    const sock = s.path(`nbd-${Math.random().toString(36).slice(2, 8)}.sock`);
    const nbd = await engine.exportNbd({ unixPath: sock, ioThreads: 2 });
    cleanups.push(() => nbd.close());
    const client = await NbdClient.connect({ socketPath: sock });
    cleanups.push(async () => client.destroy());
    const model = Buffer.alloc(SIZE);
    const load = io(client, model, 8);
    cleanups.push(() => load.stop()); // runs before the client goes, if a wait below fails
    await waitFor('I/O flowing', () => load.rounds() > 50);
    ev.events.length = 0;
    const first = proxy.conns[0]!;
    first.hold = true;
    await waitFor('replies held', () => first.held.length >= 4);
    proxy.goAway(0);
    // Requests the NBD client sends now are queued behind the GOAWAY: nobody waits on them.
    proxy.release(0);
    await waitFor('the client reconnected', () => proxy.conns.length === 2);
    const rounds = load.rounds();
    await waitFor('I/O continues', () => load.rounds() > rounds + 100);
    await load.stop(); // no request failed
    expect(proxy.conns[1]!.seqs.length).toBeGreaterThan(0);
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    expect(JSON.stringify(ev.events.filter((e) => e.type === 'replica-error' || e.type.startsWith('rebuild')))).toBe('[]');
    expect((await client.read(0, 8 * 64 * BLOCK)).equals(model.subarray(0, 8 * 64 * BLOCK))).toBe(true);
  });

  it('a client that predates GOAWAY (its server announced no bits) is never sent one and loses its connection: ERR', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const victim = hosts[2]!;
    const proxy = new FrameProxy(victim.server.port);
    let goawaysSeen = 0;
    // The HELLO reply's feature bits as a server before them sent them: zeros. The client
    // then announces nothing, as an older client would.
    proxy.rewriteReply = (frame, n) => {
      if (n === 0) frame.fill(0, REP_HEADER + 8, REP_HEADER + 16);
      if (frame.readBigUInt64LE(8) === 0n && frame.readUInt16LE(4) === CODE_GOAWAY) goawaysSeen++;
      return frame;
    };
    const port = await proxy.start();
    cleanups.push(() => proxy.close());
    const ev = collectEvents();
    const engine = await open([endpoint(hosts[0]!.server.port), endpoint(hosts[1]!.server.port), endpoint(port)], ev.onEvents);
    const model = Buffer.alloc(SIZE);
    const load = io(engine, model, 8);
    await waitFor('I/O flowing', () => load.rounds() > 50);
    expect(await victim.server.goAway(5_000)).toEqual({ goaway: 0, timedOut: 0, closed: 1 });
    const id = `127.0.0.1:${port}/vol`;
    await waitFor('replica ERR', () => modeOf(engine, id) === 'ERR', 10_000);
    const at = load.rounds();
    await waitFor('I/O continues on the others', () => load.rounds() > at + 50);
    await load.stop(); // no request failed
    expect(goawaysSeen).toBe(0);
    expect(ev.events.some((e) => e.type === 'replica-error' && e.replicaId === id)).toBe(true);
    expect(modeOf(engine, `127.0.0.1:${hosts[0]!.server.port}/vol`)).toBe('RW');
  });

  it('a server that never comes back: the replica goes ERR once ioTimeoutMs has passed, not before; I/O carries on', async () => {
    hosts = await startHosts(s, 2, SIZE);
    const victim = await peerHost();
    const IO_TIMEOUT = 1500;
    const ev = collectEvents();
    const engine = await open(
      [endpoint(victim.peer.port, 'vol', { ioTimeoutMs: IO_TIMEOUT }), endpoint(hosts[0]!.server.port), endpoint(hosts[1]!.server.port)],
      ev.onEvents,
    );
    const id = engine.replicas()[0]!.id;
    const model = Buffer.alloc(SIZE);
    const load = io(engine, model, 8);
    await waitFor('I/O flowing', () => load.rounds() > 50);
    const t0 = Date.now();
    expect(await victim.peer.goAway(5_000)).toEqual({ goaway: 1, timedOut: 0, closed: 0 });
    await victim.peer.stop();
    expect(modeOf(engine, id), 'held while it reconnects').toBe('RW');
    await waitFor('replica ERR', () => modeOf(engine, id) === 'ERR', IO_TIMEOUT + 5_000);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(IO_TIMEOUT - 100);
    expect(engine.replicas()[0]!.lastError).toBe(-110); // ETIMEDOUT
    const at = load.rounds();
    await waitFor('I/O continues on the others', () => load.rounds() > at + 50);
    await load.stop(); // no request failed: the held ones were answered once the replica was dropped
    expect(ev.events.some((e) => e.type === 'replica-error' && e.replicaId === id)).toBe(true);
    expect(engine.replicas().slice(1).map((r) => r.mode)).toEqual(['RW', 'RW']);
  });
});
