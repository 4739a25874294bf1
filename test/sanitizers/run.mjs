#!/usr/bin/env node
// The sanitizer pass: builds the addon with ASan+UBSan (build.mjs), runs the native tests
// against it (vitest.config.ts), then prints every sanitizer report the test processes
// wrote. Exits 0 only when vitest passed and no process wrote a report.
//
//   node test/sanitizers/run.mjs [--no-build] [vitest args, e.g. test/native/replica.test.ts]
//
// The last line says what happened: `sanitizers: passed ...` or `sanitizers: FAILED ...`.
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

import { ASAN_DIR, ROOT, build } from './build.mjs';

const args = process.argv.slice(2);
const noBuild = args[0] === '--no-build';
if (noBuild) args.shift();

function fail(message) {
  process.stdout.write(`sanitizers: FAILED: ${message}\n`);
  process.exit(1);
}

if (!noBuild) {
  try {
    const { ms } = build();
    process.stdout.write(`sanitizers: addon built in ${(ms / 1000).toFixed(1)} s\n`);
  } catch (err) {
    fail(err instanceof Error ? err.message : String(err));
  }
}

mkdirSync(ASAN_DIR, { recursive: true });
const logDir = mkdtempSync(join(ASAN_DIR, 'logs-'));
const results = join(logDir, 'results.json');
const started = Date.now();
const vitest = spawn(
  process.execPath,
  [
    join(ROOT, 'node_modules', 'vitest', 'vitest.mjs'),
    'run',
    '--config', join(ROOT, 'test', 'sanitizers', 'vitest.config.ts'),
    '--reporter=default', '--reporter=json', `--outputFile.json=${results}`,
    ...args,
  ],
  { cwd: ROOT, stdio: ['inherit', 'pipe', 'pipe'], env: { ...process.env, MOORING_SANITIZER_LOG_DIR: logDir } },
);
// Reports normally go to the log directory, but a runtime may still print one to stderr
// (UBSan in a child process does): the output is passed through and searched for them too.
const REPORT_LINE = /^sanitizer worker for |runtime error:|ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)/;
const reportLines = [];
function passThrough(from, to) {
  let partial = '';
  from.on('data', (d) => {
    to.write(d);
    const lines = (partial + d.toString('utf8')).split('\n');
    partial = lines.pop() ?? '';
    for (const l of lines) if (REPORT_LINE.test(l)) reportLines.push(l);
  });
  return new Promise((resolve) => from.on('close', () => {
    if (REPORT_LINE.test(partial)) reportLines.push(partial);
    resolve();
  }));
}
const drained = Promise.all([passThrough(vitest.stdout, process.stdout), passThrough(vitest.stderr, process.stderr)]);
const [code, signal] = await new Promise((resolve) => vitest.on('exit', (c, s) => resolve([c, s])));
await drained;
const seconds = ((Date.now() - started) / 1000).toFixed(1);

// Every report, in full: asan.<pid> (ASan and LeakSanitizer), ubsan.<pid>.
const reports = readdirSync(logDir).filter((f) => /^(asan|ubsan)\.\d+$/.test(f)).sort();
for (const f of reports) {
  process.stdout.write(`\n==== sanitizer report ${join(logDir, f)} ====\n${readFileSync(join(logDir, f), 'utf8')}\n`);
}

let counts = 'no test results';
try {
  const r = JSON.parse(readFileSync(results, 'utf8'));
  counts = `${r.numPassedTests} tests passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped in ${r.numTotalTestSuites ? r.testResults.length : 0} files`;
} catch {
  // vitest died before writing them; its exit status says so below.
}
const problems = [];
if (code !== 0) problems.push(`vitest exited with ${code ?? signal}`);
if (reports.length > 0) problems.push(`${reports.length} sanitizer report(s): ${reports.join(', ')}`);
if (reportLines.length > 0) problems.push(`sanitizer reports in the output: ${reportLines.slice(0, 5).join(' | ')}`);
if (problems.length > 0) fail(`${problems.join('; ')} (${counts}, ${seconds} s; logs in ${logDir})`);
process.stdout.write(`sanitizers: passed: ${counts}, no sanitizer report, ${seconds} s (logs in ${logDir})\n`);
