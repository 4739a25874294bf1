// Resize (grow) through the real addon. A replica grows durably (every layer file first,
// then one metadata commit) and never shrinks; a grow cut short before its commit opens
// at the committed size. An engine grows all its RW replicas live, and nothing is written
// past the old end before it has. An NBD connection keeps the size it negotiated while a
// new one sees the new size. The size rule: replicas left at different sizes by a resize
// cut short open at the largest size a RW replica recorded (the others grow), a replica
// that is not RW does not count, and a rebuild gives its target the volume's size, larger
// or smaller; while a rebuild runs a resize is refused (BUSY). Replicas behind replica
// servers grow over the wire (GROW).
import { readFileSync, statSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { NativeEngine } from '../../src/native/binding.js';
import { CMD, NbdClient } from '../system/helpers/nbd-client.js';
import { addon, assertDirsIdentical, codeOf, engineOptions, MiB, pattern, Scratch, withReplica } from './helpers.js';
import { closeAll, endpoint, FrameProxy, type Host, REP_HEADER, startHosts } from './remote-helpers.js';

const NBD_ENOSPC = 28;
const NBD_EINVAL = 22;

interface ReplicaJson {
  sizeBytes: number;
  layers: Array<{ file: string; sizeBytes: number }>;
}

function replicaJson(dir: string): ReplicaJson {
  return JSON.parse(readFileSync(join(dir, 'replica.json'), 'utf8')) as ReplicaJson;
}

/** Recorded size, each layer's recorded size and each layer file's length: all one number when consistent. */
function sizesOf(dir: string): number[] {
  const j = replicaJson(dir);
  return [...new Set([j.sizeBytes, ...j.layers.map((l) => l.sizeBytes), ...j.layers.map((l) => statSync(join(dir, l.file)).size)])];
}

describe('resize (grow) of replicas and engines', () => {
  let s: Scratch;
  let seq = 0;
  let hosts: Host[] = [];
  const cleanups: Array<() => Promise<void>> = [];
  beforeAll(() => {
    s = new Scratch('mooring-native-resize-');
  });
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
    await closeAll(hosts);
    hosts = [];
  });
  afterAll(() => s.cleanup());

  async function replicas(n: number, sizeBytes: number): Promise<string[]> {
    const dirs: string[] = [];
    for (let i = 0; i < n; i++) {
      const d = s.path(`rep-${++seq}`);
      await addon().createReplica(d, sizeBytes);
      dirs.push(d);
    }
    return dirs;
  }

  async function open(dirs: string[], members?: string[]): Promise<NativeEngine> {
    const e = await addon().openEngine(engineOptions({ replicas: dirs, ...(members ? { members } : {}) }));
    cleanups.push(() => e.close());
    return e;
  }

  it('grows a replica durably: every layer file and replica.json; data kept, the new range reads zeros; never shrinks', async () => {
    const [dir] = await replicas(1, 4 * MiB);
    let e = await open([dir!]);
    await e.write(4 * MiB - 4096, pattern(1, 4096));
    await e.snapshot('s1', {}, true);
    await e.write(0, pattern(2, 4096));
    await e.close();

    await withReplica(dir!, async (r) => {
      expect(await codeOf(r.grow(2 * MiB)), 'smaller').toBe('INVALID_ARGUMENT');
      expect(await codeOf(r.grow(4 * MiB + 512)), 'not whole blocks').toBe('INVALID_ARGUMENT');
      await r.grow(4 * MiB); // the same size: nothing to do
      await r.grow(12 * MiB);
      expect(r.sizeBytes).toBe(12 * MiB);
      expect((await r.read(4 * MiB, 8 * MiB)).every((b) => b === 0), 'the new range reads zeros').toBe(true);
      expect((await r.read(4 * MiB - 4096, 4096)).equals(pattern(1, 4096)), 'the snapshot layer is still read through').toBe(true);
    });
    expect(sizesOf(dir!), 'replica.json, every layer record and every layer file').toEqual([12 * MiB]);
    expect(replicaJson(dir!).layers).toHaveLength(2);

    // Across a reopen: the new size, the old data, and room past the old end.
    e = await open([dir!]);
    expect(e.sizeBytes).toBe(12 * MiB);
    await e.write(10 * MiB, pattern(3, 8192));
    expect((await e.read(10 * MiB, 8192)).equals(pattern(3, 8192))).toBe(true);
    expect((await e.read(0, 4096)).equals(pattern(2, 4096))).toBe(true);
    await e.close();
  });

  it('opens a replica whose grow was cut short before its commit at the committed size, its files cut back', async () => {
    const [dir] = await replicas(1, 4 * MiB);
    const e = await open([dir!]);
    await e.write(0, pattern(4, 65536));
    await e.close();
    // Files extended, the crash came before replica.json was replaced.
    for (const l of replicaJson(dir!).layers) truncateSync(join(dir!, l.file), 8 * MiB);
    await withReplica(dir!, async (r) => {
      expect(r.sizeBytes).toBe(4 * MiB);
      expect((await r.read(0, 65536)).equals(pattern(4, 65536))).toBe(true);
    });
    expect(sizesOf(dir!)).toEqual([4 * MiB]);
  });

  it('grows every RW replica of a serving engine; writes past the old end are refused until then; replicas end identical', async () => {
    const dirs = await replicas(3, 8 * MiB);
    const e = await open(dirs);
    const model = Buffer.alloc(24 * MiB);
    const put = async (off: number, data: Buffer): Promise<void> => {
      await e.write(off, data);
      data.copy(model, off);
    };
    await put(8 * MiB - 4096, pattern(5, 4096));
    expect(await codeOf(e.write(8 * MiB, pattern(6, 4096))), 'past the end before the resize').toBe('OUT_OF_RANGE');
    expect(await codeOf(e.resize(4 * MiB)), 'volumes only grow').toBe('INVALID_ARGUMENT');
    expect(await codeOf(e.resize(8 * MiB + 4095)), 'whole blocks only').toBe('INVALID_ARGUMENT');
    await e.resize(8 * MiB);
    expect(e.sizeBytes).toBe(8 * MiB);

    // Writes in flight while it grows: it waits for them, and they all land.
    const inFlight = Array.from({ length: 32 }, (_, i) => put(i * 65536, pattern(100 + i, 65536)));
    await e.resize(24 * MiB);
    await Promise.all(inFlight);
    expect(e.sizeBytes).toBe(24 * MiB);
    await put(20 * MiB - 100, pattern(7, 1 * MiB + 200));
    expect((await e.read(20 * MiB - 100, 1 * MiB + 200)).equals(model.subarray(20 * MiB - 100, 21 * MiB + 100))).toBe(true);
    expect((await e.read(8 * MiB, 4096)).every((b) => b === 0)).toBe(true);
    expect(e.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    await e.close();
    for (const d of dirs) expect(sizesOf(d), d).toEqual([24 * MiB]);
    await assertDirsIdentical(dirs, model);
  });

  it('keeps the size an NBD connection negotiated (past it: ENOSPC for writes, EINVAL for reads); a new connection sees the new size', async () => {
    const dirs = await replicas(2, 8 * MiB);
    const e = await open(dirs);
    const nbd = await e.exportNbd({ tcpHost: '127.0.0.1', tcpPort: 0 });
    cleanups.push(() => nbd.close());
    const before = await NbdClient.connect({ host: '127.0.0.1', port: nbd.port });
    cleanups.push(async () => before.destroy());
    expect(before.sizeBytes).toBe(8 * MiB);

    await e.resize(16 * MiB);
    const after = await NbdClient.connect({ host: '127.0.0.1', port: nbd.port });
    cleanups.push(async () => after.destroy());
    expect(after.sizeBytes, 'NBD_OPT_GO of a new connection').toBe(16 * MiB);

    // The spec bounds a connection by the size its handshake gave; the server holds it to that.
    expect((await before.rawRequest(CMD.WRITE, 0, 8 * MiB, 4096, pattern(8, 4096))).error).toBe(NBD_ENOSPC);
    expect((await before.rawRequest(CMD.READ, 0, 8 * MiB, 4096)).error).toBe(NBD_EINVAL);
    await before.write(8 * MiB - 4096, pattern(9, 4096)); // inside its size it carries on
    await after.write(12 * MiB, pattern(10, 65536));
    expect((await after.read(12 * MiB, 65536)).equals(pattern(10, 65536))).toBe(true);
    expect((await after.read(8 * MiB - 4096, 4096)).equals(pattern(9, 4096))).toBe(true);
  });

  it('finishes a resize cut short: the next engine takes the largest size a RW replica recorded and grows the others', async () => {
    const dirs = await replicas(3, 8 * MiB);
    let e = await open(dirs);
    const model = Buffer.alloc(16 * MiB);
    pattern(11, 65536).copy(model, 8 * MiB - 65536);
    await e.write(8 * MiB - 65536, model.subarray(8 * MiB - 65536, 8 * MiB));
    await e.close();
    // The crash came after r0's commit and before r1's: r1's files are longer than it records.
    await withReplica(dirs[0]!, (r) => r.grow(16 * MiB));
    for (const l of replicaJson(dirs[1]!).layers) truncateSync(join(dirs[1]!, l.file), 16 * MiB);

    e = await open(dirs);
    expect(e.sizeBytes).toBe(16 * MiB);
    expect(e.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    pattern(12, 4096).copy(model, 12 * MiB);
    await e.write(12 * MiB, model.subarray(12 * MiB, 12 * MiB + 4096));
    await e.close();
    for (const d of dirs) expect(sizesOf(d), d).toEqual([16 * MiB]);
    await assertDirsIdentical(dirs, model);
  });

  it('a replica that missed a resize while not RW gets the new size from its rebuild; one grown while not RW is shrunk back by it', async () => {
    // r2 is not a member of the replica set the engine over r0 and r1 commits, so the next
    // engine opens it ERR, whatever its size.
    const [r0, r1, r2] = await replicas(3, 8 * MiB);
    let e = await open([r0!, r1!], ['r0', 'r1']);
    const model = Buffer.alloc(16 * MiB);
    pattern(13, 8192).copy(model, 1 * MiB);
    await e.write(1 * MiB, model.subarray(1 * MiB, 1 * MiB + 8192));
    await e.resize(16 * MiB);
    pattern(14, 8192).copy(model, 14 * MiB);
    await e.write(14 * MiB, model.subarray(14 * MiB, 14 * MiB + 8192));
    await e.close();

    e = await open([r0!, r1!, r2!], ['r0', 'r1', 'r2']);
    expect(e.sizeBytes, 'r2 is ERR: its 8 MiB do not count').toBe(16 * MiB);
    expect(e.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
    await e.addReplica(r2!, 'r2');
    expect(e.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    await e.close();
    expect(sizesOf(r2!)).toEqual([16 * MiB]);
    await assertDirsIdentical([r0!, r1!, r2!], model);

    // The other way round: r5 recorded more than the volume while it was not RW.
    const [r3, r4, r5] = await replicas(3, 8 * MiB);
    e = await open([r3!, r4!], ['r3', 'r4']);
    await e.write(0, pattern(15, 4096));
    await e.close();
    await withReplica(r5!, (r) => r.grow(32 * MiB));
    e = await open([r3!, r4!, r5!], ['r3', 'r4', 'r5']);
    expect(e.sizeBytes, 'r5 is ERR: its 32 MiB do not count').toBe(8 * MiB);
    await e.addReplica(r5!, 'r5');
    await e.close();
    expect(sizesOf(r5!)).toEqual([8 * MiB]);
    await assertDirsIdentical([r3!, r4!, r5!]);
  });

  it('refuses a resize while a rebuild runs (BUSY, nothing changed), and grows the rebuilt replica too once it is done', async () => {
    hosts = await startHosts(s, 1, 64 * MiB);
    const proxy = new FrameProxy(hosts[0]!.server.port);
    await proxy.start();
    cleanups.push(() => proxy.close());
    const [local] = await replicas(1, 64 * MiB);
    let started!: () => void;
    const rebuildStarted = new Promise<void>((r) => (started = r));
    const e = await addon().openEngine(
      engineOptions({
        replicas: [local!],
        members: ['r0'],
        onEvents: (evs) => {
          // Hold the target's replies from the first rebuild event on: the rebuild stays in flight.
          if (evs.some((x) => x.type === 'rebuild-started')) {
            proxy.mode = 'hold';
            started();
          }
        },
      }),
    );
    cleanups.push(() => e.close());
    await e.write(0, pattern(18, 32 * MiB));
    const rebuild = e.addReplica(endpoint(proxy.port), 'r1');
    await rebuildStarted;
    expect(await codeOf(e.resize(128 * MiB))).toBe('BUSY');
    expect(e.sizeBytes).toBe(64 * MiB);
    proxy.release();
    await rebuild;
    await e.resize(128 * MiB);
    expect(e.replicas().map((r) => r.mode)).toEqual(['RW', 'RW']);
    await e.close();
    cleanups.length = 0;
    await proxy.close();
    await closeAll(hosts);
    const dirs = [local!, join(hosts[0]!.root, 'vol')];
    for (const d of dirs) expect(sizesOf(d), d).toEqual([128 * MiB]);
    await assertDirsIdentical(dirs);
  });

  it('refuses a resize (UNSUPPORTED, nothing changed anywhere) when a replica server does not announce GROW, as one of an older release', async () => {
    hosts = await startHosts(s, 1, 8 * MiB);
    const proxy = new FrameProxy(hosts[0]!.server.port);
    // The HELLO reply's feature bits (payload bytes 8..15) as a server before them sent them: zeros.
    proxy.rewriteReply = (frame, n) => {
      if (n === 0) frame.fill(0, REP_HEADER + 8, REP_HEADER + 16);
      return frame;
    };
    await proxy.start();
    cleanups.push(() => proxy.close());
    const [local] = await replicas(1, 8 * MiB);
    const engine = await addon().openEngine(engineOptions({ replicas: [local!, endpoint(proxy.port)] }));
    cleanups.push(() => engine.close());
    expect(await codeOf(engine.resize(16 * MiB))).toBe('UNSUPPORTED');
    expect(engine.sizeBytes).toBe(8 * MiB);
    expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW']);
    await engine.write(8 * MiB - 4096, pattern(19, 4096));
    await engine.close();
    cleanups.length = 0;
    await proxy.close();
    await closeAll(hosts);
    for (const d of [local!, join(hosts[0]!.root, 'vol')]) expect(sizesOf(d), d).toEqual([8 * MiB]);
  });

  it('grows replicas behind replica servers over the wire (GROW), alongside a local one', async () => {
    hosts = await startHosts(s, 2, 8 * MiB);
    const [local] = await replicas(1, 8 * MiB);
    const e = await addon().openEngine(engineOptions({ replicas: [local!, ...hosts.map((h) => endpoint(h.server.port))] }));
    cleanups.push(() => e.close());
    const model = Buffer.alloc(20 * MiB);
    pattern(16, 4096).copy(model, 0);
    await e.write(0, model.subarray(0, 4096));
    await e.resize(20 * MiB);
    pattern(17, 1 * MiB).copy(model, 18 * MiB);
    await e.write(18 * MiB, model.subarray(18 * MiB, 19 * MiB));
    expect((await e.read(18 * MiB, 1 * MiB)).equals(model.subarray(18 * MiB, 19 * MiB))).toBe(true);
    expect(e.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    await e.close();
    cleanups.length = 0;
    await closeAll(hosts);
    const dirs = [local!, ...hosts.map((h) => join(h.root, 'vol'))];
    for (const d of dirs) expect(sizesOf(d), d).toEqual([20 * MiB]);
    await assertDirsIdentical(dirs, model);
  });
});
