// The engines' replica connections are read by the process's connection loops, not by a
// thread each (docs/architecture.md, "Threads of the data path"); here by one loop
// (MOORING_CONNECTION_LOOPS=1, read once per process: each test file runs in a process of its
// own), which also reads the replica servers' ends. A loop never waits for one connection:
// a connection stuck on a peer that stopped reading (its socket full, its callers blocked
// writing, the JS thread asking for replica state, whose refresh the loop sends) holds up its
// own requests only. Another engine on the same loop writes and reads throughout, and the
// stuck replica is dropped once its peer goes. Nothing is timed: the stuck replica's I/O
// timeout (60 s) only makes sure it is still waiting when the other engine is done.
import { afterEach, describe, expect, it } from 'vitest';

import type { NativeEngine, NativeRemoteReplica } from '../../src/native/binding.js';
import { addon, engineOptions, MiB, pattern, Scratch, threadsByName, waitFor } from './helpers.js';
import { closeAll, endpoint, FrameProxy, type Host, startHosts } from './remote-helpers.js';

// Before any connection of this process: the loops start with the first one.
process.env.MOORING_CONNECTION_LOOPS = '1';

const SIZE = 16 * MiB;

describe('remote replicas on one shared connection loop', () => {
  let s: Scratch | undefined;
  let hosts: Host[] = [];
  let proxy: FrameProxy | undefined;
  const engines: NativeEngine[] = [];

  afterEach(async () => {
    await proxy?.close();
    proxy = undefined;
    await Promise.allSettled(engines.splice(0).map((e) => e.close()));
    await closeAll(hosts);
    hosts = [];
    s?.cleanup();
    s = undefined;
  });

  async function open(replicas: NativeRemoteReplica[]): Promise<NativeEngine> {
    const e = await addon().openEngine(engineOptions({ replicas }));
    engines.push(e);
    return e;
  }

  it('serves every other connection while one is stuck on a peer that stopped reading', async () => {
    s = new Scratch('mooring-rr-loop-');
    hosts = await startHosts(s, 3, SIZE, 'stuck');
    for (const h of hosts) await addon().createReplica(`${h.root}/good`, SIZE);
    proxy = new FrameProxy(hosts[2]!.server.port);
    const port = await proxy.start();
    const stuck = await open([
      endpoint(hosts[0]!.server.port, 'stuck'),
      endpoint(hosts[1]!.server.port, 'stuck'),
      endpoint(port, 'stuck', { ioTimeoutMs: 60_000 }),
    ]);
    const good = await open(hosts.map((h) => endpoint(h.server.port, 'good')));
    await stuck.write(0, pattern(1, 4096));
    expect(threadsByName().get('mr-conn-loop')).toBe(1);
    expect(threadsByName().has('mr-rr-read')).toBe(false);

    proxy.mode = 'stall'; // reads one chunk more, forwards nothing, answers nothing
    const before = proxy.received;
    const polling = setInterval(() => stuck.replicas(), 5); // allocated-bytes refreshes
    let stuckSettled = false;
    // Two writes of 8 MiB: they fill the socket, and hold two of libuv's four pool threads
    // (which run every engine call), so the other engine's calls still find one.
    const chunk = SIZE / 2;
    const stuckWrites = Promise.allSettled(
      Array.from({ length: 2 }, (_, i) => stuck.write(i * chunk, pattern(10 + i, chunk))),
    ).finally(() => {
      stuckSettled = true;
    });
    try {
      await waitFor('the stalled peer to take its last bytes', () => proxy!.received > before);
      for (let i = 0; i < 50; i++) {
        const data = pattern(1000 + i, 4096);
        await good.write(i * 4096, data);
        expect((await good.read(i * 4096, 4096)).equals(data)).toBe(true);
      }
      expect(stuckSettled, 'the stuck engine waits for its stalled replica').toBe(false);
      expect(stuck.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
    } finally {
      clearInterval(polling);
    }

    // The peer goes: the stuck connection fails, its engine drops that replica and its
    // writes complete on the others.
    await proxy.close();
    proxy = undefined;
    const results = await stuckWrites;
    expect(results.every((r) => r.status === 'fulfilled'), JSON.stringify(results.filter((r) => r.status === 'rejected'))).toBe(true);
    expect(stuck.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'ERR']);
    expect((await stuck.read(chunk, chunk)).equals(pattern(11, chunk))).toBe(true);
    expect(good.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
  });
});
