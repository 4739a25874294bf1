// Snapshot content through the real addon (engine/snapshot-reader.h): exportSnapshot into
// new raw files and copySnapshotTo into another engine. The expected content of a snapshot
// is what the volume read, through the engine, right when the snapshot was taken; the
// history between snapshots mixes writes, overwrites, trims (which read through to older
// layers) and write-zeroes (real zeros over older data, holes elsewhere). Each export is
// compared byte for byte, with `qemu-img compare` against a raw file built from those
// reads, and with `qemu-img map` for holes. Also: clones replicated to both replicas of the
// target, coded errors, ENOSPC on a small tmpfs, snapshot delete refused while a read runs.
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { LocalEngine, type EngineEvent } from '../../src/engine/engine.js';
import { run } from '../system/helpers/tools.js';
import { BLOCK, KiB, MiB, Scratch, addon, assertDirsIdentical, codeOf, mountTmpfs, pattern, unmount, nextEpoch } from './helpers.js';
import { FrameProxy } from './remote-helpers.js';

const SIZE = 32 * MiB;

function expectSame(actual: Buffer, expected: Buffer, what: string): void {
  if (!actual.equals(expected)) {
    const at = actual.length !== expected.length ? -1 : actual.findIndex((b, i) => b !== expected[i]);
    throw new Error(`${what}: differs at byte ${at} (lengths ${actual.length}/${expected.length})`);
  }
}

/** Bytes in 4 KiB blocks that are not all zeros: what a sparse copy writes as data. */
function nonZeroBlockBytes(b: Buffer): number {
  let n = 0;
  for (let off = 0; off < b.length; off += BLOCK) if (b.subarray(off, off + BLOCK).some((x) => x !== 0)) n += BLOCK;
  return n;
}

/** The whole volume as the engine reads it now. */
async function readAll(e: LocalEngine): Promise<Buffer> {
  const out = Buffer.alloc(e.sizeBytes);
  for (let off = 0; off < e.sizeBytes; off += 4 * MiB) (await e.read(off, Math.min(4 * MiB, e.sizeBytes - off))).copy(out, off);
  return out;
}

interface MapEntry {
  start: number;
  length: number;
  data: boolean;
  zero: boolean;
}

/** `qemu-img map` of a raw file: which ranges hold data. */
async function qemuMap(path: string): Promise<MapEntry[]> {
  const r = await run('qemu-img', ['map', '-f', 'raw', '--output=json', path]);
  return JSON.parse(r.stdout) as MapEntry[];
}

/** Whether [off, off+len) is reported as a hole (no data) everywhere by the map. */
function isHole(map: MapEntry[], off: number, len: number): boolean {
  return map.filter((m) => m.start < off + len && m.start + m.length > off).every((m) => !m.data);
}

/** Whether [off, off+len) is reported as data everywhere by the map. */
function isData(map: MapEntry[], off: number, len: number): boolean {
  const parts = map.filter((m) => m.start < off + len && m.start + m.length > off);
  return parts.length > 0 && parts.every((m) => m.data);
}

