// Helpers for the tests that run against the real native addon (test/native/). Nothing here
// fakes the addon: loading it fails loudly (NATIVE_LOAD_FAILED, with what was tried and how
// to fix it) when it has not been built, so these tests can never pass by skipping.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { NativeAddon, NativeEngineOptions, NativeReplica, NativeReplicaEndpoint } from '../../src/native/binding.js';
import { loadAddon } from '../../src/native/load.js';

export const KiB = 1024;
export const MiB = 1024 * KiB;
export const GiB = 1024 * MiB;
export const BLOCK = 4 * KiB;

/**
 * Set by the sanitizer pass (test/sanitizers/run.mjs) to the sanitizers the addon was built
 * with ('address,undefined'); empty otherwise. Under ASan, RSS also counts the allocator's
 * redzones, its shadow memory and the freed blocks it holds back (its quarantine).
 */
export const SANITIZERS = process.env.MOORING_SANITIZERS ?? '';
/** ASan's quarantine: freed memory it keeps from reuse (quarantine_size_mb, 256 MiB by default). */
export const ASAN_QUARANTINE_BYTES = SANITIZERS.includes('address') ? 256 * MiB : 0;

/** The addon exactly as the library loads it. Throws NATIVE_LOAD_FAILED if it is missing. */
export function addon(): NativeAddon {
  return loadAddon();
}

let lastEpoch = 0;
/**
 * A writer epoch no engine on this machine was given before, as the control plane would
 * allocate one (docs/single-writer.md): above the wall clock in microseconds, so processes
 * started one after another never reuse one.
 */
export function nextEpoch(): number {
  lastEpoch = Math.max(lastEpoch + 1, Date.now() * 1000);
  return lastEpoch;
}

/**
 * The member name tests give a replica endpoint (the LocalEngine class passes the spec's id):
 * from the last two components of a path, or port and name of a remote replica, so the
 * same replica has the same name in every engine of a test.
 */
export function memberOf(endpoint: NativeReplicaEndpoint): string {
  const raw = typeof endpoint === 'string' ? endpoint.split('/').slice(-2).join('-') : `${endpoint.port}-${endpoint.name}`;
  return raw.replace(/[^A-Za-z0-9._-]/g, '_').slice(-63);
}

/** Raw native engine options completed as the LocalEngine class completes them: member names (memberOf) and, unless standby, a fresh epoch. */
export function engineOptions(o: NativeEngineOptions): NativeEngineOptions {
  return { members: o.replicas.map(memberOf), ...(o.standby ? {} : { epoch: nextEpoch() }), ...o };
}

/** A scratch directory under the OS temp dir, removed by cleanup(). */
export class Scratch {
  readonly root: string;
  constructor(prefix: string) {
    this.root = mkdtempSync(join(tmpdir(), prefix));
  }
  /** A path inside the scratch dir. */
  path(...parts: string[]): string {
    return join(this.root, ...parts);
  }
  /** A fresh empty sub-directory. */
  dir(...parts: string[]): string {
    const p = this.path(...parts);
    mkdirSync(p, { recursive: true });
    return p;
  }
  cleanup(): void {
    rmSync(this.root, { recursive: true, force: true });
  }
}

/** Deterministic, seed-dependent bytes (xorshift32), distinct for different seeds. */
export function pattern(seed: number, length: number): Buffer {
  const b = Buffer.allocUnsafe(length);
  let x = (seed * 2654435761 + 0x9e3779b9) >>> 0 || 1;
  for (let i = 0; i < length; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    b[i] = x & 0xff;
  }
  return b;
}

/** Real disk usage of a file: st_blocks * 512. */
export function diskBytes(path: string): number {
  return statSync(path).blocks * 512;
}

/** The code of a rejection (fails the test if the promise resolves). */
export async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    return String((err as { code?: unknown }).code);
  }
  throw new Error('expected a rejection, but the call succeeded');
}

/** Opens a replica directly, runs fn, closes it (also when fn throws). */
export async function withReplica<T>(dir: string, fn: (r: NativeReplica) => Promise<T>): Promise<T> {
  const r = await addon().openReplica(dir);
  try {
    return await fn(r);
  } finally {
    await r.close();
  }
}

/** Calls `cond` until it returns true (or throws the last error) within `timeoutMs`. */
/**
 * Threads of a process by name (the kernel's comm: at most 15 characters). Each native
 * thread names itself (NameThisThread), so a count per kind says which kind grew.
 */
