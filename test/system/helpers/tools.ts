// Running external programs (qemu-img, qemu-io, nbdinfo, nbdcopy, fio, npm) from tests:
// every call has a timeout, a missing program is a loud failure naming the Debian package
// to install (system tests never skip), and a failing program reports its whole output.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Repository root (this file is test/system/helpers/tools.ts). */
export const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));

/** The Debian package that provides each external tool the tests call. */
const PACKAGE_OF: Record<string, string> = {
  'qemu-img': 'qemu-utils',
  'qemu-io': 'qemu-utils',
  'qemu-nbd': 'qemu-utils',
  nbdinfo: 'libnbd-bin',
  nbdcopy: 'libnbd-bin',
  fio: 'fio',
  'qemu-system-x86_64': 'qemu-system-x86',
};

const checkedTools = new Set<string>();

/** Throws a clear error if `tool` is not on PATH (tests must not silently skip). */
export function requireTool(tool: string): void {
  if (checkedTools.has(tool)) return;
  const r = spawnSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' });
  if (r.status !== 0) {
    const pkg = PACKAGE_OF[tool] ?? tool;
    throw new Error(`required tool '${tool}' is not installed: run 'apt-get install -y ${pkg}' (or bash .ci/setup.sh)`);
  }
  checkedTools.add(tool);
}

/** Throws a clear error if a build output (a path below the repository root) is missing. */
export function requireBuilt(files: readonly string[]): void {
  for (const f of files) {
    if (!existsSync(join(repoRoot, f))) throw new Error(`${f} is missing: run 'npm run build' first`);
  }
}

export interface RunOptions {
  /** Kill the program (SIGKILL) after this long; default 60 s. */
  timeoutMs?: number;
  /** Return the result instead of throwing when the exit code is not 0. */
  allowFailure?: boolean;
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  input?: string | Buffer;
}

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  ms: number;
}

function describe(cmd: string, args: readonly string[], r: RunResult): string {
  const why = r.timedOut ? 'timed out' : r.signal ? `killed by ${r.signal}` : `exit code ${r.code}`;
  return `${cmd} ${args.map((a) => (/[\s'"]/.test(a) ? JSON.stringify(a) : a)).join(' ')}: ${why} after ${r.ms} ms\n` +
    `--- stdout ---\n${r.stdout.slice(-8000)}\n--- stderr ---\n${r.stderr.slice(-8000)}`;
}

/** Runs a program to completion. Throws (with its output) on a non-zero exit unless allowFailure. */
export async function run(cmd: string, args: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  if (PACKAGE_OF[cmd]) requireTool(cmd);
  const timeoutMs = opts.timeoutMs ?? 60_000;
  const started = Date.now();
  return await new Promise<RunResult>((resolve, reject) => {
    // Own process group, so a timeout kills helpers the program started too.
    const child = spawn(cmd, args, {
      cwd: opts.cwd,
      env: opts.env ?? process.env,
      stdio: ['pipe', 'pipe', 'pipe'],
      detached: true,
    });
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
    }, timeoutMs);
    child.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      if (err.code === 'ENOENT') reject(new Error(`required program '${cmd}' was not found on PATH`));
      else reject(err);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const r: RunResult = { code, signal, stdout, stderr, timedOut, ms: Date.now() - started };
      if ((code !== 0 || timedOut) && !opts.allowFailure) reject(new Error(describe(cmd, args, r)));
      else resolve(r);
    });
    child.stdin.on('error', () => {
      // The program may exit without reading its input; that is its business.
    });
    if (opts.input !== undefined) child.stdin.end(opts.input);
    else child.stdin.end();
  });
}

/** A temporary directory that `cleanup()` removes; names stay short (unix socket paths are <108 bytes). */
export class TempDir {
  readonly path: string;
  constructor(prefix = 'mooring-t-') {
    this.path = mkdtempSync(join(tmpdir(), prefix));
  }
  join(...parts: string[]): string {
    return join(this.path, ...parts);
  }
  cleanup(): void {
    rmSync(this.path, { recursive: true, force: true });
  }
}

/** qemu-io against an NBD URI (raw format). Throws with the output if a command fails. */
export async function qemuIo(uri: string, commands: readonly string[], timeoutMs = 60_000): Promise<string> {
  const args = ['-f', 'raw', uri];
  for (const c of commands) args.push('-c', c);
  const r = await run('qemu-io', args, { timeoutMs, allowFailure: true });
  // qemu-io exits 1 when a command fails, but check the text too: older versions did not.
  if (r.code !== 0 || /verification failed|failed:|error/i.test(r.stdout + r.stderr)) {
    throw new Error(`qemu-io failed\n${describe('qemu-io', args, r)}`);
  }
  return r.stdout;
}

/** fio prints "fio: connected to NBD server" on stdout before its JSON: parse from the first '{'. */
export function parseFioJson(stdout: string): FioResult {
  const at = stdout.indexOf('{');
  if (at < 0) throw new Error(`fio printed no JSON:\n${stdout}`);
  return JSON.parse(stdout.slice(at)) as FioResult;
}

export interface FioJob {
  jobname: string;
  error: number;
  read: { io_bytes: number; iops: number };
  write: { io_bytes: number; iops: number };
}
export interface FioResult {
  jobs: FioJob[];
}
