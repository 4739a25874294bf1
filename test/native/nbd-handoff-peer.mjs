// One side of an NBD hand-off, in its own node process (test/native/nbd-handoff.test.ts).
// It loads the addon from the package root as the library does (node-gyp-build: build/,
// then prebuilds/) and obeys JSON commands, one per stdin line: {id, op, ...}. Each answer
// is one stdout line {id, ok, result} or {id, ok: false, error: {code, message}}; events
// the test waits on are lines {event, ...}. Commands run concurrently. stderr is the
// test's to show.
//
// The hand-off protocol the test drives (the controller's, in a later stage): the old
// process (O) listens; the new one (N) connects. O: freeze, detach, close its engine (the
// replica's lock goes with it), send the record. N: open an engine over the same replica
// with a higher epoch, adopt, send READY. O: COMMIT, then close the detached server
// (releases its fds, touches nothing). N: on COMMIT, unfreeze. If READY never comes (N died,
// refused), O reopens its engine with the spare epoch and unfreezes onto it.
import { createRequire } from 'node:module';
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(dirname(fileURLToPath(import.meta.url))));
const addon = createRequire(join(root, 'package.json'))('node-gyp-build')(root);

const state = { engine: null, server: null, listener: null, channel: null, record: null, dir: null };

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

async function openEngine(dir, epoch) {
  state.dir = dir;
  state.engine = await addon.openEngine({ replicas: [dir], members: ['r0'], epoch });
  return state.engine;
}

async function recv(timeoutMs) {
  const item = await state.channel.receive(timeoutMs);
  if (item.type === 'message') return { type: 'message', text: item.data.toString() };
  state.record = item.record;
  return { type: 'nbd-server', ...summary(item.record) };
}

function summary(r) {
  return {
    connectionIds: r.connectionIds,
    unixPath: r.unixPath,
    tcpPort: r.tcpPort,
    exportName: r.exportName,
    pendingBytes: r.pendingBytes,
    connectionsTotal: r.connectionsTotal,
  };
}

const ops = {
  async createReplica({ dir, sizeBytes }) {
    await addon.createReplica(dir, sizeBytes);
  },
  async openEngine({ dir, epoch }) {
    await openEngine(dir, epoch);
  },
  async resize({ sizeBytes }) {
    await state.engine.resize(sizeBytes);
  },
  async exportNbd({ nbd }) {
    state.server = await state.engine.exportNbd(nbd);
    return { port: state.server.port };
  },
  async stats() {
    return { ...state.server.stats(), connectionIds: state.server.connectionIds() };
  },
  async fdCount() {
    return readdirSync('/proc/self/fd').length;
  },
  async listen({ path }) {
    state.listener = await addon.handOff.listen(path);
  },
  async accept({ timeoutMs }) {
    state.channel = await state.listener.accept(timeoutMs);
    return { peerPid: state.channel.peerPid };
  },
  async connect({ path, timeoutMs }) {
    state.channel = await addon.handOff.connect(path, timeoutMs);
    return { peerPid: state.channel.peerPid };
  },
  async freeze({ timeoutMs }) {
    await state.server.freeze(timeoutMs);
  },
  async unfreeze() {
    await state.server.unfreeze();
  },
  // O's side of a whole hand-off. Measures the pause: freeze called to COMMIT sent.
  async handOff({ freezeTimeoutMs, readyTimeoutMs, spareEpoch }) {
    const t0 = performance.now();
    emit({ event: 'freezing' });
    await state.server.freeze(freezeTimeoutMs);
    const record = await state.server.detach();
    const sent = summary(record);
    await state.engine.close();
    await state.channel.send(record);
    let reply;
    try {
      reply = await recv(readyTimeoutMs);
    } catch (err) {
      reply = { type: 'error', code: err.code, message: err.message };
    }
    if (reply.type === 'message' && reply.text === 'READY') {
      await state.channel.send(Buffer.from('COMMIT'));
      const pauseMs = performance.now() - t0;
      await state.server.close(); // detached: closes its fds only
      state.server = null;
      state.engine = null;
      return { committed: true, pauseMs, sent };
    }
    // Rollback: the replica again, under an epoch above anything N may have claimed.
    await openEngine(state.dir, spareEpoch);
    await state.server.unfreeze(state.engine);
    return { committed: false, reply, sent };
  },
  // N's side: adopt, READY, wait for COMMIT, start. `holdBeforeReady`: adopt, say so, then
  // wait forever (the test kills us there).
  async takeOver({ path, dir, epoch, holdBeforeReady, timeoutMs }) {
    state.channel = await addon.handOff.connect(path, timeoutMs);
    const got = await recv(timeoutMs);
    if (got.type !== 'nbd-server') throw new Error(`expected an NBD record, got ${JSON.stringify(got)}`);
    await openEngine(dir, epoch);
    const t0 = performance.now();
    state.server = await addon.adoptNbdServer(state.record, state.engine);
    const adoptMs = performance.now() - t0;
    if (holdBeforeReady) {
      emit({ event: 'adopted', record: got });
      await new Promise(() => {});
    }
    await state.channel.send(Buffer.from('READY'));
    const commit = await recv(timeoutMs);
    if (commit.type !== 'message' || commit.text !== 'COMMIT') throw new Error(`expected COMMIT, got ${JSON.stringify(commit)}`);
    await state.server.unfreeze();
    return { record: got, adoptMs };
  },
  async send({ text }) {
    await state.channel.send(Buffer.from(text));
  },
  async receive({ timeoutMs }) {
    return recv(timeoutMs);
  },
  async closeChannel() {
    state.channel.close();
  },
  async close() {
    if (state.server) await state.server.close();
    if (state.engine) await state.engine.close();
    state.channel?.close();
    state.listener?.close();
    state.server = null;
    state.engine = null;
  },
};

const rl = createInterface({ input: process.stdin });
rl.on('line', (line) => {
  const cmd = JSON.parse(line);
  const op = ops[cmd.op];
  Promise.resolve()
    .then(() => {
      if (!op) throw new Error(`unknown op ${cmd.op}`);
      return op(cmd);
    })
    .then(
      (result) => emit({ id: cmd.id, ok: true, result: result ?? null }),
      (err) => emit({ id: cmd.id, ok: false, error: { code: err.code ?? 'ERROR', message: err.message } }),
    );
});
rl.on('close', () => {
  ops.close().finally(() => process.exit(0));
});
emit({ event: 'ready', pid: process.pid });
