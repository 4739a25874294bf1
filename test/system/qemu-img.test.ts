// qemu-img against the NBD export: info reports the virtual size; convert copies a raw
// file into the volume and the volume out to raw and qcow2 files; compare agrees with the
// bytes and notices a one-byte change. Replicas stay identical.
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { makeImage, writeSparse } from './helpers/images.js';
import { killAllServers } from './helpers/serve.js';
import { qemuIo, run } from './helpers/tools.js';
import { expectSameBytes, readWholeVolume, VolumeFixture } from './helpers/volume.js';

const SIZE = 48 << 20;

describe.each([1, 3])('qemu-img on a %i-replica volume', (replicas) => {
  let vol: VolumeFixture | null = null;

  afterEach(async () => {
    await vol?.cleanup();
    vol = null;
    await killAllServers();
  });

  it('info, convert both ways (raw and qcow2), compare', async () => {
    vol = new VolumeFixture(SIZE, replicas);
    await vol.start();

    const info = JSON.parse((await run('qemu-img', ['info', '--output=json', '-f', 'raw', vol.uri])).stdout) as { 'virtual-size': number; format: string };
    expect(info['virtual-size']).toBe(SIZE);
    expect(info.format).toBe('raw');

    // raw file -> volume
    const img = makeImage(11 + replicas, SIZE);
    const src = vol.tmp.join('src.raw');
    writeSparse(src, img);
    await run('qemu-img', ['convert', '-n', '-f', 'raw', '-O', 'raw', src, vol.uri]);
    expectSameBytes(await readWholeVolume(vol.uri), img, 'volume after qemu-img convert raw -> nbd');
    await run('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', src, vol.uri]);

    // volume -> raw and -> qcow2
    const outRaw = vol.tmp.join('out.raw');
    await run('qemu-img', ['convert', '-f', 'raw', '-O', 'raw', vol.uri, outRaw]);
    expectSameBytes(readFileSync(outRaw), img, 'raw file converted from the volume');
    const outQcow = vol.tmp.join('out.qcow2');
    await run('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', vol.uri, outQcow]);
    await run('qemu-img', ['compare', '-f', 'qcow2', '-F', 'raw', outQcow, src]);

    // qcow2 -> volume after changing the volume: the copy restores it exactly.
    await qemuIo(vol.uri, ['write -P 0x5a 1000 70000']);
    const diff = await run('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', src, vol.uri], { allowFailure: true });
    expect(diff.code, diff.stdout + diff.stderr).toBe(1);
    expect(diff.stdout).toMatch(/Content mismatch at offset/);
    await run('qemu-img', ['convert', '-n', '-f', 'qcow2', '-O', 'raw', outQcow, vol.uri]);
    await run('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', src, vol.uri]);
    expectSameBytes(await readWholeVolume(vol.uri), img, 'volume after qemu-img convert qcow2 -> nbd');

    await vol.checkReplicas(img);
  });
});
