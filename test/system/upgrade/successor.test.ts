// The default launcher of an upgrade: no launcher is given to Mooring; each host's
// `mooring data-engine` runs with --allow-successor-exec and is asked over gRPC to stop and
// start the new version's command in its place, with its own arguments, detached. Three
// real hosts; a 3-replica volume attached on a keeps its data and comes back at a new
// epoch. A successor outside the allowed prefix is refused while the old process keeps
// serving, and the session ends in error saying why.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MooringError } from '../../../src/errors.js';
import { Mooring } from '../../../src/mooring.js';
import { packageVersion } from '../../../src/native/load.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { alive, directoryOwner, makeHosts, stopCluster, waitFor, type HostProcess } from '../helpers/hosts.js';
import { TempDir, qemuIo, repoRoot } from '../helpers/tools.js';

const MiB = 1 << 20;

describe('upgrade with the data engines starting their own successors', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  let store: FileStateStore;
  const version = packageVersion();
  const uri = (): string => `nbd+unix:///?socket=${tmp.join('vm.sock')}`;

  beforeAll(async () => {
    hosts = makeHosts(tmp.path, 3, 17870);
    for (const h of hosts) {
      h.opts.extraArgs = ['--allow-successor-exec', repoRoot];
      await h.start();
    }
    store = await FileStateStore.open(join(tmp.path, 'state'));
    cluster = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 500 });
    await cluster.createVolume({ name: 'vm', sizeBytes: 32 * MiB, replicas: 3 });
    await cluster.volume('vm').attach({ host: 'a', nbd: `unix:${tmp.join('vm.sock')}` });
    await qemuIo(uri(), ['write -P 0x6b 0 4M', 'write -P 0xb6 24M 1M']);
  });

  afterAll(() => stopCluster({ cluster, store, hosts, tmp }));

  it('every host reports that it can start its successor', async () => {
    for (const h of hosts) expect((await h.engine.info()).features).toEqual(['successor-exec', 'in-place-handoff', 'salvage', 'backing-file-read']);
  });

  it('refuses a successor outside --allow-successor-exec: the old process keeps serving, the session says why', async () => {
    const before = await hosts[0]!.engine.info();
    const session = await cluster.startUpgrade({ dataEngine: { version, command: ['/bin/true'] }, method: 'restart', hosts: ['a'] });
    const err = (await session.done().catch((e: unknown) => e)) as MooringError;
    expect(err.code, String(err)).toBe('INVALID_ARGUMENT');
    expect(err.message).toMatch(/not under/);
    expect((await hosts[0]!.engine.info()).instanceId).toBe(before.instanceId);
    expect(await cluster.volume('vm').status()).toMatchObject({ state: 'healthy', attachedHost: 'a' });
  });

  it('replaces every host by its successor; the volume keeps its data, at a new epoch', async () => {
    const epoch = (await cluster.volume('vm').status()).epoch;
    const pids = hosts.map((h) => directoryOwner(h.opts.dir)!);
    const command = [process.execPath, join(repoRoot, 'dist/cli.js')];
    const session = await cluster.startUpgrade({ dataEngine: { version, command }, method: 'restart', stepTimeoutMs: 120_000 });
    const log: string[] = [];
    session.on('host-state-changed', (e) => log.push(`${e.host} ${e.state}`));
    const done = await session.done().catch((err: unknown) => {
      throw new Error(`${String(err)}\n${log.join(', ')}${hosts.map((h) => h.diagnostics()).join('')}`);
    });
    expect(done.state).toBe('completed');
    for (const [i, h] of hosts.entries()) {
      const pid = directoryOwner(h.opts.dir)!;
      expect(pid).not.toBe(pids[i]);
      expect(alive(pid)).toBe(true);
      // The old process exited by itself once its successor was started.
      expect(await waitFor(async () => !alive(pids[i]!), 10_000)).toBe(true);
      expect(done.hosts[h.hostId]!.instanceBefore).not.toBe((await h.engine.info()).instanceId);
    }
    const st = await cluster.volume('vm').status();
    expect(st).toMatchObject({ state: 'healthy', attachedHost: 'a' });
    expect(st.epoch).toBeGreaterThan(epoch);
    expect(await qemuIo(uri(), ['read -P 0x6b 0 4M', 'read -P 0xb6 24M 1M'])).not.toMatch(/Pattern verification failed|error/i);
  });
});
