// The native image reader against real qemu-img / qemu-io: for every variant the reader
// supports, reading through openImage equals `qemu-img convert -O raw` byte for byte, and
// block status agrees with `qemu-img map`.
import { openSync, closeSync, writeSync, writeFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { openImage } from '../../src/image/image-reader.js';
import { KiB, MiB, Scratch, pattern } from './helpers.js';
import { expectLikeQemu, expectSameBytes, qcow2Check, qcow2Variant, qemuImg, qemuIo, writeSource } from './image-helpers.js';

let scratch: Scratch;
let seq = 0;

beforeAll(() => {
  scratch = new Scratch('mooring-image-');
});
afterAll(() => scratch.cleanup());

/** A fresh directory for one case. */
function caseDir(): string {
  return scratch.dir(`c${seq++}`);
}

/** Overwrites the qcow2 header's 64-bit virtual size. */
function patchSize(path: string, size: number): void {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(size));
  const fd = openSync(path, 'r+');
  writeSync(fd, b, 0, 8, 24);
  closeSync(fd);
}

/** Writes over a qcow2 image that land in the middle of clusters, zero and discard ranges. */
const OVERWRITES = [
  'write -P 0x5a 12345 70000',
  'write -P 0x6b 1048064 1024',
  'write -z 2M 128k',
  'write -z -u 3M 64k',
  'discard 4M 64k',
];

