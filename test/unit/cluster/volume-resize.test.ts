// Resize (grow) in the control plane alone, over the shared state layer and fake data
// engines (which keep each replica's recorded size and follow the real engine's size rule):
// an attached volume grows through its engine, a detached one under a volume-expansion
// ticket (attached without frontend for the grow, detached after); the
// record is written first, so a grow that fails or is cut short is finished by the next
// resize or the next attach; volumes only grow, and not while migrating; replacements and
// rebuilt replicas get the new size.
import { describe, expect, it } from 'vitest';

import { VolumeResize } from '../../../src/cluster/volume-resize.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';
import { SIZE, controlFixture } from './control-fixture.js';

async function fixture(hostIds?: string[]) {
  const f = await controlFixture(hostIds);
  const resize = new VolumeResize(f.state, f.attachment);
  const sizes = async (v: string): Promise<Array<number | undefined>> => (await f.state.replicas(v)).map((r) => FakeDataEngine.replicaSize(r.name));
  const recorded = async (v: string): Promise<number> => (await f.state.volume(v)).sizeBytes;
  const resizedEvents = () => f.events.filter((e) => e[0] === 'resized');
  return { ...f, resize, sizes, recorded, resizedEvents };
}

describe('VolumeResize', () => {
  it('grows an attached volume through its engine: every replica, the engine, the record; emits resized', async () => {
    const { fakes, state, attachment, resize, newVolume, sizes, recorded, resizedEvents } = await fixture();
    const v = await newVolume();
    await attachment.attach(v, { host: 'a' });
    expect(await resize.resize(v, 4 * SIZE)).toEqual({ volume: v, oldSizeBytes: SIZE, newSizeBytes: 4 * SIZE });
    expect(fakes[0]!.calls).toContain(`resizeEngine ${v} ${4 * SIZE}`);
    expect((await fakes[0]!.engineInfo(v)).sizeBytes).toBe(4 * SIZE);
    expect(await sizes(v)).toEqual([4 * SIZE, 4 * SIZE, 4 * SIZE]);
    expect(await recorded(v)).toBe(4 * SIZE);
    expect(resizedEvents()).toEqual([['resized', v, { volume: v, oldSizeBytes: SIZE, newSizeBytes: 4 * SIZE }]]);
    // The same size again: nothing grows, nothing is emitted.
    await resize.resize(v, 4 * SIZE);
    expect(resizedEvents()).toHaveLength(1);
    expect((await state.engineRecord(v))?.hostId).toBe('a');
  });

  it('refuses to shrink, sizes that are not whole blocks, and volumes that are migrating; nothing changes', async () => {
    const { fakes, attachment, resize, newVolume, sizes, recorded, resizedEvents } = await fixture();
    const v = await newVolume();
    await attachment.attach(v, { host: 'a' });
    await expect(resize.resize(v, SIZE / 2)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/only grow/) });
    await expect(resize.resize(v, SIZE + 512)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(resize.resize(v, 0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(resize.resize('nope', 2 * SIZE)).rejects.toMatchObject({ code: 'NOT_FOUND' });
    expect(fakes[0]!.calls.some((c) => c.startsWith('resizeEngine'))).toBe(false);

    const m = await newVolume('migratable');
    await attachment.attach(m, { host: 'a', nbd: 'unix:/run/a.sock' });
    await attachment.attach(m, { host: 'b', nbd: 'unix:/run/b.sock' }); // a second host: a migration starts
    await expect(resize.resize(m, 2 * SIZE)).rejects.toMatchObject({ code: 'INVALID_STATE', message: expect.stringMatching(/migrating/) });
    expect(await recorded(m)).toBe(SIZE);
    expect(await sizes(m)).toEqual([SIZE, SIZE, SIZE]);
    expect(resizedEvents()).toEqual([]);
  });

  it('grows a detached volume under a volume-expansion ticket: attached without frontend for the grow, detached after', async () => {
    const { fakes, state, resize, newVolume, sizes, resizedEvents } = await fixture();
    const v = await newVolume();
    const tickets: string[] = [];
    const engines: Array<{ nbd: string | null } | null> = [];
    fakes[0]!.onResize = async () => {
      tickets.push(...(await state.observe(v)).att.tickets.map((t) => t.type));
      const eng = await state.engineRecord(v);
      engines.push(eng ? { nbd: eng.nbd } : null);
    };
    expect(await resize.resize(v, 2 * SIZE)).toEqual({ volume: v, oldSizeBytes: SIZE, newSizeBytes: 2 * SIZE });
    // Attached on the first replica host for the grow, under its own ticket, without export.
    expect(fakes[0]!.calls.filter((c) => /^(startEngine|resizeEngine|stopEngine) /.test(c))).toEqual([`startEngine ${v}`, `resizeEngine ${v} ${2 * SIZE}`, `stopEngine ${v}`]);
    expect(tickets).toEqual(['volume-expansion']);
    expect(engines).toEqual([{ nbd: null }]);
    expect(await state.engineRecord(v), 'detached again').toBeNull();
    expect((await state.observe(v)).att.tickets).toEqual([]);
    expect(await sizes(v)).toEqual([2 * SIZE, 2 * SIZE, 2 * SIZE]);
    expect(resizedEvents()).toEqual([['resized', v, { volume: v, oldSizeBytes: SIZE, newSizeBytes: 2 * SIZE }]]);

  });

  it('attaches nothing for a resize it refuses', async () => {
    const { fakes, resize, newVolume } = await fixture();
    const v = await newVolume();
    await expect(resize.resize(v, SIZE - 4096)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    for (const f of fakes) expect(f.calls.filter((c) => c.startsWith('startEngine'))).toEqual([]);
  });

  it('records the size first: a grow that fails is finished by resizing again, or by the next attach', async () => {
    const { fakes, attachment, resize, newVolume, sizes, recorded, resizedEvents } = await fixture();
    const v = await newVolume();
    await attachment.attach(v, { host: 'a' });
    fakes[0]!.failResize = 'IO_ERROR';
    await expect(resize.resize(v, 2 * SIZE)).rejects.toMatchObject({ code: 'IO_ERROR' });
    expect(await recorded(v), 'the wanted size is recorded before the data grows').toBe(2 * SIZE);
    expect((await fakes[0]!.engineInfo(v)).sizeBytes).toBe(SIZE);
    expect(resizedEvents()).toEqual([]);
    fakes[0]!.failResize = null;
    await resize.resize(v, 2 * SIZE); // the same size finishes it
    expect((await fakes[0]!.engineInfo(v)).sizeBytes).toBe(2 * SIZE);
    expect(resizedEvents()).toEqual([['resized', v, { volume: v, oldSizeBytes: SIZE, newSizeBytes: 2 * SIZE }]]);

    // Cut short again (the cluster's process died after the record); the next engine's start
    // brings the volume to the recorded size.
    fakes[0]!.failResize = 'UNAVAILABLE';
    await expect(resize.resize(v, 3 * SIZE)).rejects.toMatchObject({ code: 'UNAVAILABLE' });
    fakes[0]!.failResize = null;
    await attachment.detach(v, {});
    await attachment.attach(v, { host: 'b' });
    expect((await fakes[1]!.engineInfo(v)).sizeBytes).toBe(3 * SIZE);
    expect(fakes[1]!.calls).toContain(`resizeEngine ${v} ${3 * SIZE}`);
    expect(await sizes(v)).toEqual([3 * SIZE, 3 * SIZE, 3 * SIZE]);
    expect(resizedEvents().at(-1)).toEqual(['resized', v, { volume: v, oldSizeBytes: 2 * SIZE, newSizeBytes: 3 * SIZE }]);
  });

  it('follows replicas that recorded more than the volume record: data is never cut off', async () => {
    const { attachment, state, newVolume, recorded, resizedEvents } = await fixture();
    const v = await newVolume();
    // A replica grown behind the cluster's back (an embedder driving a data engine itself).
    FakeDataEngine.setReplicaSize((await state.replicas(v))[1]!.name, 2 * SIZE);
    await attachment.attach(v, { host: 'a' });
    expect(await recorded(v)).toBe(2 * SIZE);
    expect(resizedEvents()).toEqual([['resized', v, { volume: v, oldSizeBytes: SIZE, newSizeBytes: 2 * SIZE }]]);
  });

  it('creates a replacement replica at the new size', async () => {
    const { fakes, state, attachment, repair, resize, newVolume, sizes } = await fixture(['a', 'b', 'c', 'd']);
    const v = await newVolume('rwo', ['a', 'b', 'c']);
    await attachment.attach(v, { host: 'a' });
    await resize.resize(v, 2 * SIZE);
    fakes[0]!.setMode(v, 'r1', 'ERR');
    await state.serial(v, async () => repair.repair((await state.engineRecord(v))!));
    expect(fakes[3]!.calls.find((c) => c.startsWith('createReplica'))).toBeDefined();
    expect((await state.replicas(v)).map((r) => r.id)).toEqual(['r0', 'r2', 'r3']);
    expect(await sizes(v)).toEqual([2 * SIZE, 2 * SIZE, 2 * SIZE]);
    const created = [...fakes[3]!.replicas.values()][0]!;
    expect(created.sizeBytes, 'created at the recorded size, not rebuilt up to it').toBe(2 * SIZE);
  });
});
