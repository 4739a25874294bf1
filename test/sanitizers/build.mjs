#!/usr/bin/env node
// Builds the addon with AddressSanitizer and UndefinedBehaviorSanitizer into build-asan/
// (or $MOORING_ASAN_DIR), apart from the normal build/ and prebuilds/, so that
// MOORING_PREBUILD=build-asan loads it. Incremental: node-gyp's make rebuilds only what
// changed (and everything when the flags change).
//
//   node test/sanitizers/build.mjs
//
// The directory holds links to binding.gyp, native/, package.json and node_modules/, so
// node-gyp builds the same sources with the same binding.gyp; the sanitizer flags come in
// through CFLAGS/CXXFLAGS/LDFLAGS, which gyp's Makefile puts after binding.gyp's own (so
// -O1 wins over -O2). See docs/hardening.md, "Sanitizers".
import { spawnSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, readlinkSync, symlinkSync, unlinkSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const ASAN_DIR = resolve(process.env.MOORING_ASAN_DIR ?? join(ROOT, 'build-asan'));
export const ADDON = join(ASAN_DIR, 'build', 'Release', 'mooring.node');

// -O1 keeps the build and the run fast enough for CI and the stacks readable; -g1 (line
// tables, no variables) gives reports their file:line and builds 30% faster than -g;
// -fno-sanitize-recover=undefined makes a UBSan finding abort like an ASan one instead of
// printing and carrying on; _GLIBCXX_ASSERTIONS adds libstdc++'s bounds checks
// (operator[] past size() but within capacity, which ASan cannot see).
export const COMPILE_FLAGS = [
  '-O1',
  '-g1',
  '-fsanitize=address,undefined',
  '-fno-sanitize-recover=undefined',
  '-fno-omit-frame-pointer',
  '-D_GLIBCXX_ASSERTIONS',
];
export const LINK_FLAGS = ['-fsanitize=address,undefined'];

/** Node's headers for node-gyp, so it builds offline (npm sets this from nodedir=/usr; plain node does not). */
function nodeDir() {
  if (process.env.npm_config_nodedir) return process.env.npm_config_nodedir;
  const prefix = resolve(dirname(process.execPath), '..');
  if (existsSync(join(prefix, 'include', 'node', 'node_api.h'))) return prefix;
  return undefined;
}

function link(name) {
  const at = join(ASAN_DIR, name);
  const target = join(ROOT, name);
  try {
    if (lstatSync(at).isSymbolicLink() && readlinkSync(at) === target) return;
    unlinkSync(at);
  } catch {
    // absent
  }
  symlinkSync(target, at);
}

export function build({ stdio = 'inherit' } = {}) {
  mkdirSync(ASAN_DIR, { recursive: true });
  for (const name of ['binding.gyp', 'native', 'package.json', 'node_modules']) link(name);
  const flags = COMPILE_FLAGS.join(' ');
  const env = {
    ...process.env,
    CFLAGS: flags,
    CXXFLAGS: flags,
    LDFLAGS: LINK_FLAGS.join(' '),
  };
  const dir = nodeDir();
  const args = [join(ROOT, 'node_modules', 'node-gyp', 'bin', 'node-gyp.js'), 'configure', 'build', '--release', '-j', '2'];
  if (dir) args.push(`--nodedir=${dir}`);
  const started = Date.now();
  const r = spawnSync(process.execPath, args, { cwd: ASAN_DIR, env, stdio });
  if (r.error) throw r.error;
  if (r.status !== 0) {
    throw new Error(`node-gyp failed (${r.status ?? r.signal}) building the sanitizer addon in ${ASAN_DIR}`);
  }
  if (!existsSync(ADDON)) throw new Error(`node-gyp succeeded but ${ADDON} is missing`);
  return { ms: Date.now() - started, addon: ADDON };
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  try {
    const { ms, addon } = build();
    process.stdout.write(`sanitizers: built ${addon} in ${(ms / 1000).toFixed(1)} s\n`);
  } catch (err) {
    process.stderr.write(`sanitizers: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  }
}
