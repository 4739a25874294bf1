// Deep snapshot chains against the open-file limit and a model (real addon, each run in a
// child process: test/native/chain-limits-child.mjs). Layer files other than the head are
// opened on demand through the process-wide layer descriptor cache (store/layer-fd-cache.h),
// so a 3-replica volume with 1,000 snapshots opens, reads and snapshots under a 1,024
// open-file limit (before the cache it failed with EMFILE at depth 335); and the data of
// chains read through a cache of 3 descriptors (every read may evict and reopen) matches a
// model across writes, write-zeroes, snapshots, deletes, reverts and reopens.
import { execFileSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { Scratch } from './helpers.js';

const CHILD = join(dirname(fileURLToPath(import.meta.url)), 'chain-limits-child.mjs');

/** Runs the child with `args` (under `prlimit` when given); its stderr passes through. */
function runChild(args: string[], env: Record<string, string>, nofile?: number): Record<string, number> {
  const cmd = nofile === undefined ? process.execPath : 'prlimit';
  const argv = nofile === undefined ? [CHILD, ...args] : [`--nofile=${nofile}:${nofile}`, process.execPath, CHILD, ...args];
  const out = execFileSync(cmd, argv, { encoding: 'utf8', env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'] });
  return JSON.parse(out.trim().split('\n').pop()!) as Record<string, number>;
}

describe('deep snapshot chains (real addon, child processes)', () => {
  it('a 3-replica volume with 1,000 snapshots opens, reads the nearest layer of each block and snapshots under a 1,024 open-file limit', () => {
    const s = new Scratch('mooring-native-chain-fds-');
    try {
      // No MOORING_LAYER_FDS: the default capacity comes from the limit (a quarter of it).
      const env = { MOORING_LAYER_FDS: '' };
      const r = runChild(['deep', s.root, '1000'], env, 1024);
      expect(r.layers).toBe(1001);
      // 3 heads + 3 locks + at most 256 cached layer files + node's own: far below 3,000.
      expect(r.fds).toBeLessThan(1024);
      expect(r.fds).toBeLessThan(400);
    } finally {
      s.cleanup();
    }
  }, 600_000);

  it('reads through a cache of 3 descriptors match a model across writes, zeroes, snapshots, deletes, reverts and reopens', () => {
    const seed = Number(process.env.MOORING_TEST_SEED ?? Date.now() % 1_000_000) || 1;
    console.log(`chain model seed ${seed} (MOORING_TEST_SEED=${seed} repeats it)`);
    const s = new Scratch('mooring-native-chain-model-');
    try {
      const r = runChild(['random', s.root, String(seed), '400'], { MOORING_LAYER_FDS: '3' });
      expect(r.ops).toBe(400);
    } finally {
      s.cleanup();
    }
  }, 300_000);
});
