// The five snapshot calls of a DataEngine — create, list, delete, export, copy — through
// LocalDataEngine in this process and through RemoteDataEngine over gRPC to a real
// `mooring data-engine` process, with the real addon: data written over NBD, snapshots
// exported to raw files and compared with what NBD read at snapshot time, a clone into a
// second volume whose two replicas are opened and compared afterwards, progress events
// (through the gRPC watch stream for the process), and the coded errors of each call.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { DataEngine, DataEngineEvent, EngineReplicaRef } from '../../src/data-engine/data-engine.js';
import { RemoteDataEngine } from '../../src/data-engine/grpc/remote-data-engine.js';
import { LocalDataEngine } from '../../src/data-engine/local-data-engine.js';
import { loadAddon } from '../../src/native/load.js';
import { assertDirsIdentical, pattern } from '../native/helpers.js';
import { NbdClient } from './helpers/nbd-client.js';
import { killAllServers, startCliProcess } from './helpers/serve.js';
import { TempDir, run } from './helpers/tools.js';
import { codeOf } from '../helpers/codes.js';

const MiB = 1024 * 1024;
const SIZE = 16 * MiB;

interface Harness {
  de: DataEngine;
  /** The data engine's directory (replicas under replicas/<name>). */
  dir: string;
  events: DataEngineEvent[];
  stop: () => Promise<void>;
}

async function localHarness(tmp: TempDir): Promise<Harness> {
  const dir = tmp.join('local-de');
  const de = await LocalDataEngine.start({ dir, hostId: 'h-local', replicaListen: null, addon: loadAddon() });
  const events: DataEngineEvent[] = [];
  de.watch((e) => events.push(e));
  return { de, dir, events, stop: () => de.close() };
}

async function processHarness(tmp: TempDir): Promise<Harness> {
  const dir = tmp.join('process-de');
  const sock = tmp.join('de.sock');
  await startCliProcess(['data-engine', '--dir', dir, '--host-id', 'h-proc', '--listen', `unix:${sock}`, '--replica-listen', 'none'], 'mooring data-engine');
  const de = await RemoteDataEngine.connect({ address: `unix:${sock}`, timeoutMs: 20_000 });
  const events: DataEngineEvent[] = [];
  de.watch((e) => events.push(e));
  return {
    de,
    dir,
    events,
    stop: async () => {
      await de.close();
      await killAllServers();
    },
  };
}

async function readAllNbd(socketPath: string, size: number): Promise<Buffer> {
  const c = await NbdClient.connect({ socketPath });
  try {
    const out = Buffer.alloc(size);
    for (let off = 0; off < size; off += 4 * MiB) (await c.read(off, Math.min(4 * MiB, size - off))).copy(out, off);
    return out;
  } finally {
    await c.disconnect();
  }
}

async function writeNbd(socketPath: string, writes: Array<[number, Buffer]>): Promise<void> {
  const c = await NbdClient.connect({ socketPath });
  try {
    for (const [off, data] of writes) {
      for (let p = 0; p < data.length; p += 4 * MiB) await c.write(off + p, data.subarray(p, Math.min(data.length, p + 4 * MiB)));
    }
    await c.flush();
  } finally {
    await c.disconnect();
  }
}

