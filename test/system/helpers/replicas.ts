// Checks that the replicas of a (closed) volume hold identical data.
//
// Each replica directory is opened directly through the native addon (openReplica), which
// claims no epoch and changes nothing, and read end to end (chunks that block status
// reports as one hole are not read: their digest is that of zeros). A volume that is still
// being served holds the replicas' locks, so the check fails with BUSY instead of reading
// under a running server.
import { createRequire } from 'node:module';
import type { NativeAddon } from '../../../src/native/binding.js';
import { sha256 } from './pattern.js';
import { repoRoot } from './tools.js';

/** Bytes per digest chunk: a mismatch is reported to this granularity. */
const CHUNK = 1 << 20;

let addon: NativeAddon | undefined;

/** The addon exactly as the package loads it (node-gyp-build from the repo root). */
export function loadAddon(): NativeAddon {
  if (!addon) {
    const require = createRequire(import.meta.url);
    const nodeGypBuild = require('node-gyp-build') as (dir: string) => NativeAddon;
    addon = nodeGypBuild(repoRoot);
  }
  return addon;
}

export interface ReplicaContent {
  id: string;
  /** sha256 of each CHUNK-sized piece, in order. */
  chunks: string[];
  digest: string;
}

/** Reads one replica directory's content (opened alone, read-only in effect). */
export async function readReplica(replicaDir: string, sizeBytes: number, id = replicaDir): Promise<ReplicaContent> {
  const replica = await loadAddon().openReplica(replicaDir);
  try {
    if (replica.sizeBytes !== sizeBytes) throw new Error(`replica ${id}: size ${replica.sizeBytes}, volume says ${sizeBytes}`);
    const chunks: string[] = [];
    for (let off = 0; off < sizeBytes; off += CHUNK) {
      const n = Math.min(CHUNK, sizeBytes - off);
      const extents = await replica.blockStatus(off, n);
      const hole = extents.length === 1 && extents[0]!.length === n && (extents[0]!.flags & 1) !== 0;
      chunks.push(hole ? zeroDigest(n) : sha256(await replica.read(off, n)));
    }
    return { id, chunks, digest: sha256(Buffer.from(chunks.join(''))) };
  } finally {
    await replica.close();
  }
}

const zeroDigests = new Map<number, string>();
function zeroDigest(n: number): string {
  let d = zeroDigests.get(n);
  if (d === undefined) {
    d = sha256(Buffer.alloc(n));
    zeroDigests.set(n, d);
  }
  return d;
}

/** Digest of `data` in the same chunked form as ReplicaContent.digest. */
export function chunkedDigest(data: Buffer): string {
  const chunks: string[] = [];
  for (let off = 0; off < data.length; off += CHUNK) chunks.push(sha256(data.subarray(off, off + CHUNK)));
  return sha256(Buffer.from(chunks.join('')));
}

/**
 * Asserts every replica directory in `dirs` (whose volume must not be served right now)
 * holds the same bytes; if `expected` is given, also that they equal it. Returns how many
 * were checked.
 */
export async function assertReplicasIdentical(dirs: string[], sizeBytes: number, expected?: Buffer): Promise<number> {
  if (dirs.length === 0) throw new Error('no replica directories to compare');
  const contents: ReplicaContent[] = [];
  for (const d of dirs) contents.push(await readReplica(d, sizeBytes, d));
  const ref = expected ? { id: 'expected', chunks: chunkDigests(expected) } : contents[0]!;
  for (const c of contents) {
    const bad = c.chunks.findIndex((h, i) => h !== ref.chunks[i]);
    if (bad >= 0 || c.chunks.length !== ref.chunks.length) {
      throw new Error(`replica ${c.id} differs from ${ref.id} in the MiB at offset ${bad * CHUNK} (of ${dirs.length} replicas)`);
    }
  }
  return contents.length;
}

function chunkDigests(data: Buffer): string[] {
  const chunks: string[] = [];
  for (let off = 0; off < data.length; off += CHUNK) chunks.push(sha256(data.subarray(off, off + CHUNK)));
  return chunks;
}
