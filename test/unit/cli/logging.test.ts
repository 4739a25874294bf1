// The CLI's logging flags (docs/logging.md) through runCli, in-process with the fake addon:
// human lines by default, --log-format json gives one JSON object per line with level and
// msg (the library's records among them), --log-level warn hides info, errors keep their
// `mooring: CODE: message` line and exit status; and the progress reporter's throttling.
import { EventEmitter } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { runCli } from '../../../src/cli/cli.js';
import type { CliContext } from '../../../src/cli/common.js';
import { humanLine, takeLogFlags } from '../../../src/cli/log.js';
import { ProgressReporter, rebuildProgress } from '../../../src/cli/progress.js';
import type { Logger } from '../../../src/util/logger.js';
import { FakeAddon } from '../fakes/fake-addon.js';

interface Captured extends CliContext {
  out: string[];
  err: string[];
  signals: EventEmitter;
}

function context(addon: FakeAddon, cwd: string): Captured {
  const out: string[] = [];
  const err: string[] = [];
  return { out, err, signals: new EventEmitter(), addon, cwd, stdout: (t) => out.push(t), stderr: (t) => err.push(t), exit: () => undefined };
}

async function waitFor(what: string, pred: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** stderr as lines (each write may hold several). */
const linesOf = (err: string[]): string[] => err.join('').split('\n').filter((l) => l !== '');

describe('mooring CLI logging', () => {
  let root: string;
  let ctx: Captured;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-cli-log-'));
    ctx = context(new FakeAddon(), root);
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  // Serves a new volume until READY, then stops it; resolves to the exit status.
  async function serveOnce(extra: string[]): Promise<number> {
    const done = runCli(['serve', '--dir', 'v', '--size', '4M', '--replicas', '1', '--host-id', 'h1', ...extra], ctx);
    await waitFor('READY', () => ctx.out.some((l) => l.startsWith('READY ')));
    ctx.signals.emit('SIGTERM', 'SIGTERM');
    return done;
  }

  it('prints human lines by default', async () => {
    expect(await serveOnce([])).toBe(0);
    const lines = linesOf(ctx.err);
    expect(lines).toContain('mooring: volume v created (4 MiB, 1 replicas on h1)');
    expect(lines).toContainEqual(expect.stringMatching(/^mooring: serving v \(4 MiB, 1 replicas, healthy, writer epoch 1\) at nbd\+unix:/));
    expect(lines).toContain('mooring: SIGTERM: stopping the export (drain, flush) and detaching v');
    for (const l of lines) {
      expect(l).toMatch(/^mooring: /);
      expect(() => JSON.parse(l)).toThrow();
    }
    // stdout stays the contract: the READY line only.
    expect(ctx.out).toHaveLength(1);
  });

  it('--log-format json prints one JSON object per line, with level, msg and fields', async () => {
    expect(await serveOnce(['--log-format', 'json'])).toBe(0);
    const records = linesOf(ctx.err).map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(records.length).toBeGreaterThan(3);
    for (const r of records) {
      expect(['trace', 'debug', 'info', 'warn', 'error', 'fatal']).toContain(r.level);
      expect(typeof r.msg).toBe('string');
      expect(typeof r.time).toBe('string');
      expect(r.pid).toBe(process.pid);
    }
    // The library's records (component cluster) and the command's own.
    expect(records).toContainEqual(expect.objectContaining({ level: 'info', component: 'cluster', volume: 'v', sizeBytes: 4 << 20, msg: 'volume v created (4 MiB, 1 replicas on h1)' }));
    expect(records).toContainEqual(expect.objectContaining({ level: 'info', component: 'cluster', event: 'epoch-claimed', volume: 'v', hostId: 'h1', epoch: 1 }));
    expect(records).toContainEqual(expect.objectContaining({ level: 'info', volume: 'v', epoch: 1, state: 'healthy', msg: expect.stringMatching(/^serving v /) }));
    // The flag may come anywhere, also as --log-format=json.
    ctx.err.length = 0;
    expect(await runCli(['info', '--log-format=json', '--dir', 'missing'], ctx)).toBe(1);
    expect(linesOf(ctx.err).map((l) => JSON.parse(l))).toEqual([expect.objectContaining({ level: 'error', code: 'NOT_FOUND', msg: expect.stringContaining('missing') })]);
  });

  it('--log-level warn hides info lines but not errors; exit codes stay', async () => {
    expect(await serveOnce(['--log-level', 'warn'])).toBe(0);
    expect(ctx.err.join('')).toBe('');
    expect(await runCli(['serve', '--dir', 'w', '--log-level', 'warn'], ctx)).toBe(2);
    expect(ctx.err.join('')).toMatch(/^mooring: INVALID_ARGUMENT: .*--size is required to create one\nTry 'mooring serve --help'\.\n$/);
    ctx.err.length = 0;
    // Usage errors keep their hint and status 2, in JSON too.
    expect(await runCli(['serve', '--dir', 'w', '--bogus', '--log-format', 'json'], ctx)).toBe(2);
    expect(JSON.parse(ctx.err.join(''))).toMatchObject({ level: 'error', code: 'INVALID_ARGUMENT', hint: "Try 'mooring serve --help'." });
    // --log-level debug shows what info hides.
    ctx.err.length = 0;
    ctx.out.length = 0;
    expect(await runCli(['create', '--dir', 'd', '--size', '1M', '--log-level', 'debug'], ctx)).toBe(0);
    expect(linesOf(ctx.err)).toContainEqual(expect.stringMatching(/^mooring: debug: data engine \S+ started/));
  });

  it('short commands show the library only from warn, unless --log-level is given', async () => {
    expect(await runCli(['create', '--dir', 'c', '--size', '1M'], ctx)).toBe(0);
    expect(ctx.err.join('')).toBe('');
    expect(await runCli(['snapshot', 'create', '--dir', 'c', 's1', '--log-level', 'info'], ctx)).toBe(0);
    expect(linesOf(ctx.err)).toContainEqual(expect.stringMatching(/^mooring: host \S+: volume c: writer epoch 1 claimed$/));
  });

  it('refuses bad logging flags as usage errors', async () => {
    for (const argv of [
      ['info', '--log-format', 'xml'],
      ['info', '--log-level', 'loud'],
      ['info', '--log-level'],
      ['info', '--progress-interval-ms', '-1'],
    ]) {
      ctx.err.length = 0;
      expect(await runCli(argv, ctx), argv.join(' ')).toBe(2);
      expect(ctx.err.join(''), argv.join(' ')).toMatch(/^mooring: INVALID_ARGUMENT: --(log-format|log-level|progress-interval-ms) /);
    }
    expect(takeLogFlags('x', ['--no-progress', 'a', '--', '--log-level', 'x'])).toEqual({
      settings: expect.objectContaining({ progress: false, level: 'info' }),
      rest: ['a', '--', '--log-level', 'x'],
    });
  });

  it('formats records as human lines by level', () => {
    expect(humanLine({ level: 'info', msg: 'm' })).toBe('mooring: m\n');
    expect(humanLine({ level: 'warn', msg: 'm', code: 'IO_ERROR' })).toBe('mooring: warning: IO_ERROR: m\n');
    expect(humanLine({ level: 'warn', msg: 'm' })).toBe('mooring: warning: m\n');
    expect(humanLine({ level: 'error', msg: 'm', code: 'BUSY' })).toBe('mooring: BUSY: m\n');
    expect(humanLine({ level: 'debug', msg: 'm' })).toBe('mooring: debug: m\n');
    expect(humanLine({ level: 'error', msg: 'm', code: 'INVALID_ARGUMENT', hint: "Try 'mooring --help'." })).toBe("mooring: INVALID_ARGUMENT: m\nTry 'mooring --help'.\n");
  });
});

describe('ProgressReporter', () => {
  function recorder(): { log: Logger; got: Array<{ fields: Record<string, unknown>; msg: string }> } {
    const got: Array<{ fields: Record<string, unknown>; msg: string }> = [];
    const info = ((fields: Record<string, unknown>, msg: string) => void got.push({ fields, msg })) as Logger['info'];
    const none = (() => undefined) as Logger['info'];
    const log: Logger = { trace: none, debug: none, info, warn: none, error: none, fatal: none, child: () => log };
    return { log, got };
  }

  it('prints at most one line per interval, never a step back, and always a final 100% line', () => {
    const { log, got } = recorder();
    let now = 0;
    const p = new ProgressReporter(log, 'copy', { intervalMs: 1000, now: () => now, fields: { volume: 'v' } });
    const MiB = 1 << 20;
    now = 100;
    p.update(10 * MiB, 100 * MiB); // first: printed
    now = 500;
    p.update(20 * MiB, 100 * MiB); // within the interval: dropped
    now = 1200;
    p.update(30 * MiB, 100 * MiB); // printed
    now = 2300;
    p.update(30 * MiB, 100 * MiB); // no advance: dropped
    p.update(100 * MiB, 100 * MiB); // complete: left to finish()
    now = 2500;
    p.finish(100 * MiB, 100 * MiB);
    p.finish(100 * MiB, 100 * MiB); // once
    expect(got.map((g) => (g.fields.progress as { percent: number }).percent)).toEqual([10, 30, 100]);
    expect(got.map((g) => (g.fields.progress as { done: boolean }).done)).toEqual([false, false, true]);
    expect(got[0]).toEqual({
      fields: { volume: 'v', progress: { task: 'copy', doneBytes: 10 * MiB, totalBytes: 100 * MiB, percent: 10, bytesPerSecond: 100 * MiB, elapsedMs: 100, done: false } },
      msg: 'copy: 10% (10 MiB of 100 MiB, 100 MiB/s)',
    });
    expect(got[2]!.msg).toBe('copy: 100% (100 MiB of 100 MiB, 40 MiB/s), done in 2.5 s');
  });

  it('interval 0 prints every advance', () => {
    const { log, got } = recorder();
    let now = 0;
    const p = new ProgressReporter(log, 'copy', { intervalMs: 0, now: () => now });
    for (let i = 1; i < 4; i++) {
      now = i;
      p.update(i, 4);
    }
    p.finish(4, 4);
    expect(got.map((g) => (g.fields.progress as { percent: number }).percent)).toEqual([25, 50, 75, 100]);
  });
});

describe('rebuildProgress', () => {
  it('follows each rebuild from start to completion; a failed one ends without a final line', () => {
    const got: Array<{ fields: Record<string, unknown>; msg: string }> = [];
    const info = ((fields: Record<string, unknown>, msg: string) => void got.push({ fields, msg })) as Logger['info'];
    const none = (() => undefined) as Logger['info'];
    const log: Logger = { trace: none, debug: none, info, warn: none, error: none, fatal: none, child: () => log };
    const on = rebuildProgress(log, 0);
    const GiB = 1 << 30;
    const figures = (scanned: number) => ({ sentBytes: 0, scannedBytes: scanned, totalBytes: GiB });
    on('h1', { type: 'rebuild-started', volume: 'v', replicaId: 'r1', ...figures(0) });
    on('h1', { type: 'rebuild-started', volume: 'v', replicaId: 'r2', ...figures(0) });
    on('h1', { type: 'rebuild-progress', volume: 'v', replicaId: 'r1', ...figures(GiB / 4) });
    on('h1', { type: 'rebuild-progress', volume: 'v', replicaId: 'r2', ...figures(GiB / 2) });
    on('h1', { type: 'rebuild-failed', volume: 'v', replicaId: 'r2', code: 'UNAVAILABLE', message: 'gone', ...figures(GiB / 2) });
    on('h1', { type: 'epoch-claimed', volume: 'v', epoch: 3 });
    on('h1', { type: 'rebuild-progress', volume: 'v', replicaId: 'r1', ...figures((3 * GiB) / 4) });
    on('h1', { type: 'rebuild-completed', volume: 'v', replicaId: 'r1', ...figures(GiB) });
    expect(got.map((g) => g.msg.replace(/, [\d.]+ \S+\/s/, '').replace(/ in [\d.]+ s$/, ''))).toEqual([
      'rebuild of replica r1 of v: 25% (256 MiB of 1 GiB)',
      'rebuild of replica r2 of v: 50% (512 MiB of 1 GiB)',
      'rebuild of replica r1 of v: 75% (768 MiB of 1 GiB)',
      'rebuild of replica r1 of v: 100% (1 GiB of 1 GiB), done',
    ]);
    expect(got[3]!.fields).toMatchObject({ volume: 'v', hostId: 'h1', replicaId: 'r1', progress: { percent: 100, done: true } });
  });
});
