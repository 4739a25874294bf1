// The migration controller alone (started through the attachment controller, as tickets
// start it): the standby on the target, the hand-over that moves the writer with a higher
// epoch, confirm and rollback, hooks in order, and recovery of a hand-over a crash
// interrupted, over the shared state layer and fake data engines.
import { describe, expect, it } from 'vitest';

import { FakeDataEngine } from '../fakes/fake-data-engine.js';
import { controlFixture } from './control-fixture.js';

describe('MigrationController', () => {
  async function migrating() {
    const f = await controlFixture();
    const v = await f.newVolume('migratable');
    await f.attachment.attach(v, { host: 'a', nbd: 'unix:/run/a.sock' });
    await f.state.serial(v, () => f.migrations.checkMigratable(v, 'b'));
    await f.attachment.attach(v, { host: 'b', nbd: 'unix:/run/b.sock' });
    return { ...f, v };
  }

  it('starts a standby on the target, hands the writer over with a higher epoch, and confirms', async () => {
    const { fakes, state, migrations, attachment, eventNames, v } = await migrating();
    expect(await migrations.current(v)).toMatchObject({ sourceHost: 'a', targetHost: 'b', phase: 'target-ready' });
    expect(fakes[1]!.engines.get(v)?.role).toBe('standby');
    const calls: string[] = [];
    migrations.setHooks(v, { beforeHandOver: () => void calls.push('before'), afterHandOver: () => void calls.push('after'), afterConfirm: () => void calls.push('confirmed') }, null);
    const before = FakeDataEngine.epochOf(v);
    const ho = await state.serial(v, () => migrations.handOver(v));
    expect(ho.epoch).toBeGreaterThan(before);
    expect(fakes[1]!.engines.get(v)).toMatchObject({ role: 'active', epoch: ho.epoch });
    expect(fakes[0]!.engines.get(v)?.role).toBe('standby');
    await state.serial(v, async () => {
      await migrations.confirm(v, false);
      await attachment.converge(v);
    });
    expect(fakes[0]!.engines.has(v)).toBe(false);
    expect(await migrations.current(v)).toBeNull();
    expect((await state.engineRecord(v))?.hostId).toBe('b');
    expect(calls).toEqual(['before', 'after', 'confirmed']);
    expect(eventNames().filter((e) => String(e).startsWith('migration-'))).toEqual(['migration-started', 'migration-target-ready', 'migration-handed-over', 'migration-confirmed']);
  });

  it('rolls back after the hand-over: the source writes again with a newer epoch than the target had', async () => {
    const { fakes, state, migrations, v } = await migrating();
    const ho = await state.serial(v, () => migrations.handOver(v));
    await state.serial(v, () => migrations.rollback(v, false, 'test'));
    expect(fakes[1]!.engines.has(v)).toBe(false);
    expect(fakes[0]!.engines.get(v)).toMatchObject({ role: 'active' });
    expect(fakes[0]!.engines.get(v)!.epoch).toBeGreaterThan(ho.epoch);
    expect(await migrations.current(v)).toBeNull();
  });

  it('a beforeHandOver hook that throws stops the hand-over and the source keeps writing', async () => {
    const { fakes, state, migrations, v } = await migrating();
    migrations.setHooks(v, { beforeHandOver: () => { throw new Error('QEMU said no'); } }, null);
    await expect(state.serial(v, () => migrations.handOver(v))).rejects.toThrow(/QEMU said no/);
    expect(fakes[0]!.engines.get(v)?.role).toBe('active');
    expect((await migrations.current(v))?.phase).toBe('target-ready');
    expect(() => migrations.setHooks(v, 42 as never, null)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
  });

  it('recovers a hand-over a crash interrupted after the source drained: the source takes the writer back', async () => {
    const { fakes, state, migrations, v } = await migrating();
    const m = (await state.migrationRecord(v))!;
    // The crash: the source drained and handed over, the record says so, the target never activated.
    const ho = await fakes[0]!.deactivateEngine(v);
    await state.putMigration({ ...m, phase: 'handing-over', handOver: { epoch: ho.epoch, generation: ho.generation, rwReplicaIds: [...ho.rwReplicaIds] } });
    const changed = await state.serial(v, async () => migrations.recover(await state.observe(v)));
    expect(changed).toBe(true);
    expect(fakes[0]!.engines.get(v)).toMatchObject({ role: 'active' });
    expect(fakes[0]!.engines.get(v)!.epoch).toBeGreaterThan(ho.epoch);
    expect((await migrations.current(v))?.phase).toBe('target-ready');
  });
});
