// The sanitizer pass: test/native against the ASan+UBSan build of the addon
// (build-asan/). Run it with `node test/sanitizers/run.mjs`, which builds that addon, sets
// MOORING_SANITIZER_LOG_DIR and checks the reports afterwards; see docs/hardening.md.
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

// @ts-expect-error: a plain .mjs module without types
import { sanitizerEnv } from './env.mjs';
import { leakCheckedForks } from './leak-checked-forks.js';

const logDir = process.env.MOORING_SANITIZER_LOG_DIR;
if (!logDir) throw new Error('MOORING_SANITIZER_LOG_DIR is not set: run the sanitizer pass with `node test/sanitizers/run.mjs`');

export default defineConfig({
  test: {
    root: fileURLToPath(new URL('../..', import.meta.url)),
    include: ['test/native/**/*.test.ts'],
    // Each file in its own process, one at a time, ended so that LeakSanitizer runs.
    pool: leakCheckedForks,
    isolate: true,
    fileParallelism: false,
    // Only the workers run under the sanitizers (LD_PRELOAD is set for them, not for this
    // process): vitest passes test.env to the processes it forks.
    env: sanitizerEnv(logDir) as Record<string, string>,
    setupFiles: ['test/sanitizers/worker-setup.ts'],
    // ASan makes the native code 2-3 times slower.
    testTimeout: 300_000,
    hookTimeout: 300_000,
    // Not the summary reporter: the `N passed, N failed` line CI reads is the outer run's.
    reporters: ['default'],
  },
});
