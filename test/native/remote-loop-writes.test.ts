// Small NBD writes to an engine whose replicas are all on other hosts are started by the
// connection loop that read them (BlockDevice::TryWriteAsyncMany, docs/architecture.md "How a
// write travels"), without a worker, and the loop never waits while doing it: a replica
// whose socket is full gets the rest of the batch from a worker (RemoteReplica::SendRest),
// and a write past a replica's depth goes to a worker, which waits for room. Here on one
// connection loop (MOORING_CONNECTION_LOOPS=1, read once per process: each test file runs
// in a process of its own), which also reads every replica's answers and serves a second
// export: a loop that waited for the full socket would leave that export's reads unanswered
// (the test times out) and never read the other replicas' answers.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

import { NbdClient } from '../../src/bench/nbd-client.js';
import type { NativeEngine, NativeNbdServer } from '../../src/native/binding.js';
import { addon, createReplicas, engineOptions, MiB, pattern, replicaImage, Scratch, waitFor } from './helpers.js';
import { closeAll, endpoint, FrameProxy, type Host, startHosts } from './remote-helpers.js';

// Before any connection of this process: the loops start with the first one.
process.env.MOORING_CONNECTION_LOOPS = '1';

const SIZE = 16 * MiB;
const LEN = 64 * 1024; // the largest request the loop starts (larger ones go to a worker)
const WRITES = 160; // 10 MiB: more than a stalled socket holds, more than a replica's depth (64)

/** Bytes the kernel holds unsent on this host's TCP connection to 127.0.0.1:port. */
function sendQueue(port: number): number {
  const out = execFileSync('ss', ['-tnH', 'state', 'established', 'dst', `127.0.0.1:${port}`], { encoding: 'utf8' });
  const line = out.split('\n').find((l) => l.trim().length > 0);
  if (!line) throw new Error(`no connection to port ${port} in: ${out}`);
  return Number(line.trim().split(/\s+/)[1]);
}

describe('writes started on the connection loop', () => {
  let s: Scratch | undefined;
  let hosts: Host[] = [];
  let proxies: FrameProxy[] = [];
  const engines: NativeEngine[] = [];
  const servers: NativeNbdServer[] = [];
  const clients: NbdClient[] = [];

  afterEach(async () => {
    for (const c of clients.splice(0)) c.destroy();
    for (const x of servers.splice(0)) await x.close().catch(() => undefined);
    for (const e of engines.splice(0)) await e.close().catch(() => undefined);
    for (const p of proxies) await p.close();
    await closeAll(hosts);
    proxies = [];
    hosts = [];
    s?.cleanup();
    s = undefined;
  });

  async function exportOf(engine: NativeEngine, name: string): Promise<{ nbd: NativeNbdServer; client: NbdClient }> {
    engines.push(engine);
    const nbd = await engine.exportNbd({ unixPath: s!.path(`${name}.sock`), ioThreads: 2 });
    servers.push(nbd);
    const client = await NbdClient.connect({ socketPath: s!.path(`${name}.sock`) });
    clients.push(client);
    return { nbd, client };
  }

  it('never wait: a replica whose socket is full holds up neither the loop nor another export, and no write is lost', async () => {
    s = new Scratch('mooring-loop-writes-');
    hosts = await startHosts(s, 3, SIZE);
    proxies = hosts.map((h) => new FrameProxy(h.server.port));
    const ports = await Promise.all(proxies.map((p) => p.start()));
    const remote = await exportOf(
      await addon().openEngine(engineOptions({ replicas: ports.map((p) => endpoint(p, 'vol', { ioTimeoutMs: 60_000 })) })),
      'remote',
    );
    // A second export on the same loop, over a replica in this process: its small cached
    // READs are answered by the loop itself (inlineReads).
    const local = await exportOf(
      await addon().openEngine(engineOptions({ replicas: (await createReplicas(s.path('local'), 1, SIZE)).map((r) => r.path) })),
      'local',
    );
    const block = pattern(77, 4096);
    await local.client.write(0, block);

    const c = remote.client;
    const loopWrites = (): number => remote.nbd.ioStats!().loopWrites;
    await c.write(0, pattern(1, LEN)); // the connections are up
    const loopBefore = loopWrites();
    proxies[0]!.pauseReading(); // its socket fills; the other two replicas answer as usual
    const writes = Array.from({ length: WRITES }, (_, i) => c.write((i * LEN) % SIZE, pattern(1000 + i, LEN)));
    await waitFor('writes started on the loop', () => loopWrites() > loopBefore);
    await waitFor('the paused replica\'s socket full: megabytes unsent', () => sendQueue(ports[0]!) > MiB, 20_000);
    expect(loopWrites() - loopBefore, 'no more than a replica takes outstanding start on the loop').toBeLessThanOrEqual(64);

    // The loop is free: the other export's read is answered by it, at once.
    const inlineBefore = local.nbd.ioStats!().inlineReads;
    expect((await local.client.read(0, 4096)).equals(block)).toBe(true);
    expect(local.nbd.ioStats!().inlineReads - inlineBefore, 'read answered by the loop').toBe(1);

    proxies[0]!.resumeReading();
    await Promise.all(writes);
    // No slot is lost to the loop's reservations: a second round, past the depth again.
    await Promise.all(Array.from({ length: WRITES }, (_, i) => c.write((i * LEN) % SIZE, pattern(2000 + i, LEN))));
    expect(engines[0]!.replicas().map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);

    // Every replica holds the second round, byte for byte (the last write of each block).
    const want = Buffer.alloc(SIZE);
    for (let i = 0; i < WRITES; i++) pattern(2000 + i, LEN).copy(want, (i * LEN) % SIZE);
    clients.shift()!.destroy();
    await servers.shift()!.close();
    await engines.shift()!.close();
    await closeAll(hosts);
    for (const h of hosts) {
      const r = await addon().openReplica(join(h.root, 'vol'));
      try {
        expect((await replicaImage(r)).subarray(0, SIZE).equals(want), `replica on ${h.root}`).toBe(true);
      } finally {
        await r.close();
      }
    }
    hosts = [];
  });
});
