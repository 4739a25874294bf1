// --metrics of the real CLI: `mooring serve` and two `mooring data-engine` processes serve
// GET /metrics while a real NBD client does I/O; scrapes taken during the I/O are
// monotonic and count at least what was acknowledged, and at the end exactly what was
// sent (requests, bytes, histogram counts); the replica host's replica server counts the
// bytes the engine host sent it; a deleted volume's series disappear; the endpoint closes
// with the process. Ports 27150-27179.
import { existsSync } from 'node:fs';

import { afterAll, afterEach, describe, expect, it } from 'vitest';

import type { Mooring } from '../../src/mooring.js';
import type { FileStateStore } from '../../src/state/file-state-store.js';
import { parsePromText, type PromText } from '../helpers/prom-text.js';
import { HostProcess, openCluster, stopCluster } from './helpers/hosts.js';
import { NbdClient } from './helpers/nbd-client.js';
import { cliPath, killAllServers, startServe, type MooringServer } from './helpers/serve.js';
import { TempDir, run } from './helpers/tools.js';

const KiB = 1024;
const MiB = 1024 * KiB;

async function scrape(address: string): Promise<PromText> {
  const res = await fetch(`http://${address.slice('tcp:'.length)}/metrics`);
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return parsePromText(await res.text());
}

/** Whether anything still listens at the address. */
async function listening(address: string): Promise<boolean> {
  return fetch(`http://${address.slice('tcp:'.length)}/metrics`).then(
    () => true,
    () => false,
  );
}

/** Every counter and histogram series of `before` is in `after`, not smaller. */
function expectMonotonic(before: PromText, after: PromText): number {
  let n = 0;
  for (const s of before.samples) {
    const type = before.types.get(s.name) ?? before.types.get(s.name.replace(/_(bucket|sum|count)$/, ''));
    if (type !== 'counter' && type !== 'histogram') continue;
    const again = after.find(s.name, s.labels).filter((x) => Object.keys(x.labels).length === Object.keys(s.labels).length);
    expect(again, `${s.name} ${JSON.stringify(s.labels)}`).toHaveLength(1);
    expect(again[0]!.value, `${s.name} ${JSON.stringify(s.labels)}`).toBeGreaterThanOrEqual(s.value);
    n++;
  }
  return n;
}

/**
 * Writes `ops` blocks of `blockBytes`, `depth` at a time, scraping `address` while they
 * run; each scrape is checked against the previous one and against the writes already
 * acknowledged. Returns the scrapes taken.
 */
async function writeWhileScraping(client: NbdClient, address: string, labels: Record<string, string>, ops: number, blockBytes: number, depth: number): Promise<number> {
  const block = Buffer.alloc(blockBytes, 0x5a);
  let acked = 0;
  let done = false;
  const writer = (async () => {
    for (let i = 0; i < ops; i += depth) {
      await Promise.all(Array.from({ length: Math.min(depth, ops - i) }, (_, j) => client.write((i + j) * blockBytes, block)));
      acked = Math.min(ops, i + depth);
    }
  })().finally(() => (done = true));
  let prev = await scrape(address);
  let scrapes = 1;
  while (!done || scrapes < 3) {
    const seen = acked;
    const next = await scrape(address);
    expect(expectMonotonic(prev, next)).toBeGreaterThan(0);
    // (no series before the first write)
    expect(next.find('mooring_nbd_requests_total', { ...labels, op: 'write' })[0]?.value ?? 0).toBeGreaterThanOrEqual(seen);
    expect(next.value('mooring_nbd_written_bytes_total', labels)).toBeGreaterThanOrEqual(seen * blockBytes);
    prev = next;
    scrapes++;
  }
  await writer;
  return scrapes;
}

afterAll(async () => {
  await killAllServers();
});

