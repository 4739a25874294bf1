/**
 * `mooring bench`: fio against Mooring, qemu-nbd and a plain file on one filesystem, one job
 * at a time; prints a table and writes docs/benchmarks.md. See options.ts for the flags.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statfsSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { prewriteJob, runFio, scatteredWritesJob, workloadJob } from './fio.js';
import { describeMachine } from './machine.js';
import { BenchUsageError, HELP_TEXT, parseBenchArgs, type BenchOptions } from './options.js';
import { BenchError, BenchInterrupted, ProcessTracker, readProcStats } from './processes.js';
import {
  BUSY_LOAD,
  renderMarkdownReport,
  renderStdout,
  type BenchResults,
  type Measurement,
  type RssResult,
  type ServerPeak,
} from './report.js';
import { TARGET_LABELS, TARGET_SHORT, type TargetId } from './target-ids.js';
import { startMooring, startTarget, type RunningTarget, type TargetContext } from './targets.js';
import { isWrite, workloadById, type Workload } from './workloads.js';
import type { FioFigures } from './fio.js';
import { CostProbe, costPerIo, perfWorks, warmPageCache } from './cost.js';
import { measureMigration, type MigrationResults } from './migration.js';
import { measureRebuild, type RebuildResults } from './rebuild.js';
import { measureUpgrade, type UpgradeResults } from './upgrade.js';
import { measureGuestMigration, type GuestMigrationResults } from './guest-migration.js';
import { measureBackingImageDelivery, type BackingImageDeliveryResults } from './backing-image-delivery.js';
import { measureBackingImageRead, type BackingImageReadResults } from './backing-image-read.js';
import { benchLogLine } from './bench-log.js';
import { measureScale, type ScaleResults } from './scale/index.js';
import { renderScaleMarkdown, renderScaleStdout } from './scale/report.js';
import { measureControl, type ControlResults } from './control/index.js';
import { renderControlMarkdown, renderControlStdout } from './control/report.js';
import { DEFAULT_LOG_SETTINGS, makeCliLogger } from '../cli/log.js';
import type { Logger } from '../util/logger.js';

export { parseBenchArgs, type BenchOptions } from './options.js';

/** The RSS measurement: a 1 TiB sparse volume and 10,000 scattered 4 KiB writes. */
const RSS_VOLUME_BYTES = 1024 ** 4;
const RSS_WRITES = 10_000;
/** A server given this long after Ctrl-C is killed: its data is thrown away anyway. */
const INTERRUPT_GRACE_MS = 5_000;
/** Free space beyond what the targets hold, kept for the rest of the machine. */
const FREE_SPACE_MARGIN_BYTES = 1024 ** 3;

/** Locates this package's root (the directory whose package.json is named 'mooring'). */
function packageRoot(): string | undefined {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 8; i++) {
    const pj = join(dir, 'package.json');
    if (existsSync(pj)) {
      try {
        if ((JSON.parse(readFileSync(pj, 'utf8')) as { name?: string }).name === 'mooring') return dir;
      } catch {
        // Not ours; keep walking.
      }
    }
    const up = dirname(dir);
    if (up === dir) break;
    dir = up;
  }
  return undefined;
}

