// Backing image files on a LocalDataEngine's disk with the real addon (its image reader
// checks every finished file): download, reuse, checksum mismatch, a refused image, upload
// and resumed upload, reads from an offset and the 3-reader limit, cancel, delete (and BUSY
// while a replica uses the file), verification after a restart (an altered file fails), a
// partial file after a restart, export from a snapshot, and hostile refs.
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtemp, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import type { DataEngineEvent } from '../../../src/data-engine/data-engine.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { MooringError } from '../../../src/errors.js';
import type { NativeAddon } from '../../../src/native/binding.js';
import { loadAddon } from '../../../src/native/load.js';
import { mountTmpfs, unmount } from '../../native/helpers.js';
import { NbdClient } from '../../system/helpers/nbd-client.js';
import { MiB, TestHttpServers, chunks, collect, errorOf, rangeServe, rawImage, sha, type TestHttpHandler } from '../backing-image/helpers.js';

const FAST = { retryFirstDelayMs: 10, retryMaxDelayMs: 50, startTimeoutMs: 2000, stallTimeoutMs: 2000 };

describe('LocalDataEngine backing image files (real addon)', () => {
  let root: string;
  let de: LocalDataEngine;
  let events: DataEngineEvent[];
  const http = new TestHttpServers();
  const requests = http.requests;
  let addon: NativeAddon;

  async function startDe(extra: { addon?: NativeAddon } = {}): Promise<LocalDataEngine> {
    const d = await LocalDataEngine.start({ dir: join(root, 'de'), hostId: 'h1', replicaListen: null, addon: extra.addon ?? addon, backingImageDownload: FAST });
    events = [];
    d.watch((e) => events.push(e));
    return d;
  }

  const serve = (handler: TestHttpHandler): Promise<string> => http.serve(handler, '/image');
  const serveBytes = (body: Buffer): Promise<string> => serve((req, res) => rangeServe(req, res, body));

  const fileEvents = (name: string): Array<Extract<DataEngineEvent, { type: 'backing-image-file' }>> =>
    events.filter((e): e is Extract<DataEngineEvent, { type: 'backing-image-file' }> => e.type === 'backing-image-file' && e.name === name);

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-bif-'));
    requests.length = 0;
    addon = loadAddon();
    de = await startDe();
  });
  afterEach(async () => {
    await de.close().catch(() => undefined);
    await http.closeAll();
    await rm(root, { recursive: true, force: true });
  });

  it('downloads a file, verifies it, reports events, and reuses it', async () => {
    const body = rawImage(5 * MiB + 4096);
    const url = await serveBytes(body);
    const ref = { name: 'debian', uuid: randomUUID() };
    const info = await de.downloadBackingImageFile(ref, { url, expectedChecksum: sha(body).toUpperCase() });
    expect(info).toEqual({
      ...ref,
      state: 'ready',
      progress: 100,
      message: '',
      sizeBytes: body.length,
      receivedBytes: body.length,
      checksum: sha(body),
      format: 'raw',
      virtualSizeBytes: body.length,
      usedBy: [],
    });
    const dir = join(root, 'de', 'backing-images', `debian-${ref.uuid}`);
    expect((await readdir(dir)).sort()).toEqual(['file.json', 'image']);
    expect((await readFile(join(dir, 'image'))).equals(body)).toBe(true);
    expect(JSON.parse(await readFile(join(dir, 'file.json'), 'utf8'))).toMatchObject({ name: 'debian', uuid: ref.uuid, sizeBytes: body.length, checksum: sha(body), format: 'raw', virtualSizeBytes: body.length, state: 'ready', message: '' });
    const states = fileEvents('debian').map((e) => e.state);
    expect(states.slice(0, 2)).toEqual(['pending', 'starting']);
    expect(states).toContain('in-progress');
    expect(states.at(-1)).toBe('ready');
    // Progress events: each one at least a 1 % step (or 250 ms) after the one before.
    const progress = fileEvents('debian').filter((e) => e.state === 'in-progress').map((e) => e.progress);
    expect(progress.length).toBeLessThanOrEqual(102);
    expect(await de.listBackingImageFiles()).toEqual([info]);
    expect(await de.backingImageFile(ref)).toEqual(info);
    expect(await de.backingImageFile({ name: 'debian', uuid: randomUUID() })).toBeNull();
    // Reuse: a ready file is returned at once, nothing is fetched or received.
    const n = requests.length;
    expect(await de.downloadBackingImageFile(ref, { url })).toEqual(info);
    expect(await de.writeBackingImageFile(ref, { sizeBytes: 1 }, chunks(Buffer.alloc(1)))).toEqual(info);
    expect(requests.length).toBe(n);
  });

  it('fails a file whose SHA-512 differs, naming both sums, and starts over on the next attempt', async () => {
    const good = rawImage(2 * MiB);
    const bad = Buffer.from(good);
    bad[MiB] ^= 0xff;
    let serveGood = false;
    const url = await serve((_req, res) => {
      const body = serveGood ? good : bad;
      res.writeHead(200, { 'content-length': body.length });
      res.end(body);
    });
    const ref = { name: 'img', uuid: randomUUID() };
    const e = await errorOf(de.downloadBackingImageFile(ref, { url, expectedChecksum: sha(good) }));
    expect(e.code).toBe('CHECKSUM_MISMATCH');
    expect(e.message).toContain(sha(good));
    expect(e.message).toContain(sha(bad));
    const failed = (await de.backingImageFile(ref))!;
    expect(failed).toMatchObject({ state: 'failed', receivedBytes: 0, checksum: '', format: null });
    expect(failed.message).toMatch(/^CHECKSUM_MISMATCH: .*expected/);
    expect(await readdir(join(root, 'de', 'backing-images', `img-${ref.uuid}`))).toEqual(['file.json']);
    serveGood = true;
    expect((await de.downloadBackingImageFile(ref, { url, expectedChecksum: sha(good) })).state).toBe('ready');
    expect(requests.at(-1)!.headers.range).toBeUndefined();
  });

  it('fails a download the image reader refuses, with the reader code', async () => {
    const body = rawImage(MiB);
    body.write('KDMV', 0, 'latin1'); // a VMDK's magic
    const url = await serveBytes(body);
    const ref = { name: 'vmdk', uuid: randomUUID() };
    const e = await errorOf(de.downloadBackingImageFile(ref, { url }));
    expect(e.code).toBe('UNSUPPORTED');
    expect((await de.backingImageFile(ref))!).toMatchObject({ state: 'failed' });
    expect((await de.backingImageFile(ref))!.message).toMatch(/^UNSUPPORTED: /);
  });

  it('detects qcow2 and reports its virtual size', async () => {
    const path = join(root, 'q.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', path, '64M']);
    const body = await readFile(path);
    const info = await de.writeBackingImageFile({ name: 'q', uuid: randomUUID() }, { sizeBytes: body.length }, chunks(body));
    expect(info).toMatchObject({ state: 'ready', format: 'qcow2', virtualSizeBytes: 64 * MiB, sizeBytes: body.length });
  });

  it('fails an HTTP error with DOWNLOAD_FAILED, and refuses bad URLs and refs before touching the disk', async () => {
    const url = await serve((_req, res) => {
      res.writeHead(404);
      res.end();
    });
    const e = await errorOf(de.downloadBackingImageFile({ name: 'nf', uuid: randomUUID() }, { url }));
    expect(e.code).toBe('DOWNLOAD_FAILED');
    expect(e.message).toMatch(/HTTP 404/);
    const uuid = randomUUID();
    for (const bad of [
      { name: '../etc', uuid },
      { name: 'a/b', uuid },
      { name: '', uuid },
      { name: 'x'.repeat(64), uuid },
      { name: 'ok', uuid: '../../x' },
      { name: 'ok', uuid: uuid.toUpperCase() },
      { name: 'ok', uuid: 'not-a-uuid' },
      null,
      'ok',
    ]) {
      expect((await errorOf(de.downloadBackingImageFile(bad as never, { url }))).code).toBe('INVALID_ARGUMENT');
      expect((await errorOf(de.writeBackingImageFile(bad as never, { sizeBytes: 1 }, chunks(Buffer.alloc(1))))).code).toBe('INVALID_ARGUMENT');
      expect((await errorOf(de.deleteBackingImageFile(bad as never))).code).toBe('INVALID_ARGUMENT');
    }
    for (const u of ['file:///etc/passwd', 'ftp://x/y', 'gopher://x', '', 42]) {
      expect((await errorOf(de.downloadBackingImageFile({ name: 'u', uuid }, { url: u as string }))).code).toBe('INVALID_ARGUMENT');
    }
    expect((await errorOf(de.downloadBackingImageFile({ name: 'u', uuid }, { url, expectedChecksum: 'abc' }))).code).toBe('INVALID_ARGUMENT');
    expect(await de.backingImageFile({ name: 'u', uuid })).toBeNull();
    expect((await readdir(join(root, 'de', 'backing-images'))).length).toBe(1);
  });

  it('uploads a file; a stream that ends early leaves a partial file that a write at its offset resumes', async () => {
    const body = rawImage(6 * MiB);
    const ref = { name: 'up', uuid: randomUUID() };
    const e = await errorOf(de.writeBackingImageFile(ref, { sizeBytes: body.length, expectedChecksum: sha(body) }, chunks(body.subarray(0, 2 * MiB + 5))));
    expect(e.code).toBe('UNAVAILABLE');
    expect(e.message).toMatch(/ended after 2097157 of 6291456 bytes/);
    expect(await de.backingImageFile(ref)).toMatchObject({ state: 'failed', receivedBytes: 2 * MiB + 5, sizeBytes: body.length });
    // Only 0 or the partial's size are offsets.
    for (const offset of [1, 2 * MiB, 2 * MiB + 6, body.length + 1, -1, 0.5]) {
      expect((await errorOf(de.writeBackingImageFile(ref, { sizeBytes: body.length, offset }, chunks(body.subarray(offset > 0 ? Math.floor(offset) : 0))))).code).toBe('INVALID_ARGUMENT');
    }
    expect((await errorOf(de.writeBackingImageFile(ref, { sizeBytes: body.length + 1, offset: 2 * MiB + 5 }, chunks(body.subarray(2 * MiB + 5))))).code).toBe('INVALID_ARGUMENT');
    const info = await de.writeBackingImageFile(ref, { sizeBytes: body.length, offset: 2 * MiB + 5, expectedChecksum: sha(body) }, chunks(body.subarray(2 * MiB + 5)));
    expect(info).toMatchObject({ state: 'ready', checksum: sha(body), sizeBytes: body.length });
    expect((await readFile(join(root, 'de', 'backing-images', `up-${ref.uuid}`, 'image'))).equals(body)).toBe(true);
  });

  it('an upload that fills the disk fails NO_SPACE with its partial file a prefix of the stream; the engine keeps serving, and the upload resumes once there is room', async () => {
    const mnt = join(root, 'small');
    mountTmpfs(mnt, '6m');
    let small: LocalDataEngine | undefined;
    try {
      small = await LocalDataEngine.start({ dir: join(mnt, 'de'), hostId: 'h2', replicaListen: null, addon, backingImageDownload: FAST });
      const body = rawImage(8 * MiB);
      const ref = { name: 'full', uuid: randomUUID() };
      const e = await errorOf(small.writeBackingImageFile(ref, { sizeBytes: body.length, expectedChecksum: sha(body) }, chunks(body, MiB)));
      expect(e.code, e.message).toBe('NO_SPACE');
      const failed = await small.backingImageFile(ref);
      expect(failed).toMatchObject({ state: 'failed', sizeBytes: body.length });
      expect(failed!.receivedBytes).toBeGreaterThan(0);
      expect(failed!.receivedBytes).toBeLessThan(body.length);
      // Still answering, on the full disk.
      expect((await small.listBackingImageFiles()).map((f) => f.name)).toEqual(['full']);
      execFileSync('mount', ['-o', 'remount,size=32m', mnt]);
      // The SHA-512 covers the whole file: a partial file that were not a prefix of the
      // stream would fail it.
      const info = await small.writeBackingImageFile(ref, { sizeBytes: body.length, offset: failed!.receivedBytes, expectedChecksum: sha(body) }, chunks(body.subarray(failed!.receivedBytes), MiB));
      expect(info).toMatchObject({ state: 'ready', checksum: sha(body) });
    } finally {
      await small?.close().catch(() => undefined);
      unmount(mnt);
    }
  });

  it('fails a stream that sends more than declared or garbage chunks, and one that throws keeps its partial', async () => {
    const ref = { name: 'over', uuid: randomUUID() };
    const e = await errorOf(de.writeBackingImageFile(ref, { sizeBytes: MiB }, chunks(rawImage(MiB + 1))));
    expect(e.code).toBe('INVALID_ARGUMENT');
    expect(e.message).toMatch(/more than the 1048576 bytes declared/);
    expect(await de.backingImageFile(ref)).toMatchObject({ state: 'failed', receivedBytes: 0 });
    async function* garbage(): AsyncGenerator<Uint8Array> {
      yield Buffer.alloc(10);
      yield 'text' as unknown as Uint8Array;
    }
    expect((await errorOf(de.writeBackingImageFile(ref, { sizeBytes: MiB }, garbage()))).code).toBe('INVALID_ARGUMENT');
    async function* broken(): AsyncGenerator<Uint8Array> {
      yield Buffer.alloc(4096);
      throw new MooringError('UNAVAILABLE', 'peer went away');
    }
    expect((await errorOf(de.writeBackingImageFile(ref, { sizeBytes: MiB }, broken()))).code).toBe('UNAVAILABLE');
    expect(await de.backingImageFile(ref)).toMatchObject({ state: 'failed', receivedBytes: 4096 });
    // Two preparations of one ref at once: the second is BUSY.
    const twice = { name: 'twice', uuid: randomUUID() };
    const both = await Promise.allSettled([
      de.writeBackingImageFile(twice, { sizeBytes: MiB }, chunks(rawImage(MiB))),
      de.writeBackingImageFile(twice, { sizeBytes: MiB }, chunks(rawImage(MiB))),
    ]);
    expect(both.map((x) => (x.status === 'fulfilled' ? x.value.state : (x.reason as MooringError).code)).sort()).toEqual(['BUSY', 'ready']);
    for (const sizeBytes of [0, -1, 1.5, 2 ** 60, '1']) {
      expect((await errorOf(de.writeBackingImageFile(ref, { sizeBytes: sizeBytes as number }, chunks(Buffer.alloc(1))))).code).toBe('INVALID_ARGUMENT');
    }
    expect((await errorOf(de.writeBackingImageFile(ref, { sizeBytes: 1 }, 'x' as never))).code).toBe('INVALID_ARGUMENT');
  });

  it('reads a ready file from an offset in 1 MiB chunks, at most 3 readers at once', async () => {
    const body = rawImage(3 * MiB + 100);
    const ref = { name: 'rd', uuid: randomUUID() };
    await de.writeBackingImageFile(ref, { sizeBytes: body.length }, chunks(body));
    const all = [];
    for await (const c of de.readBackingImageFile(ref)) all.push(c.length);
    expect(all).toEqual([MiB, MiB, MiB, 100]);
    expect((await collect(de.readBackingImageFile(ref, { offset: MiB + 3 }))).equals(body.subarray(MiB + 3))).toBe(true);
    expect((await collect(de.readBackingImageFile(ref, { offset: body.length }))).length).toBe(0);
    for (const offset of [-1, body.length + 1, 1.5]) {
      expect((await errorOf(collect(de.readBackingImageFile(ref, { offset })))).code).toBe('INVALID_ARGUMENT');
    }
    // Three readers in the middle of the file; a fourth is refused until one finishes.
    const readers = [0, 1, 2].map(() => de.readBackingImageFile(ref)[Symbol.asyncIterator]());
    for (const r of readers) expect((await r.next()).done).toBe(false);
    expect((await errorOf(collect(de.readBackingImageFile(ref)))).code).toBe('BUSY');
    await readers[0]!.return!(undefined);
    expect((await collect(de.readBackingImageFile(ref))).equals(body)).toBe(true);
    for (const r of readers.slice(1)) await r.return!(undefined);
    expect((await errorOf(collect(de.readBackingImageFile({ name: 'none', uuid: randomUUID() })))).code).toBe('NOT_FOUND');
    const partial = { name: 'partial', uuid: randomUUID() };
    await errorOf(de.writeBackingImageFile(partial, { sizeBytes: MiB }, chunks(Buffer.alloc(10))));
    expect((await errorOf(collect(de.readBackingImageFile(partial)))).code).toBe('INVALID_STATE');
  });

  it('cancels a download in progress (CANCELLED, partial kept) and deletes files, cancelling a preparation', async () => {
    const body = rawImage(4 * MiB);
    const url = await serve((req, res) => {
      const m = /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
      const from = m ? Number(m[1]) : 0;
      res.writeHead(m ? 206 : 200, { 'content-length': body.length - from, ...(m ? { 'content-range': `bytes ${from}-${body.length - 1}/${body.length}` } : {}) });
      if (from === 0) res.write(body.subarray(0, MiB)); // then stalls
      else res.end(body.subarray(from));
    });
    const ref = { name: 'cx', uuid: randomUUID() };
    // Rejection handlers attached at once: the rejection comes while we await other calls.
    const p = errorOf(de.downloadBackingImageFile(ref, { url }));
    await expect.poll(async () => (await de.backingImageFile(ref))?.receivedBytes, { timeout: 5000 }).toBe(MiB);
    expect((await de.backingImageFile(ref))!.state).toBe('in-progress');
    expect((await errorOf(de.downloadBackingImageFile(ref, { url }))).code).toBe('BUSY');
    await de.cancelBackingImageFile(ref);
    expect((await p).code).toBe('CANCELLED');
    const after = (await de.backingImageFile(ref))!;
    expect(after).toMatchObject({ state: 'failed', receivedBytes: MiB, progress: 25 });
    expect(after.message).toMatch(/^CANCELLED: /);
    await de.cancelBackingImageFile(ref); // no-op now
    // Resumes from the partial file.
    expect((await de.downloadBackingImageFile(ref, { url, expectedChecksum: sha(body) })).state).toBe('ready');
    expect(requests.at(-1)!.headers.range).toBe(`bytes=${MiB}-`);
    await de.deleteBackingImageFile(ref);
    expect(await de.backingImageFile(ref)).toBeNull();
    expect(await readdir(join(root, 'de', 'backing-images'))).toEqual([]);
    await de.deleteBackingImageFile(ref); // absent: no-op
    // Delete while preparing cancels the preparation.
    const ref2 = { name: 'cx2', uuid: randomUUID() };
    const p2 = errorOf(de.downloadBackingImageFile(ref2, { url }));
    await expect.poll(async () => (await de.backingImageFile(ref2))?.receivedBytes, { timeout: 5000 }).toBe(MiB);
    await de.deleteBackingImageFile(ref2);
    expect((await p2).code).toBe('CANCELLED');
    expect(await de.listBackingImageFiles()).toEqual([]);
  });

  it('refuses to delete a file a replica on this disk uses (usedBy)', async () => {
    await de.close();
    const ref = { name: 'used', uuid: randomUUID() };
    // The replica half of issue 6 makes inspect report the backing image; model it here.
    const real = loadAddon();
    const wrapped: NativeAddon = Object.assign(Object.create(real) as NativeAddon, {
      inspectReplica: async (dir: string) => ({ ...(await real.inspectReplica(dir)), backingImage: { dir: `used-${ref.uuid}`, format: 'raw' as const, virtualSizeBytes: MiB } }),
    });
    de = await startDe({ addon: wrapped });
    await de.writeBackingImageFile(ref, { sizeBytes: MiB }, chunks(rawImage(MiB)));
    await de.createReplica('vol-r0', 4 * MiB);
    expect((await de.listReplicas())[0]!.backingImage).toEqual({ dir: `used-${ref.uuid}`, format: 'raw', virtualSizeBytes: MiB });
    expect((await de.backingImageFile(ref))!.usedBy).toEqual(['vol-r0']);
    const e = await errorOf(de.deleteBackingImageFile(ref));
    expect(e.code).toBe('BUSY');
    expect(e.message).toMatch(/vol-r0/);
    await de.deleteReplica('vol-r0');
    await de.deleteBackingImageFile(ref);
    expect(await de.listBackingImageFiles()).toEqual([]);
  });

  it('createReplica over a backing image: NOT_FOUND / INVALID_STATE checked, then a replica over the ready file, which it uses', async () => {
    const b = { dir: `nope-${randomUUID()}`, format: 'raw' as const, virtualSizeBytes: MiB };
    expect((await errorOf(de.createReplica('r', 4 * MiB, { backingImage: b }))).code).toBe('NOT_FOUND');
    const ref = { name: 'half', uuid: randomUUID() };
    await errorOf(de.writeBackingImageFile(ref, { sizeBytes: MiB }, chunks(Buffer.alloc(10))));
    expect((await errorOf(de.createReplica('r', 4 * MiB, { backingImage: { ...b, dir: `half-${ref.uuid}` } }))).code).toBe('INVALID_STATE');
    await de.writeBackingImageFile(ref, { sizeBytes: MiB }, chunks(rawImage(MiB)));
    const made = await de.createReplica('r', 4 * MiB, { backingImage: { ...b, dir: `half-${ref.uuid}` } });
    expect(made.backingImage).toEqual({ ...b, dir: `half-${ref.uuid}` });
    expect((await de.backingImageFile(ref))?.usedBy).toEqual(['r']);
    expect((await errorOf(de.deleteBackingImageFile(ref))).code).toBe('BUSY');
    await de.deleteReplica('r');
    await de.deleteBackingImageFile(ref);
    expect(await de.backingImageFile(ref)).toBeNull();
  });

  it('after a restart verifies ready files again (an altered file fails) and reports partial files for a resume', async () => {
    const a = rawImage(3 * MiB);
    const b = rawImage(2 * MiB);
    const refA = { name: 'a', uuid: randomUUID() };
    const refB = { name: 'b', uuid: randomUUID() };
    const refP = { name: 'p', uuid: randomUUID() };
    await de.writeBackingImageFile(refA, { sizeBytes: a.length }, chunks(a));
    await de.writeBackingImageFile(refB, { sizeBytes: b.length }, chunks(b));
    await errorOf(de.writeBackingImageFile(refP, { sizeBytes: 2 * MiB }, chunks(a.subarray(0, MiB))));
    await de.close();
    // Alter one byte of b's image while the data engine is away.
    const imgB = join(root, 'de', 'backing-images', `b-${refB.uuid}`, 'image');
    const altered = Buffer.from(b);
    altered[12345] ^= 1;
    await writeFile(imgB, altered);

    de = await startDe();
    const first = await de.listBackingImageFiles();
    expect(first.map((f) => [f.name, f.state])).toEqual([
      ['a', expect.stringMatching(/^(pending|ready)$/)],
      ['b', expect.stringMatching(/^(pending|ready|failed)$/)],
      ['p', 'failed'],
    ]);
    expect(first.find((f) => f.name === 'p')).toMatchObject({ receivedBytes: MiB, sizeBytes: 2 * MiB, progress: 50 });
    await expect.poll(async () => (await de.listBackingImageFiles()).map((f) => f.state), { timeout: 10_000 }).toEqual(['ready', 'failed', 'failed']);
    const files = await de.listBackingImageFiles();
    expect(files[0]).toMatchObject({ state: 'ready', checksum: sha(a), format: 'raw' });
    expect(files[1]!.message).toMatch(/^CHECKSUM_MISMATCH: /);
    expect(files[1]!.message).toContain(sha(altered));
    // The failed one is prepared again from scratch; the partial one resumes.
    expect((await de.writeBackingImageFile(refB, { sizeBytes: b.length }, chunks(b))).checksum).toBe(sha(b));
    expect((await de.writeBackingImageFile(refP, { sizeBytes: 2 * MiB, offset: MiB }, chunks(a.subarray(MiB, 2 * MiB)))).checksum).toBe(sha(a.subarray(0, 2 * MiB)));
    // A damaged record is reported failed, never trusted.
    await de.close();
    await writeFile(join(root, 'de', 'backing-images', `a-${refA.uuid}`, 'file.json'), '{"schema":"mooring-backing-image-file","schemaVersion":1,"name":"evil"');
    await writeFile(join(root, 'de', 'backing-images', 'not-ours'), 'x');
    de = await startDe();
    const again = await de.listBackingImageFiles();
    expect(again.find((f) => f.name === 'a')).toMatchObject({ state: 'failed' });
    expect(again.find((f) => f.name === 'a')!.message).toMatch(/^CORRUPT_METADATA: /);
  });

  it('exports a snapshot of a volume into a file equal to the volume content', async () => {
    await de.createReplica('v-r0', 8 * MiB);
    const sock = join(root, 'nbd.sock');
    await de.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'v-r0', address: null }], nbd: `unix:${sock}`, epoch: 1 });
    const content = Buffer.alloc(8 * MiB);
    const data = rawImage(MiB);
    data.copy(content, 2 * MiB);
    data.copy(content, 7 * MiB);
    const c = await NbdClient.connect({ socketPath: sock });
    await c.write(2 * MiB, data);
    await c.write(7 * MiB, data);
    await c.flush();
    await de.createSnapshot('v', 'base');
    await c.write(2 * MiB, Buffer.alloc(MiB, 0x55)); // after the snapshot: not in the export
    await c.disconnect();
    const ref = { name: 'from-v', uuid: randomUUID() };
    const info = await de.exportSnapshotToBackingImageFile('v', 'base', ref, { expectedChecksum: sha(content) });
    expect(info).toMatchObject({ state: 'ready', sizeBytes: 8 * MiB, format: 'raw', virtualSizeBytes: 8 * MiB, checksum: sha(content) });
    const image = join(root, 'de', 'backing-images', `from-v-${ref.uuid}`, 'image');
    expect((await readFile(image)).equals(content)).toBe(true);
    expect((await stat(image)).size).toBe(8 * MiB);
    expect((await errorOf(de.exportSnapshotToBackingImageFile('v', 'nope', { name: 'x', uuid: randomUUID() }))).code).toBe('NOT_FOUND');
    expect((await errorOf(de.exportSnapshotToBackingImageFile('nope', 'base', { name: 'y', uuid: randomUUID() }))).code).toBe('NOT_FOUND');
    const bad = await errorOf(de.exportSnapshotToBackingImageFile('v', 'base', { name: 'z', uuid: randomUUID() }, { expectedChecksum: sha(data) }));
    expect(bad.code).toBe('CHECKSUM_MISMATCH');
  });
});
