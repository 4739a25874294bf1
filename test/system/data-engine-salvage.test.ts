// A salvage start through real `mooring data-engine` processes (docs/salvage.md): a volume
// with one replica on each of three hosts is written through NBD; two hosts crash for good.
// On the third, the normal start over the replica left is NO_QUORUM; the salvage start
// serves the data written before, and the `salvaged` event comes over the gRPC watch stream
// with the source's ref id, its last RW set and `complete` false.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { DataEngineEvent, EngineReplicaRef } from '../../src/data-engine/data-engine.js';
import { codeOf } from '../helpers/codes.js';
import { makeHosts, stopCluster, type HostProcess } from './helpers/hosts.js';
import { NbdClient } from './helpers/nbd-client.js';
import { TempDir } from './helpers/tools.js';

const MiB = 1024 * 1024;

/** Calls `check` every 20 ms until it holds, at most `timeoutMs`. */
async function until(what: string, check: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('salvage start through data-engine processes', () => {
  let tmp: TempDir;
  let hosts: HostProcess[];
  beforeAll(async () => {
    tmp = new TempDir('mooring-salvage-sys-');
    hosts = makeHosts(tmp.path, 3, 27540);
    for (const h of hosts) await h.start();
  });
  afterAll(async () => {
    await stopCluster({ hosts, tmp });
  });

  it('serves the lone survivor after two hosts are gone, and reports salvaged over the watch stream', async () => {
    const [a, b, c] = hosts as [HostProcess, HostProcess, HostProcess];
    const refs: EngineReplicaRef[] = [];
    for (const [i, h] of [a, b, c].entries()) {
      await h.engine.createReplica(`vol-r${i}`, 8 * MiB);
      refs.push({ id: `r${i}`, hostId: h.hostId, name: `vol-r${i}`, address: h.ready!.replicaAddress });
    }
    const data = Buffer.alloc(MiB);
    for (let i = 0; i < data.length; i++) data[i] = (i * 13 + 5) & 0xff;
    const first = tmp.join('first.sock');
    await a.engine.startEngine({ volume: 'vol', replicas: refs, nbd: `unix:${first}`, epoch: 1 });
    const writer = await NbdClient.connect({ socketPath: first });
    await writer.write(2 * MiB, data);
    await writer.flush();
    await writer.disconnect();
    await a.engine.stopEngine('vol');

    // c's event stream is live before the salvage: a throwaway engine's stop comes through.
    const events: DataEngineEvent[] = [];
    c.engine.watch((e) => events.push(e));
    await c.engine.createReplica('probe', MiB);
    for (let epoch = 1; !events.some((e) => e.type === 'engine-stopped' && e.volume === 'probe'); epoch++) {
      if (epoch > 100) throw new Error('the watch stream never delivered');
      await c.engine.startEngine({ volume: 'probe', replicas: [{ id: 'p', hostId: 'c', name: 'probe', address: null }], epoch });
      await c.engine.stopEngine('probe');
    }

    await a.crash();
    await b.crash();
    const survivor = [{ ...refs[2]!, address: null }];
    expect(await codeOf(c.engine.startEngine({ volume: 'vol', replicas: survivor, epoch: 2 }))).toBe('NO_QUORUM');
    const nbd = tmp.join('salvaged.sock');
    const info = await c.engine.startEngine({ volume: 'vol', replicas: survivor, nbd: `unix:${nbd}`, epoch: 3, salvage: true });
    expect(info.replicas.map((r) => [r.id, r.mode])).toEqual([['r2', 'RW']]);
    const reader = await NbdClient.connect({ socketPath: nbd });
    expect(Buffer.compare(await reader.read(2 * MiB, MiB), data)).toBe(0);
    await reader.disconnect();
    await until('salvaged over the watch stream', () => events.some((e) => e.type === 'salvaged'));
    expect(events.filter((e) => e.type === 'salvaged')).toEqual([
      { type: 'salvaged', volume: 'vol', replicaId: 'r2', lastRw: { epoch: 1, generation: 1 }, complete: false, message: expect.stringMatching(/may be missing/) },
    ]);
    await c.engine.stopEngine('vol');
  });
});
