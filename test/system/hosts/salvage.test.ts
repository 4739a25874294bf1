// Salvage with five `mooring data-engine` processes as hosts (docs/salvage.md): a 3-replica
// volume served on host a, its replicas on b, c and d. A client writes and flushes through
// NBD while the replica hosts are killed one after the other (b, then c, then d); then some
// come back, in different orders, and Volume.salvage brings the volume back from them.
// The flush tracker checks the whole history of what the client was told: every write a
// FLUSH made durable reads back whenever a replica holding all of them survived.
import { describe, expect, it } from 'vitest';

import type { VolumeSalvagedEvent } from '../../../src/mooring-options.js';
import type { VolumeStatus } from '../../../src/volume/volume.js';
import { FlushTracker } from '../helpers/flush-tracker.js';
import { useHostCluster } from '../helpers/host-cluster.js';
import { waitFor } from '../helpers/hosts.js';
import { NbdClient } from '../helpers/nbd-client.js';

const MiB = 1 << 20;
const SIZE = 16 * MiB;
const BLOCKS = 512; // 2 MiB tracked
const VOLUME = 'sv';

describe('five data-engine hosts: salvage after every replica host died', () => {
  const env = useHostCluster({ hosts: 5, basePort: 27700, cluster: { replicaReplacementWaitMs: 3_600_000 } });

  const sock = (): string => env.tmp.join(`${VOLUME}.sock`);
  const uri = (): string => `nbd+unix:///?socket=${sock()}`;
  const diag = (): string => env.hosts.map((h) => h.diagnostics()).join('');
  const host = (id: string) => env.hosts.find((h) => h.hostId === id)!;
  const replicaOn = async (id: string): Promise<string> => (await env.cluster.volume(VOLUME).status()).replicas.find((r) => r.hostId === id)!.id;

  /**
   * Writes through NBD while b, c and d are killed one after the other (each once the
   * engine saw the one before fail), then brings back `back` in that order; returns the
   * tracker and the replica ids by host.
   */
  async function killAllReplicaHosts(back: string[]): Promise<{ tracker: FlushTracker; ids: Record<string, string> }> {
    await env.cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3, hosts: ['b', 'c', 'd'] });
    await env.cluster.volume(VOLUME).attach({ host: 'a', nbd: `unix:${sock()}` });
    const ids = { b: await replicaOn('b'), c: await replicaOn('c'), d: await replicaOn('d') };
    const client = await NbdClient.connect(uri());
    const tracker = new FlushTracker(0, BLOCKS, 9100 + back.length);
    tracker.allowWriteErrors = true; // held, then failed, once c is gone: never acknowledged
    const writing = tracker.run([client], 8, 16);
    try {
      for (const id of ['b', 'c']) {
        const before = tracker.acked;
        expect(await waitFor(async () => tracker.acked > before + 50, 60_000), `writes acknowledged before ${id} dies${diag()}`).toBe(true);
        await host(id).crash();
        if (id === 'b') {
          // The engine drops b (c and d are a majority of the three) and goes on.
          expect(await waitFor(async () => (await env.cluster.volume(VOLUME).engine())?.replicas.find((r) => r.id === ids.b)?.mode === 'ERR', 60_000), `b dropped${diag()}`).toBe(true);
        }
      }
      // Without c, dropping it needs b or d to agree with d: no majority, so the writes in
      // flight are held, then fail. Their replies say so: none of them is acknowledged.
      await host('d').crash();
    } finally {
      tracker.stop();
      await writing;
      await client.disconnect().catch(() => undefined);
    }
    for (const id of back) {
      await host(id).start();
      await env.cluster.addHost(host(id).engine); // offered again: a restarted data engine
    }
    return { tracker, ids };
  }

  async function salvageAndVerify(tracker: FlushTracker): Promise<VolumeSalvagedEvent & { status: VolumeStatus }> {
    const events: VolumeSalvagedEvent[] = [];
    env.cluster.on('volume-salvaged', (e) => events.push(e));
    const done = await env.cluster.volume(VOLUME).salvage({ timeoutMs: 120_000 });
    expect(done.status.state, diag()).toBe('healthy');
    expect(done.status.attachedHost).toBe('a'); // the workload's ticket keeps it there, exported
    expect(events).toEqual([expect.objectContaining({ volume: VOLUME, hostId: 'a', sourceReplicas: done.sourceReplicas })]);
    const client = await NbdClient.connect(uri());
    try {
      const { violations, stats } = tracker.verify(await client.read(0, BLOCKS * 4096));
      expect(stats.acked).toBeGreaterThan(100);
      expect(violations, diag()).toEqual([]);
    } finally {
      await client.disconnect();
    }
    // The replicas left out were replaced: three RW replicas again.
    expect(done.status.replicas).toHaveLength(3);
    expect(done.status.replicas.every((r) => r.mode === 'RW')).toBe(true);
    return done;
  }

  it('d alone comes back: no majority, the salvage serves from d, the last RW replica, and loses no durable write', async () => {
    const { tracker, ids } = await killAllReplicaHosts(['d']);
    // The normal rules cannot serve: one of three replicas is no majority.
    const status = await env.cluster.volume(VOLUME).status();
    expect(status.state, JSON.stringify(status)).not.toBe('healthy');
    const done = await salvageAndVerify(tracker);
    expect(done.sourceReplicas).toEqual([ids.d]);
    expect(done.goneReplicas.sort()).toEqual([ids.b, ids.c].sort());
    // Without a majority the engine cannot prove that no later replica set exists.
    expect(done.complete).toBe(false);
    expect(done.status.replicas.map((r) => r.hostId).sort()).toEqual(['a', 'd', 'e']);
  });

  it('b then d come back: the stale b is not the source, d is, and with a majority nothing is missing', async () => {
    const { tracker, ids } = await killAllReplicaHosts(['b', 'd']);
    const done = await salvageAndVerify(tracker);
    expect(done.sourceReplicas).toEqual([ids.d]);
    expect(done.goneReplicas).toEqual([ids.c]);
    expect(done.complete).toBe(true);
    // c's replacement goes to a or e, the hosts without one of the volume's replicas.
    const hostIds = done.status.replicas.map((r) => r.hostId);
    expect(hostIds.filter((h) => h === 'b' || h === 'd').sort()).toEqual(['b', 'd']);
    expect(hostIds.filter((h) => h === 'a' || h === 'e')).toHaveLength(1);
  });
});
