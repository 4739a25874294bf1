// Progress of long `mooring` commands with real processes (docs/logging.md, "Progress"):
// `mooring rebuild` rebuilds a replica that missed 320 MiB of writes while its host (one of
// two real `mooring data-engine` processes) was down, and `mooring snapshot clone` copies a snapshot
// holding 320 MiB into a new volume. Each prints progress lines on stderr that rise to a
// final 100%, and the result is checked: identical replicas, the clone's data read back, the
// imported volume compared with the image by qemu-img.
import { afterAll, afterEach, describe, expect, it } from 'vitest';

import { killAllServers, runCli, startServe } from './helpers/serve.js';
import { qemuIo, run, TempDir } from './helpers/tools.js';
import { VolumeFixture } from './helpers/volume.js';

const MiB = 1024 * 1024;
// Five progress events of the native copy or rebuild (one per 64 MiB).
const DATA_MIB = 320;

interface ProgressRecord {
  level: string;
  msg: string;
  volume?: string;
  replicaId?: string;
  hostId?: string;
  progress?: { task: string; percent: number; doneBytes: number; totalBytes: number; done: boolean };
}

function jsonRecords(stderr: string): ProgressRecord[] {
  return stderr
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as ProgressRecord);
}

describe('progress of mooring rebuild, snapshot clone and image import', () => {
  const tmp = new TempDir('mooring-cli-prog-');
  let vol: VolumeFixture | null = null;
  afterEach(async () => {
    await killAllServers();
    await vol?.cleanup();
    vol = null;
  });
  afterAll(() => tmp.cleanup());

  it('mooring rebuild rebuilds a replica that missed writes, with progress records up to 100%', async () => {
    // Three replicas: with one gone, the other two are still a majority and take writes.
    vol = new VolumeFixture(512 * MiB, 3);
    await vol.start();
    const peer = vol.peers[1]!;
    // The peer's host goes away: the writes below land on the other two replicas only.
    await peer.stop();
    await qemuIo(vol.uri, [`write -P 0x5a 0 ${DATA_MIB}M`], 120_000);
    await vol.stop();
    await peer.start();

    const hostArgs = [...vol.peers.flatMap((p) => ['--host', `unix:${p.grpcSocket}`]), '--cluster-secret-file', peer.clusterSecretFile!];
    const before = await runCli(['info', '--dir', vol.dir, '--json']);
    expect(JSON.parse(before.stdout)[0].state, before.stdout).not.toBe('healthy');

    const r = await runCli(
      ['rebuild', '--dir', vol.dir, ...hostArgs, '--progress-interval-ms', '0', '--log-format', 'json', '--json'],
      { timeoutMs: 240_000 },
    );
    const progress = jsonRecords(r.stderr).filter((x) => x.progress);
    expect(progress.length, r.stderr).toBeGreaterThanOrEqual(2);
    for (const p of progress) expect(p, r.stderr).toMatchObject({ level: 'info', volume: 'vol', progress: { task: expect.stringMatching(/^rebuild of replica \S+ of vol$/) } });
    const done = progress.map((p) => p.progress!.doneBytes);
    for (let i = 1; i < done.length; i++) expect(done[i]!, r.stderr).toBeGreaterThan(done[i - 1]!);
    const last = progress.at(-1)!.progress!;
    expect(last, r.stderr).toMatchObject({ percent: 100, done: true });
    expect(last.doneBytes, r.stderr).toBeGreaterThanOrEqual(DATA_MIB * MiB);
    expect(progress.filter((p) => p.progress!.done), 'one final record').toHaveLength(1);

    const result = JSON.parse(r.stdout) as { volume: string; state: string; rebuilt: Array<{ replicaId: string; hostId: string; sentBytes: number }> };
    expect(result).toMatchObject({ volume: 'vol', state: 'healthy', replicaCount: 3 });
    expect(result.rebuilt, r.stdout).toHaveLength(1);
    expect(result.rebuilt[0]!.hostId).toBe(peer.hostId);
    expect(result.rebuilt[0]!.sentBytes).toBeGreaterThanOrEqual(DATA_MIB * MiB);

    // All three replicas now hold the same bytes.
    await vol.checkReplicas();
  }, 300_000);

  it('mooring snapshot clone copies a snapshot into a new volume, with progress lines up to 100%', async () => {
    const dir = tmp.join('v');
    const server = await startServe({ dir, size: '512M', replicas: 1 });
    await qemuIo(server.uri, [`write -P 0x5a 0 ${DATA_MIB}M`], 120_000);
    expect(await server.stop(), server.diagnostics()).toBe(0);
    await runCli(['snapshot', 'create', '--dir', dir, 's1']);

    const human = await runCli(['snapshot', 'clone', '--dir', dir, 's1', '--into', 'c', '--replicas', '1', '--progress-interval-ms', '0'], { timeoutMs: 120_000 });
    const lines = human.stderr.split('\n').filter((l) => / clone of snapshot s1 of v into c: /.test(l));
    expect(lines.length, human.stderr).toBeGreaterThanOrEqual(2);
    const percents = lines.map((l) => Number(/: (\d+)% \(/.exec(l)?.[1]));
    for (let i = 1; i < percents.length; i++) expect(percents[i]!, human.stderr).toBeGreaterThan(percents[i - 1]!);
    expect(lines.at(-1)).toMatch(new RegExp(`^mooring: clone of snapshot s1 of v into c: 100% \\(${DATA_MIB} MiB of ${DATA_MIB} MiB, .*/s\\), done in \\d+\\.\\d s$`));
    expect(human.stdout).toBe(`cloned snapshot s1 of v into volume c (512 MiB, 1 replica, ${DATA_MIB} MiB of data)\n`);

    // --no-progress: no progress lines; the result still on stdout.
    const quiet = await runCli(['snapshot', 'clone', '--dir', dir, '--volume', 'v', 's1', '--into', 'c2', '--replicas', '1', '--no-progress', '--json'], { timeoutMs: 120_000 });
    expect(quiet.stderr).not.toMatch(/clone of snapshot/);
    expect(JSON.parse(quiet.stdout)).toMatchObject({ cloned: 's1', from: 'v', volume: 'c2', sizeBytes: 512 * MiB, replicaCount: 1, copiedBytes: DATA_MIB * MiB });

    // The clone holds the snapshot's data and zeros after it.
    const clone = await startServe({ dir, extraArgs: ['--volume', 'c'] });
    await qemuIo(clone.uri, [`read -P 0x5a 0 ${DATA_MIB}M`, `read -P 0 ${DATA_MIB}M ${512 - DATA_MIB}M`], 120_000);
    expect(await clone.stop(), clone.diagnostics()).toBe(0);
  }, 300_000);

  it('mooring image import uploads a qcow2 file with progress lines up to 100%, and the volume reads as the image', async () => {
    const image = tmp.join('base.qcow2');
    await run('qemu-img', ['create', '-q', '-f', 'qcow2', image, '512M']);
    await run('qemu-io', ['-f', 'qcow2', image, '-c', `write -P 0x5a 0 ${DATA_MIB}M`, '-c', 'write -P 0x11 400M 1M'], { timeoutMs: 120_000 });
    const dir = tmp.join('imported');

    // A file that is not what --checksum says: refused, and nothing of it is left behind (the
    // import below reuses both names).
    const wrong = await runCli(['image', 'import', '--dir', dir, image, '--volume', 'vm', '--image', 'base', '--replicas', '1', '--checksum', '0'.repeat(128)], { allowFailure: true, timeoutMs: 120_000 });
    expect(wrong.code, wrong.stderr).toBe(1);
    expect(wrong.stderr).toMatch(/^mooring: CHECKSUM_MISMATCH: /m);

    const r = await runCli(['image', 'import', '--dir', dir, image, '--volume', 'vm', '--image', 'base', '--replicas', '1', '--progress-interval-ms', '0', '--log-format', 'json', '--json'], { timeoutMs: 120_000 });
    const progress = jsonRecords(r.stderr).filter((x) => x.progress);
    expect(progress.length, r.stderr).toBeGreaterThanOrEqual(2);
    const done = progress.map((p) => p.progress!.doneBytes);
    for (let i = 1; i < done.length; i++) expect(done[i]!, r.stderr).toBeGreaterThan(done[i - 1]!);
    const fileBytes = progress[0]!.progress!.totalBytes;
    expect(fileBytes).toBeGreaterThan(DATA_MIB * MiB);
    for (const p of progress) expect(p, r.stderr).toMatchObject({ level: 'info', volume: 'vm', progress: { task: expect.stringMatching(/^import of .*base\.qcow2 into backing image base$/), totalBytes: fileBytes } });
    expect(progress.at(-1)!.progress, r.stderr).toMatchObject({ percent: 100, doneBytes: fileBytes, done: true });
    expect(JSON.parse(r.stdout)).toMatchObject({ image: 'base', format: 'qcow2', fileBytes, virtualSizeBytes: 512 * MiB, volume: 'vm', sizeBytes: 512 * MiB, replicaCount: 1 });

    // The same name again: refused, and the first import is untouched.
    const again = await runCli(['image', 'import', '--dir', dir, image, '--volume', 'vm', '--image', 'other'], { allowFailure: true });
    expect(again.code, again.stderr).toBe(1);
    expect(again.stderr).toMatch(/^mooring: ALREADY_EXISTS: /);

    const server = await startServe({ dir, extraArgs: ['--volume', 'vm'] });
    await run('qemu-img', ['compare', '-f', 'qcow2', '-F', 'raw', image, server.uri], { timeoutMs: 120_000 });
    expect(await server.stop(), server.diagnostics()).toBe(0);
  }, 300_000);
});
