// An upgrade session over three real `mooring data-engine` hosts, with the `restart`
// method: the launcher stops each host's process (SIGTERM: engines drain and flush) and
// starts it again on the same directory and addresses, host after host. A 3-replica volume
// attached on host a keeps every byte written before; its engine comes back on a at a new
// epoch; its replicas on b and c are caught up after their hosts' restarts; a detached
// 1-replica volume keeps its data. Seed 004's "fail 2" row is refused up front, before any
// host is touched. (The in-place hand-off, with QEMU staying connected, is a later step.)
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MooringError } from '../../../src/errors.js';
import { Mooring } from '../../../src/mooring.js';
import { packageVersion } from '../../../src/native/load.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import type { DataEngineLauncher, UpgradeSession } from '../../../src/upgrade/upgrade-session.js';
import { makeHosts, stopCluster, type HostProcess } from '../helpers/hosts.js';
import { TempDir, qemuIo } from '../helpers/tools.js';

const MiB = 1 << 20;
const SIZE = 32 * MiB;

describe('upgrade session over three data-engine hosts (method restart)', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  let store: FileStateStore;
  const replaced: string[] = [];
  const version = packageVersion();

  // How this test runs its hosts: stop the process, start it again (same dir and addresses).
  const launcher: DataEngineLauncher = {
    async replace(hostId, dataEngine) {
      expect(dataEngine.version).toBe(version);
      replaced.push(hostId);
      const h = hosts.find((x) => x.hostId === hostId)!;
      await h.stop();
      await h.start();
      return h.engine;
    },
  };

  beforeAll(async () => {
    hosts = makeHosts(tmp.path, 3, 17830);
    for (const h of hosts) await h.start();
    store = await FileStateStore.open(join(tmp.path, 'state'));
    cluster = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 500, dataEngineLauncher: launcher });
  });

  afterAll(() => stopCluster({ cluster, store, hosts, tmp }));

  const sock = (name: string): string => tmp.join(`${name}.sock`);
  const uri = (name: string): string => `nbd+unix:///?socket=${sock(name)}`;
  const diag = (): string => hosts.map((h) => h.diagnostics()).join('');

  it('refuses the seed\'s "fail 2" layout up front, naming the host and volume, and touches nothing', async () => {
    // lonely: attached on a, its only replica on c.
    await cluster.createVolume({ name: 'lonely', sizeBytes: SIZE, replicas: 1, hosts: ['c'] });
    await cluster.volume('lonely').attach({ host: 'a', nbd: `unix:${sock('lonely')}` });
    const err = (await cluster.startUpgrade({ dataEngine: { version, command: ['mooring'] }, method: 'restart' }).catch((e: unknown) => e)) as MooringError;
    expect(err.code, String(err)).toBe('PRECONDITION_FAILED');
    expect(err.details!['reasons']).toEqual([expect.objectContaining({ code: 'QUORUM_NEEDS_HOST', host: 'c', volume: 'lonely' })]);
    // `auto` also refuses to restart a under the NBD client of lonely.
    const auto = (await cluster.startUpgrade({ dataEngine: { version, command: ['mooring'] } }).catch((e: unknown) => e)) as MooringError;
    expect((auto.details!['reasons'] as { code: string }[]).map((r) => r.code).sort()).toEqual(['CLIENTS_WOULD_RECONNECT', 'QUORUM_NEEDS_HOST']);
    expect(replaced).toEqual([]);
    expect(await cluster.upgradeSession()).toBeNull();
    await cluster.volume('lonely').detach();
  });

  it('restarts every host in turn; data, replicas and the attached engine come back, at a new epoch', async () => {
    await cluster.createVolume({ name: 'vm', sizeBytes: SIZE, replicas: 3 });
    await cluster.volume('vm').attach({ host: 'a', nbd: `unix:${sock('vm')}` });
    await qemuIo(uri('vm'), ['write -P 0x5a 0 4M', 'write -P 0xa5 20M 2M']);
    await cluster.createVolume({ name: 'solo', sizeBytes: SIZE, replicas: 1, hosts: ['b'] });
    await cluster.volume('solo').attach({ host: 'b', nbd: `unix:${sock('solo')}` });
    await qemuIo(uri('solo'), ['write -P 0x77 1M 1M']);
    await cluster.volume('solo').detach();
    const before = await cluster.volume('vm').status();
    const instances = await Promise.all(hosts.map(async (h) => (await h.engine.info()).instanceId));

    const session: UpgradeSession = await cluster.startUpgrade({ dataEngine: { version, command: ['mooring'] }, method: 'restart', stepTimeoutMs: 120_000 });
    const log: string[] = [];
    session.on('host-state-changed', (e) => log.push(`${e.host} ${e.state}`));
    session.on('failed', (e) => log.push(`failed ${e.host}: ${e.error.message}`));
    const done = await session.done().catch((err: unknown) => {
      throw new Error(`${String(err)}\nevents: ${log.join(', ')}${diag()}`);
    });

    expect(done.state).toBe('completed');
    expect(replaced).toEqual(['a', 'b', 'c']);
    for (const [i, h] of hosts.entries()) {
      const info = await h.engine.info();
      expect(info.instanceId).not.toBe(instances[i]);
      expect(done.hosts[h.hostId]).toMatchObject({ state: 'completed', method: 'restart', versionBefore: version, versionAfter: version, instanceBefore: instances[i] });
    }
    expect(log.slice(0, 6)).toEqual(['a initializing', 'a switching-over', 'a upgrading-instance-manager', 'a switching-back', 'a rebuilding-replica', 'a completed']);
    // Every volume on a host was snapshotted once, before the host was touched.
    const snap = `upgrade-${session.id.slice(0, 8)}`;
    expect((await cluster.volume('vm').listSnapshots()).map((s) => s.name)).toContain(snap);
    expect(done.hosts['b']!.volumes).toMatchObject({ vm: { role: 'replica', state: 'healthy' }, solo: { role: 'replica', snapshot: snap, state: 'healthy' } });

    const after = await cluster.volume('vm').status();
    expect(after, diag()).toMatchObject({ state: 'healthy', attachedHost: 'a' });
    expect(after.epoch).toBeGreaterThan(before.epoch);
    expect(after.replicas.every((r) => r.mode === 'RW'), JSON.stringify(after.replicas)).toBe(true);
    const read = await qemuIo(uri('vm'), ['read -P 0x5a 0 4M', 'read -P 0xa5 20M 2M', 'read -P 0 8M 1M']);
    expect(read).not.toMatch(/Pattern verification failed|error/i);
    await cluster.volume('solo').attach({ host: 'b', nbd: `unix:${sock('solo')}` });
    expect(await qemuIo(uri('solo'), ['read -P 0x77 1M 1M', 'read -P 0 0 1M'])).not.toMatch(/Pattern verification failed|error/i);
    await cluster.volume('solo').detach();
    // Upgraded hosts are schedulable again: a new 3-replica volume can be placed.
    await cluster.createVolume({ name: 'after', sizeBytes: SIZE, replicas: 3 });
  });
});
