import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { LocalEngine } from '../../../src/engine/engine.js';
import { FakeAddon } from '../fakes/fake-addon.js';

// Epochs are allocated by the caller (docs/single-writer.md); here, a counter.
let epoch = 0;

describe('LocalEngine', () => {
  let root: string;
  let addon: FakeAddon;
  let paths: string[];

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-engine-'));
    addon = new FakeAddon();
    paths = ['a', 'b'].map((n) => join(root, n));
    for (const p of paths) await addon.createReplica(p, 1 << 20);
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  const specs = () => paths.map((path, i) => ({ id: `r${i}`, path }));

  it('validates replica specs', async () => {
    const bad = (replicas: unknown, code = 'INVALID_ARGUMENT') =>
      expect(LocalEngine.open({ epoch: ++epoch, replicas: replicas as never, addon })).rejects.toMatchObject({ code });
    await bad([]);
    await bad(undefined);
    await bad([{ id: 'r0', path: 'relative' }]);
    await bad([{ id: 'r 0', path: paths[0] }]);
    await bad([{ id: 'r0', path: paths[0] }, { id: 'r0', path: paths[1] }]);
    await bad([{ id: 'r0', path: paths[0] }, { id: 'r1', path: paths[0] }]);
    await bad([{ id: 'r0', path: paths[0], address: 'h:1' }], 'UNSUPPORTED');
    await bad(Array.from({ length: 17 }, (_, i) => ({ id: `r${i}`, path: `/x/${i}` })));
    await expect(LocalEngine.open({ epoch: ++epoch, replicas: [{ id: 'r0', path: join(root, 'nope') }], addon })).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it('takes its epoch from the caller: required unless standby, a positive integer; quorumHoldMs within its bounds', async () => {
    const bad = (options: object) => expect(LocalEngine.open({ replicas: specs(), addon, ...options } as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await bad({});
    for (const e of [0, -1, 1.5, '7', Number.MAX_SAFE_INTEGER + 2]) await bad({ epoch: e });
    for (const q of [-1, 600_001, 1.5, '10']) await bad({ epoch: ++epoch, quorumHoldMs: q });
    const standby = await LocalEngine.open({ replicas: specs(), addon, standby: true });
    expect(standby.epoch).toBe(0);
    await standby.close();
    const e = await LocalEngine.open({ replicas: specs(), addon, epoch: ++epoch, quorumHoldMs: 0 });
    expect(e.epoch).toBe(epoch);
    // A handed-over engine is re-activated only with a new epoch.
    const h = await e.deactivate();
    expect(h).toMatchObject({ epoch, generation: 1, rwReplicaIds: ['r0', 'r1'] });
    await expect(e.activate(h, {} as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await e.activate(h, { epoch: ++epoch });
    expect(e.epoch).toBe(epoch);
    await e.close();
  });

  it('keeps events raised during open in openEvents', async () => {
    const e = await LocalEngine.open({ epoch: ++epoch, replicas: specs(), addon });
    expect(e.openEvents).toEqual([
      { type: 'epoch-claimed', epoch },
      { type: 'replica-set-changed', epoch, generation: 1, rwReplicaIds: ['r0', 'r1'] },
    ]);
    expect(e.epoch).toBe(epoch);
    expect(e.sizeBytes).toBe(1 << 20);
    await e.close();
  });

  it('maps replica ids and events to the spec ids', async () => {
    const e = await LocalEngine.open({ epoch: ++epoch, replicas: specs(), addon });
    expect(e.replicas().map((r) => [r.id, r.path, r.mode])).toEqual([
      ['r0', paths[0], 'RW'],
      ['r1', paths[1], 'RW'],
    ]);
    const seen: unknown[] = [];
    e.on('replica-error', (ev) => seen.push(ev));
    e.on('replica-set-changed', (ev) => seen.push(ev));
    addon.engine.failReplica(paths[0]!, 28);
    expect(seen).toEqual([
      { replicaId: 'r0', path: paths[0], errno: 28, code: 'NO_SPACE', message: expect.any(String) },
      { epoch, generation: 2, rwReplicaIds: ['r1'] },
    ]);
    expect(e.replicas()[0]).toMatchObject({ mode: 'ERR', lastErrno: 28 });
    await e.close();
  });

  it('a throwing listener does not break event delivery', async () => {
    const e = await LocalEngine.open({ epoch: ++epoch, replicas: specs(), addon });
    e.on('replica-set-changed', () => {
      throw new Error('listener bug');
    });
    const uncaught = new Promise<unknown>((res) => process.once('uncaughtException', res));
    addon.engine.failReplica(paths[1]!);
    // The first listener threw, so EventEmitter stopped; the error surfaces asynchronously.
    expect((await uncaught) as Error).toMatchObject({ message: 'listener bug' });
    expect(e.state).toBe('open');
    await e.close();
  });

  it('close waits for calls in flight; calls after close reject with CLOSED', async () => {
    const e = await LocalEngine.open({ epoch: ++epoch, replicas: specs(), addon });
    let release!: () => void;
    addon.engine.gate = new Promise((res) => (release = res));
    const write = e.write(0, Buffer.alloc(4096, 1));
    const read = e.read(0, 4096);
    let closed = false;
    const closing = e.close().then(() => (closed = true));
    expect(e.state).toBe('closing');
    await expect(e.read(0, 1)).rejects.toMatchObject({ code: 'CLOSED' });
    // The fake completes a call in one turn of the event loop: ten turns are ample for a
    // close that did not wait to have closed the native engine.
    for (let i = 0; i < 10; i++) await addon.tick();
    expect(closed).toBe(false);
    expect(addon.engine.closed).toBe(false);
    release();
    await closing;
    await expect(write).resolves.toBeUndefined();
    expect((await read).length).toBe(4096);
    expect(addon.engine.closed).toBe(true);
    expect(e.state).toBe('closed');
    for (const call of [() => e.write(0, Buffer.alloc(1)), () => e.flush(), () => e.listLayers(), () => e.createSnapshot('s'), () => e.exportNbd({ nbd: 'tcp:127.0.0.1:0' })]) {
      await expect(call()).rejects.toMatchObject({ code: 'CLOSED' });
    }
    expect(() => e.replicas()).toThrow(expect.objectContaining({ code: 'CLOSED' }));
    await e.close(); // idempotent
  });

  it('closes its exports before the native engine, and is idempotent', async () => {
    const e = await LocalEngine.open({ epoch: ++epoch, replicas: specs(), addon });
    const x1 = await e.exportNbd({ nbd: `unix:${join(root, 's1')}` });
    const x2 = await e.exportNbd({ nbd: 'tcp:127.0.0.1:0' });
    expect(e.exports).toHaveLength(2);
    await expect(e.revert('s')).rejects.toMatchObject({ code: 'INVALID_STATE' });
    const closed: string[] = [];
    e.on('closed', () => closed.push('engine'));
    x1.on('closed', () => closed.push('x1'));
    const p1 = e.close();
    const p2 = e.close();
    expect(p1).toBe(p2);
    await p1;
    expect(x1.closed && x2.closed).toBe(true);
    expect(closed).toEqual(['x1', 'engine']);
    expect(() => x1.stats()).toThrow(expect.objectContaining({ code: 'CLOSED' }));
    expect(() => e.replicas()).toThrow(expect.objectContaining({ code: 'CLOSED' }));
    await expect(e.exportNbd({ nbd: 'tcp:127.0.0.1:0' })).rejects.toMatchObject({ code: 'CLOSED' });
  });
});

describe('LocalEngine close races', () => {
  it('closes an export that was being created when close began', async () => {
    const root = await mkdtemp(join(tmpdir(), 'mooring-engine-'));
    try {
      const addon = new FakeAddon();
      await addon.createReplica(join(root, 'a'), 1 << 20);
      const e = await LocalEngine.open({ epoch: ++epoch, replicas: [{ id: 'r0', path: join(root, 'a') }], addon });
      const exporting = e.exportNbd({ nbd: 'tcp:127.0.0.1:0' });
      const closing = e.close();
      const exp = await exporting;
      await closing;
      expect(exp.closed).toBe(true);
      expect(addon.engine.closed).toBe(true);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
