import { mkdtemp, rm, writeFile, readFile, readdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import {
  checkRelativePath,
  newVolumeSpec,
  parseVolumeSpec,
  readVolumeSpec,
  replicaDir,
  validateVolumeSpec,
  writeVolumeSpec,
} from '../../../src/volume/volume-spec.js';

const good = () => newVolumeSpec('vol', 1 << 20, 3, 1_700_000_000_000);
const text = (v: unknown) => JSON.stringify(v);
const corrupt = expect.objectContaining({ code: 'CORRUPT_METADATA' });

describe('volume.json validation', () => {
  it('accepts what newVolumeSpec builds', () => {
    const spec = good();
    expect(parseVolumeSpec(text(spec), 'v.json')).toEqual(spec);
    expect(spec.replicas.map((r) => r.path)).toEqual(['replicas/r0', 'replicas/r1', 'replicas/r2']);
  });
  it('keeps the epoch counter, and reads a file of the last release without it', () => {
    const spec = { ...good(), lastEpoch: 12 };
    expect(parseVolumeSpec(text(spec), 'v.json')).toEqual(spec);
    expect(parseVolumeSpec(text({ ...spec, lastEpoch: 0 }), 'v.json').lastEpoch).toBe(0);
    const old = parseVolumeSpec(text(good()), 'v.json');
    expect(old.lastEpoch).toBeUndefined();
    expect('lastEpoch' in old).toBe(false);
  });
  it('refuses bad JSON', () => {
    expect(() => parseVolumeSpec('{"format":', 'v.json')).toThrow(corrupt);
    expect(() => parseVolumeSpec('', 'v.json')).toThrow(corrupt);
    expect(() => parseVolumeSpec('[]', 'v.json')).toThrow(corrupt);
    expect(() => parseVolumeSpec('null', 'v.json')).toThrow(corrupt);
  });
  it.each([
    ['format', 'other'],
    ['version', '1'],
    ['version', 0],
    ['name', 'has space'],
    ['name', 7],
    ['uuid', 'nope'],
    ['sizeBytes', 4097],
    ['sizeBytes', -4096],
    ['sizeBytes', '4096'],
    ['sizeBytes', 2 ** 60],
    ['replicas', []],
    ['replicas', {}],
    ['replicas', Array.from({ length: 17 }, (_, i) => ({ id: `r${i}`, path: `replicas/r${i}`, mode: 'RW' }))],
    ['createdMs', -1],
    ['createdMs', 'yesterday'],
    ['lastEpoch', -1],
    ['lastEpoch', 1.5],
    ['lastEpoch', '3'],
    ['lastEpoch', null],
    ['lastEpoch', 2 ** 53],
  ])('refuses %s = %j', (field, value) => {
    expect(() => parseVolumeSpec(text({ ...good(), [field]: value }), 'v.json')).toThrow(corrupt);
  });
  it.each([
    { id: 'r0', path: '../x', mode: 'RW' },
    { id: 'r0', path: '/etc', mode: 'RW' },
    { id: 'r0', path: 'replicas/../../x', mode: 'RW' },
    { id: 'r0', path: 'replicas/./r0', mode: 'RW' },
    { id: 'r0', path: 'replicas//r0', mode: 'RW' },
    { id: 'r0', path: '', mode: 'RW' },
    { id: 'r0', path: 'replicas/r0', mode: 'rw' },
    { id: '../r0', path: 'replicas/r0', mode: 'RW' },
    { id: 'r0', path: 'replicas/r0', mode: 'RW', address: 5 },
    { id: 'r0', path: 'replicas/r0', mode: 'ERR', lastError: { errno: 'EIO' } },
    'r0',
  ])('refuses replica %j', (replica) => {
    expect(() => parseVolumeSpec(text({ ...good(), replicas: [replica] }), 'v.json')).toThrow(corrupt);
  });
  it('refuses duplicate and nested replica paths', () => {
    const r = (id: string, path: string) => ({ id, path, mode: 'RW' });
    expect(() => parseVolumeSpec(text({ ...good(), replicas: [r('a', 'x'), r('a', 'y')] }), 'v')).toThrow(corrupt);
    expect(() => parseVolumeSpec(text({ ...good(), replicas: [r('a', 'x'), r('b', 'x')] }), 'v')).toThrow(corrupt);
    expect(() => parseVolumeSpec(text({ ...good(), replicas: [r('a', 'x'), r('b', 'x/y')] }), 'v')).toThrow(corrupt);
  });
  it('refuses newer schema versions as UNSUPPORTED', () => {
    expect(() => parseVolumeSpec(text({ ...good(), version: 2 }), 'v.json')).toThrow(expect.objectContaining({ code: 'UNSUPPORTED' }));
  });
  it('reports API input as INVALID_ARGUMENT', () => {
    expect(() => validateVolumeSpec({ ...good(), name: '' }, 'INVALID_ARGUMENT', 'api')).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    expect(() => checkRelativePath('path', '../x', 'INVALID_ARGUMENT')).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
  });
  it('keeps replica directories inside the volume directory', () => {
    expect(replicaDir('/v', { id: 'r0', path: 'replicas/r0' })).toBe('/v/replicas/r0');
    expect(() => replicaDir('/v', { id: 'r0', path: '../x' })).toThrow(corrupt);
    expect(() => replicaDir('/v', { id: 'r0', path: '.' })).toThrow(corrupt);
  });
});

describe('volume.json files', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'mooring-spec-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('writes atomically and reads back', async () => {
    const spec = good();
    await writeVolumeSpec(dir, spec);
    expect(await readVolumeSpec(dir)).toEqual(spec);
    // No temporary file is left behind.
    expect(await readdir(dir)).toEqual(['volume.json']);
    expect((await readFile(join(dir, 'volume.json'), 'utf8')).endsWith('\n')).toBe(true);
  });
  it('refuses huge files before reading them', async () => {
    await writeFile(join(dir, 'volume.json'), ' '.repeat(2 * 1024 * 1024));
    await expect(readVolumeSpec(dir)).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
  });
  it('reports a missing file as NOT_FOUND', async () => {
    await expect(readVolumeSpec(dir)).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
  it('refuses to write an invalid spec', async () => {
    await expect(writeVolumeSpec(dir, { ...good(), sizeBytes: 1 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});
