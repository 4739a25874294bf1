// The environment of the sanitizer pass's test workers (see docs/hardening.md,
// "Sanitizers"). Shared by run.mjs and vitest.config.ts.
import { execFileSync } from 'node:child_process';
import { accessSync, constants, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';

import { ASAN_DIR, ROOT } from './build.mjs';

export const SUPPRESSIONS = join(ROOT, 'test', 'sanitizers', 'lsan.supp');

/**
 * Programs the native tests run that are not node. They would inherit LD_PRELOAD and run
 * with the ASan runtime in them: qemu-img and qemu-io hang in it (their coroutines switch
 * stacks with swapcontext), and LeakSanitizer would check the others' leaks at their exit,
 * which are not ours. Each gets a wrapper, first on PATH, that drops LD_PRELOAD and runs
 * the real one. node children (the tests' peers) keep it, and are checked like the workers.
 */
export const UNSANITIZED_TOOLS = [
  'qemu-img', 'qemu-io', 'qemu-nbd', 'nbdinfo', 'nbdcopy', 'fio', 'python3', 'openssl',
  'cp', 'cat', 'mkfifo', 'fallocate', 'mount', 'umount',
];

/** gcc's runtime library `name` (libasan.so, libubsan.so), or an error saying what to install. */
function runtime(name) {
  let path;
  try {
    path = execFileSync('gcc', [`-print-file-name=${name}`], { encoding: 'utf8' }).trim();
  } catch (err) {
    throw new Error(`sanitizers: gcc is needed to find ${name}: ${err instanceof Error ? err.message : String(err)}`);
  }
  // gcc prints the bare name back when it has no such file.
  if (!path.startsWith('/') || !existsSync(path)) {
    throw new Error(`sanitizers: gcc has no ${name} (on Debian 12: apt-get install libasan8 libubsan1)`);
  }
  return path;
}

function findOnPath(tool, path) {
  for (const dir of path.split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, tool);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** Writes the wrappers of UNSANITIZED_TOOLS into ASAN_DIR/bin and returns that directory. */
export function writeToolWrappers(path = process.env.PATH ?? '') {
  const bin = join(ASAN_DIR, 'bin');
  mkdirSync(bin, { recursive: true });
  for (const tool of UNSANITIZED_TOOLS) {
    const real = findOnPath(tool, path.split(delimiter).filter((d) => d !== bin).join(delimiter));
    // A tool this machine lacks stays missing, and the test that needs it says so.
    if (!real) continue;
    writeFileSync(join(bin, tool), `#!/bin/sh\nunset LD_PRELOAD\nexec '${real}' "$@"\n`, { mode: 0o755 });
  }
  return bin;
}

/**
 * The variables that make a node process run the sanitizer build of the addon under the
 * sanitizers, writing reports into `logDir` (one file per process: asan.<pid>, ubsan.<pid>).
 */
export function sanitizerEnv(logDir) {
  const bin = writeToolWrappers();
  return {
    // node is not built with ASan: its runtime must come first in the process.
    LD_PRELOAD: [runtime('libasan.so'), runtime('libubsan.so')].join(':'),
    ASAN_OPTIONS: [
      'detect_leaks=1',
      'halt_on_error=1',
      'abort_on_error=0',
      'exitcode=66',
      `log_path=${join(logDir, 'asan')}`,
      'print_suppressions=0',
    ].join(':'),
    LSAN_OPTIONS: [`suppressions=${SUPPRESSIONS}`, 'print_suppressions=0'].join(':'),
    UBSAN_OPTIONS: ['print_stacktrace=1', 'halt_on_error=1', 'exitcode=67', `log_path=${join(logDir, 'ubsan')}`].join(':'),
    MOORING_PREBUILD: ASAN_DIR,
    // What the tests read to know they run under the sanitizers (test/native/helpers.ts).
    MOORING_SANITIZERS: 'address,undefined',
    MOORING_SANITIZER_LOG_DIR: logDir,
    PATH: [bin, process.env.PATH ?? ''].join(delimiter),
  };
}
