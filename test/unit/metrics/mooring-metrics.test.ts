// MooringMetrics and DataEngineMetrics against a real in-process volume (the real addon):
// NBD I/O through the engine's export, then scrapes of the registry, checked against the
// requests and bytes the client sent; counters monotonic between scrapes taken while I/O
// runs; series of a deleted volume and of a detached engine gone; nothing on the global
// registry.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry, register as globalRegistry } from 'prom-client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { DataEngineMetrics } from '../../../src/metrics/data-engine-metrics.js';
import { MooringMetrics } from '../../../src/metrics/mooring-metrics.js';
import { Mooring } from '../../../src/mooring.js';
import { NbdClient } from '../../system/helpers/nbd-client.js';
import { parsePromText, type PromText } from '../../helpers/prom-text.js';

const KiB = 1024;
const MiB = 1024 * KiB;

/** Every counter and histogram series of `before` is still there in `after`, and not smaller. */
function expectMonotonic(before: PromText, after: PromText): void {
  let checked = 0;
  for (const s of before.samples) {
    const family = s.name.replace(/_(bucket|sum|count)$/, '');
    const type = before.types.get(s.name) ?? before.types.get(family);
    if (type !== 'counter' && type !== 'histogram') continue;
    const again = after.find(s.name, s.labels).filter((x) => Object.keys(x.labels).length === Object.keys(s.labels).length);
    expect(again, `${s.name} ${JSON.stringify(s.labels)} in the second scrape`).toHaveLength(1);
    expect(again[0]!.value, `${s.name} ${JSON.stringify(s.labels)}`).toBeGreaterThanOrEqual(s.value);
    checked++;
  }
  expect(checked).toBeGreaterThan(50);
}

/** A histogram's buckets are cumulative, end in +Inf, and _count equals the +Inf bucket. */
function expectHistogram(p: PromText, name: string, labels: Record<string, string>): number {
  const buckets = p.find(`${name}_bucket`, labels);
  expect(buckets.length).toBe(21); // 8 us .. 4.194304 s, +Inf
  const les = buckets.map((b) => (b.labels.le === '+Inf' ? Infinity : Number(b.labels.le)));
  expect(les).toEqual([...les].sort((a, b) => a - b));
  expect(les[0]).toBe(8e-6);
  expect(les.at(-2)).toBe(4.194304);
  for (let i = 1; i < buckets.length; i++) expect(buckets[i]!.value).toBeGreaterThanOrEqual(buckets[i - 1]!.value);
  const count = p.value(`${name}_count`, labels);
  expect(buckets.at(-1)!.labels.le).toBe('+Inf');
  expect(buckets.at(-1)!.value).toBe(count);
  return count;
}

