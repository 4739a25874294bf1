// A replica server's connections are read by the process's connection loops, not by a
// thread each (docs/architecture.md, "Threads of the data path"). The loop must stop reading
// a connection at its in-flight cap (128 requests, ReplicaServerOptions) and read it again
// once replies are taken: a client that sends 1,000 READs without reading any reply makes
// the server hold at most 128 of them (the budget's peak says so: the rest of the requests
// wait in the socket), and once it reads, every one of them is answered. The number of
// loops is a setting (MOORING_CONNECTION_LOOPS, read once per process: each test file runs
// in a process of its own), whatever the number of connections. Nothing is timed.
import { afterEach, describe, expect, it } from 'vitest';

import { MiB, Scratch, threadsByName, waitFor } from './helpers.js';
import { closeAll, type Host, Op, RawClient, REQ_HEADER, startHosts } from './remote-helpers.js';

// Before any connection of this process: the loops start with the first one.
const LOOPS = 3;
process.env.MOORING_CONNECTION_LOOPS = String(LOOPS);

const SIZE = 4 * MiB;
const IO = 64 * 1024;
const REQUESTS = 1000;
const CAP = 128; // ReplicaServerOptions::max_inflight_per_connection
const HELD_PER_READ = IO + REQ_HEADER; // what a READ takes from the server's budget

describe('replica server connection loop', () => {
  let s: Scratch | undefined;
  let hosts: Host[] = [];
  let client: RawClient | undefined;

  afterEach(async () => {
    client?.close();
    client = undefined;
    await closeAll(hosts);
    hosts = [];
    s?.cleanup();
    s = undefined;
  });

  it('stops reading a client that takes no replies at its in-flight cap, and answers everything once it reads', async () => {
    s = new Scratch('mooring-rs-loop-');
    hosts = await startHosts(s, 1, SIZE, 'vol');
    const server = hosts[0]!.server;
    const c = (client = await RawClient.open(server.port, 'vol'));
    c.socket.pause(); // take no replies: they fill the sockets, then wait in the server
    const reqs = Array.from({ length: REQUESTS }, (_, i) => ({ op: Op.READ, seq: i + 1, offset: (i % (SIZE / IO)) * IO, length: IO }));
    c.send(...reqs);

    // The server holds its cap of requests (their replies can go nowhere) and reads no more.
    // (A writer thread starts once the socket is full, to wait for the client.)
    await waitFor(
      'the socket to fill and the connection to reach its in-flight cap',
      () => threadsByName().has('mr-rs-send') && server.stats().bufferBytes >= CAP * HELD_PER_READ,
      20_000,
    );

    c.socket.resume();
    await c.until(() => c.replies.length === REQUESTS, 60_000);
    const seqs = new Set(c.replies.map((r) => Number(r.seq)));
    expect(seqs.size).toBe(REQUESTS);
    expect(c.replies.every((r) => r.code === 0 && r.payload.length === IO)).toBe(true);
    // Never more than the cap in flight, though 1,000 requests were sent at once.
    expect(server.stats().bufferBytesPeak).toBeLessThanOrEqual(CAP * HELD_PER_READ);
    await waitFor('the budget to be given back', () => server.stats().bufferBytes === 0);
  }, 120_000);

  it('reads every connection on MOORING_CONNECTION_LOOPS loops, however many connections there are', async () => {
    s = new Scratch('mooring-rs-loops-');
    hosts = await startHosts(s, 1, SIZE, 'vol');
    const port = hosts[0]!.server.port;
    const clients: RawClient[] = [];
    try {
      for (let i = 0; i < 4 * LOOPS; i++) clients.push(await RawClient.open(port, 'vol'));
      for (const [i, c] of clients.entries()) c.send({ op: Op.PING, seq: i + 1 });
      for (const [i, c] of clients.entries()) expect((await c.reply(i + 1))?.code).toBe(0);
      expect(threadsByName().get('mr-conn-loop')).toBe(LOOPS);
    } finally {
      for (const c of clients) c.close();
    }
  });
});
