// The package as users get it: `npm pack`, install the tarball into a scratch project, and
// use it (the main entry and `mooring/internal`) from both `import` (ESM) and `require`
// (CJS). The install must not compile anything: compilers on PATH are replaced by
// tripwires, no build/ directory may appear, and the addon that gets loaded must be the
// shipped prebuild.
import { chmodSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot, requireBuilt, run, TempDir } from '../system/helpers/tools.js';

const tmp = new TempDir('mooring-pack-');
const project = tmp.join('project');
const tripwires = tmp.join('tripwires');
const tripLog = tmp.join('tripwires.log');
let tarball = '';
let pkgVersion = '';

/** The environment for child npm/node: no npm_* leftovers from the `npm test` that runs us. */
function cleanEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  const keep = new Set(['npm_config_cache', 'npm_config_registry', 'npm_config_userconfig', 'npm_config_nodedir']);
  for (const [k, v] of Object.entries(process.env)) {
    if (k.toLowerCase().startsWith('npm_') && !keep.has(k.toLowerCase())) continue;
    env[k] = v;
  }
  env.PATH = `${tripwires}:${process.env.PATH ?? ''}`;
  env.NO_UPDATE_NOTIFIER = '1';
  return env;
}

const SCRIPT_BODY = `
  const dir = mkdtempSync(join(tmpdir(), 'mooring-use-'));
  try {
    // The embedded default: the store and this host's data engine (the addon) in one directory.
    const m = await Mooring.open({ dir: join(dir, 'm') });
    const volume = await m.createVolume({ name: 'disk0', sizeBytes: 8 * 1024 * 1024 });
    const st = await volume.attach({ nbd: 'unix:' + join(dir, 'disk0.sock') });
    if (st.state !== 'healthy' || !st.nbd || !st.nbd.uri.includes('disk0.sock')) throw new Error('attach: ' + JSON.stringify(st));
    await volume.detach();
    if ((await volume.status()).state !== 'detached') throw new Error('detach did not detach');
    await m.close();
    if (typeof MooringError !== 'function') throw new Error('MooringError is not exported');
    // The subpath for the repository's tools and tests: its own names, none of the main entry's.
    if (typeof internal.parseNbdAddress !== 'function' || typeof internal.EpochAllocator !== 'function') throw new Error('mooring/internal lacks its exports');
    if ('parseNbdAddress' in mooring || 'Mooring' in internal) throw new Error('mooring and mooring/internal overlap');
    const maps = readFileSync('/proc/self/maps', 'utf8').split('\\n');
    const loaded = [...new Set(maps.map((l) => l.split(/\\s+/).pop()).filter((p) => p && p.endsWith('.node')))];
    console.log('RESULT ' + JSON.stringify({ flavour: FLAVOUR, loaded }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
`;

