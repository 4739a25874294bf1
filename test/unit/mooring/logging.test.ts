// The `logger` option (docs/logging.md): a pino logger passed to Mooring.open receives
// levelled records with structured fields for real operations (create, attach, a replica
// fault, a background warning, detach, delete), from a child per component; a bad logger is
// refused; without one nothing is logged anywhere.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import type { Logger } from '../../../src/index.js';
import { Mooring } from '../../../src/mooring.js';
import { checkLogger, silentLogger } from '../../../src/util/logger.js';
import { FakeAddon } from '../fakes/fake-addon.js';

const MiB = 1024 * 1024;

interface Rec {
  level: number;
  msg: string;
  component?: string;
  [k: string]: unknown;
}

/** A real pino logger at `level` whose records land in `records` (parsed). */
function capturing(level = 'trace'): { logger: Logger; records: Rec[] } {
  const records: Rec[] = [];
  const logger = pino({ level }, { write: (line: string) => void records.push(JSON.parse(line) as Rec) });
  return { logger, records };
}

const LEVEL = { trace: 10, debug: 20, info: 30, warn: 40, error: 50, fatal: 60 } as const;

async function waitFor(what: string, pred: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('Mooring logger option', () => {
  let root: string;
  let addon: FakeAddon;
  const open: Mooring[] = [];

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-logging-'));
    addon = new FakeAddon();
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((m) => m.close()));
    await rm(root, { recursive: true, force: true });
  });

  it('logs create, attach, a replica fault, a warning, detach and delete with levels and fields', async () => {
    const { logger, records } = capturing();
    const m = await Mooring.open({ dir: join(root, 'm'), hostId: 'h1', repairIntervalMs: 0, dataEngine: { addon, replicaListen: null }, logger });
    open.push(m);
    // The in-process data engine logs through a child of the same logger.
    expect(records).toContainEqual(expect.objectContaining({ level: LEVEL.debug, component: 'data-engine', hostId: 'h1', msg: expect.stringMatching(/^data engine h1 started/) }));

    const v = await m.createVolume({ name: 'v', sizeBytes: 4 * MiB });
    expect(records).toContainEqual(
      expect.objectContaining({ level: LEVEL.info, component: 'cluster', volume: 'v', sizeBytes: 4 * MiB, replicas: 1, hostIds: ['h1'], msg: 'volume v created (4 MiB, 1 replicas on h1)' }),
    );

    await v.attach({});
    expect(records).toContainEqual(expect.objectContaining({ level: LEVEL.info, component: 'cluster', volume: 'v', hostId: 'h1', epoch: 1, msg: 'volume v attached on h1 (writer epoch 1)' }));
    // Data-engine events come through as records of their own, with the event's fields.
    expect(records).toContainEqual(expect.objectContaining({ level: LEVEL.info, event: 'epoch-claimed', volume: 'v', hostId: 'h1', epoch: 1, msg: 'host h1: volume v: writer epoch 1 claimed' }));

    // A replica fault is an error record naming the volume, host and replica.
    const dir = addon.engine.replicaDirs[0]!;
    addon.engine.failReplica(dir, 5);
    await waitFor('the replica-error record', () => records.some((r) => r.event === 'replica-error'));
    const fault = records.find((r) => r.event === 'replica-error')!;
    expect(fault).toMatchObject({ level: LEVEL.error, component: 'cluster', volume: 'v', hostId: 'h1', replicaId: expect.any(String), errno: expect.any(Number) });
    expect(fault.msg).toMatch(/^host h1: volume v: replica \S+ failed \(errno \d+\): I\/O error/);

    // A background failure is a warn record with its code (the same as the `warning` event).
    const warnings: string[] = [];
    m.on('warning', (e) => warnings.push(e.code));
    const unreachable = { hostId: 'h2', watch: () => () => undefined, info: () => Promise.reject(Object.assign(new Error('connection refused'), { code: 'UNAVAILABLE' })) };
    await m.addHost(unreachable as never);
    expect(warnings).toHaveLength(1);
    expect(records).toContainEqual(expect.objectContaining({ level: LEVEL.warn, component: 'cluster', code: warnings[0], msg: expect.stringContaining('host h2 did not answer when added') }));

    await v.detach({ host: 'h1' });
    expect(records).toContainEqual(expect.objectContaining({ level: LEVEL.info, volume: 'v', hostId: 'h1', msg: 'volume v detached from h1' }));
    await m.deleteVolume('v');
    expect(records).toContainEqual(expect.objectContaining({ level: LEVEL.info, volume: 'v', msg: 'volume v deleted' }));
    // Every record is levelled and has a message.
    for (const r of records) {
      expect(Object.values(LEVEL)).toContain(r.level);
      expect(typeof r.msg).toBe('string');
    }
  });

  it('respects the logger level: an info logger gets no debug records', async () => {
    const { logger, records } = capturing('info');
    const m = await Mooring.open({ dir: join(root, 'm'), hostId: 'h1', repairIntervalMs: 0, dataEngine: { addon, replicaListen: null }, logger });
    open.push(m);
    await m.createVolume({ name: 'v', sizeBytes: 4 * MiB });
    expect(records.some((r) => r.msg.startsWith('volume v created'))).toBe(true);
    expect(records.filter((r) => r.level < LEVEL.info)).toEqual([]);
  });

  it('gives the in-process data engine its own logger when dataEngine.logger is set', async () => {
    const main = capturing();
    const engine = capturing();
    const m = await Mooring.open({ dir: join(root, 'm'), hostId: 'h1', repairIntervalMs: 0, dataEngine: { addon, replicaListen: null, logger: engine.logger }, logger: main.logger });
    open.push(m);
    expect(engine.records).toContainEqual(expect.objectContaining({ msg: expect.stringMatching(/^data engine h1 started/) }));
    expect(main.records.some((r) => r.component === 'data-engine')).toBe(false);
  });

  it('refuses something that is not a logger', async () => {
    for (const logger of [null, 'pino', {}, { info: () => undefined }, { ...silentLogger, child: 1 }]) {
      await expect(Mooring.open({ dir: join(root, 'm'), hostId: 'h1', dataEngine: { addon, replicaListen: null }, logger: logger as never })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: expect.stringMatching(/logger must be a logger such as pino's/),
      });
    }
    expect(checkLogger('logger', undefined)).toBe(silentLogger);
  });

  it('an adapter over another logger works: only the six levels and child() are used', async () => {
    const lines: string[] = [];
    const adapter = (bindings: Record<string, unknown>): Logger => {
      const at =
        (level: string) =>
        (fields: Record<string, unknown> | string, msg?: string): void =>
          void lines.push(`${level} ${JSON.stringify({ ...bindings, ...(typeof fields === 'object' ? fields : {}) })} ${typeof fields === 'string' ? fields : msg}`);
      return { trace: at('trace'), debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error'), fatal: at('fatal'), child: (b) => adapter({ ...bindings, ...b }) };
    };
    const m = await Mooring.open({ dir: join(root, 'm'), hostId: 'h1', repairIntervalMs: 0, dataEngine: { addon, replicaListen: null }, logger: adapter({ app: 'vmm' }) });
    open.push(m);
    await m.createVolume({ name: 'v', sizeBytes: 4 * MiB });
    expect(lines).toContainEqual(expect.stringMatching(/^info \{"app":"vmm","component":"cluster","volume":"v".*\} volume v created/));
  });
});
