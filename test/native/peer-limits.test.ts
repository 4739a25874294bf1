// Per-peer connection limits (docs/hardening.md, "Connections"), through the real addon.
// Hostile peers open connections and never finish their handshake:
// - replica server, full of one address's stuck connections (over its share): a good client
//   from another address, and one from the same address, are served at once, each in place
//   of that address's oldest stuck connection;
// - full of stuck connections whose peers are within their share: a newcomer is closed
//   while they are young, served (and an engine too) once they have waited 1 s; connections
//   past HELLO are never dropped for a newcomer, however many one address has;
// - NBD export on a unix socket (peer = user id), full of one user's stuck connections: a
//   good client is served at once in place of the oldest.
import { createConnection, type Socket } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../src/bench/nbd-client.js';
import { LocalEngine } from '../../src/engine/engine.js';
import type { NativeEngine } from '../../src/native/binding.js';
import { addon, createReplicas, engineOptions, MiB, nextEpoch, pattern, Scratch } from './helpers.js';
import { closeAll, CodeNum, endpoint, type Host, Op, RawClient } from './remote-helpers.js';

const SIZE = 4 * MiB;
const EVICT_AFTER_MS = 1000; // kEvictHandshakingAfterMs

/** `n` raw connections from `from` that send nothing (stuck in their handshake). */
async function hostile(port: number, from: string, n: number): Promise<RawClient[]> {
  const out: RawClient[] = [];
  for (let i = 0; i < n; i++) out.push(await RawClient.connect(port, '127.0.0.1', from));
  return out;
}

/** Waits until the server has closed exactly `closed` of `conns` (and the rest stay open for a moment). */
async function settle(conns: RawClient[], closed: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (conns.filter((c) => !c.isOpen).length < closed) {
    if (Date.now() > deadline) throw new Error(`expected ${closed} of ${conns.length} closed, got ${conns.filter((c) => !c.isOpen).length}`);
    await Promise.race([...conns.filter((c) => c.isOpen).map((c) => c.closed), new Promise((r) => setTimeout(r, 100))]);
  }
}

async function hello(c: RawClient, name = 'vol'): Promise<number | null> {
  c.send({ op: Op.HELLO, seq: 0, payload: Buffer.from(name) });
  const r = await c.next();
  return r ? r.code : null;
}

