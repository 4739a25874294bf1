// `mooring data-engine` in-process with the fake addon: READY line, a round trip through
// the gRPC address it printed, orderly shutdown on SIGTERM, usage errors.
import { EventEmitter } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { runCli } from '../../../src/cli/cli.js';
import type { CliContext } from '../../../src/cli/common.js';
import type { DataEngineReadyInfo } from '../../../src/cli/data-engine.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
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

async function ready(ctx: Captured): Promise<DataEngineReadyInfo> {
  for (let i = 0; i < 1000; i++) {
    const line = ctx.out.find((l) => l.startsWith('READY '));
    if (line) return JSON.parse(line.slice('READY '.length)) as DataEngineReadyInfo;
    // An error line: `mooring: CODE: message`.
    if (ctx.err.some((l) => /^mooring: [A-Z][A-Z_]+: /.test(l) && !/^mooring: SIG/.test(l))) throw new Error(ctx.err.join(''));
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`no READY line; stderr: ${ctx.err.join('')}`);
}

describe('mooring data-engine', () => {
  let root: string;
  let addon: FakeAddon;
  let ctx: Captured;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-de-cli-'));
    addon = new FakeAddon();
    ctx = context(addon, root);
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('serves until SIGTERM: READY with its addresses, a round trip, engines stopped on the way out', async () => {
    // A new directory with a replica port must say how the port is guarded.
    expect(await runCli(['data-engine', '--dir', 'de', '--host-id', 'h1', '--listen', 'unix:de.sock'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/INVALID_ARGUMENT: --replica-listen tcp:127\.0\.0\.1:0: a replica server without TLS needs --cluster-secret-file/);
    ctx.err.length = 0;
    const run = runCli(['data-engine', '--dir', 'de', '--host-id', 'h1', '--listen', 'unix:de.sock', '--max-concurrent-rebuilds', '3', '--insecure'], ctx);
    const info = await ready(ctx);
    expect(info).toMatchObject({ hostId: 'h1', grpc: `unix:${join(root, 'de.sock')}`, tls: false });
    expect(info.replicaAddress).toMatch(/^tcp:127\.0\.0\.1:\d+$/);
    const remote = await RemoteDataEngine.connect({ address: info.grpc });
    await remote.createReplica('r0', 1024 * 1024);
    await remote.startEngine({ volume: 'v', replicas: [{ id: 'r0', hostId: 'h1', name: 'r0', address: null }], nbd: `unix:${join(root, 'v.sock')}`, epoch: 1 });
    await remote.close();
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    expect(await run).toBe(0);
    expect(addon.engine.closed).toBe(true);
    expect(addon.engine.servers[0]!.closed).toBe(true);
    expect([...addon.replicaServers.values()]).toEqual([]);
    expect(ctx.err.join('')).toContain('volume v: engine stopped');
    // The directory is free for the next run.
    ctx.out.length = 0;
    ctx.err.length = 0;
    const again = runCli(['data-engine', '--dir', 'de', '--host-id', 'h1', '--listen', 'unix:de.sock', '--replica-listen', 'none'], ctx);
    expect((await ready(ctx)).replicaAddress).toBeNull();
    ctx.signals.emit('SIGINT', 'SIGINT');
    expect(await again).toBe(0);
    // A directory an earlier run made: an unguarded replica port is warned about, not refused
    // (a data engine restarted, or upgraded with its old command line).
    ctx.out.length = 0;
    ctx.err.length = 0;
    const third = runCli(['data-engine', '--dir', 'de', '--host-id', 'h1', '--listen', 'unix:de.sock'], ctx);
    expect((await ready(ctx)).replicaAddress).toMatch(/^tcp:127\.0\.0\.1:\d+$/);
    expect(ctx.err.join('')).toContain('warning: no --cluster-secret-file and no TLS');
    ctx.signals.emit('SIGINT', 'SIGINT');
    expect(await third).toBe(0);
  });

  it('refuses bad invocations with usage errors (exit 2) and bad settings with coded errors (exit 1)', async () => {
    const usage: string[][] = [
      ['data-engine', '--host-id', 'h', '--listen', 'unix:x.sock'],
      ['data-engine', '--dir', 'd', '--listen', 'unix:x.sock'],
      ['data-engine', '--dir', 'd', '--host-id', 'h'],
      ['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'http://x'],
      ['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--tls-cert', 'c.pem'],
      ['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--max-concurrent-rebuilds', 'many'],
      ['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--hand-over-hold-ms', 'soon'],
      ['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--hand-over-hold-ms', '-1'],
      ['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--bogus'],
    ];
    for (const argv of usage) expect(await runCli(argv, ctx), argv.join(' ')).toBe(2);
    expect(ctx.err.join('')).toContain('--listen ADDRESS is required (unix:PATH or tcp:HOST:PORT)');
    expect(ctx.err.join('')).not.toContain('undefined');
    ctx.err.length = 0;
    expect(await runCli(['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'tcp:0.0.0.0:0', '--replica-listen', 'none', '--insecure'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/INVALID_ARGUMENT: .*loopback/);
    ctx.err.length = 0;
    // Loopback TCP without TLS and without a cluster secret: any local process could call it.
    expect(await runCli(['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'tcp:127.0.0.1:0', '--replica-listen', 'none'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/INVALID_ARGUMENT: .*needs --cluster-secret-file/);
    expect(await runCli(['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--insecure', '--cluster-secret-file', 'f'], ctx)).toBe(2);
    expect(await runCli(['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--replica-listen', 'tcp:10.1.2.3:0'], ctx)).toBe(1);
    expect(await runCli(['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--max-concurrent-rebuilds', '0'], ctx)).toBe(1);
    ctx.err.length = 0;
    expect(await runCli(['data-engine', '--dir', 'd', '--host-id', 'h', '--listen', 'unix:x.sock', '--hand-over-hold-ms', '100000000'], ctx)).toBe(1);
    expect(ctx.err.join('')).toMatch(/INVALID_ARGUMENT: handOverHoldMs/);
    expect(await runCli(['data-engine', '--help'], ctx)).toBe(0);
    expect(ctx.out.join('')).toContain('mooring data-engine');
  });
});
