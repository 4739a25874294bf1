// Hostile images: headers and tables built or damaged by hand, loops, bombs, names that try
// to leave the directory. Each one must end in a coded error (never a crash, never a hang),
// and the reader must say which code.
import { execFileSync, spawnSync } from 'node:child_process';
import { closeSync, openSync, readFileSync, statSync, symlinkSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { deflateRawSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { openImage } from '../../src/image/image-reader.js';
import { findPackageRoot } from '../../src/native/load.js';
import { KiB, MiB, Scratch } from './helpers.js';
import { qemuImg, qemuIo, writeSource } from './image-helpers.js';

let scratch: Scratch;
let seq = 0;

beforeAll(() => {
  scratch = new Scratch('mooring-image-hostile-');
});
afterAll(() => scratch.cleanup());

function caseDir(): string {
  return scratch.dir(`h${seq++}`);
}

function patch(path: string, offset: number, bytes: Buffer): void {
  const fd = openSync(path, 'r+');
  try {
    writeSync(fd, bytes, 0, bytes.length, offset);
  } finally {
    closeSync(fd);
  }
}

/** qemu-img creations of a LUKS image tried before its CPU-timing failure counts (see the test). */
const LUKS_CREATE_ATTEMPTS = 5;

const be32 = (v: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0);
  return b;
};
const be64 = (v: bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(v);
  return b;
};

interface Layout {
  clusterBits: number;
  l1Offset: number;
  extendedL2: boolean;
}
function layout(path: string): Layout {
  const h = readFileSync(path).subarray(0, 112);
  const version = h.readUInt32BE(4);
  return {
    clusterBits: h.readUInt32BE(20),
    l1Offset: Number(h.readBigUInt64BE(40)),
    extendedL2: version >= 3 && (h.readBigUInt64BE(72) & 16n) !== 0n,
  };
}
/** File offset of the L2 entry that maps guest offset `guest` (its L2 table must exist). */
function l2EntryAt(path: string, guest: number): number {
  const { clusterBits, l1Offset, extendedL2 } = layout(path);
  const entryBytes = extendedL2 ? 16 : 8;
  const l2Bits = clusterBits - Math.log2(entryBytes);
  const file = readFileSync(path);
  const l1Index = Math.floor(guest / 2 ** (clusterBits + l2Bits));
  const l2 = Number(file.readBigUInt64BE(l1Offset + l1Index * 8) & 0x00fffffffffffe00n);
  expect(l2, 'an L2 table maps this offset').toBeGreaterThan(0);
  return l2 + (Math.floor(guest / 2 ** clusterBits) % 2 ** l2Bits) * entryBytes;
}
function readEntry(path: string, at: number): bigint {
  return readFileSync(path).readBigUInt64BE(at);
}

/** A small valid qcow2 with data in its first clusters. */
function dataImage(d: string, name: string, options = 'cluster_size=64k', size = '4M'): string {
  qemuImg(d, 'create', '-f', 'qcow2', '-o', options, name, size);
  qemuIo(join(d, name), 'qcow2', 'write -P 0x11 0 128k');
  return join(d, name);
}

/** The code openImage + a read of the whole first MiB + block status ends with. */
async function outcome(path: string, format: 'auto' | 'raw' | 'qcow2' = 'auto'): Promise<{ code: string; message: string }> {
  try {
    const img = await openImage(path, { format });
    try {
      await img.blockStatus(0, img.sizeBytes);
      await img.read(0, Math.min(MiB, img.sizeBytes));
      return { code: 'OK', message: '' };
    } finally {
      await img.close();
    }
  } catch (err) {
    const e = err as { code?: string; message?: string };
    return { code: String(e.code), message: String(e.message) };
  }
}

describe('hostile headers', () => {
  it('L1 table beyond the end of the file', async () => {
    const p = dataImage(caseDir(), 'a.qcow2');
    patch(p, 40, be64(1n << 40n));
    expect(await outcome(p)).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('L1 table') });
  });

  it('huge l1_size (2^32 - 1 entries), and an L1 table too small for the virtual size', async () => {
    const d = caseDir();
    const p = dataImage(d, 'a.qcow2');
    patch(p, 36, be32(0xffffffff));
    expect((await outcome(p)).code).toBe('CORRUPT_METADATA');
    const q = dataImage(d, 'b.qcow2');
    patch(q, 36, be32(0));
    expect(await outcome(q)).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('too small') });
  });

  for (const [bits, code] of [
    [8, 'CORRUPT_METADATA'],
    [0, 'CORRUPT_METADATA'],
    [64, 'CORRUPT_METADATA'],
    [0xffffffff, 'CORRUPT_METADATA'],
    [22, 'UNSUPPORTED'],
    [30, 'UNSUPPORTED'],
  ] as const) {
    it(`cluster_bits ${bits} -> ${code}`, async () => {
      const p = dataImage(caseDir(), 'a.qcow2');
      patch(p, 20, be32(bits));
      expect((await outcome(p)).code).toBe(code);
    });
  }

  it('encryption: a real LUKS image, and crypt_method 1 (AES) patched in', async () => {
    const d = caseDir();
    // qemu-img times PBKDF iterations by the thread's CPU clock to honour iter-time; on a busy
    // shared machine that measurement sometimes fails ("Unable to get accurate CPU usage")
    // before any image exists. Only that tool error is tried again; the reader is not involved.
    for (let attempt = 1; ; attempt++) {
      try {
        qemuImg(d, 'create', '--object', 'secret,id=s0,data=hunter2', '-f', 'qcow2', '-o', 'encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10', 'luks.qcow2', '1M');
        break;
      } catch (err) {
        if (attempt >= LUKS_CREATE_ATTEMPTS || !/Unable to get accurate CPU usage/.test(String(err))) throw err;
      }
    }
    expect(await outcome(join(d, 'luks.qcow2'))).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining('encrypted') });
    const p = dataImage(d, 'aes.qcow2');
    patch(p, 32, be32(1));
    expect(await outcome(p)).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining('AES') });
  });

  it('unknown incompatible feature bits are refused; the corrupt bit is CORRUPT_METADATA', async () => {
    const d = caseDir();
    const p = dataImage(d, 'a.qcow2');
    patch(p, 72, be64(1n << 20n));
    expect(await outcome(p)).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining('bit 20') });
    const q = dataImage(d, 'b.qcow2');
    patch(q, 72, be64(1n << 63n));
    expect((await outcome(q)).code).toBe('UNSUPPORTED');
    const r = dataImage(d, 'c.qcow2');
    patch(r, 72, be64(2n));
    expect(await outcome(r)).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('marked corrupt') });
  });

  it('version 1 and 4, a bad header_length, an unknown compression type, a huge virtual size, a truncated header', async () => {
    const d = caseDir();
    const v1 = dataImage(d, 'v1.qcow2');
    patch(v1, 4, be32(1));
    expect((await outcome(v1)).code).toBe('UNSUPPORTED');
    const v4 = dataImage(d, 'v4.qcow2');
    patch(v4, 4, be32(4));
    expect((await outcome(v4)).code).toBe('UNSUPPORTED');
    const hl = dataImage(d, 'hl.qcow2');
    patch(hl, 100, be32(100003));
    expect((await outcome(hl)).code).toBe('CORRUPT_METADATA');
    const ct = dataImage(d, 'ct.qcow2');
    patch(ct, 72, be64(8n));
    patch(ct, 104, Buffer.from([7]));
    expect((await outcome(ct)).code).toBe('UNSUPPORTED');
    const big = dataImage(d, 'big.qcow2');
    patch(big, 24, be64(1n << 60n));
    expect((await outcome(big)).code).toBe('UNSUPPORTED');
    const t = join(d, 'short.qcow2');
    writeFileSync(t, readFileSync(dataImage(d, 'full.qcow2')).subarray(0, 50));
    expect((await outcome(t)).code).toBe('CORRUPT_METADATA');
    expect((await outcome(t, 'qcow2')).code).toBe('CORRUPT_METADATA');
    const notQcow = join(d, 'random.bin');
    writeFileSync(notQcow, Buffer.alloc(4096, 0x5a));
    expect((await outcome(notQcow, 'qcow2')).code).toBe('CORRUPT_METADATA');
  });

  it('foreign formats are refused by auto and read as bytes with format raw', async () => {
    const d = caseDir();
    qemuImg(d, 'create', '-f', 'vmdk', 'disk.vmdk', '1M');
    expect(await outcome(join(d, 'disk.vmdk'))).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining('VMDK') });
    expect((await outcome(join(d, 'disk.vmdk'), 'raw')).code).toBe('OK');
    qemuImg(d, 'create', '-f', 'vpc', 'disk.vhd', '1M');
    expect((await outcome(join(d, 'disk.vhd'))).code).toBe('UNSUPPORTED');
  });
});

