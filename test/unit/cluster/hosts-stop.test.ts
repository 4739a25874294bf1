// Hosts.stopEngine, the one way the control plane stops an engine: it waits for a stop as
// long as the host answers (a stop drains and flushes, and may take long), and gives up
// with UNAVAILABLE once the host stops answering (the data engine's own call would wait up
// to its 6 h deadline), so that a frozen or cut-off host holds no volume's turn.
import { describe, expect, it } from 'vitest';

import type { DataEngine } from '../../../src/data-engine/data-engine.js';
import { HOST_PROBE_TIMEOUT_MS, Hosts, STOP_LIVENESS_INTERVAL_MS } from '../../../src/cluster/hosts.js';
import { MooringError } from '../../../src/errors.js';
import { controlFixture } from './control-fixture.js';

const never = <T>(): Promise<T> => new Promise<T>(() => undefined);

// A data engine whose stop and info are what the test says.
function stub(o: { stop: () => Promise<void>; info: () => Promise<unknown> }): DataEngine {
  return { watch: () => () => undefined, stopEngine: o.stop, info: o.info } as unknown as DataEngine;
}

describe('Hosts.stopEngine', () => {
  it('gives up with UNAVAILABLE when the host stops answering during the stop, and counts it as unanswered', async () => {
    let answering = false;
    const hosts = new Hosts(() => undefined);
    hosts.set('a', stub({ stop: never, info: () => (answering ? Promise.resolve({}) : never()) }));
    const t0 = Date.now();
    const err = await hosts.stopEngine('a', 'v1').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(MooringError);
    expect((err as MooringError).code).toBe('UNAVAILABLE');
    expect((err as MooringError).message).toMatch(/host a stopped answering while stopping the engine of v1/);
    // One interval and one probe timeout, not the data engine call's deadline.
    expect(Date.now() - t0).toBeLessThan(STOP_LIVENESS_INTERVAL_MS + HOST_PROBE_TIMEOUT_MS + 5000);
    answering = true;
    expect((await hosts.answeringAgain()).map((b) => b.hostId)).toEqual(['a']);
  }, 20_000);

  it('waits for a stop longer than a probe while the host answers, and passes its failure on', async () => {
    const hosts = new Hosts(() => undefined);
    let probes = 0;
    const info = () => (probes++, Promise.resolve({}));
    hosts.set('a', stub({ stop: () => new Promise((r) => setTimeout(r, HOST_PROBE_TIMEOUT_MS + 2 * STOP_LIVENESS_INTERVAL_MS)), info }));
    await hosts.stopEngine('a', 'v1');
    expect(probes).toBeGreaterThanOrEqual(2);
    hosts.set('b', stub({ stop: () => Promise.reject(new MooringError('NOT_FOUND', 'no engine of v1')), info }));
    await expect(hosts.stopEngine('b', 'v1')).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(hosts.stopEngine('c', 'v1')).rejects.toMatchObject({ code: 'UNAVAILABLE' });
  }, 20_000);

  it('a migration confirms while its source host is frozen: the fenced source engine is left to the repair loop', async () => {
    const f = await controlFixture();
    const v = await f.newVolume('migratable');
    await f.attachment.attach(v, { host: 'a', nbd: 'unix:/run/a.sock' });
    await f.state.serial(v, () => f.migrations.checkMigratable(v, 'b'));
    await f.attachment.attach(v, { host: 'b', nbd: 'unix:/run/b.sock' });
    await f.state.serial(v, () => f.migrations.handOver(v));
    // Host a freezes: its calls never answer.
    const a = f.fakes[0]!;
    a.stopEngine = never;
    a.info = never;
    await f.state.serial(v, () => f.migrations.confirm(v, false));
    expect(await f.migrations.current(v)).toBeNull();
    expect((await f.state.engineRecord(v))?.hostId).toBe('b');
    expect(f.eventNames()).toContain('migration-confirmed');
  }, 20_000);
});
