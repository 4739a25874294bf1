// Runs the SPIN model test/model/single-writer.pml in one configuration: spin generates
// the verifier (pan.c) in a fresh temporary directory, gcc compiles it, pan searches the
// whole state space (safety mode), and on a violation spin replays the trail to print the
// counterexample. Nothing is written to the repository; the directory is removed after.
import { execFile } from 'node:child_process';
import { copyFile, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The model this helper runs. */
export const MODEL_PATH = fileURLToPath(new URL('./single-writer.pml', import.meta.url));

/** Depth bound for pan's DFS stack; the configurations checked reach well under 1,000. */
const MAX_DEPTH = 100_000;
/** pan stops (and the run fails) rather than use more memory than this. */
const MEMORY_LIMIT_MB = 3072;
/** One tool's output beyond this is an error, not something to buffer. */
const OUTPUT_MAX_BYTES = 64 * 1024 * 1024;

export interface SpinOptions {
  /** Preprocessor defines for the model, e.g. ['NR=3', 'BROKEN_NO_MAJORITY']. */
  defines: string[];
  /** Kill any one tool that runs longer than this. */
  timeoutMs: number;
}

export interface SpinResult {
  /** The defines, as given. */
  defines: string[];
  errors: number;
  statesStored: number;
  transitions: number;
  depthReached: number;
  /** pan's own search time. */
  searchSeconds: number;
  /** spin + gcc + pan (+ the trail replay), wall clock. */
  totalSeconds: number;
  memoryMb: number;
  /** The whole state space was searched: no depth, memory or error cut-off. */
  complete: boolean;
  /** Text of the first failed assertion, if any. */
  assertion: string | null;
  /** The counterexample's events (the model's `MSC:` lines), when a violation was found. */
  counterexample: string[];
  /** pan's report, for the test output when something is off. */
  panOutput: string;
}

interface ToolOutput {
  stdout: string;
  stderr: string;
}

function run(cmd: string, args: string[], cwd: string, timeoutMs: number): Promise<ToolOutput> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd, timeout: timeoutMs, maxBuffer: OUTPUT_MAX_BYTES }, (err, stdout, stderr) => {
      if (err) {
        const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
        const why = missing
          ? `${cmd} is not installed (apt-get install -y spin gcc; .ci/setup.sh installs both)`
          : `${cmd} ${args.join(' ')} failed (${err.message})`;
        reject(new Error(`${why}\nstdout:\n${stdout}\nstderr:\n${stderr}`, { cause: err }));
        return;
      }
      resolve({ stdout, stderr });
    });
  });
}

function num(out: string, re: RegExp): number {
  const m = re.exec(out);
  if (!m) throw new Error(`pan's report lacks ${re}:\n${out}`);
  return Number(m[1]);
}

/** Verifies the model in one configuration. Rejects if a tool is missing or fails. */
export async function runSpin(opts: SpinOptions): Promise<SpinResult> {
  const started = performance.now();
  const dir = await mkdtemp(join(tmpdir(), 'mooring-spin-'));
  try {
    await copyFile(MODEL_PATH, join(dir, 'single-writer.pml'));
    const d = opts.defines.map((x) => `-D${x}`);
    await run('spin', [...d, '-a', 'single-writer.pml'], dir, opts.timeoutMs);
    // -O1: compiles in about half the time of -O2, searches about as fast. -DSAFETY:
    // assertions and invalid end states, no cycle search. -DCOLLAPSE: lossless
    // state compression (the search stays exhaustive; bitstate hashing is not used).
    await run(
      'gcc',
      ['-O1', '-w', '-DSAFETY', '-DCOLLAPSE', `-DMEMLIM=${MEMORY_LIMIT_MB}`, '-o', 'pan', 'pan.c'],
      dir,
      opts.timeoutMs,
    );
    const pan = await run('./pan', [`-m${MAX_DEPTH}`], dir, opts.timeoutMs);
    const out = pan.stdout + pan.stderr;
    const errors = num(out, /errors: (\d+)/);
    const depthReached = num(out, /depth reached (\d+)/);
    const truncated =
      /Search not completed/.test(out) ||
      /max search depth too small/.test(out) ||
      /out of memory/i.test(out) ||
      depthReached >= MAX_DEPTH;
    let counterexample: string[] = [];
    if (errors > 0 && (await readdir(dir)).includes('single-writer.pml.trail')) {
      const replay = await run('spin', [...d, '-t', 'single-writer.pml'], dir, opts.timeoutMs);
      counterexample = replay.stdout
        .split('\n')
        .filter((l) => l.includes('MSC:') || l.includes('assertion violated'))
        .map((l) => l.trim().replace(/^MSC: /, ''));
    }
    return {
      defines: opts.defines,
      errors,
      statesStored: num(out, /([\d.e+]+) states, stored/),
      transitions: num(out, /([\d.e+]+) transitions/),
      depthReached,
      searchSeconds: num(out, /elapsed time ([\d.e+]+) seconds/),
      totalSeconds: (performance.now() - started) / 1000,
      memoryMb: num(out, /([\d.]+)\s+total actual memory usage/),
      complete: errors === 0 && !truncated,
      assertion: /assertion violated (.*) \(at depth/.exec(out)?.[1] ?? null,
      counterexample,
      panOutput: out,
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** One line for the test output: what was searched and how long it took. */
export function describeRun(r: SpinResult): string {
  return (
    `spin ${r.defines.map((x) => `-D${x}`).join(' ')}: ${r.statesStored.toLocaleString('en')} states, ` +
    `${r.transitions.toLocaleString('en')} transitions, depth ${r.depthReached}, ${r.memoryMb.toFixed(0)} MB, ` +
    `search ${r.searchSeconds.toFixed(1)} s (${r.totalSeconds.toFixed(1)} s with spin and gcc), ` +
    `${r.errors} errors${r.complete ? ', search complete' : ''}`
  );
}

/** Runs tasks at most `limit` at a time (pan is CPU- and memory-bound: one per core). */
export function limiter(limit: number): <T>(task: () => Promise<T>) => Promise<T> {
  let active = 0;
  const waiting: Array<() => void> = [];
  return async <T>(task: () => Promise<T>): Promise<T> => {
    // A finishing task hands its slot straight to the next one waiting.
    if (active < limit) active++;
    else await new Promise<void>((resolve) => waiting.push(resolve));
    try {
      return await task();
    } finally {
      const next = waiting.shift();
      if (next) next();
      else active--;
    }
  };
}
