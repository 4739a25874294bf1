#!/usr/bin/env node
// Prometheus metrics of an embedded Mooring: the embedder mounts the registry where it
// likes (here GET /metrics of its own node:http server on an ephemeral loopback port). A
// volume is attached with an NBD socket, written through it by qemu-io (when installed),
// and /metrics is scraped before and after: the request and byte counters and the latency
// histogram of the writes, the volume's state and replica modes.
//
//   npm run build && node examples/metrics/demo.mjs [--port N]   (default: any free port)
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { Registry } from 'prom-client';

import { Mooring, MooringMetrics } from '../../dist/index.js';

const MiB = 1024 * 1024;
const portArg = process.argv.indexOf('--port');
const port = portArg > 0 ? Number(process.argv[portArg + 1]) : 0;
const log = (line = '') => process.stdout.write(`${line}\n`);

// One sample line's value, or undefined.
const valueOf = (text, series) => {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
};

const root = await mkdtemp(join(tmpdir(), 'mooring-metrics-demo-'));
const socket = join(root, 'disk0.sock');
let mooring;
let http;
let failed = false;
try {
  mooring = await Mooring.open({ dir: root });
  const host = mooring.hostId;

  // 1. The embedder's registry (or leave `registry` out: MooringMetrics makes a new one,
  //    never prom-client's global one). Other metrics of the embedder can live in it too.
  const registry = new Registry();
  const metrics = new MooringMetrics(mooring, { registry });

  // 2. Mount it: here on its own loopback HTTP server; in an embedder, a route of its own.
  http = createServer(async (req, res) => {
    if (req.url !== '/metrics') return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': registry.contentType }).end(await registry.metrics());
  });
  await new Promise((resolve) => http.listen(port, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${http.address().port}/metrics`;
  log(`metrics at ${url}`);
  const scrape = async () => (await fetch(url)).text();

  // 3. A volume attached with an NBD socket.
  const disk = await mooring.createVolume({ name: 'disk0', sizeBytes: 64 * MiB, replicas: 1 });
  const st = await disk.attach({ nbd: `unix:${socket}` });
  let text = await scrape();
  const w = `{host="${host}",volume="disk0",op="write"}`;
  log(`before: mooring_volume_state healthy=${valueOf(text, 'mooring_volume_state{volume="disk0",state="healthy"}')}, ` +
    `RW replicas=${valueOf(text, 'mooring_volume_replicas{volume="disk0",mode="RW"}')}, write requests=${valueOf(text, `mooring_nbd_requests_total${w}`) ?? 'no series yet'}`);

  // 4. I/O through the socket, as QEMU would: 16 writes of 64 KiB.
  const r = spawnSync('qemu-io', ['-f', 'raw', ...Array.from({ length: 16 }, (_, i) => ['-c', `write -P 0xab ${i * 64}k 64k`]).flat(), st.nbd.uri], { encoding: 'utf8' });
  if (r.error) {
    log('(qemu-io is not installed: no I/O to count)');
  } else {
    if (r.status !== 0) throw new Error(`qemu-io failed: ${r.stderr}`);
    text = await scrape();
    log(`after 16 writes of 64 KiB: write requests=${valueOf(text, `mooring_nbd_requests_total${w}`)}, ` +
      `bytes written=${valueOf(text, `mooring_nbd_written_bytes_total{host="${host}",volume="disk0"}`)}, ` +
      `write latency count=${valueOf(text, `mooring_nbd_request_duration_seconds_count${w}`)}`);
    log('  ' + text.split('\n').filter((l) => l.startsWith(`mooring_nbd_request_duration_seconds_bucket{host="${host}",volume="disk0",op="write",le="0.001024"}`)).join(''));
  }

  // 5. A deleted volume's series go with it.
  await disk.detach();
  await mooring.deleteVolume('disk0');
  text = await scrape();
  log(`after delete: series naming disk0: ${text.split('\n').filter((l) => l.includes('volume="disk0"')).length}`);
  metrics.close();
} catch (err) {
  failed = true;
  console.error(err);
} finally {
  await new Promise((resolve) => (http ? http.close(resolve) : resolve()));
  await mooring?.close();
  await rm(root, { recursive: true, force: true });
  log('closed');
}
process.exitCode = failed ? 1 : 0;
