import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { runCli } from '../../../src/cli/cli.js';
import type { CliContext } from '../../../src/cli/common.js';
import { runServe } from '../../../src/cli/serve.js';
import { Mooring } from '../../../src/mooring.js';
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
    for (const cmd of ['serve', 'create', 'info', 'snapshot', 'rebuild', 'image']) {
      ctx.out.length = 0;
      expect(await runCli([cmd, '--help'], ctx)).toBe(0);
      expect(ctx.out.join('')).toContain(`mooring ${cmd}`);
    }
    expect(await runCli(['snapshot', 'list', '--help'], ctx)).toBe(0);
    expect(await runCli([], ctx)).toBe(2);
    ctx.out.length = 0;
    ctx.err.length = 0;
    expect(await runCli(['snapshot'], ctx)).toBe(2);
    expect(ctx.out, 'usage errors print nothing on stdout').toEqual([]);
    expect(ctx.err.join('')).toContain('mooring snapshot create');
  });

  it.each([
    [['nope'], 'unknown command'],
    [['serve', '--bogus'], "Unknown option '--bogus'"],
    [['serve'], '--dir DIR is required'],
    [['serve', '--dir', 'v'], '--size is required'],
    [['serve', '--dir', 'v', '--size', '10GB'], 'invalid size'],
    // Sizes are checked as the library checks them, before anything opens.
    [['serve', '--dir', 'v', '--size', '1000'], '--size: sizeBytes must be a positive multiple of 4096'],
    [['create', '--dir', 'v', '--size', '0'], '--size: sizeBytes must be a positive multiple of 4096'],
    [['create', '--dir', 'v', '--size', '-1G'], "--size needs a value; to give one starting with '-', write --size=VALUE"],
    [['create', '--dir', 'v', '--size=-1G'], '--size: invalid size "-1G"'],
    [['serve', '--dir', 'v', '--size', '1M', '--replicas', '0'], '--replicas must be'],
    [['serve', '--dir', 'v', '--size', '1M', '--replicas', '17'], '--replicas must be'],
    [['serve', '--dir', 'v', '--size', '1M', '--nbd', 'http://x'], '--nbd must be'],
    [['serve', '--dir', 'v', 'extra'], 'unexpected argument'],
    [['serve', '--dir', 'v', '--size', '1M', '--host', 'h2:1234'], '--host must be'],
    [['serve', '--dir', 'v', '--size', '1M', '--host-id', 'a/b'], '--host-id must match'],
    [['info', '--dir', 'v', '--volume', ''], '--volume needs a NAME'],
    [['create', '--dir', 'v', '--size', '1M', '--volume', '../x'], '--volume must match'],
    [['serve', '--dir'], "Option '--dir <value>' argument missing"],
    [['create', '--dir', 'v'], '--size SIZE is required'],
    [['snapshot', 'frobnicate', '--dir', 'v'], 'unknown snapshot command'],
    [['snapshot', 'create', '--dir', 'v'], 'needs a snapshot NAME'],
    [['snapshot', 'create', '--dir', 'v', 's', '--label', 'novalue'], '--label must be KEY=VALUE'],
    [['snapshot', 'list', '--dir', 'v', 'extra'], 'unexpected argument'],
    [['snapshot', 'delete', '--dir', 'v', 's', '--label', 'a=b'], '--label only applies'],
    [['snapshot', 'clone', '--dir', 'v', 's'], 'snapshot clone needs --into NEW'],
    [['snapshot', 'clone', '--dir', 'v'], 'needs a snapshot NAME'],
    [['snapshot', 'export', '--dir', 'v', 's', '--to', 'f', '--into', 'c'], '--into only applies to snapshot clone'],
    [['snapshot', 'create', '--dir', 'v', 's', '--replicas', '2'], '--replicas only applies to snapshot clone'],
    [['snapshot', 'clone', '--dir', 'v', 's', '--into', 'c', '--replicas', '0'], '--replicas must be'],
    [['image', 'export'], 'unknown image command'],
    [['image', 'import', '--dir', 'v'], 'image import needs the image FILE'],
    [['image', 'import', '--dir', 'v', 'f', '--checksum', 'abc'], '--checksum must be a SHA-512'],
    [['image', 'import', '--dir', 'v', 'f', '--size', '1000'], '--size: sizeBytes must be a positive multiple of 4096'],
    [['image', 'import', '--dir', 'v', 'f', '--image', 'a/b'], '--image must match'],
    [['rebuild'], '--dir DIR is required'],
    [['rebuild', '--dir', 'v', 'extra'], 'unexpected argument'],
    [['rebuild', '--dir', 'v', '--timeout-ms', '1.5'], '--timeout-ms must be an integer'],
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
    // A directory that holds no store is reported, and left as it was.
    await mkdir(join(root, 'plain'));
    ctx.err.length = 0;
    expect(await runCli(['info', '--dir', 'plain'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/^mooring: NOT_FOUND: .*holds no Mooring store/);
    expect(await readdir(join(root, 'plain'))).toEqual([]);
  });

  it('creates, shows and snapshots a volume', async () => {
    expect(await runCli(['create', '--dir', 'v', '--size', '1M'], ctx)).toBe(0);
    expect(ctx.out.join('')).toContain('created volume v');
    ctx.out.length = 0;
    // Replicas go one per host: two need a second host (--host).
    expect(await runCli(['create', '--dir', 'v', '--volume', 'w', '--size', '1M', '--replicas', '2'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/^mooring: UNAVAILABLE: /);
    expect(await runCli(['snapshot', 'create', '--dir', 'v', 'snap1', '--label', 'a=b', '--label', 'c=d=e'], ctx)).toBe(0);
    expect(await runCli(['snapshot', 'list', '--dir', 'v', '--json'], ctx)).toBe(0);
    const list = JSON.parse(ctx.out.at(-1)!);
    expect(list).toEqual([expect.objectContaining({ name: 'snap1', labels: { a: 'b', c: 'd=e' }, parent: null })]);
    ctx.out.length = 0;
    expect(await runCli(['info', '--dir', 'v', '--json'], ctx)).toBe(0);
    const [info] = JSON.parse(ctx.out.join(''));
    expect(info).toMatchObject({ volume: 'v', sizeBytes: 1 << 20, replicaCount: 1, state: 'detached', snapshots: [{ name: 'snap1' }], servedBy: null });
    expect(info.replicas.map((r: { id: string; mode: string }) => `${r.id}:${r.mode}`)).toEqual(['r0:RW']);
    ctx.out.length = 0;
    expect(await runCli(['info', '--dir', 'v'], ctx)).toBe(0);
    expect(ctx.out.join('')).toMatch(/size\s+1 MiB \(1048576 bytes\)/);
    expect(ctx.out.join('')).toMatch(/served\s+no \(detached\); last writer epoch \d+/);
    expect(await runCli(['snapshot', 'revert', '--dir', 'v', 'snap1'], ctx)).toBe(0);
    expect(addon.reverts).toEqual(['snap1']);
    expect(await runCli(['snapshot', 'delete', '--dir', 'v', 'snap1'], ctx)).toBe(0);
    expect(await runCli(['snapshot', 'delete', '--dir', 'v', 'snap1'], ctx)).toBe(1);
    expect(ctx.err.join('')).toContain('mooring: NOT_FOUND: ');
  });

  it('serve creates, prints one READY line, and stops cleanly on SIGTERM', async () => {
    const done = runServe(['--dir', 'v', '--size', '4M', '--replicas', '1', '--host-id', 'h1'], ctx);
    await waitFor(() => ctx.out.length > 0);
    expect(ctx.out).toHaveLength(1);
    const line = ctx.out[0]!;
    expect(line).toMatch(/^READY \{.*\}\n$/);
    const ready = JSON.parse(line.slice('READY '.length));
    const sock = join(root, 'v', 'nbd.sock');
    expect(ready).toEqual({ uri: `nbd+unix:///?socket=${sock}`, nbd: `unix:${sock}`, volume: 'v', hostId: 'h1', sizeBytes: 4 << 20, replicas: 1, epoch: 1 });
    expect(Object.keys(ready)).toEqual(['uri', 'nbd', 'volume', 'hostId', 'sizeBytes', 'replicas', 'epoch']);
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    expect(await done).toBe(0);
    expect(addon.engine.closed).toBe(true);
    expect(addon.engine.servers[0]!.closed).toBe(true);
    expect(ctx.signals.listenerCount('SIGTERM')).toBe(0);
    expect(ctx.exits).toEqual([]);
  });

  it('serve opens an existing volume on TCP and checks --size/--replicas', async () => {
    expect(await runCli(['create', '--dir', 'v', '--size', '1M'], ctx)).toBe(0);
    ctx.out.length = 0;
    expect(await runCli(['serve', '--dir', 'v', '--size', '2M'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/mooring: INVALID_ARGUMENT: --size 2097152 does not match/);
    expect(await runCli(['serve', '--dir', 'v', '--replicas', '3'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/--replicas 3 does not match/);
    const done = runServe(['--dir', 'v', '--size', '1M', '--nbd', 'tcp:127.0.0.1:0'], ctx);
    await waitFor(() => ctx.out.length > 0);
    const ready = JSON.parse(ctx.out[0]!.slice(6));
    expect(ready.uri).toMatch(/^nbd:\/\/127\.0\.0\.1:\d+\/?$/);
    expect(ready.nbd).toMatch(/^tcp:127\.0\.0\.1:\d+$/);
    expect(ready.nbd).not.toBe('tcp:127.0.0.1:0');
    expect(ready.epoch).toBe(addon.engine.epoch());
    // The refused serves checked before attaching: no epoch was handed out for them.
    expect(ready.epoch).toBe(1);
    ctx.signals.emit('SIGINT', 'SIGINT');
    ctx.signals.emit('SIGINT', 'SIGINT');
    expect(await done).toBe(0);
    // The second signal asked for a forced exit.
    expect(ctx.exits).toEqual([1]);
  });

  it('serve refuses NBD on a non-loopback TCP address unless --allow-insecure-remote says so', async () => {
    expect(await runCli(['serve', '--dir', 'v', '--size', '1M', '--nbd', 'tcp:0.0.0.0:0'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/mooring: INVALID_ARGUMENT: nbd 0\.0\.0\.0 is not a loopback address/);
    expect(ctx.out).toEqual([]);
    const done = runServe(['--dir', 'v', '--nbd', 'tcp:0.0.0.0:0', '--allow-insecure-remote'], ctx);
    await waitFor(() => ctx.out.length > 0);
    expect(JSON.parse(ctx.out[0]!.slice(6)).nbd).toMatch(/^tcp:0\.0\.0\.0:\d+$/);
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    expect(await done).toBe(0);
  });

  it('serve closes without serving when the signal comes while it opens', async () => {
    const done = runServe(['--dir', 'v', '--size', '1M'], ctx);
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    expect(await done).toBe(0);
    expect(ctx.out).toEqual([]);
    expect(addon.engines).toHaveLength(0);
  });

  it('serve names a new volume after its directory, or asks for --volume', async () => {
    expect(await runCli(['serve', '--dir', 'bad name', '--size', '1M'], ctx)).toBe(2);
    expect(ctx.err.join('')).toMatch(/is no volume name: give one with --volume/);
  });

  it('info never claims a writer epoch: offline it reads under the locks, while served it asks the server', async () => {
    expect(await runCli(['create', '--dir', 'v', '--size', '1M'], ctx)).toBe(0);
    const epochOf = async (c: Captured) => {
      c.out.length = 0;
      expect(await runCli(['info', '--dir', 'v', '--json'], c)).toBe(0);
      return JSON.parse(c.out.join(''))[0] as { epoch: number; replicas: { epoch: number }[] };
    };
    const before = (await epochOf(ctx)).epoch;
    const engines = addon.engines.length;
    for (let i = 0; i < 3; i++) expect((await epochOf(ctx)).epoch).toBe(before);
    expect(addon.engines.length, 'info opened an engine').toBe(engines);

    const done = runServe(['--dir', 'v'], ctx);
    await waitFor(() => ctx.out.some((l) => l.startsWith('READY ')));
    const ready = JSON.parse(ctx.out.find((l) => l.startsWith('READY '))!.slice(6)) as { epoch: number; nbd: string };
    const other = context(addon, root);
    expect(await runCli(['info', '--dir', 'v', '--json'], other)).toBe(0);
    const [live] = JSON.parse(other.out.join(''));
    expect(live).toMatchObject({ volume: 'v', epoch: ready.epoch, replicaCount: 1, state: 'healthy', servedBy: { pid: process.pid, nbd: ready.nbd } });
    other.out.length = 0;
    expect(await runCli(['info', '--dir', 'v'], other)).toBe(0);
    expect(other.out.join('')).toMatch(new RegExp(`served\\s+by pid ${process.pid} at ${ready.nbd}; healthy; writer epoch ${ready.epoch}`));
    // Asking changed nothing: the server is still the writer.
    expect(addon.engine.closed).toBe(false);
    expect(addon.engine.epoch()).toBe(ready.epoch);
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    expect(await done).toBe(0);
    expect(existsSync(join(root, 'v', 'status.sock')), 'the status socket outlived the server').toBe(false);
    // And offline again, the next epoch has not been handed out.
    expect((await epochOf(other)).epoch).toBe(ready.epoch);
  });

  it('info on a directory another process holds without a status socket says BUSY and why', async () => {
    expect(await runCli(['create', '--dir', 'v', '--size', '1M'], ctx)).toBe(0);
    const held = await Mooring.open({ dir: join(root, 'v'), dataEngine: { addon }, repairIntervalMs: 0 });
    try {
      const other = context(addon, root);
      expect(await runCli(['info', '--dir', 'v'], other)).toBe(1);
      expect(other.err.join('')).toMatch(/^mooring: BUSY: .*no status socket/);
    } finally {
      await held.close();
    }
  });
});
