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
import { stateStoreContract } from './state-store-contract.js';

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

for (const [name, make] of stores) stateStoreContract(name, make);

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
    let s = await open();
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
      // Damaged at rest: an open store keeps what it wrote (it is the directory's only writer).
      await s.close();
      await writeFile(bad, text);
      s = await open();
      let err: unknown;
      await s.get('volume', 'bad').catch((e: unknown) => (err = e));
      expect(err, text).toBeInstanceOf(MooringError);
      expect((err as MooringError).code).toBe('CORRUPT_METADATA');
      expect((err as MooringError).message).toContain(bad);
      expect(await codeOf(s.list('volume'))).toBe('CORRUPT_METADATA');
      expect(await codeOf(s.put('volume', 'bad', 2))).toBe('CORRUPT_METADATA');
    }
    // A document far larger than any put can write is refused before it is read.
    await s.close();
    await writeFile(bad, Buffer.alloc(STATE_DOCUMENT_BYTES_MAX + 8192, 0x20));
    s = await open();
    expect(await codeOf(s.get('volume', 'bad'))).toBe('CORRUPT_METADATA');
    expect((await s.get('volume', 'good'))!.value).toBe(1);
    await s.delete('volume', 'bad');
    expect((await s.list('volume')).map((d) => d.key)).toEqual(['good']);
  });

  it('reads each file once while open: the directory is listed once, then served from what the store wrote and read', async () => {
    const s = await open();
    await s.put('replica', 'a-1', 1);
    await s.put('replica', 'b-1', 2);
    expect((await s.list('replica')).map((d) => d.key)).toEqual(['a-1', 'b-1']);
    // Behind the store's back (it is the directory's only writer, so this never happens in use):
    // a removed file and a new one are not seen, which shows nothing is read again.
    await rm(join(dir, 'replica', 'a-1.json'));
    await writeFile(join(dir, 'replica', 'c-1.json'), '{"format":"mooring-state","kind":"replica","key":"c-1","version":1,"value":3}');
    expect((await s.list('replica')).map((d) => d.key)).toEqual(['a-1', 'b-1']);
    expect((await s.get('replica', 'a-1'))!.value).toBe(1);
    expect(await s.get('replica', 'c-1')).toBeNull();
    // Its own writes are: put, delete and list by prefix stay exact.
    await s.put('replica', 'a-2', 4);
    await s.delete('replica', 'b-1');
    expect((await s.list('replica', { prefix: 'a-' })).map((d) => [d.key, d.value])).toEqual([['a-1', 1], ['a-2', 4]]);
    // Reopened, the directory is what counts.
    await s.close();
    const again = await open();
    expect((await again.list('replica')).map((d) => d.key)).toEqual(['a-2', 'c-1']);
  });

  it('writes racing the first list of a kind are all in it and in every later one', async () => {
    const s = await open();
    for (let i = 0; i < 20; i += 2) await s.put('volume', `v${String(i).padStart(2, '0')}`, i);
    const closed = await open().catch(() => undefined); // BUSY: one owner
    expect(closed).toBeUndefined();
    const writes: Array<Promise<unknown>> = [];
    for (let i = 1; i < 20; i += 2) writes.push(s.put('volume', `v${String(i).padStart(2, '0')}`, i));
    writes.push(s.delete('volume', 'v00'));
    const first = s.list('volume');
    await Promise.all(writes);
    await first;
    const keys = (await s.list('volume')).map((d) => d.key);
    expect(keys).toEqual(Array.from({ length: 19 }, (_, i) => `v${String(i + 1).padStart(2, '0')}`));
    // A copy each time: changing what a read returned changes nothing stored.
    const doc = (await s.get<{ n: number }>('volume', 'v01'))!;
    expect(doc.value).toBe(1);
    await s.put('volume', 'obj', { n: 1 });
    (await s.get<{ n: number }>('volume', 'obj'))!.value.n = 99;
    expect((await s.get<{ n: number }>('volume', 'obj'))!.value.n).toBe(1);
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