describe('MooringMetrics on a real in-process volume', () => {
  let root: string;
  let m: Mooring | null = null;
  let metrics: MooringMetrics | null = null;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-metrics-'));
  });
  afterEach(async () => {
    metrics?.close();
    await m?.close();
    m = null;
    await rm(root, { recursive: true, force: true });
  });

  it('counts requests, bytes and latencies of the NBD I/O done, per kind, and control-plane state', async () => {
    m = await Mooring.open({ dir: join(root, 'm'), hostId: 'h1', repairIntervalMs: 0, dataEngine: { replicaListen: null } });
    const registry = new Registry();
    metrics = new MooringMetrics(m, { registry });
    expect(metrics.registry).toBe(registry);
    expect(await globalRegistry.metrics()).not.toContain('mooring_');

    const v = await m.createVolume({ name: 'v1', sizeBytes: 16 * MiB, replicas: 1 });
    const sock = join(root, 'v1.sock');
    const st = await v.attach({ nbd: `unix:${sock}` });
    const client = await NbdClient.connect({ socketPath: sock });
    try {
      const block = Buffer.alloc(64 * KiB, 0xab);
      for (let i = 0; i < 10; i++) await client.write(i * 64 * KiB, block);
      await client.flush();
      for (let i = 0; i < 5; i++) expect((await client.read(i * 64 * KiB, 64 * KiB)).equals(block)).toBe(true);
      await client.trim(MiB, 128 * KiB);

      const p = parsePromText(await registry.metrics());
      const e = { host: 'h1', volume: 'v1' };
      expect(p.types.get('mooring_nbd_requests_total')).toBe('counter');
      expect(p.types.get('mooring_nbd_request_duration_seconds')).toBe('histogram');
      expect(p.value('mooring_nbd_requests_total', { ...e, op: 'write' })).toBe(10);
      expect(p.value('mooring_nbd_requests_total', { ...e, op: 'read' })).toBe(5);
      expect(p.value('mooring_nbd_requests_total', { ...e, op: 'flush' })).toBe(1);
      expect(p.value('mooring_nbd_requests_total', { ...e, op: 'trim' })).toBe(1);
      expect(p.value('mooring_nbd_request_errors_total', { ...e, op: 'write' })).toBe(0);
      // Kinds never requested have no series yet.
      expect(p.find('mooring_nbd_requests_total', { ...e, op: 'write_zeroes' })).toEqual([]);
      expect(p.find('mooring_nbd_request_duration_seconds_count', { ...e, op: 'write_zeroes' })).toEqual([]);
      expect(p.value('mooring_nbd_written_bytes_total', e)).toBe(10 * 64 * KiB);
      expect(p.value('mooring_nbd_read_bytes_total', e)).toBe(5 * 64 * KiB);
      expect(expectHistogram(p, 'mooring_nbd_request_duration_seconds', { ...e, op: 'write' })).toBe(10);
      expect(expectHistogram(p, 'mooring_nbd_request_duration_seconds', { ...e, op: 'read' })).toBe(5);
      expect(p.value('mooring_nbd_request_duration_seconds_sum', { ...e, op: 'write' })).toBeGreaterThan(0);
      expect(p.value('mooring_nbd_connections', e)).toBe(1);
      expect(p.value('mooring_nbd_connections_total', e)).toBe(1);
      expect(p.value('mooring_nbd_budget_limit_bytes', e)).toBeGreaterThan(0);
      expect(p.value('mooring_nbd_budget_used_bytes', e)).toBe(0); // nothing in flight between requests
      expect(p.value('mooring_nbd_budget_peak_bytes', e)).toBeGreaterThanOrEqual(64 * KiB);
      expect(p.value('mooring_engine_role', { ...e, role: 'active' })).toBe(1);
      // the control plane
      expect(p.value('mooring_volumes')).toBe(1);
      expect(p.value('mooring_volume_size_bytes', { volume: 'v1' })).toBe(16 * MiB);
      expect(p.value('mooring_volume_state', { volume: 'v1', state: 'healthy' })).toBe(1);
      expect(p.value('mooring_volume_state', { volume: 'v1', state: 'degraded' })).toBe(0);
      expect(p.value('mooring_volume_replicas', { volume: 'v1', mode: 'RW' })).toBe(1);
      expect(p.value('mooring_volume_replicas', { volume: 'v1', mode: 'ERR' })).toBe(0);
      expect(p.value('mooring_replica_mode', { volume: 'v1', host: 'h1', mode: 'RW' })).toBe(1);
      expect(p.value('mooring_volume_attached', { volume: 'v1', host: 'h1' })).toBe(1);
      expect(p.value('mooring_volume_epoch', { volume: 'v1' })).toBe(st.epoch);
      expect(p.find('mooring_volume_migration')).toEqual([]);
      expect(p.find('mooring_upgrade_state')).toEqual([]);
      expect(p.value('mooring_metrics_collect_errors_total')).toBe(0);

      // The same counters through a DataEngineMetrics of the in-process data engine.
      const de = new DataEngineMetrics(m.localDataEngine!);
      const q = parsePromText(await de.registry.metrics());
      expect(q.value('mooring_nbd_requests_total', { ...e, op: 'write' })).toBe(10);
      expect(q.find('mooring_volumes')).toEqual([]);
      de.close();
      expect(await de.registry.metrics()).not.toContain('mooring_');

      // Scrapes while writes are in flight: monotonic, and at least what was acknowledged.
      let acked = 0;
      const writer = (async () => {
        for (let i = 0; i < 200; i++) {
          await Promise.all([0, 1, 2, 3].map((j) => client.write(((i * 4 + j) % 200) * 64 * KiB, block)));
          acked += 4;
        }
      })();
      let prev = p;
      let scrapes = 0;
      let done = false;
      void writer.finally(() => (done = true));
      while (!done || scrapes < 2) {
        // A scrape may finish without any I/O (the state store answers from memory): give the
        // writer's socket a turn of the event loop between scrapes, as an HTTP scrape would.
        await new Promise((r) => setImmediate(r));
        const seen = acked;
        const next = parsePromText(await registry.metrics());
        expectMonotonic(prev, next);
        expect(next.value('mooring_nbd_requests_total', { ...e, op: 'write' })).toBeGreaterThanOrEqual(10 + seen);
        expect(next.value('mooring_nbd_written_bytes_total', e)).toBeGreaterThanOrEqual((10 + seen) * 64 * KiB);
        prev = next;
        scrapes++;
      }
      await writer;
      const end = parsePromText(await registry.metrics());
      expect(end.value('mooring_nbd_requests_total', { ...e, op: 'write' })).toBe(810);
      expect(expectHistogram(end, 'mooring_nbd_request_duration_seconds', { ...e, op: 'write' })).toBe(810);
      expect(end.value('mooring_nbd_written_bytes_total', e)).toBe(810 * 64 * KiB);
    } finally {
      await client.disconnect();
    }

    // Detached: the engine and its export are gone, and so are their series.
    await v.detach();
    const d = parsePromText(await registry.metrics());
    expect(d.find('mooring_nbd_requests_total')).toEqual([]);
    expect(d.value('mooring_volume_state', { volume: 'v1', state: 'detached' })).toBe(1);
    expect(d.find('mooring_volume_attached')).toEqual([]);
  });

  it('drops the series of a deleted volume, and close() takes its metrics off the registry', async () => {
    m = await Mooring.open({ dir: join(root, 'm'), hostId: 'h1', repairIntervalMs: 0, dataEngine: { replicaListen: null } });
    metrics = new MooringMetrics(m);
    await m.createVolume({ name: 'a', sizeBytes: 4 * MiB, replicas: 1 });
    await m.createVolume({ name: 'b', sizeBytes: 8 * MiB, replicas: 1 });
    let p = parsePromText(await metrics.registry.metrics());
    expect(p.value('mooring_volumes')).toBe(2);
    expect(p.value('mooring_volume_size_bytes', { volume: 'b' })).toBe(8 * MiB);
    expect(p.find('mooring_volume_state', { volume: 'b' })).toHaveLength(5);
    await m.deleteVolume('b');
    p = parsePromText(await metrics.registry.metrics());
    expect(p.value('mooring_volumes')).toBe(1);
    expect(p.samples.filter((s) => s.labels.volume === 'b')).toEqual([]);
    expect(p.value('mooring_volume_size_bytes', { volume: 'a' })).toBe(4 * MiB);

    // A second MooringMetrics on the same registry is refused (same names), not merged.
    expect(() => new MooringMetrics(m!, { registry: metrics!.registry })).toThrow(/already been registered/);
    metrics.close();
    expect(await metrics.registry.metrics()).not.toContain('mooring_');
    metrics = null;
  });

  it('counts a closed Mooring\'s scrape as a collect error and reports no volume series', async () => {
    m = await Mooring.open({ dir: join(root, 'm'), hostId: 'h1', repairIntervalMs: 0, dataEngine: { replicaListen: null } });
    metrics = new MooringMetrics(m);
    await m.createVolume({ name: 'a', sizeBytes: 4 * MiB, replicas: 1 });
    await m.close();
    const p = parsePromText(await metrics.registry.metrics());
    expect(p.value('mooring_metrics_collect_errors_total')).toBe(1);
    expect(p.find('mooring_volumes')).toEqual([]);
    expect(p.find('mooring_volume_size_bytes')).toEqual([]);
  });
});
