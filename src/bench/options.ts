/**
 * Command-line options of `mooring bench`: parsing, defaults and the help text.
 */
import { ALL_WORKLOADS, QUICK_WORKLOAD_IDS } from './workloads.js';
import { ALL_TARGET_IDS, DEFAULT_TARGET_IDS, type TargetId } from './target-ids.js';

/** Everything one benchmark run is configured by. */
export interface BenchOptions {
  /** Fewer workloads, shorter runs, smaller test area. */
  quick: boolean;
  /** Measured seconds per workload (time_based). */
  runtimeSec: number;
  /** Rounds over all workloads and targets; the report keeps each figure's median. */
  repeat: number;
  /** Seconds fio runs before it starts measuring (excluded from the figures). */
  rampSec: number;
  /** Bytes of the test area every target is pre-written over and measured on. */
  areaBytes: number;
  /** Parent of the scratch directory; it must be on the filesystem being measured. */
  parentDir: string | undefined;
  /** Markdown report path; undefined = do not write one. */
  outPath: string | undefined;
  /** outPath is the default (resolved against the package root, not the working directory). */
  outPathIsDefault: boolean;
  /** Raw per-run figures as JSON; undefined = do not write. */
  jsonPath: string | undefined;
  /** Targets in the order they run. */
  targets: TargetId[];
  /** Workload ids in the order they run. */
  workloadIds: string[];
  /** Run the 1 TiB sparse-volume RSS measurement. */
  rss: boolean;
  /** Measure full and incremental rebuilds over loopback. */
  rebuild: boolean;
  /** Migrations to measure; 0 skips them. */
  migrations: number;
  /** In-place hand-offs of the engine's host to measure (upgrade sessions); 0 skips the upgrade step. */
  upgrades: number;
  /** Live migrations of a real QEMU guest to measure (and as many between qemu-nbd servers); 0 skips them. */
  guestMigrations: number;
  /**
   * Backing images: compare reads over a qcow2 backing image with qemu-nbd -r, and
   * measure upload and delivery of an image between two hosts over loopback.
   */
  backingImage: boolean;
  /** Run the scale curves (issue 21): volumes per host and per cluster, chain depth, extents. */
  scale: boolean;
  /** Largest size of any scale curve; undefined = the full sizes (up to 1,000 volumes, 1,000 layers, 1 M extents). */
  scaleMax: number | undefined;
  /** Seconds one size of one scale curve may take before it is recorded as BENCH_TIMEOUT and its curve ends. */
  scaleStepTimeoutSec: number;
  /** The scale curves to run, in their run order (default: all). */
  scaleCurves: ScaleCurveId[];
  /** Scale report path (default docs/benchmarks-scale.md); undefined = do not write one. */
  scaleOutPath: string | undefined;
  /** scaleOutPath is the default (resolved against the package root). */
  scaleOutPathIsDefault: boolean;
  /** Run the control-plane step (issue 18): control operations with the file store and with etcd. */
  control: boolean;
  /** Measured create-to-delete cycles per store of the control step. */
  controlCycles: number;
  /** First of the loopback TCP ports the control step uses (etcd client and peer, two replica servers). */
  controlBasePort: number;
  /** Control report path (default docs/benchmarks-control.md); undefined = do not write one. */
  controlOutPath: string | undefined;
  /** controlOutPath is the default (resolved against the package root). */
  controlOutPathIsDefault: boolean;
  /** Count syscalls and context switches with perf stat (CPU per I/O is always measured). */
  cost: boolean;
  /** First TCP port of the run: the servers of every step listen on fixed offsets from it (up to +82). */
  portBase: number;
  /** Explicit path of the Mooring CLI script; undefined = this package's dist/cli.js. */
  mooringCli: string | undefined;
  help: boolean;
}

/** A usage error: the CLI prints it with the help hint and exits 2. */
export class BenchUsageError extends Error {
  override readonly name = 'BenchUsageError';
}

