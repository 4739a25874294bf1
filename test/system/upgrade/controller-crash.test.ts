// The VM manager that drives an upgrade session is killed (SIGKILL) again and again, at
// different steps of different hosts, and each time a new one, a fresh process over the
// same state store, takes the session over once the dead one's lease has run out (15 s)
// and goes on from the recorded step. Three real `mooring data-engine` hosts; the test
// owns their processes and replaces one when a driver's launcher asks (over IPC), so a
// replacement in flight when its driver dies still finishes. At the end: the session
// completed, each host was replaced exactly once, the volume's data is intact and its
// engine runs on a again at a newer epoch with every replica RW.
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { packageVersion } from '../../../src/native/load.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { makeHosts, type HostProcess } from '../helpers/hosts.js';
import { killAllServers } from '../helpers/serve.js';
import { TempDir, qemuIo, repoRoot } from '../helpers/tools.js';

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
    hosts = makeHosts(tmp.path, 3, 17850);
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

  // Runs one driver; resolves with how it ended: killed at a step, or done.
  function runDriver(stepsSoFar: { n: number }, log: string[]): Promise<'killed' | string> {
    const args = [join(repoRoot, 'test/system/upgrade/upgrade-driver.mjs'), join(tmp.path, 'state'), version, ...hosts.map((h) => `${h.hostId}=unix:${h.grpcSocket}`)];
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
    drivers.push(child);
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('message', (m: { id: number; replace: string }) => {
      // The host is replaced even if the driver that asked dies meanwhile.
      replaced.push(m.replace);
      const h = hosts.find((x) => x.hostId === m.replace)!;
      void h
        .stop()
        .then(() => h.start())
        .then(
          () => child.connected && child.send({ id: m.id }),
          (err: unknown) => child.connected && child.send({ id: m.id, error: String(err) }),
        );
    });
    return new Promise((resolve, reject) => {
      let ended = false;
      createInterface({ input: child.stdout! }).on('line', (line) => {
        log.push(line);
        if (line.startsWith('STEP ')) {
          if (KILL_AT.includes(stepsSoFar.n++) && !ended) {
            ended = true;
            child.kill('SIGKILL');
            resolve('killed');
          }
        } else if (line.startsWith('DONE ')) {
          ended = true;
          resolve(line.slice('DONE '.length));
        }
      });
      child.on('exit', (code, signal) => {
        if (!ended) reject(new Error(`driver exited (${code ?? signal}) before the session ended\n${log.join('\n')}\n${stderr}`));
      });
    });
  }

  it('is taken over after each kill and completes; every host replaced once, data intact', async () => {
    const steps = { n: 0 };
    const log: string[] = [];
    let outcome: string;
    let kills = 0;
    for (;;) {
      outcome = await runDriver(steps, log);
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
