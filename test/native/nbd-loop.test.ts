// NBD connections in the transmission phase are read by the process's connection loops, not
// by a thread each (docs/architecture.md, "Threads of the data path"); here by one loop
// (MOORING_CONNECTION_LOOPS=1, read once per process: each test file runs in a process of its
// own). 64 clients of one export add no thread after the first (each handshake's mr-nbd-hello
// thread ends once the client is in transmission), and a client that stops reading its
// replies (its socket full, replies queued for the loop to finish on EPOLLOUT) holds up only
// itself: every other client on the same loop writes and reads back meanwhile, and the stuck
// one gets every reply, intact, once it reads again. Fails with a thread per connection (the
// count) or with a loop that waits for a connection's socket (the test times out).
// A freeze with hold parks each connection as a loop state: the FLUSHes at the head of its
// stream are still answered (by a worker), anything else waits, unread, for the unfreeze.
import { afterEach, describe, expect, it } from 'vitest';

import { NbdClient } from '../../src/bench/nbd-client.js';
import type { NativeEngine, NativeNbdHandOffServer, NativeNbdServer } from '../../src/native/binding.js';
import { MiB, Scratch, addon, createReplicas, engineOptions, pattern, threadTotal, threadsByName, waitFor } from './helpers.js';

// Before any connection of this process: the loops start with the first one.
process.env.MOORING_CONNECTION_LOOPS = '1';

const SIZE = 64 * MiB;
const CLIENTS = 64;
const STUCK_READS = 16;
const READ_BYTES = MiB;

