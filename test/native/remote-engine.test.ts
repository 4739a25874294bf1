// An engine over three remote replicas, each behind its own replica server (three "hosts"
// in this process), through the real addon: the data path and snapshots over the replica
// protocol leave all replicas identical to what was written; requests are pipelined up to
// the client's depth and no further; the server runs a pipelined burst concurrently and
// answers every request by seq; and writer epochs are enforced at the server, across
// connections, whatever the order requests arrive in (invariant 2).
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { NativeEngine } from '../../src/native/binding.js';
import { addon, codeOf, MiB, nextEpoch, pattern, replicaImage, Scratch, waitFor, engineOptions } from './helpers.js';
import { NbdClient } from '../system/helpers/nbd-client.js';
import { closeAll, CodeNum, collectEvents, endpoint, FrameProxy, type Host, Op, RawClient, startHosts } from './remote-helpers.js';

const SIZE = 16 * MiB;

describe('engine over remote replicas', () => {
  let s: Scratch;
  let hosts: Host[] = [];
  const cleanups: Array<() => Promise<void>> = [];
  beforeAll(() => {
    s = new Scratch('mooring-remote-engine-');
  });
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
    await closeAll(hosts);
    hosts = [];
  });
  afterAll(() => s.cleanup());

  async function openEngine(ports: number[], ioTimeoutMs?: number): Promise<NativeEngine> {
    const e = await addon().openEngine(engineOptions({ replicas: ports.map((p) => endpoint(p, 'vol', ioTimeoutMs ? { ioTimeoutMs } : {})) }));
    cleanups.push(() => e.close());
    return e;
  }

  it('writes, reads, zeroes, trims, snapshots and reverts over the wire; all replicas end identical', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const engine = await openEngine(hosts.map((h) => h.server.port));
    expect(engine.sizeBytes).toBe(SIZE);
    expect(engine.replicas().map((r) => [r.id, r.mode])).toEqual(hosts.map((h) => [`127.0.0.1:${h.server.port}/vol`, 'RW']));

    const model = Buffer.alloc(SIZE);
    const put = async (off: number, data: Buffer): Promise<void> => {
      await engine.write(off, data);
      data.copy(model, off);
    };
    await put(0, pattern(1, 4096));
    await put(4096 * 3 + 100, pattern(2, 777)); // unaligned, inside a block
    await put(1 * MiB - 5, pattern(3, 10)); // across a block edge
    await put(2 * MiB + 512, pattern(4, 9 * MiB + 3)); // larger than one frame: split by the client
    expect((await engine.read(0, SIZE / 2)).equals(model.subarray(0, SIZE / 2))).toBe(true);
    expect((await engine.read(2 * MiB, 10 * MiB)).equals(model.subarray(2 * MiB, 12 * MiB))).toBe(true);

    await engine.writeZeroes(3 * MiB, 64 * 1024);
    model.fill(0, 3 * MiB, 3 * MiB + 64 * 1024);
    await engine.trim(4 * MiB, 1 * MiB);
    model.fill(0, 4 * MiB, 5 * MiB);
    await engine.flush();
    const extents = await engine.blockStatus(0, SIZE);
    expect(extents.reduce((a, e) => a + e.length, 0)).toBeLessThanOrEqual(SIZE);
    expect(extents.length).toBeGreaterThan(1);

    await engine.snapshot('s1', { why: 'test' }, true);
    // Over the wire the first replica lists everything and the engine picks (no protocol op).
    expect((await engine.listSnapshots('s1')).map((l) => [l.name, l.labels])).toEqual([['s1', { why: 'test' }]]);
    const before = Buffer.from(model);
    await put(0, pattern(5, 8192));
    const layers = await engine.listSnapshots();
    expect(layers.map((l) => [l.name, l.head])).toEqual([
      ['s1', false],
      ['', true],
    ]);
    expect(layers[0]!.labels).toEqual({ why: 'test' });
    expect((await engine.read(0, 8192)).equals(model.subarray(0, 8192))).toBe(true);
    await engine.revert('s1');
    before.copy(model);
    expect((await engine.read(0, SIZE)).equals(model)).toBe(true);
    await put(5 * MiB, pattern(6, 3 * 4096));

    const epoch = engine.epoch();
    expect(engine.replicas().every((r) => r.mode === 'RW' && r.epoch === epoch)).toBe(true);
    await engine.close();
    cleanups.length = 0;
    await closeAll(hosts);

    // Each replica, opened directly on its "host": same bytes as the model, marked clean.
    for (const h of hosts) {
      const r = await addon().openReplica(join(h.root, 'vol'));
      try {
        expect(r.clean()).toBe(true);
        expect(r.epoch()).toBe(epoch);
        const img = await replicaImage(r);
        const at = img.findIndex((b, i) => b !== model[i]);
        expect(at, `replica on ${h.root} differs at ${at}`).toBe(-1);
      } finally {
        await r.close();
      }
    }
  });

  it('skips the reconcile at open when the servers say every replica was clean before the claim', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const ports = hosts.map((h) => h.server.port);
    const open = async (): Promise<{ engine: NativeEngine; kinds: () => string[] }> => {
      const ev = collectEvents();
      const engine = await addon().openEngine(engineOptions({ replicas: ports.map((p) => endpoint(p)), onEvents: ev.onEvents }));
      cleanups.push(() => engine.close());
      await waitFor('the open events', () => ev.events.some((e) => e.type === 'epoch-claimed'));
      return { engine, kinds: () => ev.events.map((e) => e.type) };
    };
    const first = await open();
    await first.engine.write(0, pattern(90, 65536));
    await first.engine.close();
    // Closed cleanly: the CLAIM_EPOCH replies carry "was clean" (kStateWasClean).
    const second = await open();
    expect(second.kinds()).not.toContain('reconciled');
    await second.engine.write(65536, pattern(91, 4096));
    await second.engine.close();
    // A writer claims r0 and goes away without closing: the first claim's reply says the
    // replica was clean (state bit 4), a second one's does not, and the next engine reconciles.
    const claimer = await RawClient.open(ports[0]!, 'vol');
    cleanups.push(async () => claimer.close());
    claimer.send({ op: Op.CLAIM_EPOCH, seq: 1, epoch: nextEpoch() });
    const firstClaim = await claimer.reply(1);
    expect(firstClaim?.code).toBe(CodeNum.OK);
    expect(firstClaim!.state & 4).toBe(4);
    claimer.send({ op: Op.CLAIM_EPOCH, seq: 2, epoch: nextEpoch() });
    const secondClaim = await claimer.reply(2);
    expect(secondClaim?.code).toBe(CodeNum.OK);
    expect(secondClaim!.state & 4).toBe(0);
    claimer.close();
    const third = await open();
    expect(third.kinds()).toContain('reconciled');
    await third.engine.close();
  });

  it('keeps up to its depth of requests in flight and no more, and completes them all', async () => {
    hosts = await startHosts(s, 1, SIZE);
    const proxy = new FrameProxy(hosts[0]!.server.port);
    const port = await proxy.start();
    cleanups.push(() => proxy.close());
    const engine = await openEngine([port], 60_000);
    // Enough concurrency above the engine to fill the pipeline: 4 NBD connections, 128
    // NBD workers (each NBD connection keeps at most 64 requests in flight itself).
    const nbd = await engine.exportNbd({ tcpHost: '127.0.0.1', tcpPort: 0, ioThreads: 128 });
    cleanups.push(() => nbd.close());
    const clients = await Promise.all(Array.from({ length: 4 }, () => NbdClient.connect({ host: '127.0.0.1', port: nbd.port })));
    cleanups.push(async () => {
      for (const c of clients) c.destroy();
    });

    proxy.mode = 'hold';
    proxy.maxOutstanding = proxy.outstanding;
    const N = 200;
    const writes = Array.from({ length: N }, (_, i) => clients[i % 4]!.write(i * 4096, pattern(100 + i, 4096)));
    const settled = Promise.allSettled(writes);
    // All replies are held: the client stops at its depth (RemoteReplica::kMaxInflight).
    await waitFor('64 requests in flight', () => proxy.outstanding >= 64);
    await new Promise((r) => setTimeout(r, 300));
    expect(proxy.outstanding).toBe(64);
    proxy.release();
    expect((await settled).filter((r) => r.status === 'rejected')).toEqual([]);
    expect(proxy.maxOutstanding).toBe(64);
    for (let i = 0; i < N; i += 37) expect((await engine.read(i * 4096, 4096)).equals(pattern(100 + i, 4096))).toBe(true);
    expect(engine.replicas()[0]!.mode).toBe('RW');
  });

  it('reads from the replica in its own process when it is RW, round-robin over the remote ones otherwise', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const proxies = hosts.slice(1).map((h) => new FrameProxy(h.server.port));
    const ports = await Promise.all(proxies.map((p) => p.start()));
    for (const p of proxies) cleanups.push(() => p.close());
    const reads = (): number[] => proxies.map((p) => p.ops.get(Op.READ) ?? 0);
    const local = join(hosts[0]!.root, 'vol');
    const mixed = await addon().openEngine(engineOptions({ replicas: [endpoint(ports[0]!), local, endpoint(ports[1]!)] }));
    await mixed.write(0, pattern(7, 64 * 1024));
    for (let i = 0; i < 60; i++) expect((await mixed.read((i % 16) * 4096, 4096)).equals(pattern(7, 64 * 1024).subarray((i % 16) * 4096, (i % 16 + 1) * 4096))).toBe(true);
    expect(reads()).toEqual([0, 0]);
    await mixed.close();
    // Only remote replicas: the reads are spread over them.
    const remote = await openEngine(ports);
    for (let i = 0; i < 60; i++) await remote.read((i % 16) * 4096, 4096);
    expect(reads().every((n) => n >= 20), `READ requests per remote replica: ${reads().join(', ')}`).toBe(true);
  });

  it('large replica payloads reuse the process\'s spare buffers, within its cap, and carry the right bytes', async () => {
    hosts = await startHosts(s, 2, SIZE);
    const engine = await openEngine(hosts.map((h) => h.server.port));
    const data = pattern(11, 4 * MiB);
    await engine.write(0, data);
    const before = hosts[0]!.server.stats();
    // 1 MiB reads: a reply payload on the server and a receive buffer in the engine, per read.
    for (let i = 0; i < 24; i++) {
      const off = (i % 4) * MiB;
      expect((await engine.read(off, MiB)).equals(data.subarray(off, off + MiB))).toBe(true);
    }
    const after = hosts[0]!.server.stats();
    // Both ends of every read after the first few find a spare buffer (the counters are the
    // process's: both "hosts" and the engine live here).
    expect(after.spareBufferHits - before.spareBufferHits, `spare buffer hits over 24 reads of 1 MiB`).toBeGreaterThanOrEqual(24);
    expect(after.spareBufferBytes).toBeGreaterThan(0);
    expect(after.spareBufferBytes).toBeLessThanOrEqual(32 * MiB);
    // A buffer taken back and reused holds whatever it held: a write then a read of other
    // bytes at the same size must not show the old ones.
    const other = pattern(12, MiB);
    await engine.write(MiB, other);
    expect((await engine.read(MiB, MiB)).equals(other)).toBe(true);
    // Idle, the spares are freed (after 1 s unused): the process keeps no memory for them.
    await waitFor('the spare buffers to be freed once idle', () => hosts[0]!.server.stats().spareBufferBytes === 0, 10_000);
  });

  it('runs a pipelined burst concurrently and answers every request by its seq', async () => {
    hosts = await startHosts(s, 1, SIZE);
    const c = await RawClient.open(hosts[0]!.server.port, 'vol');
    cleanups.push(async () => c.close());
    // Epoch 0 is the replica's epoch: writes with it are accepted.
    const N = 100;
    c.send(...Array.from({ length: N }, (_, i) => ({ op: Op.WRITE, seq: 1000 + i, offset: i * 4096, length: 4096, payload: pattern(i, 4096) })));
    c.send(...Array.from({ length: N }, (_, i) => ({ op: Op.READ, seq: 5000 + i, offset: i * 4096, length: 4096 })));
    await c.until(() => c.replies.length === 2 * N);
    const bySeq = new Map(c.replies.map((r) => [Number(r.seq), r]));
    for (let i = 0; i < N; i++) {
      expect(bySeq.get(1000 + i)?.code).toBe(CodeNum.OK);
      const rd = bySeq.get(5000 + i);
      expect(rd?.code).toBe(CodeNum.OK);
      // A read sent after the write to its block sees it only if the write ran first; the
      // server promises no order among requests in flight, so either is valid.
      expect(rd!.payload.equals(pattern(i, 4096)) || rd!.payload.equals(Buffer.alloc(4096))).toBe(true);
    }
    // After all writes were answered, reads see every one.
    c.replies.length = 0;
    c.send(...Array.from({ length: N }, (_, i) => ({ op: Op.READ, seq: 9000 + i, offset: i * 4096, length: 4096 })));
    await c.until(() => c.replies.length === N);
    for (const r of c.replies) expect(r.payload.equals(pattern(Number(r.seq) - 9000, 4096))).toBe(true);
    expect(hosts[0]!.server.stats().requests).toBeGreaterThanOrEqual(3 * N);
  });

  it('refuses every write with an older epoch once a claim from another connection has landed, whatever the arrival order', async () => {
    hosts = await startHosts(s, 1, SIZE);
    const port = hosts[0]!.server.port;
    const writer = await RawClient.open(port, 'vol');
    const claimer = await RawClient.open(port, 'vol');
    cleanups.push(async () => {
      writer.close();
      claimer.close();
    });
    // Establish epoch 5, then write with it.
    claimer.send({ op: Op.CLAIM_EPOCH, seq: 1, epoch: 5 });
    expect((await claimer.reply(1))?.code).toBe(CodeNum.OK);

    const BLOCKS = 600;
    const burst = (from: number, to: number): void =>
      writer.send(...Array.from({ length: to - from }, (_, k) => {
        const i = from + k;
        return { op: Op.WRITE, seq: i + 1, epoch: 5, offset: i * 4096, length: 4096, payload: pattern(7000 + i, 4096) };
      }));
    // Old-epoch writes in flight on one connection while the claim arrives on another.
    burst(0, 200);
    claimer.send({ op: Op.CLAIM_EPOCH, seq: 2, epoch: 6 });
    burst(200, 400);
    const claim = await claimer.reply(2);
    expect(claim?.code).toBe(CodeNum.OK);
    expect(claim?.epoch).toBe(6n);
    // Sent after the claim's reply: every one must be refused.
    burst(400, BLOCKS);
    await writer.until(() => writer.replies.length === BLOCKS);
    const code = new Map(writer.replies.map((r) => [Number(r.seq) - 1, r.code]));
    for (let i = 0; i < BLOCKS; i++) expect([CodeNum.OK, CodeNum.STALE_EPOCH]).toContain(code.get(i));
    for (let i = 400; i < BLOCKS; i++) expect(code.get(i), `write ${i} sent after the claim landed`).toBe(CodeNum.STALE_EPOCH);
    const refused = [...code.values()].filter((c) => c === CodeNum.STALE_EPOCH).length;
    expect(hosts[0]!.server.stats().staleEpochRefusals).toBe(refused);

    // A refused write changed nothing; an accepted one is there.
    const reader = await RawClient.open(port, 'vol');
    cleanups.push(async () => reader.close());
    reader.send(...Array.from({ length: BLOCKS }, (_, i) => ({ op: Op.READ, seq: i + 1, offset: i * 4096, length: 4096 })));
    await reader.until(() => reader.replies.length === BLOCKS);
    for (const r of reader.replies) {
      const i = Number(r.seq) - 1;
      const want = code.get(i) === CodeNum.OK ? pattern(7000 + i, 4096) : Buffer.alloc(4096);
      expect(r.payload.equals(want), `block ${i}`).toBe(true);
    }
  });

  it('fences an engine whose replicas another engine claimed through the same servers', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const ports = hosts.map((h) => h.server.port);
    const first = await openEngine(ports);
    await first.write(0, pattern(1, 4096));
    const second = await openEngine(ports);
    expect(second.epoch()).toBeGreaterThan(first.epoch());
    expect(await codeOf(first.write(4096, pattern(2, 4096)))).toBe('STALE_EPOCH');
    await second.write(8192, pattern(3, 4096));
    expect((await second.read(0, 4096)).equals(pattern(1, 4096))).toBe(true);
    expect((await second.read(4096, 4096)).equals(Buffer.alloc(4096))).toBe(true);
    expect(second.replicas().every((r) => r.mode === 'RW')).toBe(true);
  });

  it('an engine cut off and fenced changes no replica, not even the local one the new engine could not reach', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const ports = hosts.map((h) => h.server.port);
    const local = join(hosts[0]!.root, 'vol');
    // The old engine: its own host's replica opened locally, the other two over the wire.
    const old = await addon().openEngine(engineOptions({ replicas: [local, endpoint(ports[1]!), endpoint(ports[2]!)] }));
    cleanups.push(() => old.close());
    await old.write(0, pattern(1, 4096));
    await old.flush();
    // A partition: a new engine reaches only the two remote replicas and claims them.
    const fresh = await openEngine([ports[1]!, ports[2]!]);
    expect(fresh.epoch()).toBeGreaterThan(old.epoch());
    // The old engine writes: the remote replicas refuse its epoch, so it must not have
    // written its local replica either (that replica still has the old epoch).
    expect(await codeOf(old.write(0, pattern(9, 4096)))).toBe('STALE_EPOCH');
    expect(await codeOf(old.write(8192, pattern(9, 4096)))).toBe('STALE_EPOCH');
    await old.close().catch(() => undefined);
    const r = await addon().openReplica(local);
    try {
      expect((await r.read(0, 4096)).equals(pattern(1, 4096)), 'the fenced engine changed its local replica').toBe(true);
      expect((await r.read(8192, 4096)).equals(Buffer.alloc(4096))).toBe(true);
    } finally {
      await r.close();
    }
    expect((await fresh.read(0, 4096)).equals(pattern(1, 4096))).toBe(true);
  });
});
