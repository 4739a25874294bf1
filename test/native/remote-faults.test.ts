// Remote replicas failing under an engine, through the real addon: a replica server closed
// in the middle of I/O, a peer that stops answering (during I/O, and while idle, found by
// the keepalive), and replicas that cannot be reached when the engine starts. In every case
// the engine marks that replica ERR and keeps serving from the others, with no error to
// its caller, and the surviving replicas stay identical.
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { NativeEngine, NativeRemoteReplica } from '../../src/native/binding.js';
import { addon, MiB, pattern, replicaImage, Scratch, waitFor, engineOptions } from './helpers.js';
import { closeAll, collectEvents, endpoint, FrameProxy, type Host, silentServer, startHosts } from './remote-helpers.js';

const SIZE = 8 * MiB;
const ENOTCONN = 107;
const ETIMEDOUT = 110;

/** A port nothing listens on (bound, read, closed). */
async function deadPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

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

  it('fails a replica whose server stops answering within the I/O timeout, without failing the write', async () => {
    hosts = await startHosts(s, 3, SIZE);
    const proxy = new FrameProxy(hosts[2]!.server.port);
    const port = await proxy.start();
    cleanups.push(() => proxy.close());
    const eps = [endpoint(hosts[0]!.server.port), endpoint(hosts[1]!.server.port), endpoint(port, 'vol', { ioTimeoutMs: 1000 })];
    const engine = await open(eps);
    await engine.write(0, pattern(1, 4096));
    proxy.mode = 'blackhole';
    await engine.write(4096, pattern(2, 8192)); // answered by the two others once the third times out
    const st = engine.replicas()[2]!;
    expect(st.mode).toBe('ERR');
    expect(st.lastError).toBe(-ETIMEDOUT);
    expect(engine.replicas().slice(0, 2).map((r) => r.mode)).toEqual(['RW', 'RW']);
    expect((await engine.read(0, 12288)).equals(Buffer.concat([pattern(1, 4096), pattern(2, 8192)]))).toBe(true);
  });

  it('finds a silent peer by keepalive while idle and drops it at once, without any I/O', async () => {
    hosts = await startHosts(s, 2, SIZE);
    const proxy = new FrameProxy(hosts[1]!.server.port);
    const port = await proxy.start();
    cleanups.push(() => proxy.close());
    const engine = await open([endpoint(hosts[0]!.server.port), endpoint(port, 'vol', { ioTimeoutMs: 500 })]);
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
    // The next write is answered after the dropped replica was fenced (a newer epoch).
    await engine.write(4096, pattern(2, 4096));
    expect(engine.epoch()).toBeGreaterThan(epochBefore);
    expect(engine.replicas()[1]!.mode).toBe('ERR');
  });

  it('opens replicas that cannot be reached at start as ERR (refused, silent, unknown name)', async () => {
    hosts = await startHosts(s, 1, SIZE);
    const silent = await silentServer();
    cleanups.push(() => silent.close());
    const refused = await deadPort();
    const eps = [
      endpoint(hosts[0]!.server.port),
      endpoint(refused, 'vol', { ioTimeoutMs: 500 }),
      endpoint(silent.port, 'vol', { ioTimeoutMs: 500 }),
      endpoint(hosts[0]!.server.port, 'no-such-replica'),
    ];
    const ev = collectEvents();
    const engine = await open(eps, ev.onEvents);
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'ERR', 'ERR', 'ERR']);
    expect(engine.sizeBytes).toBe(SIZE);
    await engine.write(0, pattern(9, 4096));
    expect((await engine.read(0, 4096)).equals(pattern(9, 4096))).toBe(true);
    for (const id of engine.replicas().slice(1).map((r) => r.id))
      expect(ev.events.some((e) => e.type === 'replica-error' && e.replicaId === id), id).toBe(true);
  });
});
