// `mooring bench` honours the logging flags of every command (docs/logging.md): a short real
// run (fio on a plain file only) through the CLI's dispatch, as JSON records, without
// progress, and silenced; its table stays on stdout. Needs fio.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import { benchLogLine } from '../../src/bench/bench-log.js';
import { runCli } from '../../src/cli/cli.js';
import type { CliContext } from '../../src/cli/common.js';
import { makeCliLogger } from '../../src/cli/log.js';

const work = mkdtempSync(join(os.tmpdir(), 'mooring-bench-log-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

// One fio workload on the page-cached file target: a few seconds, no Mooring process.
const SHORT_RUN = [
  '--runtime', '1', '--ramp', '0', '--size', '16M', '--dir', work, '--targets', 'file-buffered', '--workloads', 'randread-4k-qd16-j1',
  '--no-rss', '--no-rebuild', '--no-backing-image', '--migrations', '0', '--upgrades', '0', '--guest-migrations', '0', '--out', '-',
];

async function bench(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const ctx: CliContext = { stdout: (t) => void (stdout += t), stderr: (t) => void (stderr += t) };
  const code = await runCli(['bench', ...args], ctx);
  return { code, stdout, stderr };
}

function records(stderr: string): Array<{ level: string; msg: string; code?: string; bench?: string }> {
  return stderr
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      try {
        return JSON.parse(l) as { level: string; msg: string };
      } catch {
        throw new Error(`not a JSON record: ${l}\n--- stderr ---\n${stderr}`);
      }
    });
}

describe('mooring bench logging', () => {
  it('a usage error follows --log-format and --log-level', async () => {
    const json = await bench(['--targets', 'nope', '--log-format', 'json']);
    expect(json.code).toBe(2);
    expect(records(json.stderr)).toEqual([expect.objectContaining({ level: 'error', code: 'INVALID_ARGUMENT', msg: expect.stringContaining('nope') })]);
    const human = await bench(['--targets', 'nope']);
    expect(human.code).toBe(2);
    expect(human.stderr).toMatch(/^mooring: INVALID_ARGUMENT: .*nope.*\nTry 'mooring bench --help'\.\n$/);
    const silent = await bench(['--targets', 'nope', '--log-level', 'silent']);
    expect(silent).toMatchObject({ code: 2, stderr: '' });
    const bad = await bench(['--log-format', 'xml']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/^mooring: INVALID_ARGUMENT: --log-format must be human or json/);
  });

  it('sorts its lines: warnings and failures warn, progress only with progress on', () => {
    let out = '';
    const log = makeCliLogger({ stderr: (t) => void (out += t) }, { format: 'json', level: 'info' });
    for (const progress of [true, false]) {
      out = '';
      const line = benchLogLine(log, progress);
      for (const l of ['[file-buffered] file', '  pre-written 16 MiB in 0.1 s', '  warning: sync -f failed: x', '  qemu-raw: FAILED: boom', 'wrote /x/y.md', '\nmooring bench: SIGINT: stopping', '']) line(l);
      const got = records(out).map((r) => `${r.level} ${r.bench ?? '-'} ${r.msg}`);
      expect(got).toEqual([
        ...(progress ? ['info progress [file-buffered] file', 'info progress pre-written 16 MiB in 0.1 s'] : []),
        'warn - sync -f failed: x',
        'warn - qemu-raw: FAILED: boom',
        'info - wrote /x/y.md',
        'info - bench: SIGINT: stopping',
      ]);
    }
  });

  it('a real run logs JSON records with --log-format json, no progress with --no-progress, and keeps its table on stdout', async () => {
    execFileSync('fio', ['--version'], { stdio: 'ignore' });
    const json = await bench([...SHORT_RUN, '--log-format', 'json']);
    expect(json.code, json.stderr).toBe(0);
    const all = records(json.stderr);
    const progress = all.filter((r) => r.bench === 'progress');
    expect(progress.map((r) => r.msg), json.stderr).toEqual(expect.arrayContaining([expect.stringMatching(/^\[file-buffered\] /), expect.stringMatching(/^pre-written 16 MiB/), expect.stringMatching(/^4k randread qd16 j1 .* IOPS/)]));
    expect(all.map((r) => r.msg)).toContainEqual(expect.stringMatching(/^bench: 1 targets x 1 workloads/));
    expect(json.stdout).toContain('4k randread qd16 j1');

    const quiet = await bench([...SHORT_RUN, '--no-progress']);
    expect(quiet.code, quiet.stderr).toBe(0);
    expect(quiet.stderr, 'no progress lines').not.toMatch(/pre-written|IOPS|\[file-buffered\]/);
    expect(quiet.stdout).toContain('4k randread qd16 j1');

    const silent = await bench([...SHORT_RUN, '--log-level', 'silent']);
    expect(silent).toMatchObject({ code: 0, stderr: '' });
    expect(silent.stdout).toContain('4k randread qd16 j1');
  }, 120_000);
});
