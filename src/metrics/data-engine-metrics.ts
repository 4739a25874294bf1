/**
 * Metrics of a data engine in this process: the NBD export of each engine (requests by
 * kind, bytes, latency histograms, connections, memory budget) and the replica server
 * (connections, traffic, buffer budget), read at scrape time from the native counters
 * (`LocalDataEngine.ioStats()`). docs/metrics.md lists them.
 *
 * @packageDocumentation
 */
import { Registry } from 'prom-client';

import type { LocalDataEngine, LocalDataEngineIoStats } from '../data-engine/local-data-engine.js';
import type { NbdOpStats as NativeNbdOpStats } from '../data-engine/local-data-engine.js';
import { CollectedMetric, MetricSet, SnapshotOnce, log2Histogram, type Sample } from './collected-metric.js';

/** Options of {@link DataEngineMetrics} and {@link MooringMetrics}. */
export interface MetricsOptions {
  /** The registry to register on (default: a new one, not prom-client's global registry). */
  registry?: Registry;
}

/** The counters of one data engine, read at once. */
export interface DataPathSnapshot {
  host: string;
  stats: LocalDataEngineIoStats;
}

/** NBD request kinds, as the `op` label names them. */
const OPS: ReadonlyArray<[keyof LocalOps, string]> = [
  ['read', 'read'],
  ['write', 'write'],
  ['flush', 'flush'],
  ['trim', 'trim'],
  ['writeZeroes', 'write_zeroes'],
  ['other', 'other'],
];
type LocalOps = { read: NativeNbdOpStats; write: NativeNbdOpStats; flush: NativeNbdOpStats; trim: NativeNbdOpStats; writeZeroes: NativeNbdOpStats; other: NativeNbdOpStats };

/** Reads a data engine's counters as a snapshot for {@link dataPathMetrics}. */
export function readDataPath(de: LocalDataEngine | null): DataPathSnapshot | null {
  return de ? { host: de.hostId, stats: de.ioStats() } : null;
}

