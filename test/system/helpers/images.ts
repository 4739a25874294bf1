// Source images for copy tests: pseudo-random data runs separated by zero gaps (so copy
// tools exercise both WRITE and their sparse/zero paths), written as sparse raw files.
import { closeSync, ftruncateSync, openSync, writeSync } from 'node:fs';
import { patternBytes, Rng } from './pattern.js';

/** A deterministic image of `size` bytes: data runs of 1 B..2 MiB at random offsets. */
export function makeImage(seed: number, size: number, runs = 40): Buffer {
  const rng = new Rng(seed);
  const img = Buffer.alloc(size);
  for (let i = 0; i < runs; i++) {
    const len = rng.pick([1, 511, 4096, 4097, 65536, 300_000, 1 << 20, 2 << 20]);
    const off = rng.int(size - len);
    patternBytes(seed * 1000 + i, len).copy(img, off);
  }
  return img;
}

/** Writes `img` to `path` as a sparse file (zero 64 KiB pieces are skipped). */
export function writeSparse(path: string, img: Buffer): void {
  const fd = openSync(path, 'w');
  try {
    ftruncateSync(fd, img.length);
    const piece = 64 * 1024;
    const zero = Buffer.alloc(piece);
    for (let off = 0; off < img.length; off += piece) {
      const p = img.subarray(off, Math.min(off + piece, img.length));
      if (!p.equals(zero.subarray(0, p.length))) writeSync(fd, p, 0, p.length, off);
    }
  } finally {
    closeSync(fd);
  }
}
