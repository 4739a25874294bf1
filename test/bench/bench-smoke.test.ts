// Smoke test of the benchmark harness: a very short run must produce the table and the
// report. No timing is asserted (benchmarks are not tests); this only proves the harness
// starts its targets, parses fio's JSON and cleans up after itself.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { parseBenchArgs, runBench } from '../../src/bench/index.js';
import { SCALE_DEPTHS, SCALE_EXTENTS, SCALE_VOLUMES, scaleSizes } from '../../src/bench/scale/index.js';
import { CONTROL_OPS, type ControlResults, type ControlStoreId } from '../../src/bench/control/index.js';
import { renderControlMarkdown } from '../../src/bench/control/report.js';
import { costPerIo, parsePerfCsv } from '../../src/bench/cost.js';

// The run's servers listen on --port-base and up to 82 ports above it (default 17810); a
// machine running several suites at once can give this one its own range.
const PORT_BASE = process.env.MOORING_BENCH_PORT_BASE ?? '17810';

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

/** Runs the bench with stdout and stderr captured (the log is kept for a failure message, not printed). */
async function runCaptured(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const outSpy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
    stdout += String(chunk);
    return true;
  });
  const errSpy = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
    stderr += String(chunk);
    return true;
  });
  try {
    return { code: await runBench(argv), stdout, stderr };
  } finally {
    outSpy.mockRestore();
    errSpy.mockRestore();
  }
}

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
    // The scale curves are off by default; --scale-only runs nothing else and writes no main report.
    expect(full).toMatchObject({ scale: false, scaleMax: undefined, scaleOutPath: 'docs/benchmarks-scale.md' });
    expect(parseBenchArgs(['--scale']).scale).toBe(true);
    const sc = parseBenchArgs(['--scale-only', '--scale-max', '20', '--scale-out', '-']);
    expect(full.scaleCurves).toEqual(['host', 'depth', 'extents', 'cluster']);
    // --scale-curves: the curves named, in their run order whatever order they are given in.
    expect(parseBenchArgs(['--scale-only', '--scale-curves', 'cluster,host']).scaleCurves).toEqual(['host', 'cluster']);
    expect(sc).toMatchObject({ scale: true, scaleMax: 20, targets: [], rss: false, rebuild: false, migrations: 0, upgrades: 0, guestMigrations: 0, backingImage: false, outPath: undefined, scaleOutPath: undefined });
    // The control step is off by default; --control-only runs nothing else.
    expect(full).toMatchObject({ control: false, controlCycles: 50, controlBasePort: 17900, controlOutPath: 'docs/benchmarks-control.md' });
    expect(quick.controlCycles).toBe(10);
    const co = parseBenchArgs(['--control-only', '--control-cycles', '7', '--control-port', '28400', '--control-out', '-']);
    expect(co).toMatchObject({ control: true, controlCycles: 7, controlBasePort: 28400, controlOutPath: undefined, scale: false, backingImage: false, targets: [], rss: false, rebuild: false, migrations: 0, upgrades: 0, guestMigrations: 0, outPath: undefined });
    // The replicated-path peers run by default; perf counts by default; the ports move as a block.
    expect(full.targets).toEqual(expect.arrayContaining(['nbdkit-file', 'qemu-nbd-tcp', 'qemu-quorum']));
    expect(full).toMatchObject({ cost: true, portBase: 17810 });
    expect(parseBenchArgs(['--no-perf', '--port-base', '28300'])).toMatchObject({ cost: false, portBase: 28300 });
  });

  it('reads perf stat CSV and turns a window into per-I/O figures per process', () => {
    const csv = '# started on x\n\n7290,,raw_syscalls:sys_enter,84380673,100.00,,\n<not counted>,,context-switches,0,100.00,,\n';
    expect(parsePerfCsv(csv)).toEqual({ syscalls: 7290, switches: 0 });
    expect(parsePerfCsv('<not supported>,,raw_syscalls:sys_enter,0,100.00,,\n')).toEqual({ syscalls: undefined, switches: undefined });
    const procs = [{ name: 'engine host h0', pid: 1 }, { name: 'replica host h1', pid: 2 }];
    expect(costPerIo(procs, { cpuSec: [0.3, 0.1], syscalls: 2000, switches: 500 }, 10_000)).toEqual({
      ios: 10_000,
      cpuUsPerIo: 40,
      perProcess: [{ name: 'engine host h0', cpuUsPerIo: 30 }, { name: 'replica host h1', cpuUsPerIo: 10 }],
      syscallsPerIo: 0.2,
      switchesPerIo: 0.05,
    });
    expect(costPerIo([], { cpuSec: [], syscalls: undefined, switches: undefined }, 100)).toBeUndefined();
  });

  it('caps the scale curves: --quick keeps two sizes, --scale-max N measures N instead of the larger ones', () => {
    expect(scaleSizes(SCALE_VOLUMES, { quick: false, max: undefined })).toEqual([10, 100, 1000]);
    expect(scaleSizes(SCALE_EXTENTS, { quick: true, max: undefined })).toEqual([10_000, 100_000]);
    expect(scaleSizes(SCALE_DEPTHS, { quick: false, max: 20 })).toEqual([0, 20]);
    expect(scaleSizes(SCALE_VOLUMES, { quick: false, max: 100 })).toEqual([10, 100]);
    expect(scaleSizes(SCALE_EXTENTS, { quick: false, max: 20 })).toEqual([20]);
  });

  it('rejects unknown targets and bad sizes with exit code 2', async () => {
    const err = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
    try {
      expect(await runBench(['--targets', 'nope'])).toBe(2);
      expect(await runBench(['--size', '1000'])).toBe(2);
      expect(await runBench(['--migrations', '2.5'])).toBe(2);
      expect(await runBench(['--scale-max', '0'])).toBe(2);
      expect(await runBench(['--scale-only', '--scale-curves', 'cluster,nope'])).toBe(2);
      expect(await runBench(['--scale-only', '--backing-image-only'])).toBe(2);
      expect(await runBench(['--control-only', '--scale-only'])).toBe(2);
      expect(await runBench(['--control-cycles', '0'])).toBe(2);
      expect(await runBench(['--control-port', '65535'])).toBe(2);
      expect(await runBench(['--port-base', '80'])).toBe(2);
    } finally {
      err.mockRestore();
    }
  });
});

