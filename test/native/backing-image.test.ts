// A backing image as the bottom, read-only layer of a replica's chain (seed 003), through the
// real addon and real QEMU tools. For images qemu-img/qemu-io make in every variant the reader
// supports, a replica is created over DISK/backing-images/<dir>/image, an engine over it is
// exported over NBD, and:
//   - `qemu-img convert -f raw -O raw <nbd uri>` equals `qemu-img convert -O raw <image>` byte
//     for byte over the image's virtual size, and reads zeros beyond it;
//   - `qemu-img map` of the export agrees with `qemu-img map` of the image on data vs zeros.
// Then, over one image: writes on top (copy-up of partial blocks), write-zeroes with and
// without trim over image data, fast-only write-zeroes, a snapshot exported with image data,
// a rebuild that sends only what was written, refusals (missing file, wrong size, a rebuild
// target without the image, hostile replica.json values), and the image file unchanged.
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { LocalEngine } from '../../src/engine/engine.js';
import { openImage } from '../../src/image/image-reader.js';
import type { NativeReplicaBackingImage } from '../../src/native/binding.js';
import { run } from '../system/helpers/tools.js';
import { BLOCK, KiB, MiB, Scratch, addon, assertDirsIdentical, codeOf, pattern, withReplica, nextEpoch } from './helpers.js';
import { expectSameBytes, qcow2Check, qcow2Variant, qemuImg, qemuIo, writeSource } from './image-helpers.js';

let scratch: Scratch;
/** A data engine's DIR: replicas in DISK/replicas, images in DISK/backing-images. */
let disk: string;
/** SHA-512 of every image file when it was made, checked again at the end. */
const madeHashes = new Map<string, string>();
let seq = 0;

beforeAll(() => {
  scratch = new Scratch('mooring-backing-');
  disk = scratch.dir('disk');
  mkdirSync(join(disk, 'replicas'));
  mkdirSync(join(disk, 'backing-images'));
});
afterAll(() => scratch.cleanup());

function sha512(path: string): string {
  return createHash('sha512').update(readFileSync(path)).digest('hex');
}

interface Image {
  ref: NativeReplicaBackingImage;
  /** DISK/backing-images/<dir>: the image and any backing or data files it names. */
  dir: string;
  path: string;
  /** `qemu-img convert -O raw` of the image. */
  want: Buffer;
}

/** Makes DISK/backing-images/<name>/image with `build` (run in that directory), records its hash. */
async function makeImage(name: string, format: 'raw' | 'qcow2', build: (d: string) => void): Promise<Image> {
  const dir = join(disk, 'backing-images', name);
  mkdirSync(dir, { recursive: true });
  build(dir);
  const path = join(dir, 'image');
  for (const f of ['image', 'base.raw', 'mid.qcow2', 'data.raw']) {
    try {
      madeHashes.set(join(dir, f), sha512(join(dir, f)));
    } catch {
      // not part of this image
    }
  }
  qemuImg(dir, 'convert', '-f', format, '-O', 'raw', 'image', join(scratch.root, `${name}.ref`));
  const want = readFileSync(join(scratch.root, `${name}.ref`));
  const img = await openImage(path, { format });
  const virtualSizeBytes = img.sizeBytes;
  await img.close();
  expect(virtualSizeBytes, `${name}: virtual size as QEMU converts it`).toBe(want.length);
  return { ref: { dir: name, format, virtualSizeBytes }, dir, path, want };
}

/** Replica size over an image: whole blocks, plus 64 KiB past the image that must read zeros. */
function sizeOver(img: Image): number {
  return Math.ceil(img.ref.virtualSizeBytes / BLOCK) * BLOCK + 64 * KiB;
}

async function newReplica(img: Image | undefined, sizeBytes: number): Promise<string> {
  const dir = join(disk, 'replicas', `r${seq++}`);
  await addon().createReplica(dir, sizeBytes, img ? { backingImage: img.ref } : undefined);
  return dir;
}

/** Whole-volume `qemu-img convert` of an NBD export into a buffer. */
async function convertNbd(uri: string, name: string): Promise<Buffer> {
  const out = join(scratch.root, `${name}.${seq++}.nbd.raw`);
  await run('qemu-img', ['convert', '-f', 'raw', '-O', 'raw', uri, out]);
  return readFileSync(out);
}

