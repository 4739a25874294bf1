// The attachment controller alone, over the shared state layer and fake data engines:
// tickets decide where the engine runs, each start gets a newly allocated epoch, a volume
// whose host cannot be reached is taken over, an operation's own ticket attaches a detached
// volume without frontend and leaves nothing behind, and a withdrawn ticket detaches.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';

import { KIND } from '../../../src/cluster/cluster-records.js';
import { UPGRADE_KIND, UPGRADE_SCHEMA_VERSION } from '../../../src/upgrade/upgrade-records.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';
import { controlFixture } from './control-fixture.js';

describe('AttachmentController', () => {
  it('starts the engine where the ticket asks, with an allocated epoch, and records it', async () => {
    const { fakes, store, attachment, newVolume } = await controlFixture();
    const v = await newVolume();
    const st = await attachment.attach(v, { host: 'b', nbd: 'unix:/run/b.sock' });
    expect(st).toMatchObject({ attachedHost: 'b', writerHost: 'b', state: 'healthy', nbd: { address: 'unix:/run/b.sock' } });
    expect(fakes[1]!.engines.get(v)).toMatchObject({ role: 'active', epoch: st.epoch });
    expect(FakeDataEngine.epochsGivenFor(v).map((e) => [e.hostId, e.call, e.epoch])).toEqual([['b', 'startEngine', 1]]);
    expect((await store.get<{ hostId: string }>(KIND.engine, v))?.value.hostId).toBe('b');
    const [t] = await attachment.tickets(v);
    expect(t).toMatchObject({ id: 'api-b', hostId: 'b', status: { satisfied: true } });
    await expect(attachment.attach(v, { host: 'a' })).rejects.toMatchObject({ code: 'BUSY', details: { attachedHost: 'b' } });
  });

  it('takes a volume over from a host that cannot be reached, with a higher epoch, and says so', async () => {
    const { fakes, events, attachment, newVolume } = await controlFixture();
    const v = await newVolume();
    const first = await attachment.attach(v, { host: 'a' });
    fakes[0]!.reachable = false;
    const st = await attachment.attach(v, { host: 'c' });
    expect(st.attachedHost).toBe('c');
    expect(st.epoch).toBeGreaterThan(first.epoch);
    expect(events).toContainEqual(['engine-taken-over', { volume: v, fromHost: 'a', toHost: 'c', epoch: st.epoch }]);
    // The old host's ticket went with it.
    expect((await attachment.tickets(v)).map((t) => t.id)).toEqual(['api-c']);
  });

  it('leaves an engine alone while an upgrade replaces its host\'s process (it is between the old process and the new)', async () => {
    const { fakes, store, attachment, newVolume } = await controlFixture();
    const v = await newVolume('rwo', ['a', 'b', 'c']);
    const st = await attachment.attach(v, { host: 'a', nbd: 'unix:/run/a.sock' });
    const hostUpgrade = (state: string) => ({
      schema: UPGRADE_SCHEMA_VERSION, session: randomUUID(), hostId: 'a', state, method: 'in-place', methodReason: 'test',
      instanceBefore: null, versionBefore: null, versionAfter: null, volumes: {}, error: null, startedMs: null, doneMs: null,
    });
    // The old process stopped the engine for the hand-off; the successor has not started it yet.
    await store.put(UPGRADE_KIND.host, 'a', hostUpgrade('switching-over'));
    fakes[0]!.engines.delete(v);
    await attachment.converge(v);
    expect((await store.get<{ hostId: string; epoch: number }>(KIND.engine, v))?.value).toMatchObject({ hostId: 'a', epoch: st.epoch });
    expect(FakeDataEngine.epochsGivenFor(v).map((e) => e.call)).toEqual(['startEngine']);
    // In any other step (a restart's switching-back relies on it), an engine that stopped is started again.
    await store.put(UPGRADE_KIND.host, 'a', hostUpgrade('switching-back'));
    await attachment.converge(v);
    expect(fakes[0]!.engines.get(v)?.epoch).toBeGreaterThan(st.epoch);
  });

  it("holds an operation's own ticket: a detached volume attaches without frontend for it, then detaches", async () => {
    const { fakes, store, state, attachment, newVolume } = await controlFixture();
    const v = await newVolume('rwo', ['a', 'b', 'c']);
    const host = await attachment.operationHost(v, undefined);
    expect(host).toBe('a');
    const seen = await attachment.withTicket(v, 'snapshot', host, async (writer) => {
      const e = fakes[0]!.engines.get(v);
      return { writer, nbd: e?.nbd, tickets: (await attachment.tickets(v)).map((t) => [t.type, t.parameters.disableFrontend, t.heldBy]) };
    });
    expect(seen).toEqual({ writer: 'a', nbd: null, tickets: [['snapshot', 'true', state.instanceId]] });
    expect(fakes[0]!.engines.has(v)).toBe(false);
    expect(await store.get(KIND.engine, v)).toBeNull();
    expect(await attachment.tickets(v)).toEqual([]);
  });

  it("withdraws an operation's ticket that another control plane left behind (it died or lost the lead midway), and no other", async () => {
    const { fakes, store, state, events, attachment, newVolume } = await controlFixture();
    const v = await newVolume('rwo', ['a', 'b', 'c']);
    await attachment.attach(v, { host: 'b' });
    // As a killed leader leaves it: its snapshot ticket in the record, beside the embedder's
    // own ticket of an operation type (no holder: it stays until the embedder withdraws it).
    const att = await store.get<{ tickets: unknown[] }>(KIND.attachment, v);
    const left = { id: 'snapshot-dead0001', type: 'snapshot', hostId: 'b', parameters: { disableFrontend: 'any', lastAttachedBy: null, nbd: null }, generation: 1, heldBy: 'gone-instance' };
    const mine = { id: 'backup-tool', type: 'backup', hostId: 'b', parameters: { disableFrontend: 'any', lastAttachedBy: null, nbd: null }, generation: 1 };
    await store.put(KIND.attachment, v, { ...att!.value, tickets: [...att!.value.tickets, left, mine] });
    await attachment.converge(v);
    expect((await attachment.tickets(v)).map((t) => t.id).sort()).toEqual(['api-b', 'backup-tool']);
    expect(events).toContainEqual(['warning', expect.objectContaining({ code: 'INVALID_STATE', details: expect.objectContaining({ ticketId: 'snapshot-dead0001', heldBy: 'gone-instance' }) })]);
    // With the embedder's tickets withdrawn too, the volume detaches: nothing keeps it attached.
    await attachment.detach(v, {});
    await attachment.deleteTicket(v, 'backup-tool');
    expect(fakes[1]!.engines.has(v)).toBe(false);
    expect(await store.get(KIND.engine, v)).toBeNull();
    // A ticket this control plane holds is its own operation's: kept while the operation runs.
    const kept = await attachment.withTicket(v, 'snapshot', 'a', async () => {
      await attachment.converge(v);
      return (await attachment.tickets(v)).map((t) => t.heldBy);
    });
    expect(kept).toEqual([state.instanceId]);
  });

  it('detaches when the last ticket is withdrawn, and a detach of nothing is harmless', async () => {
    const { fakes, attachment, newVolume } = await controlFixture();
    const v = await newVolume();
    await attachment.attach(v, { host: 'a', attacher: 'workload' });
    await attachment.detach(v, { host: 'b' });
    expect(fakes[0]!.engines.has(v)).toBe(true);
    await attachment.detach(v, { host: 'a' });
    expect(fakes[0]!.engines.has(v)).toBe(false);
    await attachment.detach(v, {});
    await expect(attachment.detach('nope', {})).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
});
