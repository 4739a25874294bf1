// LocalEngine's salvage start (EngineOptions.salvage, docs/salvage.md) through the real
// addon: over the lone survivor of three replicas, the normal open is NO_QUORUM; the salvage
// open serves the data and reports `salvaged` with the source named by its spec id.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { LocalEngine, type SalvagedEvent } from '../../src/engine/engine.js';
import { MiB, Scratch, codeOf, createReplicas, nextEpoch, pattern, waitFor } from './helpers.js';

const A = pattern(91, MiB);

/** The `salvaged` events of an engine: those kept while it opened, then those emitted. */
function salvagedEvents(engine: LocalEngine): SalvagedEvent[] {
  const got: SalvagedEvent[] = engine.openEvents.flatMap(({ type, ...e }) => (type === 'salvaged' ? [e as SalvagedEvent] : []));
  engine.on('salvaged', (e) => got.push(e));
  return got;
}

describe('LocalEngine salvage start', () => {
  let s: Scratch;
  beforeAll(() => {
    s = new Scratch('mooring-engine-salvage-');
  });
  afterAll(() => s.cleanup());

  it('serves the lone survivor of three replicas and reports it as the source, not complete', async () => {
    // Spec ids unlike the directories, so the event's id is shown to be mapped, not passed through.
    const replicas = (await createReplicas(s.path('survivor'), 3, 4 * MiB)).map((r) => ({ id: `disk-${r.id}`, path: r.path }));
    const first = await LocalEngine.open({ replicas, epoch: nextEpoch() });
    await first.write(0, A);
    const firstEpoch = first.epoch;
    await first.close();
    const survivor = [replicas[2]!];
    expect(await codeOf(LocalEngine.open({ replicas: survivor, epoch: nextEpoch() }))).toBe('NO_QUORUM');
    const engine = await LocalEngine.open({ replicas: survivor, epoch: nextEpoch(), salvage: true });
    try {
      const events = salvagedEvents(engine);
      expect(engine.replicas().map((r) => [r.id, r.mode])).toEqual([['disk-r2', 'RW']]);
      expect((await engine.read(0, MiB)).equals(A)).toBe(true);
      await waitFor('the salvaged event', () => events.length > 0);
      expect(events).toEqual([{ replicaId: 'disk-r2', lastRw: { epoch: firstEpoch, generation: 1 }, complete: false, message: expect.stringMatching(/may be missing/) }]);
    } finally {
      await engine.close();
    }
  });

  it('refuses a salvage that is not a boolean, or with standby, before touching a replica', async () => {
    const replicas = await createReplicas(s.path('bad'), 1, MiB);
    for (const salvage of ['yes', 1, null]) {
      const err = await LocalEngine.open({ replicas, epoch: nextEpoch(), salvage: salvage as never }).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/salvage must be a boolean/) });
    }
    expect(await codeOf(LocalEngine.open({ replicas, standby: true, salvage: true }))).toBe('INVALID_ARGUMENT');
  });
});