describe('snapshot export and copy (real addon)', () => {
  let s: Scratch;
  let src: LocalEngine;
  const events: EngineEvent[] = [];
  /** What the volume read when each snapshot was taken. */
  const at: Record<string, Buffer> = {};

  async function newEngine(name: string, replicas: number, size = SIZE): Promise<{ engine: LocalEngine; dirs: string[] }> {
    const dirs: string[] = [];
    for (let i = 0; i < replicas; i++) {
      const dir = s.path(`${name}-r${i}`);
      await addon().createReplica(dir, size);
      dirs.push(dir);
    }
    const engine = await LocalEngine.open({ epoch: nextEpoch(), replicas: dirs.map((path, i) => ({ id: `r${i}`, path })) });
    return { engine, dirs };
  }

  beforeAll(async () => {
    s = new Scratch('mooring-snap-export-');
    src = (await newEngine('src', 2)).engine;
    src.on('snapshot-copy-progress', (e) => events.push({ type: 'snapshot-copy-progress', ...e }));

    // s1: patterns, one unaligned write, the rest never written.
    await src.write(0, pattern(1, 4 * MiB));
    await src.write(8 * MiB, pattern(2, 64 * KiB));
    await src.write(20 * MiB + 100, pattern(3, 5000));
    await src.createSnapshot('s1');
    at.s1 = await readAll(src);

    // s2: overwrite part of s1's data; new data, partly trimmed (that part reads as zeros:
    // nothing below it); a trim over overwritten s1 data (reads s1's bytes again); zeroes
    // over s1 data (real zeros) and over nothing (a hole).
    await src.write(1 * MiB, pattern(4, 256 * KiB));
    await src.write(12 * MiB, pattern(5, MiB));
    await src.trim(12 * MiB + 256 * KiB, 256 * KiB);
    await src.trim(1 * MiB + 128 * KiB, 64 * KiB);
    await src.writeZeroes(3 * MiB, 128 * KiB);
    await src.writeZeroes(16 * MiB, MiB);
    await src.createSnapshot('s2');
    at.s2 = await readAll(src);

    // After s2: more writes, which no export may show.
    await src.write(0, pattern(6, 512 * KiB));
    await src.write(24 * MiB, pattern(7, MiB));
    await src.trim(8 * MiB, 64 * KiB);
  });
  afterAll(async () => {
    await src?.close().catch(() => undefined);
    s?.cleanup();
  });

  it('the history is what the test means it to be (the reads it compares against are not trivial)', () => {
    // A trim over overwritten s1 data reads s1's bytes again, not zeros.
    expectSame(at.s2!.subarray(MiB + 128 * KiB, MiB + 192 * KiB), at.s1!.subarray(MiB + 128 * KiB, MiB + 192 * KiB), 'trim over s1 data');
    expect(at.s1!.subarray(MiB + 128 * KiB, MiB + 192 * KiB).some((b) => b !== 0)).toBe(true);
    // The trimmed part of new data reads zeros; write-zeroes over s1 data reads zeros.
    expect(at.s2!.subarray(12 * MiB + 256 * KiB, 12 * MiB + 512 * KiB).every((b) => b === 0)).toBe(true);
    expect(at.s2!.subarray(3 * MiB, 3 * MiB + 128 * KiB).every((b) => b === 0)).toBe(true);
    expect(at.s1!.subarray(3 * MiB, 3 * MiB + 128 * KiB).some((b) => b !== 0)).toBe(true);
  });

  it('exports each snapshot as it read when it was taken: bytes, qemu-img compare, holes in qemu-img map', async () => {
    for (const name of ['s1', 's2']) {
      const path = s.path(`${name}.raw`);
      const res = await src.exportSnapshot(name, path);
      expect(res.sizeBytes).toBe(SIZE);
      expect(statSync(path).size).toBe(SIZE);
      expect(statSync(path).mode & 0o777).toBe(0o600);
      expectSame(readFileSync(path), at[name]!, `export of ${name}`);

      // qemu-img compares it with a raw file written from the reads (not sparse-aware).
      const ref = s.path(`${name}-reads.raw`);
      writeFileSync(ref, at[name]!);
      const cmp = await run('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', path, ref], { allowFailure: true });
      expect(cmp.code, cmp.stdout + cmp.stderr).toBe(0);

      // Only data is written: never-written ranges and zeros stay holes.
      const map = await qemuMap(path);
      expect(isHole(map, 4 * MiB, 4 * MiB)).toBe(true);
      expect(isHole(map, 28 * MiB, 4 * MiB)).toBe(true);
      expect(isData(map, 8 * MiB, 64 * KiB)).toBe(true);
      expect(isData(map, 20 * MiB, 8 * KiB)).toBe(true);
      const dataBytes = map.filter((m) => m.data).reduce((n, m) => n + m.length, 0);
      expect(res.copiedBytes).toBe(nonZeroBlockBytes(at[name]!));
      expect(dataBytes).toBe(res.copiedBytes);
      expect(statSync(path).blocks * 512).toBeLessThanOrEqual(dataBytes + 64 * KiB);
    }
    const map2 = await qemuMap(s.path('s2.raw'));
    expect(isData(map2, 12 * MiB, 256 * KiB)).toBe(true);
    expect(isHole(map2, 12 * MiB + 256 * KiB, 256 * KiB)).toBe(true); // trimmed, nothing below
    expect(isHole(map2, 3 * MiB, 128 * KiB)).toBe(true); // zeroes over s1 data: real zeros in the layer, a hole in the file
    expect(isHole(map2, 16 * MiB, MiB)).toBe(true);
    // The volume itself moved on; the exports did not follow.
    expect((await readAll(src)).equals(at.s2!)).toBe(false);
  });

  it('copies a snapshot into a second engine with 2 replicas, both of which hold it', async () => {
    const { engine: dst, dirs } = await newEngine('clone', 2);
    const res = await src.copySnapshotTo('s2', dst);
    expect(res.sizeBytes).toBe(SIZE);
    expect(res.copiedBytes).toBe(nonZeroBlockBytes(at.s2!));
    expectSame(await readAll(dst), at.s2!, 'clone read through its engine');
    // Sparse: zeros and holes were not written as data.
    const allocated = dst.replicas().map((r) => r.allocatedBytes);
    for (const a of allocated) expect(a).toBeLessThanOrEqual(res.copiedBytes + 256 * KiB);
    await dst.close();
    // Each replica, opened on its own, holds exactly the snapshot.
    const cmp = await assertDirsIdentical(dirs, at.s2!);
    expect(cmp.ids.length).toBe(2);
  });

  it('replaces what the target held before: ranges the snapshot does not hold are zeroed', async () => {
    const { engine: dst, dirs } = await newEngine('reused', 2);
    await dst.write(0, pattern(9, SIZE / 2));
    await dst.write(SIZE / 2, pattern(10, SIZE / 2));
    await src.copySnapshotTo('s1', dst);
    expectSame(await readAll(dst), at.s1!, 'target after the copy');
    await dst.close();
    await assertDirsIdentical(dirs, at.s1!);
  });

  it('refuses with coded errors and leaves no file behind', async () => {
    const existing = s.path('existing.raw');
    writeFileSync(existing, 'keep me');
    expect(await codeOf(src.exportSnapshot('s1', existing))).toBe('ALREADY_EXISTS');
    expect(readFileSync(existing, 'utf8')).toBe('keep me');
    expect(await codeOf(src.exportSnapshot('s1', 'relative.raw'))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(src.exportSnapshot('s1', s.path('no-such-dir', 'x.raw')))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(src.exportSnapshot('s1', s.root + '/'))).toBe('INVALID_ARGUMENT');
    // The native layer checks too, whatever the TypeScript layer let through.
    expect(await codeOf((src as unknown as { exportSnapshot: (n: string, p: unknown) => Promise<unknown> }).exportSnapshot('s1', 42))).toBe('INVALID_ARGUMENT');
    const missing = s.path('missing.raw');
    expect(await codeOf(src.exportSnapshot('nope', missing))).toBe('NOT_FOUND');
    expect(existsSync(missing)).toBe(false);
    expect(await codeOf(src.exportSnapshot('../s1', missing))).toBe('INVALID_ARGUMENT');

    expect(await codeOf(src.copySnapshotTo('s1', src))).toBe('INVALID_ARGUMENT');
    const { engine: small } = await newEngine('small', 1, 16 * MiB);
    expect(await codeOf(src.copySnapshotTo('s1', small))).toBe('INVALID_ARGUMENT');
    const { engine: same } = await newEngine('same', 1);
    expect(await codeOf(src.copySnapshotTo('nope', same))).toBe('NOT_FOUND');
    await same.close();
    expect(await codeOf(src.copySnapshotTo('s1', same))).toBe('CLOSED');
    await small.close();
  });

  it('fails with NO_SPACE on a full file system and removes the partial file', async () => {
    const mnt = s.path('tiny');
    mountTmpfs(mnt, '2m'); // s1 holds over 4 MiB of data
    try {
      const path = join(mnt, 's1.raw');
      const err = await src.exportSnapshot('s1', path).then(
        () => undefined,
        (e: unknown) => e as { code: string; message: string },
      );
      expect(err?.code, err?.message).toBe('NO_SPACE');
      expect(readdirSync(mnt)).toEqual([]);
    } finally {
      unmount(mnt);
    }
  });

  it('reports progress of a long export every 64 MiB', async () => {
    const { engine: big } = await newEngine('big', 1, 160 * MiB);
    const seen: Array<{ snapshot: string; copiedBytes: number; totalBytes: number }> = [];
    big.on('snapshot-copy-progress', (e) => seen.push(e));
    for (let off = 0; off < 136 * MiB; off += 8 * MiB) await big.write(off, pattern(off / MiB, 8 * MiB));
    await big.createSnapshot('full');
    const res = await big.exportSnapshot('full', s.path('big.raw'));
    expect(res.copiedBytes).toBe(136 * MiB);
    // Events cross threads in batches: let the last ones arrive.
    for (let i = 0; i < 100 && seen.length < 2; i++) await new Promise((r) => setTimeout(r, 10));
    expect(seen.map((e) => e.copiedBytes)).toEqual([64 * MiB, 128 * MiB]);
    expect(seen.every((e) => e.snapshot === 'full' && e.totalBytes === 136 * MiB)).toBe(true);
    await big.close();
  });

  it('an engine whose replica another engine claimed reads no snapshot from it (STALE_EPOCH)', async () => {
    const { engine: first, dirs } = await newEngine('fenced', 1);
    await first.write(0, pattern(16, MiB));
    await first.createSnapshot('x');
    // A second engine over the same directory (shared in this process) takes the volume over.
    const second = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', path: dirs[0]! }] });
    expect(second.epoch).toBeGreaterThan(first.epoch);
    expect(await codeOf(first.exportSnapshot('x', s.path('fenced.raw')))).toBe('STALE_EPOCH');
    expect(existsSync(s.path('fenced.raw'))).toBe(false);
    await second.exportSnapshot('x', s.path('fenced.raw'));
    expect(readFileSync(s.path('fenced.raw')).subarray(0, MiB).equals(pattern(16, MiB))).toBe(true);
    await second.close();
    await first.close().catch(() => undefined);
  });

  describe('a snapshot read in flight (a replica reached through a proxy that holds replies)', () => {
    let host: { root: string; server: { port: number; close: () => Promise<void> } };
    let proxy: FrameProxy;
    let held: LocalEngine;
    const content: Record<string, Buffer> = {};

    beforeAll(async () => {
      const root = s.dir('remote-host');
      await addon().createReplica(join(root, 'vol'), SIZE);
      host = { root, server: await addon().startReplicaServer({ root }) };
      proxy = new FrameProxy(host.server.port);
      await proxy.start();
      held = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', remote: { host: '127.0.0.1', port: proxy.port, name: 'vol', ioTimeoutMs: 60_000 } }] });
      await held.write(0, pattern(11, 6 * MiB));
      await held.createSnapshot('a');
      content.a = await readAll(held);
      await held.write(MiB, pattern(12, MiB));
      await held.createSnapshot('b');
      content.b = await readAll(held);
    });
    afterAll(async () => {
      proxy?.release();
      await held?.close().catch(() => undefined);
      await proxy?.close();
      await host?.server.close();
    });

    it('refuses snapshot delete and revert with BUSY until the export ends, and the export is whole', async () => {
      const path = s.path('held-a.raw');
      proxy.mode = 'hold';
      const exporting = held.exportSnapshot('a', path);
      // The export has opened its read and is waiting for a reply the proxy holds.
      for (let i = 0; i < 500 && proxy.outstanding === 0; i++) await new Promise((r) => setTimeout(r, 10));
      expect(proxy.outstanding).toBeGreaterThan(0);
      expect(await codeOf(held.deleteSnapshot('a'))).toBe('BUSY');
      expect(await codeOf(held.deleteSnapshot('b'))).toBe('BUSY');
      expect(await codeOf(held.revert('a'))).toBe('BUSY');
      // No hand-over either: the next writer could delete the layers being read.
      expect(await codeOf(held.deactivate())).toBe('BUSY');
      expect(held.role).toBe('active');
      proxy.release();
      const res = await exporting;
      expect(res.copiedBytes).toBe(6 * MiB);
      expectSame(readFileSync(path), content.a!, 'export of a');
      // Done: delete works again, and b (merged with a's data) still reads as it did.
      await held.deleteSnapshot('a');
      const path2 = s.path('held-b.raw');
      await held.exportSnapshot('b', path2);
      expectSame(readFileSync(path2), content.b!, 'export of b after a was deleted');
    });

    it('a copy whose target is held keeps the source snapshot from being deleted', async () => {
      // The held engine is now the target: its writes wait on the proxy.
      const { engine: from } = await newEngine('copy-src', 1);
      await from.write(2 * MiB, pattern(13, 3 * MiB));
      await from.createSnapshot('c');
      const want = await readAll(from);
      proxy.mode = 'hold';
      const copying = from.copySnapshotTo('c', held);
      for (let i = 0; i < 500 && proxy.outstanding === 0; i++) await new Promise((r) => setTimeout(r, 10));
      expect(proxy.outstanding).toBeGreaterThan(0);
      expect(await codeOf(from.deleteSnapshot('c'))).toBe('BUSY');
      // A second read of the same snapshot is no conflict.
      const side = s.path('side-c.raw');
      await from.exportSnapshot('c', side);
      expectSame(readFileSync(side), want, 'export during the copy');
      proxy.release();
      await copying;
      expectSame(await readAll(held), want, 'target after the copy');
      await from.deleteSnapshot('c');
      await from.close();
    });

    it('goes on from the other replica when the one it reads from fails mid-way, and marks that one ERR', async () => {
      const root = s.dir('failover-host');
      await addon().createReplica(join(root, 'vol'), SIZE);
      const server = await addon().startReplicaServer({ root });
      const p2 = new FrameProxy(server.port);
      await p2.start();
      const localDir = s.path('failover-local');
      await addon().createReplica(localDir, SIZE);
      // The remote replica comes first: the read starts on it.
      const e = await LocalEngine.open({
      epoch: nextEpoch(),
        replicas: [
          { id: 'r0', remote: { host: '127.0.0.1', port: p2.port, name: 'vol', ioTimeoutMs: 60_000 } },
          { id: 'r1', path: localDir },
        ],
      });
      try {
        await e.write(0, pattern(15, 10 * MiB));
        await e.createSnapshot('f');
        const want = await readAll(e);
        p2.mode = 'hold';
        const path = s.path('failover.raw');
        const exporting = e.exportSnapshot('f', path);
        for (let i = 0; i < 500 && p2.outstanding === 0; i++) await new Promise((r) => setTimeout(r, 10));
        expect(p2.outstanding).toBeGreaterThan(0);
        await p2.close(); // the connection drops with the read in flight
        const res = await exporting;
        expect(res.copiedBytes).toBe(10 * MiB);
        expectSame(readFileSync(path), want, 'export that changed replicas');
        expect(e.replicas().map((r) => r.mode)).toEqual(['ERR', 'RW']);
      } finally {
        await e.close().catch(() => undefined);
        await server.close();
      }
    });

    it('closing the source engine cuts a copy short with CLOSED', async () => {
      const { engine: from } = await newEngine('cut-src', 1);
      await from.write(0, pattern(14, 12 * MiB)); // three windows of data
      await from.createSnapshot('d');
      proxy.mode = 'hold';
      const copying = from.copySnapshotTo('d', held).then(
        () => 'resolved',
        (e: unknown) => (e as { code: string }).code,
      );
      // The first window's write to the target is held: the copy has more to read.
      for (let i = 0; i < 500 && proxy.outstanding === 0; i++) await new Promise((r) => setTimeout(r, 10));
      expect(proxy.outstanding).toBeGreaterThan(0);
      await from.close(); // does not wait for the copy
      proxy.release();
      expect(await copying).toBe('CLOSED');
    });
  });
});
