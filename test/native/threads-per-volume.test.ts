// Threads and file descriptors of one process do not grow with the number of attached
// volumes (issue 21, docs/architecture.md "Threads"): an engine with an NBD export and a
// connected client per volume (its connection read by the connection loops once in transmission), over one local replica or three replicas served by replica
// servers over loopback. Each native thread names itself (NameThisThread), so the count is
// taken per kind from /proc/self/task/*/comm and the test says which kind grew.
// Shape, not speed: counts at N and 2N volumes are compared, nothing is timed.
import { readdirSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { NbdClient } from '../../src/bench/nbd-client.js';
import type { NativeEngine, NativeNbdServer } from '../../src/native/binding.js';
import { MiB, Scratch, addon, createReplicas, engineOptions, threadTotal as total, threadsByName, waitFor } from './helpers.js';
import { FrameProxy, Op, closeAll, endpoint, startHosts, type Host } from './remote-helpers.js';

const SIZE = 4 * MiB;
const FIRST = 25;
const SECOND = 50;

function fds(): number {
  return readdirSync('/proc/self/fd').length;
}

/** What grew between two counts, per thread name. */
function growth(before: Map<string, number>, after: Map<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of after) if (v !== (before.get(k) ?? 0)) out[k] = v - (before.get(k) ?? 0);
  return out;
}

/**
 * Between the two steps, only the thread kinds in `perVolume` grew, each by at most that many
 * per added volume; the shared ones stay within their bounds: one poller, an NBD I/O pool of
 * at most WorkerPool::kNbdThreadsMax threads.
 */
function expectGrowth(steps: Array<{ n: number; threads: Map<string, number> }>, perVolume: Record<string, number>): void {
  const [a, b] = [steps[0]!, steps[1]!];
  const added = b.n - a.n;
  const grew = growth(a.threads, b.threads);
  for (const [kind, by] of Object.entries(grew)) {
    // libuv's pool and V8's helpers are the runtime's, started on demand and bounded by it.
    if (kind.startsWith('mr-') && kind !== 'mr-nbd-io') {
      expect(by, `thread kind ${kind} grew by ${by} for ${added} volumes`).toBeLessThanOrEqual((perVolume[kind] ?? 0) * added);
    }
  }
  let allowed = 0;
  for (const v of Object.values(perVolume)) allowed += v * added;
  expect(total(b.threads) - total(a.threads), JSON.stringify(grew)).toBeLessThanOrEqual(allowed + 8);
  expect(b.threads.get('mr-poller') ?? 0).toBeLessThanOrEqual(1);
  expect(b.threads.get('mr-nbd-io') ?? 0).toBeLessThanOrEqual(64);
  expect(b.threads.get('mr-accept') ?? 0, 'no accept thread per listening socket').toBe(0);
  // Replica servers' connections are read by the connection loops (Poller::ForConnection,
  // MOORING_CONNECTION_LOOPS, 2 by default), none by a thread of its own.
  expect(b.threads.get('mr-conn-loop') ?? 0).toBeLessThanOrEqual(2);
  expect(b.threads.get('mr-rs-conn') ?? 0, 'no thread per replica server connection').toBe(0);
  expect(b.threads.get('mr-nbd-conn') ?? 0, 'no thread per NBD connection').toBe(0);
  expectNoReplicaClientThreads(b.threads);
}

/** The engine's side of replica connections: read by the connection loops, no thread each. */
function expectNoReplicaClientThreads(t: Map<string, number>): void {
  expect(t.get('mr-rr-read') ?? 0, 'no reader thread per remote replica').toBe(0);
  expect(t.get('mr-rr-lost') ?? 0, 'one failure-listener thread per process').toBeLessThanOrEqual(1);
  expect(t.get('mr-conn-loop') ?? 0).toBeLessThanOrEqual(2);
}

interface Attached {
  engine: NativeEngine;
  server: NativeNbdServer;
  client: NbdClient;
}

