// The `mooring` process's logs and progress (docs/logging.md) with the real addon: a served
// volume gets 320 MiB of data through qemu-io, then `mooring snapshot export` writes the
// snapshot to a raw file and prints progress lines on stderr (human and JSON) whose
// percentages increase to a final 100%; --no-progress prints none; stdout keeps the result.
import { readFile, stat } from 'node:fs/promises';
import { afterAll, afterEach, describe, expect, it } from 'vitest';

import { killAllServers, runCli, startServe } from './helpers/serve.js';
import { qemuIo, TempDir } from './helpers/tools.js';

const MiB = 1024 * 1024;
// Five progress events of the native copy (one per 64 MiB read).
const DATA_MIB = 320;

describe('mooring logging and progress', () => {
  const tmp = new TempDir('mooring-cli-log-');
  afterEach(() => killAllServers());
  afterAll(() => tmp.cleanup());

  it('snapshot export prints progress lines up to 100%, as human lines and as JSON records', async () => {
    const dir = tmp.join('v');
    const server = await startServe({ dir, size: '512M', replicas: 1, extraArgs: ['--log-format', 'json'] });
    await qemuIo(server.uri, [`write -P 0x5a 0 ${DATA_MIB}M`], 120_000);
    expect(await server.stop(), server.diagnostics()).toBe(0);
    // serve's own stderr was JSON throughout: one object per line, each with level and msg.
    const served = server.stderr.split('\n').filter((l) => l !== '');
    expect(served.length, server.diagnostics()).toBeGreaterThan(3);
    for (const l of served) expect(JSON.parse(l), l).toMatchObject({ level: expect.any(String), msg: expect.any(String) });
    expect(served.map((l) => JSON.parse(l).msg)).toContainEqual(expect.stringMatching(/^serving v /));

    await runCli(['snapshot', 'create', '--dir', dir, 's1']);

    // Human lines, one per progress event (interval 0), then the final one.
    const human = await runCli(['snapshot', 'export', '--dir', dir, 's1', '--to', tmp.join('s1.raw'), '--progress-interval-ms', '0']);
    const lines = human.stderr.split('\n').filter((l) => / export of snapshot s1 of v: /.test(l));
    expect(lines.length, human.stderr).toBeGreaterThanOrEqual(2);
    const percents = lines.map((l) => Number(/: (\d+)% \(/.exec(l)?.[1]));
    for (let i = 1; i < percents.length; i++) expect(percents[i]!, human.stderr).toBeGreaterThan(percents[i - 1]!);
    expect(percents.at(-1)).toBe(100);
    expect(lines.at(-1)).toMatch(new RegExp(`^mooring: export of snapshot s1 of v: 100% \\(${DATA_MIB} MiB of ${DATA_MIB} MiB, .*/s\\), done in \\d+\\.\\d s$`));
    expect(human.stdout).toMatch(/^exported snapshot s1 of v to .*s1\.raw \(512 MiB, 320 MiB of data\)\n$/);
    expect((await stat(tmp.join('s1.raw'))).size).toBe(512 * MiB);
    const head = await readFile(tmp.join('s1.raw')).then((b) => b.subarray(0, 4096));
    expect(head.every((x) => x === 0x5a)).toBe(true);

    // JSON: progress records with structured fields, the last one done at 100%.
    const json = await runCli(['snapshot', 'export', '--dir', dir, 's1', '--to', tmp.join('s1b.raw'), '--progress-interval-ms', '0', '--log-format', 'json', '--json']);
    const records = json.stderr
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as { level: string; msg: string; volume?: string; snapshot?: string; progress?: { percent: number; doneBytes: number; totalBytes: number; done: boolean } });
    const progress = records.filter((r) => r.progress);
    expect(progress.length, json.stderr).toBeGreaterThanOrEqual(2);
    for (const r of progress) expect(r).toMatchObject({ level: 'info', volume: 'v', snapshot: 's1', progress: { totalBytes: DATA_MIB * MiB } });
    const done = progress.map((r) => r.progress!.doneBytes);
    for (let i = 1; i < done.length; i++) expect(done[i]!).toBeGreaterThan(done[i - 1]!);
    expect(progress.at(-1)!.progress).toMatchObject({ percent: 100, doneBytes: DATA_MIB * MiB, done: true });
    expect(JSON.parse(json.stdout)).toMatchObject({ exported: 's1', sizeBytes: 512 * MiB, copiedBytes: DATA_MIB * MiB });

    // --no-progress: no progress lines; the result still on stdout.
    const quiet = await runCli(['snapshot', 'export', '--dir', dir, 's1', '--to', tmp.join('s1c.raw'), '--no-progress']);
    expect(quiet.stderr).not.toMatch(/export of snapshot/);
    expect(quiet.stdout).toMatch(/^exported snapshot s1 of v/);
  }, 300_000);
});
