// One DataEngine suite, run against LocalDataEngine directly and against RemoteDataEngine
// over gRPC (unix socket), both with the real addon and local replicas: replicas, an engine
// exported over NBD with data written and read back through NBD, stop, events, errors.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { DataEngine, DataEngineEvent, EngineReplicaRef } from '../../../src/data-engine/data-engine.js';
import { DataEngineGrpcServer } from '../../../src/data-engine/grpc/data-engine-grpc-server.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { loadAddon } from '../../../src/native/load.js';
import { NbdClient } from '../../system/helpers/nbd-client.js';
import { codeOf } from '../../helpers/codes.js';

const MiB = 1024 * 1024;

interface Harness {
  de: DataEngine;
  root: string;
  /** Waits for an event on the data engine (through watch). */
  events: DataEngineEvent[];
  stop: () => Promise<void>;
}

async function localHarness(): Promise<Harness> {
  const root = await mkdtemp(join(tmpdir(), 'mooring-dec-'));
  // The replica server is native work landing separately; these cases use local replicas.
  const de = await LocalDataEngine.start({ dir: join(root, 'de'), hostId: 'host-1', addon: loadAddon() });
  const events: DataEngineEvent[] = [];
  de.watch((e) => events.push(e));
  return {
    de,
    root,
    events,
    stop: async () => {
      await de.close();
      await rm(root, { recursive: true, force: true });
    },
  };
}

async function grpcHarness(): Promise<Harness> {
  const root = await mkdtemp(join(tmpdir(), 'mooring-dec-'));
  const local = await LocalDataEngine.start({ dir: join(root, 'de'), hostId: 'host-1', addon: loadAddon() });
  const server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${join(root, 'grpc.sock')}` });
  const de = await RemoteDataEngine.connect({ address: server.address, timeoutMs: 20_000 });
  const events: DataEngineEvent[] = [];
  de.watch((e) => events.push(e));
  // Wait until the watch stream delivers: run a throwaway engine until its events arrive.
  await local.createReplica('probe', MiB);
  for (let i = 0; !events.some((e) => e.type === 'engine-stopped'); i++) {
    if (i >= 100) throw new Error('the watch stream never delivered');
    await local.startEngine({ volume: 'probe', replicas: [{ id: 'p', hostId: 'host-1', name: 'probe', address: null }], epoch: i + 1 });
    await local.stopEngine('probe');
    await new Promise((r) => setTimeout(r, 20));
  }
  await local.deleteReplica('probe');
  events.length = 0;
  return {
    de,
    root,
    events,
    stop: async () => {
      await de.close();
      await server.close();
      await local.close();
      await rm(root, { recursive: true, force: true });
    },
  };
}

async function until(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 500; i++) {
    if (check()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out waiting for ${what}`);
}