interface MapEntry {
  start: number;
  length: number;
  data: boolean;
  zero: boolean;
}

/**
 * Per byte range, "reads as data" (true) or "reads as zeros" (false). For an NBD export QEMU
 * turns base:allocation flags into data = !HOLE, zero = ZERO, so zeros the image records (ZERO
 * without HOLE) show as data+zero there and as zero without data on the image itself: both
 * mean "reads as zeros", which is what is compared.
 */
function dataRuns(entries: MapEntry[]): Array<[number, number, boolean]> {
  const out: Array<[number, number, boolean]> = [];
  for (const e of entries) {
    const data = e.data && !e.zero;
    const last = out[out.length - 1];
    if (last && last[2] === data && last[0] + last[1] === e.start) last[1] += e.length;
    else out.push([e.start, e.length, data]);
  }
  return out;
}

function expectMapsAgree(nbd: MapEntry[], image: MapEntry[], volumeSize: number, virtualSize: number, what: string): void {
  const a = dataRuns(nbd);
  const b = dataRuns(image);
  expect(a.reduce((n, r) => n + r[1], 0), `${what}: NBD map length`).toBe(volumeSize);
  expect(b.reduce((n, r) => n + r[1], 0), `${what}: image map length`).toBe(virtualSize);
  // Beyond the image the volume reads zeros.
  b.push([virtualSize, volumeSize - virtualSize, false]);
  let i = 0;
  let j = 0;
  for (let at = 0; at < volumeSize; ) {
    const x = a[i]!;
    const y = b[j]!;
    if (x[2] !== y[2]) throw new Error(`${what}: at byte ${at} the export says ${x[2] ? 'data' : 'zeros'}, the image ${y[2] ? 'data' : 'zeros'}`);
    at = Math.min(x[0] + x[1], y[0] + y[1]);
    if (at === x[0] + x[1]) i++;
    if (at === y[0] + y[1]) j++;
  }
}

/** `qemu-img map`, run in `cwd` so that names an image stores (data files) resolve there. */
async function qemuMap(args: string[], cwd?: string): Promise<MapEntry[]> {
  return JSON.parse((await run('qemu-img', ['map', '--output=json', ...args], cwd ? { cwd } : {})).stdout) as MapEntry[];
}

/** An engine over one new replica over `img`, exported on a unix socket. */
async function serve(img: Image, name: string): Promise<{ engine: LocalEngine; uri: string; dir: string; size: number }> {
  const size = sizeOver(img);
  const dir = await newReplica(img, size);
  const engine = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', path: dir }] });
  const exp = await engine.exportNbd({ nbd: `unix:${scratch.path(`${name}-${seq++}.sock`)}` });
  return { engine, uri: exp.uri, dir, size };
}

/** The checks every variant gets: content and allocation through NBD equal the image's. */
async function expectServedLikeQemu(img: Image, name: string): Promise<void> {
  const { engine, uri, dir, size } = await serve(img, name);
  try {
    const got = await convertNbd(uri, name);
    expect(got.length).toBe(size);
    expectSameBytes(got.subarray(0, img.ref.virtualSizeBytes), img.want, `${name}: volume over the image`);
    expect(got.subarray(img.ref.virtualSizeBytes).every((b) => b === 0), `${name}: zeros beyond the image`).toBe(true);
    const nbdMap = await qemuMap(['-f', 'raw', uri]);
    const imageMap = await qemuMap(['-f', img.ref.format, img.path], img.dir);
    expectMapsAgree(nbdMap, imageMap, size, img.ref.virtualSizeBytes, name);
  } finally {
    await engine.close();
  }
  const info = await addon().inspectReplica(dir);
  expect(info.backingImage).toEqual(img.ref);
}

const OVERWRITES = ['write -P 0x5a 12345 70000', 'write -P 0x6b 1048064 1024', 'write -z 2M 128k', 'write -z -u 3M 64k', 'discard 4M 64k'];

