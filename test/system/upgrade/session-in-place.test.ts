// A whole upgrade session with the in-place method, chosen by `auto`: three real hosts whose
// `mooring data-engine` runs with --allow-successor-exec, no launcher given to Mooring, a
// 3-replica volume attached on host a with an NBD client writing at queue depth 8 through
// the entire session, and a 1-replica volume attached on host b with fio (nbd engine,
// crc32c verify) running back to back through it; qemu-io patterns written before are read
// back after. Every host's process is replaced by a successor; the client never sees
// an error and never reconnects (its socket stays open; the export's connection count stays
// 1); the engine on a serves at a newer epoch, in another process; every acknowledged write
// reads back, every replica is RW at the end, and none was ever dropped or rebuilt: the
// engine's connections to the replica servers of b and c drain and reconnect on GOAWAY.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../../src/bench/nbd-client.js';
import { Mooring } from '../../../src/mooring.js';
import { packageVersion } from '../../../src/native/load.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { makeHosts, stopCluster, waitFor, type HostProcess } from '../helpers/hosts.js';
import { TempDir, parseFioJson, qemuIo, repoRoot, run, type RunResult } from '../helpers/tools.js';
import { startWriteLanes } from '../helpers/write-lanes.js';

const MiB = 1 << 20;
const SIZE = 32 * MiB;
// The JS client writes the first half of vm; qemu-io's patterns live in the second.
const CLIENT_BYTES = 16 * MiB;
const BLOCK = 4096;

describe('upgrade session in place: NBD client connected throughout', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  let store: FileStateStore;

  beforeAll(async () => {
    hosts = makeHosts(tmp.path, 3, 17910 + 40);
    for (const h of hosts) {
      h.opts.extraArgs = ['--allow-successor-exec', repoRoot];
      await h.start();
    }
    store = await FileStateStore.open(join(tmp.path, 'state'));
    cluster = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 500 });
  });

  afterAll(() => stopCluster({ cluster, store, hosts, tmp }));

  it('replaces all three processes while the client writes; no error, no reconnect, data intact', async () => {
    const sock = tmp.join('vm.sock');
    await cluster.createVolume({ name: 'vm', sizeBytes: SIZE, replicas: 3 });
    const before = await cluster.volume('vm').attach({ host: 'a', nbd: `unix:${sock}` });
    const vmUri = `nbd+unix:///?socket=${sock}`;
    await qemuIo(vmUri, ['write -P 0x5c 20M 2M', 'write -P 0xc5 30M 1M']);
    // solo: one replica, on b, attached on b; fio verifies its own writes run after run.
    const soloSock = tmp.join('solo.sock');
    await cluster.createVolume({ name: 'solo', sizeBytes: SIZE, replicas: 1, hosts: ['b'] });
    const soloBefore = await cluster.volume('solo').attach({ host: 'b', nbd: `unix:${soloSock}` });
    const fioRuns: RunResult[] = [];
    let fioStop = false;
    const fioLoop = (async () => {
      for (let i = 0; !fioStop; i++) {
        const args = ['--name=solo', '--ioengine=nbd', `--uri=nbd+unix:///?socket=${soloSock}`, '--rw=randwrite', '--bs=4k', '--iodepth=16', '--size=8m',
          '--verify=crc32c', '--verify_fatal=1', `--randseed=${i + 1}`, '--time_based', '--runtime=2', '--output-format=json', '--verify_state_save=0'];
        fioRuns.push(await run('fio', args, { timeoutMs: 120_000, cwd: tmp.path, allowFailure: true }));
      }
    })();
    const client = await NbdClient.connect({ socketPath: sock });
    // Connections the export accepted so far (qemu-io's and the client's): none is added by
    // the session. qemu-io's has ended first (a finished connection may still be counted
    // as open for a moment).
    const vmStats = async () => (await cluster.volume('vm').engine())!.nbdStats!;
    expect(await waitFor(async () => (await vmStats()).connectionsOpen === 1, 10_000)).toBe(true);
    const connections = (await vmStats()).connectionsTotal;
    let closed = false;
    client.socket.once('close', () => (closed = true));
    const writes = startWriteLanes(client, CLIENT_BYTES / BLOCK, 8);

    // Replicas that drop out of an engine (and get rebuilt) would show here.
    const dropped: string[] = [];
    cluster.on('data-engine-event', (host, e) => {
      if (e.type === 'replica-error' || e.type === 'rebuild-started') dropped.push(`${host}: ${e.type} ${e.volume}/${e.replicaId}`);
    });
    const session = await cluster.startUpgrade({ dataEngine: { version: packageVersion(), command: [process.execPath, join(repoRoot, 'dist/cli.js')] }, stepTimeoutMs: 120_000 });
    const log: string[] = [];
    const pauses: number[] = [];
    session.on('method-chosen', (e) => log.push(`${e.host} ${e.method}`));
    session.on('host-state-changed', (e) => log.push(`${e.host} ${e.state}`));
    session.on('handed-off', (e) => pauses.push(e.pauseMs));
    const done = await session.done().catch((err: unknown) => {
      throw new Error(`${String(err)}\n${log.join(', ')}${hosts.map((h) => h.diagnostics()).join('')}`);
    });
    await writes.stop();
    fioStop = true;
    await fioLoop;

    expect(done.state).toBe('completed');
    // fio ran through the whole session (at least one run began before it and one after), never failing.
    expect(fioRuns.length).toBeGreaterThanOrEqual(2);
    for (const r of fioRuns) {
      expect(r.code, `fio failed\n${r.stdout}\n${r.stderr}`).toBe(0);
      expect(parseFioJson(r.stdout).jobs[0]!.error).toBe(0);
    }
    const solo = await cluster.volume('solo').status();
    expect(solo).toMatchObject({ state: 'healthy', attachedHost: 'b' });
    expect(solo.epoch).toBeGreaterThan(soloBefore.epoch);
    expect(log.filter((l) => /in-place|restart/.test(l))).toEqual(['a in-place', 'b in-place', 'c in-place']);
    expect(pauses).toHaveLength(3);
    expect(writes.failures).toEqual([]);
    expect(closed).toBe(false);
    // Replica clients were told to go away and came back: no replica dropped, none rebuilt.
    expect(dropped).toEqual([]);
    const engine = await cluster.volume('vm').engine();
    expect(engine).toMatchObject({ hostId: 'a', role: 'active' });
    expect(engine!.nbdStats!.connectionsTotal).toBe(connections);
    const st = await cluster.volume('vm').status();
    expect(st.epoch).toBeGreaterThan(before.epoch);
    expect(st.state, JSON.stringify(st.replicas)).toBe('healthy');
    await writes.verify();
    await client.disconnect();
    // qemu-io's patterns, written before the session, read back after it.
    expect(await qemuIo(vmUri, ['read -P 0x5c 20M 2M', 'read -P 0xc5 30M 1M', 'read -P 0 24M 1M'])).not.toMatch(/Pattern verification failed|error/i);
    console.log(`in-place session: exports frozen ${pauses.map((p) => p.toFixed(1)).join(', ')} ms on a, b, c; ${writes.model.size} blocks checked; ${fioRuns.length} fio verify runs on the 1-replica volume`);
  });
});
