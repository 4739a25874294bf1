#!/usr/bin/env node
// A volume over a backing image: the base layer every replica reads beneath its own writes.
//
// Two data engines run in this process (in production each host runs its own). A small
// HTTP server stands in for an image registry and serves a raw image with a pattern in its
// first MiB. Mooring downloads it on host a, copies it to host b when the volume's
// replicas need it there (the copy is checked against the image's SHA-512), and creates the
// replicas over it. Reading the volume through its NBD export shows the image's bytes; a
// write lands above the image and the image stays as it was.
//
//   npm run build && node examples/backing-image/demo.mjs
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { Mooring, FileStateStore, LocalDataEngine, MooringError } from '../../dist/index.js';

const MiB = 1024 * 1024;
const log = (line = '') => process.stdout.write(`${line}\n`);
const qemuIo = async (socket, command) => {
  try {
    const { stdout } = await promisify(execFile)('qemu-io', ['-f', 'raw', `nbd+unix:///?socket=${socket}`, '-c', command]);
    return stdout.trim().split('\n')[0];
  } catch (err) {
    if (err.code === 'ENOENT') throw new Error('qemu-io is not installed (apt-get install qemu-utils)');
    return `refused: ${(err.stderr || err.stdout || err.message).trim().split('\n')[0]}`;
  }
};

// The image: 8 MiB raw, 0x5a in its first MiB, zeros after.
const image = Buffer.alloc(8 * MiB);
image.fill(0x5a, 0, MiB);
const server = createServer((req, res) => {
  if (req.url !== '/base.raw') return res.writeHead(404).end();
  res.writeHead(200, { 'content-length': image.length }).end(image);
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const url = `http://127.0.0.1:${server.address().port}/base.raw`;

const root = await mkdtemp(join(tmpdir(), 'mooring-backing-image-demo-'));
const engines = [];
let store;
let mooring;
let failed = false;

try {
  for (const [i, id] of ['a', 'b'].entries()) {
    engines.push(await LocalDataEngine.start({ dir: join(root, id), hostId: id, replicaListen: `tcp:127.0.0.1:${17921 + i}` }));
  }
  store = await FileStateStore.open(join(root, 'state'));
  mooring = await Mooring.open({ store, hosts: engines });

  const img = await mooring.createBackingImage({
    name: 'debian-base',
    source: { type: 'download', url },
    expectedChecksum: createHash('sha512').update(image).digest('hex'),
    host: 'a',
  });
  img.on('ready', (f) => log(`  event ready: file on ${f.hostId}`));
  const st = await img.waitReady({ timeoutMs: 60_000 });
  log(`image ${st.name}: ${st.state}, ${st.format}, ${st.sizeBytes} bytes, sha512 ${st.currentChecksum.slice(0, 16)}...`);

  // Its replicas go to a and b: b gets a copy of the file first.
  const vol = await mooring.createVolume({ name: 'vm1-disk', replicas: 2, hosts: ['a', 'b'], backingImage: 'debian-base' });
  const vst = await vol.status();
  log(`volume ${vst.name}: ${vst.sizeBytes} bytes over ${vst.backingImage}`);
  log(`files: ${(await img.status()).files.map((f) => `${f.hostId}=${f.state}`).join(' ')}`);

  const sock = join(root, 'vm1.sock');
  await vol.attach({ host: 'a', nbd: `unix:${sock}` });
  log(`the image's bytes: ${await qemuIo(sock, 'read -P 0x5a 0 1M')}`);
  log(`a write above it: ${await qemuIo(sock, 'write -P 0x42 0 64k')}`);
  log(`reads back: ${await qemuIo(sock, 'read -P 0x42 0 64k')}`);
  log(`the rest still from the image: ${await qemuIo(sock, 'read -P 0x5a 64k 960k')}`);

  try {
    await img.delete();
  } catch (err) {
    log(`delete while used: ${err.code}`);
  }
  await mooring.volume('vm1-disk').detach();
  await mooring.deleteVolume('vm1-disk');
  await img.delete();
  log('volume and image deleted');
} catch (err) {
  failed = true;
  log(`failed: ${err instanceof MooringError ? `${err.code}: ` : ''}${err.message}`);
} finally {
  await mooring?.close();
  await store?.close();
  for (const e of engines) await e.close().catch(() => undefined);
  server.close();
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
