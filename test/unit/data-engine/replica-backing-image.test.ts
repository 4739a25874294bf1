// LocalDataEngine.createReplica with a backing image: the reference is validated before the
// addon is called, passed through, and reported back by the replica listing (from inspect).
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { checkReplicaBackingImage } from '../../../src/data-engine/replica-backing-image.js';
import { FakeAddon } from '../fakes/fake-addon.js';

const MiB = 1024 * 1024;

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    return String((err as { code?: unknown }).code);
  }
  throw new Error('expected a rejection');
}

describe('LocalDataEngine replicas over a backing image', () => {
  let root: string;
  let addon: FakeAddon;
  let de: LocalDataEngine;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-de-bi-'));
    addon = new FakeAddon();
    de = await LocalDataEngine.start({ dir: join(root, 'h1'), hostId: 'h1', addon, replicaListen: null });
  });
  afterEach(async () => {
    await de.close();
    await rm(root, { recursive: true, force: true });
  });

  it('passes the reference through and reports it back', async () => {
    // The file must be ready on this disk first. The fake addon models no image reader:
    // stand one in that calls whatever it is given a qcow2 of MiB + 512 bytes.
    addon.openImage = async (path: string) => ({ path, format: 'qcow2', sizeBytes: MiB + 512, chain: [], read: async () => Buffer.alloc(0), blockStatus: async () => [], close: async () => undefined });
    const ref = { name: 'ubuntu', uuid: randomUUID() };
    await de.writeBackingImageFile(ref, { sizeBytes: 4096 }, (async function* () {
      yield Buffer.alloc(4096, 1);
    })());
    const backingImage = { dir: `ubuntu-${ref.uuid}`, format: 'qcow2' as const, virtualSizeBytes: MiB + 512 };
    const created = await de.createReplica('vol-a-r0', 2 * MiB, { backingImage });
    expect(created.backingImage).toEqual(backingImage);
    expect((await de.listReplicas()).find((r) => r.name === 'vol-a-r0')?.backingImage).toEqual(backingImage);
    expect((await de.createReplica('vol-b-r0', MiB)).backingImage).toBeNull();
  });

  it('refuses bad references with INVALID_ARGUMENT before creating anything', async () => {
    const ok = { dir: 'img-1', format: 'raw', virtualSizeBytes: MiB };
    const bad: unknown[] = [
      null,
      'img-1',
      { ...ok, dir: '..' },
      { ...ok, dir: '.' },
      { ...ok, dir: '' },
      { ...ok, dir: 'a/b' },
      { ...ok, dir: 'x'.repeat(128) },
      { ...ok, format: 'vmdk' },
      { ...ok, virtualSizeBytes: 0 },
      { ...ok, virtualSizeBytes: 1000 },
      { ...ok, virtualSizeBytes: 4 * MiB },
      { ...ok, virtualSizeBytes: '1048576' },
    ];
    for (const b of bad) {
      expect(await codeOf(de.createReplica('vol-c-r0', 2 * MiB, { backingImage: b as never })), JSON.stringify(b)).toBe('INVALID_ARGUMENT');
      expect(() => checkReplicaBackingImage(b, 2 * MiB)).toThrow();
    }
    expect(await de.listReplicas()).toEqual([]);
  });
});
