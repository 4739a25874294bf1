// FileStateStore under SIGKILL: a child process rewrites documents as fast as it can and
// reports each acknowledged version; after it is killed mid-write, reopening the store
// (taking over its stale lock) finds every document whole, at or after the last
// acknowledged version, and no temporary files.
import { spawn } from 'node:child_process';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { FileStateStore } from '../../src/state/file-state-store.js';
import { TempDir, repoRoot } from './helpers/tools.js';

const WRITER = `
const { FileStateStore } = await import(process.argv[1]);
const store = await FileStateStore.open(process.argv[2]);
const pad = 'x'.repeat(20000);
for (;;) {
  for (const key of ['a', 'b', 'c']) {
    // n is the version this write creates, so a reader can tell value and version belong together.
    const cur = (await store.get('volume', key))?.version ?? 0;
    const doc = await store.put('volume', key, { n: cur + 1, key, pad }, { expectedVersion: cur });
    process.stdout.write(key + ' ' + doc.version + '\\n');
  }
}
`;

describe('FileStateStore crash safety (SIGKILL mid-write)', () => {
  let tmp: TempDir;
  beforeAll(() => {
    tmp = new TempDir('mooring-state-');
  });
  afterAll(() => {
    tmp.cleanup();
  });

  it('every document is whole and at least at its last acknowledged version after a kill', async () => {
    const dist = pathToFileURL(join(repoRoot, 'dist', 'index.js')).href;
    for (let round = 0; round < 5; round++) {
      const dir = tmp.join('store');
      const child = spawn(process.execPath, ['--input-type=module', '-e', WRITER, dist, dir], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
      child.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
      const exited = new Promise((r) => child.once('exit', r));
      // Kill it once it has acknowledged a few hundred more writes (mid-stream, at no chosen point).
      const target = 300 + round * 97;
      await new Promise<void>((res, rej) => {
        const check = (): void => {
          if (out.split('\n').length > target) res();
        };
        child.stdout.on('data', check);
        child.once('exit', () => rej(new Error(`writer exited early: ${err}`)));
      });
      child.kill('SIGKILL');
      await exited;
      const acked = new Map<string, number>();
      for (const line of out.split('\n')) {
        const m = /^([abc]) (\d+)$/.exec(line);
        if (m) acked.set(m[1]!, Number(m[2]));
      }
      const store = await FileStateStore.open(dir);
      try {
        for (const key of ['a', 'b', 'c']) {
          const doc = await store.get<{ n: number; key: string; pad: string }>('volume', key);
          expect(doc, key).not.toBeNull();
          expect(doc!.version).toBeGreaterThanOrEqual(acked.get(key) ?? 0);
          // Whole, and the value written with that version.
          expect(doc!.value.key).toBe(key);
          expect(doc!.value.n).toBe(doc!.version);
          expect(doc!.value.pad.length).toBe(20000);
        }
        expect((await readdir(join(dir, 'volume'))).sort()).toEqual(['a.json', 'b.json', 'c.json']);
      } finally {
        await store.close();
      }
    }
  });
});