export function threadsByName(pid: number | 'self' = 'self'): Map<string, number> {
  const out = new Map<string, number>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    let name: string;
    try {
      name = readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim();
    } catch {
      continue; // ended meanwhile
    }
    out.set(name, (out.get(name) ?? 0) + 1);
  }
  return out;
}

/** All the threads of a count by name. */
export function threadTotal(m: Map<string, number>): number {
  let n = 0;
  for (const v of m.values()) n += v;
  return n;
}

export async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > until) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * The ranges of a replica that hold data (block status flags without the hole bit), merged,
 * over the whole volume. Block status is bounded per call, so it is asked again from where
 * each answer ends.
 */
export async function dataRanges(r: NativeReplica): Promise<Array<[number, number]>> {
  const out: Array<[number, number]> = [];
  let off = 0;
  while (off < r.sizeBytes) {
    const extents = await r.blockStatus(off, r.sizeBytes - off);
    if (extents.length === 0) throw new Error(`replica ${r.id}: block status at ${off} returned nothing`);
    for (const e of extents) {
      if ((e.flags & 1) === 0) {
        const last = out[out.length - 1];
        if (last && last[0] + last[1] === off) last[1] += e.length;
        else out.push([off, e.length]);
      }
      off += e.length;
    }
  }
  return out;
}

/** Union of sorted [offset, length] range lists, merged. */
export function unionRanges(lists: Array<Array<[number, number]>>): Array<[number, number]> {
  const all = lists.flat().sort((a, b) => a[0] - b[0]);
  const out: Array<[number, number]> = [];
  for (const [o, l] of all) {
    const last = out[out.length - 1];
    if (last && o <= last[0] + last[1]) last[1] = Math.max(last[1], o + l - last[0]);
    else out.push([o, l]);
  }
  return out;
}

/** Reads a whole (small) replica into one buffer. */
export async function replicaImage(r: NativeReplica): Promise<Buffer> {
  const img = Buffer.alloc(r.sizeBytes);
  for (const [o, l] of await dataRanges(r)) {
    for (let p = o; p < o + l; p += COMPARE_CHUNK) {
      const n = Math.min(COMPARE_CHUNK, o + l - p);
      (await r.read(p, n)).copy(img, p);
    }
  }
  return img;
}

/** Largest read used when comparing replicas. */
const COMPARE_CHUNK = 4 * MiB;

/** A replica directory of a test volume, as {@link LocalEngine.open} takes it. */
export interface ReplicaDir {
  /** Its id in the engine (r0, r1, ...). */
  id: string;
  /** Its absolute directory. */
  path: string;
}

/** Creates empty replicas `r0` .. `r{count-1}` of `sizeBytes` under `root` (created if missing). */
export async function createReplicas(root: string, count: number, sizeBytes: number): Promise<ReplicaDir[]> {
  mkdirSync(root, { recursive: true });
  const dirs = Array.from({ length: count }, (_, i) => ({ id: `r${i}`, path: join(root, `r${i}`) }));
  for (const d of dirs) await addon().createReplica(d.path, sizeBytes);
  return dirs;
}

/** The replica of `replicas` with id `id`. */
export function replicaDir(replicas: ReplicaDir[], id: string): string {
  const r = replicas.find((x) => x.id === id);
  if (!r) throw new Error(`no replica ${id} among ${replicas.map((x) => x.id).join(', ')}`);
  return r.path;
}

export interface IdenticalOptions {
  /** Replica ids to leave out (e.g. one that is ERR and known to be stale). */
  exclude?: string[];
  /** The whole volume's expected content (small volumes only). */
  expected?: Buffer;
}

export interface IdenticalResult {
  /** Replicas compared. */
  ids: string[];
  /** Bytes compared per replica (the union of their data ranges). */
  bytes: number;
}

/**
 * Asserts that the replicas of a CLOSED engine hold identical data: opens each replica
 * directly (openReplica: no epoch is claimed, nothing is changed), takes the union of the
 * ranges any of them holds data in, and compares those bytes across replicas (everything
 * outside the union is a hole, so zeros, in all of them). With `expected`, each replica must
 * also equal it, including zeros outside the union. Throws naming the first differing
 * offset. An open engine makes openReplica fail with BUSY, which is reported as such.
 */
