// Repair driven by events (issue 21) with real data-engine processes: four hosts, a
// 3-replica volume on a, b, c with its engine on a, and a full pass of the repair loop only
// once an hour (the one at open aside). Host b is killed; the engine on a drops its replica
// (replica-error over the gRPC watch), and that event alone gets the replica replaced on d:
// without the event path nothing would happen for an hour. The data written before and
// after the failure reads back from the volume, now on a, c and d.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { Mooring, ReplicaReplacedEvent } from '../../../src/mooring.js';
import type { FileStateStore } from '../../../src/state/file-state-store.js';
import { makeHosts, openCluster, stopCluster, waitFor, type HostProcess } from '../helpers/hosts.js';
import { qemuIo, TempDir } from '../helpers/tools.js';

const MiB = 1 << 20;
const VOLUME = 'ev1';
const HOUR_MS = 3_600_000;
// Ports 27400..27403 (this test's range), one replica server per host.
const BASE_PORT = 27400;
// Bound of the waits on conditions below (not a speed check: a loaded machine is slow).
const WAIT_MS = 90_000;

describe('event-driven repair across data-engine processes', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  let cluster: Mooring | undefined;
  let store: FileStateStore | undefined;
  const nbd = `unix:${tmp.join('ev1.sock')}`;
  const uri = (): string => `nbd+unix:///?socket=${nbd.slice('unix:'.length)}`;
  const diag = (): string => hosts.map((h) => h.diagnostics()).join('');

  beforeAll(async () => {
    hosts = makeHosts(tmp.path, 4, BASE_PORT);
    for (const h of hosts) await h.start();
    ({ cluster, store } = await openCluster(tmp.path, hosts, { repairIntervalMs: HOUR_MS, replicaReplacementWaitMs: 0, engineIoTimeoutMs: 1000 }));
  });

  afterAll(async () => {
    await stopCluster({ cluster, store, hosts, tmp });
  });

  it('replaces the replica of a killed host through the event path, the periodic pass an hour away', async () => {
    const m = cluster!;
    expect(await waitFor(async () => m.repairLoop.passes === 1, WAIT_MS)).toBe(true);
    expect(m.repairLoop.nextPassDelayMs).toBeGreaterThanOrEqual(HOUR_MS);
    await m.createVolume({ name: VOLUME, sizeBytes: 16 * MiB, replicas: 3, hosts: ['a', 'b', 'c'] });
    const st = await m.volume(VOLUME).attach({ host: 'a', nbd });
    expect(st.state, JSON.stringify(st)).toBe('healthy');
    await qemuIo(uri(), ['write -P 0x3c 0 2M']);

    const replaced: ReplicaReplacedEvent[] = [];
    m.on('replica-replaced', (e) => replaced.push(e));
    await hosts[1]!.crash();
    // Writes after the crash reach the engine's lost replica and fail there: it goes ERR.
    await qemuIo(uri(), ['write -P 0x7e 4M 1M']);
    expect(await waitFor(async () => replaced.length > 0, WAIT_MS), `no replacement${diag()}`).toBe(true);
    expect(replaced).toHaveLength(1);
    expect(replaced[0]).toMatchObject({ volume: VOLUME, oldHostId: 'b', newHostId: 'd' });
    expect(m.repairLoop.passes, 'the periodic pass ran again').toBe(1);
    expect(m.repairLoop.eventRepairs).toBeGreaterThan(0);

    expect(await waitFor(async () => (await m.volume(VOLUME).status()).state === 'healthy', WAIT_MS), diag()).toBe(true);
    const after = await m.volume(VOLUME).status();
    expect(after.replicas.map((r) => r.hostId).sort()).toEqual(['a', 'c', 'd']);
    const out = await qemuIo(uri(), ['read -P 0x3c 0 2M', 'read -P 0x7e 4M 1M', 'read -P 0 8M 1M']);
    expect(out).not.toMatch(/Pattern verification failed/i);
  });
});
