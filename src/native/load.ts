/**
 * Finds and loads the native addon (node-gyp-build: build/Release, then prebuilds/).
 *
 * The package root is found by walking up from this module to the package.json named
 * "mooring", so the same code works from src/ (vitest), dist/index.js (ESM) and
 * dist/index.cjs (CJS; tsup's `shims` provides import.meta.url there).
 */
import { readFileSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { arch, platform } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import nodeGypBuild from 'node-gyp-build';

import { MooringError } from '../errors.js';
import type { NativeAddon } from './binding.js';

/** The package name the loader looks for while walking up. */
const PACKAGE_NAME = 'mooring';
/** How many directories the walk up may climb before giving up. */
const PACKAGE_SEARCH_DEPTH_MAX = 8;

let cachedAddon: NativeAddon | undefined;

/**
 * The directory of the mooring package this module belongs to.
 *
 * @param fromUrl - where to start walking up (defaults to this module)
 * @throws MooringError NATIVE_LOAD_FAILED when no package.json named "mooring" is found
 * @internal
 */
export function findPackageRoot(fromUrl: string = import.meta.url): string {
  const tried: string[] = [];
  let dir = dirname(fileURLToPath(fromUrl));
  for (let i = 0; i < PACKAGE_SEARCH_DEPTH_MAX; i++) {
    const candidate = join(dir, 'package.json');
    tried.push(candidate);
    try {
      const pkg = JSON.parse(readFileSync(candidate, 'utf8')) as { name?: unknown };
      if (pkg.name === PACKAGE_NAME) return dir;
    } catch {
      // Missing or unreadable: keep climbing.
    }
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  throw new MooringError(
    'NATIVE_LOAD_FAILED',
    `cannot find the ${PACKAGE_NAME} package root above ${fileURLToPath(fromUrl)}; looked at:\n` +
      tried.map((t) => `  ${t}`).join('\n'),
    { details: { tried } },
  );
}

/** The package version from package.json, or '0.0.0' when it cannot be read. @internal */
export function packageVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(join(findPackageRoot(), 'package.json'), 'utf8')) as {
      version?: unknown;
    };
    return typeof pkg.version === 'string' ? pkg.version : '0.0.0';
  } catch {
    return '0.0.0';
  }
}

function listNodeFiles(dir: string): string[] {
  try {
    return readdirSync(dir)
      .filter((f) => f.endsWith('.node'))
      .map((f) => join(dir, f));
  } catch {
    return [];
  }
}

function looksLikeAddon(value: unknown): value is NativeAddon {
  const v = value as Partial<NativeAddon> | null;
  return (
    typeof v === 'object' &&
    v !== null &&
    typeof v.createReplica === 'function' &&
    typeof v.openEngine === 'function'
  );
}

/**
 * Loads the addon from `root` (default: this package) without caching.
 *
 * @throws MooringError NATIVE_LOAD_FAILED naming every place tried and how to fix it
 * @internal
 */
export function loadAddonFrom(root: string): NativeAddon {
  const platformTag = `${platform()}-${arch()}`;
  const candidates = [
    join(root, 'build', 'Release'),
    join(root, 'build', 'Debug'),
    join(root, 'prebuilds', platformTag),
  ];
  const override = process.env.MOORING_PREBUILD;
  let chosen: string | undefined;
  let cause: unknown;
  try {
    chosen = nodeGypBuild.resolve(root);
    const req = createRequire(join(root, 'package.json'));
    const addon: unknown = req(chosen);
    if (!looksLikeAddon(addon)) {
      throw new Error(`${chosen} loaded but does not export createReplica/openEngine (wrong file?)`);
    }
    return addon;
  } catch (err) {
    cause = err;
  }
  const found = candidates.flatMap(listNodeFiles);
  const causeText = cause instanceof Error ? cause.message.trim() : String(cause);
  const lines = [
    `the native addon could not be loaded (${platformTag}, node ${process.versions.node}, N-API ${process.versions.napi ?? '?'})`,
    `  package root: ${root}`,
    `  looked in: ${candidates.join(', ')}${override ? `, MOORING_PREBUILD=${override}` : ''}`,
    `  .node files found there: ${found.length > 0 ? found.join(', ') : 'none'}`,
    ...(chosen ? [`  chosen: ${chosen}`] : []),
    `  error: ${causeText}`,
    'how to fix:',
    '  - in a source checkout, build it: `npm run build` (or `npm run build:native`; needs g++ and make)',
    '  - prebuilt binaries ship in the package under prebuilds/ for linux-x64 only;' +
      (platformTag === 'linux-x64' ? ' reinstall the package if they are missing' : ` this machine is ${platformTag}`),
    '  - a stale build/Release/*.node shadows the prebuilds: delete build/ after a bare `node-gyp rebuild`',
    '  - MOORING_PREBUILD=/dir (a directory with prebuilds/ or build/) loads the addon from elsewhere',
  ];
  throw new MooringError('NATIVE_LOAD_FAILED', lines.join('\n'), {
    cause,
    details: { root, tried: candidates, found, ...(chosen ? { chosen } : {}) },
  });
}

/**
 * The native addon of this package, loaded once on first use.
 *
 * @throws MooringError NATIVE_LOAD_FAILED
 * @internal
 */
export function loadAddon(): NativeAddon {
  if (cachedAddon === undefined) {
    cachedAddon = loadAddonFrom(resolve(findPackageRoot()));
    const pkgVersion = packageVersion();
    const addonVersion = typeof cachedAddon.version === 'string' ? cachedAddon.version : 'unknown';
    if (addonVersion !== pkgVersion) {
      process.emitWarning(
        `mooring: native addon version ${addonVersion} differs from package version ${pkgVersion}; rebuild with \`npm run build\``,
        { code: 'MOORING_ADDON_VERSION' },
      );
    }
  }
  return cachedAddon;
}
