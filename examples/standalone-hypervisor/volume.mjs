// The demos' VM disk: a 3-replica volume over a backing image made from the bootable disk
// given, or from a blank raw file for a direct kernel boot.
import { execFile } from 'node:child_process';
import { createReadStream, statSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

/** Creates volume `name` on hosts a, b and c over backing image `base`; returns the image's state. */
export async function createVmVolume(mooring, name, { dir, image, size }) {
  let file = image;
  if (!file) {
    file = join(dir, 'blank.raw');
    await promisify(execFile)('qemu-img', ['create', '-f', 'raw', file, size]);
  }
  const img = await mooring.createBackingImage({ name: 'base', source: { type: 'upload', sizeBytes: statSync(file).size }, host: 'a' });
  await img.upload(createReadStream(file));
  const st = await img.waitReady({ timeoutMs: 120_000 });
  await mooring.createVolume({ name, replicas: 3, hosts: ['a', 'b', 'c'], accessMode: 'migratable', backingImage: 'base' });
  return st;
}
