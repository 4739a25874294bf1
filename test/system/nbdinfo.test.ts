// nbdinfo (libnbd): size and flags of the export, and `--map` (base:allocation) reporting
// data where qemu-io wrote and holes where it trimmed, also after a restart. Every range's
// content is checked too.
import { afterEach, describe, expect, it } from 'vitest';
import { killAllServers } from './helpers/serve.js';
import { qemuIo, run } from './helpers/tools.js';
import { VolumeFixture } from './helpers/volume.js';

const SIZE = 32 << 20;
const MiB = 1 << 20;
const KiB = 1024;

interface MapEntry {
  offset: number;
  length: number;
  type: number;
  description: string;
}

async function nbdMap(uri: string): Promise<MapEntry[]> {
  const map = JSON.parse((await run('nbdinfo', ['--map', '--json', uri])).stdout) as MapEntry[];
  // The map must tile the export exactly: no gaps, no overlaps.
  let at = 0;
  for (const e of map) {
    expect(e.offset, `map entry at ${at}`).toBe(at);
    at += e.length;
  }
  expect(at).toBe(SIZE);
  return map;
}

/** Every map entry overlapping [offset, offset+length) satisfies `check(type)`. */
function expectRange(map: MapEntry[], offset: number, length: number, what: string, check: (type: number) => boolean): void {
  const over = map.filter((e) => e.offset < offset + length && e.offset + e.length > offset);
  expect(over.length, `${what}: no map entries`).toBeGreaterThan(0);
  for (const e of over) {
    if (!check(e.type)) expect.fail(`${what} [${offset}, +${length}): map says ${JSON.stringify(e)}\nwhole map: ${JSON.stringify(map)}`);
  }
}

const isData = (t: number): boolean => (t & 1) === 0;
const isHole = (t: number): boolean => (t & 1) === 1;

