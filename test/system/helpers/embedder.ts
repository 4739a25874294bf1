// A VM manager process embedding Mooring over etcd with leadership (embedder-process.mjs),
// driven by the test over IPC: `call(op, ...args)` runs one control operation there and
// resolves with its result or rejects with an EmbedderError carrying the MooringError code.
// It can be SIGKILLed (a crashed VM manager), frozen and resumed.
import { fork, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import type { LeaderStatus } from '../../../src/cluster/leader-lease.js';
import { repoRoot } from './tools.js';

const SCRIPT = fileURLToPath(new URL('./embedder-process.mjs', import.meta.url));
/** Longest wait for one call (every operation of the test is bounded far below it). */
const CALL_TIMEOUT_MS = 90_000;

export interface EmbedderConfig {
  id: string;
  endpoint: string;
  prefix: string;
  leaseMs: number;
  hosts: Array<{ address: string; secretFile: string }>;
  replicaReplacementWaitMs?: number;
}

/** Where the process runs: a command prefix such as `ip netns exec NS` (NetLab.wrap), or none. */
export interface EmbedderPlace {
  wrap?: string[];
}

/** A leadership change as the embedder reported it, on the machine's monotonic clock (ms). */
export interface LeadershipEvent {
  status: LeaderStatus;
  atMono: number;
}

/** An operation refused or failed inside an embedder. */
export class EmbedderError extends Error {
  constructor(
    message: string,
    readonly code: string | null,
    readonly details: unknown,
  ) {
    super(message);
  }
}

interface Message {
  id?: number;
  ok?: boolean;
  value?: unknown;
  error?: { code: string | null; message: string; details: unknown };
  event?: string;
  status?: LeaderStatus;
  isLeader?: boolean;
  atMono?: number;
}

const live = new Set<Embedder>();

export class Embedder {
  readonly events: LeadershipEvent[] = [];
  /** Each change of whether it counts itself leader (the first entry: when it opened). */
  readonly leading: Array<{ isLeader: boolean; atMono: number }> = [];
  #nextId = 1;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  #stderr = '';
  #exited: string | null = null;

  private constructor(
    readonly id: string,
    readonly child: ChildProcess,
  ) {
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.#stderr = (this.#stderr + d).slice(-20_000)));
    child.stdout!.setEncoding('utf8').on('data', (d: string) => (this.#stderr = (this.#stderr + d).slice(-20_000)));
    child.on('message', (msg: Message) => {
      if (msg.event === 'leadership') this.events.push({ status: msg.status!, atMono: msg.atMono! });
      if (msg.event === 'leading') this.leading.push({ isLeader: msg.isLeader!, atMono: msg.atMono! });
      if (msg.id === undefined) return;
      const p = this.#pending.get(msg.id);
      if (!p) return;
      this.#pending.delete(msg.id);
      if (msg.ok) p.resolve(msg.value);
      else p.reject(new EmbedderError(`${this.id}: ${msg.error!.code ?? 'no code'}: ${msg.error!.message}`, msg.error!.code, msg.error!.details));
    });
    child.on('exit', (code, signal) => {
      this.#exited = `exited (${code ?? signal})`;
      live.delete(this);
      for (const p of this.#pending.values()) p.reject(new EmbedderError(`${this.id} ${this.#exited}`, null, null));
      this.#pending.clear();
    });
  }

  /** Starts the process; resolves once its Mooring is open (it knows whether it leads). */
  static async start(cfg: EmbedderConfig, place: EmbedderPlace = {}): Promise<{ embedder: Embedder; status: LeaderStatus }> {
    // In a namespace: `ip netns exec NS node SCRIPT` (ip execs node: same pid, the IPC channel's fd inherited).
    const [wrapCmd, ...wrapArgs] = place.wrap ?? [];
    const child = fork(SCRIPT, [], {
      ...(wrapCmd ? { execPath: wrapCmd, execArgv: [...wrapArgs, process.execPath] } : {}),
      env: { ...process.env, MOORING_DIST_INDEX: join(repoRoot, 'dist', 'index.js'), MOORING_EMBEDDER_CONFIG: JSON.stringify(cfg) },
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    });
    const e = new Embedder(cfg.id, child);
    live.add(e);
    const status = await new Promise<LeaderStatus>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`embedder ${cfg.id} not ready in 30 s${e.diagnostics()}`)), 30_000);
      child.on('message', (msg: Message) => {
        if (msg.event !== 'ready') return;
        clearTimeout(timer);
        resolve(msg.status!);
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`embedder ${cfg.id} exited (${code ?? signal}) before it was ready${e.diagnostics()}`));
      });
    });
    return { embedder: e, status };
  }

  get alive(): boolean {
    return this.#exited === null;
  }

  /** Runs one operation in the embedder. */
  call<T = unknown>(op: string, ...args: unknown[]): Promise<T> {
    if (!this.alive) return Promise.reject(new EmbedderError(`${this.id} ${this.#exited}`, null, null));
    const id = this.#nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new Error(`${this.id}: ${op} did not answer in ${CALL_TIMEOUT_MS} ms`));
      }, CALL_TIMEOUT_MS);
      this.#pending.set(id, {
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v as T);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.child.send({ id, op, args });
    });
  }

  /** Its leadership now, with the monotonic time of the answer. */
  async leadership(): Promise<{ leadership: LeaderStatus; atMono: number }> {
    return this.call('status');
  }

  /** Monotonic ms (this machine's clock) once it was gone after SIGKILL, or null. */
  killedAtMono: number | null = null;

  /** SIGKILL: the VM manager crashes. Waits until it is gone. */
  async kill(): Promise<void> {
    if (!this.alive) return;
    const gone = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGKILL');
    await gone;
    this.killedAtMono = Number(process.hrtime.bigint() / 1000n) / 1000;
  }

  freeze(): void {
    this.child.kill('SIGSTOP');
  }

  thaw(): void {
    this.child.kill('SIGCONT');
  }

  /** A clean close (hands leadership over); SIGKILL if it does not end in 30 s. */
  async close(): Promise<void> {
    if (!this.alive) return;
    this.thaw();
    const gone = new Promise((r) => this.child.once('exit', r));
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 30_000);
    await this.call('close').catch(() => undefined);
    await gone;
    clearTimeout(timer);
  }

  diagnostics(): string {
    return `\n--- embedder ${this.id} (${this.#exited ?? 'running'}) output ---\n${this.#stderr.slice(-4000)}`;
  }
}

/** Kills every embedder still running (afterAll). */
export async function killAllEmbedders(): Promise<void> {
  for (const e of [...live]) await e.kill();
}
