// The StateStore contract, run against FileStateStore and MemoryStateStore, then what only
// the file store has: its files, crash leftovers, damaged documents and the directory lock.
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm, writeFile, mkdir } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { MooringError } from '../../../src/errors.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { STATE_DOCUMENT_BYTES_MAX } from '../../../src/state/state-keys.js';
import type { StateStore } from '../../../src/state/state-store.js';
import { codeOf } from '../../helpers/codes.js';

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), 'mooring-state-'));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

const stores: Array<[string, () => Promise<StateStore>]> = [
  ['FileStateStore', () => FileStateStore.open({ dir: join(root, 'store') })],
  ['MemoryStateStore', async () => new MemoryStateStore()],
];

describe.each(stores)('%s (StateStore contract)', (_name, make) => {
  let store: StateStore;
  beforeEach(async () => {
    store = await make();
  });
  afterEach(async () => {
    await store.close();
  });

  it('puts, gets, lists in key order and deletes', async () => {
    expect(await store.get('volume', 'v1')).toBeNull();
    const a = await store.put('volume', 'v2', { size: 2 });
    expect(a).toEqual({ kind: 'volume', key: 'v2', version: 1, value: { size: 2 } });
    await store.put('volume', 'v1', { size: 1 });
    await store.put('engine', 'v1', { host: 'h1' });
    const b = await store.put('volume', 'v2', { size: 3 });
    expect(b.version).toBe(2);
    expect(await store.get('volume', 'v2')).toEqual({ kind: 'volume', key: 'v2', version: 2, value: { size: 3 } });
    expect((await store.list('volume')).map((d) => [d.key, d.version])).toEqual([
      ['v1', 1],
      ['v2', 2],
    ]);
    expect(await store.list('nothing-here')).toEqual([]);
    await store.delete('volume', 'v1');
    await store.delete('volume', 'v1');
    expect((await store.list('volume')).map((d) => d.key)).toEqual(['v2']);
    expect(await store.get('engine', 'v1')).not.toBeNull();
  });

  it('lists only the keys with a prefix when asked, in key order', async () => {
    for (const k of ['vol-a-r1', 'vol-a-r0', 'vol-ab-r0', 'vol-b-r0']) await store.put('replica', k, { k });
    expect((await store.list('replica', { prefix: 'vol-a-' })).map((d) => d.key)).toEqual(['vol-a-r0', 'vol-a-r1']);
    expect((await store.list('replica', { prefix: 'vol-a' })).map((d) => d.key)).toEqual(['vol-a-r0', 'vol-a-r1', 'vol-ab-r0']);
    expect(await store.list('replica', { prefix: 'none-' })).toEqual([]);
    expect(await store.list('replica', {})).toHaveLength(4);
  });

  it('returns copies: changing a value after put or get does not change the stored one', async () => {
    const value = { list: [1, 2] };
    const put = await store.put('volume', 'v', value);
    value.list.push(3);
    put.value.list.push(4);
    const got = await store.get<{ list: number[] }>('volume', 'v');
    expect(got!.value.list).toEqual([1, 2]);
    got!.value.list.push(5);
    expect((await store.get<{ list: number[] }>('volume', 'v'))!.value.list).toEqual([1, 2]);
  });

  it('compare-and-set: expectedVersion 0 creates only, N replaces only version N', async () => {
    await store.put('volume', 'v', 'a', { expectedVersion: 0 });
    expect(await codeOf(store.put('volume', 'v', 'b', { expectedVersion: 0 }))).toBe('CONFLICT');
    expect(await codeOf(store.put('volume', 'v', 'b', { expectedVersion: 2 }))).toBe('CONFLICT');
    expect((await store.put('volume', 'v', 'b', { expectedVersion: 1 })).version).toBe(2);
    expect(await codeOf(store.delete('volume', 'v', { expectedVersion: 1 }))).toBe('CONFLICT');
    expect((await store.get('volume', 'v'))!.value).toBe('b');
    await store.delete('volume', 'v', { expectedVersion: 2 });
    expect(await store.get('volume', 'v')).toBeNull();
    expect(await codeOf(store.delete('volume', 'v', { expectedVersion: 2 }))).toBe('CONFLICT');
    expect(await codeOf(store.put('volume', 'v', 'c', { expectedVersion: 1 }))).toBe('CONFLICT');
  });

  it('a CAS race has exactly one winner', async () => {
    await store.put('volume', 'v', { owner: 'none' });
    const racers = Array.from({ length: 20 }, (_, i) => store.put('volume', 'v', { owner: `h${i}` }, { expectedVersion: 1 }));
    const results = await Promise.allSettled(racers);
    const won = results.filter((r) => r.status === 'fulfilled');
    expect(won).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect((r.reason as MooringError).code).toBe('CONFLICT');
    const doc = await store.get<{ owner: string }>('volume', 'v');
    expect(doc!.version).toBe(2);
    expect(doc!.value).toEqual((won[0] as PromiseFulfilledResult<{ value: unknown }>).value.value);
  });

  it('a guarded write happens only while the guard document is at the guard version', async () => {
    const lead = await store.put('leader', 'cluster', { holder: 'a' });
    const guard = { kind: 'leader', key: 'cluster', version: lead.version };
    await store.put('volume', 'v', 1, { guard });
    await store.delete('volume', 'v', { guard });
    expect(await codeOf(store.put('volume', 'v', 2, { guard: { ...guard, version: 0 } }))).toBe('CONFLICT');
    await store.put('leader', 'cluster', { holder: 'b' }); // deposed
    const err = await store.put('volume', 'w', 3, { guard }).catch((e: MooringError) => e);
    expect(err).toMatchObject({ code: 'CONFLICT', details: { guard: true, version: lead.version + 1 } });
    expect(await codeOf(store.delete('volume', 'w', { guard }))).toBe('CONFLICT');
    expect(await store.get('volume', 'w')).toBeNull();
    expect(await codeOf(store.put('volume', 'w', 3, { guard: { kind: 'Bad', key: 'x', version: 1 } }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(store.put('volume', 'w', 3, { guard: { ...guard, version: -1 } }))).toBe('INVALID_ARGUMENT');
  });

  it('a write racing the change of its guard either lands before it or fails', async () => {
    const lead = await store.put('leader', 'cluster', { holder: 'a' });
    const guard = { kind: 'leader', key: 'cluster', version: lead.version };
    const writes = Array.from({ length: 20 }, (_, i) => store.put('volume', `v${i}`, i, { guard }));
    const takeover = store.put('leader', 'cluster', { holder: 'b' }, { expectedVersion: lead.version });
    const results = await Promise.allSettled([...writes, takeover]);
    expect(results.at(-1)!.status).toBe('fulfilled');
    // Each write either landed (stored) or failed CONFLICT (not stored): never stored after a refusal.
    for (let i = 0; i < 20; i++) {
      const r = results[i]!;
      const stored = await store.get('volume', `v${i}`);
      if (r.status === 'fulfilled') expect(stored).not.toBeNull();
      else expect([(r.reason as MooringError).code, stored]).toEqual(['CONFLICT', null]);
    }
  });

  it('read-modify-write loops that retry on CONFLICT lose no increment', async () => {
    await store.put('counter', 'c', 0);
    const worker = async (): Promise<void> => {
      for (let attempt = 0; attempt < 100; attempt++) {
        const cur = (await store.get<number>('counter', 'c'))!;
        try {
          await store.put('counter', 'c', cur.value + 1, { expectedVersion: cur.version });
          return;
        } catch (err) {
          if ((err as MooringError).code !== 'CONFLICT') throw err;
        }
      }
      throw new Error('too many conflicts');
    };
    await Promise.all(Array.from({ length: 10 }, worker));
    expect((await store.get<number>('counter', 'c'))!.value).toBe(10);
  });

  it('refuses bad kinds, keys, versions and values with INVALID_ARGUMENT', async () => {
    for (const kind of ['', 'Volume', '../x', 'a/b', 'x'.repeat(64), 7]) {
      expect(await codeOf(store.get(kind as string, 'k'))).toBe('INVALID_ARGUMENT');
    }
    for (const key of ['', '.', '..', '../../etc/passwd', 'a/b', 'x'.repeat(64), 'a\0b', null]) {
      expect(await codeOf(store.put('volume', key as string, 1))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(store.delete('volume', key as string))).toBe('INVALID_ARGUMENT');
    }
    expect(await codeOf(store.put('volume', 'k', 1, { expectedVersion: -1 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(store.put('volume', 'k', 1, { expectedVersion: 1.5 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(store.put('volume', 'k', undefined))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(store.put('volume', 'k', 10n))).toBe('INVALID_ARGUMENT');
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(await codeOf(store.put('volume', 'k', cyclic))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(store.put('volume', 'k', 'x'.repeat(STATE_DOCUMENT_BYTES_MAX)))).toBe('INVALID_ARGUMENT');
    expect(await store.get('volume', 'k')).toBeNull();
  });

  it('rejects calls after close with CLOSED', async () => {
    await store.close();
    await store.close();
    expect(await codeOf(store.get('volume', 'v'))).toBe('CLOSED');
    expect(await codeOf(store.put('volume', 'v', 1))).toBe('CLOSED');
  });
});

describe('FileStateStore (files)', () => {
  let dir: string;
  const opened: FileStateStore[] = [];
  const open = async (): Promise<FileStateStore> => {
    const s = await FileStateStore.open(dir);
    opened.push(s);
    return s;
  };
  beforeEach(() => {
    dir = join(root, 'store');
  });
  afterEach(async () => {
    await Promise.allSettled(opened.splice(0).map((s) => s.close()));
  });

  it('keeps documents as DIR/<kind>/<key>.json and finds them again after reopening', async () => {
    const s = await open();
    await s.put('volume', 'disk-0', { sizeBytes: 4096 });
    await s.put('volume', 'disk-0', { sizeBytes: 8192 });
    await s.close();
    expect((await readdir(dir)).sort()).toEqual(['volume']);
    expect(await readdir(join(dir, 'volume'))).toEqual(['disk-0.json']);
    const text = JSON.parse(await readFile(join(dir, 'volume', 'disk-0.json'), 'utf8'));
    expect(text).toMatchObject({ kind: 'volume', key: 'disk-0', version: 2, value: { sizeBytes: 8192 } });
    const again = await open();
    expect(await again.get('volume', 'disk-0')).toEqual({ kind: 'volume', key: 'disk-0', version: 2, value: { sizeBytes: 8192 } });
  });

  it('removes temporary files a crash left behind, and never lists them', async () => {
    const s = await open();
    await s.put('volume', 'v', { n: 1 });
    await s.close();
    // What writeFileAtomic leaves when the process dies between write and rename.
    const leftover = join(dir, 'volume', `.v.json.tmp-12345-0badf00d`);
    await writeFile(leftover, '{"format":"mooring-state","kind":"volume","key":"v","version":9,"val');
    const again = await open();
    expect(await readdir(join(dir, 'volume'))).toEqual(['v.json']);
    expect((await again.get('volume', 'v'))!.version).toBe(1);
    expect((await again.list('volume')).map((d) => d.key)).toEqual(['v']);
  });

  it('a truncated or hostile document is CORRUPT_METADATA naming the file; others stay readable; delete clears it', async () => {
    const s = await open();
    await s.put('volume', 'good', 1);
    await s.put('volume', 'bad', { big: 'x'.repeat(100) });
    const bad = join(dir, 'volume', 'bad.json');
    const full = await readFile(bad, 'utf8');
    const cases = [
      full.slice(0, full.length / 2),
      '',
      '[]',
      '{"format":"mooring-state","kind":"volume","key":"other","version":1,"value":1}',
      '{"format":"mooring-state","kind":"volume","key":"bad","version":-3,"value":1}',
      '{"format":"mooring-state","kind":"volume","key":"bad","version":1}',
      '{"format":"something-else","kind":"volume","key":"bad","version":1,"value":1}',
    ];
    for (const text of cases) {
      await writeFile(bad, text);
      let err: unknown;
      await s.get('volume', 'bad').catch((e: unknown) => (err = e));
      expect(err, text).toBeInstanceOf(MooringError);
      expect((err as MooringError).code).toBe('CORRUPT_METADATA');
      expect((err as MooringError).message).toContain(bad);
      expect(await codeOf(s.list('volume'))).toBe('CORRUPT_METADATA');
      expect(await codeOf(s.put('volume', 'bad', 2))).toBe('CORRUPT_METADATA');
    }
    // A document far larger than any put can write is refused before it is read.
    await writeFile(bad, Buffer.alloc(STATE_DOCUMENT_BYTES_MAX + 8192, 0x20));
    expect(await codeOf(s.get('volume', 'bad'))).toBe('CORRUPT_METADATA');
    expect((await s.get('volume', 'good'))!.value).toBe(1);
    await s.delete('volume', 'bad');
    expect((await s.list('volume')).map((d) => d.key)).toEqual(['good']);
  });

  it('ignores files that are not documents (wrong names) when listing', async () => {
    const s = await open();
    await s.put('volume', 'v', 1);
    await writeFile(join(dir, 'volume', 'notes.txt'), 'x');
    await writeFile(join(dir, 'volume', '...json'), 'x');
    await mkdir(join(dir, 'Weird Kind'));
    expect((await s.list('volume')).map((d) => d.key)).toEqual(['v']);
  });

  it('one process per directory: a second open is BUSY, a dead owner is taken over', async () => {
    await open();
    expect(await codeOf(FileStateStore.open(dir))).toBe('BUSY');
    await opened[0]!.close();
    // A live process of this host holds it.
    const sleeper = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      await writeFile(join(dir, 'state.lock'), JSON.stringify({ pid: sleeper.pid, hostname: hostname(), acquiredMs: Date.now() }));
      const err = await FileStateStore.open(dir).catch((e: unknown) => e);
      expect((err as MooringError).code).toBe('BUSY');
      expect((err as MooringError).message).toContain(`state store ${dir}`);
    } finally {
      sleeper.kill('SIGKILL');
      await new Promise((r) => sleeper.once('exit', r));
    }
    // Its owner is gone now: the stale lock is taken over.
    const s = await open();
    await s.put('volume', 'v', 1);
  });
});