/** Relative to the package root. */
export const DEFAULT_OUT_PATH = 'docs/benchmarks.md';
/** Relative to the package root: the scale curves' report. */
export const DEFAULT_SCALE_OUT_PATH = 'docs/benchmarks-scale.md';
/** Relative to the package root: the control-plane report. */
export const DEFAULT_CONTROL_OUT_PATH = 'docs/benchmarks-control.md';
const DEFAULT_CONTROL_CYCLES = 50;
const QUICK_CONTROL_CYCLES = 10;
const CONTROL_CYCLES_MAX = 10_000;
/** Distinct from the other steps' fixed ports (17810-17999 in steps of 10 and up). */
const DEFAULT_CONTROL_BASE_PORT = 17900;
/** Ports from the control step's base: etcd client, etcd peer, the replica servers of h0 and h1. */
export const CONTROL_PORTS_USED = 4;
/** The largest size of the full scale run is 1 M (extents); a cap beyond it is a typo. */
const SCALE_MAX_MAX = 1_000_000;
const DEFAULT_SCALE_STEP_TIMEOUT_SEC = 1800;
/** The scale curves, in their run order (the cluster curve last: at 1,000 volumes it is the one most likely to time out). */
export const SCALE_CURVE_IDS = ['host', 'depth', 'extents', 'cluster'] as const;
export type ScaleCurveId = (typeof SCALE_CURVE_IDS)[number];
const SCALE_STEP_TIMEOUT_SEC_MAX = 86_400;
const DEFAULT_RUNTIME_SEC = 10;
const QUICK_RUNTIME_SEC = 3;
const DEFAULT_AREA_BYTES = 1024 ** 3;
const QUICK_AREA_BYTES = 512 * 1024 ** 2;
/** Far beyond any sensible run; catches typos such as --runtime 6000. */
const RUNTIME_SEC_MAX = 600;
/** The smallest area that still holds a few 1 MiB blocks per job. */
/** Migrations measured by default (median and p99 over 50), and in --quick runs. */
const DEFAULT_MIGRATIONS = 50;
const QUICK_MIGRATIONS = 10;
const MIGRATIONS_MAX = 1000;
/** In-place hand-offs measured by default (p50/p99/max over 20), and in --quick runs. */
const DEFAULT_UPGRADES = 20;
const QUICK_UPGRADES = 5;
const UPGRADES_MAX = 200;
const DEFAULT_GUEST_MIGRATIONS = 10;
const QUICK_GUEST_MIGRATIONS = 3;
const GUEST_MIGRATIONS_MAX = 200;
/** Rounds are whole passes over every workload and target; more than a few is a typo. */
const REPEAT_MAX = 20;
const AREA_BYTES_MIN = 16 * 1024 ** 2;
/** The default --port-base, and the highest offset any step adds to it. */
export const DEFAULT_PORT_BASE = 17810;
export const PORT_SPAN = 83;

const SIZE_UNITS: Record<string, number> = {
  '': 1,
  k: 1024,
  kib: 1024,
  m: 1024 ** 2,
  mib: 1024 ** 2,
  g: 1024 ** 3,
  gib: 1024 ** 3,
  t: 1024 ** 4,
  tib: 1024 ** 4,
};

/** Parses SIZE as the CLI contract defines it: bytes, or K/M/G/T (KiB/MiB/...) binary multiples. */
export function parseSizeBytes(text: string): number {
  const m = /^(\d+)\s*([a-zA-Z]*)$/.exec(text.trim());
  const unit = m ? SIZE_UNITS[m[2]!.toLowerCase()] : undefined;
  if (!m || unit === undefined) throw new BenchUsageError(`invalid size '${text}' (use bytes or K/M/G/T)`);
  const bytes = Number(m[1]) * unit;
  if (!Number.isSafeInteger(bytes)) throw new BenchUsageError(`size '${text}' is too large`);
  return bytes;
}