describe.each([1, 3])('nbdinfo on a %i-replica volume', (replicas) => {
  let vol: VolumeFixture | null = null;

  afterEach(async () => {
    await vol?.cleanup();
    vol = null;
    await killAllServers();
  });

  it('reports size and flags', async () => {
    vol = new VolumeFixture(SIZE, replicas);
    await vol.start();
    const info = JSON.parse((await run('nbdinfo', ['--json', vol.uri])).stdout) as {
      protocol: string;
      structured: boolean;
      exports: Record<string, unknown>[];
    };
    expect(info.protocol).toBe('newstyle-fixed');
    expect(info.structured).toBe(true);
    expect(info.exports).toHaveLength(1);
    const e = info.exports[0]!;
    expect(e['export-size']).toBe(SIZE);
    expect(e).toMatchObject({
      is_read_only: false,
      can_flush: true,
      can_fua: true,
      can_trim: true,
      can_zero: true,
      can_multi_conn: true,
    });
    expect(e.contexts).toContain('base:allocation');
    if (e.block_size_maximum !== undefined) {
      const min = e.block_size_minimum as number;
      const pref = e.block_size_preferred as number;
      const max = e.block_size_maximum as number;
      expect(min & (min - 1)).toBe(0);
      expect(pref & (pref - 1)).toBe(0);
      expect(pref).toBeGreaterThanOrEqual(Math.max(min, 512));
      expect(max).toBeGreaterThanOrEqual(32 * MiB);
    }
  });

  it('serves over TCP on an ephemeral loopback port', async () => {
    vol = new VolumeFixture(SIZE, replicas, { nbd: 'tcp:127.0.0.1:0' });
    const s = await vol.start();
    const m = /^nbd:\/\/127\.0\.0\.1:(\d+)\/?$/.exec(s.ready.uri);
    expect(m, s.ready.uri).not.toBeNull();
    expect(Number(m![1])).toBeGreaterThan(0);
    expect(s.ready.nbd).toBe(`tcp:127.0.0.1:${m![1]}`);
    const info = JSON.parse((await run('nbdinfo', ['--json', s.ready.uri])).stdout) as { exports: Record<string, unknown>[] };
    expect(info.exports[0]!['export-size']).toBe(SIZE);
    await qemuIo(s.ready.uri, ['write -P 0x3c 12345 70000', 'read -P 0x3c 12345 70000', 'read -P 0 0 12345']);
    await vol.checkReplicas();
  });

  it('--map shows data where written and holes where trimmed', async () => {
    vol = new VolumeFixture(SIZE, replicas);
    await vol.start();
    // Fresh volume: all hole.
    expectRange(await nbdMap(vol.uri), 0, SIZE, 'fresh volume', isHole);

    await qemuIo(vol.uri, [
      `write -P 0x61 ${1 * MiB} ${64 * KiB}`,
      `write -P 0x62 ${4 * MiB} ${4 * MiB}`,
      `write -P 0x63 ${12 * MiB + 4 * KiB} ${8 * KiB}`,
      `write -P 0x64 ${20 * MiB} ${2 * MiB}`,
      `discard ${5 * MiB} ${1 * MiB}`, // trim inside written data
      `write -z -u ${6 * MiB} ${1 * MiB}`, // zero, may unmap
      `write -z ${21 * MiB} ${512 * KiB}`, // zero, must stay allocated-or-zero
      `discard ${24 * MiB} ${1 * MiB}`, // trim of never-written space
    ]);

    const check = async (when: string): Promise<void> => {
      const map = await nbdMap(vol!.uri);
      expectRange(map, 1 * MiB, 64 * KiB, `${when}: data A`, isData);
      expectRange(map, 4 * MiB, 1 * MiB, `${when}: data B before trim`, isData);
      expectRange(map, 5 * MiB, 1 * MiB, `${when}: trimmed range`, (t) => t === 3);
      // Zeroes that may unmap: Mooring punches a hole (space reclaimed), like TRIM.
      expectRange(map, 6 * MiB, 1 * MiB, `${when}: write -z -u range`, (t) => t === 3);
      expectRange(map, 7 * MiB, 1 * MiB, `${when}: data B after zeroes`, isData);
      expectRange(map, 12 * MiB + 4 * KiB, 8 * KiB, `${when}: data C`, isData);
      expectRange(map, 20 * MiB, 1 * MiB, `${when}: data D`, isData);
      expectRange(map, 21 * MiB + 512 * KiB, 512 * KiB, `${when}: data D after zeroes`, isData);
      // Never written: holes (well away from the writes, whatever the block granularity).
      expectRange(map, 0, 1 * MiB, `${when}: start`, isHole);
      expectRange(map, 2 * MiB, 2 * MiB, `${when}: gap`, isHole);
      expectRange(map, 14 * MiB, 6 * MiB, `${when}: gap`, isHole);
      expectRange(map, 23 * MiB, SIZE - 23 * MiB, `${when}: tail`, isHole);
      // And the content agrees with the map.
      await qemuIo(vol!.uri, [
        `read -P 0x61 ${1 * MiB} ${64 * KiB}`,
        `read -P 0x62 ${4 * MiB} ${1 * MiB}`,
        `read -P 0 ${5 * MiB} ${2 * MiB}`,
        `read -P 0x62 ${7 * MiB} ${1 * MiB}`,
        `read -P 0 ${12 * MiB} ${4 * KiB}`,
        `read -P 0x63 ${12 * MiB + 4 * KiB} ${8 * KiB}`,
        `read -P 0x64 ${20 * MiB} ${1 * MiB}`,
        `read -P 0 ${21 * MiB} ${512 * KiB}`,
        `read -P 0x64 ${21 * MiB + 512 * KiB} ${512 * KiB}`,
        `read -P 0 ${22 * MiB} ${SIZE - 22 * MiB}`,
      ]);
    };
    await check('served');
    await vol.restart();
    await check('after restart');
    await vol.checkReplicas();
  });
});