/** The data path's metrics over a snapshot (null: no data engine in this process). */
export function dataPathMetrics<T>(snapshot: SnapshotOnce<T>, pick: (s: T) => DataPathSnapshot | null): CollectedMetric<T>[] {
  const perEngine = (f: (labels: Record<string, string>, e: LocalDataEngineIoStats['engines'][number]) => Sample[]) => (s: T): Sample[] => {
    const d = pick(s);
    if (!d) return [];
    return d.stats.engines.flatMap((e) => f({ host: d.host, volume: e.volume }, e));
  };
  const perOp = (f: (labels: Record<string, string>, op: NativeNbdOpStats) => Sample[]) =>
    // A kind's series appear with its first request: most exports never see most kinds, and
    // six histograms per volume would be most of a scrape.
    perEngine((labels, e) => (e.io ? OPS.flatMap(([key, op]) => (e.io!.ops[key].count > 0 ? f({ ...labels, op }, e.io!.ops[key]) : [])) : []));
  const server = (f: (labels: Record<string, string>, r: NonNullable<LocalDataEngineIoStats['replicaServer']>) => number) => (s: T): Sample[] => {
    const d = pick(s);
    if (!d?.stats.replicaServer) return [];
    return [{ labels: { host: d.host }, value: f({ host: d.host }, d.stats.replicaServer) }];
  };
  const m = (name: string, help: string, type: 'counter' | 'gauge' | 'histogram', samples: (s: T) => Sample[]) =>
    new CollectedMetric<T>(name, help, type, snapshot, samples);
  return [
    m('mooring_nbd_requests_total', 'NBD requests an engine\'s export executed, by kind (op: read, write, flush, trim, write_zeroes, other).', 'counter',
      perOp((labels, op) => [{ labels, value: op.count }])),
    m('mooring_nbd_request_errors_total', 'NBD requests answered with an error, by kind.', 'counter',
      perOp((labels, op) => [{ labels, value: op.errors }])),
    m('mooring_nbd_request_duration_seconds', 'Device time of NBD requests, by kind: a worker taking the request to its reply being queued (log2 buckets, 8 us to 4.2 s).', 'histogram',
      perOp((labels, op) => log2Histogram(labels, op.buckets, op.sumNs))),
    m('mooring_nbd_read_bytes_total', 'Bytes sent to NBD clients by reads.', 'counter',
      perEngine((labels, e) => [{ labels, value: e.nbd.bytesRead }])),
    m('mooring_nbd_written_bytes_total', 'Bytes received from NBD clients by writes.', 'counter',
      perEngine((labels, e) => [{ labels, value: e.nbd.bytesWritten }])),
    m('mooring_nbd_connections', 'NBD client connections open now.', 'gauge',
      perEngine((labels, e) => [{ labels, value: e.nbd.connectionsOpen }])),
    m('mooring_nbd_connections_total', 'NBD client connections accepted.', 'counter',
      perEngine((labels, e) => [{ labels, value: e.nbd.connectionsTotal }])),
    m('mooring_nbd_protocol_errors_total', 'NBD clients dropped for protocol violations or timeouts.', 'counter',
      perEngine((labels, e) => [{ labels, value: e.nbd.protocolErrors }])),
    m('mooring_nbd_budget_used_bytes', 'READ/WRITE bytes in flight held against the export\'s memory budget now.', 'gauge',
      perEngine((labels, e) => (e.io ? [{ labels, value: e.io.budgetUsedBytes }] : []))),
    m('mooring_nbd_budget_limit_bytes', 'The export\'s memory budget of READ/WRITE bytes in flight.', 'gauge',
      perEngine((labels, e) => (e.io ? [{ labels, value: e.io.budgetLimitBytes }] : []))),
    m('mooring_nbd_budget_peak_bytes', 'The most bytes held against the export\'s budget at once since it started.', 'gauge',
      perEngine((labels, e) => (e.io ? [{ labels, value: e.io.budgetPeakBytes }] : []))),
    m('mooring_nbd_budget_waits_total', 'NBD requests that waited for the export\'s budget (back-pressure).', 'counter',
      perEngine((labels, e) => (e.io ? [{ labels, value: e.io.budgetWaits }] : []))),
    m('mooring_nbd_inline_reads_total', 'NBD READs the connection loop answered itself, from the page cache of a replica on this host, without a worker.', 'counter',
      perEngine((labels, e) => (e.io ? [{ labels, value: e.io.inlineReads }] : []))),
    m('mooring_nbd_loop_writes_total', 'NBD WRITEs the connection loop started itself, to replicas on other hosts, without a worker.', 'counter',
      perEngine((labels, e) => (e.io ? [{ labels, value: e.io.loopWrites }] : []))),
    m('mooring_nbd_grouped_requests_total', 'NBD READs and WRITEs started in groups of two or more, their frames to each replica on another host sent together.', 'counter',
      perEngine((labels, e) => (e.io ? [{ labels, value: e.io.groupedRequests }] : []))),
    m('mooring_engine_role', 'Engines with an NBD export on this data engine: 1 for the role it has (active or standby).', 'gauge',
      perEngine((labels, e) => [{ labels: { ...labels, role: e.role }, value: 1 }])),
    m('mooring_replica_server_connections', 'Replica-protocol connections (engines of other hosts) open now.', 'gauge', server((_, r) => r.connectionsOpen)),
    m('mooring_replica_server_connections_total', 'Replica-protocol connections accepted.', 'counter', server((_, r) => r.connectionsTotal)),
    m('mooring_replica_server_requests_total', 'Replica-protocol requests served.', 'counter', server((_, r) => r.requests)),
    m('mooring_replica_server_read_bytes_total', 'Bytes read from replicas for other hosts\' engines.', 'counter', server((_, r) => r.bytesRead)),
    m('mooring_replica_server_written_bytes_total', 'Bytes written to replicas by other hosts\' engines.', 'counter', server((_, r) => r.bytesWritten)),
    m('mooring_replica_server_buffer_bytes', 'Request and reply bytes the replica server holds now (its memory budget in use).', 'gauge', server((_, r) => r.bufferBytes)),
    m('mooring_replica_server_buffer_peak_bytes', 'The most request and reply bytes the replica server held at once.', 'gauge', server((_, r) => r.bufferBytesPeak)),
    m('mooring_replica_server_inline_writes_total', 'Small replica-protocol writes done on the connection loop, without a worker.', 'counter', server((_, r) => r.inlineWrites)),
    m('mooring_replica_server_inline_reads_total', 'Small replica-protocol reads answered on the connection loop from the page cache, without a worker.', 'counter', server((_, r) => r.inlineReads)),
    m('mooring_replica_server_buffer_waits_total', 'Replica-protocol requests that waited for the budget.', 'counter', server((_, r) => r.bufferWaits)),
    m('mooring_replica_server_auth_failures_total', 'Replica-protocol connections refused UNAUTHENTICATED.', 'counter', server((_, r) => r.authFailures)),
    m('mooring_replica_server_stale_epoch_refusals_total', 'Replica-protocol requests refused for an older writer epoch.', 'counter', server((_, r) => r.staleEpochRefusals)),
    m('mooring_replica_server_protocol_errors_total', 'Replica-protocol connections dropped for protocol violations.', 'counter', server((_, r) => r.protocolErrors)),
  ];
}

/**
 * Metrics of a {@link LocalDataEngine} (the data engine of `mooring data-engine`, or one an
 * embedder runs): per engine NBD requests, bytes, latency histograms, connections and
 * memory budget, and the replica server's connections and buffers; labels `host`,
 * `volume`, `op`. Read from the native counters when scraped: nothing is added to the I/O
 * path. Series of engines that stopped disappear.
 *
 * ```ts
 * const metrics = new DataEngineMetrics(dataEngine);
 * res.end(await metrics.registry.metrics());
 * ```
 */
export class DataEngineMetrics {
  /** Where the metrics are registered. */
  readonly registry: Registry;
  readonly #set: MetricSet;

  /**
   * @param dataEngine - the data engine, or a function giving the one running now (null:
   *   none, no series), for a process that reopens its data engine
   */
  constructor(dataEngine: LocalDataEngine | (() => LocalDataEngine | null), options: MetricsOptions = {}) {
    this.registry = options.registry ?? new Registry();
    this.#set = new MetricSet(this.registry);
    const current = typeof dataEngine === 'function' ? dataEngine : () => dataEngine;
    const snapshot = new SnapshotOnce(async () => readDataPath(current()));
    for (const metric of dataPathMetrics(snapshot, (s) => s)) this.#set.add(metric);
  }

  /** Removes its metrics from the registry. */
  close(): void {
    this.#set.remove();
  }
}