describe('qcow2 read through openImage equals qemu-img convert, block status equals qemu-img map', () => {
  it('v2 (compat=0.10), 64 KiB clusters', async () => {
    const d = caseDir();
    writeSource(join(d, 'src.raw'), 6 * MiB, 1);
    qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', '-o', 'compat=0.10', 'src.raw', 'v2.qcow2');
    qemuIo(join(d, 'v2.qcow2'), 'qcow2', 'write -P 0x5a 12345 70000', 'write -z 2M 128k');
    expect(qcow2Variant(join(d, 'v2.qcow2'))).toMatchObject({ version: 2, clusterBits: 16 });
    await expectLikeQemu(join(d, 'v2.qcow2'), 'qcow2', join(d, 'ref.raw'));
  });

  for (const cluster of ['512', '4k', '64k', '2M']) {
    it(`v3, ${cluster} clusters, with partial writes, zero clusters (write -z, write -z -u) and discard`, async () => {
      const d = caseDir();
      writeSource(join(d, 'src.raw'), 6 * MiB, 2);
      qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', '-o', `cluster_size=${cluster}`, 'src.raw', 'img.qcow2');
      qemuIo(join(d, 'img.qcow2'), 'qcow2', ...OVERWRITES);
      const bits = { '512': 9, '4k': 12, '64k': 16, '2M': 21 }[cluster];
      expect(qcow2Variant(join(d, 'img.qcow2'))).toMatchObject({ version: 3, clusterBits: bits, incompatible: 0 });
      await expectLikeQemu(join(d, 'img.qcow2'), 'qcow2', join(d, 'ref.raw'));
    });
  }

  for (const [type, cluster] of [
    ['zlib', '64k'],
    ['zlib', '4k'],
    ['zstd', '64k'],
    ['zstd', '512'],
  ] as const) {
    it(`${type}-compressed clusters (${cluster} clusters, qemu-img convert -c), partly overwritten`, async () => {
      const d = caseDir();
      writeSource(join(d, 'src.raw'), 5 * MiB, 3);
      qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', '-o', `compression_type=${type},cluster_size=${cluster}`, 'src.raw', 'c.qcow2');
      // Some clusters of the source are random (stored uncompressed), others compress.
      // Compressed writes need unallocated clusters: 1088k starts a hole of the source.
      qemuIo(join(d, 'c.qcow2'), 'qcow2', 'write -P 0x77 200000 5000', 'write -c -P 0x12 1088k 64k');
      expect(qcow2Variant(join(d, 'c.qcow2')).compressionType, 'compression_type field').toBe(type === 'zstd' ? 1 : 0);
      expect(qcow2Check(join(d, 'c.qcow2')).compressedClusters, 'compressed clusters').toBeGreaterThan(8);
      await expectLikeQemu(join(d, 'c.qcow2'), 'qcow2', join(d, 'ref.raw'));
    });
  }

  it('extended L2 entries: subcluster writes and zero subclusters over a backing file', async () => {
    const d = caseDir();
    writeSource(join(d, 'base.raw'), 4 * MiB, 4);
    qemuImg(d, 'create', '-f', 'qcow2', '-o', 'extended_l2=on,cluster_size=64k', '-b', 'base.raw', '-F', 'raw', 'ext.qcow2', '4M');
    qemuIo(
      join(d, 'ext.qcow2'),
      'qcow2',
      'write -P 0x11 4k 4k', // subclusters 2-3 of cluster 0: the rest falls through to base.raw
      'write -P 0x22 130k 1k', // inside one 2 KiB subcluster of cluster 2
      'write -z 200k 6k', // zero subclusters over backing data
      'write -P 0x33 1M 64k', // a whole cluster
      'write -z 2M 64k',
      'write -P 0x44 3M 10k',
      'discard 3M 4k',
    );
    expect(qcow2Variant(join(d, 'ext.qcow2')).incompatible & 16, 'extended L2 bit').toBe(16);
    await expectLikeQemu(join(d, 'ext.qcow2'), 'qcow2', join(d, 'ref.raw'));
  });

  it('extended L2 entries without a backing file (16 KiB clusters, the smallest allowed)', async () => {
    const d = caseDir();
    writeSource(join(d, 'src.raw'), 3 * MiB, 5);
    qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', '-o', 'extended_l2=on,cluster_size=16k', 'src.raw', 'ext.qcow2');
    qemuIo(join(d, 'ext.qcow2'), 'qcow2', 'write -P 0x55 1000 3000', 'write -z 100k 1k', 'write -z 1M 64k');
    expect(qcow2Variant(join(d, 'ext.qcow2'))).toMatchObject({ clusterBits: 14, incompatible: 16 });
    await expectLikeQemu(join(d, 'ext.qcow2'), 'qcow2', join(d, 'ref.raw'));
  });

  it('a backing chain of 3 (qcow2 on qcow2 on a raw file whose size is not a multiple of 512), growing sizes', async () => {
    const d = caseDir();
    writeSource(join(d, 'base.raw'), 3 * MiB + 1000, 6);
    qemuImg(d, 'create', '-f', 'qcow2', '-b', 'base.raw', '-F', 'raw', 'mid.qcow2', '4M');
    qemuIo(join(d, 'mid.qcow2'), 'qcow2', 'write -P 0x21 64k 100k', 'write -z 1M 64k', 'write -P 0x22 3670016 4096');
    qemuImg(d, 'create', '-f', 'qcow2', '-o', 'cluster_size=4k', '-b', 'mid.qcow2', '-F', 'qcow2', 'top.qcow2', '5M');
    qemuIo(join(d, 'top.qcow2'), 'qcow2', 'write -P 0x31 100k 8k', 'write -z 0 4k', 'write -P 0x32 4718592 4096');
    const chain = await expectLikeQemu(join(d, 'top.qcow2'), 'qcow2', join(d, 'ref.raw'));
    expect(chain.map((l) => [l.path.split('/').pop(), l.format, l.sizeBytes])).toEqual([
      ['top.qcow2', 'qcow2', 5 * MiB],
      ['mid.qcow2', 'qcow2', 4 * MiB],
      ['base.raw', 'raw', 3 * MiB + 1024],
    ]);
  });

  it('backing files in a subdirectory, named relative to the image that names them', async () => {
    const d = caseDir();
    scratch.dir(`c${seq - 1}`, 'layers');
    writeSource(join(d, 'layers', 'base.raw'), MiB, 7);
    qemuImg(join(d, 'layers'), 'create', '-f', 'qcow2', '-b', 'base.raw', '-F', 'raw', 'mid.qcow2', '1M');
    qemuIo(join(d, 'layers', 'mid.qcow2'), 'qcow2', 'write -P 0x41 0 4k');
    qemuImg(d, 'create', '-f', 'qcow2', '-b', 'layers/mid.qcow2', '-F', 'qcow2', 'top.qcow2', '1M');
    qemuIo(join(d, 'top.qcow2'), 'qcow2', 'write -P 0x42 64k 4k');
    const chain = await expectLikeQemu(join(d, 'top.qcow2'), 'qcow2', join(d, 'ref.raw'));
    expect(chain.map((l) => l.path.slice(d.length + 1))).toEqual(['top.qcow2', 'layers/mid.qcow2', 'layers/base.raw']);
  });

  for (const raw of ['on', 'off']) {
    it(`external data file (data_file_raw=${raw})`, async () => {
      const d = caseDir();
      qemuImg(d, 'create', '-f', 'qcow2', '-o', `data_file=data.raw,data_file_raw=${raw}`, 'ext.qcow2', '3M');
      qemuIo(join(d, 'ext.qcow2'), 'qcow2', 'write -P 0x61 0 100k', 'write -P 0x62 1M 5000', 'write -z 1M 4k', 'write -P 0x63 2M 64k');
      expect(qcow2Variant(join(d, 'ext.qcow2')).incompatible & 4, 'external data file bit').toBe(4);
      const chain = await expectLikeQemu(join(d, 'ext.qcow2'), 'qcow2', join(d, 'ref.raw'));
      expect(chain[0]!.dataFile).toBe(join(d, 'data.raw'));
    });
  }

  it('a qcow2 whose virtual size is not a multiple of 512 reads like QEMU (rounded down to 512)', async () => {
    const d = caseDir();
    writeSource(join(d, 'src.raw'), MiB, 8);
    qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', 'src.raw', 'odd.qcow2');
    patchSize(join(d, 'odd.qcow2'), MiB - 1000);
    await expectLikeQemu(join(d, 'odd.qcow2'), 'qcow2', join(d, 'ref.raw'));
  });

  it('a dirty image (lazy refcounts left unflushed) is read: refcounts do not matter for reads', async () => {
    const d = caseDir();
    writeSource(join(d, 'src.raw'), MiB, 9);
    qemuImg(d, 'convert', '-f', 'raw', '-O', 'qcow2', 'src.raw', 'dirty.qcow2');
    const h = readFileSync(join(d, 'dirty.qcow2'));
    h[79] = h[79]! | 1; // incompatible_features bit 0
    writeFileSync(join(d, 'dirty.qcow2'), h);
    const chain = await expectLikeQemu(join(d, 'dirty.qcow2'), 'qcow2', join(d, 'ref.raw'));
    expect(chain[0]!.dirty).toBe(true);
  });
});

