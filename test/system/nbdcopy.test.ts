// nbdcopy (libnbd; multi-conn, many requests in flight) both ways: file -> volume -> file,
// bytes compared; a second copy over different content must also zero what the new
// source has as holes.
import { readFileSync } from 'node:fs';
import { afterEach, describe, it } from 'vitest';
import { makeImage, writeSparse } from './helpers/images.js';
import { killAllServers } from './helpers/serve.js';
import { run } from './helpers/tools.js';
import { expectSameBytes, readWholeVolume, VolumeFixture } from './helpers/volume.js';

const SIZE = 64 << 20;

describe.each([1, 3])('nbdcopy on a %i-replica volume', (replicas) => {
  let vol: VolumeFixture | null = null;

  afterEach(async () => {
    await vol?.cleanup();
    vol = null;
    await killAllServers();
  });

  it('copies file -> volume -> file, twice, byte for byte', async () => {
    vol = new VolumeFixture(SIZE, replicas);
    await vol.start();
    let img: Buffer = Buffer.alloc(0);
    for (const round of [1, 2]) {
      img = makeImage(100 * replicas + round, SIZE, 60);
      const src = vol.tmp.join(`src-${round}.raw`);
      const out = vol.tmp.join(`out-${round}.raw`);
      writeSparse(src, img);
      await run('nbdcopy', ['--flush', '--', src, vol.uri]);
      expectSameBytes(await readWholeVolume(vol.uri), img, `round ${round}: volume after nbdcopy file -> nbd`);
      await run('nbdcopy', ['--', vol.uri, out]);
      expectSameBytes(readFileSync(out), img, `round ${round}: file after nbdcopy nbd -> file`);
    }
    // Persisted as copied.
    await vol.restart();
    expectSameBytes(await readWholeVolume(vol.uri), img, 'volume after restart');
    await vol.checkReplicas(img);
  });
});
