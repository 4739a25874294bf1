// The replica metadata journal (native/src/store/metadata-journal.h, docs/replica-format.md)
// through the real addon: commits append one record each to replica.log instead of
// rewriting replica.json, so a commit writes as many bytes at depth 400 as at depth 10; a
// crash cut anywhere in the last record leaves the state before it (or after it, once
// whole); damage before a whole record is CORRUPT_METADATA, not a silent rollback; records
// a crash left from an earlier base are ignored; a cleanly closed replica is format 1 again.
//
// A "crash" here is a copy of the directory taken while the replica is open: every commit
// is synced before it returns, so the copy holds exactly what a power cut would leave.
import { cpSync, existsSync, readFileSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import type { NativeEngine } from '../../src/native/binding.js';
import { MiB, Scratch, addon, codeOf, engineOptions, nextEpoch, withReplica } from './helpers.js';

const LOG = 'replica.log';
const META = 'replica.json';

let scratch: Scratch | undefined;
afterEach(() => {
  scratch?.cleanup();
  scratch = undefined;
});

async function freshReplica(name = 'r'): Promise<string> {
  scratch ??= new Scratch('mooring-native-journal-');
  const dir = scratch.path(name);
  await addon().createReplica(dir, MiB);
  return dir;
}

async function openEngine(dir: string): Promise<NativeEngine> {
  return addon().openEngine(engineOptions({ replicas: [dir] }));
}

function logBytes(dir: string): number {
  return existsSync(join(dir, LOG)) ? statSync(join(dir, LOG)).size : 0;
}

function meta(dir: string): { format: number; journal?: number; layers: unknown[] } {
  return JSON.parse(readFileSync(join(dir, META), 'utf8')) as { format: number; journal?: number; layers: unknown[] };
}

/** Snapshot names of a closed replica's chain, oldest first, and its head's id. */
async function chainOf(dir: string): Promise<{ names: string[]; head: string }> {
  return withReplica(dir, async (r) => {
    const layers = await r.listLayers();
    return { names: layers.filter((l) => !l.head && !l.removed).map((l) => l.name), head: layers.find((l) => l.head)!.id };
  });
}

/** What a crash at this moment would leave: a copy of the open replica's directory. */
function crashCopy(dir: string, name: string): string {
  const to = scratch!.path(name);
  cpSync(dir, to, { recursive: true });
  return to;
}

/**
 * A fresh replica whose engine took these snapshots in turn: the log's size after each, and
 * a crash copy of the directory taken after the last, before the engine closed cleanly.
 */
async function crashedAfterSnapshots(names: string[]): Promise<{ dir: string; crashed: string; logAfter: number[] }> {
  const dir = await freshReplica();
  const e = await openEngine(dir);
  try {
    const logAfter: number[] = [];
    for (const name of names) {
      await e.snapshot(name, {}, true);
      logAfter.push(logBytes(dir));
    }
    return { dir, crashed: crashCopy(dir, 'crashed'), logAfter };
  } finally {
    await e.close();
  }
}

describe('replica metadata journal (real addon)', () => {
  it('appends one record per commit, the same size at depth 10 and 400; replica.json is rewritten only by compactions; close leaves format 1 and no log', async () => {
    const dir = await freshReplica();
    const e = await openEngine(dir);
    try {
      for (let i = 0; i < 10; i++) await e.snapshot(`a${i}`, {}, true);
      // The first commit of the session wrote a base in format 2; the rest went to the log.
      expect(meta(dir)).toMatchObject({ format: 2, journal: expect.any(Number) as number });
      const inode = statSync(join(dir, META)).ino;
      const before10 = logBytes(dir);
      await e.snapshot('at-depth-10', {}, true);
      const atDepth10 = logBytes(dir) - before10;
      for (let i = 0; i < 389; i++) await e.snapshot(`b${i}`, {}, true);
      const before400 = logBytes(dir);
      await e.snapshot('at-depth-400', {}, true);
      const atDepth400 = logBytes(dir) - before400;
      expect(atDepth10).toBeGreaterThan(0);
      expect(atDepth10).toBeLessThan(2048);
      // Two layer records (the old head named, the new head) whatever the depth; only the
      // name's length and the numbers' digits differ.
      expect(Math.abs(atDepth400 - atDepth10)).toBeLessThan(32);
      // Past max(256 KiB, 2 x the base) the log was compacted into a new replica.json.
      expect(logBytes(dir)).toBeLessThanOrEqual(256 * 1024 + 2048);
      expect(statSync(join(dir, META)).ino).not.toBe(inode);
      expect(meta(dir).format).toBe(2);
    } finally {
      await e.close();
    }
    expect(meta(dir).format).toBe(1);
    expect(meta(dir)).not.toHaveProperty('journal');
    expect(existsSync(join(dir, LOG))).toBe(false);
    const chain = await chainOf(dir);
    expect(chain.names).toHaveLength(401);
    expect(chain.names.at(-1)).toBe('at-depth-400');
  });

  it('a crash cut at every byte of the last record leaves the state before it; whole, the state after it', async () => {
    const { crashed, logAfter } = await crashedAfterSnapshots(['s0', 's1', 's2']);
    const [start, end] = [logAfter[1]!, logAfter[2]!];
    expect(end).toBeGreaterThan(start + 20);
    // (Opening `crashed` itself would close it cleanly: format 1, no log. Always a copy.)
    const seen = new Set<string>();
    for (let cut = start; cut <= end; cut++) {
      const copy = crashCopy(crashed, `cut-${cut}`);
      truncateSync(join(copy, LOG), cut);
      const chain = await chainOf(copy);
      expect(chain.names, `log cut at byte ${cut} of ${start}..${end}`).toEqual(cut === end ? ['s0', 's1', 's2'] : ['s0', 's1']);
      seen.add(chain.head);
    }
    // Before the record the head is the layer s2 named; after it, the layer s2's commit made.
    expect(seen.size).toBe(2);
  });

  it('a damaged record before a whole one is CORRUPT_METADATA at open and inspect, never a silent rollback', async () => {
    const { crashed, logAfter } = await crashedAfterSnapshots(['s0', 's1', 's2']);
    const firstRecordEnd = logAfter[1]!;
    const log = readFileSync(join(crashed, LOG));
    // A flipped byte in the payload of the first record (s1's), then of the last (s2's).
    const middle = crashCopy(crashed, 'middle');
    const m = Buffer.from(log);
    m[40] ^= 0x01;
    writeFileSync(join(middle, LOG), m);
    expect(await codeOf(addon().inspectReplica(middle))).toBe('CORRUPT_METADATA');
    expect(await codeOf(addon().openReplica(middle))).toBe('CORRUPT_METADATA');
    const last = crashCopy(crashed, 'last');
    const l = Buffer.from(log);
    l[firstRecordEnd + 40] ^= 0x01;
    writeFileSync(join(last, LOG), l);
    expect((await chainOf(last)).names).toEqual(['s0', 's1']);
  });

  it('ignores records a crash left from an earlier base (between the base rename and emptying the log)', async () => {
    // The crash copy's log is the replica's log before its clean close.
    const { dir, crashed: before } = await crashedAfterSnapshots(['s0', 's1', 's2']);
    const staleLog = readFileSync(join(before, LOG));
    expect(staleLog.length).toBeGreaterThan(0);
    // Opened directly (an engine's open makes commits of its own): the one commit, the
    // first of the session, compacts: a new base, a new generation, an empty log.
    const r = await addon().openReplica(dir);
    const claimed = nextEpoch();
    let crashed: string;
    try {
      await r.claimEpoch(claimed);
      expect(logBytes(dir)).toBe(0);
      crashed = crashCopy(dir, 'crashed-after-claim');
    } finally {
      await r.close();
    }
    // As if the crash came before the log was emptied: the old base's records are still
    // there. Replayed over the new base they would take its epoch back to the engine's.
    writeFileSync(join(crashed, LOG), staleLog);
    expect((await addon().inspectReplica(crashed)).epoch).toBe(claimed);
    expect((await chainOf(crashed)).names).toEqual(['s0', 's1', 's2']);
  });

  it('inspect of an open replica reads the log: the epoch of the last commit, not of the base', async () => {
    const dir = await freshReplica();
    const r = await addon().openReplica(dir);
    try {
      const first = nextEpoch();
      await r.claimEpoch(first); // compaction: the base says `first`
      const second = nextEpoch();
      await r.claimEpoch(second); // a record
      expect(meta(dir)).toMatchObject({ format: 2 });
      expect(logBytes(dir)).toBeGreaterThan(0);
      expect((await addon().inspectReplica(dir)).epoch).toBe(second);
    } finally {
      await r.close();
    }
    expect((await addon().inspectReplica(dir)).epoch).toBeGreaterThan(0);
    expect(meta(dir).format).toBe(1);
  });

  it('hostile logs under a format 2 base open or fail CORRUPT_METADATA, never crash', async () => {
    const { crashed } = await crashedAfterSnapshots(['s0', 's1']);
    const good = readFileSync(join(crashed, LOG));
    const gen = good.readBigUInt64LE(8);
    const record = (payload: Buffer, g = gen): Buffer => {
      const h = Buffer.alloc(20);
      h.write('MRJ1', 0, 'latin1');
      h.writeUInt32LE(payload.length, 4);
      h.writeBigUInt64LE(g, 8);
      h.writeUInt32LE(crc32c(Buffer.concat([h.subarray(0, 16), payload])), 16);
      return Buffer.concat([h, payload]);
    };
    const cases: Array<[string, Buffer, 'open' | 'CORRUPT_METADATA']> = [
      ['garbage', Buffer.from('not a journal at all, just text\n'.repeat(50)), 'open'],
      ['a length of 4 GiB', Buffer.concat([good, Buffer.from('MRJ1\xff\xff\xff\xff', 'latin1'), Buffer.alloc(64)]), 'open'],
      ['a whole record that is not JSON', Buffer.concat([good, record(Buffer.from('{{{'))]), 'CORRUPT_METADATA'],
      ['a whole record that drops a missing layer', Buffer.concat([good, record(Buffer.from(JSON.stringify({ ...topOf(crashed), drop: ['L999999'], layers: [] })))]), 'CORRUPT_METADATA'],
      ['a whole record naming a head that is not a layer', Buffer.concat([good, record(Buffer.from(JSON.stringify({ ...topOf(crashed), head: 'L000777', drop: [], layers: [] })))]), 'CORRUPT_METADATA'],
      ['a whole record of another generation', Buffer.concat([good, record(Buffer.from('{{{'), gen + 1n)]), 'open'],
    ];
    for (const [what, bytes, want] of cases) {
      const copy = crashCopy(crashed, `hostile-${what.replace(/\W+/g, '-')}`);
      writeFileSync(join(copy, LOG), bytes);
      if (want === 'open') {
        const chain = await chainOf(copy);
        expect(chain.names.length, what).toBeLessThanOrEqual(2);
      } else {
        expect(await codeOf(addon().openReplica(copy)), what).toBe(want);
      }
    }
  });
});

/** The top-level fields of a replica.json (for hand-made records). */
function topOf(dir: string): Record<string, unknown> {
  const { format: _f, journal: _j, layers: _l, ...top } = JSON.parse(readFileSync(join(dir, META), 'utf8')) as Record<string, unknown>;
  return top;
}

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[i] = c >>> 0;
  }
  return t;
})();

function crc32c(b: Buffer): number {
  let c = 0xffffffff;
  for (const x of b) c = CRC_TABLE[(c ^ x) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
