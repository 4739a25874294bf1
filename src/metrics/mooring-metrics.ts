/**
 * Metrics of a {@link Mooring}: per volume state, size, replica modes, rebuild progress
 * and bytes, attachment, migration, writer epoch; the upgrade session's state; and, when
 * the Mooring runs this host's data engine in process, that data engine's data-path metrics
 * (data-engine-metrics.ts); and the repair loop's pass duration, next delay and
 * event-driven repairs. Read at scrape time from the store, the engines and the Mooring;
 * rebuilds are counted from the data engines' events. docs/metrics.md lists them.
 *
 * @packageDocumentation
 */
import { Registry } from 'prom-client';

import type { DataEngineEvent } from '../data-engine/data-engine.js';
import type { Mooring, RepairLoopStatus } from '../mooring.js';
import { PASS_DURATION_FACTOR } from '../cluster/repair-loop.js';
import type { UpgradeSessionStatus } from '../upgrade/upgrade-session.js';
import type { VolumeStatus } from '../volume/volume.js';
import { HOST_UPGRADE_STATES, UPGRADE_STATES } from '../upgrade/upgrade-records.js';
import { CollectedMetric, MetricSet, SnapshotOnce, type Sample } from './collected-metric.js';
import { dataPathMetrics, readDataPath, type DataPathSnapshot, type MetricsOptions } from './data-engine-metrics.js';

/** Options of {@link MooringMetrics}. */
export interface MooringMetricsOptions extends MetricsOptions {
  /**
   * Include the data-path metrics of the data engine the Mooring runs in this process
   * ({@link Mooring.localDataEngine}; default true). Turn it off when a
   * {@link DataEngineMetrics} on the same registry reports it already.
   */
  dataPath?: boolean;
}

const VOLUME_STATES: ReadonlyArray<VolumeStatus['state']> = ['detached', 'healthy', 'degraded', 'faulted', 'unknown'];
const REPLICA_MODES = ['RW', 'WO', 'ERR', 'unknown'] as const;

interface ControlSnapshot {
  volumes: VolumeStatus[];
  upgrade: UpgradeSessionStatus | null;
  failed: boolean;
  dataPath: DataPathSnapshot | null;
}

interface RebuildCounts {
  completed: number;
  failed: number;
  sentBytes: number;
  scannedBytes: number;
}

/**
 * Prometheus metrics of a {@link Mooring} on a prom-client `Registry` (`registry`: the
 * embedder's, or a new one; never the global registry unless passed). Mount it where you
 * like: `res.end(await metrics.registry.metrics())`. A scrape reads every volume's status
 * (as {@link Mooring.listVolumes}); series of deleted volumes disappear.
 */
export class MooringMetrics {
  /** Where the metrics are registered. */
  readonly registry: Registry;
  readonly #set: MetricSet;
  readonly #mooring: Mooring;
  readonly #rebuilds = new Map<string, RebuildCounts>();
  #collectErrors = 0;
  readonly #onEvent: (host: string, e: DataEngineEvent) => void;

