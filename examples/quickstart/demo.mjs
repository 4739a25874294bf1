#!/usr/bin/env node
// Mooring quickstart: a 3-replica volume in a temporary directory, written and read through
// the library, snapshotted, and served over NBD on a unix socket.
//
//   npm run build && npm run demo            serve until Ctrl-C
//   npm run demo -- --once   (or CI=1)       print everything, then close and exit
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { MooringError, Volume } from '../../dist/index.js';

const once = process.argv.includes('--once') || Boolean(process.env.CI);
const MiB = 1024 * 1024;
const log = (line = '') => process.stdout.write(`${line}\n`);

const root = await mkdtemp(join(tmpdir(), 'mooring-demo-'));
const dir = join(root, 'disk0');
let volume;
let failed = false;
try {
  // 1. Create: three replica directories under dir/replicas, described by dir/volume.json.
  volume = await Volume.create({ dir, sizeBytes: 64 * MiB, replicas: 3, name: 'demo' });
  volume.on('replica-error', (e) => log(`! replica ${e.replicaId} failed: ${e.code} ${e.message}`));
  log(`created volume ${volume.name}: ${volume.sizeBytes / MiB} MiB, ${volume.replicaCount} replicas, epoch ${volume.epoch}`);
  log(`  directory ${dir}`);

  // 2. Write through the library (each write reaches all three replicas before it resolves),
  //    including an unaligned one, then read back and compare.
  const block = Buffer.alloc(64 * 1024, 0xab);
  const text = Buffer.from('hello from mooring\n');
  await volume.write(0, block);
  await volume.write(1 * MiB + 123, text);
  await volume.flush();
  const back = await volume.read(0, block.length);
  const backText = await volume.read(1 * MiB + 123, text.length);
  if (!back.equals(block) || !backText.equals(text)) throw new Error('read-back mismatch');
  log(`wrote ${block.length} bytes at 0 and ${text.length} bytes at ${1 * MiB + 123}; read back and verified`);

  // 3. Snapshot (O(1): no data copied), then change the volume so the snapshot differs.
  await volume.createSnapshot('first', { labels: { made_by: 'demo' } });
  await volume.write(0, Buffer.alloc(4096, 0xcd));
  for (const s of await volume.listSnapshots()) {
    log(`snapshot ${s.name}: created ${new Date(s.createdMs).toISOString()}, labels ${JSON.stringify(s.labels)}`);
  }
  const map = await volume.blockStatus(0, 2 * MiB);
  log(`allocation of the first 2 MiB: ${map.map((e) => `${e.offset}+${e.length} ${e.hole ? 'hole' : 'data'}`).join(', ')}`);
  const status = await volume.status();
  for (const r of status.replicas) log(`replica ${r.id}: ${r.mode}, epoch ${r.epoch}, ${r.allocatedBytes} bytes allocated`);

  // 4. Export over NBD on a unix socket (dir/nbd.sock by default).
  const nbd = await volume.export();
  const uri = nbd.uri;
  log();
  log(`serving over NBD at ${nbd.addressString}`);
  log(`  URI: ${uri}`);
  log('connect a client, e.g.:');
  log(`  nbdinfo '${uri}'`);
  log(`  nbdinfo --map '${uri}'`);
  log(`  qemu-img info '${uri}'`);
  log(`  qemu-io -f raw -c 'read -P 0xcd 0 4k' -c 'read -P 0xab 4k 60k' '${uri}'`);
  log(`  qemu-img convert -p -O qcow2 '${uri}' /tmp/demo-copy.qcow2`);
  log(`  fio --name=demo --ioengine=nbd --uri='${uri}' --rw=randrw --bs=4k --iodepth=16 --size=64M --runtime=10 --time_based`);
  log(`  (qemu: -blockdev driver=nbd,server.type=unix,server.path=${nbd.address.path},node-name=disk0)`);

  if (once) {
    log();
    log('--once: closing now (run without --once to keep serving until Ctrl-C)');
  } else {
    log();
    log('serving until Ctrl-C ...');
    await new Promise((resolve) => {
      const keepAlive = setInterval(() => undefined, 1 << 30);
      const stop = (signal) => {
        log(`\n${signal}: draining and closing`);
        clearInterval(keepAlive);
        resolve();
      };
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
    });
  }
} catch (err) {
  failed = true;
  if (err instanceof MooringError) {
    process.stderr.write(`demo failed: ${err.code}: ${err.message}\n`);
    if (err.code === 'NATIVE_LOAD_FAILED') process.stderr.write('(run `npm run build` first)\n');
  } else {
    process.stderr.write(`demo failed: ${err?.stack ?? err}\n`);
  }
} finally {
  try {
    if (volume) {
      await volume.close();
      log('volume closed (export drained and flushed, replicas marked clean)');
    }
  } catch (err) {
    failed = true;
    process.stderr.write(`closing failed: ${err?.code ?? ''} ${err?.message ?? err}\n`);
  }
  await rm(root, { recursive: true, force: true });
  log(`removed ${root}`);
}
process.exitCode = failed ? 1 : 0;