describe('a replica over a backing image serves it like qemu-img reads it', () => {
  it('qcow2 v2 (compat=0.10), 64 KiB clusters', async () => {
    const img = await makeImage('v2', 'qcow2', (d) => {
      writeSource(join(d, 'src.raw'), 6 * MiB, 1);
      qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', '-o', 'compat=0.10', 'src.raw', 'image');
      qemuIo(join(d, 'image'), 'qcow2', 'write -P 0x5a 12345 70000', 'write -z 2M 128k');
    });
    expect(qcow2Variant(img.path)).toMatchObject({ version: 2, clusterBits: 16 });
    await expectServedLikeQemu(img, 'v2');
  });

  for (const cluster of ['512', '4k', '64k', '2M']) {
    it(`qcow2 v3, ${cluster} clusters, partial writes, zero clusters, discard`, async () => {
      const name = `v3-${cluster}`;
      const img = await makeImage(name, 'qcow2', (d) => {
        writeSource(join(d, 'src.raw'), 6 * MiB, 2);
        qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', '-o', `cluster_size=${cluster}`, 'src.raw', 'image');
        qemuIo(join(d, 'image'), 'qcow2', ...OVERWRITES);
      });
      expect(qcow2Variant(img.path)).toMatchObject({ version: 3, clusterBits: { '512': 9, '4k': 12, '64k': 16, '2M': 21 }[cluster] });
      await expectServedLikeQemu(img, name);
    });
  }

  for (const type of ['zlib', 'zstd'] as const) {
    it(`${type}-compressed clusters`, async () => {
      const img = await makeImage(`c-${type}`, 'qcow2', (d) => {
        writeSource(join(d, 'src.raw'), 5 * MiB, 3);
        qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', '-o', `compression_type=${type}`, 'src.raw', 'image');
        qemuIo(join(d, 'image'), 'qcow2', 'write -P 0x77 200000 5000', 'write -z 3M 64k');
      });
      expect(qcow2Variant(img.path).compressionType).toBe(type === 'zstd' ? 1 : 0);
      expect(qcow2Check(img.path).compressedClusters).toBeGreaterThan(8);
      await expectServedLikeQemu(img, `c-${type}`);
    });
  }

  it('extended L2 entries (subclusters) over a raw backing file', async () => {
    const img = await makeImage('ext-l2', 'qcow2', (d) => {
      writeSource(join(d, 'base.raw'), 4 * MiB, 4);
      qemuImg(d, 'create', '-f', 'qcow2', '-o', 'extended_l2=on,cluster_size=64k', '-b', 'base.raw', '-F', 'raw', 'image', '4M');
      qemuIo(join(d, 'image'), 'qcow2', 'write -P 0x11 4k 4k', 'write -P 0x22 130k 1k', 'write -z 200k 6k', 'write -P 0x33 1M 64k', 'write -z 2M 64k', 'discard 3M 4k');
    });
    expect(qcow2Variant(img.path).incompatible & 16).toBe(16);
    await expectServedLikeQemu(img, 'ext-l2');
  });

  it('a qcow2 backing chain of 3 over a raw file whose size is not a multiple of 512', async () => {
    const img = await makeImage('chain', 'qcow2', (d) => {
      writeSource(join(d, 'base.raw'), 3 * MiB + 1000, 6);
      qemuImg(d, 'create', '-f', 'qcow2', '-b', 'base.raw', '-F', 'raw', 'mid.qcow2', '4M');
      qemuIo(join(d, 'mid.qcow2'), 'qcow2', 'write -P 0x21 64k 100k', 'write -z 1M 64k');
      qemuImg(d, 'create', '-f', 'qcow2', '-o', 'cluster_size=4k', '-b', 'mid.qcow2', '-F', 'qcow2', 'image', '5M');
      qemuIo(join(d, 'image'), 'qcow2', 'write -P 0x31 100k 8k', 'write -z 0 4k', 'write -P 0x32 4718592 4096');
    });
    await expectServedLikeQemu(img, 'chain');
  });

  it('an external data file', async () => {
    const img = await makeImage('data-file', 'qcow2', (d) => {
      qemuImg(d, 'create', '-f', 'qcow2', '-o', 'data_file=data.raw', 'image', '3M');
      qemuIo(join(d, 'image'), 'qcow2', 'write -P 0x61 0 100k', 'write -P 0x62 1M 5000', 'write -z 1M 4k', 'write -P 0x63 2M 64k');
    });
    expect(qcow2Variant(img.path).incompatible & 4).toBe(4);
    await expectServedLikeQemu(img, 'data-file');
  });

  it('a raw image whose size is not a multiple of 512 (virtual size rounded up, not a multiple of 4096)', async () => {
    const img = await makeImage('raw-odd', 'raw', (d) => writeSource(join(d, 'image'), 3 * MiB + 1000, 7));
    expect(img.ref.virtualSizeBytes).toBe(3 * MiB + 1024);
    await expectServedLikeQemu(img, 'raw-odd');
  });

  it('a qcow2 whose virtual size is not a multiple of 512 (QEMU rounds it down), nor of 4096', async () => {
    const img = await makeImage('qcow2-odd', 'qcow2', (d) => {
      writeSource(join(d, 'src.raw'), 2 * MiB, 8);
      qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', 'src.raw', 'image');
      const b = Buffer.alloc(8);
      b.writeBigUInt64BE(BigInt(2 * MiB - 1000));
      const buf = readFileSync(join(d, 'image'));
      b.copy(buf, 24);
      writeFileSync(join(d, 'image'), buf);
    });
    expect(img.ref.virtualSizeBytes).toBe(2 * MiB - 1024);
    await expectServedLikeQemu(img, 'qcow2-odd');
  });

  it('a qcow2 of 3 MiB + 512 bytes whose last block is partly image data', async () => {
    const img = await makeImage('qcow2-512', 'qcow2', (d) => {
      qemuImg(d, 'create', '-f', 'qcow2', '-o', 'cluster_size=4k', 'image', String(3 * MiB + 512));
      qemuIo(join(d, 'image'), 'qcow2', 'write -P 0x71 0 64k', `write -P 0x72 ${3 * MiB - 4096} 4608`);
    });
    await expectServedLikeQemu(img, 'qcow2-512');
  });
});