describe('hostile tables', () => {
  it('an L2 entry pointing beyond the end of the file: read and block status fail, other clusters still read', async () => {
    const p = dataImage(caseDir(), 'a.qcow2');
    const at = l2EntryAt(p, 64 * KiB);
    patch(p, at, be64((1n << 63n) | (1n << 45n)));
    const img = await openImage(p);
    await expect(img.read(64 * KiB, 4096)).rejects.toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('beyond the end') });
    await expect(img.blockStatus(64 * KiB, 4096)).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
    expect((await img.read(0, 4096)).every((b) => b === 0x11)).toBe(true);
    await img.close();
  });

  it('data clusters and L2 tables overlapping metadata (header, L1 table, another L2 table)', async () => {
    const d = caseDir();
    const p = dataImage(d, 'a.qcow2');
    const { l1Offset } = layout(p);
    patch(p, l2EntryAt(p, 0), be64((1n << 63n) | BigInt(l1Offset)));
    expect(await outcome(p)).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('overlaps') });

    const q = dataImage(d, 'b.qcow2');
    const l2 = readEntry(q, layout(q).l1Offset) & 0x00fffffffffffe00n;
    patch(q, l2EntryAt(q, 0), be64((1n << 63n) | l2)); // a data cluster that is the L2 table itself
    expect((await outcome(q)).code).toBe('CORRUPT_METADATA');

    const r = dataImage(d, 'c.qcow2');
    patch(r, layout(r).l1Offset, be64((1n << 63n) | BigInt(layout(r).l1Offset))); // L2 table = the L1 table
    expect((await outcome(r)).code).toBe('CORRUPT_METADATA');

    // Two L1 entries sharing one L2 table (512 B clusters: one L1 entry maps 32 KiB).
    const s = join(d, 's.qcow2');
    qemuImg(d, 'create', '-f', 'qcow2', '-o', 'cluster_size=512', 's.qcow2', '1M');
    qemuIo(s, 'qcow2', 'write -P 1 0 512', 'write -P 2 64k 512');
    patch(s, layout(s).l1Offset + 8, be64(readEntry(s, layout(s).l1Offset)));
    expect(await outcome(s)).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('same L2 table') });
  });

  it('an unaligned L2 entry, a zero flag in a version 2 image, a subcluster both allocated and zero', async () => {
    const d = caseDir();
    const p = dataImage(d, 'a.qcow2');
    const at = l2EntryAt(p, 0);
    patch(p, at, be64(readEntry(p, at) + 4096n));
    expect((await outcome(p)).code).toBe('CORRUPT_METADATA');

    const v2 = dataImage(d, 'v2.qcow2', 'compat=0.10');
    const at2 = l2EntryAt(v2, 0);
    patch(v2, at2, be64(readEntry(v2, at2) | 1n));
    expect(await outcome(v2)).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('version 2') });

    const ext = dataImage(d, 'ext.qcow2', 'extended_l2=on,cluster_size=64k');
    const at3 = l2EntryAt(ext, 0);
    patch(ext, at3 + 8, be64(0x00000001_00000001n));
    expect(await outcome(ext)).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('both allocated and zero') });
  });

  it('a compressed cluster whose size runs past the end of the file', async () => {
    const d = caseDir();
    writeSource(join(d, 'src.raw'), MiB, 21);
    qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', 'src.raw', 'c.qcow2');
    const p = join(d, 'c.qcow2');
    const at = l2EntryAt(p, 128 * KiB); // a constant-byte piece of the source: compressed
    const e = readEntry(p, at);
    expect(e & (1n << 62n), 'cluster is compressed').not.toBe(0n);
    // 64 KiB clusters: offset in bits 0..53, extra sectors in bits 54..61. All 255 extra
    // sectors from an offset near the end of the file.
    const size = BigInt(statSync(p).size);
    patch(p, at, be64((1n << 62n) | (255n << 54n) | (size - 100n)));
    const img = await openImage(p);
    await expect(img.read(128 * KiB, 4096)).rejects.toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('past the end') });
    await img.close();
  });

  it('decompression bombs: deflate and zstd streams that expand past the cluster are refused', async () => {
    const d = caseDir();
    writeSource(join(d, 'src.raw'), MiB, 22);
    // deflate: 32 MiB of zeros in ~32 KiB, appended and pointed to by a 64 KiB cluster.
    qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', 'src.raw', 'z.qcow2');
    const p = join(d, 'z.qcow2');
    const bomb = deflateRawSync(Buffer.alloc(32 * MiB));
    const end = Math.ceil(statSync(p).size / 512) * 512;
    patch(p, end, bomb);
    const sectors = BigInt(Math.ceil(bomb.length / 512) - 1);
    expect(sectors).toBeLessThan(256n);
    patch(p, l2EntryAt(p, 128 * KiB), be64((1n << 62n) | (sectors << 54n) | BigInt(end)));
    const img = await openImage(p);
    await expect(img.read(128 * KiB, 4096)).rejects.toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('more than the cluster size') });
    await img.close();

    // zstd: a 2 MiB cluster compressed by QEMU itself, pointed to by a 64 KiB cluster.
    writeFileSync(join(d, 'flat.raw'), Buffer.alloc(2 * MiB, 0x42));
    qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', '-o', 'compression_type=zstd,cluster_size=2M', 'flat.raw', 'big.qcow2');
    const big = join(d, 'big.qcow2');
    const be = readEntry(big, l2EntryAt(big, 0));
    expect(be & (1n << 62n), '2 MiB cluster is compressed').not.toBe(0n);
    const x = 62n - (21n - 8n);
    const host = Number(be & ((1n << x) - 1n));
    const len = Number((((be >> x) & ((1n << 13n) - 1n)) + 1n) * 512n) - (host % 512);
    const frame = readFileSync(big).subarray(host, host + len);
    qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', '-o', 'compression_type=zstd', 'src.raw', 'zs.qcow2');
    const q = join(d, 'zs.qcow2');
    const qend = Math.ceil(statSync(q).size / 512) * 512;
    patch(q, qend, frame);
    patch(q, l2EntryAt(q, 128 * KiB), be64((1n << 62n) | (BigInt(Math.ceil(frame.length / 512) - 1) << 54n) | BigInt(qend)));
    const zimg = await openImage(q);
    await expect(zimg.read(128 * KiB, 4096)).rejects.toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('zstd frame') });
    await zimg.close();
  });
});

