// The VM manager that drives an upgrade session is killed (SIGKILL) again and again, at
// different steps of different hosts, and each time a new one, a fresh process over the
// same state store, takes the session over once the dead one's lease has run out (15 s)
// and goes on from the recorded step. Three real `mooring data-engine` hosts; the test
// owns their processes and replaces one when a driver's launcher asks (over IPC), so a
// replacement in flight when its driver dies still finishes. At the end: the session
// completed, each host was replaced exactly once, the volume's data is intact and its
// engine runs on a again at a newer epoch with every replica RW.
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { packageVersion } from '../../../src/native/load.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { makeHosts, type HostProcess } from '../helpers/hosts.js';
import { killAllServers } from '../helpers/serve.js';
import { TempDir, qemuIo } from '../helpers/tools.js';
import { runDriver } from './driver-runner.js';

const MiB = 1 << 20;
// The driver is killed when it reports these steps (counted over all drivers, 0-based);
// with 6 steps per host they fall on: a initializing, a switching-back, b switching-over,
// b rebuilding-replica, c upgrading-instance-manager.
const KILL_AT = [0, 3, 7, 10, 14];

describe('upgrade session: the driving VM manager is SIGKILLed at one step after another', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  const replaced: string[] = [];
  const drivers: ChildProcess[] = [];
  const version = packageVersion();
  const sock = (): string => tmp.join('vm.sock');

  beforeAll(async () => {
    hosts = makeHosts(tmp.path, 3, 17850, { insecure: true }); // the driver process knows no secret
    for (const h of hosts) await h.start();
    const store = await FileStateStore.open(join(tmp.path, 'state'));
    const m = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 0 });
    await m.createVolume({ name: 'vm', sizeBytes: 32 * MiB, replicas: 3 });
    await m.volume('vm').attach({ host: 'a', nbd: `unix:${sock()}` });
    // Closing this Mooring leaves the engine running on a (its data engine is another process).
    await m.close();
    await store.close();
    await qemuIo(`nbd+unix:///?socket=${sock()}`, ['write -P 0x3c 0 4M', 'write -P 0xc3 30M 2M']);
  });

  afterAll(async () => {
    for (const d of drivers) d.kill('SIGKILL');
    for (const h of hosts) await h.stop().catch(() => undefined);
    await killAllServers();
    tmp.cleanup();
  });

  // Runs one driver; the host it asks to replace (over IPC) is replaced even if it dies meanwhile.
  function driver(steps: { n: number }, log: string[]): Promise<'killed' | string> {
    const args = [join(tmp.path, 'state'), version, ...hosts.map((h) => `${h.hostId}=unix:${h.grpcSocket}`)];
    return runDriver({
      args, killAt: KILL_AT, steps, log, drivers,
      onMessage: (child, msg) => {
        const m = msg as { id: number; replace: string };
        replaced.push(m.replace);
        const h = hosts.find((x) => x.hostId === m.replace)!;
        void h
          .stop()
          .then(() => h.start())
          .then(
            () => child.connected && child.send({ id: m.id }),
            (err: unknown) => child.connected && child.send({ id: m.id, error: String(err) }),
          );
      },
    });
  }

  it('is taken over after each kill and completes; every host replaced once, data intact', async () => {
    const steps = { n: 0 };
    const log: string[] = [];
    let outcome: string;
    let kills = 0;
    for (;;) {
      outcome = await driver(steps, log);
      if (outcome !== 'killed') break;
      kills++;
      expect(kills, log.join('\n')).toBeLessThanOrEqual(KILL_AT.length);
    }
    expect(outcome, log.join('\n')).toBe('completed');
    expect(kills).toBe(KILL_AT.length);
    // One session throughout.
    expect(new Set(log.filter((l) => l.startsWith('SESSION ')))).toHaveProperty('size', 1);
    expect(replaced).toEqual(['a', 'b', 'c']);

    const store = await FileStateStore.open(join(tmp.path, 'state'));
    const m = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 0 });
    try {
      const st = await (await m.upgradeSession())!.status();
      expect(Object.values(st.hosts).map((h) => h.state)).toEqual(['completed', 'completed', 'completed']);
      const vol = await m.volume('vm').status();
      expect(vol).toMatchObject({ state: 'healthy', attachedHost: 'a' });
      expect(vol.epoch).toBeGreaterThan(1);
      expect(vol.replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
      // One snapshot, whichever driver took it.
      expect((await m.volume('vm').listSnapshots()).filter((s) => s.name.startsWith('upgrade-'))).toHaveLength(1);
    } finally {
      await m.close();
      await store.close();
    }
    const read = await qemuIo(`nbd+unix:///?socket=${sock()}`, ['read -P 0x3c 0 4M', 'read -P 0xc3 30M 2M', 'read -P 0 8M 1M']);
    expect(read).not.toMatch(/Pattern verification failed|error/i);
  });
});