export async function assertReplicasIdentical(replicas: ReplicaDir[], options: IdenticalOptions = {}): Promise<IdenticalResult> {
  const specs = replicas.filter((r) => !(options.exclude ?? []).includes(r.id));
  if (specs.length === 0) throw new Error(`no replicas left to compare of ${replicas.map((r) => r.id).join(', ')}`);
  const size = await withReplica(specs[0]!.path, async (r) => r.sizeBytes);
  return compareReplicas(specs.map((s) => ({ id: s.id, dir: s.path })), size, specs.map((s) => s.path).join(', '), options.expected);
}

/** assertReplicasIdentical for replica directories that belong to no volume (closed engines). */
export async function assertDirsIdentical(dirs: string[], expected?: Buffer): Promise<IdenticalResult> {
  if (dirs.length === 0) throw new Error('no replica directories to compare');
  const size = await withReplica(dirs[0]!, async (r) => r.sizeBytes);
  return compareReplicas(dirs.map((dir) => ({ id: dir, dir })), size, dirs.join(', '), expected);
}

async function compareReplicas(
  specs: Array<{ id: string; dir: string }>,
  sizeBytes: number,
  what: string,
  expected: Buffer | undefined,
): Promise<IdenticalResult> {
  const opened: Array<{ id: string; r: NativeReplica }> = [];
  try {
    for (const s of specs) {
      const r = await addon().openReplica(s.dir);
      opened.push({ id: s.id, r });
      if (r.sizeBytes !== sizeBytes) throw new Error(`replica ${s.id}: size ${r.sizeBytes}, expected ${sizeBytes}`);
    }
    const ranges = unionRanges(await Promise.all(opened.map((o) => dataRanges(o.r))));
    if (expected) {
      if (expected.length !== sizeBytes) throw new Error(`expected image is ${expected.length} bytes, volume ${sizeBytes}`);
      // Outside the union every replica reads zeros: so must the expected image.
      let pos = 0;
      for (const [o, l] of [...ranges, [sizeBytes, 0] as [number, number]]) {
        const gap = expected.subarray(pos, o);
        const nz = gap.findIndex((b) => b !== 0);
        if (nz >= 0) throw new Error(`replicas hold a hole at ${pos + nz}, but the expected data is not zero there`);
        pos = o + l;
      }
    }
    let bytes = 0;
    for (const [o, l] of ranges) {
      for (let p = o; p < o + l; p += COMPARE_CHUNK) {
        const n = Math.min(COMPARE_CHUNK, o + l - p);
        const datas = await Promise.all(opened.map((x) => x.r.read(p, n)));
        const ref = expected ? expected.subarray(p, p + n) : datas[0]!;
        const refName = expected ? 'the expected data' : `replica ${opened[0]!.id}`;
        datas.forEach((d, i) => {
          if (!d.equals(ref)) {
            const at = d.findIndex((b, k) => b !== ref[k]);
            throw new Error(`replica ${opened[i]!.id} differs from ${refName} at byte ${p + at} (${what})`);
          }
        });
        bytes += n;
      }
    }
    return { ids: opened.map((o) => o.id), bytes };
  } finally {
    await Promise.allSettled(opened.map((o) => o.r.close()));
  }
}

/**
 * A closed replica's chain as comparable text: per layer its id, name, parent, head and
 * removed flags and the ranges it allocates itself. Two replicas kept in step (or rebuilt
 * from one another) have equal summaries.
 */
export async function layerSummary(dir: string): Promise<string[]> {
  return withReplica(dir, async (r) => {
    const out: string[] = [];
    for (const l of await r.listLayers()) {
      const ext = (await r.layerExtents(l.id)).map(([o, n]) => `${o}+${n}`).join(',');
      out.push(`${l.id} name=${l.name} parent=${l.parent} head=${l.head} removed=${l.removed} extents=[${ext}]`);
    }
    return out;
  });
}

/** Mounts a tmpfs of `size` (e.g. '2m') on `dir`. Needs root; fails loudly otherwise. */
export function mountTmpfs(dir: string, size: string): void {
  if (typeof process.getuid === 'function' && process.getuid() !== 0) {
    throw new Error(`mounting a tmpfs on ${dir} needs root (these tests run as root in CI; run them with sudo)`);
  }
  mkdirSync(dir, { recursive: true });
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', dir]);
}

/** Unmounts `dir` if something is mounted there (lazily if still busy). */
export function unmount(dir: string): void {
  const mounted = readFileSync('/proc/self/mounts', 'utf8')
    .split('\n')
    .some((l) => l.split(' ')[1] === dir);
  if (!mounted) return;
  try {
    execFileSync('umount', [dir]);
  } catch {
    execFileSync('umount', ['-l', dir]);
  }
}
