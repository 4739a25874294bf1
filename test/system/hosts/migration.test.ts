// Live migration with three `mooring data-engine` processes as three hosts and qemu-io as
// the client (docs/migration.md):
// - migrate a → b, hand over, confirm: b reads every pattern a wrote and writes more; a write
//   sent to a after the hand-over fails and changes nothing; a's engine is gone; the
//   replicas on all hosts are identical to what b serves;
// - rollback before hand-over (b's standby goes) and after it (b wrote: a claims a newer
//   epoch and serves b's writes);
// - a degraded volume (host c down) migrates; c's replica is rebuilt by b's engine later;
// - crashes: b killed mid-migration, before or after the hand-over → rolled back by the
//   cluster (after it, a keeps what b wrote); a killed after hand-over →
//   the volume stays on b; the embedding process restarts mid-migration → a new Mooring over
//   the same state store finds the migration and finishes it.
import { describe, expect, it } from 'vitest';

import { useHostCluster } from '../helpers/host-cluster.js';
import { readReplicas, waitFor, type HostProcess } from '../helpers/hosts.js';
import { chunkedDigest } from '../helpers/replicas.js';
import { qemuIo, run } from '../helpers/tools.js';
import { readWholeVolume } from '../helpers/volume.js';

const MiB = 1 << 20;
const SIZE = 32 * MiB;
const VOLUME = 'vm-mig';

// Patterns written through a's export before the migration: [offset MiB, length MiB, byte].
const BEFORE: Array<[number, number, number]> = [
  [0, 1, 0x11],
  [5, 2, 0x22],
  [31, 1, 0x33],
];