describe('raw images', () => {
  for (const size of [1000, 4097, 3 * MiB + 123, 2 * MiB]) {
    it(`a raw file of ${size} bytes (sparse in places) reads like QEMU: size rounded up to 512, zeros past the end`, async () => {
      const d = caseDir();
      writeSource(join(d, 'img.raw'), size, 10);
      await expectLikeQemu(join(d, 'img.raw'), 'raw', join(d, 'ref.raw'));
      const img = await openImage(join(d, 'img.raw'));
      expect(img.sizeBytes).toBe(Math.ceil(size / 512) * 512);
      const tail = img.sizeBytes - size;
      if (tail > 0) {
        const ext = await img.blockStatus(size, tail);
        expect(ext).toEqual([{ offset: size, length: tail, hole: true, zero: true }]);
      }
      await img.close();
    });
  }

  it("format 'raw' reads a qcow2 file as its bytes", async () => {
    const d = caseDir();
    qemuImg(d, 'create', '-f', 'qcow2', 'q.qcow2', '1M');
    const bytes = readFileSync(join(d, 'q.qcow2'));
    const img = await openImage(join(d, 'q.qcow2'), { format: 'raw' });
    expect(img.format).toBe('raw');
    expect(img.sizeBytes).toBe(Math.ceil(bytes.length / 512) * 512);
    expectSameBytes(await img.read(0, bytes.length), bytes, 'raw view of a qcow2 file');
    await img.close();
  });
});

describe('lifecycle and concurrency', () => {
  it('concurrent reads of a compressed chain agree with qemu-img; close waits and later calls reject CLOSED', async () => {
    const d = caseDir();
    writeSource(join(d, 'base.raw'), 4 * MiB, 11);
    qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', 'base.raw', 'base.qcow2');
    expect(qcow2Check(join(d, 'base.qcow2')).compressedClusters).toBeGreaterThan(8);
    qemuImg(d, 'create', '-f', 'qcow2', '-b', 'base.qcow2', '-F', 'qcow2', 'top.qcow2', '4M');
    qemuIo(join(d, 'top.qcow2'), 'qcow2', 'write -P 0x99 300k 200k');
    qemuImg(d, 'convert', '-O', 'raw', 'top.qcow2', 'ref.raw');
    const want = readFileSync(join(d, 'ref.raw'));
    const img = await openImage(join(d, 'top.qcow2'));
    const reads = Array.from({ length: 64 }, (_, i) => {
      const off = (i * 61 * KiB + i * 7) % (want.length - 128 * KiB);
      return img.read(off, 100 * KiB + i).then((b) => expectSameBytes(b, want.subarray(off, off + 100 * KiB + i), `read ${i}`));
    });
    const closing = Promise.all(reads).then(() => img.close());
    await closing;
    await expect(img.read(0, 4096)).rejects.toMatchObject({ code: 'CLOSED' });
    await expect(img.blockStatus(0, 4096)).rejects.toMatchObject({ code: 'CLOSED' });
    await img.close(); // idempotent
  });

  it('argument checks: OUT_OF_RANGE past the end, INVALID_ARGUMENT for bad lengths and formats', async () => {
    const d = caseDir();
    writeFileSync(join(d, 'r.raw'), pattern(12, 8192));
    const img = await openImage(join(d, 'r.raw'));
    await expect(img.read(8192, 1)).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
    await expect(img.read(0, 0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(img.read(0, 64 * MiB)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(img.blockStatus(4096, 8192)).rejects.toMatchObject({ code: 'OUT_OF_RANGE' });
    await img.close();
    await expect(openImage(join(d, 'r.raw'), { format: 'vmdk' as 'raw' })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(openImage(join(d, 'missing.raw'))).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(openImage(d)).rejects.toMatchObject({ code: 'UNSUPPORTED' });
  });
});
