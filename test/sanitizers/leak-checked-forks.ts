// A vitest pool for the sanitizer pass: vitest's own `forks` pool, except for how a worker
// ends. vitest ends a fork worker with SIGTERM and SIGKILL 500 ms later, and ignores its exit
// status; LeakSanitizer checks for leaks in an atexit handler, which neither signal lets
// run, so every leak would go unseen. Here a worker is asked to leave (its IPC channel is
// closed) and left to exit on its own: node tears the environment down (addon finalizers
// and cleanup hooks run), then LeakSanitizer checks and exits non-zero if anything leaked.
// A worker that exits non-zero, dies of a signal, or does not exit within
// WORKER_EXIT_TIMEOUT_MS (a handle left open keeps its event loop alive, and then leaks
// would go unchecked) is a test run error: vitest fails the run and prints it.
import { type ChildProcess, fork } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import type { PoolOptions, PoolRunnerInitializer, PoolWorker, WorkerRequest } from 'vitest/node';

/** How long a worker may take to exit once asked (teardown plus the leak check under ASan). */
export const WORKER_EXIT_TIMEOUT_MS = 60_000;

class LeakCheckedForksWorker implements PoolWorker {
  readonly name = 'leak-checked-forks';
  readonly cacheFs = true;
  private child: ChildProcess | undefined;
  /** The test files this worker was sent, for the error messages. */
  private readonly files: string[] = [];
  private readonly entrypoint: string;
  private readonly stdout: Writable;
  private readonly stderr: Writable;

  constructor(private readonly options: PoolOptions) {
    // The same entry point as vitest's forks pool (runtime/workers/forks.ts).
    this.entrypoint = resolve(options.distPath, 'workers/forks.js');
    this.stdout = options.project.vitest.logger.outputStream;
    this.stderr = options.project.vitest.logger.errorStream;
  }

  private get fork(): ChildProcess {
    if (!this.child) throw new Error('leak-checked-forks: the worker is not running');
    return this.child;
  }

  on(event: string, callback: (arg: unknown) => void): void {
    this.fork.on(event, callback);
  }

  off(event: string, callback: (arg: unknown) => void): void {
    this.fork.off(event, callback);
  }

  send(message: WorkerRequest): void {
    if (message.type === 'run' || message.type === 'collect') {
      for (const f of message.context.files) this.files.push(f.filepath);
    }
    this.fork.send(message);
  }

  deserialize(data: unknown): unknown {
    return data;
  }

  async start(): Promise<void> {
    if (this.child) return;
    this.child = fork(this.entrypoint, [], {
      env: this.options.env,
      execArgv: this.options.execArgv,
      stdio: 'pipe',
      serialization: 'advanced',
    });
    // Not pipe(): a pipe would end vitest's own stdout when the worker's ends.
    this.child.stdout!.on('data', (d: Buffer) => this.stdout.write(d));
    this.child.stderr!.on('data', (d: Buffer) => this.stderr.write(d));
  }

  async stop(): Promise<void> {
    const child = this.fork;
    const files = `${this.files.join(', ') || '(no test file)'} (pid ${child.pid})`;
    // Everything the worker writes, LeakSanitizer's report included, has been read once
    // both pipes have closed (they may have already: the worker can leave on its own once
    // vitest has told it to stop).
    const closed = (r: Readable): Promise<unknown> => (r.closed ? Promise.resolve() : once(r, 'close'));
    const drained = Promise.all([closed(child.stdout!), closed(child.stderr!)]);
    const exited: Promise<[number | null, NodeJS.Signals | null]> =
      child.exitCode !== null || child.signalCode !== null
        ? Promise.resolve([child.exitCode, child.signalCode])
        : (once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>);
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, WORKER_EXIT_TIMEOUT_MS);
    if (child.connected) child.disconnect();
    const [code, signal] = await exited;
    clearTimeout(timer);
    await drained;
    this.child = undefined;
    let problem: string | undefined;
    if (timedOut) {
      problem =
        `did not exit within ${WORKER_EXIT_TIMEOUT_MS / 1000} s of being asked to (something kept its event loop alive), ` +
        'so LeakSanitizer never checked it; killed';
    } else if (signal !== null) {
      problem = `died of ${signal}`;
    } else if (code !== 0) {
      problem = `exited with status ${code} (a sanitizer report is above, and in the sanitizer log directory)`;
    }
    if (problem) {
      const message = `sanitizer worker for ${files} ${problem}`;
      // Also on stderr, where run.mjs looks: a worker stopped after the last file has
      // finished may be reported after vitest has counted the errors.
      this.stderr.write(`${message}\n`);
      this.options.project.vitest.state.catchError(new Error(message), 'Sanitizer');
    }
  }
}

/** The pool, for `test.pool` in a vitest config. */
export const leakCheckedForks: PoolRunnerInitializer = {
  name: 'leak-checked-forks',
  createPoolWorker: (options: PoolOptions) => new LeakCheckedForksWorker(options),
};
