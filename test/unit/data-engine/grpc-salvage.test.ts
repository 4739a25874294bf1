// Salvage over gRPC, version skew (docs/salvage.md): a data engine announces `salvage` in
// Info.features; RemoteDataEngine sends a salvage start only to one that does, because an
// older one would drop the unknown field and start normally. The `salvaged` event's wire
// form, a source without a recorded last RW set included. The salvage start itself, through
// a real engine on both sides of the wire, is in data-engine-contract.test.ts.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Server, ServerCredentials, type ServiceDefinition } from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import type { DataEngineEvent } from '../../../src/data-engine/data-engine.js';
import { eventFromMsg, eventToMsg } from '../../../src/data-engine/grpc/codec.js';
import { DataEngineGrpcServer } from '../../../src/data-engine/grpc/data-engine-grpc-server.js';
import { DATA_ENGINE_PROTO, DATA_ENGINE_SERVICE, dataEnginePackageDefinition } from '../../../src/data-engine/grpc/data-engine-proto.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { codeOf } from '../../helpers/codes.js';
import { FakeAddon } from '../fakes/fake-addon.js';

describe('salvage over gRPC', () => {
  let root: string;
  const closers: Array<() => Promise<unknown>> = [];
  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-grpc-salvage-'));
  });
  afterEach(async () => {
    for (const c of closers.splice(0).reverse()) await c();
    await rm(root, { recursive: true, force: true });
  });

  it('a data engine of this release announces salvage', async () => {
    const local = await LocalDataEngine.start({ dir: join(root, 'de'), hostId: 'h1', addon: new FakeAddon(), replicaListen: null });
    closers.push(() => local.close());
    const server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${join(root, 'de.sock')}` });
    closers.push(() => server.close());
    const remote = await RemoteDataEngine.connect({ address: server.address });
    closers.push(() => remote.close());
    expect((await remote.info()).features).toContain('salvage');
  });

  it('refuses a salvage start towards a data engine that does not announce it, before sending it', async () => {
    // An older data engine: it answers Info without the feature and would start normally.
    const started: unknown[] = [];
    const old = new Server();
    old.addService(dataEnginePackageDefinition()[DATA_ENGINE_SERVICE] as unknown as ServiceDefinition, {
      Info: (_call: unknown, cb: (err: null, reply: object) => void) => cb(null, { hostId: 'old', version: '0.9.0', dir: '/old', features: ['successor-exec'] }),
      StartEngine: (call: { request: object }, cb: (err: null, reply: object) => void) => {
        started.push(call.request);
        cb(null, { volume: 'v', role: 'active', epoch: 3 });
      },
    });
    const path = join(root, 'old.sock');
    await new Promise<number>((res, rej) => old.bindAsync(`unix:${path}`, ServerCredentials.createInsecure(), (err, port) => (err ? rej(err) : res(port))));
    closers.push(() => new Promise<void>((res) => old.tryShutdown(() => res())));
    const remote = await RemoteDataEngine.connect({ address: `unix:${path}` });
    closers.push(() => remote.close());
    const replicas = [{ id: 'r0', hostId: 'old', name: 'r0', address: null }];
    const err = await remote.startEngine({ volume: 'v', replicas, epoch: 3, salvage: true }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'UNSUPPORTED', message: expect.stringMatching(/0\.9\.0.*does not announce salvage/) });
    expect(started).toEqual([]);
    // A normal start still goes through.
    await remote.startEngine({ volume: 'v', replicas, epoch: 3 });
    expect(started).toMatchObject([{ volume: 'v', epoch: 3, salvage: false }]);
    expect(await codeOf(remote.startEngine({ volume: 'v', replicas, epoch: 4, salvage: 1 as never }))).toBe('INVALID_ARGUMENT');
  });

  it('carries the salvaged event through the codec and the wire, with and without a last RW set', () => {
    const type = protobuf.parse(DATA_ENGINE_PROTO, { keepCase: false }).root.lookupType('mooring.dataengine.v1.Event');
    const wire = (m: object): Record<string, unknown> => type.toObject(type.decode(type.encode(m).finish()), { longs: Number, defaults: true });
    const events: DataEngineEvent[] = [
      { type: 'salvaged', volume: 'v', replicaId: 'r2', lastRw: { epoch: 2 ** 53 - 1, generation: 7 }, complete: true, message: 'kept' },
      { type: 'salvaged', volume: 'v', replicaId: 'r0', lastRw: null, complete: false, message: 'none recorded' },
    ];
    for (const e of events) expect(eventFromMsg(wire(eventToMsg(e)))).toEqual(e);
  });
});