describe('npm package', () => {
  beforeAll(async () => {
    requireBuilt(['dist/index.js', 'dist/index.cjs', 'dist/internal.js', 'dist/internal.cjs', 'dist/cli.js', 'prebuilds/linux-x64/mooring.node']);
    mkdirSync(tripwires);
    for (const tool of ['cc', 'gcc', 'g++', 'c++', 'clang', 'clang++', 'make', 'node-gyp']) {
      const p = join(tripwires, tool);
      writeFileSync(p, `#!/bin/sh\necho "${tool} $*" >> ${tripLog}\nexit 1\n`);
      chmodSync(p, 0o755);
    }
    const packed = await run('npm', ['pack', '--json', '--pack-destination', tmp.path], { cwd: repoRoot, env: cleanEnv(), timeoutMs: 120_000 });
    const info = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('['))) as { filename: string; version: string; size: number; unpackedSize: number; files: { path: string }[] }[];
    console.log(`npm pack: ${info[0]!.files.length} files, ${(info[0]!.size / 1e6).toFixed(2)} MB packed, ${(info[0]!.unpackedSize / 1e6).toFixed(2)} MB unpacked`);
    tarball = join(tmp.path, info[0]!.filename);
    pkgVersion = info[0]!.version;
    const files = info[0]!.files.map((f) => f.path);
    for (const f of ['package.json', 'dist/index.js', 'dist/index.cjs', 'dist/index.d.ts', 'dist/index.d.cts', 'dist/internal.js', 'dist/internal.cjs', 'dist/internal.d.ts', 'dist/internal.d.cts', 'dist/cli.js', 'prebuilds/linux-x64/mooring.node', 'prebuilds/linux-arm64/mooring.node']) {
      expect(files, `tarball lacks ${f}`).toContain(f);
    }
    expect(files.filter((f) => f.startsWith('test/') || f.startsWith('node_modules/') || f.startsWith('build/'))).toEqual([]);
    // Nothing dead: no source maps, and the bins only as the ESM files package.json names.
    expect(files.filter((f) => f.endsWith('.map') || f === 'dist/cli.cjs' || f === 'dist/lock-exec.cjs')).toEqual([]);

    mkdirSync(project);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'mooring-scratch', version: '1.0.0', private: true }, null, 2));
    await run('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', tarball], { cwd: project, env: cleanEnv(), timeoutMs: 180_000 });
  });

  afterAll(() => tmp.cleanup());

  it('installs without compiling', () => {
    const installed = join(project, 'node_modules', 'mooring');
    expect(existsSync(join(installed, 'package.json'))).toBe(true);
    expect(existsSync(join(installed, 'prebuilds', 'linux-x64', 'mooring.node'))).toBe(true);
    expect(existsSync(join(installed, 'build')), 'a build/ directory means node-gyp ran on install').toBe(false);
    expect(existsSync(tripLog), 'a compiler or make was called during npm install').toBe(false);
  });

  it.each([
    ['esm', 'use.mjs', `import * as mooring from 'mooring';\nimport * as internal from 'mooring/internal';\nconst { Mooring, MooringError } = mooring;\nimport { mkdtempSync, readFileSync, rmSync } from 'node:fs';\nimport { tmpdir } from 'node:os';\nimport { join } from 'node:path';\nconst FLAVOUR = 'esm';\n${SCRIPT_BODY}`],
    ['cjs', 'use.cjs', `const mooring = require('mooring');\nconst internal = require('mooring/internal');\nconst { Mooring, MooringError } = mooring;\nconst { mkdtempSync, readFileSync, rmSync } = require('node:fs');\nconst { tmpdir } = require('node:os');\nconst { join } = require('node:path');\nconst FLAVOUR = 'cjs';\n(async () => {\n${SCRIPT_BODY}\n})().catch((e) => { console.error(e); process.exit(1); });`],
  ])('works from %s', async (flavour, file, source) => {
    writeFileSync(join(project, file), source);
    const r = await run(process.execPath, [file], { cwd: project, env: cleanEnv(), timeoutMs: 60_000 });
    const line = /^RESULT (.*)$/m.exec(r.stdout);
    expect(line, r.stdout + r.stderr).not.toBeNull();
    const result = JSON.parse(line![1]!) as { flavour: string; loaded: string[] };
    expect(result.flavour).toBe(flavour);
    expect(result.loaded).toEqual([join(project, 'node_modules', 'mooring', 'prebuilds', 'linux-x64', 'mooring.node')]);
  });

  it('installs the mooring command', async () => {
    const r = await run(join(project, 'node_modules', '.bin', 'mooring'), ['--version'], { cwd: project, env: cleanEnv(), timeoutMs: 30_000 });
    expect(r.stdout).toContain(pkgVersion);
    const help = await run(join(project, 'node_modules', '.bin', 'mooring'), ['serve', '--help'], { cwd: project, env: cleanEnv(), timeoutMs: 30_000 });
    expect(help.stdout + help.stderr).toMatch(/--dir/);
  });
});