describe('hostile chains and names', () => {
  it('backing loops (self, and a -> b -> a) are CORRUPT_METADATA; 16 images open, 17 do not', async () => {
    const d = caseDir();
    qemuImg(d, 'create', '-f', 'qcow2', 'self.qcow2', '1M');
    qemuImg(d, 'rebase', '-u', '-f', 'qcow2', '-b', 'self.qcow2', '-F', 'qcow2', 'self.qcow2');
    expect(await outcome(join(d, 'self.qcow2'))).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('loops') });

    qemuImg(d, 'create', '-f', 'qcow2', 'b.qcow2', '1M');
    qemuImg(d, 'create', '-f', 'qcow2', '-b', 'b.qcow2', '-F', 'qcow2', 'a.qcow2', '1M');
    qemuImg(d, 'rebase', '-u', '-f', 'qcow2', '-b', 'a.qcow2', '-F', 'qcow2', 'b.qcow2');
    expect(await outcome(join(d, 'a.qcow2'))).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('loops') });

    const deep = scratch.dir(`h${seq - 1}`, 'deep');
    writeFileSync(join(deep, 'l0.raw'), Buffer.alloc(64 * KiB, 7));
    for (let i = 1; i <= 16; i++) {
      const below = i === 1 ? ['-b', 'l0.raw', '-F', 'raw'] : ['-b', `l${i - 1}.qcow2`, '-F', 'qcow2'];
      qemuImg(deep, 'create', '-f', 'qcow2', ...below, `l${i}.qcow2`, '64K');
    }
    expect((await outcome(join(deep, 'l15.qcow2'))).code).toBe('OK'); // 16 images
    expect(await outcome(join(deep, 'l16.qcow2'))).toMatchObject({ code: 'CORRUPT_METADATA', message: expect.stringContaining('deeper than 16') });
  });

  it('names that leave the directory (absolute, .., a symlink out) are refused; a missing backing file is NOT_FOUND', async () => {
    const d = caseDir();
    const outside = scratch.dir('outside');
    writeFileSync(join(outside, 'secret.raw'), Buffer.alloc(4096, 0x53));
    qemuImg(d, 'create', '-f', 'qcow2', '-b', join(outside, 'secret.raw'), '-F', 'raw', 'abs.qcow2', '1M');
    expect(await outcome(join(d, 'abs.qcow2'))).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining('absolute') });
    qemuImg(d, 'create', '-f', 'qcow2', '-b', '../outside/secret.raw', '-F', 'raw', 'dotdot.qcow2', '1M');
    expect(await outcome(join(d, 'dotdot.qcow2'))).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining("'..'") });
    symlinkSync(join(outside, 'secret.raw'), join(d, 'link.raw'));
    qemuImg(d, 'create', '-f', 'qcow2', '-b', 'link.raw', '-F', 'raw', 'sym.qcow2', '1M');
    expect(await outcome(join(d, 'sym.qcow2'))).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining('outside') });
    qemuImg(d, 'create', '-f', 'qcow2', '-o', 'data_file=../outside/secret.raw', 'df.qcow2', '1M');
    expect((await outcome(join(d, 'df.qcow2'))).code).toBe('UNSUPPORTED');
    qemuImg(d, 'create', '-f', 'qcow2', '-b', 'gone.raw', '-F', 'raw', '-u', 'missing.qcow2', '1M');
    expect(await outcome(join(d, 'missing.qcow2'))).toMatchObject({ code: 'NOT_FOUND', message: expect.stringContaining('gone.raw') });
  });

  it('a backing file that is a FIFO does not hang the open; an unsupported backing format is refused', async () => {
    const d = caseDir();
    execFileSync('mkfifo', [join(d, 'pipe.raw')]);
    qemuImg(d, 'create', '-f', 'qcow2', '-b', 'pipe.raw', '-F', 'raw', '-u', 'fifo.qcow2', '1M');
    expect(await outcome(join(d, 'fifo.qcow2'))).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining('not a regular file') });
    qemuImg(d, 'create', '-f', 'vmdk', 'base.vmdk', '1M');
    qemuImg(d, 'create', '-f', 'qcow2', '-b', 'base.vmdk', '-F', 'vmdk', 'on-vmdk.qcow2', '1M');
    expect(await outcome(join(d, 'on-vmdk.qcow2'))).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringContaining('vmdk') });
  });

  it('a zstd image on a host without libzstd fails with UNSUPPORTED naming the package', () => {
    const d = caseDir();
    writeSource(join(d, 'src.raw'), MiB, 23);
    qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', '-o', 'compression_type=zstd', 'src.raw', 'z.qcow2');
    qemuImg(d, 'convert', '-c', '-f', 'raw', '-O', 'qcow2', 'src.raw', 'zlib.qcow2');
    // A separate process, so the library is looked up afresh with the override set.
    const script = `
      const load = require('node-gyp-build');
      const addon = load(${JSON.stringify(findPackageRoot())});
      (async () => {
        const out = {};
        for (const f of ['z.qcow2', 'zlib.qcow2']) {
          try { const img = await addon.openImage(f); await img.read(0, 65536); await img.close(); out[f] = 'OK'; }
          catch (e) { out[f] = e.code + ': ' + e.message; }
        }
        console.log(JSON.stringify(out));
      })();`;
    const r = spawnSync(process.execPath, ['-e', script], {
      cwd: d,
      env: { ...process.env, MOORING_ZSTD_LIBRARY: '/nonexistent/libzstd.so.1', NODE_PATH: join(findPackageRoot(), 'node_modules') },
      encoding: 'utf8',
    });
    expect(r.status, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as Record<string, string>;
    expect(out['z.qcow2']).toMatch(/^UNSUPPORTED: .*zstd.*libzstd1/);
    expect(out['zlib.qcow2']).toBe('OK');
  });
});
