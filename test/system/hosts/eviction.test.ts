// Host eviction and disk replacement with four `mooring data-engine` processes as hosts
// (src/cluster/eviction-controller.ts): an attached volume's healthy replicas move off an
// evicted host while a client writes and flushes through NBD, a detached volume moves under
// its own ticket, and every acknowledged write reads back afterwards; a host whose disk was
// wiped and that came back (a new disk id in its data-engine.json) has its replicas
// replaced at once, with the data rebuilt from the others.
import { existsSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import { FlushTracker } from '../helpers/flush-tracker.js';
import { useHostCluster } from '../helpers/host-cluster.js';
import { readReplicas, replicaPath, type HostProcess } from '../helpers/hosts.js';
import { NbdClient } from '../helpers/nbd-client.js';
import { qemuIo } from '../helpers/tools.js';

const MiB = 1 << 20;
const SIZE = 16 * MiB;
const BLOCKS = 512; // 2 MiB tracked

describe('four data-engine hosts: eviction and a replaced disk', () => {
  const env = useHostCluster({ hosts: 4, basePort: 17950, cluster: { repairIntervalMs: 0, replicaReplacementWaitMs: 3_600_000 } });

  const sock = (name: string): string => env.tmp.join(`${name}.sock`);
  const uri = (name: string): string => `nbd+unix:///?socket=${sock(name)}`;
  const diag = (): string => env.hosts.map((h) => h.diagnostics()).join('');
  const replicaDirs = (h: HostProcess): string[] => (existsSync(join(h.opts.dir, 'replicas')) ? readdirSync(join(h.opts.dir, 'replicas')) : []);
  const hostsOf = async (v: string): Promise<string[]> => (await env.cluster.volume(v).status()).replicas.map((r) => r.hostId).sort();

  it('moves every replica off an evicted host while a client writes, losing no acknowledged write', async () => {
    const warnings: string[] = [];
    env.cluster.on('warning', (e) => warnings.push(`${e.code}: ${e.message}`));
    let evicted = false;
    env.cluster.on('host-evicted', (e) => (evicted ||= e.hostId === 'c'));
    await env.cluster.createVolume({ name: 'att', sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] });
    await env.cluster.createVolume({ name: 'det', sizeBytes: SIZE, replicas: 2, hosts: ['b', 'c'] });
    // The detached volume's data, written once through its own attach.
    await env.cluster.volume('det').attach({ host: 'b', nbd: `unix:${sock('det')}` });
    await qemuIo(uri('det'), ['write -P 0x5a 1M 3M']);
    await env.cluster.volume('det').detach();

    await env.cluster.volume('att').attach({ host: 'a', nbd: `unix:${sock('att')}` });
    const client = await NbdClient.connect(uri('att'));
    const tracker = new FlushTracker(0, BLOCKS, 4242);
    const writing = tracker.run([client], 8, 16);
    try {
      expect((await env.cluster.evictHost('c')).replicasLeft).toBe(2);
      // Each pass moves one replica per volume: two passes at most, with I/O in flight throughout.
      for (let pass = 0; pass < 6 && !evicted; pass++) await env.cluster.repairOnce();
    } finally {
      tracker.stop();
      await writing;
    }
    expect(evicted, `${warnings.join('\n')}${diag()}`).toBe(true);
    await client.flush();
    const { violations, stats } = tracker.verify(await client.read(0, BLOCKS * 4096));
    await client.disconnect();
    expect(stats.acked).toBeGreaterThan(100);
    expect(violations, diag()).toEqual([]);

    expect(await hostsOf('att')).toEqual(['a', 'b', 'd']);
    const det = await hostsOf('det');
    expect(det).not.toContain('c');
    expect(det).toHaveLength(2);
    expect(replicaDirs(env.hosts[2]!), 'the evicted host keeps no replica').toEqual([]);
    expect((await env.cluster.volume('att').engine())?.replicas.every((r) => r.mode === 'RW')).toBe(true);
    expect(await env.cluster.volume('det').tickets()).toEqual([]);
    expect((await env.cluster.volume('det').status()).state).toBe('detached');

    // The moved detached volume holds its data on its new hosts: read it with c gone.
    await env.hosts[2]!.stop();
    await env.cluster.volume('det').attach({ host: 'a', nbd: `unix:${sock('det')}` });
    await qemuIo(uri('det'), ['read -P 0x5a 1M 3M', 'read -P 0 0 1M']);
    await env.cluster.volume('det').detach();
  });

  it('replaces at once the replicas of a host that came back with a wiped disk', async () => {
    const replaced: unknown[] = [];
    env.cluster.on('disk-replaced', (e) => replaced.push(e));
    await env.cluster.createVolume({ name: 'dv', sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] });
    await env.cluster.volume('dv').attach({ host: 'a', nbd: `unix:${sock('dv')}` });
    await qemuIo(uri('dv'), ['write -P 0x61 0 4M', 'flush']);
    const b = env.hosts[1]!;
    const before = (await b.engine.info()).diskId;
    expect(before).toMatch(/^[0-9a-f-]{36}$/);

    // The disk is replaced: the process stops, its directory goes, a new one comes up.
    await b.stop();
    rmSync(b.opts.dir, { recursive: true, force: true });
    await b.start();
    const after = (await b.engine.info()).diskId;
    expect(after).not.toBe(before);
    await env.cluster.addHost(b.engine);
    expect(replaced).toEqual([{ hostId: 'b', oldDiskId: before, newDiskId: after, lostReplicas: [expect.stringContaining('dv')] }]);

    // The replacement wait is an hour: only the disk's new identity makes this immediate.
    for (let pass = 0; pass < 4 && (await hostsOf('dv')).includes('b'); pass++) await env.cluster.repairOnce();
    expect(await hostsOf('dv'), diag()).toEqual(['a', 'c', 'd']);
    await qemuIo(uri('dv'), ['read -P 0x61 0 4M']);
    // The rebuilt replica holds the same bytes as the two that stayed.
    await env.cluster.volume('dv').detach();
    const names = (await env.cluster.volume('dv').status()).replicas.map((r) => ({ host: env.hosts['abcd'.indexOf(r.hostId)]!, name: r.name }));
    expect(names.every((n) => existsSync(replicaPath(n.host, n.name))), 'every replica directory found under its recorded name').toBe(true);
    const contents = await readReplicas(names, SIZE);
    expect(new Set(contents.map((c) => c.digest)).size, contents.map((c) => c.id).join(', ')).toBe(1);
  });
});
