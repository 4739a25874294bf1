// The demo's hosts, all on this machine: each is a `mooring data-engine` process, a sanlock
// daemon with its own run directory and host name, and a host agent (host-agent.mjs) that
// starts that host's QEMUs. In production each host runs these as services; the daemon here
// runs without a watchdog (-w 0), which is only fit for a demo (docs/locks.md).
import { execFile, fork, spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { startDataEngineProcess } from '../shared/data-engine-process.mjs';

const here = dirname(fileURLToPath(import.meta.url));

/** A host agent's IPC channel: calls in, replies and events out. */
export class HostAgent {
  #next = 0;
  #pending = new Map();
  #exits = new Map(); // key -> resolve of that QEMU's exit
  #hostWaiters;
  /** key -> pid of the QEMUs this agent started (a crash kills them with the host). */
  pids = new Map();

  constructor(id, env) {
    this.id = id;
    this.child = fork(join(here, 'host-agent.mjs'), [], { env, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    this.onHost = () => undefined;
    /** sanlock host id -> its state as this host's sanlock last reported it. */
    this.hostStates = new Map();
    this.#hostWaiters = new Set();
    this.child.on('message', (m) => {
      if (m.event === 'exit') this.#exits.get(m.key)?.(m);
      else if (m.event === 'host') {
        this.hostStates.set(m.hostId, m.state);
        this.onHost(m);
        for (const w of this.#hostWaiters) w();
      }
      else {
        const p = this.#pending.get(m.id);
        this.#pending.delete(m.id);
        if (m.error) p?.reject(Object.assign(new Error(`host ${id}: ${m.error.message}`), { code: m.error.code }));
        else p?.resolve(m.value);
      }
    });
    this.child.once('exit', () => {
      for (const p of this.#pending.values()) p.reject(new Error(`host ${id}: its agent exited`));
      this.#pending.clear();
    });
  }

  call(op, args = {}) {
    return new Promise((resolve, reject) => {
      if (!this.child.connected) return reject(new Error(`host ${this.id}: its agent is gone`));
      const id = ++this.#next;
      this.#pending.set(id, { resolve, reject });
      this.child.send({ id, op, args });
    });
  }

  /** Resolves once this host's sanlock reports host `hostId` in `state` (e.g. 'dead'). */
  waitHost(hostId, state) {
    return new Promise((resolve) => {
      const check = () => {
        if (this.hostStates.get(hostId) !== state) return;
        this.#hostWaiters.delete(check);
        resolve();
      };
      this.#hostWaiters.add(check);
      check();
    });
  }

  /** Starts QEMU (see host-agent.mjs `start`); resolves with `{ exited }`, a promise of its exit. */
  async startQemu(key, args, lock, logPath) {
    const exited = new Promise((r) => this.#exits.set(key, r));
    const { pid } = await this.call('start', { key, args, lock, logPath });
    this.pids.set(key, pid);
    void exited.then(() => this.pids.delete(key));
    // Wrapped: an async function returning the promise itself would wait for QEMU's exit.
    return { exited };
  }

  /** The lock half of `Volume.migrate({ locks })` for the QEMU `key` on this host. */
  lockHolder(key) {
    return {
      handOver: () => this.call('handOver', { key }),
      // The lockspaces are the agent's own, opened on its host.
      takeOver: (handover) => this.call('takeOver', { key, handover }),
    };
  }
}

async function startSanlock(dir, id, preload) {
  const runDir = join(dir, `sanlock-${id}`);
  mkdirSync(runDir, { recursive: true });
  const env = { ...process.env, SANLOCK_RUN_DIR: runDir };
  const daemon = spawn('sanlock', ['daemon', '-D', '-w', '0', '-l', '0', '-h', '0', '-U', 'root', '-G', 'root', '-e', `demo-${id}`], {
    env: preload ? { ...env, LD_PRELOAD: preload } : env,
    stdio: 'ignore',
  });
  for (let i = 0; ; i++) {
    if (daemon.exitCode !== null) throw new Error(`sanlock daemon of host ${id} exited (${daemon.exitCode}); in a container without CAP_SYS_RESOURCE pass --sanlock-preload (README)`);
    try {
      await promisify(execFile)('sanlock', ['client', 'status'], { env });
      return { daemon, env };
    } catch (err) {
      if (i > 150) throw new Error(`sanlock daemon of host ${id} does not answer: ${err.message}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/**
 * Starts host `id` (number `n`, from 1: its sanlock host id) under `dir`: data engine with its
 * replica server on 127.0.0.1:`port`, sanlock daemon, agent joined to the lockspace at
 * `lockspacePath` (created by the first host).
 */
export async function startHost(dir, id, n, port, { lockspacePath, ioTimeoutSeconds, preload }) {
  const { child, engine } = await startDataEngineProcess(dir, id, port);
  const { daemon, env } = await startSanlock(dir, id, preload);
  const agent = new HostAgent(id, env);
  await agent.call('join', { name: 'vms', path: lockspacePath, hostId: n, hostName: `demo-${id}`, create: n === 1, ioTimeoutSeconds });
  return {
    id,
    /** The host's id in the lockspace. */
    sanlockHostId: n,
    engine,
    agent,
    /** SIGKILL of everything the host runs, its QEMUs included, as in a power loss. */
    crash() {
      for (const pid of agent.pids.values()) process.kill(pid, 'SIGKILL');
      for (const p of [agent.child, daemon, child]) p.kill('SIGKILL');
    },
    async close() {
      if (agent.child.connected) agent.child.disconnect();
      await engine.close().catch(() => undefined);
      child.kill('SIGTERM');
      await promisify(execFile)('sanlock', ['client', 'shutdown', '-f', '1'], { env }).catch(() => daemon.kill('SIGKILL'));
    },
  };
}