export const HELP_TEXT = `Usage: mooring bench [options]

Runs fio (ioengine=nbd) against Mooring (1 and 3 replicas, local and remote), qemu-nbd
(raw, qcow2, one copy over TCP), nbdkit's file plugin and QEMU's quorum over 3 qemu-nbd,
and fio with io_uring directly on a file as the physical limit, all on one filesystem.
All targets are started first; each workload then runs on each target in turn, one fio
at a time, the target's files read into the page cache right before. Measures the CPU,
syscalls and context switches per I/O of every server process. Prints a table and
writes a Markdown report.

Options:
  --quick             ${QUICK_WORKLOAD_IDS.length} workloads, ${QUICK_RUNTIME_SEC} s each, ${QUICK_AREA_BYTES / 1024 ** 2} MiB test area
  --runtime SEC       measured seconds per workload (default ${DEFAULT_RUNTIME_SEC}, quick ${QUICK_RUNTIME_SEC})
  --ramp SEC          unmeasured warm-up seconds per workload (default 1, quick 0)
  --repeat N          rounds over all workloads and targets; the median is reported (default 1)
  --size SIZE         test area per target (default 1G, quick 512M)
  --dir DIR           create the scratch directory under DIR (default: the OS temp dir)
  --out FILE          Markdown report (default docs/benchmarks.md of this package; '-' = none)
  --json FILE         also write every measured figure as JSON
  --targets LIST      comma-separated, in run order (default ${DEFAULT_TARGET_IDS.join(',')})
                      available: ${ALL_TARGET_IDS.join(', ')}
  --workloads LIST    comma-separated workload ids (default: all, or the quick set)
                      available: ${ALL_WORKLOADS.map((w) => w.id).join(', ')}
  --no-rss            skip the 1 TiB sparse volume peak-RSS measurement
  --no-rebuild        skip the rebuild measurements (3 data-engine processes)
  --no-backing-image  skip the backing image measurements: reads over a qcow2 backing image vs
                      qemu-nbd -r, and delivery of an image between 2 data-engine processes
  --backing-image-only  run only those (no report written unless --out is given)
  --migrations N      live migrations to measure (default ${DEFAULT_MIGRATIONS}, --quick ${QUICK_MIGRATIONS}; 0 skips them)
  --upgrades N        in-place data-engine hand-offs to measure (default ${DEFAULT_UPGRADES}, --quick ${QUICK_UPGRADES}; 0 skips them)
  --guest-migrations N  live migrations of a QEMU guest (TCG) to measure, and as many between two
                      qemu-nbd servers (default ${DEFAULT_GUEST_MIGRATIONS}, --quick ${QUICK_GUEST_MIGRATIONS}; 0 skips them)
  --scale             also run the scale curves (off by default: a full run takes tens of minutes):
                      volumes per host and per cluster (10, 100, 1,000), snapshot chain depth
                      (0, 100, 1,000), extents (10 k, 100 k, 1 M); --quick keeps the first two sizes
  --scale-only        run only the scale curves (no main report unless --out is given)
  --scale-max N       cap every scale curve at N (larger sizes left out, N measured instead)
  --scale-curves LIST comma-separated scale curves to run (default all: host,depth,extents,cluster)
  --scale-step-timeout SEC  one size of one curve may take this long, then it is recorded
                      as BENCH_TIMEOUT and its curve ends (default ${DEFAULT_SCALE_STEP_TIMEOUT_SEC})
  --scale-out FILE    scale report (default docs/benchmarks-scale.md of this package; '-' = none)
  --control           also run the control-plane step: cycles of create, attach, snapshot,
                      migrate, detach and delete with the file store, with etcd, and with etcd
                      under leadership (needs etcd: apt-get install etcd-server)
  --control-only      run only the control-plane step (no main report unless --out is given)
  --control-cycles N  measured cycles per store (default ${DEFAULT_CONTROL_CYCLES}, --quick ${QUICK_CONTROL_CYCLES})
  --control-port N    first of 4 loopback TCP ports the step uses: etcd client and peer, two
                      replica servers (default ${DEFAULT_CONTROL_BASE_PORT})
  --control-out FILE  control report (default docs/benchmarks-control.md of this package; '-' = none)
  --no-perf           leave out the syscall and context-switch counts of the cost per I/O (perf stat);
                      CPU per I/O is still measured
  --port-base N       first TCP port the run's servers listen on (default ${DEFAULT_PORT_BASE}; they use up to N+${PORT_SPAN - 1})
  --mooring-cli FILE  the Mooring CLI script to serve with (default dist/cli.js of this package)
  -h, --help          show this help

The table goes to stdout; what the run is doing, warnings and errors to stderr, as every
command's logs (docs/logging.md): --log-format human|json, --log-level LEVEL, and
--no-progress (only warnings, failures and the files written).
`;

function splitList(value: string, option: string): string[] {
  const items = value.split(',').map((s) => s.trim()).filter((s) => s.length > 0);
  if (items.length === 0) throw new BenchUsageError(`${option} needs at least one entry`);
  return items;
}

function parsePositiveNumber(value: string, option: string, max: number, allowZero: boolean): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0 || (!allowZero && n === 0) || n > max) {
    throw new BenchUsageError(`${option} must be a number in ${allowZero ? '[0' : '(0'}, ${max}], got '${value}'`);
  }
  return n;
}

function wholeNumber(value: string, option: string, max: number, allowZero: boolean): number {
  const n = parsePositiveNumber(value, option, max, allowZero);
  if (!Number.isInteger(n)) throw new BenchUsageError(`${option} must be a whole number`);
  return n;
}

