// Deterministic data for tests: a seeded PRNG (so every failure reproduces), pattern
// buffers, and an in-memory model of what a volume should contain.
import { createHash } from 'node:crypto';

/** Small, fast, seeded PRNG (mulberry32). Same seed, same sequence, on every machine. */
export class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  /** Uniform 32-bit unsigned integer. */
  u32(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  /** Integer in [0, n). */
  int(n: number): number {
    if (n <= 0x1_0000_0000) return Math.floor((this.u32() / 0x1_0000_0000) * n);
    return Math.floor((this.u32() * 0x1_0000_0000 + this.u32()) / 2 ** 64 * n);
  }
  /** Integer in [lo, hi]. */
  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }
  chance(p: number): boolean {
    return this.u32() / 0x1_0000_0000 < p;
  }
  bytes(n: number): Buffer {
    const b = Buffer.allocUnsafe(n);
    let i = 0;
    for (; i + 4 <= n; i += 4) b.writeUInt32LE(this.u32(), i);
    for (; i < n; i++) b[i] = this.u32() & 0xff;
    return b;
  }
}

/** `length` bytes that depend only on `seed` (pseudo-random, so misplaced data is detected). */
export function patternBytes(seed: number, length: number): Buffer {
  return new Rng(seed ^ 0x5eed_1234).bytes(length);
}

export function sha256(data: Buffer | Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** What a volume should contain: apply the same writes to it as to the volume, then compare. */
export class VolumeModel {
  readonly data: Buffer;
  constructor(readonly sizeBytes: number) {
    this.data = Buffer.alloc(sizeBytes);
  }
  write(offset: number, bytes: Uint8Array): void {
    this.data.set(bytes, offset);
  }
  /** qemu-io `write -P byte off len`. */
  fill(offset: number, length: number, byte: number): void {
    this.data.fill(byte, offset, offset + length);
  }
  zero(offset: number, length: number): void {
    this.data.fill(0, offset, offset + length);
  }
  slice(offset: number, length: number): Buffer {
    return this.data.subarray(offset, offset + length);
  }
  digest(): string {
    return sha256(this.data);
  }
}

/** Index of the first differing byte, or -1. Used to say where two images diverge. */
export function firstDifference(a: Uint8Array, b: Uint8Array): number {
  if (a.length === b.length && Buffer.from(a.buffer, a.byteOffset, a.length).equals(b)) return -1;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}
