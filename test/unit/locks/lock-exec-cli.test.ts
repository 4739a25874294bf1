// The mooring-lock-exec bin's command line, as a user meets it: --help, usage errors (exit
// 2, with the usage), and 127 kept for "the command was not run". Runs the built bin.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const bin = join(import.meta.dirname, '..', '..', '..', 'dist', 'lock-exec.js');

function run(...args: string[]) {
  expect(existsSync(bin), `${bin} missing: run npm run build`).toBe(true);
  // No sanlock daemon here on purpose: only the command line is under test.
  const r = spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env: { ...process.env, SANLOCK_RUN_DIR: '/nonexistent' }, timeout: 30_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('mooring-lock-exec command line', () => {
  it('--help and -h print the usage on stdout and exit 0', () => {
    for (const h of ['--help', '-h']) {
      const r = run(h);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toMatch(/^usage: mooring-lock-exec /);
      expect(r.stdout).toContain('--killpath-args ARGS');
      expect(r.stderr).toBe('');
    }
  });

  it.each([
    [['--bogus', '--', 'true'], 'unknown option "--bogus"'],
    [['--restrict', 'sigstop', '--', 'true'], '--restrict needs a valid value (got "sigstop")'],
    [['--control-fd'], '--control-fd needs a valid value (got none)'],
    [['--'], 'no COMMAND after --'],
    [[], 'no COMMAND after --'],
  ])('%j is a usage error: exit 2 with the message and the usage', (args, message) => {
    const r = run(...args);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`mooring-lock-exec: ${message}`);
    expect(r.stderr).toContain('usage: mooring-lock-exec');
    expect(r.stdout).toBe('');
  });

  it('a valid command line that cannot register with the daemon still exits 127 (not run), with a coded error', () => {
    const r = run('--', 'true');
    expect(r.code).toBe(127);
    expect(r.stderr).toMatch(/^mooring-lock-exec: [A-Z_]+: /);
  });
});
