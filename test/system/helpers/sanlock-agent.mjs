// A simulated host's library process for the sanlock system tests: it runs with its own
// SANLOCK_RUN_DIR (so the library talks to that host's daemon), imports the built package
// (dist/index.js) and runs the functions the test sends over IPC. State persists across
// calls in `s`; `s.emit(name, data)` sends an event back with a timestamp.
import { createInterface } from 'node:readline';

const m = await import(process.env.MOORING_DIST_INDEX);
// esbuild (vitest) may wrap functions in __name(); the functions arrive as source text.
globalThis.__name = (f) => f;
const AsyncFunction = Object.getPrototypeOf(async () => {}).constructor;

const s = {
  procs: [],
  // LockedProcess.start, remembered so the host's stop() can kill what is left.
  async start(opts) {
    const p = await m.LockedProcess.start(opts);
    s.procs.push(p);
    return p;
  },
  emit(name, data) {
    process.send({ event: name, data, atMs: Date.now() });
  },
  // One request/answer line with a fake VM (test/system/helpers/sanlock-vm.mjs).
  async talk(proc, line) {
    const child = proc.child;
    if (!child.__lines) {
      child.__lines = [];
      child.__waiters = [];
      createInterface({ input: child.stdout }).on('line', (l) => {
        const w = child.__waiters.shift();
        if (w) w(l);
        else child.__lines.push(l);
      });
    }
    child.stdin.on('error', () => undefined); // a VM that died answers nothing (below)
    child.stdin.write(`${line}\n`);
    const first = child.__lines.shift();
    if (first !== undefined) return first;
    return new Promise((resolve) => {
      child.__waiters.push(resolve);
      child.once('exit', () => resolve('exited'));
    });
  },
};

process.on('message', async (msg) => {
  try {
    const fn = new AsyncFunction('m', 's', 'args', `return (${msg.fn})(m, s, args);`);
    const value = await fn(m, s, msg.args);
    process.send({ id: msg.id, value: value === undefined ? null : value });
  } catch (err) {
    const e = err ?? {};
    process.send({ id: msg.id, error: { code: e.code, message: String(e.message ?? e), details: e.details ?? null } });
  }
});
process.send({ ready: true });
