// Real sanlock daemons for system tests, one per simulated host, each with its own run
// directory (SANLOCK_RUN_DIR: socket, pid file) and fixed host name (-e), started the way
// DESIGN.md says works in a container without CAP_SYS_RESOURCE: a preloaded shim lets the
// daemon's setrlimit(RLIMIT_MEMLOCK/RTPRIO) "succeed", no watchdog (-w 0), no mlockall
// (-l 0), no RR scheduling (-h 0), running as root. A missing sanlock fails loudly.
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/** How long a daemon may take to answer `sanlock client status` after start. */
const DAEMON_READY_TIMEOUT_MS = 15_000;
/** How long a clean shutdown may take before SIGKILL. */
const DAEMON_STOP_TIMEOUT_MS = 15_000;
/** Daemon log kept for diagnostics (bytes). */
const LOG_BYTES_MAX = 256 * 1024;

const SHIM_SOURCE = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/resource.h>
/* sanlock raises RLIMIT_MEMLOCK and RLIMIT_RTPRIO at start and exits when it cannot
   (a container without CAP_SYS_RESOURCE): report success for exactly those. */
int setrlimit(__rlimit_resource_t r, const struct rlimit *l) {
  int (*real)(__rlimit_resource_t, const struct rlimit *) =
      (int (*)(__rlimit_resource_t, const struct rlimit *))dlsym(RTLD_NEXT, "setrlimit");
  int rc = real(r, l);
  if (rc != 0 && errno == EPERM && (r == RLIMIT_MEMLOCK || r == RLIMIT_RTPRIO)) return 0;
  return rc;
}
`;

let shimPath: string | undefined;

/** Throws naming the Debian packages when sanlock (daemon or client library) is missing. */
export function requireSanlock(): void {
  const r = spawnSync('sh', ['-c', 'command -v sanlock && ls /usr/lib/*/libsanlock_client.so.1 /lib/*/libsanlock_client.so.1 2>/dev/null | head -1'], {
    encoding: 'utf8',
  });
  const lines = r.stdout.trim().split('\n').filter(Boolean);
  if (r.status !== 0 || lines.length < 2)
    throw new Error("sanlock is not installed: run 'apt-get install -y sanlock libsanlock-client1' (or bash .ci/setup.sh)");
  const gcc = spawnSync('sh', ['-c', 'command -v gcc']);
  if (gcc.status !== 0) throw new Error("gcc is needed to build the setrlimit shim: run 'apt-get install -y gcc'");
}

/** Builds (once per test process) the setrlimit shim and returns its path. */
export function buildShim(): string {
  if (shimPath && existsSync(shimPath)) return shimPath;
  requireSanlock();
  const dir = mkdtempSync(join(tmpdir(), 'mooring-sanlock-shim-'));
  writeFileSync(join(dir, 'shim.c'), SHIM_SOURCE);
  execFileSync('gcc', ['-shared', '-fPIC', '-O2', '-o', join(dir, 'shim.so'), join(dir, 'shim.c'), '-ldl'], { stdio: 'pipe' });
  shimPath = join(dir, 'shim.so');
  return shimPath;
}

const live = new Set<SanlockDaemon>();

/** A running `sanlock daemon` for one simulated host. */
export class SanlockDaemon {
  log = '';
  readonly exited: Promise<void>;
  #child: ChildProcess;

  private constructor(
    /** The daemon's host name (-e). */
    readonly hostName: string,
    /** Its SANLOCK_RUN_DIR. */
    readonly runDir: string,
    child: ChildProcess,
  ) {
    this.#child = child;
    const keep = (d: Buffer) => {
      this.log = (this.log + d.toString('utf8')).slice(-LOG_BYTES_MAX);
    };
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    this.exited = new Promise((r) => child.once('exit', () => r()));
    live.add(this);
    void this.exited.then(() => live.delete(this));
  }

  /** Starts a daemon named `hostName` with a fresh run directory; resolves when it answers. */
  static async start(hostName: string): Promise<SanlockDaemon> {
    const shim = buildShim();
    const runDir = mkdtempSync(join(tmpdir(), `mooring-sanlock-${hostName}-`));
    mkdirSync(runDir, { recursive: true });
    const child = spawn('sanlock', ['daemon', '-D', '-w', '0', '-l', '0', '-h', '0', '-U', 'root', '-G', 'root', '-e', hostName], {
      env: { ...process.env, SANLOCK_RUN_DIR: runDir, LD_PRELOAD: shim },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const d = new SanlockDaemon(hostName, runDir, child);
    const deadline = Date.now() + DAEMON_READY_TIMEOUT_MS;
    for (;;) {
      if (!d.alive) throw new Error(`sanlock daemon ${hostName} exited at start:\n${d.log}`);
      const r = spawnSync('sanlock', ['client', 'status'], { env: d.env(), encoding: 'utf8', timeout: 5000 });
      if (r.status === 0) return d;
      if (Date.now() > deadline) {
        d.kill();
        throw new Error(`sanlock daemon ${hostName} did not answer within ${DAEMON_READY_TIMEOUT_MS} ms:\n${d.log}`);
      }
      await sleep(100);
    }
  }

  get pid(): number {
    return this.#child.pid!;
  }

  get alive(): boolean {
    return this.#child.exitCode === null && this.#child.signalCode === null;
  }

  /** Environment for a client of this daemon (library calls, `sanlock client`). */
  env(): NodeJS.ProcessEnv {
    return { ...process.env, SANLOCK_RUN_DIR: this.runDir };
  }

  /** `sanlock client status` output. */
  status(): string {
    return spawnSync('sanlock', ['client', 'status'], { env: this.env(), encoding: 'utf8', timeout: 5000 }).stdout;
  }

  /** SIGKILL: the host's sanlock dies (as in a host crash); its leases stop being renewed. */
  kill(): void {
    if (this.alive) this.#child.kill('SIGKILL');
  }

  /** Clean shutdown (releases host leases), SIGKILL after a timeout; removes the run directory. */
  async stop(): Promise<void> {
    if (this.alive) {
      spawnSync('sanlock', ['client', 'shutdown', '-f', '1'], { env: this.env(), timeout: 5000 });
      const ok = await Promise.race([this.exited.then(() => true), sleep(DAEMON_STOP_TIMEOUT_MS).then(() => false)]);
      if (!ok) this.kill();
      await this.exited;
    }
    rmSync(this.runDir, { recursive: true, force: true });
  }
}

/** Kills every daemon still running (afterAll safety net). */
export async function killAllDaemons(): Promise<void> {
  const all = [...live];
  for (const d of all) d.kill();
  await Promise.all(all.map((d) => d.exited));
  for (const d of all) rmSync(d.runDir, { recursive: true, force: true });
  if (shimPath) rmSync(join(shimPath, '..'), { recursive: true, force: true });
  shimPath = undefined;
}
