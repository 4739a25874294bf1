// Backing image file throughput (a benchmark, not a test: run it by hand with
// `node test/bench/backing-image-throughput.mjs [DIR]` after `npm run build`).
//
// A 256 MiB raw image through a LocalDataEngine in this process: downloaded from a local
// node http server (SHA-512 while writing, image reader, rename, fsync), written from a
// stream of 1 MiB chunks (the same ending), read back in 1 MiB chunks, and verified again
// after a restart (the whole file hashed). Then sha512sum of the same file for scale.
// Median of 3 runs; page cache warm.
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { LocalDataEngine } from '../../dist/index.js';

const MiB = 1024 * 1024;
const SIZE = 256 * MiB;
const RUNS = 3;
const root = mkdtempSync(join(process.argv[2] ?? tmpdir(), 'mooring-bif-bench-'));
const body = randomBytes(SIZE);
body.fill(0, 0, 512);
const sum = createHash('sha512').update(body).digest('hex');

const server = createServer((_req, res) => {
  res.writeHead(200, { 'content-length': body.length });
  res.end(body);
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const url = `http://127.0.0.1:${server.address().port}/image`;

async function* chunks() {
  for (let o = 0; o < body.length; o += MiB) yield body.subarray(o, o + MiB);
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const rate = (ms) => `${ms.toFixed(0)} ms, ${((SIZE / MiB / ms) * 1000).toFixed(0)} MiB/s`;

const results = { download: [], write: [], read: [], verify: [], sha512sum: [] };
for (let i = 0; i < RUNS; i++) {
  const dir = join(root, `de-${i}`);
  let de = await LocalDataEngine.start({ dir, hostId: 'bench', replicaListen: null });
  let t = performance.now();
  await de.downloadBackingImageFile({ name: 'dl', uuid: randomUUID() }, { url, expectedChecksum: sum });
  results.download.push(performance.now() - t);
  const ref = { name: 'wr', uuid: randomUUID() };
  t = performance.now();
  await de.writeBackingImageFile(ref, { sizeBytes: SIZE, expectedChecksum: sum }, chunks());
  results.write.push(performance.now() - t);
  t = performance.now();
  let n = 0;
  for await (const c of de.readBackingImageFile(ref)) n += c.length;
  results.read.push(performance.now() - t);
  if (n !== SIZE) throw new Error(`read ${n} bytes`);
  await de.close();
  t = performance.now();
  de = await LocalDataEngine.start({ dir, hostId: 'bench', replicaListen: null });
  for (;;) {
    const files = await de.listBackingImageFiles();
    if (files.every((f) => f.state === 'ready')) break;
    if (files.some((f) => f.state === 'failed')) throw new Error('verification failed');
    await new Promise((r) => setTimeout(r, 5));
  }
  // Two files were verified one after the other.
  results.verify.push((performance.now() - t) / 2);
  await de.close();
  t = performance.now();
  execFileSync('sha512sum', [join(dir, 'backing-images', `wr-${ref.uuid}`, 'image')]);
  results.sha512sum.push(performance.now() - t);
}
server.close();
rmSync(root, { recursive: true, force: true });
for (const [k, v] of Object.entries(results)) console.log(`${k.padEnd(10)} ${rate(median(v))}`);
