import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { findPackageRoot, loadAddonFrom, packageVersion } from '../../../src/native/load.js';

describe('native addon loader', () => {
  let root: string;
  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-load-'));
    // node-gyp-build would look in MOORING_PREBUILD instead of the directory under test.
    vi.stubEnv('MOORING_PREBUILD', undefined);
  });
  afterEach(async () => {
    vi.unstubAllEnvs();
    await rm(root, { recursive: true, force: true });
  });

  it('finds the package root from src/', () => {
    expect(findPackageRoot()).toBe(resolve(__dirname, '../../..'));
    expect(packageVersion()).toMatch(/^\d+\.\d+\.\d+/);
  });

  it('walks up to the package.json named mooring', async () => {
    await writeFile(join(root, 'package.json'), JSON.stringify({ name: 'mooring' }));
    await mkdir(join(root, 'dist', 'deep'), { recursive: true });
    await writeFile(join(root, 'dist', 'package.json'), JSON.stringify({ name: 'other' }));
    expect(findPackageRoot(pathToFileURL(join(root, 'dist', 'deep', 'index.js')).href)).toBe(root);
  });

  it('says what it looked at when there is no package root', () => {
    expect(() => findPackageRoot(pathToFileURL('/nonexistent/a/b/c.js').href)).toThrow(
      expect.objectContaining({ code: 'NATIVE_LOAD_FAILED', message: expect.stringContaining('/nonexistent/a/b/package.json') }),
    );
  });

  it('fails with NATIVE_LOAD_FAILED listing what was tried and how to fix it', async () => {
    await writeFile(join(root, 'package.json'), JSON.stringify({ name: 'mooring' }));
    let err: unknown;
    try {
      loadAddonFrom(root);
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ code: 'NATIVE_LOAD_FAILED' });
    const message = (err as Error).message;
    expect(message).toContain(join(root, 'build', 'Release'));
    expect(message).toContain(join(root, 'prebuilds', 'linux-x64'));
    expect(message).toContain('npm run build');
    expect(message).toContain('linux-x64');
    expect((err as Error).cause).toBeInstanceOf(Error);
  });

  it('refuses a .node file that is not the mooring addon', async () => {
    await writeFile(join(root, 'package.json'), JSON.stringify({ name: 'mooring' }));
    await mkdir(join(root, 'prebuilds', 'linux-x64'), { recursive: true });
    await writeFile(join(root, 'prebuilds', 'linux-x64', 'mooring.napi.node'), 'not an ELF file');
    expect(() => loadAddonFrom(root)).toThrow(expect.objectContaining({ code: 'NATIVE_LOAD_FAILED', message: expect.stringContaining('mooring.napi.node') }));
  });
});
