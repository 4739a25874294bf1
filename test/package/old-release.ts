// The previous release as its users got it, for the version-skew test: the commit's tree
// (git archive, from this repository's history), `npm ci --ignore-scripts`, `npm run build`
// (native and TypeScript), `npm pack`, and the tarball installed into a scratch project.
// The result is kept under node_modules/.cache/mooring-skew/<commit>/ and reused by the next
// run in the same checkout (a marker file is written last, so a cut-short build is redone).
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot, run } from '../system/helpers/tools.js';

export interface OldRelease {
  /** The full commit id. */
  commit: string;
  /** The scratch project the tarball is installed in (`import 'mooring'` from a file here loads it). */
  project: string;
  /** The installed package's directory. */
  packageDir: string;
  /** Its dist/cli.js (`node CLI data-engine ...` runs the old data engine). */
  cli: string;
  /** Its package.json version. */
  version: string;
  /** Whether this run built it (false: taken from the cache). */
  built: boolean;
}

/** The environment for child npm/node: no npm_* leftovers from the `npm test` that runs us. */
export function cleanNpmEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  const keep = new Set(['npm_config_cache', 'npm_config_registry', 'npm_config_userconfig', 'npm_config_nodedir']);
  for (const [k, v] of Object.entries(process.env)) {
    if (k.toLowerCase().startsWith('npm_') && !keep.has(k.toLowerCase())) continue;
    env[k] = v;
  }
  env.NO_UPDATE_NOTIFIER = '1';
  return env;
}

async function resolveCommit(commit: string): Promise<string> {
  const r = await run('git', ['-C', repoRoot, 'rev-parse', '--verify', '--quiet', `${commit}^{commit}`], { allowFailure: true, timeoutMs: 30_000 });
  if (r.code === 0) return r.stdout.trim();
  const shallow = await run('git', ['-C', repoRoot, 'rev-parse', '--is-shallow-repository'], { allowFailure: true, timeoutMs: 30_000 });
  throw new Error(
    `the version-skew test needs commit ${commit} (the previous release) in the history of ${repoRoot}, and it is not there` +
      (shallow.stdout.trim() === 'true' ? ' (this is a shallow clone: run `git fetch --unshallow`, or clone without --depth)' : '') +
      `\n--- git rev-parse stderr ---\n${r.stderr}`,
  );
}

/** Builds (or takes from the cache) the release at `commit`, packed and installed. */
export async function oldRelease(commit: string): Promise<OldRelease> {
  const full = await resolveCommit(commit);
  const root = join(repoRoot, 'node_modules', '.cache', 'mooring-skew', full);
  const project = join(root, 'project');
  const packageDir = join(project, 'node_modules', 'mooring');
  const cli = join(packageDir, 'dist', 'cli.js');
  const marker = join(root, 'installed.json');
  const result = (built: boolean): OldRelease => ({
    commit: full,
    project,
    packageDir,
    cli,
    version: (JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8')) as { version: string }).version,
    built,
  });
  if (existsSync(marker) && existsSync(cli) && existsSync(join(packageDir, 'prebuilds', 'linux-x64', 'mooring.node'))) return result(false);

  rmSync(root, { recursive: true, force: true });
  const src = join(root, 'src');
  mkdirSync(src, { recursive: true });
  const env = cleanNpmEnv();
  await run('git', ['-C', repoRoot, 'archive', '--format=tar', '-o', join(root, 'src.tar'), full], { timeoutMs: 60_000 });
  await run('tar', ['-xf', join(root, 'src.tar'), '-C', src], { timeoutMs: 60_000 });
  rmSync(join(root, 'src.tar'));
  // The dependencies come from the npm cache the current checkout's `npm ci` filled (the
  // registry is asked only for what is not there).
  await run('npm', ['ci', '--ignore-scripts', '--no-audit', '--no-fund', '--prefer-offline'], { cwd: src, env, timeoutMs: 300_000 });
  await run('npm', ['run', 'build'], { cwd: src, env, timeoutMs: 600_000 });
  const packed = await run('npm', ['pack', '--json', '--pack-destination', root], { cwd: src, env, timeoutMs: 120_000 });
  const info = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('['))) as { filename: string }[];
  const tarball = join(root, info[0]!.filename);
  mkdirSync(project);
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'mooring-skew-old', version: '1.0.0', private: true, type: 'module' }, null, 2));
  await run('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', tarball], { cwd: project, env, timeoutMs: 300_000 });
  // The source tree (with its own node_modules) is not needed once the package is installed.
  rmSync(src, { recursive: true, force: true });
  if (!existsSync(cli)) throw new Error(`the installed previous release has no ${cli}`);
  writeFileSync(marker, JSON.stringify({ commit: full, tarball }));
  return result(true);
}
