// Starting `mooring serve` (dist/cli.js) as a child process for system tests: waits for the
// READY line, keeps stderr for failure messages, and kills whatever is left in cleanup.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { ReadyInfo } from '../../../src/cli/serve.js';
import { repoRoot } from './tools.js';

export type { ReadyInfo };

export const cliPath = join(repoRoot, 'dist', 'cli.js');

export interface ServeOptions {
  /** Mooring's directory (--dir). */
  dir: string;
  /** Required when the directory does not hold the volume yet. */
  size?: string | number;
  replicas?: number;
  /** gRPC addresses of other hosts' data engines (--host, one each). */
  hosts?: string[];
  /** --cluster-secret-file: the secret those data engines were given. */
  clusterSecretFile?: string | undefined;
  /** `unix:PATH` or `tcp:HOST:PORT` (default: unix:DIR/nbd.sock). */
  nbd?: string;
  extraArgs?: string[];
  /** How long to wait for READY (default 30 s). */
  readyTimeoutMs?: number;
}

const live = new Set<MooringServer>();

/** A running `mooring serve`. */
export class MooringServer {
  ready!: ReadyInfo;
  /** The JSON text of the READY line. */
  readyLine = '';
  stdout = '';
  stderr = '';
  exitCode: number | null = null;
  exitSignal: NodeJS.Signals | null = null;
  readonly exited: Promise<void>;

  constructor(
    readonly child: ChildProcess,
    readonly description: string,
  ) {
    child.stdout!.setEncoding('utf8').on('data', (d: string) => (this.stdout += d));
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    this.exited = new Promise((r) =>
      child.on('exit', (code, signal) => {
        this.exitCode = code;
        this.exitSignal = signal;
        live.delete(this);
        r();
      }),
    );
    live.add(this);
  }

  get uri(): string {
    return this.ready.uri;
  }
  get pid(): number {
    return this.child.pid!;
  }
  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** What to append to an assertion message: the server's stderr and exit state. */
  diagnostics(): string {
    const state = this.alive ? 'running' : `exited code=${this.exitCode} signal=${this.exitSignal}`;
    return `\n--- ${this.description} (${state}) stderr ---\n${this.stderr.slice(-6000)}\n--- stdout ---\n${this.stdout.slice(-2000)}`;
  }

  /** SIGTERM (or SIGINT), wait for exit; returns the exit code. Throws on timeout. */
  async stop(signal: NodeJS.Signals = 'SIGTERM', timeoutMs = 30_000): Promise<number | null> {
    if (this.alive) this.child.kill(signal);
    const ok = await Promise.race([this.exited.then(() => true), sleep(timeoutMs).then(() => false)]);
    if (!ok) {
      this.child.kill('SIGKILL');
      await this.exited;
      throw new Error(`server did not exit within ${timeoutMs} ms of ${signal}${this.diagnostics()}`);
    }
    return this.exitCode;
  }

  /** SIGKILL: a crash. Waits until the process is gone. */
  async crash(): Promise<void> {
    if (this.alive) this.child.kill('SIGKILL');
    await this.exited;
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function requireCli(): void {
  if (!existsSync(cliPath)) throw new Error(`${cliPath} is missing: run 'npm run build' first`);
}

/** Starts `mooring serve` and waits for its READY line. */
export async function startServe(opts: ServeOptions): Promise<MooringServer> {
  const args = ['serve', '--dir', opts.dir];
  if (opts.size !== undefined) args.push('--size', String(opts.size));
  if (opts.replicas !== undefined) args.push('--replicas', String(opts.replicas));
  for (const h of opts.hosts ?? []) args.push('--host', h);
  if (opts.clusterSecretFile) args.push('--cluster-secret-file', opts.clusterSecretFile);
  if (opts.nbd) args.push('--nbd', opts.nbd);
  args.push(...(opts.extraArgs ?? []));
  const s = await startCliProcess(args, `mooring serve --dir ${opts.dir}`, opts.readyTimeoutMs);
  s.ready = JSON.parse(s.readyLine) as ReadyInfo;
  return s;
}

/**
 * Starts `node dist/cli.js ARGS` (a long-running command: serve, data-engine) and waits for
 * its `READY {json}` line, kept in `readyLine`. `wrap` runs it through a command that execs
 * it (e.g. `ip netns exec NS`). `cli`: another build's cli.js (the version-skew test runs the
 * previous release's); default this repository's dist/cli.js.
 */
export async function startCliProcess(args: string[], description: string, readyTimeoutMs = 30_000, env?: NodeJS.ProcessEnv, wrap?: string[], cli?: string): Promise<MooringServer> {
  if (cli === undefined) requireCli();
  // `wrap`: a command that execs the rest (e.g. `ip netns exec NS`), so the pid stays node's.
  const argv = [process.execPath, cli ?? cliPath, ...args];
  const full = wrap && wrap.length > 0 ? [...wrap, ...argv] : argv;
  const child = spawn(full[0]!, full.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], ...(env ? { env } : {}) });
  const s = new MooringServer(child, description);
  s.readyLine = await new Promise<string>((resolveLine, reject) => {
    const t = setTimeout(() => reject(new Error(`no READY line within ${readyTimeoutMs} ms${s.diagnostics()}`)), readyTimeoutMs);
    const onData = (): void => {
      const m = /^READY (\{.*\})\s*$/m.exec(s.stdout);
      if (m) {
        clearTimeout(t);
        child.stdout!.off('data', onData);
        resolveLine(m[1]!);
      }
    };
    child.stdout!.on('data', onData);
    onData();
    void s.exited.then(() => {
      clearTimeout(t);
      reject(new Error(`${description} exited before READY${s.diagnostics()}`));
    });
  });
  return s;
}

/** Kills every server a test left running (call from afterEach/afterAll). */
export async function killAllServers(): Promise<void> {
  const all = [...live];
  for (const s of all) s.child.kill('SIGKILL');
  await Promise.all(all.map((s) => s.exited));
}

process.on('exit', () => {
  for (const s of live) s.child.kill('SIGKILL');
});

/** Runs `node dist/cli.js ARGS` to completion (for create/info/snapshot commands). */
export async function runCli(args: string[], opts: { allowFailure?: boolean; timeoutMs?: number } = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  requireCli();
  const { run } = await import('./tools.js');
  return await run(process.execPath, [cliPath, ...args], { allowFailure: opts.allowFailure, timeoutMs: opts.timeoutMs ?? 60_000 });
}
