// Runs in every worker of the sanitizer pass before its test file: makes sure the file is
// tested under the sanitizers, against the sanitizer build, and not silently against the
// normal one (node-gyp-build would take prebuilds/ if MOORING_PREBUILD were lost).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { loadAddon } from '../../src/native/load.js';

const maps = (): string => readFileSync('/proc/self/maps', 'utf8');
if (!/\/libasan\.so/.test(maps())) {
  throw new Error(`sanitizer pass: this worker runs without the ASan runtime (LD_PRELOAD=${process.env.LD_PRELOAD ?? ''})`);
}
const dir = process.env.MOORING_PREBUILD;
if (!dir) throw new Error('sanitizer pass: MOORING_PREBUILD is not set');
loadAddon();
const expected = join(dir, 'build', 'Release', 'mooring.node');
if (!maps().includes(expected)) {
  const loaded = maps().split('\n').filter((l) => l.endsWith('.node')).map((l) => l.replace(/^.* /, ''));
  throw new Error(`sanitizer pass: expected ${expected} to be loaded, found ${[...new Set(loaded)].join(', ') || 'no addon'}`);
}

// The node processes the tests start (peers, crash children) inherit this environment and
// run under the sanitizers too, but without the leak check: they end in process.exit() or
// are killed, and at process.exit() nothing is torn down (V8's heap, addon objects still
// alive), so everything would count as leaked. The ASan runtime read ASAN_OPTIONS when this
// process started: changing it here leaves this worker's own leak check on.
process.env.ASAN_OPTIONS = (process.env.ASAN_OPTIONS ?? '').replace(/(^|:)detect_leaks=1(?=:|$)/, '$1detect_leaks=0');