describe('writing, zeroing, snapshots and rebuilds over a backing image', () => {
  let img: Image;

  beforeAll(async () => {
    // Compressed and plain clusters, zero clusters, and a hole, so every kind of image block
    // meets the operations below.
    img = await makeImage('ops', 'qcow2', (d) => {
      writeSource(join(d, 'src.raw'), 8 * MiB, 11);
      qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', 'src.raw', 'image');
      qemuIo(join(d, 'image'), 'qcow2', 'write -P 0x3c 2M 1M', 'write -z 5M 256k');
    });
  });

  it('writes on top (partial blocks copy the image up) and write-zeroes over image data read back as asked', async () => {
    const { engine, uri, size } = await serve(img, 'ops-write');
    try {
      const model = Buffer.alloc(size);
      img.want.copy(model);
      const cmds: string[] = [];
      const write = (off: number, len: number, byte: number): void => {
        cmds.push(`write -P ${byte} ${off} ${len}`);
        model.fill(byte, off, off + len);
      };
      const zero = (off: number, len: number, unmap: boolean): void => {
        cmds.push(`write -z ${unmap ? '-u ' : ''}${off} ${len}`);
        model.fill(0, off, off + len);
      };
      write(12345, 7000, 0xa1); // partial blocks over image data at both ends
      write(2 * MiB + 100, 100, 0xa2); // inside one block of image data
      write(8 * MiB - 2048, 4096, 0xa3); // across the end of the image
      zero(64 * KiB, 128 * KiB, true); // may trim: must not punch a hole that shows image bytes
      zero(1 * MiB + 1000, 70000, true); // unaligned, may trim
      zero(3 * MiB, 64 * KiB, false); // NO_HOLE
      zero(5 * MiB - 4096, 300 * KiB, true); // over data and the image's zero clusters
      const args = ['-f', 'raw'];
      for (const c of cmds) args.push('-c', c);
      await run('qemu-io', [...args, uri]);
      // qemu-io verifies what it reads: every range reads back as written or as zeros.
      const reads = ['-f', 'raw', '-c', `read -P 161 12345 7000`, '-c', `read -P 0 ${64 * KiB} ${128 * KiB}`, '-c', `read -P 0 ${MiB + 1000} 70000`];
      const r = await run('qemu-io', [...reads, uri]);
      expect(r.stdout).not.toMatch(/Pattern verification failed|error/i);
      expectSameBytes(await convertNbd(uri, 'ops-write'), model, 'volume after writes and write-zeroes');
      // Write-zeroes over image data next to data a snapshot (a lower layer) holds: neither
      // may be punched back to the image.
      await engine.write(6 * MiB + 512 * KiB, pattern(15, 64 * KiB));
      await engine.createSnapshot('below');
      await engine.writeZeroes(6 * MiB + 128 * KiB, 512 * KiB, { mayTrim: true });
      model.fill(0, 6 * MiB + 128 * KiB, 6 * MiB + 640 * KiB);
      expectSameBytes(await engine.read(6 * MiB, MiB), model.subarray(6 * MiB, 7 * MiB), 'zeroed around a lower layer');
      // Fast-only write-zeroes cannot zero image data without writing.
      expect(await codeOf(engine.writeZeroes(2 * MiB + 64 * KiB, 64 * KiB, { fastOnly: true }))).toBe('UNSUPPORTED');
      expectSameBytes(await engine.read(2 * MiB + 64 * KiB, 64 * KiB), model.subarray(2 * MiB + 64 * KiB, 2 * MiB + 128 * KiB), 'unchanged by a refused fast zero');
      // Past the image (and where it holds nothing) there is nothing to hide: fast works.
      await engine.writeZeroes(8 * MiB + 4096, 8192, { fastOnly: true });
      // A trim over image data: NBD lets a trimmed range read as anything; here it reads
      // through to the image again, and never as another volume's bytes.
      await engine.trim(6 * MiB, 64 * KiB);
      img.want.copy(model, 6 * MiB, 6 * MiB, 6 * MiB + 64 * KiB);
      expectSameBytes(await convertNbd(uri, 'ops-trim'), model, 'volume after the trim');
    } finally {
      await engine.close();
    }
  });

  it('a snapshot exports with the image data beneath it; later writes stay out', async () => {
    const { engine, uri } = await serve(img, 'ops-snap');
    try {
      await engine.write(4 * MiB + 100, pattern(5, 10000));
      await engine.writeZeroes(7 * MiB, 64 * KiB);
      const atSnapshot = await convertNbd(uri, 'ops-snap-before');
      await engine.createSnapshot('s1');
      await engine.write(0, pattern(6, 3 * MiB));
      const out = scratch.path('s1.raw');
      const res = await engine.exportSnapshot('s1', out);
      expectSameBytes(readFileSync(out), atSnapshot, 'exported snapshot');
      // Image data counts as copied data: the export does not leave it out.
      expect(res.copiedBytes).toBeGreaterThan(4 * MiB);
      // A clone into an engine over no image, and into one over the same image (where the
      // zero runs must be written as zeros over the image's data), reads the same.
      for (const over of [undefined, img]) {
        const dir = await newReplica(over, sizeOver(img));
        const clone = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'c0', path: dir }] });
        try {
          await engine.copySnapshotTo('s1', clone);
          const got = Buffer.alloc(clone.sizeBytes);
          for (let off = 0; off < got.length; off += MiB) (await clone.read(off, Math.min(MiB, got.length - off))).copy(got, off);
          expectSameBytes(got, atSnapshot, `clone of s1 ${over ? 'over the same image' : 'over no image'}`);
        } finally {
          await clone.close();
        }
      }
    } finally {
      await engine.close();
    }
  });

  it('a rebuild over the same image sends only what was written, never image data', async () => {
    const size = sizeOver(img);
    const r0 = await newReplica(img, size);
    const engine = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', path: r0 }] });
    let model: Buffer;
    try {
      const written = 3 * 64 * KiB;
      await engine.write(0, pattern(7, 64 * KiB));
      await engine.write(3 * MiB, pattern(8, 64 * KiB));
      await engine.write(7 * MiB, pattern(9, 64 * KiB));
      // A target over no image, or over another one, is refused before it changes.
      const bare = await newReplica(undefined, size);
      expect(await codeOf(engine.addReplica({ id: 'r1', path: bare }))).toBe('INVALID_ARGUMENT');
      const r1 = await newReplica(img, size);
      const res = await engine.addReplica({ id: 'r1', path: r1 });
      expect(res.sentBytes).toBe(written);
      model = Buffer.alloc(size);
      for (let off = 0; off < size; off += MiB) (await engine.read(off, Math.min(MiB, size - off))).copy(model, off);
      await engine.close();
      // The rebuilt replica alone (read directly: an engine never opens a minority of the
      // replicas) holds the whole volume, image data included.
      await withReplica(r1, async (alone) => {
        const got = Buffer.alloc(size);
        for (let off = 0; off < size; off += MiB) (await alone.read(off, Math.min(MiB, size - off))).copy(got, off);
        expectSameBytes(got, model, 'rebuilt replica');
        expect(got.subarray(MiB, 2 * MiB).equals(img.want.subarray(MiB, 2 * MiB))).toBe(true);
      });
      // Only the written blocks are in either replica's own files.
      const info = await addon().inspectReplica(r1);
      expect(info.allocatedBytes).toBeLessThan(written + 64 * KiB);
      await assertDirsIdentical([r0, r1]);
    } finally {
      await engine.close();
    }
  });
});

