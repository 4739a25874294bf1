// NBD reads and writes to an engine over remote replicas are answered by the replicas'
// answers (BlockDevice::ReadAsync / WriteAsync, docs/architecture.md "Reads and writes
// without a waiting thread"): the worker that starts one does not wait for it, so an export
// with 2 I/O threads keeps many in flight. A write is still never answered before every RW
// replica has it, or before a replica that failed it is durably out of the replica set; a
// read that fails on one replica is answered from another. A structured READ asks the
// replicas nothing but the READ (no BLOCK_STATUS round trip first).
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { NativeEngine, NativeNbdServer } from '../../src/native/binding.js';
import { NbdClient } from '../system/helpers/nbd-client.js';
import { addon, engineOptions, MiB, pattern, replicaImage, Scratch, waitFor } from './helpers.js';
import { closeAll, endpoint, FrameProxy, type Host, Op, startHosts } from './remote-helpers.js';

const SIZE = 8 * MiB;
const N = 48;

describe('the NBD path over remote replicas', () => {
  let s: Scratch;
  let hosts: Host[] = [];
  let proxies: FrameProxy[] = [];
  let engine: NativeEngine | undefined;
  let nbd: NativeNbdServer | undefined;
  let client: NbdClient | undefined;
  beforeAll(() => {
    s = new Scratch('mooring-async-write-');
  });
  afterEach(async () => {
    client?.destroy();
    await nbd?.close().catch(() => undefined);
    await engine?.close().catch(() => undefined);
    for (const p of proxies) await p.close();
    await closeAll(hosts);
    client = undefined;
    nbd = undefined;
    engine = undefined;
    proxies = [];
    hosts = [];
  });
  afterAll(() => s.cleanup());

  // Three hosts, each behind a proxy; an engine over them exported with 2 I/O threads.
  async function setup(ioTimeoutMs = 60_000): Promise<NbdClient> {
    hosts = await startHosts(s, 3, SIZE);
    proxies = hosts.map((h) => new FrameProxy(h.server.port));
    const ports = await Promise.all(proxies.map((p) => p.start()));
    engine = await addon().openEngine(engineOptions({ replicas: ports.map((p) => endpoint(p, 'vol', { ioTimeoutMs })) }));
    const sock = s.path(`nbd-${Math.random().toString(36).slice(2, 8)}.sock`);
    nbd = await engine.exportNbd({ unixPath: sock, ioThreads: 2 });
    client = await NbdClient.connect({ socketPath: sock });
    return client;
  }

  // Closes the client, the export, the engine and the hosts, then reads each host's replica
  // image as it is on disk.
  async function closeAndReadReplicas(): Promise<Buffer[]> {
    client!.destroy();
    client = undefined;
    await nbd!.close();
    nbd = undefined;
    await engine!.close();
    engine = undefined;
    await closeAll(hosts);
    const images: Buffer[] = [];
    for (const h of hosts) {
      const r = await addon().openReplica(join(h.root, 'vol'));
      try {
        images.push(await replicaImage(r));
      } finally {
        await r.close();
      }
    }
    hosts = [];
    return images;
  }

  it('keeps far more writes in flight than it has I/O threads, and answers each once every replica has it', async () => {
    const c = await setup();
    for (const p of proxies) p.mode = 'hold';
    let answered = 0;
    const writes = Array.from({ length: N }, (_, i) => c.write(i * 4096, pattern(500 + i, 4096)).then(() => answered++));
    // A worker that waited for its write would leave at most 2 in flight per replica.
    await waitFor(`${N} writes in flight on every replica`, () => proxies.every((p) => p.outstanding >= N));
    expect(answered, 'no write is answered while a replica has not answered it').toBe(0);
    // Two replicas answer; the third still holds every write back.
    proxies[0]!.release();
    proxies[1]!.release();
    await waitFor('the first two replicas answered', () => proxies[0]!.outstanding === 0 && proxies[1]!.outstanding === 0);
    expect(answered, 'a write waits for its last replica').toBe(0);
    proxies[2]!.release();
    await Promise.all(writes);
    for (let i = 0; i < N; i++) expect((await c.read(i * 4096, 4096)).equals(pattern(500 + i, 4096))).toBe(true);
    expect(engine!.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    // Every replica holds every write.
    const images = await closeAndReadReplicas();
    images.forEach((img, h) => {
      for (let i = 0; i < N; i++) expect(img.subarray(i * 4096, (i + 1) * 4096).equals(pattern(500 + i, 4096)), `replica ${h} block ${i}`).toBe(true);
    });
  });

  it('writes and reads parsed together start together, overlapping writes one after the other, and every replica agrees', async () => {
    const c = await setup();
    const io = (): number => nbd!.ioStats!().groupedRequests;
    const before = io();
    // 24 writes in one send (about 99 KB): the connection loop parses them in one turn or
    // a few. Blocks 3 and 7 are written twice in the same batch: the second of each pair
    // overlaps a write of its own group that is not sent yet, and must wait for it (a
    // group that waited there would never finish: its own writes are answered only after it).
    const order = [...Array.from({ length: 22 }, (_, i) => i), 3, 7];
    for (let round = 0; round < 5; round++) {
      c.socket.cork();
      const writes = order.map((b, k) => c.write(b * 4096, pattern(round * 100 + k, 4096)));
      c.socket.uncork();
      await Promise.all(writes);
    }
    expect(io() - before, 'writes started in groups').toBeGreaterThan(0);
    const last = (k: number): Buffer => pattern(4 * 100 + k, 4096);
    const afterWrites = io();
    c.socket.cork();
    const reads = Array.from({ length: 22 }, (_, b) => c.read(b * 4096, 4096));
    c.socket.uncork();
    const back = await Promise.all(reads);
    expect(io() - afterWrites, 'reads started in groups').toBeGreaterThan(0);
    for (let b = 0; b < 22; b++) {
      const got = back[b]!;
      if (b === 3 || b === 7) {
        // Either of the round's two writes (NBD leaves the outcome of overlapping writes in
        // flight open), the same on every replica (checked below).
        const k2 = order.lastIndexOf(b);
        expect(got.equals(last(b)) || got.equals(last(k2)), `block ${b}`).toBe(true);
      } else {
        expect(got.equals(last(b)), `block ${b}`).toBe(true);
      }
    }
    expect(engine!.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    const images = (await closeAndReadReplicas()).map((img) => img.subarray(0, 22 * 4096));
    expect(images[1]!.equals(images[0]!), 'replica 2 = replica 1').toBe(true);
    expect(images[2]!.equals(images[0]!), 'replica 3 = replica 1').toBe(true);
  });

  it('a write larger than one replica frame goes to every replica in frames cut from one copy, byte for byte', async () => {
    const c = await setup();
    const writesBefore = proxies.map((p) => p.ops.get(Op.WRITE) ?? 0);
    // 4 MiB + 4 KiB, two frames (a frame carries at most 4 MiB); the rest of the volume, one.
    const big = pattern(41, 4 * MiB + 4096);
    const rest = pattern(42, SIZE - big.length);
    await Promise.all([c.write(0, big), c.write(big.length, rest)]);
    expect(proxies.map((p, i) => (p.ops.get(Op.WRITE) ?? 0) - writesBefore[i]!)).toEqual([3, 3, 3]);
    const want = Buffer.concat([big, rest]);
    const images = await closeAndReadReplicas();
    images.forEach((img, h) => expect(img.subarray(0, SIZE).equals(want), `replica ${h}`).toBe(true));
  });

  it('a replica lost under writes in flight is out of the stored replica set before any of them is answered', async () => {
    const c = await setup();
    proxies[2]!.mode = 'hold';
    const setsBefore = proxies[0]!.ops.get(Op.SET_REPLICA_SET) ?? 0;
    const setsAtAnswer: number[] = [];
    const writes = Array.from({ length: 16 }, (_, i) =>
      c.write(i * 4096, pattern(900 + i, 4096)).then(() => setsAtAnswer.push(proxies[0]!.ops.get(Op.SET_REPLICA_SET) ?? 0)),
    );
    await waitFor('16 writes held by the third replica', () => proxies[2]!.outstanding >= 16);
    expect(setsAtAnswer).toEqual([]);
    await proxies[2]!.close(); // its connection drops with every write unanswered
    await Promise.all(writes); // answered: two RW replicas have each
    expect(setsAtAnswer.length).toBe(16);
    // The engine stored the set without the lost replica first (a commit goes to the
    // survivors), so no later engine can take the lost one for a full copy.
    for (const n of setsAtAnswer) expect(n).toBeGreaterThan(setsBefore);
    expect(engine!.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
    for (let i = 0; i < 16; i++) expect((await c.read(i * 4096, 4096)).equals(pattern(900 + i, 4096))).toBe(true);
  });

  it('keeps far more reads in flight than it has I/O threads, each one READ frame, holes and data right', async () => {
    const c = await setup();
    // Data in the even blocks, holes in the odd ones.
    for (let i = 0; i < N; i += 2) await c.write(i * 4096, pattern(700 + i, 4096));
    expect(c.structured).toBe(true);
    const statusBefore = proxies.map((p) => p.ops.get(Op.BLOCK_STATUS) ?? 0);
    const readsBefore = proxies.reduce((n, p) => n + (p.ops.get(Op.READ) ?? 0), 0);
    for (const p of proxies) p.mode = 'hold';
    const reads = Array.from({ length: N }, (_, i) => c.read(i * 4096, 4096));
    const inFlight = (): number => proxies.reduce((n, p) => n + p.outstanding, 0);
    await waitFor(`${N} reads in flight`, () => inFlight() >= N);
    for (const p of proxies) p.release();
    const got = await Promise.all(reads);
    for (let i = 0; i < N; i++) {
      const want = i % 2 === 0 ? pattern(700 + i, 4096) : Buffer.alloc(4096);
      expect(got[i]!.equals(want), `block ${i}`).toBe(true);
    }
    expect(proxies.reduce((n, p) => n + (p.ops.get(Op.READ) ?? 0), 0) - readsBefore).toBe(N);
    expect(proxies.map((p) => p.ops.get(Op.BLOCK_STATUS) ?? 0)).toEqual(statusBefore);
  });

  it('replies a client does not take yet wait for it: a full socket mid-batch, every reply sent once it reads again', async () => {
    const c = await setup();
    const blocks = 48;
    const len = 64 * 1024; // 3 MiB of replies: far more than a unix socket holds
    for (let i = 0; i < blocks; i++) await c.write(i * len, pattern(40 + i, len));
    const readsBefore = proxies.reduce((n, p) => n + (p.ops.get(Op.READ) ?? 0), 0);
    c.socket.pause(); // stops reading replies; requests still go out
    const reads = Array.from({ length: blocks }, (_, i) => c.read(i * len, len));
    // Every replica answered: the replies are with the NBD server, most of them unsent.
    await waitFor('every READ answered by the replicas', () =>
      proxies.reduce((n, p) => n + (p.ops.get(Op.READ) ?? 0), 0) - readsBefore === blocks && proxies.every((p) => p.outstanding === 0),
    );
    c.socket.resume();
    let timer: NodeJS.Timeout | undefined;
    const stuck = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error('replies still unsent 20 s after the client read again')), 20_000);
    });
    const got = await Promise.race([Promise.all(reads), stuck]).finally(() => clearTimeout(timer));
    for (let i = 0; i < blocks; i++) expect(got[i]!.equals(pattern(40 + i, len)), `block ${i}`).toBe(true);
  });

  it('a read whose replica is lost is answered from another, after the lost one is out of the stored set', async () => {
    const c = await setup();
    for (let i = 0; i < 16; i++) await c.write(i * 4096, pattern(300 + i, 4096));
    proxies[1]!.mode = 'hold';
    const setsBefore = proxies[0]!.ops.get(Op.SET_REPLICA_SET) ?? 0;
    // Round robin: about a third of these go to the held replica.
    let closed = false;
    let answered = 0;
    const setsAtLateAnswer: number[] = [];
    const reads = Array.from({ length: 16 }, (_, i) =>
      c.read(i * 4096, 4096).then((b) => {
        answered++;
        if (closed) setsAtLateAnswer.push(proxies[0]!.ops.get(Op.SET_REPLICA_SET) ?? 0);
        return b;
      }),
    );
    // Every read answered but those the held replica has.
    await waitFor('reads held by the second replica, the others answered', () => proxies[1]!.outstanding >= 3 && answered + proxies[1]!.outstanding === 16);
    const held = proxies[1]!.outstanding;
    closed = true;
    await proxies[1]!.close();
    const got = await Promise.all(reads);
    for (let i = 0; i < 16; i++) expect(got[i]!.equals(pattern(300 + i, 4096)), `block ${i}`).toBe(true);
    expect(engine!.replicas().map((r) => r.mode)).toEqual(['RW', 'ERR', 'RW']);
    // Those the lost replica held were answered from another, once the set without it was stored.
    expect(setsAtLateAnswer.length).toBe(held);
    for (const n of setsAtLateAnswer) expect(n).toBeGreaterThan(setsBefore);
  });
});
