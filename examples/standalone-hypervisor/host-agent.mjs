// The per-host half of the VM manager: one process per host, with that host's sanlock
// daemon (SANLOCK_RUN_DIR), started by the manager (hosts.mjs) and driven over Node's IPC
// channel. It joins the lockspace, starts each QEMU through LockedProcess so the VM never
// runs without its disk lock, moves the lock at a live migration's hand-over, and reports
// QEMU exits and the other hosts' liveness as sanlock sees it.
//
// requests  {id, op, args}  ->  replies {id, value} | {id, error: {code, message}}
// events    {event: 'exit', key, code, signal, stoppedBySanlock} | {event: 'host', state, hostId}
import { closeSync, openSync } from 'node:fs';

import { Lockspace, LockedProcess } from '../../dist/index.js';

let lockspace = null;
let watcher = null;
/** key -> { proc, held }: `held` is what the process holds, kept for when it is gone. */
const vms = new Map();
const send = (msg) => process.connected && process.send(msg);

function vm(key) {
  const v = vms.get(key);
  if (!v) throw Object.assign(new Error(`no VM process ${key} on this host`), { code: 'NOT_FOUND' });
  return v;
}

const ops = {
  /** Creates the lockspace (first host only) and joins it; watches the other hosts. */
  async join({ name, path, hostId, hostName, create, ioTimeoutSeconds }) {
    if (create) await Lockspace.create({ name, path, maxLocks: 64, ioTimeoutSeconds });
    lockspace = await Lockspace.open({ name, path });
    await lockspace.join({ hostId, hostName });
    watcher = lockspace.watch();
    watcher.on('change', (e) => send({ event: 'host', state: e.to, hostId: e.hostId }));
    watcher.on('error', () => undefined); // the watcher keeps polling
    watcher.start();
  },

  async createLock({ name }) {
    await lockspace.createLock(name);
  },

  /**
   * Starts QEMU holding the lock `lock` (null: registered with sanlock, holding nothing, as a
   * migration target until the hand-over). Resolves once QEMU runs; waits while the lock's
   * holder is a host not yet dead.
   */
  async start({ key, args, lock, logPath }) {
    const locks = lock ? [await lockspace.openLock(lock)] : [];
    const log = openSync(logPath, 'a');
    try {
      const proc = await LockedProcess.start({ command: 'qemu-system-x86_64', args, locks, ownerName: key, stdio: ['ignore', log, log] });
      const v = { proc, held: { state: '', leases: await proc.inquire() } };
      vms.set(key, v);
      void proc.exited.then((e) => send({ event: 'exit', key, code: e.code, signal: e.signal, stoppedBySanlock: e.stoppedBySanlock ?? null }));
      return { pid: proc.pid };
    } finally {
      closeSync(log);
    }
  },

  /** Migration source at the switch-over: release the lock and report its version. */
  async handOver({ key }) {
    const v = vm(key);
    try {
      const out = await v.proc.handOver();
      v.held = { state: '', leases: [] };
      return out;
    } catch (err) {
      // A process that is gone holds nothing any more: the daemon released what it last held.
      await Promise.race([v.proc.exited, new Promise((r) => setTimeout(r, 2000))]);
      if (v.proc.exit) return v.held;
      throw err;
    }
  },

  /** Migration target before it runs (or the source on rollback): acquire at the handed-over version. */
  async takeOver({ key, handover }) {
    const v = vm(key);
    await v.proc.takeOver(handover, [lockspace]);
    v.held = { state: '', leases: await v.proc.inquire() };
  },

  async kill({ key }) {
    vms.get(key)?.proc.kill('SIGKILL');
  },
};

process.on('message', async ({ id, op, args }) => {
  try {
    if (!Object.hasOwn(ops, op)) throw Object.assign(new Error(`unknown op ${op}`), { code: 'INVALID_ARGUMENT' });
    send({ id, value: (await ops[op](args)) ?? null });
  } catch (err) {
    send({ id, error: { code: err.code ?? 'ERROR', message: err.message } });
  }
});

// The manager went away: stop watching, leave the VMs to sanlock (as a crashed agent would).
process.on('disconnect', async () => {
  await watcher?.stop();
  process.exit(0);
});