/** `--scale-curves`: known ids, kept in their run order whatever order they are given in. */
function parseScaleCurves(value: string): ScaleCurveId[] {
  const list = splitList(value, '--scale-curves');
  for (const c of list) {
    if (!(SCALE_CURVE_IDS as readonly string[]).includes(c)) throw new BenchUsageError(`unknown scale curve '${c}' (available: ${SCALE_CURVE_IDS.join(', ')})`);
  }
  return SCALE_CURVE_IDS.filter((c) => list.includes(c));
}

/** Parses `mooring bench` arguments (without the leading `bench`). Throws BenchUsageError. */
export function parseBenchArgs(argv: readonly string[]): BenchOptions {
  let quick = false;
  let help = false;
  let rss = true;
  let rebuild = true;
  let migrations: number | undefined;
  let upgrades: number | undefined;
  let guestMigrations: number | undefined;
  let backingImage = true;
  let backingImageOnly = false;
  let scale = false;
  let scaleOnly = false;
  let scaleMax: number | undefined;
  let scaleStepTimeoutSec = DEFAULT_SCALE_STEP_TIMEOUT_SEC;
  let scaleCurves: ScaleCurveId[] = [...SCALE_CURVE_IDS];
  let scaleOutPath: string | undefined | null = null; // null = default
  let control = false;
  let controlOnly = false;
  let controlCycles: number | undefined;
  let controlBasePort = DEFAULT_CONTROL_BASE_PORT;
  let controlOutPath: string | undefined | null = null; // null = default
  let runtimeSec: number | undefined;
  let repeat = 1;
  let rampSec: number | undefined;
  let areaBytes: number | undefined;
  let parentDir: string | undefined;
  let outPath: string | undefined | null = null; // null = default
  let jsonPath: string | undefined;
  let targets: TargetId[] | undefined;
  let workloadIds: string[] | undefined;
  let mooringCli: string | undefined;
  let cost = true;
  let portBase = DEFAULT_PORT_BASE;

  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i]!;
    let inline: string | undefined;
    const eq = arg.indexOf('=');
    if (arg.startsWith('--') && eq > 0) {
      inline = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    }
    const value = (): string => {
      if (inline !== undefined) return inline;
      const v = argv[++i];
      if (v === undefined) throw new BenchUsageError(`${arg} needs a value`);
      return v;
    };
    switch (arg) {
      case '--quick': quick = true; break;
      case '-h':
      case '--help': help = true; break;
      case '--no-rss': rss = false; break;
      case '--no-perf': cost = false; break;
      case '--port-base': {
        portBase = parsePositiveNumber(value(), arg, 65536 - PORT_SPAN, false);
        if (!Number.isInteger(portBase) || portBase < 1024) throw new BenchUsageError(`--port-base must be a whole number in [1024, ${65536 - PORT_SPAN}]`);
        break;
      }
      case '--no-rebuild': rebuild = false; break;
      case '--no-backing-image': backingImage = false; break;
      case '--backing-image-only': backingImageOnly = true; break;
      case '--scale': scale = true; break;
      case '--scale-only': scaleOnly = true; break;
      case '--scale-max': scaleMax = wholeNumber(value(), arg, SCALE_MAX_MAX, false); break;
      case '--scale-curves': scaleCurves = parseScaleCurves(value()); break;
      case '--scale-step-timeout': scaleStepTimeoutSec = parsePositiveNumber(value(), arg, SCALE_STEP_TIMEOUT_SEC_MAX, false); break;
      case '--scale-out': { const v = value(); scaleOutPath = v === '-' ? undefined : v; break; }
      case '--control': control = true; break;
      case '--control-only': controlOnly = true; break;
      case '--control-cycles': controlCycles = wholeNumber(value(), arg, CONTROL_CYCLES_MAX, false); break;
      case '--control-port': controlBasePort = wholeNumber(value(), arg, 65536 - CONTROL_PORTS_USED, false); break;
      case '--control-out': { const v = value(); controlOutPath = v === '-' ? undefined : v; break; }
      case '--migrations': migrations = wholeNumber(value(), arg, MIGRATIONS_MAX, true); break;
      case '--upgrades': upgrades = wholeNumber(value(), arg, UPGRADES_MAX, true); break;
      case '--guest-migrations': guestMigrations = wholeNumber(value(), arg, GUEST_MIGRATIONS_MAX, true); break;
      case '--runtime': runtimeSec = parsePositiveNumber(value(), arg, RUNTIME_SEC_MAX, false); break;
      case '--repeat': repeat = wholeNumber(value(), arg, REPEAT_MAX, false); break;
      case '--ramp': rampSec = parsePositiveNumber(value(), arg, RUNTIME_SEC_MAX, true); break;
      case '--size': {
        areaBytes = parseSizeBytes(value());
        if (areaBytes < AREA_BYTES_MIN || areaBytes % (1024 * 1024) !== 0) {
          throw new BenchUsageError(`--size must be a multiple of 1 MiB and at least ${AREA_BYTES_MIN / 1024 ** 2} MiB`);
        }
        break;
      }
      case '--dir': parentDir = value(); break;
      case '--out': { const v = value(); outPath = v === '-' ? undefined : v; break; }
      case '--json': jsonPath = value(); break;
      case '--mooring-cli': mooringCli = value(); break;
      case '--targets': {
        const list = splitList(value(), arg);
        for (const t of list) {
          if (!(ALL_TARGET_IDS as readonly string[]).includes(t)) {
            throw new BenchUsageError(`unknown target '${t}' (available: ${ALL_TARGET_IDS.join(', ')})`);
          }
        }
        targets = [...new Set(list)] as TargetId[];
        break;
      }
      case '--workloads': {
        const list = splitList(value(), arg);
        for (const w of list) {
          if (!ALL_WORKLOADS.some((x) => x.id === w)) {
            throw new BenchUsageError(`unknown workload '${w}' (available: ${ALL_WORKLOADS.map((x) => x.id).join(', ')})`);
          }
        }
        workloadIds = [...new Set(list)];
        break;
      }
      default:
        throw new BenchUsageError(`unknown option '${argv[i]}'`);
    }
  }

  const onlys = [scaleOnly && '--scale-only', backingImageOnly && '--backing-image-only', controlOnly && '--control-only'].filter((o): o is string => o !== false);
  if (onlys.length > 1) throw new BenchUsageError(`${onlys.join(' and ')} contradict each other`);
  if (backingImageOnly && !backingImage) throw new BenchUsageError('--backing-image-only and --no-backing-image contradict each other');
  if (onlys.length === 1) {
    // One step alone: the options without the --*-only flag, every other step off.
    const only = onlys[0]!;
    return {
      ...parseBenchArgs(argv.filter((a) => a !== only)),
      targets: [],
      rss: false,
      rebuild: false,
      migrations: 0,
      upgrades: 0,
      guestMigrations: 0,
      backingImage: backingImageOnly,
      scale: scaleOnly,
      control: controlOnly,
      outPath: outPath === null ? undefined : outPath,
      outPathIsDefault: false,
    };
  }
  return {
    quick,
    help,
    rss,
    rebuild,
    backingImage,
    scale,
    scaleMax,
    scaleStepTimeoutSec,
    scaleCurves,
    scaleOutPath: scaleOutPath === null ? DEFAULT_SCALE_OUT_PATH : scaleOutPath,
    scaleOutPathIsDefault: scaleOutPath === null,
    control,
    controlCycles: controlCycles ?? (quick ? QUICK_CONTROL_CYCLES : DEFAULT_CONTROL_CYCLES),
    controlBasePort,
    controlOutPath: controlOutPath === null ? DEFAULT_CONTROL_OUT_PATH : controlOutPath,
    controlOutPathIsDefault: controlOutPath === null,
    migrations: migrations ?? (quick ? QUICK_MIGRATIONS : DEFAULT_MIGRATIONS),
    upgrades: upgrades ?? (quick ? QUICK_UPGRADES : DEFAULT_UPGRADES),
    guestMigrations: guestMigrations ?? (quick ? QUICK_GUEST_MIGRATIONS : DEFAULT_GUEST_MIGRATIONS),
    runtimeSec: runtimeSec ?? (quick ? QUICK_RUNTIME_SEC : DEFAULT_RUNTIME_SEC),
    repeat,
    rampSec: rampSec ?? (quick ? 0 : 1),
    areaBytes: areaBytes ?? (quick ? QUICK_AREA_BYTES : DEFAULT_AREA_BYTES),
    parentDir,
    outPath: outPath === null ? DEFAULT_OUT_PATH : outPath,
    outPathIsDefault: outPath === null,
    jsonPath,
    targets: targets ?? [...DEFAULT_TARGET_IDS],
    workloadIds: workloadIds ?? (quick ? [...QUICK_WORKLOAD_IDS] : ALL_WORKLOADS.map((w) => w.id)),
    mooringCli,
    cost,
    portBase,
  };
}
