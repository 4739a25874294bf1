// Repair driven by events (issue 21), through Mooring over fake data engines: a replica
// event of one volume repairs that volume only, many events make one repair, a host offered
// again or answering again repairs its volumes, and closing cancels what is pending. The full pass is set an
// hour apart, so nothing here can be the periodic loop's doing.
import { afterEach, describe, expect, it, vi } from 'vitest';

import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

const SIZE = 64 * 4096;
const HOUR_MS = 3_600_000;
const VOLUMES = 6;
// Bound of a wait on a condition (a loaded machine may be slow; nothing is timed).
const WAIT = { timeout: 10_000 };

describe('event-driven repair', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const m of open.splice(0)) await m.close();
  });

  // VOLUMES attached volumes on a, b, c (engine on a), a spare host d; the first pass done.
  async function setup() {
    const hosts = ['a', 'b', 'c', 'd'].map((h) => new FakeDataEngine(h));
    const store = new MemoryStateStore();
    const m = await Mooring.open({ store, hosts, repairIntervalMs: HOUR_MS, replicaReplacementWaitMs: 0 });
    open.push(m);
    await vi.waitFor(() => expect(m.repairLoop.passes).toBe(1), WAIT);
    expect(m.repairLoop.nextPassDelayMs).toBeGreaterThanOrEqual(HOUR_MS);
    for (let i = 0; i < VOLUMES; i++) {
      await m.createVolume({ name: `v${i}`, sizeBytes: SIZE, hosts: ['a', 'b', 'c'] });
      await m.volume(`v${i}`).attach({ host: 'a' });
    }
    for (const h of hosts) h.calls.length = 0;
    // Volumes whose engine was asked about, on any host, since the calls were cleared.
    const probed = () => new Set(hosts.flatMap((h) => h.calls.filter((c) => c.startsWith('engineInfo ')).map((c) => c.slice('engineInfo '.length))));
    return { hosts, store, m, probed };
  }

  it('replaces the ERR replica of the volume the event names, and touches no other volume', async () => {
    const { hosts, m, probed } = await setup();
    const replaced: unknown[] = [];
    m.on('replica-replaced', (e) => replaced.push(e));
    hosts[0]!.setMode('v3', 'r1', 'ERR');
    hosts[0]!.emit({ type: 'replica-error', volume: 'v3', replicaId: 'r1', errno: 5, message: 'EIO' });
    await vi.waitFor(() => expect(replaced).toHaveLength(1), WAIT);
    expect(replaced[0]).toMatchObject({ volume: 'v3', oldReplicaId: 'r1', oldHostId: 'b', newHostId: 'd' });
    expect(hosts[3]!.replicas.size).toBe(1);
    expect([...probed()]).toEqual(['v3']);
    expect(m.repairLoop).toMatchObject({ passes: 1, eventRepairs: 1 });
    expect((await m.volume('v0').status()).replicas.map((r) => r.hostId).sort()).toEqual(['a', 'b', 'c']);
  });

  it('coalesces a burst of events: one repair per volume named', async () => {
    const { hosts, m, probed } = await setup();
    for (let i = 0; i < 40; i++) {
      hosts[0]!.emit({ type: 'replica-error', volume: 'v1', replicaId: 'r2', errno: 5, message: 'EIO' });
      hosts[0]!.emit({ type: 'replica-set-changed', volume: 'v1', epoch: 1, generation: i + 2, rwReplicaIds: ['r0', 'r1'] });
      hosts[0]!.emit({ type: 'rebuild-failed', volume: 'v4', replicaId: 'r0', code: 'IO_ERROR', message: 'x', scannedBytes: 0, sentBytes: 0, totalBytes: 0 });
    }
    // Events that do not change replicas ask for nothing.
    hosts[0]!.emit({ type: 'rebuild-progress', volume: 'v2', replicaId: 'r0', scannedBytes: 0, sentBytes: 0, totalBytes: 0 });
    await vi.waitFor(() => expect(m.repairLoop).toMatchObject({ eventRepairs: 2, pendingEventRepairs: 0 }), WAIT);
    await vi.waitFor(() => expect([...probed()].sort()).toEqual(['v1', 'v4']), WAIT);
    // Each repaired volume's engine host was asked about it once (the others once each for a stray engine).
    expect(hosts[0]!.calls.filter((c) => c === 'engineInfo v1')).toHaveLength(1);
    expect(m.repairLoop.passes).toBe(1);
  });

  it('repairs the volumes of a host offered again', async () => {
    const { hosts, m, probed } = await setup();
    await m.createVolume({ name: 'elsewhere', sizeBytes: SIZE, replicas: 1, hosts: ['d'] });
    await m.volume('elsewhere').attach({ host: 'd' });
    for (const h of hosts) h.calls.length = 0;
    await m.addHost(new FakeDataEngine('b', hosts[1]!.replicaAddress));
    await vi.waitFor(() => expect(m.repairLoop).toMatchObject({ eventRepairs: VOLUMES, pendingEventRepairs: 0 }), WAIT);
    await vi.waitFor(() => expect([...probed()].sort()).toHaveLength(VOLUMES), WAIT);
    expect(probed().has('elsewhere')).toBe(false);
  });

  it('a host offered while it does not answer is recorded once it answers, under its new replica address, and its replicas re-added there', async () => {
    const { hosts, store, m } = await setup();
    const b = hosts[1]!;
    // b restarted under another replica address; the VM manager offers it while its channel
    // does not answer yet (gRPC's reconnect back-off), and does not offer it again.
    b.reachable = false;
    (b as { replicaAddress: string | null }).replicaAddress = 'tcp:127.0.0.1:9999';
    for (let i = 0; i < VOLUMES; i++) hosts[0]!.setMode(`v${i}`, 'r1', 'ERR');
    await m.addHost(b);
    expect((await store.get<{ replicaAddress: string }>('host', 'b'))?.value.replicaAddress).not.toBe('tcp:127.0.0.1:9999');
    b.reachable = true;
    await vi.waitFor(async () => expect((await store.get<{ replicaAddress: string }>('host', 'b'))?.value.replicaAddress).toBe('tcp:127.0.0.1:9999'), WAIT);
    await vi.waitFor(() => expect(hosts[0]!.calls.filter((c) => c.startsWith('addReplica ') && c.endsWith('@b'))).toHaveLength(VOLUMES), WAIT);
  });

  it('stops a leftover engine on a host that answers again (no event, no full pass)', async () => {
    const { hosts, m } = await setup();
    const d = hosts[3]!;
    // A takeover's leftover: d (no replica of v2) still runs an engine of v2; then d stops
    // answering, and the repair asked for by an event finds it down.
    d.engines.set('v2', structuredClone(hosts[0]!.engines.get('v2')!));
    d.reachable = false;
    hosts[0]!.emit({ type: 'replica-set-changed', volume: 'v2', epoch: 1, generation: 9, rwReplicaIds: ['r0', 'r1', 'r2'] });
    await vi.waitFor(() => expect(m.repairLoop).toMatchObject({ eventRepairs: 1, pendingEventRepairs: 0 }), WAIT);
    expect(d.engines.has('v2')).toBe(true);
    // d answers again, as after a healed partition: nothing is emitted and d is not offered again.
    d.reachable = true;
    await vi.waitFor(() => expect(d.engines.has('v2')).toBe(false), WAIT);
    expect(hosts[0]!.engines.has('v2')).toBe(true);
    expect(m.repairLoop.passes).toBe(1);
  });

  it('a batch still running when a host answers again probes it again for the repairs it takes in', async () => {
    const { hosts, m } = await setup();
    const [a, , , d] = hosts as [FakeDataEngine, FakeDataEngine, FakeDataEngine, FakeDataEngine];
    d.engines.set('v2', structuredClone(a.engines.get('v2')!));
    d.reachable = false;
    // The batch repairs v2 (finds d down) and then hangs in v0's repair.
    let release = (): void => undefined;
    const gate = new Promise<void>((r) => (release = r));
    const engineInfo = a.engineInfo.bind(a);
    a.engineInfo = async (v) => {
      if (v === 'v0') await gate;
      return engineInfo(v);
    };
    a.emit({ type: 'replica-set-changed', volume: 'v2', epoch: 1, generation: 9, rwReplicaIds: ['r0', 'r1', 'r2'] });
    a.emit({ type: 'replica-set-changed', volume: 'v0', epoch: 1, generation: 9, rwReplicaIds: ['r0', 'r1', 'r2'] });
    await vi.waitFor(() => expect(m.repairLoop).toMatchObject({ eventRepairs: 2, pendingEventRepairs: 0 }), WAIT);
    // d is back while that batch still runs: the recheck asks for v2 again, in the same batch.
    d.reachable = true;
    await vi.waitFor(() => expect(m.repairLoop.pendingEventRepairs).toBe(1), WAIT);
    expect(d.engines.has('v2')).toBe(true);
    release();
    await vi.waitFor(() => expect(d.engines.has('v2')).toBe(false), WAIT);
    expect(m.repairLoop).toMatchObject({ passes: 1, eventRepairs: 3 });
  });

  it('does nothing for events once closed, and nothing with the loop off', async () => {
    const { hosts, m } = await setup();
    hosts[0]!.emit({ type: 'replica-error', volume: 'v0', replicaId: 'r1', errno: 5, message: 'EIO' });
    expect(m.repairLoop.pendingEventRepairs).toBe(1);
    await m.close();
    expect(m.repairLoop).toMatchObject({ running: false, pendingEventRepairs: 0, eventRepairs: 0 });

    const e = new FakeDataEngine('e');
    const off = await Mooring.open({ store: new MemoryStateStore(), hosts: [e], repairIntervalMs: 0 });
    open.push(off);
    await off.createVolume({ name: 'w', sizeBytes: SIZE, replicas: 1 });
    await off.volume('w').attach({ host: 'e' });
    e.emit({ type: 'replica-error', volume: 'w', replicaId: 'r0', errno: 5, message: 'EIO' });
    expect(off.repairLoop).toMatchObject({ running: false, pendingEventRepairs: 0 });
  });
});