describe('per-peer connection limits', () => {
  let s: Scratch;
  let hosts: Host[] = [];
  const raw: RawClient[] = [];
  const engines: NativeEngine[] = [];
  beforeAll(() => {
    s = new Scratch('mooring-peer-limits-');
  });
  afterEach(async () => {
    for (const c of raw.splice(0)) c.close();
    for (const e of engines.splice(0)) await e.close().catch(() => {});
    await closeAll(hosts);
    hosts = [];
  });
  afterAll(() => s.cleanup());

  async function server(opts: { maxConnections: number; handshakingPerPeerMax: number }): Promise<number> {
    const root = s.dir(`h-${Math.random().toString(36).slice(2, 8)}`);
    await addon().createReplica(`${root}/vol`, SIZE);
    const srv = await addon().startReplicaServer({ root, ...opts });
    hosts.push({ root, server: srv });
    return srv.port;
  }

  it('replica server: full of one address over its share, it serves others and that address at once', async () => {
    const port = await server({ maxConnections: 8, handshakingPerPeerMax: 4 });
    const bad = await hostile(port, '127.0.0.1', 10);
    raw.push(...bad);
    // 8 fill the server; the 9th and 10th each take the place of the oldest (8 > its share of 4).
    await settle(bad, 2);
    expect([bad[0]!.isOpen, bad[1]!.isOpen]).toEqual([false, false]);

    // Another address is served at once, in place of the next oldest stuck one.
    const other = await RawClient.connect(port, '127.0.0.1', '127.0.0.2');
    raw.push(other);
    expect(await hello(other)).toBe(CodeNum.OK);
    await bad[2]!.closed;

    // So is a good client from the same address as the stuck ones.
    const same = await RawClient.connect(port, '127.0.0.1', '127.0.0.1');
    raw.push(same);
    expect(await hello(same)).toBe(CodeNum.OK);
    await bad[3]!.closed;
    expect(bad.filter((c) => c.isOpen)).toHaveLength(6);
    const st = hosts[0]!.server.stats();
    expect([st.handshakesDropped, st.connectionsRefused]).toEqual([4, 0]);
  });

  it('replica server: full of stuck handshakes, it still serves a good client and an engine; served connections are never dropped', async () => {
    const port = await server({ maxConnections: 8, handshakingPerPeerMax: 4 });
    // Good connections past HELLO from one address: more than the per-peer handshake limit.
    const good: RawClient[] = [];
    for (let i = 0; i < 5; i++) {
      const c = await RawClient.connect(port, '127.0.0.1', '127.0.0.9');
      good.push(c);
      expect(await hello(c)).toBe(CodeNum.OK);
    }
    raw.push(...good);
    // Hostile peers fill the rest, each within its share: 2 + 1 stuck (server full at 8).
    const bad = [...(await hostile(port, '127.0.0.1', 2)), ...(await hostile(port, '127.0.0.3', 1))];
    raw.push(...bad);
    const t0 = Date.now();
    // While they are young nothing may go for a newcomer: closed at accept.
    const early = await RawClient.connect(port, '127.0.0.1', '127.0.0.6');
    raw.push(early);
    await early.closed;
    expect(early.replies).toEqual([]);
    expect(Date.now() - t0).toBeLessThan(EVICT_AFTER_MS); // (else the check above proved nothing)
    expect(hosts[0]!.server.stats().connectionsRefused).toBe(1);
    while (Date.now() - t0 < EVICT_AFTER_MS + 100) await new Promise((r) => setTimeout(r, EVICT_AFTER_MS + 100 - (Date.now() - t0)));

    // A good client on a full server: the oldest stuck handshake goes for it.
    const newcomer = await RawClient.connect(port, '127.0.0.1', '127.0.0.5');
    raw.push(newcomer);
    expect(await hello(newcomer)).toBe(CodeNum.OK);
    // An engine too (its replica client connects, HELLO, CLAIM_EPOCH...).
    const engine = await addon().openEngine(engineOptions({ replicas: [endpoint(port, 'vol')] }));
    engines.push(engine);
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW']);
    await engine.write(0, pattern(3, 4096));
    expect((await engine.read(0, 4096)).equals(pattern(3, 4096))).toBe(true);
    expect(hosts[0]!.server.stats().handshakesDropped).toBe(2);

    // A flood of young connections: the first takes the last stuck handshake's place, then
    // there is nothing it may drop (the first is young and within its share, the others
    // served): closed at accept. The served connections all answer a PING.
    const flood = await hostile(port, '127.0.0.4', 20);
    raw.push(...flood);
    await settle(flood, 19);
    expect(flood[0]!.isOpen).toBe(true);
    await settle(bad, 3);
    expect(hosts[0]!.server.stats().handshakesDropped).toBe(3);
    for (const c of [...good, newcomer]) {
      c.send({ op: Op.PING, seq: 7 });
      expect((await c.reply(7))?.code).toBe(CodeNum.OK);
    }
  });

  it('NBD export on a unix socket: full of one user\'s stuck handshakes (over its share of 16), a good client is served at once', async () => {
    const replicas = await createReplicas(s.path('nbd-replicas'), 1, 16 * MiB);
    const engine = await LocalEngine.open({ replicas, epoch: nextEpoch() });
    const sock = s.path('nbd.sock');
    const stuck: Socket[] = [];
    try {
      await engine.exportNbd({ nbd: `unix:${sock}`, maxConnections: 20 });
      const closed: boolean[] = [];
      for (let i = 0; i < 24; i++) {
        const so = createConnection({ path: sock });
        so.on('error', () => {});
        so.resume(); // take the greeting, so that an EOF after it is seen
        const k = closed.push(false) - 1;
        so.on('close', () => (closed[k] = true));
        stuck.push(so);
        await new Promise<void>((res) => so.once('connect', () => res()));
      }
      // 20 fill the export; each of the 4 more takes the place of the oldest.
      const until = async (n: number): Promise<void> => {
        const deadline = Date.now() + 10_000;
        while (closed.filter(Boolean).length < n && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
        expect(closed.filter(Boolean).length).toBe(n);
      };
      await until(4);
      expect(closed.slice(0, 4).every(Boolean)).toBe(true);
      const good = await NbdClient.connect({ socketPath: sock });
      try {
        await good.write(0, pattern(4, 4096));
        expect((await good.read(0, 4096)).equals(pattern(4, 4096))).toBe(true);
      } finally {
        await good.disconnect();
      }
      await until(5); // the next oldest made room for it
      expect(closed[4]).toBe(true);
    } finally {
      for (const so of stuck) so.destroy();
      await engine.close();
    }
  });
});