describe('mooring serve --metrics', () => {
  const tmp = new TempDir('mooring-metrics-serve-');
  let server: MooringServer | null = null;
  afterEach(async () => {
    await server?.stop().catch(() => undefined);
    server = null;
  });
  afterAll(() => tmp.cleanup());

  it('serves counters that grow with the I/O done, histograms that match the requests, and closes with the process', async () => {
    server = await startServe({ dir: tmp.join('d'), size: '64M', replicas: 1, extraArgs: ['--metrics', 'tcp:127.0.0.1:27151'] });
    const address = server.ready.metrics!;
    expect(address).toBe('tcp:127.0.0.1:27151');
    const labels = { host: server.ready.hostId, volume: server.ready.volume };
    const first = await scrape(address);
    // No request yet: no per-kind series yet, the connection gauges are there.
    expect(first.find('mooring_nbd_requests_total', labels)).toEqual([]);
    expect(first.value('mooring_nbd_connections', labels)).toBe(0);
    expect(first.value('mooring_volume_state', { volume: server.ready.volume, state: 'healthy' })).toBe(1);

    const client = await NbdClient.connect({ socketPath: server.ready.nbd.slice('unix:'.length) });
    try {
      const scrapes = await writeWhileScraping(client, address, labels, 256, 128 * KiB, 8);
      expect(scrapes, server.diagnostics()).toBeGreaterThanOrEqual(3);
      await client.flush();
      for (let i = 0; i < 16; i++) await client.read(i * 128 * KiB, 128 * KiB);

      const p = await scrape(address);
      expect(p.value('mooring_nbd_requests_total', { ...labels, op: 'write' })).toBe(256);
      expect(p.value('mooring_nbd_written_bytes_total', labels)).toBe(256 * 128 * KiB);
      expect(p.value('mooring_nbd_requests_total', { ...labels, op: 'read' })).toBe(16);
      expect(p.value('mooring_nbd_read_bytes_total', labels)).toBe(16 * 128 * KiB);
      expect(p.value('mooring_nbd_requests_total', { ...labels, op: 'flush' })).toBe(1);
      for (const [op, n] of [['write', 256], ['read', 16], ['flush', 1]] as const) {
        expect(p.value('mooring_nbd_request_duration_seconds_count', { ...labels, op })).toBe(n);
        expect(p.value('mooring_nbd_request_duration_seconds_bucket', { ...labels, op, le: '+Inf' })).toBe(n);
        expect(p.value('mooring_nbd_request_duration_seconds_sum', { ...labels, op })).toBeGreaterThan(0);
      }
      expect(p.value('mooring_nbd_connections', labels)).toBe(1);
      expect(p.value('mooring_nbd_budget_peak_bytes', labels)).toBeGreaterThanOrEqual(128 * KiB);
    } finally {
      await client.disconnect();
    }
    expect(await server.stop()).toBe(0);
    expect(server.stderr).toContain('metrics at http://127.0.0.1:27151/metrics');
    expect(await listening(address)).toBe(false);
  });

  it('refuses a bad or non-loopback --metrics address as a usage error (exit 2), for serve and data-engine', async () => {
    for (const [addr, message] of [
      ['127.0.0.1:27152', /--metrics must be tcp:HOST:PORT/],
      ['tcp:127.0.0.1:99999', /--metrics/],
      ['tcp:192.0.2.1:27152', /not a loopback address.*--metrics-allow-remote/],
    ] as const) {
      const r = await run(process.execPath, [cliPath, 'serve', '--dir', tmp.join('bad'), '--size', '4M', '--metrics', addr], { allowFailure: true });
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toMatch(message);
      const d = await run(process.execPath, [cliPath, 'data-engine', '--dir', tmp.join('bad-de'), '--host-id', 'x', '--listen', `unix:${tmp.join('bad-de.sock')}`, '--replica-listen', 'none', '--metrics', addr], { allowFailure: true });
      expect(d.code, d.stderr).toBe(2);
      expect(d.stderr).toMatch(message);
    }
    // Nothing was made of a refused command line.
    expect(existsSync(tmp.join('bad'))).toBe(false);
  });
});

describe('mooring data-engine --metrics', () => {
  const tmp = new TempDir('mooring-metrics-de-');
  const hosts = [0, 1].map(
    (i) =>
      new HostProcess({
        hostId: `m${i}`,
        dir: tmp.join(`host-${i}`),
        ip: `127.0.0.${31 + i}`,
        replicaPort: 27170 + i,
        // Port 0: a fixed port here could meet another test's ephemeral port on a busy CI run.
        extraArgs: ['--metrics', 'tcp:127.0.0.1:0'],
      }),
  );
  let cluster: Mooring | undefined;
  let store: FileStateStore | undefined;
  afterAll(async () => {
    await stopCluster({ cluster, store, hosts, tmp });
  });

  it('reports the engine host\'s NBD I/O and the replica host\'s replica server, and drops a deleted volume\'s series', async () => {
    for (const h of hosts) await h.start();
    const addresses = hosts.map((h) => (JSON.parse(h.proc!.readyLine) as { metrics: string }).metrics);
    // Each reports the port it got.
    for (const a of addresses) expect(a).toMatch(/^tcp:127\.0\.0\.1:[1-9]\d*$/);
    expect(new Set(addresses).size).toBe(2);
    ({ cluster, store } = await openCluster(tmp.path, hosts, { repairIntervalMs: 0 }));
    const v = await cluster.createVolume({ name: 'mv', sizeBytes: 32 * MiB, replicas: 2 });
    const sock = tmp.join('mv.sock');
    await v.attach({ host: 'm0', nbd: `unix:${sock}` });
    const replicaBefore = await scrape(addresses[1]!);
    const client = await NbdClient.connect({ socketPath: sock });
    const labels = { host: 'm0', volume: 'mv' };
    try {
      await writeWhileScraping(client, addresses[0]!, labels, 64, 256 * KiB, 4);
      await client.flush();
    } finally {
      await client.disconnect();
    }
    const p = await scrape(addresses[0]!);
    expect(p.value('mooring_nbd_requests_total', { ...labels, op: 'write' })).toBe(64);
    expect(p.value('mooring_nbd_request_duration_seconds_count', { ...labels, op: 'write' })).toBe(64);
    expect(p.value('mooring_nbd_written_bytes_total', labels)).toBe(64 * 256 * KiB);
    expect(p.value('mooring_engine_role', { ...labels, role: 'active' })).toBe(1);
    // The control plane is not the data engine's: no volume records here.
    expect(p.find('mooring_volume_state')).toEqual([]);
    // The other replica is on m1: m0's engine wrote every byte there over the replica protocol.
    const q = await scrape(addresses[1]!);
    expect(q.value('mooring_replica_server_written_bytes_total', { host: 'm1' }) - replicaBefore.value('mooring_replica_server_written_bytes_total', { host: 'm1' })).toBeGreaterThanOrEqual(64 * 256 * KiB);
    expect(q.value('mooring_replica_server_connections', { host: 'm1' })).toBeGreaterThanOrEqual(1);
    expect(q.find('mooring_nbd_requests_total', { volume: 'mv' })).toEqual([]);

    await v.detach();
    await cluster.deleteVolume('mv');
    for (const a of addresses) expect((await scrape(a)).samples.filter((s) => s.labels.volume === 'mv')).toEqual([]);

    for (const h of hosts) await h.stop();
    for (const a of addresses) expect(await listening(a)).toBe(false);
  });
});
