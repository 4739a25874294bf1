// Remote replicas failing under an engine, through the real addon: a replica server closed
// in the middle of I/O, a peer that stops answering (during I/O, and while idle, found by
// the keepalive), and replicas that cannot be reached when the engine starts. In every case
// the engine marks that replica ERR and keeps serving from the others, with no error to
// its caller, and the surviving replicas stay identical.
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { NativeEngine, NativeRemoteReplica, NativeReplica } from '../../src/native/binding.js';
import { addon, codeOf, MiB, nextEpoch, pattern, replicaImage, Scratch, waitFor, engineOptions } from './helpers.js';
import { closeAll, collectEvents, deadPort, endpoint, FrameProxy, type Host, silentServer, startHosts } from './remote-helpers.js';

const SIZE = 8 * MiB;
const ENOTCONN = 107;
const ETIMEDOUT = 110;

describe('remote replica faults', () => {
  let s: Scratch;
  let hosts: Host[] = [];
  const cleanups: Array<() => Promise<void>> = [];
  beforeAll(() => {
    s = new Scratch('mooring-remote-faults-');
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

  it('marks a replica ERR when its server closes mid-I/O and keeps serving from the others', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const ev = collectEvents();
    const engine = await open(hosts.map((h) => endpoint(h.server.port)), ev.onEvents);
    const model = Buffer.alloc(SIZE);
    let stop = false;
    let rounds = 0;
    // Several writers, so requests are in flight on the connection when it goes.
    const writers = Array.from({ length: 4 }, async (_, w) => {
      for (let k = 0; !stop; k++) {
        const off = ((k * 4 + w) % 512) * 4096;
        const data = pattern(w * 100_000 + k, 4096);
        await engine.write(off, data);
        data.copy(model, off);
        rounds++;
      }
    });
    await waitFor('writes flowing', () => rounds > 50);
    const victim = hosts[1]!;
    await victim.server.close();
    const id = `127.0.0.1:${victim.server.port}/vol`;
    await waitFor('replica ERR', () => engine.replicas().find((r) => r.id === id)!.mode === 'ERR');
    const at = rounds;
    await waitFor('writes continue', () => rounds > at + 50);
    stop = true;
    await Promise.all(writers); // no write failed
    const st = engine.replicas().find((r) => r.id === id)!;
    expect([-ENOTCONN, -104]).toContain(st.lastError);
    expect(ev.events.some((e) => e.type === 'replica-error' && e.replicaId === id)).toBe(true);
    expect((await engine.read(0, 512 * 4096)).equals(model.subarray(0, 512 * 4096))).toBe(true);
    await engine.close();
    cleanups.length = 0;
    await closeAll(hosts);
    await expectIdentical([hosts[0]!.root, hosts[2]!.root], model);
  });

  it('a replica dropped from rw keeps its last RW set while it stores the later sets, over the wire', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const members = ['m0', 'm1', 'm2'];
    const e1 = nextEpoch();
    const first = await addon().openEngine({ replicas: hosts.map((h) => endpoint(h.server.port)), members, epoch: e1 });
    cleanups.push(() => first.close());
    await first.write(0, pattern(1, 4096));
    await hosts[1]!.server.close(); // m1 goes away; the next write drops it: set e1/2 without it
    await first.write(4096, pattern(2, 4096));
    await waitFor('m1 ERR', () => first.replicas()[1]!.mode === 'ERR');
    await first.close();
    cleanups.length = 0;
    // m1 comes back; the next engine finds it outside rw, opens it ERR, and stores its first
    // set on every member, m1 included.
    hosts[1]!.server = await addon().startReplicaServer({ root: hosts[1]!.root });
    const e2 = nextEpoch();
    const second = await addon().openEngine({ replicas: hosts.map((h) => endpoint(h.server.port)), members, epoch: e2 });
    cleanups.push(() => second.close());
    expect(second.replicas().map((r) => r.mode)).toEqual(['RW', 'ERR', 'RW']);
    await second.close();
    cleanups.length = 0;
    await closeAll(hosts);
    const seen: unknown[] = [];
    for (const h of hosts) {
      const r = await addon().openReplica(join(h.root, 'vol'));
      try {
        seen.push({ lastRw: await r.lastRw(), stored: await r.claimEpoch(e2 + 1000) });
      } finally {
        await r.close();
      }
    }
    const stored = { epoch: e2, generation: 1, members, rw: ['m0', 'm2'] };
    expect(seen).toEqual([
      { lastRw: { epoch: e2, generation: 1 }, stored },
      { lastRw: { epoch: e1, generation: 1 }, stored }, // RW last in the first engine's first set
      { lastRw: { epoch: e2, generation: 1 }, stored },
    ]);
  });

  // Three hosts, the third reached through a FrameProxy with a 1 s I/O timeout; one block written.
  async function thirdThroughProxy() {
    hosts = await startHosts(s, 3, SIZE);
    const proxy = new FrameProxy(hosts[2]!.server.port);
    const port = await proxy.start();
    cleanups.push(() => proxy.close());
    const engine = await open([endpoint(hosts[0]!.server.port), endpoint(hosts[1]!.server.port), endpoint(port, 'vol', { ioTimeoutMs: 1000 })]);
    await engine.write(0, pattern(1, 4096));
    return { proxy, engine };
  }

  it('fails a replica whose server stops answering within the I/O timeout, without failing the write', async () => {
    const { proxy, engine } = await thirdThroughProxy();
    proxy.mode = 'blackhole';
    await engine.write(4096, pattern(2, 8192)); // answered by the two others once the third times out
    const st = engine.replicas()[2]!;
    expect(st.mode).toBe('ERR');
    expect(st.lastError).toBe(-ETIMEDOUT);
    expect(engine.replicas().slice(0, 2).map((r) => r.mode)).toEqual(['RW', 'RW']);
    expect((await engine.read(0, 12288)).equals(Buffer.concat([pattern(1, 4096), pattern(2, 8192)]))).toBe(true);
  });

  it('fails a replica whose peer stops reading (its socket full) within the I/O timeout, whichever thread was writing', async () => {
    const { proxy, engine } = await thirdThroughProxy();
    proxy.mode = 'stall';
    // Megabytes of writes fill the socket; the JS thread asks for replica state meanwhile
    // (an allocated-bytes refresh the connection's reader sends when idle).
    const polling = setInterval(() => engine.replicas(), 5);
    try {
      const chunk = 1024 * 1024;
      await Promise.all(Array.from({ length: SIZE / chunk }, (_, i) => engine.write(i * chunk, pattern(10 + i, chunk))));
    } finally {
      clearInterval(polling);
    }
    const st = engine.replicas()[2]!;
    expect(st.mode).toBe('ERR');
    expect(st.lastError).toBe(-ETIMEDOUT);
    expect(engine.replicas().slice(0, 2).map((r) => r.mode)).toEqual(['RW', 'RW']);
    expect((await engine.read(SIZE - 4096, 4096)).equals(pattern(10 + SIZE / (1024 * 1024) - 1, 1024 * 1024).subarray(1024 * 1024 - 4096))).toBe(true);
  });

  it('finds a silent peer by keepalive while idle and drops it at once, without any I/O', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const proxy = new FrameProxy(hosts[1]!.server.port);
    const port = await proxy.start();
    cleanups.push(() => proxy.close());
    const ev = collectEvents();
    const engine = await open(
      [endpoint(hosts[0]!.server.port), endpoint(port, 'vol', { ioTimeoutMs: 500 }), endpoint(hosts[2]!.server.port)],
      ev.onEvents,
    );
    await engine.write(0, pattern(1, 4096));
    let closedByClient = false;
    proxy.onClientClose = () => {
      closedByClient = true;
    };
    proxy.mode = 'blackhole';
    // No I/O from here: only the client's ping can notice that the peer went silent.
    await waitFor('the client drops the silent connection', () => closedByClient, 15_000);
    // The engine learns it from the replica itself (its failure listener), not at a write.
    await waitFor('the engine marks the silent replica ERR', () => engine.replicas()[1]!.mode === 'ERR', 5_000);
    expect(engine.replicas()[1]!.lastError).toBe(-ETIMEDOUT);
    expect(engine.replicas()[0]!.mode).toBe('RW');
    const epochBefore = engine.epoch();
    // The next write is answered after the replica set without the dropped replica was
    // committed (to the two others, a majority); the epoch stays the engine's own.
    await engine.write(4096, pattern(2, 4096));
    expect(engine.epoch()).toBe(epochBefore);
    expect(engine.replicas()[1]!.mode).toBe('ERR');
    await waitFor('the replica set without it is reported', () =>
      ev.events.some((e) => e.type === 'replica-set-changed' && (e as { rwMembers?: string[] }).rwMembers?.length === 2),
    );
  });

  it('an engine cut off from a majority of its replicas holds the write, then fails it with NO_QUORUM, never acknowledging it', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const proxies = [new FrameProxy(hosts[1]!.server.port), new FrameProxy(hosts[2]!.server.port)];
    const ports = await Promise.all(proxies.map((p) => p.start()));
    for (const p of proxies) cleanups.push(() => p.close());
    const HOLD_MS = 1500;
    const engine = await addon().openEngine(
      engineOptions({ replicas: [endpoint(hosts[0]!.server.port), ...ports.map((p) => endpoint(p, 'vol', { ioTimeoutMs: 500 }))], quorumHoldMs: HOLD_MS }),
    );
    cleanups.push(() => engine.close());
    await engine.write(0, pattern(1, 4096));
    await engine.flush();
    for (const p of proxies) p.mode = 'blackhole';
    const t0 = Date.now();
    // The two silent replicas time out and are dropped; the replica set without them
    // cannot reach a majority, so the write is held (at least the hold) and then fails.
    expect(await codeOf(engine.write(4096, pattern(2, 4096)))).toBe('NO_QUORUM');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(HOLD_MS);
    expect(await codeOf(engine.flush())).toBe('NO_QUORUM');
    expect(await codeOf(engine.write(8192, pattern(3, 4096)))).toBe('NO_QUORUM');
    await engine.close().catch(() => undefined);
    for (const p of proxies) await p.close();
    // The replica set on disk still names all three as RW: the next engine, on any majority,
    // reconciles them (the first may hold the unacknowledged writes; nothing acked is lost).
    let r: NativeReplica | undefined;
    await waitFor('the server lets go of the replica', async () => {
      r = await addon().openReplica(join(hosts[1]!.root, 'vol')).catch(() => undefined);
      return r !== undefined;
    }, 40_000);
    try {
      expect((await r!.read(0, 4096)).equals(pattern(1, 4096))).toBe(true);
      const set = await r!.claimEpoch(nextEpoch());
      expect(set?.rw.length).toBe(3);
    } finally {
      await r!.close();
    }
  });

  it('opens replicas that cannot be reached at start as ERR (refused, silent, unknown name)', async () => {
    // Four that answer, so the engine claims a majority of its seven replicas and opens.
    hosts = await startHosts(s, 4, SIZE);
    const silent = await silentServer();
    cleanups.push(() => silent.close());
    const refused = await deadPort();
    const eps = [
      ...hosts.map((h) => endpoint(h.server.port)),
      endpoint(refused, 'vol', { ioTimeoutMs: 500 }),
      endpoint(silent.port, 'vol', { ioTimeoutMs: 500 }),
      endpoint(hosts[0]!.server.port, 'no-such-replica'),
    ];
    const ev = collectEvents();
    const engine = await open(eps, ev.onEvents);
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW', 'RW', 'ERR', 'ERR', 'ERR']);
    expect(engine.sizeBytes).toBe(SIZE);
    await engine.write(0, pattern(9, 4096));
    expect((await engine.read(0, 4096)).equals(pattern(9, 4096))).toBe(true);
    for (const id of engine.replicas().slice(4).map((r) => r.id))
      expect(ev.events.some((e) => e.type === 'replica-error' && e.replicaId === id), id).toBe(true);
  });
});
