// Authentication of the replica protocol with the cluster secret (docs/replica-protocol.md,
// "Authentication"), through the real addon: a raw client speaking the handshake as the
// document describes it (proofs computed here with node:crypto) is served only with the
// right secret; no AUTH, a wrong secret or a spoiled proof gets UNAUTHENTICATED and a
// closed connection, before it can name a replica; an engine opens replicas with the right
// secret and as ERR otherwise, and refuses an impostor server that cannot prove the secret
// (it never sends it a HELLO, let alone a write). Prints the handshake's cost.
import { randomBytes } from 'node:crypto';
import { createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { addon, codeOf, MiB, pattern, Scratch } from './helpers.js';
import { closeAll, CodeNum, endpoint, FrameSplitter, Op, RawClient, rawAuthenticate, RemoteFixture, REQ_HEADER, startHosts } from './remote-helpers.js';

const SIZE = 4 * MiB;

describe('replica protocol authentication (cluster secret)', () => {
  let s: Scratch;
  const f = new RemoteFixture();
  const secret = randomBytes(32);
  beforeAll(() => {
    s = new Scratch('mooring-replica-auth-');
  });
  afterEach(() => f.reset());
  afterAll(() => s.cleanup());

  it('serves a raw client that proves the secret, after the server proved it', async () => {
    f.hosts = await startHosts(s, 1, SIZE, 'vol', undefined, secret);
    const port = f.hosts[0]!.server.port;
    const c = await RawClient.connect(port);
    const { serverProved, reply } = await rawAuthenticate(c, secret);
    expect(serverProved).toBe(true);
    expect(reply?.code).toBe(CodeNum.OK);
    c.send({ op: Op.HELLO, seq: 1, payload: Buffer.from('vol') });
    expect((await c.reply(1))?.code).toBe(CodeNum.OK);
    c.send({ op: Op.CLAIM_EPOCH, seq: 2, epoch: 7 });
    expect((await c.reply(2))?.code).toBe(CodeNum.OK);
    c.send({ op: Op.WRITE, seq: 3, epoch: 7, offset: 0, length: 4096, payload: pattern(5, 4096) });
    expect((await c.reply(3))?.code).toBe(CodeNum.OK);
    // Authentication is over once HELLO is answered: AUTH again is a protocol error.
    c.send({ op: Op.AUTH, seq: 4, payload: randomBytes(32) });
    expect((await c.reply(4))?.code).toBe(CodeNum.PROTOCOL_ERROR);
    c.close();
    expect(f.hosts[0]!.server.stats().authFailures).toBe(0);
  });

  it('refuses a client without the secret, with a wrong one, or with a spoiled proof, before it names a replica', async () => {
    f.hosts = await startHosts(s, 1, SIZE, 'vol', undefined, secret);
    const port = f.hosts[0]!.server.port;

    // No AUTH at all (a client of a release without authentication, or an attacker):
    // HELLO and CLAIM_EPOCH pipelined; only the refusal comes back, then the close.
    const none = await RawClient.connect(port);
    none.send({ op: Op.HELLO, seq: 0, payload: Buffer.from('vol') }, { op: Op.CLAIM_EPOCH, seq: 1, epoch: 99 });
    await none.closed;
    expect(none.replies.map((r) => r.code)).toEqual([CodeNum.UNAUTHENTICATED]);
    expect(none.replies[0]!.payload.toString()).toContain('requires the cluster secret');

    // A wrong secret: the server's proof does not check out with it, and the client's
    // proof is refused.
    const wrong = await RawClient.connect(port);
    const w = await rawAuthenticate(wrong, randomBytes(32));
    expect(w.serverProved).toBe(false);
    expect(w.reply?.code).toBe(CodeNum.UNAUTHENTICATED);
    expect(w.reply?.payload.toString()).toContain('wrong cluster secret');
    wrong.send({ op: Op.HELLO, seq: 1, payload: Buffer.from('vol') });
    await wrong.closed;
    expect(wrong.replies).toEqual([]);

    // The right secret but a proof with one bit flipped (no replay or guess passes).
    const spoiled = await RawClient.connect(port);
    const sp = await rawAuthenticate(spoiled, secret, true);
    expect(sp.serverProved).toBe(true);
    expect(sp.reply?.code).toBe(CodeNum.UNAUTHENTICATED);
    await spoiled.closed;

    expect(f.hosts[0]!.server.stats().authFailures).toBe(3);
    // Nothing reached the replica: its epoch is still 0 (the refused CLAIM_EPOCH never ran).
    await closeAll(f.hosts);
    const r = await addon().openReplica(join(f.hosts[0]!.root, 'vol'));
    try {
      expect(r.epoch()).toBe(0);
    } finally {
      await r.close();
    }
  });

  it('a server without a secret refuses AUTH, so a client with one does not use it', async () => {
    f.hosts = await startHosts(s, 1, SIZE, 'vol');
    const c = await RawClient.connect(f.hosts[0]!.server.port);
    const { reply } = await rawAuthenticate(c, secret);
    expect(reply?.code).toBe(CodeNum.UNAUTHENTICATED);
    expect(reply?.payload.toString()).toContain('no cluster secret');
    await c.closed;
  });

  it('an engine opens replicas with the right secret, and as ERR without it, with a wrong one, or on a server without one', async () => {
    f.hosts = await startHosts(s, 1, SIZE, 'vol', undefined, secret);
    const [plain] = await startHosts(s, 1, SIZE, 'vol');
    const port = f.hosts[0]!.server.port;
    for (const n of ['g1', 'g2', 'g3', 'g4', 'b1', 'b2']) await addon().createReplica(join(f.hosts[0]!.root, n), SIZE);
    const engine = await f.open([
      endpoint(port, 'g1', { clusterSecret: secret }),
      endpoint(port, 'g2', { clusterSecret: secret }),
      endpoint(port, 'g3', { clusterSecret: secret }),
      endpoint(port, 'g4', { clusterSecret: secret }), // a majority of the 7 is good
      endpoint(port, 'b1', { ioTimeoutMs: 2000 }), // no secret
      endpoint(port, 'b2', { clusterSecret: randomBytes(32), ioTimeoutMs: 2000 }), // a wrong one
      endpoint(plain!.server.port, 'vol', { clusterSecret: secret, ioTimeoutMs: 2000 }), // a server without one
    ]);
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW', 'RW', 'ERR', 'ERR', 'ERR']);
    await engine.write(0, pattern(1, 4096));
    expect((await engine.read(0, 4096)).equals(pattern(1, 4096))).toBe(true);
    // b1 was refused by the server; b2's client gave up first: the server's proof did not
    // check out with the wrong secret, so it never sent a proof of its own.
    expect(f.hosts[0]!.server.stats().authFailures).toBe(1);
    expect(plain!.server.stats().authFailures).toBe(1);
    f.hosts.push(plain!);
  });

  it('an engine refuses an impostor that cannot prove the secret: it never sends it HELLO or a write', async () => {
    f.hosts = await startHosts(s, 2, SIZE, 'vol', undefined, secret);
    const ops: number[] = [];
    const sockets = new Set<Socket>();
    const impostor = createServer((sock) => {
      sockets.add(sock);
      const split = new FrameSplitter(REQ_HEADER, 40);
      sock.on('error', () => {});
      sock.on('data', (d: Buffer) => {
        for (const f of split.push(d)) {
          const op = f.readUInt8(5);
          ops.push(op);
          if (op !== Op.AUTH) continue;
          // An OK reply with a nonce and a made-up proof.
          const h = Buffer.alloc(40);
          h.writeUInt32LE(0x3150524d, 0);
          h.writeBigUInt64LE(f.readBigUInt64LE(8), 8);
          h.writeUInt32LE(64, 20);
          sock.write(Buffer.concat([h, randomBytes(64)]));
        }
      });
    });
    await new Promise<void>((res) => impostor.listen(0, '127.0.0.1', res));
    try {
      const port = (impostor.address() as { port: number }).port;
      const engine = await f.open([
        endpoint(f.hosts[0]!.server.port, 'vol', { clusterSecret: secret }),
        endpoint(f.hosts[1]!.server.port, 'vol', { clusterSecret: secret }),
        endpoint(port, 'vol', { clusterSecret: secret, ioTimeoutMs: 2000 }),
      ]);
      expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
      await engine.write(0, pattern(2, 4096));
      expect(ops.length).toBeGreaterThan(0);
      expect(ops.every((op) => op === Op.AUTH)).toBe(true);
    } finally {
      for (const so of sockets) so.destroy();
      await new Promise<void>((res) => impostor.close(() => res()));
    }
  });

  it('refuses a secret out of bounds with a coded error', async () => {
    const root = s.dir('bad-secret');
    expect(await codeOf(addon().startReplicaServer({ root, clusterSecret: randomBytes(8) }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().startReplicaServer({ root, clusterSecret: randomBytes(2048) }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().startReplicaServer({ root, clusterSecret: 'not bytes' as unknown as Uint8Array }))).toBe('INVALID_ARGUMENT');
  });

  it('measures what the handshake costs (printed)', async () => {
    f.hosts = await startHosts(s, 1, SIZE, 'vol', undefined, secret);
    const [plain] = await startHosts(s, 1, SIZE, 'vol');
    f.hosts.push(plain!);
    const rounds = 200;
    const time = async (port: number, auth: boolean): Promise<number> => {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < rounds; i++) {
        const c = await RawClient.connect(port);
        if (auth) expect((await rawAuthenticate(c, secret)).reply?.code).toBe(CodeNum.OK);
        c.send({ op: Op.HELLO, seq: 1, payload: Buffer.from('vol') });
        expect((await c.reply(1))?.code).toBe(CodeNum.OK);
        c.close();
      }
      return Number(process.hrtime.bigint() - t0) / 1e6 / rounds;
    };
    const plainMs = await time(plain!.server.port, false);
    const authMs = await time(f.hosts[0]!.server.port, true);
    console.log(`replica handshake (connect, HELLO) over ${rounds} connections: ${plainMs.toFixed(3)} ms plain, ${authMs.toFixed(3)} ms with AUTH/AUTH_PROOF (+${(authMs - plainMs).toFixed(3)} ms)`);
  });
});
