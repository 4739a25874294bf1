// Helpers for the image reader tests: real qemu-img / qemu-io, byte-for-byte comparison
// with `qemu-img convert -O raw`, and block status compared with `qemu-img map`.
import { execFileSync } from 'node:child_process';
import { closeSync, ftruncateSync, openSync, readFileSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { expect } from 'vitest';

import type { Extent } from '../../src/engine/engine.js';
import { type ImageReader, openImage } from '../../src/image/image-reader.js';
import { KiB, MiB, pattern } from './helpers.js';

/** Runs qemu-img in the image's directory (so relative backing names resolve there too). */
export function qemuImg(cwd: string, ...args: string[]): string {
  return execFileSync('qemu-img', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

/** Runs qemu-io commands against an image. */
export function qemuIo(path: string, format: string, ...commands: string[]): void {
  const args = ['-f', format];
  for (const c of commands) args.push('-c', c);
  args.push(path);
  const out = execFileSync('qemu-io', args, { cwd: dirname(path), encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  // qemu-io reports a failed command on stdout and still exits 0.
  if (/error|failed|Cannot/i.test(out)) throw new Error(`qemu-io ${commands.join('; ')} on ${path}: ${out}`);
}

/** What `qemu-img check` counts in a qcow2 image (and proves it consistent). */
export function qcow2Check(path: string): { compressedClusters: number; allocatedClusters: number } {
  const r = JSON.parse(qemuImg(dirname(path), 'check', '--output=json', path)) as {
    'check-errors': number;
    'compressed-clusters'?: number;
    'allocated-clusters': number;
  };
  expect(r['check-errors'], `${path}: qemu-img check`).toBe(0);
  return { compressedClusters: r['compressed-clusters'] ?? 0, allocatedClusters: r['allocated-clusters'] };
}

/** The header fields that say which variant a qcow2 file is. */
export function qcow2Variant(path: string): { version: number; clusterBits: number; incompatible: number; compressionType: number } {
  const h = readFileSync(path).subarray(0, 112);
  const version = h.readUInt32BE(4);
  return {
    version,
    clusterBits: h.readUInt32BE(20),
    incompatible: version >= 3 ? Number(h.readBigUInt64BE(72)) : 0,
    compressionType: version >= 3 && h.readUInt32BE(100) > 104 ? h[104]! : 0,
  };
}

/**
 * A raw file with varied content, 64 KiB pieces in turn: random bytes, a hole, a constant
 * byte, half random and half zeros. Its length may be any number of bytes.
 */
export function writeSource(path: string, sizeBytes: number, seed: number): void {
  const fd = openSync(path, 'w');
  try {
    const piece = 64 * KiB;
    for (let i = 0, off = 0; off < sizeBytes; i++, off += piece) {
      const n = Math.min(piece, sizeBytes - off);
      const kind = i % 4;
      if (kind === 1) continue;
      let b: Buffer;
      if (kind === 0) b = pattern(seed * 1000 + i, n);
      else if (kind === 2) b = Buffer.alloc(n, 0x40 + (i % 64));
      else {
        b = Buffer.alloc(n);
        pattern(seed * 1000 + i, Math.floor(n / 2)).copy(b);
      }
      writeSync(fd, b, 0, n, off);
    }
    ftruncateSync(fd, sizeBytes);
  } finally {
    closeSync(fd);
  }
}

/** Throws naming the first differing byte (a multi-MiB toEqual diff is useless). */
export function expectSameBytes(actual: Buffer, expected: Buffer, what: string): void {
  expect(actual.length, `${what}: length`).toBe(expected.length);
  if (!actual.equals(expected)) {
    const at = actual.findIndex((b, i) => b !== expected[i]);
    throw new Error(`${what}: differs at byte ${at} (got ${actual[at]}, want ${expected[at]})`);
  }
}

/** The whole allocation map, asking again from where each answer ends. */
export async function wholeMap(img: ImageReader): Promise<Extent[]> {
  const out: Extent[] = [];
  let at = 0;
  while (at < img.sizeBytes) {
    const part = await img.blockStatus(at, img.sizeBytes - at);
    expect(part.length, `blockStatus at ${at} returned no extent`).toBeGreaterThan(0);
    for (const e of part) {
      expect(e.offset).toBe(at);
      at += e.length;
    }
    out.push(...part);
  }
  expect(at).toBe(img.sizeBytes);
  return out;
}

interface MapEntry {
  start: number;
  length: number;
  data: boolean;
  zero: boolean;
}

/**
 * Compares our allocation map with `qemu-img map --output=json` byte range by byte range:
 * data (neither hole nor zero) exactly where qemu-img says data, and our "reads as zero"
 * only where qemu-img says zero too.
 */
export function expectMapAgrees(ours: Extent[], path: string, format: string): void {
  const theirs = JSON.parse(qemuImg(dirname(path), 'map', '--output=json', '-f', format, path)) as MapEntry[];
  const end = theirs.reduce((n, e) => Math.max(n, e.start + e.length), 0);
  expect(ours.reduce((n, e) => n + e.length, 0), `${path}: mapped length`).toBe(end);
  let i = 0;
  let j = 0;
  let at = 0;
  while (at < end) {
    const a = ours[i]!;
    const b = theirs[j]!;
    const data = !a.hole && !a.zero;
    if (data !== b.data || (a.zero && !b.zero)) {
      throw new Error(
        `${path}: at ${at} we say ${JSON.stringify({ hole: a.hole, zero: a.zero })}, qemu-img map says ${JSON.stringify({ data: b.data, zero: b.zero })}`,
      );
    }
    const next = Math.min(a.offset + a.length, b.start + b.length);
    at = next;
    if (at === a.offset + a.length) i++;
    if (at === b.start + b.length) j++;
  }
}

/** Deterministic offsets and lengths (unaligned, crossing clusters) for spot reads. */
export function spotReads(sizeBytes: number, count: number, seed: number): Array<[number, number]> {
  const r = pattern(seed, count * 8);
  const out: Array<[number, number]> = [];
  for (let k = 0; k < count; k++) {
    const off = r.readUInt32LE(k * 8) % sizeBytes;
    const len = 1 + (r.readUInt32LE(k * 8 + 4) % (300 * KiB));
    out.push([off, Math.min(len, sizeBytes - off)]);
  }
  return out;
}

/**
 * Opens `path` through openImage and checks it against qemu-img: every byte equals
 * `qemu-img convert -O raw` (whole image in 1 MiB reads, plus unaligned spot reads), and
 * block status agrees with `qemu-img map`. Returns the reader's chain for further checks.
 */
export async function expectLikeQemu(path: string, format: 'raw' | 'qcow2', refPath: string): Promise<ImageReader['chain']> {
  qemuImg(dirname(path), 'convert', '-f', format, '-O', 'raw', path, refPath);
  const want = readFileSync(refPath);
  const img = await openImage(path);
  try {
    expect(img.format).toBe(format);
    expect(img.sizeBytes, `${path}: size`).toBe(want.length);
    const parts: Buffer[] = [];
    for (let off = 0; off < img.sizeBytes; off += MiB) parts.push(await img.read(off, Math.min(MiB, img.sizeBytes - off)));
    expectSameBytes(Buffer.concat(parts), want, `${path}: whole image`);
    for (const [off, len] of spotReads(img.sizeBytes, 40, img.sizeBytes % 9973)) {
      expectSameBytes(await img.read(off, len), want.subarray(off, off + len), `${path}: ${len} bytes at ${off}`);
    }
    expectMapAgrees(await wholeMap(img), path, format);
    return img.chain;
  } finally {
    await img.close();
  }
}
