// The VM manager driving an in-place session is SIGKILLed while it hands host a over (just
// after a enters switching-over, so mostly with its HandOffProcess call in flight), while b's
// successor is awaited, and while c is handed over; each time a new one takes the session
// over once the lease has run out (15 s). Meanwhile every driver's own reconcile loop runs
// (every 300 ms) against hosts whose engines are between two processes. A client in this
// process writes at queue depth 8 through the whole run: it never sees an error, its
// connection never drops, and every acknowledged write reads back. Each host is handed over
// exactly once; the engine serves on a, in the last successor, at a newer epoch.
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../../src/bench/nbd-client.js';
import { Mooring } from '../../../src/mooring.js';
import { packageVersion } from '../../../src/native/load.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { makeHosts, type HostProcess } from '../helpers/hosts.js';
import { killAllServers } from '../helpers/serve.js';
import { TempDir, repoRoot } from '../helpers/tools.js';
import { startWriteLanes } from '../helpers/write-lanes.js';
import { runDriver } from './driver-runner.js';

const MiB = 1 << 20;
const BLOCK = 4096;
const CLIENT_BLOCKS = (16 * MiB) / BLOCK;
// Steps counted over all drivers, 0-based, 6 per host: a switching-over, b
// upgrading-instance-manager, c switching-over.
const KILL_AT = [1, 8, 13];

describe('in-place upgrade session: the driving VM manager is SIGKILLed mid-hand-off', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  const drivers: ChildProcess[] = [];
  const sock = (): string => tmp.join('vm.sock');

  beforeAll(async () => {
    hosts = makeHosts(tmp.path, 3, 18010, { insecure: true }); // the driver process knows no secret
    for (const h of hosts) {
      h.opts.extraArgs = ['--allow-successor-exec', repoRoot];
      await h.start();
    }
    const store = await FileStateStore.open(join(tmp.path, 'state'));
    const m = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 0 });
    await m.createVolume({ name: 'vm', sizeBytes: 32 * MiB, replicas: 3 });
    await m.volume('vm').attach({ host: 'a', nbd: `unix:${sock()}` });
    await m.close();
    await store.close();
  });

  afterAll(async () => {
    for (const d of drivers) d.kill('SIGKILL');
    for (const h of hosts) await h.stop().catch(() => undefined);
    await killAllServers();
    tmp.cleanup();
  });

  function driver(steps: { n: number }, log: string[]): Promise<'killed' | string> {
    const args = ['--in-place', join(tmp.path, 'state'), packageVersion(), ...hosts.map((h) => `${h.hostId}=unix:${h.grpcSocket}`)];
    return runDriver({ args, killAt: KILL_AT, steps, log, drivers, diagnostics: () => hosts.map((h) => h.diagnostics()).join('') });
  }

  it('is taken over after each kill and completes; the client never notices; every host handed over once', async () => {
    const client = await NbdClient.connect({ socketPath: sock() });
    let closed = false;
    client.socket.once('close', () => (closed = true));
    const writes = startWriteLanes(client, CLIENT_BLOCKS, 8);

    const steps = { n: 0 };
    const log: string[] = [];
    let outcome: string;
    let kills = 0;
    try {
      for (;;) {
        outcome = await driver(steps, log);
        if (outcome !== 'killed') break;
        kills++;
        expect(kills, log.join('\n')).toBeLessThanOrEqual(KILL_AT.length);
      }
    } finally {
      await writes.stop();
    }
    const why = `${log.join('\n')}${hosts.map((h) => h.diagnostics()).join('')}`;
    expect(outcome, why).toBe('completed');
    expect(kills).toBe(KILL_AT.length);
    expect(new Set(log.filter((l) => l.startsWith('SESSION ')))).toHaveProperty('size', 1);
    expect(writes.failures, why).toEqual([]);
    expect(closed, why).toBe(false);
    // Handed over exactly once each: one successor took over on every host.
    for (const h of hosts) expect(h.diagnostics().match(/took over \d+ engine\(s\) from the previous process/g) ?? [], `${h.hostId}${why}`).toHaveLength(1);

    const store = await FileStateStore.open(join(tmp.path, 'state'));
    const m = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 0 });
    try {
      const st = await (await m.upgradeSession())!.status();
      expect(Object.values(st.hosts).map((h) => [h.method, h.state])).toEqual([['in-place', 'completed'], ['in-place', 'completed'], ['in-place', 'completed']]);
      const vol = await m.volume('vm').status();
      expect(vol).toMatchObject({ state: 'healthy', attachedHost: 'a' });
      expect(vol.replicas.map((r) => r.mode)).toEqual(['RW', 'RW', 'RW']);
      expect((await m.volume('vm').engine())!.nbdStats!.connectionsOpen).toBe(1);
    } finally {
      await m.close();
      await store.close();
    }
    await writes.verify();
    await client.disconnect();
    console.log(`in-place session with ${kills} drivers killed: ${writes.model.size} blocks written and read back, ${writes.started()} writes started, no error, no reconnect`);
  }, 300_000);
});
