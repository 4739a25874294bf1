// The engine's host fails, with three `mooring data-engine` processes as three hosts.
// - SIGKILL of the engine's host while two NBD connections write tracked blocks with FLUSH
//   and FUA: a new engine on host b (a newer epoch) serves every write acknowledged before
//   a FLUSH reply (or with FUA); when a is back its replica is rebuilt, replicas identical.
// - Fencing: the engine's host is frozen (SIGSTOP, as in a partition), the volume is taken
//   over by host b, then a resumes (SIGCONT) with a client still connected to it: a's
//   engine, holding the old epoch, cannot change the replicas the volume now uses; its
//   client sees errors; the data served by b is b's.
import { describe, expect, it } from 'vitest';

import { FlushTracker } from '../helpers/flush-tracker.js';
import { useHostCluster } from '../helpers/host-cluster.js';
import { readReplicas, waitFor, type HostProcess } from '../helpers/hosts.js';
import { NbdClient } from '../helpers/nbd-client.js';
import { chunkedDigest } from '../helpers/replicas.js';
import { sleep } from '../helpers/serve.js';
import { readRange, readWholeVolume } from '../helpers/volume.js';

const MiB = 1 << 20;
const SIZE = 32 * MiB;
const TRACKED_BLOCKS = 1024; // 4 MiB at offset 0
const VOLUME = 'vm2-disk';

describe('three data-engine hosts, engine host failure', () => {
  const env = useHostCluster({ hosts: 3, basePort: 17330 });

  const sock = (host: string): string => env.tmp.join(`${VOLUME}-${host}.sock`);
  const uriOf = (host: string): string => `nbd+unix:///?socket=${sock(host)}`;
  const diag = (): string => env.hosts.map((h) => h.diagnostics()).join('');
  const replicasNow = async (): Promise<Array<{ host: HostProcess; name: string }>> =>
    (await env.cluster.volume(VOLUME).status()).replicas.map((r) => ({ host: env.hosts.find((h) => h.hostId === r.hostId)!, name: r.name }));

  it('keeps every flushed write when the engine host is killed, and a new engine on b serves it', async () => {
    await env.cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3 });
    const first = await env.cluster.volume(VOLUME).attach({ host: 'a', nbd: `unix:${sock('a')}` });
    expect(first.state).toBe('healthy');

    const tracker = new FlushTracker(0, TRACKED_BLOCKS, 4711);
    const clients = [await NbdClient.connect(uriOf('a')), await NbdClient.connect(uriOf('a'))];
    let killed = false;
    tracker.onFlushed = (n) => {
      if (n >= 40 && !killed) {
        killed = true;
        env.hosts[0]!.proc!.child.kill('SIGKILL');
      }
    };
    const load = tracker.run(clients);
    const deadline = Date.now() + 60_000;
    while (!killed && Date.now() < deadline) await sleep(20);
    expect(killed, `fewer than 40 flushes in 60 s${diag()}`).toBe(true);
    await env.hosts[0]!.crash();
    await load;
    for (const c of clients) c.destroy();

    const taken = await env.cluster.volume(VOLUME).attach({ host: 'b', nbd: `unix:${sock('b')}` });
    expect(taken.attachedHost).toBe('b');
    expect(taken.epoch).toBeGreaterThan(first.epoch);
    expect(taken.replicas.find((r) => r.hostId === 'a')?.mode).toBe('ERR');
    const check = await NbdClient.connect(uriOf('b'));
    const region = await readRange(check, 0, TRACKED_BLOCKS * 4096);
    await check.disconnect();
    const { violations, stats } = tracker.verify(region);
    console.log(`engine host crash: ${JSON.stringify(stats)}`);
    expect(violations.slice(0, 20), `${violations.length} blocks lost durable writes; ${JSON.stringify(stats)}${diag()}`).toEqual([]);
    expect(stats.durableBlocks).toBeGreaterThan(50);

    // Host a comes back: its replica (which missed the takeover) is rebuilt by b's engine.
    await env.hosts[0]!.start();
    await env.cluster.addHost(env.hosts[0]!.engine);
    const healthy = await waitFor(async () => (await env.cluster.volume(VOLUME).status()).state === 'healthy', 60_000, 300);
    expect(healthy, `not healthy after a came back: ${JSON.stringify(await env.cluster.volume(VOLUME).status())}${diag()}`).toBe(true);
    const served = await readWholeVolume(uriOf('b'));
    const list = await replicasNow();
    await env.cluster.volume(VOLUME).detach();
    const contents = await readReplicas(list, SIZE);
    for (const c of contents) expect(c.digest, `replica ${c.id} differs from what b served`).toBe(chunkedDigest(served));
  });

  it('fences the old engine of a frozen host: after SIGCONT it cannot change the replicas', async () => {
    await env.cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3 });
    const first = await env.cluster.volume(VOLUME).attach({ host: 'a', nbd: `unix:${sock('a')}` });
    const stale = await NbdClient.connect(uriOf('a'));
    await stale.write(0, Buffer.alloc(MiB, 0x01));
    await stale.flush();

    env.hosts[0]!.freeze();
    const taken = await env.cluster.volume(VOLUME).attach({ host: 'b', nbd: `unix:${sock('b')}` });
    expect(taken.epoch, JSON.stringify(taken)).toBeGreaterThan(first.epoch);
    const fresh = await NbdClient.connect(uriOf('b'));
    expect((await fresh.read(0, MiB)).equals(Buffer.alloc(MiB, 0x01))).toBe(true);
    await fresh.write(0, Buffer.alloc(MiB, 0x02));
    await fresh.flush();

    // The partition heals: a runs again with its old engine and its client.
    env.hosts[0]!.thaw();
    const results = await Promise.allSettled([
      stale.write(0, Buffer.alloc(MiB, 0xee)),
      stale.write(4 * MiB, Buffer.alloc(MiB, 0xee)),
      stale.flush(),
    ]);
    const writesOk = results.slice(0, 2).filter((r) => r.status === 'fulfilled').length;
    expect(writesOk, `a fenced engine acknowledged writes: ${JSON.stringify(results)}${diag()}`).toBe(0);
    stale.destroy();

    // What b serves is b's data, also after a's replica is rebuilt.
    expect((await fresh.read(0, MiB)).equals(Buffer.alloc(MiB, 0x02))).toBe(true);
    expect((await fresh.read(4 * MiB, MiB)).equals(Buffer.alloc(MiB, 0))).toBe(true);
    const healthy = await waitFor(async () => (await env.cluster.volume(VOLUME).status()).state === 'healthy', 60_000, 300);
    expect(healthy, `not healthy after a resumed: ${JSON.stringify(await env.cluster.volume(VOLUME).status())}${diag()}`).toBe(true);
    await fresh.disconnect();
    const served = await readWholeVolume(uriOf('b'));
    expect(served.subarray(4 * MiB, 5 * MiB).equals(Buffer.alloc(MiB, 0))).toBe(true);
    const list = await replicasNow();
    await env.cluster.volume(VOLUME).detach();
    const contents = await readReplicas(list, SIZE);
    for (const c of contents) expect(c.digest, `replica ${c.id} differs from what b served`).toBe(chunkedDigest(served));
  });
});
