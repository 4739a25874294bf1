// The demos' VM: its command-line options (what to boot, how) and its disk, a 3-replica
// volume over a backing image made from the bootable disk given, or from a blank raw file
// for a direct kernel boot.
import { execFile } from 'node:child_process';
import { createReadStream, statSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';

/**
 * Parses the demo's options: the VM's (--image, or --kernel and --initrd; --size; --accel)
 * and the demo's own `extra` ones, described in `usage`; exits 2 when the VM has nothing to boot.
 */
export function parseVmArgs(extra, usage) {
  const options = {
    image: { type: 'string' },
    kernel: { type: 'string' },
    initrd: { type: 'string' },
    size: { type: 'string', default: '64M' },
    accel: { type: 'string', default: 'tcg' },
    ...extra,
  };
  const { values } = parseArgs({ options });
  if (!values.image && !(values.kernel && values.initrd)) {
    process.stderr.write(`usage: ${usage}\n`);
    process.exit(2);
  }
  return values;
}

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