describe('NBD connections on one shared connection loop', () => {
  let s: Scratch | undefined;
  let engine: NativeEngine | undefined;
  let server: NativeNbdServer | undefined;
  const clients: NbdClient[] = [];

  afterEach(async () => {
    for (const c of clients.splice(0)) c.socket.destroy();
    await server?.close().catch(() => undefined);
    await engine?.close().catch(() => undefined);
    server = engine = undefined;
    s?.cleanup();
    s = undefined;
  });

  it('adds no thread per connection and serves every client while one does not read its replies', async () => {
    s = new Scratch('mooring-nbd-loop-');
    const replicas = await createReplicas(s.path('r'), 1, SIZE);
    engine = await addon().openEngine(engineOptions({ replicas: replicas.map((r) => r.path) }));
    const sock = s.path('v.sock');
    server = await engine.exportNbd({ unixPath: sock, maxConnections: CLIENTS + 8 });
    const connect = async (i: number): Promise<NbdClient> => {
      const c = await NbdClient.connect({ socketPath: sock });
      clients.push(c);
      const data = pattern(100 + i, 4096);
      await c.write(32 * MiB + i * 4096, data);
      expect((await c.read(32 * MiB + i * 4096, 4096)).equals(data)).toBe(true);
      return c;
    };
    const handshakesDone = () => waitFor('handshake threads to end', () => !threadsByName().has('mr-nbd-hello'), 2000);

    // The first client starts what is shared (the loop, the NBD worker pool).
    const stuck = await connect(0);
    await handshakesDone();
    const before = threadsByName();
    for (let i = 1; i < CLIENTS; i++) await connect(i);
    await handshakesDone();
    const after = threadsByName();
    const grew: Record<string, number> = {};
    for (const [k, v] of after) if (v !== (before.get(k) ?? 0)) grew[k] = v - (before.get(k) ?? 0);
    const poolGrowth = (after.get('mr-nbd-io') ?? 0) - (before.get('mr-nbd-io') ?? 0);
    console.log(`${CLIENTS} NBD clients of one export: +${threadTotal(after) - threadTotal(before)} threads after the first; grew: ${JSON.stringify(grew)}`);
    expect(after.get('mr-conn-loop')).toBe(1);
    expect(after.has('mr-nbd-conn') || after.has('mr-nbd-tls'), 'no thread per NBD connection').toBe(false);
    for (const [kind, by] of Object.entries(grew)) {
      // The NBD worker pool is shared and bounded (WorkerPool::Nbd, at most 64).
      if (kind.startsWith('mr-') && kind !== 'mr-nbd-io') expect(by, `thread kind ${kind} grew by ${by} for ${CLIENTS - 1} connections`).toBe(0);
    }
    expect(after.get('mr-nbd-io') ?? 0).toBeLessThanOrEqual(64);
    // Only the runtime's own pools (libuv, V8) may still start threads: a few, not one per connection.
    expect(threadTotal(after) - threadTotal(before) - poolGrowth, JSON.stringify(grew)).toBeLessThanOrEqual(8);
    expect(server.stats().connectionsOpen).toBe(CLIENTS);

    // The first client writes what it will read, then stops reading: its replies fill the
    // socket and wait, queued, holding the export's budget.
    const want = pattern(7, STUCK_READS * READ_BYTES);
    await stuck.write(0, want);
    const requestsBefore = server.stats().requests;
    stuck.socket.pause();
    const reads = Array.from({ length: STUCK_READS }, (_, k) => stuck.read(k * READ_BYTES, READ_BYTES));
    await waitFor('the stuck client\'s reads to be answered into a full socket', () => {
      const io = server!.ioStats!();
      return server!.stats().requests >= requestsBefore + STUCK_READS && io.budgetUsedBytes >= STUCK_READS * READ_BYTES / 2;
    });
    let stuckSettled = false;
    const settled = Promise.allSettled(reads).finally(() => {
      stuckSettled = true;
    });

    // Every other client on the same loop is served meanwhile.
    for (let round = 0; round < 2; round++) {
      for (let i = 1; i < CLIENTS; i++) {
        const data = pattern(1000 * (round + 1) + i, 4096);
        await clients[i]!.write(32 * MiB + i * 4096, data);
        expect((await clients[i]!.read(32 * MiB + i * 4096, 4096)).equals(data)).toBe(true);
      }
    }
    expect(stuckSettled, 'the stuck client has not read its replies').toBe(false);
    expect(server.ioStats!().budgetUsedBytes, 'its replies still wait').toBeGreaterThan(0);

    // It reads again: the loop finishes the queued replies, each whole and in place.
    stuck.socket.resume();
    const results = await settled;
    for (let k = 0; k < STUCK_READS; k++) {
      const r = results[k]!;
      expect(r.status, `read ${k}`).toBe('fulfilled');
      if (r.status === 'fulfilled') expect(r.value.equals(want.subarray(k * READ_BYTES, (k + 1) * READ_BYTES)), `read ${k}`).toBe(true);
    }
    await waitFor('the budget to be given back', () => server!.ioStats!().budgetUsedBytes === 0);
    expect(server.stats().protocolErrors).toBe(0);
  });

  it('a unix client\'s socket takes a whole 1 MiB reply at once, without the loop finishing it', async () => {
    s = new Scratch('mooring-nbd-sndbuf-');
    const replicas = await createReplicas(s.path('r'), 1, SIZE);
    engine = await addon().openEngine(engineOptions({ replicas: replicas.map((r) => r.path) }));
    const sock = s.path('v.sock');
    server = await engine.exportNbd({ unixPath: sock });
    const c = await NbdClient.connect({ socketPath: sock });
    clients.push(c);
    await c.write(0, pattern(7, READ_BYTES));
    c.socket.pause(); // the reply stays in the socket until the client reads
    const read = c.read(0, READ_BYTES);
    // The budget is held until a reply is sent whole: with the default send buffer (208 KiB)
    // most of it would wait for the client; raised, all of it is in the socket.
    await waitFor('the 1 MiB reply sent whole into the socket (send buffer raised; needs net.core.wmem_max ≥ 1 MiB)', () =>
      server!.ioStats!().budgetUsedBytes === 0,
    );
    c.socket.resume();
    expect((await read).equals(pattern(7, READ_BYTES))).toBe(true);
  });

  it('parked in a hold, answers the FLUSHes at the head of each stream and holds the rest until unfrozen', async () => {
    s = new Scratch('mooring-nbd-loop-hold-');
    const replicas = await createReplicas(s.path('r'), 1, SIZE);
    engine = await addon().openEngine(engineOptions({ replicas: replicas.map((r) => r.path) }));
    const sock = s.path('v.sock');
    const exp = (server = await engine.exportNbd({ unixPath: sock })) as NativeNbdHandOffServer;
    const a = await NbdClient.connect({ socketPath: sock });
    const b = await NbdClient.connect({ socketPath: sock });
    clients.push(a, b);
    const data = pattern(3, 64 * 1024);
    await a.write(0, data);

    await exp.freeze(5000, true);
    await a.flush(); // at the head: answered while parked
    await a.flush();
    let readDone = false;
    let flushAfterRead = false;
    const read = a.read(0, data.length).then((r) => {
      readDone = true;
      return r;
    });
    const laterFlush = a.flush().then(() => {
      flushAfterRead = true;
    });
    // The other connection, on the same loop, still has its FLUSHes answered meanwhile.
    for (let i = 0; i < 3; i++) await b.flush();
    expect(readDone, 'a READ at the head of a held stream waits for the unfreeze').toBe(false);
    expect(flushAfterRead, 'a FLUSH behind it waits too: requests stay in order').toBe(false);
    const io = exp.ioStats!();
    expect(io.ops.read.count, 'the held READ was not executed').toBe(0);

    await exp.unfreeze();
    expect((await read).equals(data)).toBe(true);
    await laterFlush;
    expect(readDone && flushAfterRead).toBe(true);
    expect(exp.stats().protocolErrors).toBe(0);
  });
});