describe('a replica over a backing image on a replica server (replica protocol)', () => {
  it('serves the image, exports a snapshot with it, and rebuilds a local replica with only the written data', async () => {
    const img = await makeImage('remote', 'qcow2', (d) => {
      writeSource(join(d, 'src.raw'), 4 * MiB, 13);
      qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', '-o', 'cluster_size=4k', 'src.raw', 'image');
      qemuIo(join(d, 'image'), 'qcow2', 'write -z 1M 64k');
    });
    const size = sizeOver(img);
    const name = `r${seq++}`;
    await addon().createReplica(join(disk, 'replicas', name), size, { backingImage: img.ref });
    const server = await addon().startReplicaServer({ root: join(disk, 'replicas') });
    try {
      const engine = await LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', remote: { host: '127.0.0.1', port: server.port, name } }] });
      try {
        const model = Buffer.alloc(size);
        img.want.copy(model);
        const data = pattern(14, 10000);
        await engine.write(2 * MiB + 777, data);
        data.copy(model, 2 * MiB + 777);
        const got = Buffer.alloc(size);
        for (let off = 0; off < size; off += MiB) (await engine.read(off, Math.min(MiB, size - off))).copy(got, off);
        expectSameBytes(got, model, 'remote replica over the image');
        // Block status crosses the protocol too: the image's zero cluster is not data.
        const ext = await engine.blockStatus(MiB, 64 * KiB);
        expect(ext.every((e) => e.zero)).toBe(true);
        await engine.createSnapshot('s1');
        const out = scratch.path('remote-s1.raw');
        await engine.exportSnapshot('s1', out);
        expectSameBytes(readFileSync(out), model, 'snapshot exported from the remote replica');
        const local = await newReplica(img, size);
        const res = await engine.addReplica({ id: 'r1', path: local });
        // One 10,000-byte write touches 3 blocks; the image is never sent.
        expect(res.sentBytes).toBe(3 * BLOCK);
      } finally {
        await engine.close();
      }
    } finally {
      await server.close();
    }
  });
});