describe('threads and fds per attached volume', () => {
  let s: Scratch | undefined;
  let attached: Attached[] = [];
  let hosts: Host[] = [];
  let proxy: FrameProxy | undefined;

  afterEach(async () => {
    for (const a of attached.splice(0)) {
      await a.client.disconnect().catch(() => undefined);
      await a.server.close().catch(() => undefined);
      await a.engine.close().catch(() => undefined);
    }
    proxy?.release();
    await proxy?.close();
    proxy = undefined;
    await closeAll(hosts);
    hosts = [];
    s?.cleanup();
    s = undefined;
  });

  async function attach(scratch: Scratch, i: number, open: (i: number) => Promise<NativeEngine>): Promise<void> {
    const engine = await open(i);
    const sock = scratch.path(`v${i}.sock`);
    const server = await engine.exportNbd({ unixPath: sock });
    const client = await NbdClient.connect({ socketPath: sock });
    attached.push({ engine, server, client });
    // One write through each, so every connection and replica path has run.
    await client.write(0, Buffer.alloc(4096, i & 0xff));
  }

  // Attaches up to FIRST then SECOND volumes; returns the counts after each step.
  async function measure(label: string, scratch: Scratch, open: (i: number) => Promise<NativeEngine>) {
    const base = { threads: threadsByName(), fds: fds() };
    const steps: Array<{ n: number; threads: Map<string, number>; fds: number }> = [];
    for (const n of [FIRST, SECOND]) {
      while (attached.length < n) await attach(scratch, attached.length, open);
      // An engine's fan-out helpers live for one operation, a replica server connection's
      // handshake thread until HELLO is answered: count once they have ended.
      await waitFor('fan-out and handshake threads to end', () => {
        const t = threadsByName();
        return !t.has('mr-fanout') && !t.has('mr-rs-hello') && !t.has('mr-nbd-hello');
      }, 2000);
      steps.push({ n, threads: threadsByName(), fds: fds() });
    }
    for (const st of steps) {
      console.log(
        `${label}: ${st.n} volumes: ${total(st.threads)} threads (+${total(st.threads) - total(base.threads)}), ` +
          `${st.fds} fds (+${st.fds - base.fds}); grew: ${JSON.stringify(growth(base.threads, st.threads))}`,
      );
    }
    return { base, steps };
  }

  it('one local replica per volume', async () => {
    const scratch = (s = new Scratch('mooring-threads-local-'));
    const { steps } = await measure('local', scratch, async (i) => {
      const replicas = await createReplicas(scratch.path(`r${i}`), 1, SIZE);
      return addon().openEngine(engineOptions({ replicas: replicas.map((r) => r.path) }));
    });
    // The NBD connections are read by the connection loops: no thread per attached volume.
    expectGrowth(steps, {});
    // fds per volume: the replica's files, the export's listening socket and wake fd, the
    // connection's socket (its handshake's wake fd is closed once it is on a loop), and the
    // test's own client socket.
    expect((steps[1]!.fds - steps[0]!.fds) / (SECOND - FIRST)).toBeLessThanOrEqual(10);
  });

  it('three replicas on three replica servers over loopback', async () => {
    const scratch = (s = new Scratch('mooring-threads-remote-'));
    hosts = await startHosts(scratch, 3, SIZE, 'v0');
    const { steps } = await measure('3 remote replicas', scratch, async (i) => {
      if (i > 0) for (const h of hosts) await addon().createReplica(`${h.root}/v${i}`, SIZE);
      return addon().openEngine(engineOptions({ replicas: hosts.map((h) => endpoint(h.server.port, `v${i}`)) }));
    });
    // A replica connection costs no thread on either side: the connection loops read the
    // engine's side (requests are sent by their callers) and the server's (the workers send
    // its replies; a writer thread starts only for a client whose socket filled up), and so
    // is each NBD connection once in transmission.
    expectGrowth(steps, {});
    expect((steps[1]!.fds - steps[0]!.fds) / (SECOND - FIRST)).toBeLessThanOrEqual(20);
  });

  // The engines' replica connections (and the servers' ends of them, in this same process)
  // are read by the connection loops: 100 connections add a fixed number of threads, none
  // per connection, whatever the number of engines.
  it('50 engines with 2 remote replicas each add no thread per replica connection', async () => {
    const scratch = (s = new Scratch('mooring-threads-rr-'));
    const ENGINES = 50;
    hosts = await startHosts(scratch, 2, SIZE, 'v0');
    for (let i = 1; i < ENGINES; i++) for (const h of hosts) await addon().createReplica(`${h.root}/v${i}`, SIZE);
    const engines: NativeEngine[] = [];
    const open = async (i: number): Promise<void> => {
      const e = await addon().openEngine(engineOptions({ replicas: hosts.map((h) => endpoint(h.server.port, `v${i}`)) }));
      engines.push(e);
      await e.write(0, Buffer.alloc(4096, i + 1)); // every connection has carried a request
      await waitFor('fan-out and handshake threads to end', () => {
        const t = threadsByName();
        return !t.has('mr-fanout') && !t.has('mr-rs-hello');
      }, 2000);
    };
    try {
      // The first engine starts what is shared (the loops, the servers' worker pools).
      await open(0);
      const before = threadsByName();
      for (let i = 1; i < ENGINES; i++) await open(i);
      const after = threadsByName();
      const grew = growth(before, after);
      console.log(`${ENGINES} engines x 2 remote replicas: +${total(after) - total(before)} threads after the first; grew: ${JSON.stringify(grew)}`);
      expectNoReplicaClientThreads(after);
      for (const [kind, by] of Object.entries(grew))
        if (kind.startsWith('mr-')) expect(by, `thread kind ${kind} grew by ${by} for ${2 * (ENGINES - 1)} replica connections`).toBe(0);
      // Only the runtime's own pools (libuv, V8) may still start threads: a few, not one per connection.
      expect(total(after) - total(before), JSON.stringify(grew)).toBeLessThanOrEqual(8);
      for (let i = 0; i < ENGINES; i++) expect((await engines[i]!.read(0, 4096))[0]).toBe((i + 1) & 0xff);
    } finally {
      await Promise.allSettled(engines.map((e) => e.close()));
    }
  });

  // The exports share one worker pool (WorkerPool::Nbd): an export whose replica stops
  // answering holds at most its own io_threads workers, and another export is served meanwhile.
  it('an export stuck on its replica holds at most its io_threads workers; the others go on', async () => {
    const scratch = (s = new Scratch('mooring-threads-lanes-'));
    hosts = await startHosts(scratch, 1, SIZE, 'stuck');
    proxy = new FrameProxy(hosts[0]!.server.port);
    const port = await proxy.start();
    const stuckEngine = await addon().openEngine(engineOptions({ replicas: [endpoint(port, 'stuck')] }));
    const stuckServer = await stuckEngine.exportNbd({ unixPath: scratch.path('stuck.sock'), ioThreads: 2 });
    const stuck = await NbdClient.connect({ socketPath: scratch.path('stuck.sock') });
    attached.push({ engine: stuckEngine, server: stuckServer, client: stuck });
    await attach(scratch, 1, async () => {
      const replicas = await createReplicas(scratch.path('good'), 1, SIZE);
      return addon().openEngine(engineOptions({ replicas: replicas.map((r) => r.path) }));
    });
    const good = attached[1]!.client;

    proxy.mode = 'hold';
    proxy.maxOutstanding = proxy.outstanding;
    // A FLUSH waits for its replica on a worker. (A READ or WRITE to remote replicas holds
    // none: the replica's answer finishes it, test/native/remote-nbd-path.test.ts.)
    const held = Array.from({ length: 8 }, () => stuck.flush());
    await waitFor('the stuck export to fill its share of workers', () => proxy!.outstanding >= 2);
    for (let i = 0; i < 20; i++) {
      const data = Buffer.alloc(4096, 0x30 + i);
      await good.write(i * 4096, data);
      expect((await good.read(i * 4096, 4096)).equals(data)).toBe(true);
    }
    // Two workers at most ran the stuck export's flushes, however many it had queued.
    expect(proxy.maxOutstanding).toBeLessThanOrEqual(2);
    expect(proxy.ops.get(Op.FLUSH) ?? 0).toBeLessThanOrEqual(2);
    expect(threadsByName().get('mr-nbd-io') ?? 0).toBeLessThanOrEqual(64);
    proxy.release();
    await Promise.all(held);
    expect(proxy.ops.get(Op.FLUSH)).toBe(8);
  });
});
