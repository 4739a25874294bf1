// Mooring option engineIoTimeoutMs: every engine the cluster starts (attach, migration
// standby) gets it as its remote-replica I/O timeout; without it the data engine's default
// applies; out-of-range values are refused.
import { afterEach, describe, expect, it, vi } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import type { EngineStartOptions } from '../../../src/data-engine/data-engine.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

describe('Mooring engineIoTimeoutMs', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const c of open.splice(0)) await c.close();
    vi.restoreAllMocks();
  });

  async function setup(engineIoTimeoutMs?: number): Promise<{ cluster: Mooring; starts: EngineStartOptions[] }> {
    const starts: EngineStartOptions[] = [];
    const real = FakeDataEngine.prototype.startEngine;
    vi.spyOn(FakeDataEngine.prototype, 'startEngine').mockImplementation(function (this: FakeDataEngine, o: EngineStartOptions) {
      starts.push(o);
      return real.call(this, o);
    });
    const hosts = ['a', 'b', 'c'].map((id) => new FakeDataEngine(id));
    const cluster = await Mooring.open({ store: new MemoryStateStore(), hosts, repairIntervalMs: 0, ...(engineIoTimeoutMs !== undefined ? { engineIoTimeoutMs } : {}) });
    open.push(cluster);
    return { cluster, starts };
  }

  it('passes the timeout to every engine it starts, the standby of a migration too', async () => {
    const { cluster, starts } = await setup(750);
    await cluster.createVolume({ name: 'v', sizeBytes: 4096 * 16, accessMode: 'migratable' });
    await cluster.volume('v').attach({ host: 'a', nbd: 'unix:/tmp/v-a.sock' });
    await cluster.volume('v').migrate('b', { nbd: 'unix:/tmp/v-b.sock' });
    expect(starts.map((s) => [s.volume, s.standby === true, s.ioTimeoutMs])).toEqual([
      ['v', false, 750],
      ['v', true, 750],
    ]);
  });

  it('leaves it to the data engine when not set, and refuses values out of range', async () => {
    const { cluster, starts } = await setup();
    await cluster.createVolume({ name: 'v', sizeBytes: 4096 * 16 });
    await cluster.volume('v').attach({ host: 'a' });
    expect(starts).toHaveLength(1);
    expect(starts[0]!.ioTimeoutMs).toBeUndefined();
    for (const bad of [0, 99, 600_001, 1.5]) {
      await expect(Mooring.open({ store: new MemoryStateStore(), engineIoTimeoutMs: bad })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    }
  });
});