describe('refusals', () => {
  let img: Image;
  beforeAll(async () => {
    img = await makeImage('refuse', 'raw', (d) => writeSource(join(d, 'image'), MiB, 12));
  });

  it('a missing image file is NOT_FOUND naming the path, at create and at open', async () => {
    const missing = { ...img.ref, dir: 'no-such-image' };
    const dir = join(disk, 'replicas', `r${seq++}`);
    const err = await addon().createReplica(dir, 2 * MiB, { backingImage: missing }).then(
      () => undefined,
      (e: unknown) => e as { code: string; message: string },
    );
    expect(err?.code).toBe('NOT_FOUND');
    expect(err?.message).toContain(join(disk, 'backing-images', 'no-such-image', 'image'));

    const r = await newReplica(img, 2 * MiB);
    renameSync(img.path, `${img.path}.away`);
    try {
      const e2 = await addon().openReplica(r).then(
        () => undefined,
        (e: unknown) => e as { code: string; message: string },
      );
      expect(e2?.code).toBe('NOT_FOUND');
      expect(e2?.message).toContain(img.path);
      expect(await codeOf(LocalEngine.open({ epoch: nextEpoch(), replicas: [{ id: 'r0', path: r }] }))).toBe('NOT_FOUND');
    } finally {
      renameSync(`${img.path}.away`, img.path);
    }
    await withReplica(r, async (rep) => expect((await rep.read(0, 4096)).equals(img.want.subarray(0, 4096))).toBe(true));
  });

  it('a virtual size that differs from the image: INVALID_ARGUMENT at create, CORRUPT_METADATA at open', async () => {
    const dir = join(disk, 'replicas', `r${seq++}`);
    expect(await codeOf(addon().createReplica(dir, 2 * MiB, { backingImage: { ...img.ref, virtualSizeBytes: 2 * MiB } }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().createReplica(dir, 2 * MiB, { backingImage: { ...img.ref, format: 'qcow2' } }))).toBe('CORRUPT_METADATA');
    expect(await codeOf(addon().createReplica(dir, 512 * KiB, { backingImage: img.ref }))).toBe('INVALID_ARGUMENT');
    const r = await newReplica(img, 2 * MiB);
    const meta = JSON.parse(readFileSync(join(r, 'replica.json'), 'utf8')) as Record<string, unknown>;
    writeFileSync(join(r, 'replica.json'), JSON.stringify({ ...meta, backingImage: { ...img.ref, virtualSizeBytes: MiB - 512 } }));
    expect(await codeOf(addon().openReplica(r))).toBe('CORRUPT_METADATA');
  });

  it("the reader's own refusals keep their codes: a qcow2 marked corrupt, a FIFO in the image's place", async () => {
    const q = await makeImage('refuse-q', 'qcow2', (d) => qemuImg(d, 'create', '-f', 'qcow2', 'image', '1M'));
    const r = await newReplica(q, MiB);
    // The copy in madeHashes must stay intact: damage a copy swapped in, then swap back.
    const saved = readFileSync(q.path);
    const damaged = Buffer.from(saved);
    damaged.writeBigUInt64BE(damaged.readBigUInt64BE(72) | 2n, 72); // incompatible feature bit 1: corrupt
    try {
      writeFileSync(q.path, damaged);
      expect(await codeOf(addon().openReplica(r))).toBe('CORRUPT_METADATA');
      rmSync(q.path);
      execFileSync('mkfifo', [q.path]);
      expect(await codeOf(addon().openReplica(r))).toBe('UNSUPPORTED');
    } finally {
      rmSync(q.path, { force: true });
      writeFileSync(q.path, saved);
    }
    await withReplica(r, async (rep) => expect(rep.sizeBytes).toBe(MiB));
  });

  it('a damaged cluster of the image fails reads and copy-up writes there with CORRUPT_METADATA and drops no replica', async () => {
    const img = await makeImage('refuse-l2', 'qcow2', (d) => {
      qemuImg(d, 'create', '-f', 'qcow2', '-o', 'cluster_size=64k', 'image', '1M');
      qemuIo(join(d, 'image'), 'qcow2', 'write -P 0x11 0 128k');
      // Point the L2 entry of cluster 1 far past the end of the file (the image opens: L2
      // entries are checked where they are used).
      const buf = readFileSync(join(d, 'image'));
      const l1 = Number(buf.readBigUInt64BE(40));
      const l2 = Number(buf.readBigUInt64BE(l1) & 0x00fffffffffffe00n);
      buf.writeBigUInt64BE((1n << 63n) | BigInt(1024 * MiB), l2 + 8);
      writeFileSync(join(d, 'image'), buf);
    });
    const dirs = [await newReplica(img, MiB), await newReplica(img, MiB)];
    const engine = await LocalEngine.open({ epoch: nextEpoch(), replicas: dirs.map((path, i) => ({ id: `r${i}`, path })) });
    try {
      expect((await engine.read(0, 4096)).every((b) => b === 0x11)).toBe(true);
      for (let i = 0; i < 3; i++) expect(await codeOf(engine.read(64 * KiB, 4096))).toBe('CORRUPT_METADATA');
      expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW']);
      // A partial-block write there must copy the block up through the image: it fails alike
      // on both replicas, which stay RW (equal: both stopped at the same block).
      expect(await codeOf(engine.write(64 * KiB + 100, Buffer.alloc(512, 0x22)))).toBe('CORRUPT_METADATA');
      expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW']);
      // A whole-block write needs no copy-up: it lands, and reads back, above the bad cluster.
      await engine.write(64 * KiB, Buffer.alloc(4096, 0x33));
      expect((await engine.read(64 * KiB, 4096)).every((b) => b === 0x33)).toBe(true);
      expect(engine.replicas().map((r) => r.mode)).toEqual(['RW', 'RW']);
      expect((await engine.read(128 * KiB, 4096)).every((b) => b === 0)).toBe(true);
    } finally {
      await engine.close();
    }
  });

  it('hostile backingImage values in replica.json are CORRUPT_METADATA at open and inspect', async () => {
    const r = await newReplica(img, 2 * MiB);
    const meta = JSON.parse(readFileSync(join(r, 'replica.json'), 'utf8')) as Record<string, unknown>;
    expect(meta['backingImage']).toEqual(img.ref);
    const ok = img.ref;
    const bad: unknown[] = [
      null,
      'refuse',
      [],
      {},
      { ...ok, dir: '..' },
      { ...ok, dir: '.' },
      { ...ok, dir: '' },
      { ...ok, dir: '../refuse' },
      { ...ok, dir: 'a/b' },
      { ...ok, dir: '/etc' },
      { ...ok, dir: 'x'.repeat(128) },
      { ...ok, dir: 'caf\u00e9' },
      { ...ok, dir: 7 },
      { ...ok, format: 'vmdk' },
      { ...ok, format: 'auto' },
      { ...ok, format: 'RAW' },
      { ...ok, virtualSizeBytes: 0 },
      { ...ok, virtualSizeBytes: 1000 },
      { ...ok, virtualSizeBytes: -512 },
      { ...ok, virtualSizeBytes: 4 * MiB },
      { ...ok, virtualSizeBytes: '1048576' },
      { ...ok, virtualSizeBytes: 1048576.5 },
      { dir: ok.dir, format: ok.format },
    ];
    for (const value of bad) {
      writeFileSync(join(r, 'replica.json'), JSON.stringify({ ...meta, backingImage: value }));
      expect(await codeOf(addon().openReplica(r)), `open with backingImage ${JSON.stringify(value)}`).toBe('CORRUPT_METADATA');
      expect(await codeOf(addon().inspectReplica(r)), `inspect with backingImage ${JSON.stringify(value)}`).toBe('CORRUPT_METADATA');
    }
    // Without the key, an old replica opens unchanged (and reads zeros, no image).
    const { backingImage: _drop, ...old } = meta;
    writeFileSync(join(r, 'replica.json'), JSON.stringify(old));
    expect((await addon().inspectReplica(r)).backingImage).toBeNull();
    await withReplica(r, async (rep) => expect((await rep.read(0, 4096)).every((b) => b === 0)).toBe(true));
  });

  it('INVALID_ARGUMENT for bad create options', async () => {
    const dir = join(disk, 'replicas', `r${seq++}`);
    for (const backingImage of [
      { ...img.ref, dir: '../x' },
      { ...img.ref, format: 'vmdk' },
      { ...img.ref, virtualSizeBytes: 100 },
    ]) {
      expect(await codeOf(addon().createReplica(dir, 2 * MiB, { backingImage: backingImage as NativeReplicaBackingImage }))).toBe('INVALID_ARGUMENT');
    }
    expect(await codeOf(addon().createReplica(dir, 2 * MiB, { backingImage: 'x' as unknown as NativeReplicaBackingImage }))).toBe('INVALID_ARGUMENT');
  });
});

describe('the image files', () => {
  it('are byte for byte unchanged after everything above (SHA-512)', () => {
    expect(madeHashes.size).toBeGreaterThan(15);
    for (const [path, hash] of madeHashes) expect(sha512(path), path).toBe(hash);
  });
});