describe('three data-engine hosts, live migration', () => {
  const env = useHostCluster({ hosts: 3, basePort: 17430, cluster: { repairIntervalMs: 0 } });

  const sock = (host: string): string => env.tmp.join(`${VOLUME}-${host}.sock`);
  const uriOf = (host: string): string => `nbd+unix:///?socket=${sock(host)}`;
  const diag = (): string => env.hosts.map((h) => h.diagnostics()).join('');
  const write = (host: string, p: [number, number, number]): Promise<string> => qemuIo(uriOf(host), [`write -P ${p[2]} ${p[0]}M ${p[1]}M`]);
  const readsBack = (host: string, p: [number, number, number]): Promise<string> => qemuIo(uriOf(host), [`read -P ${p[2]} ${p[0]}M ${p[1]}M`]);
  const ioFails = async (host: string, cmd: string): Promise<string> => {
    const r = await run('qemu-io', ['-f', 'raw', uriOf(host), '-c', cmd], { allowFailure: true, timeoutMs: 30_000 });
    return r.stdout + r.stderr;
  };
  const replicasNow = async (): Promise<Array<{ host: HostProcess; name: string }>> =>
    (await env.cluster.volume(VOLUME).status()).replicas.map((r) => ({ host: env.hosts.find((h) => h.hostId === r.hostId)!, name: r.name }));

  async function attachOnA(): Promise<void> {
    await env.cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3, accessMode: 'migratable' });
    const st = await env.cluster.volume(VOLUME).attach({ host: 'a', attacher: 'workload', nbd: `unix:${sock('a')}` });
    expect(st.state).toBe('healthy');
    for (const p of BEFORE) await write('a', p);
  }

  // Detaches and checks every replica equals what `host` served.
  async function expectReplicasEqual(host: string): Promise<void> {
    const served = await readWholeVolume(uriOf(host));
    const list = await replicasNow();
    await env.cluster.volume(VOLUME).detach();
    const contents = await readReplicas(list, SIZE);
    expect(contents).toHaveLength(3);
    for (const c of contents) expect(c.digest, `replica ${c.id} differs from what ${host} served${diag()}`).toBe(chunkedDigest(served));
  }

  it('migrates a → b: hand-over moves the writer, a is fenced, confirm removes a, replicas identical', async () => {
    await attachOnA();
    const vol = env.cluster.volume(VOLUME);
    const steps: string[] = [];
    for (const e of ['migration-started', 'migration-target-ready', 'migration-handed-over', 'migration-confirmed'] as const) vol.on(e, () => steps.push(e));

    const m = await vol.migrate('b', { nbd: `unix:${sock('b')}`, attacher: 'workload' });
    // The standby serves nothing before the hand-over.
    expect(await ioFails('b', 'read 0 4k')).toMatch(/Operation not permitted/);
    await write('a', [8, 1, 0x44]); // a is still the writer
    const ho = await m.handOver();
    console.log(`hand-over: pause ${ho.pauseMs.toFixed(1)} ms (drain ${ho.drainMs.toFixed(1)} ms), epoch ${ho.epoch}`);
    expect(ho.rwReplicaIds).toHaveLength(3);

    for (const p of [...BEFORE, [8, 1, 0x44] as [number, number, number]]) await readsBack('b', p);
    await write('b', [12, 1, 0x55]);
    // A write sent to a after the hand-over is held (a rollback would serve it); the
    // confirm drops it unanswered, and it changes nothing.
    const held = ioFails('a', 'write -P 0xee 12M 1M');
    await m.confirm();
    const dropped = await held;
    expect(dropped, dropped).toMatch(/error|fail/i);
    expect(dropped, dropped).not.toMatch(/Operation not permitted|wrote/);
    await readsBack('b', [12, 1, 0x55]);
    expect(steps).toEqual(['migration-started', 'migration-target-ready', 'migration-handed-over', 'migration-confirmed']);
    expect((await env.hosts[0]!.engine.listEngines()).map((e) => e.volume)).not.toContain(VOLUME);
    const st = await vol.status();
    expect(st).toMatchObject({ attachedHost: 'b', writerHost: 'b', state: 'healthy', migration: null });
    await expectReplicasEqual('b');
  });

  it('rolls back before the hand-over: b stops, a keeps serving', async () => {
    await attachOnA();
    const vol = env.cluster.volume(VOLUME);
    const m = await vol.migrate('b', { nbd: `unix:${sock('b')}` });
    await m.rollback();
    expect((await env.hosts[1]!.engine.listEngines()).map((e) => e.volume)).not.toContain(VOLUME);
    for (const p of BEFORE) await readsBack('a', p);
    await write('a', [9, 1, 0x66]);
    expect((await vol.status()).migration).toBeNull();
    await expectReplicasEqual('a');
  });

  it('rolls back after b wrote: a claims a newer epoch and serves what b wrote', async () => {
    await attachOnA();
    const vol = env.cluster.volume(VOLUME);
    const m = await vol.migrate('b', { nbd: `unix:${sock('b')}` });
    const ho = await m.handOver();
    await write('b', [3, 1, 0x77]);
    await m.rollback();
    const st = await vol.status();
    expect(st.attachedHost).toBe('a');
    expect(st.epoch).toBeGreaterThan(ho.epoch);
    await readsBack('a', [3, 1, 0x77]);
    for (const p of BEFORE) await readsBack('a', p);
    await write('a', [4, 1, 0x78]);
    expect((await env.hosts[1]!.engine.listEngines()).map((e) => e.volume)).not.toContain(VOLUME);
    await expectReplicasEqual('a');
  });

  it('migrates a degraded volume (a replica host down); the target rebuilds that replica when it returns', async () => {
    await attachOnA();
    const vol = env.cluster.volume(VOLUME);
    await env.hosts[2]!.crash();
    await write('a', [14, 1, 0x5c]); // the engine finds c gone and goes on with a and b
    expect(await waitFor(async () => (await vol.status()).state === 'degraded', 30_000, 200), diag()).toBe(true);
    const m = await vol.migrate('b', { nbd: `unix:${sock('b')}` });
    const ho = await m.handOver();
    expect(ho.rwReplicaIds).toHaveLength(2);
    for (const p of [...BEFORE, [14, 1, 0x5c] as [number, number, number]]) await readsBack('b', p);
    await write('b', [15, 1, 0x5d]);
    await m.confirm();
    expect((await vol.status()).replicas.find((r) => r.hostId === 'c')?.mode).toBe('ERR');
    await env.hosts[2]!.start();
    await env.cluster.addHost(env.hosts[2]!.engine);
    expect(await waitFor(async () => (await vol.status()).state === 'healthy', 60_000, 300), diag()).toBe(true);
    await expectReplicasEqual('b');
  });

  it('rolls back by itself when the target host dies mid-migration', async () => {
    await attachOnA();
    const vol = env.cluster.volume(VOLUME);
    const rolled: Array<{ automatic: boolean; reason: string }> = [];
    vol.on('migration-rolled-back', (e) => rolled.push(e));
    await vol.migrate('b', { nbd: `unix:${sock('b')}` });
    await env.hosts[1]!.crash();
    await env.cluster.repairOnce();
    expect(rolled, diag()).toEqual([expect.objectContaining({ automatic: true })]);
    for (const p of BEFORE) await readsBack('a', p);
    await write('a', [10, 1, 0x79]);
    expect((await vol.status()).migration).toBeNull();
    // b comes back: its replica is rebuilt by a's engine.
    await env.hosts[1]!.start();
    await env.cluster.addHost(env.hosts[1]!.engine);
    expect(await waitFor(async () => (await vol.status()).state === 'healthy', 60_000, 300), diag()).toBe(true);
    await expectReplicasEqual('a');
  });

  it('rolls back by itself when the target host dies after the hand-over, keeping what it wrote', async () => {
    await attachOnA();
    const vol = env.cluster.volume(VOLUME);
    const rolled: Array<{ automatic: boolean; reason: string }> = [];
    vol.on('migration-rolled-back', (e) => rolled.push(e));
    const m = await vol.migrate('b', { nbd: `unix:${sock('b')}` });
    const ho = await m.handOver();
    await write('b', [20, 1, 0x7c]);
    await env.hosts[1]!.crash();
    await env.cluster.repairOnce();
    expect(rolled, diag()).toEqual([expect.objectContaining({ automatic: true })]);
    const st = await vol.status();
    expect(st).toMatchObject({ attachedHost: 'a', writerHost: 'a', migration: null });
    expect(st.epoch).toBeGreaterThan(ho.epoch);
    // a's new engine serves b's acknowledged write (it reached a's and c's replicas).
    for (const p of [...BEFORE, [20, 1, 0x7c] as [number, number, number]]) await readsBack('a', p);
    await write('a', [21, 1, 0x7d]);
    await env.hosts[1]!.start();
    await env.cluster.addHost(env.hosts[1]!.engine);
    expect(await waitFor(async () => (await vol.status()).state === 'healthy', 60_000, 300), diag()).toBe(true);
    await expectReplicasEqual('a');
  });

  it('stays on the target when the source host dies after the hand-over', async () => {
    await attachOnA();
    const vol = env.cluster.volume(VOLUME);
    const m = await vol.migrate('b', { nbd: `unix:${sock('b')}` });
    await m.handOver();
    await write('b', [16, 1, 0x7a]);
    await env.hosts[0]!.crash();
    await env.cluster.repairOnce();
    const st = await vol.status();
    expect(st, diag()).toMatchObject({ attachedHost: 'b', writerHost: 'b', migration: null });
    for (const p of [...BEFORE, [16, 1, 0x7a] as [number, number, number]]) await readsBack('b', p);
    await write('b', [17, 1, 0x7b]);
    await env.hosts[0]!.start();
    await env.cluster.addHost(env.hosts[0]!.engine);
    expect(await waitFor(async () => (await vol.status()).state === 'healthy', 60_000, 300), diag()).toBe(true);
    await expectReplicasEqual('b');
  });

  it('finishes a migration after the embedding process restarts', async () => {
    await attachOnA();
    await env.cluster.volume(VOLUME).migrate('b', { nbd: `unix:${sock('b')}` });
    // A new VM-manager process: same state store, fresh connections to the same hosts.
    await env.reopen();
    const m = await env.cluster.volume(VOLUME).migration();
    expect(m).not.toBeNull();
    expect(await m!.info()).toMatchObject({ sourceHost: 'a', targetHost: 'b', phase: 'target-ready' });
    await m!.handOver();
    for (const p of BEFORE) await readsBack('b', p);
    await m!.confirm();
    expect((await env.cluster.volume(VOLUME).status()).attachedHost).toBe('b');
    await expectReplicasEqual('b');
  });
});
