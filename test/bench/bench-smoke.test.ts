// Smoke test of the benchmark harness: a very short run must produce the table and the
// report. No timing is asserted (benchmarks are not tests); this only proves the harness
// starts its targets, parses fio's JSON and cleans up after itself.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { parseBenchArgs, runBench } from '../../src/bench/index.js';

// The run needs these tools and a build; a missing one fails the test loudly.
function requireTool(tool: string): void {
  try {
    execFileSync(tool, ['--version'], { stdio: 'ignore' });
  } catch (err) {
    throw new Error(`${tool} is required by the benchmark (apt-get install fio qemu-utils): ${String(err)}`);
  }
}

const root = join(import.meta.dirname, '..', '..');
const work = mkdtempSync(join(os.tmpdir(), 'mooring-bench-smoke-'));

afterAll(() => rmSync(work, { recursive: true, force: true }));

describe('bench options', () => {
  it('defaults to the full run and parses sizes and lists', () => {
    const full = parseBenchArgs([]);
    expect(full.runtimeSec).toBe(10);
    expect(full.workloadIds).toHaveLength(10);
    expect(full.targets).toContain('qemu-raw');
    const quick = parseBenchArgs(['--quick', '--size', '64M', '--targets', 'file-buffered,qemu-raw', '--out', '-']);
    expect(quick.runtimeSec).toBe(3);
    expect(quick.areaBytes).toBe(64 * 1024 * 1024);
    expect(quick.targets).toEqual(['file-buffered', 'qemu-raw']);
    expect(quick.outPath).toBeUndefined();
    expect(full.migrations).toBe(50);
    expect(quick.migrations).toBe(10);
    expect(parseBenchArgs(['--migrations', '0']).migrations).toBe(0);
    expect([full.guestMigrations, quick.guestMigrations, parseBenchArgs(['--guest-migrations', '0']).guestMigrations]).toEqual([10, 3, 0]);
    const bi = parseBenchArgs(['--backing-image-only', '--runtime', '2']);
    expect(bi).toMatchObject({ backingImage: true, targets: [], rss: false, rebuild: false, migrations: 0, outPath: undefined, runtimeSec: 2 });
    expect(full.backingImage).toBe(true);
    expect(parseBenchArgs(['--no-backing-image']).backingImage).toBe(false);
  });

  it('rejects unknown targets and bad sizes with exit code 2', async () => {
    const err = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
    try {
      expect(await runBench(['--targets', 'nope'])).toBe(2);
      expect(await runBench(['--size', '1000'])).toBe(2);
      expect(await runBench(['--migrations', '2.5'])).toBe(2);
    } finally {
      err.mockRestore();
    }
  });
});

describe('bench smoke run', () => {
  it('produces the table and the report, and leaves nothing behind', async () => {
    for (const tool of ['fio', 'qemu-nbd', 'qemu-img']) requireTool(tool);
    for (const built of ['dist/cli.js', 'prebuilds/linux-x64/mooring.node'])
      expect(existsSync(join(root, built)), `${built} missing: run npm run build`).toBe(true);
    const out = join(work, 'benchmarks.md');
    const targets = ['mooring-1', 'mooring-3-remote', 'qemu-raw', 'file-buffered'];
    let stdout = '';
    const outSpy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
      stdout += String(chunk);
      return true;
    });
    // The harness's log (stderr) is kept for the failure message, not printed.
    let stderr = '';
    const errSpy = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
      stderr += String(chunk);
      return true;
    });
    let code: number;
    try {
      code = await runBench([
        '--runtime', '1', '--ramp', '0', '--size', '32M', '--dir', work,
        '--targets', targets.join(','), '--workloads', 'randread-4k-qd16-j1,write-1m-qd8',
        '--no-rss', '--migrations', '3', '--upgrades', '2', '--guest-migrations', '2', '--out', out,
      ]);
    } finally {
      outSpy.mockRestore();
      errSpy.mockRestore();
    }
    expect(code, `mooring bench exited ${code}; its log:\n${stderr.slice(-8000)}`).toBe(0);
    expect(stdout).toContain('4k randread qd16 j1');
    expect(stdout).toContain('qemu-nbd raw (writeback)');
    expect(stdout).toMatch(/\d+(\.\d)?k?\s/);
    const md = readFileSync(out, 'utf8');
    expect(md).toContain('## Machine');
    expect(md).toContain('| workload |');
    expect(md).toContain('## Targets');
    expect(md).toMatch(/M1\/qemu raw/);
    // The remote target ran (4 data-engine processes) and the rebuild step measured both rebuilds.
    expect(stdout).toContain('Mooring 3 remote replicas');
    expect(md).toMatch(/full rebuild into an empty replica \S+ MiB in/);
    expect(md).toMatch(/3 remote replicas \(loopback TCP\) ≥ 0\.6× of 1 local replica on writes \| \*\*(pass|miss)\*\*/);
    // The migration step migrated three times and compared the pause with qemu-nbd's.
    expect(md).toMatch(/migrated 3 times between two hosts/);
    expect(md).toMatch(/live-migration hand-over < 50 ms median on loopback \| \*\*(pass|miss)\*\*/);
    // The upgrade step handed the engine's host over in place twice, restarted it, and compared with qemu-nbd restarted.
    expect(md).toMatch(/In place, engine host: client pause median [\d.]+ ms, p99 [\d.]+ ms, max [\d.]+ ms over 2 hand-offs/);
    expect(md).toMatch(/in-place upgrade: longest client pause < 100 ms, no reconnect \(4k randwrite qd16\) \| \*\*(pass|miss)\*\*/);
    // The guest step migrated a QEMU guest twice with Mooring and twice between qemu-nbd servers.
    expect(md).toMatch(/migrated 2 times between two hosts with pause-before-switchover/);
    expect(md).toMatch(/guest live migration: QEMU downtime within \+20 ms of two qemu-nbd servers \(median\), hand-over < 50 ms p99 \| \*\*(pass|miss)\*\*/);
    // The backing image step compared reads over a qcow2 image with qemu-nbd -r.
    expect(md).toContain('### Reads over a qcow2 backing image');
    expect(md).toMatch(/reads over a qcow2 backing image ≥ 1\.0× qemu-nbd -r on the same image \| \*\*(pass|miss)\*\*/);
    // The backing image step uploaded a file into one host and copied it to another.
    expect(md).toMatch(/copy to the second host \(read stream relayed into a write, SHA-512 verified on arrival\) [\d.]+ s = \d+ MiB\/s/);
    expect(md).toMatch(/backing image copy between hosts ≥ 0\.8× the disk's sequential write rate \| \*\*(pass|miss)\*\*/);
    // The scratch directory and every child are gone.
    expect(readdirSync(work).filter((f) => f.startsWith('mooring-bench-'))).toEqual([]);
  }, 300_000);
});
