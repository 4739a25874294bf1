// The shipped prebuilds load on old distributions: every dynamic symbol of every
// prebuilds/<platform>-<arch>/*.node may need at most the glibc of its architecture's
// floor (x64: GLIBC_2.28, RHEL/Rocky 8; arm64: GLIBC_2.17, its first glibc), and no
// GLIBCXX_/CXXABI_ version at all (libstdc++ is linked statically). objdump -T (binutils)
// reads the version tags; without it the test fails. See docs/dependencies.md, "glibc floor".
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot, requireBuilt } from '../system/helpers/tools.js';

/** The newest glibc symbol version each shipped architecture may need. */
const GLIBC_FLOOR: Record<string, string> = { x64: '2.28', arm64: '2.17' };

function versionParts(v: string): number[] {
  return v.split('.').map((n) => Number(n));
}

function newer(a: string, b: string): boolean {
  const pa = versionParts(a);
  const pb = versionParts(b);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const x = pa[i] ?? 0;
    const y = pb[i] ?? 0;
    if (x !== y) return x > y;
  }
  return false;
}

/** The offending lines of `objdump -T` output: glibc versions newer than floor, any GLIBCXX_/CXXABI_. */
export function badSymbols(objdumpT: string, floor: string): string[] {
  const bad: string[] = [];
  for (const line of objdumpT.split('\n')) {
    const m = /\s\(?((?:GLIBC|GLIBCXX|CXXABI)_[0-9.]+)\)?\s+(\S+)\s*$/.exec(line);
    if (!m) continue;
    const [tag, symbol] = [m[1]!, m[2]!];
    if (tag.startsWith('GLIBCXX_') || tag.startsWith('CXXABI_')) bad.push(`${symbol} (${tag})`);
    else if (newer(tag.slice('GLIBC_'.length), floor)) bad.push(`${symbol} (${tag})`);
  }
  return bad;
}

function objdump(file: string): string {
  const r = spawnSync('objdump', ['-T', file], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
  if (r.error) throw new Error(`objdump -T ${file}: ${r.error.message} (install binutils; .ci/setup.sh does)`);
  if (r.status !== 0) throw new Error(`objdump -T ${file} exited ${r.status}: ${r.stderr}`);
  return r.stdout;
}

function shippedPrebuilds(): { arch: string; file: string }[] {
  const root = join(repoRoot, 'prebuilds');
  const out: { arch: string; file: string }[] = [];
  for (const dir of readdirSync(root, { withFileTypes: true })) {
    if (!dir.isDirectory()) continue;
    for (const f of readdirSync(join(root, dir.name))) {
      if (f.endsWith('.node')) out.push({ arch: dir.name.split('-').slice(1).join('-'), file: join(root, dir.name, f) });
    }
  }
  return out;
}

describe('prebuild symbol versions', () => {
  it('the check itself flags too-new glibc and any libstdc++ version', () => {
    const sample = [
      '0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.2.5) pthread_rwlock_init',
      '0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.28) fcntl64',
      '0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.34) dlopen',
      '0000000000000000      DO *UND*\t0000000000000000 (GLIBC_2.32) __libc_single_threaded',
      '0000000000000000      DF *UND*\t0000000000000000 (GLIBCXX_3.4.30) _ZNSt3_V215__glibcxx_rwlock',
      '0000000000000000      DF *UND*\t0000000000000000 (CXXABI_1.3) __cxa_begin_catch',
      '0000000000000000      DF *UND*\t0000000000000000  GLIBC_2.29  exp',
    ].join('\n');
    expect(badSymbols(sample, '2.28')).toEqual([
      'dlopen (GLIBC_2.34)',
      '__libc_single_threaded (GLIBC_2.32)',
      '_ZNSt3_V215__glibcxx_rwlock (GLIBCXX_3.4.30)',
      '__cxa_begin_catch (CXXABI_1.3)',
      'exp (GLIBC_2.29)',
    ]);
    expect(badSymbols(sample, '2.17')).toContain('fcntl64 (GLIBC_2.28)');
  });

  it('objdump is installed (binutils)', () => {
    const r = spawnSync('objdump', ['--version'], { encoding: 'utf8' });
    expect(r.error, 'objdump is missing: install binutils (.ci/setup.sh does)').toBeUndefined();
    expect(r.status).toBe(0);
  });

  it('every shipped prebuild needs no glibc newer than its floor and no libstdc++', () => {
    requireBuilt(['prebuilds/linux-x64/mooring.node', 'prebuilds/linux-arm64/mooring.node']);
    const prebuilds = shippedPrebuilds();
    expect(prebuilds.map((p) => p.arch).sort()).toEqual(['arm64', 'x64']);
    for (const { arch, file } of prebuilds) {
      const floor = GLIBC_FLOOR[arch];
      expect(floor, `no glibc floor known for ${file} (arch ${arch})`).toBeDefined();
      const dump = objdump(file);
      // The dump must have glibc-versioned symbols at all, or the parse found nothing to check.
      expect(dump).toMatch(/\(GLIBC_2\.[0-9.]+\)/);
      // A --wrap whose __real_/__wrap_ partner is missing would only fail at load time.
      expect(dump.split('\n').filter((l) => /\b__(real|wrap)_/.test(l)), `${file} has unresolved --wrap symbols`).toEqual([]);
      expect(badSymbols(dump, floor!), `${file} needs symbols newer than GLIBC_${floor} or libstdc++'s`).toEqual([]);
    }
  });
});
