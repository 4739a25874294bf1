#!/usr/bin/env node
// The `mooring` executable (package.json bin -> dist/cli.js).
import { runCli } from './cli.js';
import { processContext } from './common.js';

/** How long the process may linger after the command finished before it exits anyway. */
const EXIT_GRACE_MS = 2000;

runCli(process.argv.slice(2), processContext()).then(
  (code) => {
    process.exitCode = code;
    // Everything is closed by now; if a handle still holds the event loop open, do not hang
    // a script waiting for us.
    setTimeout(() => process.exit(code), EXIT_GRACE_MS).unref();
  },
  (err: unknown) => {
    process.stderr.write(`mooring: IO_ERROR: ${String(err)}\n`);
    process.exitCode = 1;
  },
);
