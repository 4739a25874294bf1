import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { runCli } from '../../../src/cli/cli.js';
import type { CliContext } from '../../../src/cli/common.js';
import { runServe } from '../../../src/cli/serve.js';
import { DirectoryVolume } from '../../../src/volume/directory-volume.js';
import { FakeAddon } from '../fakes/fake-addon.js';

interface Captured extends CliContext {
  out: string[];
  err: string[];
  signals: EventEmitter;
  exits: number[];
}

function context(addon: FakeAddon, cwd: string): Captured {
  const out: string[] = [];
  const err: string[] = [];
  const exits: number[] = [];
  const signals = new EventEmitter();
  return { out, err, exits, signals, addon, cwd, stdout: (t) => out.push(t), stderr: (t) => err.push(t), exit: (c) => exits.push(c) };
}

async function waitFor(pred: () => boolean, ms = 2000): Promise<void> {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('mooring CLI', () => {
  let root: string;
  let addon: FakeAddon;
  let ctx: Captured;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-cli-'));
    addon = new FakeAddon();
    ctx = context(addon, root);
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('prints help and version', async () => {
    expect(await runCli(['--help'], ctx)).toBe(0);
    expect(ctx.out.join('')).toContain('Usage: mooring <command>');
    expect(await runCli(['--version'], ctx)).toBe(0);
    expect(ctx.out.at(-1)).toMatch(/^\d+\.\d+\.\d+\n$/);
    for (const cmd of ['serve', 'create', 'info', 'snapshot']) {
      ctx.out.length = 0;
      expect(await runCli([cmd, '--help'], ctx)).toBe(0);
      expect(ctx.out.join('')).toContain(`mooring ${cmd}`);
    }
    expect(await runCli(['snapshot', 'list', '--help'], ctx)).toBe(0);
    expect(await runCli([], ctx)).toBe(2);
  });

  it.each([
    [['nope'], 'unknown command'],
    [['serve', '--bogus'], "Unknown option '--bogus'"],
    [['serve'], '--dir DIR is required'],
    [['serve', '--dir', 'v'], '--size is required'],
    [['serve', '--dir', 'v', '--size', '10GB'], 'invalid size'],
    [['serve', '--dir', 'v', '--size', '1M', '--replicas', '0'], '--replicas must be'],
    [['serve', '--dir', 'v', '--size', '1M', '--replicas', '17'], '--replicas must be'],
    [['serve', '--dir', 'v', '--size', '1M', '--nbd', 'http://x'], '--nbd must be'],
    [['serve', '--dir', 'v', 'extra'], 'unexpected argument'],
    [['serve', '--dir'], "Option '--dir <value>' argument missing"],
    [['create', '--dir', 'v'], '--size SIZE is required'],
    [['snapshot', 'frobnicate', '--dir', 'v'], 'unknown snapshot command'],
    [['snapshot', 'create', '--dir', 'v'], 'needs a snapshot NAME'],
    [['snapshot', 'create', '--dir', 'v', 's', '--label', 'novalue'], '--label must be KEY=VALUE'],
    [['snapshot', 'list', '--dir', 'v', 'extra'], 'unexpected argument'],
    [['snapshot', 'delete', '--dir', 'v', 's', '--label', 'a=b'], '--label only applies'],
  ])('%j is a usage error (exit 2)', async (argv, message) => {
    expect(await runCli(argv, ctx)).toBe(2);
    const err = ctx.err.join('');
    expect(err).toMatch(/^mooring: INVALID_ARGUMENT: /);
    expect(err).toContain(message);
    expect(err).toContain('--help');
  });

  it('reports operating errors with their code (exit 1)', async () => {
    expect(await runCli(['info', '--dir', 'missing'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/^mooring: NOT_FOUND: /);
    ctx.err.length = 0;
    expect(await runCli(['create', '--dir', 'v', '--size', '1000'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/^mooring: INVALID_ARGUMENT: sizeBytes must be/);
  });

  it('creates, shows and snapshots a volume', async () => {
    expect(await runCli(['create', '--dir', 'v', '--size', '1M', '--replicas', '2'], ctx)).toBe(0);
    expect(ctx.out.join('')).toContain('created volume v');
    ctx.out.length = 0;
    expect(await runCli(['snapshot', 'create', '--dir', 'v', 'snap1', '--label', 'a=b', '--label', 'c=d=e'], ctx)).toBe(0);
    expect(await runCli(['snapshot', 'list', '--dir', 'v', '--json'], ctx)).toBe(0);
    const list = JSON.parse(ctx.out.at(-1)!);
    expect(list).toEqual([expect.objectContaining({ name: 'snap1', labels: { a: 'b', c: 'd=e' }, parent: null })]);
    ctx.out.length = 0;
    expect(await runCli(['info', '--dir', 'v', '--json'], ctx)).toBe(0);
    const info = JSON.parse(ctx.out.join(''));
    expect(info).toMatchObject({ name: 'v', sizeBytes: 1 << 20, replicaCount: 2, healthy: true, snapshots: [{ name: 'snap1' }], servedBy: null });
    expect(info.replicas.map((r: { id: string; mode: string }) => `${r.id}:${r.mode}`)).toEqual(['r0:RW', 'r1:RW']);
    ctx.out.length = 0;
    expect(await runCli(['info', '--dir', 'v'], ctx)).toBe(0);
    expect(ctx.out.join('')).toMatch(/size\s+1 MiB \(1048576 bytes\)/);
    expect(ctx.out.join('')).toMatch(/served\s+no; last writer epoch \d+/);
    expect(await runCli(['snapshot', 'revert', '--dir', 'v', 'snap1'], ctx)).toBe(0);
    expect(addon.reverts).toEqual(['snap1']);
    expect(await runCli(['snapshot', 'delete', '--dir', 'v', 'snap1'], ctx)).toBe(0);
    expect(await runCli(['snapshot', 'delete', '--dir', 'v', 'snap1'], ctx)).toBe(1);
    expect(ctx.err.join('')).toContain('mooring: NOT_FOUND: ');
  });

  it('serve creates, prints one READY line, and stops cleanly on SIGTERM', async () => {
    const done = runServe(['--dir', 'v', '--size', '4M', '--replicas', '1'], ctx);
    await waitFor(() => ctx.out.length > 0);
    expect(ctx.out).toHaveLength(1);
    const line = ctx.out[0]!;
    expect(line).toMatch(/^READY \{.*\}\n$/);
    const ready = JSON.parse(line.slice('READY '.length));
    const sock = join(root, 'v', 'nbd.sock');
    expect(ready).toEqual({ uri: `nbd+unix:///?socket=${sock}`, nbd: `unix:${sock}`, sizeBytes: 4 << 20, replicas: 1, epoch: 1 });
    expect(Object.keys(ready)).toEqual(['uri', 'nbd', 'sizeBytes', 'replicas', 'epoch']);
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    expect(await done).toBe(0);
    expect(addon.engine.closed).toBe(true);
    expect(addon.engine.servers[0]!.closed).toBe(true);
    expect(ctx.signals.listenerCount('SIGTERM')).toBe(0);
    expect(ctx.exits).toEqual([]);
  });

  it('serve opens an existing volume on TCP and checks --size/--replicas', async () => {
    expect(await runCli(['create', '--dir', 'v', '--size', '1M', '--replicas', '2'], ctx)).toBe(0);
    ctx.out.length = 0;
    expect(await runCli(['serve', '--dir', 'v', '--size', '2M'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/mooring: INVALID_ARGUMENT: --size 2097152 does not match/);
    expect(await runCli(['serve', '--dir', 'v', '--replicas', '3'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/--replicas 3 does not match/);
    const done = runServe(['--dir', 'v', '--size', '1M', '--nbd', 'tcp:127.0.0.1:0', '--export-name', 'disk'], ctx);
    await waitFor(() => ctx.out.length > 0);
    const ready = JSON.parse(ctx.out[0]!.slice(6));
    expect(ready.uri).toMatch(/^nbd:\/\/127\.0\.0\.1:\d+\/disk$/);
    expect(ready.nbd).toMatch(/^tcp:127\.0\.0\.1:\d+$/);
    expect(ready.nbd).not.toBe('tcp:127.0.0.1:0');
    expect(ready.epoch).toBe(addon.engine.epoch());
    // Each open allocated the next epoch from volume.json: create 1, the two refused serves
    // (they opened the volume before checking it) 2 and 3, this one 4.
    expect(ready.epoch).toBe(4);
    expect(JSON.parse(await readFile(join(ctx.cwd!, 'v', 'volume.json'), 'utf8')).lastEpoch).toBe(4);
    ctx.signals.emit('SIGINT', 'SIGINT');
    ctx.signals.emit('SIGINT', 'SIGINT');
    expect(await done).toBe(0);
    // The second signal asked for a forced exit.
    expect(ctx.exits).toEqual([1]);
  });

  it('serve closes without serving when the signal comes while it opens', async () => {
    const done = runServe(['--dir', 'v', '--size', '1M'], ctx);
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    expect(await done).toBe(0);
    expect(ctx.out).toEqual([]);
    expect(addon.engine.closed).toBe(true);
    expect(addon.engine.servers).toHaveLength(0);
  });

  it('serve refuses a non-empty directory without a volume', async () => {
    await mkdir(join(root, 'junk'));
    await writeFile(join(root, 'junk', 'file'), 'x');
    expect(await runCli(['serve', '--dir', 'junk', '--size', '1M'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/^mooring: NOT_FOUND: .*holds no volume\.json/);
  });

  it('info never claims a writer epoch: offline it reads under the lock, while served it asks the server', async () => {
    expect(await runCli(['create', '--dir', 'v', '--size', '1M', '--replicas', '2'], ctx)).toBe(0);
    const spec = async () => JSON.parse(await readFile(join(root, 'v', 'volume.json'), 'utf8')) as { lastEpoch: number };
    const before = (await spec()).lastEpoch;
    const engines = addon.engines.length;
    for (let i = 0; i < 3; i++) expect(await runCli(['info', '--dir', 'v', '--json'], ctx)).toBe(0);
    expect((await spec()).lastEpoch).toBe(before);
    expect(addon.engines.length, 'info opened an engine').toBe(engines);
    expect(addon.replicasOpened.length).toBe(3);

    const done = runServe(['--dir', 'v'], ctx);
    await waitFor(() => ctx.out.some((l) => l.startsWith('READY ')));
    const ready = JSON.parse(ctx.out.find((l) => l.startsWith('READY '))!.slice(6)) as { epoch: number; nbd: string };
    const served = (await spec()).lastEpoch;
    const other = context(addon, root);
    expect(await runCli(['info', '--dir', 'v', '--json'], other)).toBe(0);
    const live = JSON.parse(other.out.join(''));
    expect(live).toMatchObject({ name: 'v', epoch: ready.epoch, replicaCount: 2, healthy: true, servedBy: { pid: process.pid, nbd: ready.nbd } });
    other.out.length = 0;
    expect(await runCli(['info', '--dir', 'v'], other)).toBe(0);
    expect(other.out.join('')).toMatch(new RegExp(`served\\s+by pid ${process.pid} at ${ready.nbd}; writer epoch ${ready.epoch}`));
    // Asking changed nothing: same epoch, the server still the writer.
    expect((await spec()).lastEpoch).toBe(served);
    expect(addon.engine.closed).toBe(false);
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    expect(await done).toBe(0);
    expect(existsSync(join(root, 'v', 'status.sock')), 'the status socket outlived the server').toBe(false);
  });

  it('info on a volume opened without a status socket says BUSY and why', async () => {
    expect(await runCli(['create', '--dir', 'v', '--size', '1M'], ctx)).toBe(0);
    const held = await DirectoryVolume.open(join(root, 'v'), { addon });
    try {
      const other = context(addon, root);
      expect(await runCli(['info', '--dir', 'v'], other)).toBe(1);
      expect(other.err.join('')).toMatch(/^mooring: BUSY: .*no status socket/);
    } finally {
      await held.close();
    }
  });
});