describe('bench control report', () => {
  it('shows failed operations with their codes, and etcd against the file store per operation', () => {
    const store = (id: ControlStoreId, p50Ms: number, failed: number): ControlResults['stores'][number] => ({
      store: id,
      ops: CONTROL_OPS.map((op) => ({ op, count: op === 'delete' ? 10 - failed : 10, failed: op === 'delete' ? failed : 0, opsPerSec: 1000 / p50Ms, p50Ms, p99Ms: 2 * p50Ms, reads: 3, writes: 2 })),
      cycleP50Ms: 6 * p50Ms,
      failures: failed > 0 ? [{ op: 'delete', code: 'UNAVAILABLE', message: 'delete of etcd-0003: 1 replica(s) could not be deleted' }] : [],
    });
    const r: ControlResults = { settings: { cycles: 10, basePort: 17900 }, volumeBytes: 16 * 1024 ** 2, replicas: 2, etcdVersion: 'etcd 3.4.23', stores: [store('file', 10, 0), store('etcd', 15, 1)] };
    const machine = { cpuModel: 'cpu', cores: 2, memoryGiB: 4, distro: 'Debian', kernel: 'Linux', filesystem: 'ext4', fio: 'fio', qemuNbd: 'qemu-nbd', node: 'v20', mooring: '0.1.0' };
    const md = renderControlMarkdown(r, { startedAt: new Date(0), durationSec: 1, machine, scratchDir: '/tmp', loadBefore: [0, 0, 0], loadAfter: [0, 0, 0], commit: undefined, command: 'mooring bench --control-only' });
    expect(md).toContain('| delete | etcd | 9 | 1 | 66.7 | 15.0 | 30.0 | 3 | 2 |');
    expect(md).toMatch(/## Failed operations[\s\S]*- etcd: \*\*UNAVAILABLE\*\*: delete of etcd-0003/);
    expect(md).toContain('| attach | etcd | 0.67× | 1.50× | 1.50× |');
    expect(md).toContain('| whole cycle | etcd | – | 1.50× | – |');
  });
});

describe('bench smoke run', () => {
  it('produces the table and the report, and leaves nothing behind', async () => {
    for (const tool of ['fio', 'qemu-nbd', 'qemu-img', 'nbdkit', 'qemu-storage-daemon', 'cc']) requireTool(tool);
    for (const built of ['dist/cli.js', 'prebuilds/linux-x64/mooring.node'])
      expect(existsSync(join(root, built)), `${built} missing: run npm run build`).toBe(true);
    const out = join(work, 'benchmarks.md');
    const targets = ['mooring-1', 'mooring-3-remote', 'mooring-3-mixed', 'qemu-raw', 'nbdkit-file', 'qemu-nbd-tcp', 'qemu-quorum', 'file-buffered'];
    const { code, stdout, stderr } = await runCaptured([
      '--runtime', '1', '--ramp', '0', '--size', '32M', '--dir', work, '--port-base', PORT_BASE,
      '--targets', targets.join(','), '--workloads', 'randread-4k-qd16-j1,write-1m-qd8',
      '--no-rss', '--migrations', '3', '--upgrades', '2', '--guest-migrations', '2', '--out', out,
    ]);
    expect(code, `mooring bench exited ${code}; its log:\n${stderr.slice(-8000)}`).toBe(0);
    expect(stdout).toContain('4k randread qd16 j1');
    expect(stdout).toContain('qemu-nbd raw (writeback)');
    expect(stdout).toMatch(/\d+(\.\d)?k?\s/);
    const md = readFileSync(out, 'utf8');
    expect(md).toContain('## Machine');
    expect(md).toContain('| workload |');
    expect(md).toContain('## Targets');
    expect(md).toMatch(/M1\/qemu raw/);
    // The peers ran: nbdkit, one qemu-nbd over TCP and the quorum, the TCP ones with the TCP_NODELAY shim.
    for (const label of ['nbdkit file plugin', 'qemu-nbd raw over TCP (one remote copy)', 'QEMU quorum over 3 qemu-nbd (TCP)']) expect(stdout).toContain(label);
    expect(md).toContain('TCP_NODELAY');
    // Cost per I/O: a row per served target and workload, CPU per process for the multi-process ones;
    // syscalls and switches are figures when perf works here, and the report says why when it does not.
    expect(md).toContain('## Cost per I/O and the replicated-path peers');
    const costRows = md.split('## Cost per I/O and the replicated-path peers')[1]!;
    const fig = String.raw`(\d+\.\d+|–)`;
    for (const label of ['Mooring 1 replica', 'nbdkit file plugin', 'qemu-nbd raw over TCP \\(one remote copy\\)']) {
      expect(costRows).toMatch(new RegExp(String.raw`^\| 4k randread qd16 j1 \| ${label} \| \S+ \| \d+\.\d \| ${fig} \| ${fig} \|  \|$`, 'm'));
    }
    expect(costRows).toMatch(/^\| 1M write qd8 \| Mooring 3 remote replicas \(loopback TCP\) \| .* \| engine host h0 [\d.]+, replica host h1 [\d.]+, replica host h2 [\d.]+, replica host h3 [\d.]+ \|$/m);
    expect(costRows).toMatch(/^\| 1M write qd8 \| QEMU quorum over 3 qemu-nbd \(TCP\) \| .* \| qemu-storage-daemon [\d.]+, qemu-nbd c0 [\d.]+, qemu-nbd c1 [\d.]+, qemu-nbd c2 [\d.]+ \|$/m);
    if (/syscalls and context switches not measured/.test(md)) expect(costRows).toMatch(/\| – \| – \|/);
    else expect(costRows).toMatch(/^\| 4k randread qd16 j1 \| Mooring 1 replica \| \S+ \| \d+\.\d \| \d+\.\d \| \d+\.\d\d \|/m);
    expect(costRows).toMatch(/^\| 1M write qd8 \| [\d.]+× \| [\d.]+× \| [\d.]+× \| [\d.]+× \| [\d.]+× \| [\d.]+× \| [\d.]+× \| [\d.]+× \|$/m);
    expect(md).toMatch(/cost per 4k random write, 3 remote replicas, all processes: ≤ 25 µs CPU, ≤ 6 syscalls, ≤ 1 context switch \| \*\*not measured\*\*/);
    expect(md).toMatch(/3 remote replicas ≥ 1\.0× QEMU quorum on every row \| \*\*(pass|miss)\*\*/);
    expect(md).toMatch(/1 replica ≥ 1\.0× nbdkit on every row \| \*\*(pass|miss)\*\*/);
    // One replica on the engine's host and two remote: three data-engine processes, and reads judged against 1 local replica.
    expect(costRows).toMatch(/^\| 4k randread qd16 j1 \| Mooring 3 replicas, 1 on the engine host \+ 2 remote \(loopback TCP\) \| .* \| engine host h0 [\d.]+, replica host h1 [\d.]+, replica host h2 [\d.]+ \|$/m);
    expect(md).toMatch(/reads from the local replica when there is one: .* ≥ 0\.9× of 1 local replica on reads \| \*\*(pass|miss)\*\*/);
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
    // ... pulled by the second host's data engine from the first directly, and relayed through the bench's process (the fallback).
    // ... the bytes of the pull over the replica protocol (the hosts have replica servers).
    expect(md).toMatch(/copy to the second host pulled from the first directly \(data engine to data engine over replica protocol, SHA-512 verified on arrival\) [\d.]+ s = \d+ MiB\/s, relayed through the bench's process \(the fallback\) [\d.]+ s = \d+ MiB\/s/);
    expect(md).toMatch(/backing image copy between hosts ≥ 0\.8× the disk's sequential write rate \| \*\*(pass|miss)\*\*/);
    // The scratch directory and every child are gone.
    expect(readdirSync(work).filter((f) => f.startsWith('mooring-bench-'))).toEqual([]);
  }, 300_000);
});

describe('bench scale smoke run', () => {
  it('measures every scale curve at small sizes and writes their figures and growth factors', async () => {
    for (const tool of ['fio']) requireTool(tool);
    expect(existsSync(join(root, 'dist/cli.js')), 'dist/cli.js missing: run npm run build').toBe(true);
    const out = join(work, 'benchmarks-scale.md');
    const { code, stdout, stderr } = await runCaptured(['--scale-only', '--scale-max', '20', '--runtime', '1', '--dir', work, '--scale-out', out]);
    expect(code, `mooring bench exited ${code}; its log:\n${stderr.slice(-8000)}`).toBe(0);
    const md = readFileSync(out, 'utf8');
    for (const section of ['## Machine', '## Volumes per host', '## Volumes per cluster', '## Snapshot chain depth', '## Extents']) expect(md).toContain(section);
    const num = String.raw`[\d,]+(?:\.\d+)?`;
    const row = (size: string, columns: number): RegExp => new RegExp(String.raw`^\| ${size} \|` + String.raw` ${num} \|`.repeat(columns) + String.raw` ${num} \| ok \|$`, 'm');
    // Volumes per host at 10 and 20: create, attach p50/p99, list, status, threads, fds, RSS.
    expect(md).toMatch(row('10', 8));
    expect(md).toMatch(row('20', 8));
    // Volumes per cluster: list, full pass, idle CPU, attach p99 at both sizes.
    expect(md.split('## Volumes per cluster')[1]).toMatch(row('20', 4));
    // Depth 20: IOPS of both volumes, their ratio, snapshot create, fds (depth 0 has no snapshot time).
    expect(md.split('## Snapshot chain depth')[1]).toMatch(row('20', 5));
    // Extents 20: reopen, RSS, RSS per extent (negative when the process shrank: small sizes are noise).
    expect(md.split('## Extents')[1]).toMatch(new RegExp(String.raw`^\| 20 \| ${num} \| ${num} \| -?${num} \| ${num} \| ok \|$`, 'm'));
    // Growth per step, as a factor and against the growth in N.
    expect(md).toMatch(/\| 10 → 20 \(×2\.0\) \| ×[\d.,]+ \(-?[\d.,]+ of N's\) \|/);
    expect(md).toMatch(/\| 0 → 20 \(from 0\) \| ×[\d.,]+ \|/);
    expect(md).toMatch(/measured at commit `[0-9a-f]{12}/);
    expect(stdout).toContain('Volumes per cluster:');
    expect(readdirSync(work).filter((f) => f.startsWith('mooring-bench-'))).toEqual([]);
  }, 300_000);
});

describe('bench control smoke run', () => {
  it('runs the control operations with the file store, etcd and etcd under leadership, and writes their figures and ratios', async () => {
    for (const tool of ['fio', 'etcd']) requireTool(tool);
    expect(existsSync(join(root, 'dist/cli.js')), 'dist/cli.js missing: run npm run build').toBe(true);
    const out = join(work, 'benchmarks-control.md');
    // Ports 28410-28413: etcd's client and peer ports, the two data engines' replica servers.
    const { code, stdout, stderr } = await runCaptured(['--control-only', '--control-cycles', '2', '--control-port', '28410', '--dir', work, '--control-out', out]);
    expect(code, `mooring bench exited ${code}; its log:\n${stderr.slice(-8000)}`).toBe(0);
    const md = readFileSync(out, 'utf8');
    for (const section of ['## Machine', '## Method', '## Operations', '## etcd against the file store']) expect(md).toContain(section);
    expect(md).toMatch(/^- etcd: etcd \d+\.\d+/m);
    const num = String.raw`[\d,]+\.\d`;
    // Every operation on every store: 2 measured, none failed, ops/s, p50 and p99, store reads and writes
    // (every operation writes: at least its records, or the volume's epoch).
    for (const op of ['create', 'attach', 'snapshot', 'migrate', 'detach', 'delete']) {
      for (const store of ['file store', 'etcd', 'etcd, leader-guarded writes']) {
        expect(md).toMatch(new RegExp(String.raw`^\| ${op} \| ${store} \| 2 \| 0 \| ${num} \| ${num} \| ${num} \| \d+ \| [1-9]\d* \|$`, 'm'));
      }
      for (const store of ['etcd', 'etcd, leader-guarded writes']) {
        expect(md).toMatch(new RegExp(String.raw`^\| ${op} \| ${store} \| ${num}\d× \| ${num}\d× \| ${num}\d× \|$`, 'm'));
      }
    }
    expect(md).toMatch(/^\| whole cycle \| etcd \| – \| [\d.,]+× \| – \|$/m);
    expect(md).toMatch(/measured at commit `[0-9a-f]{12}/);
    expect(stdout).toContain('Control operations (2 cycles per store):');
    // The scratch directory (etcd's data and the data engines') is gone.
    expect(readdirSync(work).filter((f) => f.startsWith('mooring-bench-'))).toEqual([]);
  }, 300_000);
});
