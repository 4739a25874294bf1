// The sanitizer pass as part of `npm test` (docs/hardening.md, "Sanitizers"): the addon built
// with ASan+UBSan, then every test in test/native run against it by a vitest of its own
// (test/sanitizers/run.mjs), LeakSanitizer checking each test process as it exits. Fails
// with that run's whole output (the sanitizer reports are at its end) if a test failed, a
// sanitizer reported anything, or a test process did not exit so that it could be checked.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';

const BUILD = fileURLToPath(new URL('./build.mjs', import.meta.url));
const RUN = fileURLToPath(new URL('./run.mjs', import.meta.url));

/** Runs a node script, its stdout and stderr together, as the terminal would show them. */
function runNode(script: string, args: string[]): Promise<{ status: string; output: string }> {
  // The variables vitest set for this worker would make the inner vitest think it runs
  // inside this one.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('VITEST') && k !== 'TEST'));
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...env, NO_COLOR: '1', FORCE_COLOR: '0' },
    });
    const chunks: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => chunks.push(d));
    child.stderr.on('data', (d: Buffer) => chunks.push(d));
    child.on('error', reject);
    child.on('close', (code, signal) => {
      resolve({ status: code === 0 ? 'ok' : `exit ${code ?? signal}`, output: Buffer.concat(chunks).toString('utf8') });
    });
  });
}

let built = false;

it('builds the addon with -fsanitize=address,undefined into build-asan/', async () => {
  const r = await runNode(BUILD, []);
  if (r.status !== 'ok') throw new Error(`the sanitizer build failed (${r.status}):\n${r.output}`);
  console.log(r.output.trim().split('\n').pop());
  built = true;
}, 20 * 60_000);

it('runs every test in test/native under ASan+UBSan: all pass, no sanitizer report, LeakSanitizer clean', async () => {
  if (!built) throw new Error('not run: the sanitizer build failed (previous test)');
  const r = await runNode(RUN, ['--no-build']);
  const last = r.output.trim().split('\n').pop() ?? '';
  if (r.status !== 'ok' || !last.startsWith('sanitizers: passed:')) {
    throw new Error(`the sanitizer pass failed (${r.status}); its output:\n${r.output}`);
  }
  // A pass that ran nothing proves nothing.
  expect(Number(/: (\d+) tests passed, 0 failed/.exec(last)?.[1] ?? 0)).toBeGreaterThan(100);
  console.log(last);
}, 30 * 60_000);