describe.each([
  ['LocalDataEngine (in process)', localHarness],
  ['RemoteDataEngine over gRPC to a mooring data-engine process', processHarness],
])('DataEngine snapshots: %s', (_name, make) => {
  let tmp: TempDir;
  let h: Harness;
  let host: string;
  const ref = (id: string, name: string): EngineReplicaRef => ({ id, hostId: host, name, address: null });
  const at: Record<string, Buffer> = {};
  let nbd: string;

  beforeAll(async () => {
    tmp = new TempDir('mooring-de-snap-');
    h = await make(tmp);
    host = h.de.hostId;
    for (const n of ['src-r0', 'src-r1', 'dst-r0', 'dst-r1']) await h.de.createReplica(n, SIZE);
    await h.de.createReplica('odd-r0', 2 * SIZE);
    nbd = tmp.join('src.sock');
    await h.de.startEngine({ volume: 'src', replicas: [ref('r0', 'src-r0'), ref('r1', 'src-r1')], nbd: `unix:${nbd}`, epoch: 1 });
  });
  afterAll(async () => {
    await h?.stop().catch(() => undefined);
    tmp?.cleanup();
  });

  it('creates and lists snapshots, with coded errors', async () => {
    await writeNbd(nbd, [
      [0, pattern(1, 2 * MiB)],
      [5 * MiB + 4096, pattern(2, 300_000)],
    ]);
    const s1 = await h.de.createSnapshot('src', 's1', { labels: { purpose: 'backup', 'example.com/by': 'test' } });
    expect(s1).toMatchObject({ name: 's1', parent: null, labels: { purpose: 'backup', 'example.com/by': 'test' }, sizeBytes: SIZE, userCreated: true });
    expect(s1.id).toMatch(/^L\d{6,}$/);
    expect(s1.allocatedBytes).toBeGreaterThanOrEqual(2 * MiB);
    at.s1 = await readAllNbd(nbd, SIZE);

    await writeNbd(nbd, [[MiB, pattern(3, MiB)]]);
    const s2 = await h.de.createSnapshot('src', 's2');
    expect(s2).toMatchObject({ name: 's2', parent: 's1', labels: {} });
    at.s2 = await readAllNbd(nbd, SIZE);
    await writeNbd(nbd, [[10 * MiB, pattern(4, MiB)]]); // after s2: no export shows it

    expect((await h.de.listSnapshots('src')).map((x) => [x.name, x.parent])).toEqual([
      ['s1', null],
      ['s2', 's1'],
    ]);
    expect(await codeOf(h.de.createSnapshot('src', 's1'))).toBe('ALREADY_EXISTS');
    expect(await codeOf(h.de.createSnapshot('src', 'bad/name'))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.createSnapshot('src', 's3', { labels: { 'bad key!': 'x' } }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.createSnapshot('nope', 's3'))).toBe('NOT_FOUND');
    expect(await codeOf(h.de.listSnapshots('nope'))).toBe('NOT_FOUND');
  });

  it('exports snapshots into raw files equal to what NBD read at snapshot time', async () => {
    for (const name of ['s1', 's2']) {
      const path = tmp.join(`${name}.raw`);
      const res = await h.de.exportSnapshot('src', name, path);
      expect(res.sizeBytes).toBe(SIZE);
      expect(res.copiedBytes).toBeGreaterThan(0);
      expect(readFileSync(path).equals(at[name]!)).toBe(true);
      const ref = tmp.join(`${name}-nbd.raw`);
      writeFileSync(ref, at[name]!);
      await run('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', path, ref]);
    }
    const existing = tmp.join('s1.raw');
    expect(await codeOf(h.de.exportSnapshot('src', 's1', existing))).toBe('ALREADY_EXISTS');
    expect(await codeOf(h.de.exportSnapshot('src', 's1', 'relative.raw'))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.exportSnapshot('src', 's1', tmp.join('missing-dir', 'x.raw')))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.exportSnapshot('src', 'nope', tmp.join('nope.raw')))).toBe('NOT_FOUND');
    expect(existsSync(tmp.join('nope.raw'))).toBe(false);
    expect(await codeOf(h.de.exportSnapshot('nope', 's1', tmp.join('nope.raw')))).toBe('NOT_FOUND');
  });

  it('copies a snapshot into another volume through its engine: both of its replicas hold it', async () => {
    await h.de.startEngine({ volume: 'dst', replicas: [ref('r0', 'dst-r0'), ref('r1', 'dst-r1')], epoch: 1 });
    await h.de.startEngine({ volume: 'odd', replicas: [ref('r0', 'odd-r0')], epoch: 1 });
    expect(await codeOf(h.de.copySnapshot('src', 's2', 'odd'))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.copySnapshot('src', 's2', 'src'))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(h.de.copySnapshot('src', 's2', 'nope'))).toBe('NOT_FOUND');
    expect(await codeOf(h.de.copySnapshot('src', 'nope', 'dst'))).toBe('NOT_FOUND');
    const res = await h.de.copySnapshot('src', 's2', 'dst');
    expect(res.sizeBytes).toBe(SIZE);
    expect(res.copiedBytes).toBeGreaterThan(2 * MiB);
    await h.de.stopEngine('dst');
    await h.de.stopEngine('odd');
    const dirs = ['dst-r0', 'dst-r1'].map((n) => join(h.dir, 'replicas', n));
    expect((await assertDirsIdentical(dirs, at.s2!)).ids).toHaveLength(2);
  });

  it('deletes snapshots: the next one keeps its content; refused codes', async () => {
    await h.de.deleteSnapshot('src', 's1');
    expect((await h.de.listSnapshots('src')).map((x) => [x.name, x.parent])).toEqual([['s2', null]]);
    expect(await codeOf(h.de.deleteSnapshot('src', 's1'))).toBe('NOT_FOUND');
    expect(await codeOf(h.de.deleteSnapshot('nope', 's2'))).toBe('NOT_FOUND');
    const path = tmp.join('s2-after-delete.raw');
    await h.de.exportSnapshot('src', 's2', path);
    expect(readFileSync(path).equals(at.s2!)).toBe(true);
  });

  it('reverts to a snapshot through an engine without export; refused while exported', async () => {
    await writeNbd(nbd, [[0, pattern(6, MiB)]]);
    expect(await codeOf(h.de.revertSnapshot('src', 's2'))).toBe('INVALID_STATE');
    expect((await readAllNbd(nbd, SIZE)).equals(at.s2!)).toBe(false);
    await h.de.stopEngine('src');
    await h.de.startEngine({ volume: 'src', replicas: [ref('r0', 'src-r0'), ref('r1', 'src-r1')], epoch: 2 });
    expect(await codeOf(h.de.revertSnapshot('src', 'nope'))).toBe('NOT_FOUND');
    await h.de.revertSnapshot('src', 's2');
    await h.de.stopEngine('src');
    await h.de.startEngine({ volume: 'src', replicas: [ref('r0', 'src-r0'), ref('r1', 'src-r1')], nbd: `unix:${nbd}`, epoch: 3 });
    expect((await readAllNbd(nbd, SIZE)).equals(at.s2!)).toBe(true);
    expect((await h.de.listSnapshots('src')).map((x) => x.name)).toEqual(['s2']);
  });

  it('reports progress of a long copy as data-engine events', async () => {
    const big = 96 * MiB;
    await h.de.createReplica('big-r0', big);
    const sock = tmp.join('big.sock');
    await h.de.startEngine({ volume: 'big', replicas: [ref('r0', 'big-r0')], nbd: `unix:${sock}`, epoch: 1 });
    await writeNbd(sock, [[0, pattern(5, 72 * MiB)]]);
    await h.de.createSnapshot('big', 'full');
    const res = await h.de.exportSnapshot('big', 'full', tmp.join('big.raw'));
    expect(res.copiedBytes).toBe(72 * MiB);
    const progress = (): DataEngineEvent[] => h.events.filter((e) => e.type === 'snapshot-copy-progress');
    for (let i = 0; i < 200 && progress().length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect(progress()).toEqual([{ type: 'snapshot-copy-progress', volume: 'big', snapshot: 'full', copiedBytes: 64 * MiB, totalBytes: 72 * MiB }]);
    await h.de.stopEngine('big');
  });
});