  constructor(mooring: Mooring, options: MooringMetricsOptions = {}) {
    this.#mooring = mooring;
    this.registry = options.registry ?? new Registry();
    this.#set = new MetricSet(this.registry);
    const dataPath = options.dataPath !== false;
    const snapshot = new SnapshotOnce<ControlSnapshot>(() => this.#read(dataPath));
    this.#onEvent = (_host, e) => this.#count(e);
    mooring.on('data-engine-event', this.#onEvent);

    const perVolume = (f: (v: VolumeStatus) => Sample[]) => (s: ControlSnapshot): Sample[] => s.volumes.flatMap(f);
    const perReplica = (f: (v: VolumeStatus, r: VolumeStatus['replicas'][number]) => Sample[]) =>
      perVolume((v) => v.replicas.flatMap((r) => f(v, r)));
    const rebuilds = (f: (c: RebuildCounts) => number) =>
      perVolume((v) => {
        const c = this.#rebuilds.get(v.name);
        return c ? [{ labels: { volume: v.name }, value: f(c) }] : [];
      });
    const m = (name: string, help: string, type: 'counter' | 'gauge', samples: (s: ControlSnapshot) => Sample[]) =>
      this.#set.add(new CollectedMetric(name, help, type, snapshot, samples));

    m('mooring_volumes', 'Volumes in the store.', 'gauge', (s) => (s.failed ? [] : [{ labels: {}, value: s.volumes.length }]));
    m('mooring_volume_size_bytes', 'A volume\'s recorded size.', 'gauge', perVolume((v) => [{ labels: { volume: v.name }, value: v.sizeBytes }]));
    m('mooring_volume_state', 'A volume\'s state: 1 for the state it is in (detached, healthy, degraded, faulted, unknown), 0 for the others.', 'gauge',
      perVolume((v) => VOLUME_STATES.map((state) => ({ labels: { volume: v.name, state }, value: v.state === state ? 1 : 0 }))));
    m('mooring_volume_replicas_wanted', 'How many replicas a volume should have (healthy needs that many RW).', 'gauge',
      perVolume((v) => [{ labels: { volume: v.name }, value: v.replicaCount }]));
    m('mooring_volume_replicas', 'A volume\'s replicas by mode (RW, WO: being rebuilt, ERR, unknown: as last recorded).', 'gauge',
      perVolume((v) => REPLICA_MODES.map((mode) => ({ labels: { volume: v.name, mode }, value: v.replicas.filter((r) => r.mode === mode).length }))));
    m('mooring_replica_mode', 'Each replica: 1, labelled with its mode and the host that holds it.', 'gauge',
      perReplica((v, r) => [{ labels: { volume: v.name, replica: r.id, host: r.hostId, mode: r.mode }, value: 1 }]));
    m('mooring_replica_rebuild_scanned_bytes', 'Bytes a running rebuild has compared so far.', 'gauge',
      perReplica((v, r) => (r.rebuild ? [{ labels: { volume: v.name, replica: r.id, host: r.hostId }, value: r.rebuild.scannedBytes }] : [])));
    m('mooring_replica_rebuild_sent_bytes', 'Bytes a running rebuild has written to the replica so far (the blocks that differed).', 'gauge',
      perReplica((v, r) => (r.rebuild ? [{ labels: { volume: v.name, replica: r.id, host: r.hostId }, value: r.rebuild.sentBytes }] : [])));
    m('mooring_replica_rebuild_total_bytes', 'Bytes a running rebuild will compare in all (as planned so far).', 'gauge',
      perReplica((v, r) => (r.rebuild ? [{ labels: { volume: v.name, replica: r.id, host: r.hostId }, value: r.rebuild.totalBytes }] : [])));
    m('mooring_volume_rebuilds_completed_total', 'Rebuilds of a volume\'s replicas that completed, since these metrics were created.', 'counter', rebuilds((c) => c.completed));
    m('mooring_volume_rebuilds_failed_total', 'Rebuilds of a volume\'s replicas that failed, since these metrics were created.', 'counter', rebuilds((c) => c.failed));
    m('mooring_volume_rebuild_sent_bytes_total', 'Bytes written by finished rebuilds of a volume (completed or failed), since these metrics were created.', 'counter', rebuilds((c) => c.sentBytes));
    m('mooring_volume_rebuild_scanned_bytes_total', 'Bytes compared by finished rebuilds of a volume, since these metrics were created.', 'counter', rebuilds((c) => c.scannedBytes));
    m('mooring_volume_attached', 'Where a volume is attached: 1, labelled with the host (during a migration: the source until confirmed).', 'gauge',
      perVolume((v) => (v.attachedHost ? [{ labels: { volume: v.name, host: v.attachedHost }, value: 1 }] : [])));
    m('mooring_volume_epoch', 'The writer epoch of a volume\'s engine (0 when detached).', 'gauge', perVolume((v) => [{ labels: { volume: v.name }, value: v.epoch }]));
    m('mooring_volume_migration', 'A migration in progress: 1, labelled with its phase, source and target hosts.', 'gauge',
      perVolume((v) => (v.migration ? [{ labels: { volume: v.name, phase: v.migration.phase, source: v.migration.sourceHost, target: v.migration.targetHost }, value: 1 }] : [])));
    m('mooring_upgrade_state', 'The upgrade session\'s state: 1 for the state it is in, 0 for the others (no series without a session).', 'gauge',
      (s) => (s.upgrade ? UPGRADE_STATES.map((state) => ({ labels: { state }, value: s.upgrade!.state === state ? 1 : 0 })) : []));
    m('mooring_upgrade_host_state', 'Each host of the upgrade session: 1, labelled with its step or how it ended.', 'gauge',
      (s) => (s.upgrade ? Object.values(s.upgrade.hosts).map((h) => ({ labels: { host: h.hostId, state: HOST_UPGRADE_STATES.includes(h.state) ? h.state : 'unknown' }, value: 1 })) : []));
    // The repair loop (docs/cluster.md): read from the Mooring, not the store.
    const loop = (f: (l: RepairLoopStatus) => number | null) => (): Sample[] => {
      const v = f(this.#mooring.repairLoop);
      return v === null ? [] : [{ labels: {}, value: v }];
    };
    m('mooring_repair_pass_duration_seconds', 'How long the repair loop\'s last full pass took (no series before the first).', 'gauge', loop((l) => (l.lastPassDurationMs === null ? null : l.lastPassDurationMs / 1000)));
    m('mooring_repair_pass_busy_seconds', 'How long the event loop was busy during that pass (waits for hosts do not count).', 'gauge', loop((l) => (l.lastPassBusyMs === null ? null : l.lastPassBusyMs / 1000)));
    m('mooring_repair_pass_next_delay_seconds', `The delay the loop chose after its last full pass: max(repairIntervalMs, ${PASS_DURATION_FACTOR} x its busy time).`, 'gauge', loop((l) => (l.nextPassDelayMs === null ? null : l.nextPassDelayMs / 1000)));
    m('mooring_repair_passes_total', 'Full passes the repair loop ran.', 'counter', loop((l) => l.passes));
    m('mooring_event_repairs_total', 'Repairs of one volume run because a data engine reported a replica change or its host was offered again (coalesced per volume).', 'counter', loop((l) => l.eventRepairs));
    m('mooring_event_repairs_pending', 'Volumes waiting for an event-driven repair.', 'gauge', loop((l) => l.pendingEventRepairs));
    m('mooring_event_repairs_dropped_total', 'Event-driven repair requests dropped because too many volumes were waiting (the next full pass covers them).', 'counter', loop((l) => l.droppedEventRepairs));
    m('mooring_metrics_collect_errors_total', 'Scrapes that could not read the volumes or the upgrade session (their series were left out).', 'counter',
      () => [{ labels: {}, value: this.#collectErrors }]);
    if (dataPath) for (const metric of dataPathMetrics(snapshot, (s) => s.dataPath)) this.#set.add(metric);
  }

  /** Removes its metrics from the registry and stops counting rebuilds. */
  close(): void {
    this.#mooring.off('data-engine-event', this.#onEvent);
    this.#set.remove();
  }

  async #read(dataPath: boolean): Promise<ControlSnapshot> {
    let volumes: VolumeStatus[] = [];
    let upgrade: UpgradeSessionStatus | null = null;
    let failed = false;
    try {
      volumes = await this.#mooring.listVolumes();
      const session = await this.#mooring.upgradeSession();
      upgrade = session ? await session.status() : null;
    } catch {
      // A closed Mooring, a store that does not answer, a volume deleted mid-read: this
      // scrape reports what it has, and says so.
      this.#collectErrors++;
      failed = true;
    }
    // Rebuild counts of deleted volumes go with them.
    if (!failed) {
      const names = new Set(volumes.map((v) => v.name));
      for (const name of [...this.#rebuilds.keys()]) if (!names.has(name)) this.#rebuilds.delete(name);
    }
    return { volumes, upgrade, failed, dataPath: dataPath ? readDataPath(this.#mooring.localDataEngine) : null };
  }

  #count(e: DataEngineEvent): void {
    if (e.type !== 'rebuild-completed' && e.type !== 'rebuild-failed') return;
    let c = this.#rebuilds.get(e.volume);
    if (!c) {
      c = { completed: 0, failed: 0, sentBytes: 0, scannedBytes: 0 };
      this.#rebuilds.set(e.volume, c);
    }
    if (e.type === 'rebuild-completed') c.completed++;
    else c.failed++;
    c.sentBytes += e.sentBytes;
    c.scannedBytes += e.scannedBytes;
  }
}