describe.each([
  ['LocalDataEngine', localHarness],
  ['RemoteDataEngine over gRPC', grpcHarness],
])('DataEngine contract: %s (real addon)', (_name, make) => {
  let h: Harness;
  beforeAll(async () => {
    h = await make();
  });
  afterAll(async () => {
    await h?.stop();
  });

  it('knows its host', async () => {
    expect(h.de.hostId).toBe('host-1');
    const info = await h.de.info();
    expect(info).toMatchObject({ hostId: 'host-1', dir: join(h.root, 'de'), tls: false });
    // The replica server listens on loopback by default, on a port of its own.
    expect(info.replicaAddress).toMatch(/^tcp:127\.0\.0\.1:[1-9][0-9]*$/);
    expect(info.version).toMatch(/^\d+\.\d+\.\d+/);
  });

  it('creates, lists and deletes replicas, with coded errors', async () => {
    const r = await h.de.createReplica('scratch', 4 * MiB);
    expect(r).toMatchObject({ name: 'scratch', sizeBytes: 4 * MiB, inUse: false, rebuilding: false });
    expect(await codeOf(h.de.createReplica('scratch', 4 * MiB))).toBe('ALREADY_EXISTS');
    expect(await codeOf(h.de.createReplica('../escape', 4 * MiB))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.createReplica('odd', 1000))).toBe('INVALID_ARGUMENT');
    expect((await h.de.listReplicas()).map((x) => x.name)).toContain('scratch');
    await h.de.deleteReplica('scratch');
    expect((await h.de.listReplicas()).map((x) => x.name)).not.toContain('scratch');
    expect(await codeOf(h.de.deleteReplica('scratch'))).toBe('NOT_FOUND');
  });

  it('runs an engine exported over NBD: data written through NBD reads back and lands on every replica', async () => {
    await h.de.createReplica('vol1-r0', 8 * MiB);
    await h.de.createReplica('vol1-r1', 8 * MiB);
    const refs: EngineReplicaRef[] = [
      { id: 'r0', hostId: 'host-1', name: 'vol1-r0', address: null },
      { id: 'r1', hostId: 'host-1', name: 'vol1-r1', address: null },
    ];
    const socket = join(h.root, 'vol1.sock');
    // The epoch is the caller's to allocate: the engine claims the one it is given.
    const info = await h.de.startEngine({ volume: 'vol1', replicas: refs, nbd: `unix:${socket}`, epoch: 5 });
    expect(info).toMatchObject({ volume: 'vol1', sizeBytes: 8 * MiB, epoch: 5, nbd: { address: `unix:${socket}` } });
    expect(info.replicas.map((r) => [r.id, r.hostId, r.name, r.mode])).toEqual([
      ['r0', 'host-1', 'vol1-r0', 'RW'],
      ['r1', 'host-1', 'vol1-r1', 'RW'],
    ]);
    expect(await codeOf(h.de.startEngine({ volume: 'vol1', replicas: refs, epoch: 6 }))).toBe('ALREADY_EXISTS');
    expect(await codeOf(h.de.deleteReplica('vol1-r0'))).toBe('BUSY');
    expect((await h.de.listReplicas()).find((r) => r.name === 'vol1-r0')!.inUse).toBe(true);
    expect((await h.de.listEngines()).map((e) => e.volume)).toEqual(['vol1']);

    const client = await NbdClient.connect({ socketPath: socket });
    const data = Buffer.alloc(64 * 1024);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + 3) & 0xff;
    await client.write(MiB, data);
    await client.flush();
    expect(Buffer.compare(await client.read(MiB, data.length), data)).toBe(0);
    await client.disconnect();

    await until(() => h.events.some((e) => e.type === 'epoch-claimed' && e.volume === 'vol1' && e.epoch === 5), 'epoch-claimed');
    await until(() => h.events.some((e) => e.type === 'replica-set-changed' && e.volume === 'vol1' && e.epoch === 5 && e.generation === 1), 'replica-set-changed');
    await h.de.stopEngine('vol1');
    await until(() => h.events.some((e) => e.type === 'engine-stopped' && e.volume === 'vol1'), 'engine-stopped');
    expect(await codeOf(h.de.engineInfo('vol1'))).toBe('NOT_FOUND');
    const replicas = (await h.de.listReplicas()).filter((r) => r.name.startsWith('vol1-'));
    expect(replicas.map((r) => [r.clean, r.inUse])).toEqual([
      [true, false],
      [true, false],
    ]);

    // Both replicas promised epoch 5: a start at 5 again is refused, nothing served.
    expect(await codeOf(h.de.startEngine({ volume: 'vol1', replicas: refs, epoch: 5 }))).toBe('STALE_EPOCH');
    expect(await codeOf(h.de.engineInfo('vol1'))).toBe('NOT_FOUND');
    // Both replicas hold the data: read each directly (an engine over one of the two would
    // be a minority of the volume's replicas, which no engine serves).
    for (const ref of refs) {
      const r = await loadAddon().openReplica(join(h.root, 'de', 'replicas', ref.name));
      try {
        expect(Buffer.compare(await r.read(MiB, data.length), data), ref.name).toBe(0);
      } finally {
        await r.close();
      }
    }
    await h.de.deleteReplica('vol1-r0');
    await h.de.deleteReplica('vol1-r1');
  });

  it('resizes a running engine (new NBD connections see the new size) and grows replicas no engine uses', async () => {
    await h.de.createReplica('grow-r0', 4 * MiB);
    await h.de.createReplica('grow-r1', 4 * MiB);
    const refs: EngineReplicaRef[] = [
      { id: 'r0', hostId: 'host-1', name: 'grow-r0', address: null },
      { id: 'r1', hostId: 'host-1', name: 'grow-r1', address: null },
    ];
    const socket = join(h.root, 'grow.sock');
    await h.de.startEngine({ volume: 'grow', replicas: refs, nbd: `unix:${socket}`, epoch: 9 });
    expect(await codeOf(h.de.growReplica('grow-r0', 8 * MiB)), 'open in the engine').toBe('BUSY');
    expect(await codeOf(h.de.resizeEngine('grow', 2 * MiB))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.resizeEngine('grow', 4 * MiB + 1))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.resizeEngine('none', 8 * MiB))).toBe('NOT_FOUND');
    expect(await h.de.resizeEngine('grow', 8 * MiB)).toMatchObject({ volume: 'grow', sizeBytes: 8 * MiB });
    expect((await h.de.engineInfo('grow')).sizeBytes).toBe(8 * MiB);
    const client = await NbdClient.connect({ socketPath: socket });
    expect(client.sizeBytes).toBe(8 * MiB);
    const data = Buffer.alloc(4096, 0x5a);
    await client.write(6 * MiB, data);
    expect(Buffer.compare(await client.read(6 * MiB, data.length), data)).toBe(0);
    await client.disconnect();
    await h.de.stopEngine('grow');
    expect((await h.de.listReplicas()).filter((r) => r.name.startsWith('grow-')).map((r) => r.sizeBytes)).toEqual([8 * MiB, 8 * MiB]);

    // Detached: each replica on its own.
    expect(await h.de.growReplica('grow-r0', 12 * MiB)).toMatchObject({ name: 'grow-r0', sizeBytes: 12 * MiB, inUse: false });
    expect(await codeOf(h.de.growReplica('grow-r0', 4 * MiB))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.growReplica('missing', 12 * MiB))).toBe('NOT_FOUND');
    // The engine's size rule: the largest size a replica recorded; the other grows to it.
    expect(await h.de.startEngine({ volume: 'grow', replicas: refs, epoch: 10 })).toMatchObject({ sizeBytes: 12 * MiB });
    await h.de.stopEngine('grow');
    expect((await h.de.listReplicas()).filter((r) => r.name.startsWith('grow-')).map((r) => r.sizeBytes)).toEqual([12 * MiB, 12 * MiB]);
    await h.de.deleteReplica('grow-r0');
    await h.de.deleteReplica('grow-r1');
  });

  it('refuses bad engine requests with coded errors', async () => {
    const ok: EngineReplicaRef = { id: 'r0', hostId: 'host-1', name: 'nothing', address: null };
    expect(await codeOf(h.de.startEngine({ volume: 'v', replicas: [ok], epoch: 1 }))).toBe('NOT_FOUND');
    expect(await codeOf(h.de.startEngine({ volume: '', replicas: [ok], epoch: 1 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.startEngine({ volume: 'v', replicas: [], epoch: 1 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.startEngine({ volume: 'v', replicas: [{ ...ok, hostId: 'host-2', address: 'nowhere' }], epoch: 1 }))).toBe('INVALID_ARGUMENT');
    // No epoch, or one that no allocator hands out.
    expect(await codeOf(h.de.startEngine({ volume: 'v', replicas: [ok] }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.startEngine({ volume: 'v', replicas: [ok], epoch: 0 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.startEngine({ volume: 'v', replicas: [ok], epoch: 1, quorumHoldMs: -1 }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.stopEngine('none'))).toBe('NOT_FOUND');
    expect(await codeOf(h.de.removeReplica('none', 'r0'))).toBe('NOT_FOUND');
    expect(await codeOf(h.de.addReplica('none', ok))).toBe('NOT_FOUND');
    // salvage: a boolean, never with standby (checked before the replicas are looked up).
    expect(await codeOf(h.de.startEngine({ volume: 'v', replicas: [ok], epoch: 1, salvage: 'yes' as never }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.startEngine({ volume: 'v', replicas: [ok], standby: true, salvage: true }))).toBe('INVALID_ARGUMENT');
  });

  it('salvage start over the lone survivor of three replicas: serves it and reports salvaged (docs/salvage.md)', async () => {
    const refs: EngineReplicaRef[] = ['r0', 'r1', 'r2'].map((id) => ({ id, hostId: 'host-1', name: `sal-${id}`, address: null }));
    for (const r of refs) await h.de.createReplica(r.name, 4 * MiB);
    await h.de.startEngine({ volume: 'sal', replicas: refs, epoch: 20 });
    await h.de.stopEngine('sal');
    // r0 and r1 are gone for good; alone, r2 is no majority of the last replica set.
    await h.de.deleteReplica('sal-r0');
    await h.de.deleteReplica('sal-r1');
    const survivor = [refs[2]!];
    expect(await codeOf(h.de.startEngine({ volume: 'sal', replicas: survivor, epoch: 21 }))).toBe('NO_QUORUM');
    const info = await h.de.startEngine({ volume: 'sal', replicas: survivor, epoch: 22, salvage: true });
    expect(info.replicas.map((r) => [r.id, r.mode])).toEqual([['r2', 'RW']]);
    await until(() => h.events.some((e) => e.type === 'salvaged' && e.volume === 'sal'), 'salvaged');
    expect(h.events.filter((e) => e.type === 'salvaged')).toEqual([
      { type: 'salvaged', volume: 'sal', replicaId: 'r2', lastRw: { epoch: 20, generation: 1 }, complete: false, message: expect.stringMatching(/may be missing/) },
    ]);
    await h.de.stopEngine('sal');
    await h.de.deleteReplica('sal-r2');
  });
});