function mooringVersion(root: string | undefined): string {
  if (!root) return 'unknown';
  try {
    return (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version?: string }).version ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Mutable state shared by the steps of one run. */
interface RunState {
  opts: BenchOptions;
  tracker: ProcessTracker;
  abort: AbortSignal;
  scratch: string;
  mooringCli: string | undefined;
  log: (line: string) => void;
  measurements: Measurement[];
  serverPeaks: ServerPeak[];
  failures: Array<{ what: string; message: string }>;
  /** perf stat counts syscalls and context switches (checked in preflight). */
  perf: boolean;
}

/** Flushes the scratch filesystem so one run's writeback does not land in the next. */
async function syncfs(s: RunState): Promise<void> {
  const r = await s.tracker.run('sync', ['-f', s.scratch], s.abort, { timeoutMs: 300_000 });
  if (r.code !== 0) s.log(`  warning: sync -f failed: ${r.stderr.trim()}`);
}

function targetContext(s: RunState, dir: string): TargetContext {
  return { tracker: s.tracker, abort: s.abort, dir, areaBytes: s.opts.areaBytes, mooringCli: s.mooringCli, log: s.log, portBase: s.opts.portBase };
}

/** A started, pre-written target taking part in the rotation. */
interface LiveTarget {
  id: TargetId;
  dir: string;
  running: RunningTarget;
  /** Set when its server died: the rest of its workloads are skipped. */
  dead: boolean;
}

/** Starts one target in its own directory and pre-writes the whole area. */
async function prepareTarget(s: RunState, id: TargetId): Promise<LiveTarget | undefined> {
  const dir = join(s.scratch, id);
  mkdirSync(dir);
  s.log(`[${id}] ${TARGET_LABELS[id]}`);
  let running: RunningTarget | undefined;
  try {
    running = await startTarget(id, targetContext(s, dir));
    const t0 = Date.now();
    await runFio(prewriteJob(running.endpoint, s.opts.areaBytes), 'write', s.tracker, s.abort);
    s.log(`  pre-written ${s.opts.areaBytes / 1024 ** 2} MiB in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    return { id, dir, running, dead: false };
  } catch (err) {
    if (s.abort.aborted) throw err;
    s.failures.push({ what: id, message: errorText(err) });
    s.log(`  ${id}: FAILED: ${errorText(err)}`);
    await running?.stop();
    rmSync(dir, { recursive: true, force: true });
    return undefined;
  }
}

/**
 * Runs one workload on one target and records it (a failure is recorded, not thrown). The
 * target's files are read into the page cache first, alike for every target. The cost
 * window runs from the end of fio's ramp to fio's exit: a few tens of ms longer than fio's
 * measured window, alike for every target.
 */
async function measure(s: RunState, t: LiveTarget, w: Workload, round: number): Promise<void> {
  const procs = t.running.processes;
  let probe: CostProbe | undefined;
  let probeDir: string | undefined;
  try {
    await warmPageCache(t.dir);
    probeDir = mkdtempSync(join(s.scratch, 'cost-'));
    probe = await CostProbe.attach(procs, s.perf, probeDir, s.tracker, s.abort);
    const job = workloadJob(w, t.running.endpoint, s.opts.areaBytes, s.opts.runtimeSec, s.opts.rampSec);
    const started = Date.now();
    const cpuAtStart = procs.map((p) => readProcStats(p.pid)?.cpuSec ?? NaN);
    const fio = runFio(job, isWrite(w) ? 'write' : 'read', s.tracker, s.abort);
    let rampTimer: NodeJS.Timeout | undefined;
    const began = new Promise<void>((resolve, reject) => {
      rampTimer = setTimeout(() => probe!.begin().then(resolve, reject), s.opts.rampSec * 1000);
    });
    let figures: FioFigures;
    try {
      figures = await fio;
    } finally {
      clearTimeout(rampTimer);
    }
    await began;
    const window = await probe.end();
    const wallSec = (Date.now() - started) / 1000;
    const cpuAtEnd = procs.map((p) => readProcStats(p.pid)?.cpuSec ?? NaN);
    const cpuSec = cpuAtEnd.reduce((a, b, i) => a + b - cpuAtStart[i]!, 0);
    const serverCpuPct = procs.length === 0 || !Number.isFinite(cpuSec) ? undefined : (cpuSec / wallSec) * 100;
    const cost = costPerIo(procs, window, figures.ioBytes / w.blockBytes);
    s.measurements.push({ targetId: t.id, workloadId: w.id, figures, serverCpuPct, cost, round });
    s.log(
      `  ${w.label.padEnd(20)} ${TARGET_SHORT[t.id].padEnd(16)} ${figures.iops.toFixed(0).padStart(7)} IOPS ` +
        `${figures.mibPerSec.toFixed(1).padStart(7)} MiB/s  clat p50 ${figures.clatP50Us.toFixed(0)} µs p99 ${figures.clatP99Us.toFixed(0)} µs` +
        (serverCpuPct === undefined ? '' : `  server CPU ${serverCpuPct.toFixed(0)}%`) +
        (cost === undefined ? '' : `  per I/O: ${cost.cpuUsPerIo.toFixed(1)} µs CPU, ${cost.syscallsPerIo?.toFixed(1) ?? '–'} syscalls, ${cost.switchesPerIo?.toFixed(2) ?? '–'} switches`),
    );
  } catch (err) {
    if (s.abort.aborted) throw err;
    await probe?.detach();
    s.failures.push({ what: `${t.id} ${w.label}`, message: errorText(err) });
    s.log(`  ${w.label} ${t.id}: FAILED: ${errorText(err)}`);
    if (procs.some((p) => readProcStats(p.pid) === undefined)) {
      t.dead = true;
      s.failures.push({ what: t.id, message: `a server process died during ${w.label}; its remaining workloads were skipped` });
    }
  } finally {
    if (probeDir) rmSync(probeDir, { recursive: true, force: true });
  }
}

/**
 * Every target is started and pre-written first; then each workload runs on each target in
 * turn (one fio at a time). Interleaving keeps a burst of load from other work on a shared
 * machine from landing on one target only, which would skew the ratios.
 */
async function benchAll(s: RunState): Promise<void> {
  const live: LiveTarget[] = [];
  try {
    for (const id of s.opts.targets) {
      const t = await prepareTarget(s, id);
      if (t) live.push(t);
    }
    await syncfs(s);
    for (let round = 0; round < s.opts.repeat; round++) {
      if (s.opts.repeat > 1) s.log(`[round ${round + 1}/${s.opts.repeat}]`);
      for (const wid of s.opts.workloadIds) {
        const w = workloadById(wid);
        for (const t of live) {
          if (t.dead) continue;
          await measure(s, t, w, round);
          await syncfs(s);
        }
      }
    }
    for (const t of live) {
      const st = t.running.processes.map((p) => readProcStats(p.pid));
      if (st.length > 0 && st.every((x) => x !== undefined)) {
        s.serverPeaks.push({ targetId: t.id, peakRssBytes: st.reduce((a, x) => a + x!.peakRssBytes, 0), threads: st.reduce((a, x) => a + x!.threads, 0), processes: st.length });
      }
    }
  } finally {
    for (const t of live) {
      await t.running.stop(s.abort.aborted ? INTERRUPT_GRACE_MS : undefined);
      rmSync(t.dir, { recursive: true, force: true });
    }
  }
}

async function measureRss(s: RunState): Promise<RssResult | undefined> {
  const dir = join(s.scratch, 'rss');
  mkdirSync(dir);
  s.log(`[rss] Mooring 1 replica, 1 TiB sparse, ${RSS_WRITES} scattered 4 KiB writes`);
  let running: RunningTarget | undefined;
  try {
    running = await startMooring('mooring-1', 1, RSS_VOLUME_BYTES, targetContext(s, dir));
    const pid = running.processes[0]!.pid;
    const atReady = readProcStats(pid);
    await runFio(scatteredWritesJob(running.endpoint, RSS_VOLUME_BYTES, RSS_WRITES), 'write', s.tracker, s.abort);
    const after = readProcStats(pid);
    if (!atReady || !after) throw new BenchError('BENCH_TARGET_FAILED', 'mooring serve exited during the RSS measurement');
    s.log(`  VmHWM ${(after.peakRssBytes / 1024 ** 2).toFixed(1)} MiB (at READY ${(atReady.rssBytes / 1024 ** 2).toFixed(1)} MiB)`);
    return {
      volumeBytes: RSS_VOLUME_BYTES,
      writes: RSS_WRITES,
      rssAtReadyBytes: atReady.rssBytes,
      peakRssBytes: after.peakRssBytes,
      threads: after.threads,
    };
  } catch (err) {
    if (s.abort.aborted) throw err;
    s.failures.push({ what: 'rss', message: errorText(err) });
    s.log(`  rss: FAILED: ${errorText(err)}`);
    return undefined;
  } finally {
    await running?.stop(s.abort.aborted ? INTERRUPT_GRACE_MS : undefined);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** One measurement over data-engine processes in its own scratch directory; a failure is recorded, not fatal. */
async function hostStep<T>(s: RunState, what: string, description: string, fn: (ctx: TargetContext) => Promise<T>): Promise<T | undefined> {
  const dir = join(s.scratch, what);
  mkdirSync(dir);
  s.log(`[${what}] ${description}`);
  try {
    return await fn(targetContext(s, dir));
  } catch (err) {
    if (s.abort.aborted) throw err;
    s.failures.push({ what, message: errorText(err) });
    s.log(`  ${what}: FAILED: ${errorText(err)}`);
    return undefined;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function measureRebuildStep(s: RunState): Promise<RebuildResults | undefined> {
  return hostStep(s, 'rebuild', `3 data-engine processes on loopback, ${s.opts.areaBytes / 1024 ** 2} MiB volume`, measureRebuild);
}

function measureMigrationStep(s: RunState): Promise<MigrationResults | undefined> {
  return hostStep(s, 'migration', `3 data-engine processes on loopback, ${s.opts.migrations} migrations of a 3-replica volume`, (ctx) => measureMigration(ctx, s.opts.migrations));
}

function measureUpgradeStep(s: RunState): Promise<UpgradeResults | undefined> {
  return hostStep(s, 'upgrade', `3 data-engine processes on loopback, ${s.opts.upgrades} in-place hand-offs of a 3-replica volume's engine host`, (ctx) => measureUpgrade(ctx, s.opts.upgrades));
}

function measureGuestMigrationStep(s: RunState): Promise<GuestMigrationResults | undefined> {
  return hostStep(s, 'guest-migration', `3 data-engine processes on loopback, ${s.opts.guestMigrations} live migrations of a QEMU guest (TCG) on a 3-replica volume, and as many between two qemu-nbd servers`, (ctx) =>
    measureGuestMigration(ctx, s.opts.guestMigrations),
  );
}

function measureBackingImageReadStep(s: RunState): Promise<BackingImageReadResults | undefined> {
  return hostStep(s, 'backing-image-read', '1-replica volume over a qcow2 backing image vs qemu-nbd -r on the same file', (ctx) =>
    measureBackingImageRead(ctx, s.opts.runtimeSec, s.opts.rampSec, s.opts.repeat),
  );
}

function measureBackingImageDeliveryStep(s: RunState): Promise<BackingImageDeliveryResults | undefined> {
  return hostStep(s, 'backing-image-delivery', '2 data-engine processes on loopback, one image uploaded and copied between them', measureBackingImageDelivery);
}

function measureScaleStep(s: RunState): Promise<ScaleResults | undefined> {
  const settings = { quick: s.opts.quick, max: s.opts.scaleMax, runtimeSec: s.opts.runtimeSec, stepTimeoutSec: s.opts.scaleStepTimeoutSec, curves: s.opts.scaleCurves };
  return hostStep(s, 'scale', `scale curves: volumes per host and per cluster, chain depth, extents${settings.max === undefined ? '' : ` (capped at ${settings.max})`}`, async (ctx) => {
    const r = await measureScale(ctx, settings);
    // A curve that could not start fails the run; a size that failed is a finding, in the report.
    for (const f of r.failures) s.failures.push({ what: `scale ${f.curve}`, message: `${f.code}: ${f.message}` });
    return r;
  });
}

function measureControlStep(s: RunState): Promise<ControlResults | undefined> {
  const settings = { cycles: s.opts.controlCycles, basePort: s.opts.controlBasePort };
  return hostStep(s, 'control', `2 data-engine processes and etcd on loopback, ${settings.cycles} cycles of control operations per store`, async (ctx) => {
    const r = await measureControl(ctx, settings);
    // A failed operation is a finding, in the report; the run fails as for a scale size that failed.
    for (const st of r.stores) for (const f of st.failures) s.failures.push({ what: `control ${st.store} ${f.op}`, message: `${f.code}: ${f.message}` });
    return r;
  });
}

/** The commit the package was built from (with '+ changes' if the work tree differs), if it is a git checkout. */
function sourceCommit(root: string | undefined): string | undefined {
  if (!root) return undefined;
  try {
    const git = (args: string[]): string => execFileSync('git', ['-C', root, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 10_000 }).trim();
    const head = git(['rev-parse', '--short=12', 'HEAD']);
    return git(['status', '--porcelain', '--untracked-files=no']) === '' ? head : `${head} + uncommitted changes`;
  } catch {
    return undefined;
  }
}

/** Checks tools, the build and free space before minutes of work are spent. */
async function preflight(s: Omit<RunState, 'scratch'>, parent: string, root: string | undefined): Promise<string | undefined> {
  const needNbd = s.opts.targets.some((t) => !t.startsWith('file-')) || s.opts.rss || s.opts.scale;
  const needGuest = s.opts.guestMigrations > 0;
  const needQemu = s.opts.targets.some((t) => t.startsWith('qemu-')) || s.opts.backingImage || s.opts.migrations > 0 || s.opts.upgrades > 0 || needGuest;
  const needMooring = s.opts.targets.some((t) => t.startsWith('mooring-')) || s.opts.rss || s.opts.rebuild || s.opts.backingImage || s.opts.migrations > 0 || s.opts.upgrades > 0 || needGuest || s.opts.scale || s.opts.control;

  // A missing tool rejects with BENCH_TOOL_MISSING; keep an interrupt an interrupt.
  const orUndefined = (err: unknown): undefined => {
    if (s.abort.aborted) throw err;
    return undefined;
  };
  const fio = await s.tracker.run('fio', ['--version'], s.abort).catch(orUndefined);
  if (!fio || fio.code !== 0) throw new BenchError('BENCH_TOOL_MISSING', 'fio is not installed (apt-get install fio)');
  if (needNbd) {
    const eng = await s.tracker.run('fio', ['--enghelp=nbd'], s.abort);
    if (eng.code !== 0) throw new BenchError('BENCH_TOOL_MISSING', `this fio has no nbd engine (${fio.stdout.trim()}); Debian's fio has it`);
  }
  if (needQemu) {
    for (const tool of ['qemu-nbd', 'qemu-img', ...(s.opts.backingImage ? ['qemu-io'] : [])]) {
      const r = await s.tracker.run(tool, ['--version'], s.abort).catch(orUndefined);
      if (!r || r.code !== 0) {
        throw new BenchError('BENCH_TOOL_MISSING', `${tool} is not installed (apt-get install qemu-utils), or leave the qemu targets out with --targets`);
      }
    }
  }
  const peerTools: Array<[TargetId, string, string[], string]> = [
    ['nbdkit-file', 'nbdkit', ['--version'], 'nbdkit'],
    ['qemu-quorum', 'qemu-storage-daemon', ['--version'], 'qemu-system-common'],
    ['qemu-nbd-tcp', 'cc', ['--version'], 'gcc'],
    ['qemu-quorum', 'cc', ['--version'], 'gcc'],
  ];
  for (const [target, tool, args, pkg] of peerTools) {
    if (!s.opts.targets.includes(target)) continue;
    const r = await s.tracker.run(tool, args, s.abort).catch(orUndefined);
    if (!r || r.code !== 0) throw new BenchError('BENCH_TOOL_MISSING', `${tool} is not installed (apt-get install ${pkg}), or leave ${target} out with --targets`);
  }
  if (needGuest) {
    const r = await s.tracker.run('qemu-system-x86_64', ['--version'], s.abort).catch(orUndefined);
    if (!r || r.code !== 0) throw new BenchError('BENCH_TOOL_MISSING', 'qemu-system-x86_64 is not installed (apt-get install qemu-system-x86), or skip the guest migrations with --guest-migrations 0');
  }
  let cli: string | undefined;
  if (needMooring) {
    cli = s.opts.mooringCli ? resolve(s.opts.mooringCli) : root ? join(root, 'dist', 'cli.js') : undefined;
    if (!cli || !existsSync(cli)) {
      throw new BenchError(
        'BENCH_NOT_BUILT',
        `the Mooring targets need ${cli ?? 'dist/cli.js'}: run 'npm run build' first, ` +
          `or leave them out with --targets qemu-raw,qemu-qcow2,file-buffered,file-direct --no-rss`,
      );
    }
  }
  if (!existsSync(parent)) throw new BenchError('INVALID_ARGUMENT', `--dir ${parent} does not exist`);
  const fs = statfsSync(parent);
  const freeBytes = fs.bavail * fs.bsize;
  // All targets live at once (interleaved runs); mooring-3 and the quorum hold three copies.
  const copies = s.opts.targets.reduce((n, t) => n + (t.startsWith('mooring-3') || t === 'qemu-quorum' ? 3 : 1), 0);
  const needBytes = copies * s.opts.areaBytes + FREE_SPACE_MARGIN_BYTES;
  if (freeBytes < needBytes) {
    throw new BenchError(
      'NO_SPACE',
      `${parent} has ${(freeBytes / 1024 ** 3).toFixed(1)} GiB free; this run needs ${(needBytes / 1024 ** 3).toFixed(1)} GiB (use a smaller --size)`,
    );
  }
  return cli;
}

/** The version the served CLI reports (it may not be this package's, see --mooring-cli). */
async function servedVersion(s: Omit<RunState, 'scratch'>, cli: string | undefined, root: string | undefined): Promise<string> {
  if (!cli) return `${mooringVersion(root)} (not served)`;
  const r = await s.tracker.run(process.execPath, [cli, '--version'], s.abort, { timeoutMs: 30_000 });
  const v = r.code === 0 ? r.stdout.trim().split('\n')[0]! : 'unknown';
  return s.opts.mooringCli ? `${v} (${cli})` : v;
}

/** Where `mooring bench` writes: the table, the CLI's logger, whether progress lines are wanted. */
export interface BenchOutput {
  /** The table and --help (default: process.stdout). */
  stdout?: (text: string) => void;
  /** Default: human lines on stderr, level info. */
  log?: Logger;
  /** False with --no-progress (default true). */
  progress?: boolean;
}

/**
 * Runs the benchmark with `mooring bench` arguments. Resolves to the process exit code:
 * 0 done, 1 a failure (the report still lists what was measured), 2 usage, 130 interrupted.
 * Every child process and scratch file is gone when it resolves, also after Ctrl-C.
 */
export async function runBench(argv: string[], output: BenchOutput = {}): Promise<number> {
  const logger = output.log ?? makeCliLogger({ stderr: (t) => void process.stderr.write(t) }, DEFAULT_LOG_SETTINGS);
  const stdout = output.stdout ?? ((t: string) => void process.stdout.write(t));
  let opts: BenchOptions;
  try {
    opts = parseBenchArgs(argv);
  } catch (err) {
    if (err instanceof BenchUsageError) {
      logger.error({ code: 'INVALID_ARGUMENT', hint: "Try 'mooring bench --help'." }, err.message);
      return 2;
    }
    throw err;
  }
  if (opts.help) {
    stdout(HELP_TEXT);
    return 0;
  }

  const root = packageRoot();
  const tracker = new ProcessTracker();
  const controller = new AbortController();
  const log = benchLogLine(logger, output.progress ?? true);
  let scratch: string | undefined;

  const onSignal = (signal: NodeJS.Signals): void => {
    if (controller.signal.aborted) {
      // Second Ctrl-C: no more grace.
      tracker.killAll('SIGKILL');
      return;
    }
    log(`\nmooring bench: ${signal}: stopping children and removing ${scratch ?? 'scratch files'}`);
    controller.abort(new BenchInterrupted(signal));
    tracker.killAll('SIGTERM');
  };
  // Last resort if something calls process.exit mid-run: no orphans, no scratch left.
  const onExit = (): void => {
    tracker.killAll('SIGKILL');
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  process.on('exit', onExit);

  const started = new Date();
  const loadBefore = os.loadavg();
  // Read at the start: the tree may change while a long run goes on.
  const commit = opts.scale || opts.control ? sourceCommit(root) : undefined;
  try {
    const parent = resolve(opts.parentDir ?? os.tmpdir());
    const base = { opts, tracker, abort: controller.signal, log, measurements: [], serverPeaks: [], failures: [], mooringCli: undefined, perf: false };
    const mooringCli = await preflight(base, parent, root);
    let costNote: string | undefined;
    if (opts.cost && opts.targets.length > 0) {
      const p = await perfWorks(tracker, controller.signal);
      base.perf = p.ok;
      if (!p.ok) {
        costNote = `syscalls and context switches not measured: ${p.why}`;
        log(`warning: ${costNote}`);
      }
    } else if (opts.targets.length > 0) {
      costNote = 'syscalls and context switches not measured (--no-perf)';
    }
    if (loadBefore[0]! > BUSY_LOAD) {
      log(`warning: load average is ${loadBefore[0]!.toFixed(2)}: other work is running and the figures will be noisy`);
    }
    scratch = mkdtempSync(join(parent, 'mooring-bench-'));
    const s: RunState = { ...base, scratch, mooringCli };
    const machine = describeMachine(scratch, await servedVersion(base, mooringCli, root));
    log(`mooring bench: ${opts.targets.length} targets x ${opts.workloadIds.length} workloads, ${opts.runtimeSec} s each, scratch ${scratch}`);

    await benchAll(s);
    const rss = opts.rss ? await measureRss(s) : undefined;
    const rebuild = opts.rebuild ? await measureRebuildStep(s) : undefined;
    const migration = opts.migrations > 0 ? await measureMigrationStep(s) : undefined;
    const upgrade = opts.upgrades > 0 ? await measureUpgradeStep(s) : undefined;
    const guestMigration = opts.guestMigrations > 0 ? await measureGuestMigrationStep(s) : undefined;
    const backingImageRead = opts.backingImage ? await measureBackingImageReadStep(s) : undefined;
    const backingImageDelivery = opts.backingImage ? await measureBackingImageDeliveryStep(s) : undefined;
    const scale = opts.scale ? await measureScaleStep(s) : undefined;
    const control = opts.control ? await measureControlStep(s) : undefined;

    const results: BenchResults = {
      startedAt: started,
      durationSec: (Date.now() - started.getTime()) / 1000,
      quick: opts.quick,
      runtimeSec: opts.runtimeSec,
      repeat: opts.repeat,
      rampSec: opts.rampSec,
      areaBytes: opts.areaBytes,
      scratchDir: parent,
      loadBefore,
      loadAfter: os.loadavg(),
      machine,
      targets: opts.targets,
      workloads: opts.workloadIds.map(workloadById),
      measurements: s.measurements,
      serverPeaks: s.serverPeaks,
      costNote,
      portBase: opts.portBase,
      rss,
      rebuild,
      migration,
      upgrade,
      guestMigration,
      backingImageRead,
      backingImageDelivery,
      scale,
      control,
      failures: s.failures,
    };
    stdout(renderStdout(results));
    // A report path given on the command line is the working directory's; a default one, the package's.
    const write = (path: string | undefined, isDefault: boolean, text: () => string): void => {
      if (!path) return;
      const out = isDefault && root ? join(root, path) : resolve(path);
      mkdirSync(dirname(out), { recursive: true });
      writeFileSync(out, text());
      log(`wrote ${out}`);
    };
    const meta = { startedAt: started, durationSec: results.durationSec, machine, scratchDir: parent, loadBefore, loadAfter: results.loadAfter, commit, command: `mooring bench ${argv.join(' ')}`.trim() };
    if (scale) {
      stdout(renderScaleStdout(scale));
      write(opts.scaleOutPath, opts.scaleOutPathIsDefault, () => renderScaleMarkdown(scale, meta));
    }
    if (control) {
      stdout(renderControlStdout(control));
      write(opts.controlOutPath, opts.controlOutPathIsDefault, () => renderControlMarkdown(control, meta));
    }
    write(opts.outPath, opts.outPathIsDefault, () => renderMarkdownReport(results));
    if (opts.jsonPath) {
      const out = resolve(opts.jsonPath);
      mkdirSync(dirname(out), { recursive: true });
      writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
      log(`wrote ${out}`);
    }
    return s.failures.length === 0 ? 0 : 1;
  } catch (err) {
    if (err instanceof BenchInterrupted) {
      log(`mooring bench: ${err.message}; nothing written`);
      return 130;
    }
    if (err instanceof BenchError) {
      logger.error({ code: err.code }, err.message);
      return 1;
    }
    logger.error({ code: 'BENCH_FAILED' }, err instanceof Error ? (err.stack ?? err.message) : String(err));
    return 1;
  } finally {
    // Targets stop themselves; anything still tracked here is a leftover (e.g. an aborted fio).
    tracker.killAll('SIGKILL');
    if (scratch) rmSync(scratch, { recursive: true, force: true });
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    process.off('exit', onExit);
  }
}
