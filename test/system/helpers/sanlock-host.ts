// A simulated host for the sanlock system tests: its own sanlock daemon (own run directory
// and host name) and its own library process (sanlock-agent.mjs) talking to that daemon,
// as on a real host where one VM manager process uses the local daemon. Tests send
// functions to run in the agent with `host.run((m, s, args) => ..., args)`; `m` is the built
// package, `s` per-host state. The functions travel as source text: they must not close
// over test variables (pass `args`).
import { fork, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import type * as Mooring from '../../../src/index.js';
import { SanlockDaemon } from './sanlock-daemon.js';
import { repoRoot } from './tools.js';

/** Path of the fake VM program. */
export const VM_SCRIPT = fileURLToPath(new URL('./sanlock-vm.mjs', import.meta.url));
const AGENT_SCRIPT = fileURLToPath(new URL('./sanlock-agent.mjs', import.meta.url));
/** Default wait for one call into the agent. */
const CALL_TIMEOUT_MS = 150_000;

/** Per-host state inside the agent (anything the test functions keep). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AgentState = Record<string, any> & {
  procs: Mooring.LockedProcess[];
  start(opts: Mooring.LockedProcessOptions): Promise<Mooring.LockedProcess>;
  emit(name: string, data: unknown): void;
  talk(proc: Mooring.LockedProcess, line: string): Promise<string>;
};

/** An event an agent function emitted. */
export interface AgentEvent {
  event: string;
  data: any; // eslint-disable-line @typescript-eslint/no-explicit-any
  atMs: number;
}

/** An error thrown inside the agent, with its MooringError code. */
export class AgentError extends Error {
  constructor(
    message: string,
    readonly code: string | undefined,
    readonly details: unknown,
  ) {
    super(message);
  }
}

const live = new Set<SimHost>();

export class SimHost {
  readonly events: AgentEvent[] = [];
  #nextId = 1;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  #stderr = '';

  private constructor(
    readonly name: string,
    readonly daemon: SanlockDaemon,
    readonly agent: ChildProcess,
  ) {
    agent.stderr!.setEncoding('utf8').on('data', (d: string) => (this.#stderr = (this.#stderr + d).slice(-20000)));
    agent.on('message', (msg: { id?: number; value?: unknown; error?: { code?: string; message: string; details: unknown }; event?: string; data?: unknown; atMs?: number }) => {
      if (msg.event !== undefined) {
        this.events.push({ event: msg.event, data: msg.data, atMs: msg.atMs! });
        return;
      }
      const p = msg.id === undefined ? undefined : this.#pending.get(msg.id);
      if (!p) return;
      this.#pending.delete(msg.id!);
      if (msg.error) p.reject(new AgentError(`${this.name}: ${msg.error.message}`, msg.error.code, msg.error.details));
      else p.resolve(msg.value);
    });
    agent.on('exit', () => {
      for (const p of this.#pending.values()) p.reject(new Error(`${this.name}: agent exited\n${this.#stderr}`));
      this.#pending.clear();
    });
    live.add(this);
  }

  /** Starts the host's daemon (named `name`) and its library process. */
  static async start(name: string): Promise<SimHost> {
    const daemon = await SanlockDaemon.start(name);
    const agent = fork(AGENT_SCRIPT, [], {
      env: { ...daemon.env(), MOORING_DIST_INDEX: join(repoRoot, 'dist', 'index.js') },
      stdio: ['ignore', 'inherit', 'pipe', 'ipc'],
    });
    await new Promise<void>((resolve, reject) => {
      agent.once('message', () => resolve());
      agent.once('exit', (code) => reject(new Error(`agent of ${name} exited (${code})`)));
    });
    return new SimHost(name, daemon, agent);
  }

  /** Runs `fn` in the host's library process and returns its (JSON-serialisable) result. */
  run<T, A = undefined>(fn: (m: typeof Mooring, s: AgentState, args: A) => Promise<T>, args?: A, timeoutMs = CALL_TIMEOUT_MS): Promise<T> {
    const id = this.#nextId++;
    return new Promise<T>((resolve, reject) => {
      const t = setTimeout(() => {
        this.#pending.delete(id);
        reject(new Error(`${this.name}: call timed out after ${timeoutMs} ms\n${this.#stderr}`));
      }, timeoutMs);
      this.#pending.set(id, {
        resolve: (v) => {
          clearTimeout(t);
          resolve(v as T);
        },
        reject: (e) => {
          clearTimeout(t);
          reject(e);
        },
      });
      this.agent.send({ id, fn: fn.toString(), args });
    });
  }

  /** Resolves with the first event (already seen or future) matching `pred`. */
  async waitEvent(pred: (e: AgentEvent) => boolean, timeoutMs: number): Promise<AgentEvent> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const hit = this.events.find(pred);
      if (hit) return hit;
      if (Date.now() > deadline) throw new Error(`${this.name}: no matching event within ${timeoutMs} ms; got ${JSON.stringify(this.events)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** The daemon log and agent stderr, for failure messages. */
  diagnostics(): string {
    return `\n--- ${this.name} daemon ---\n${this.daemon.log.slice(-4000)}\n--- ${this.name} agent stderr ---\n${this.#stderr}`;
  }

  /** Stops the agent (its VM processes die with their locks released) and the daemon. */
  async stop(): Promise<void> {
    live.delete(this);
    if (this.agent.exitCode === null && this.agent.signalCode === null) {
      await this.run(async (_m, s) => {
        for (const p of s.procs) p.kill('SIGKILL');
        await Promise.all(s.procs.map((p) => p.exited));
      }, undefined, 10_000).catch(() => undefined);
      this.agent.kill('SIGKILL');
      await new Promise((r) => this.agent.once('exit', r));
    }
    await this.daemon.stop();
  }
}

/** Stops every host still running. */
export async function stopAllHosts(): Promise<void> {
  await Promise.all([...live].map((h) => h.stop()));
}
