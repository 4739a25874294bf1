/**
 * Turning measurements into the stdout table and the Markdown report (docs/benchmarks.md).
 */
import type { FioFigures } from './fio.js';
import type { MachineInfo } from './machine.js';
import type { ScaleResults } from './scale/index.js';
import type { ControlResults } from './control/index.js';
import type { MigrationResults } from './migration.js';
import type { UpgradeResults } from './upgrade.js';
import type { GuestMigrationResults } from './guest-migration.js';
import type { BackingImageDeliveryResults } from './backing-image-delivery.js';
import type { BackingImageReadResults, BackingImageRow } from './backing-image-read.js';
import type { RebuildResults } from './rebuild.js';
import type { IoCost } from './cost.js';
import { costMethodLines, costSection, costTable, judgeCostTargets, peerRatioTable } from './cost-report.js';
import { LIMIT_TARGET, PEER_TARGET, TARGET_LABELS, TARGET_SHORT, type TargetId } from './target-ids.js';
import { isWrite, workloadById, type Workload } from './workloads.js';

/** One fio run against one target. */
export interface Measurement {
  targetId: TargetId;
  workloadId: string;
  figures: FioFigures;
  /** CPU used by all server processes during the run, % of one core; undefined for file targets. */
  serverCpuPct: number | undefined;
  /** Cost per I/O over all server processes (cost.ts); undefined for file targets. */
  cost?: IoCost | undefined;
  /** 0-based round (see --repeat). */
  round: number;
}

/** Peak memory of a target's server processes over its whole benchmark run (summed over them). */
export interface ServerPeak {
  targetId: TargetId;
  peakRssBytes: number;
  threads: number;
  processes: number;
}

/** The 1 TiB sparse volume measurement. */
export interface RssResult {
  volumeBytes: number;
  writes: number;
  /** VmRSS right after READY (Node's own baseline is most of it). */
  rssAtReadyBytes: number;
  /** VmHWM after the writes. */
  peakRssBytes: number;
  threads: number;
}

export interface BenchResults {
  startedAt: Date;
  durationSec: number;
  quick: boolean;
  runtimeSec: number;
  repeat: number;
  rampSec: number;
  areaBytes: number;
  scratchDir: string;
  loadBefore: number[];
  loadAfter: number[];
  machine: MachineInfo;
  targets: TargetId[];
  workloads: Workload[];
  measurements: Measurement[];
  serverPeaks: ServerPeak[];
  /** Why part of the cost per I/O was not measured; undefined when all of it was. */
  costNote?: string | undefined;
  /** --port-base of the run. */
  portBase?: number;
  rss: RssResult | undefined;
  /** Full and incremental rebuild over loopback; undefined when skipped or failed. */
  rebuild?: RebuildResults | undefined;
  /** Live migrations over loopback; undefined when skipped or failed. */
  migration?: MigrationResults | undefined;
  /** In-place data-engine hand-offs over loopback; undefined when skipped or failed. */
  upgrade?: UpgradeResults | undefined;
  guestMigration?: GuestMigrationResults | undefined;
  /** Reads over a qcow2 backing image against qemu-nbd; undefined when skipped or failed. */
  backingImageRead?: BackingImageReadResults | undefined;
  /** Backing image upload and copy between two hosts over loopback; undefined when skipped or failed. */
  backingImageDelivery?: BackingImageDeliveryResults | undefined;
  /** The scale curves (--scale); undefined when skipped. */
  scale?: ScaleResults | undefined;
  /** Control operations with the file store and etcd (--control); undefined when skipped. */
  control?: ControlResults | undefined;
  /** Targets or steps that failed; the rest of the run went on. */
  failures: Array<{ what: string; message: string }>;
}

/** Above this 1-minute load average the report says the machine was shared. */
export const BUSY_LOAD = 1;

/** The RSS budget for a 1 TiB sparse volume (a performance target). */
export const RSS_TARGET_BYTES = 64 * 1024 * 1024;

type Cell = string;

function fmtIops(n: number): string {
  if (!Number.isFinite(n)) return '–';
  return n >= 10_000 ? `${(n / 1000).toFixed(1)}k` : n.toFixed(0);
}

function fmtMib(n: number): string {
  if (!Number.isFinite(n)) return '–';
  return n >= 100 ? n.toFixed(0) : n.toFixed(1);
}

function fmtUs(n: number): string {
  if (!Number.isFinite(n)) return '–';
  return n >= 100 ? n.toFixed(0) : n.toFixed(1);
}

export function fmtRatio(n: number | undefined): string {
  return n === undefined || !Number.isFinite(n) ? '–' : `${n.toFixed(2)}×`;
}

function fmtMiB(bytes: number): string {
  return `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
}

/** The figure a workload is judged by: IOPS for 4k random, MiB/s for 1M sequential. */
export function headline(w: Workload, f: FioFigures): number {
  return w.family === 'random-4k' ? f.iops : f.mibPerSec;
}

export function fmtHeadline(w: Workload, f: FioFigures | undefined): string {
  if (!f) return '–';
  return w.family === 'random-4k' ? fmtIops(f.iops) : `${fmtMib(f.mibPerSec)} MiB/s`;
}

/** Lookup over the measurements: with several rounds, the run with the median headline figure. */
export class ResultIndex {
  private readonly map = new Map<string, Measurement>();
  constructor(measurements: readonly Measurement[]) {
    const groups = new Map<string, Measurement[]>();
    for (const m of measurements) {
      const key = `${m.targetId}/${m.workloadId}`;
      groups.set(key, [...(groups.get(key) ?? []), m]);
    }
    for (const [key, list] of groups) {
      const w = workloadById(list[0]!.workloadId);
      const sorted = [...list].sort((a, b) => headline(w, a.figures) - headline(w, b.figures));
      this.map.set(key, sorted[Math.floor((sorted.length - 1) / 2)]!);
    }
  }
  get(target: TargetId, workloadId: string): Measurement | undefined {
    return this.map.get(`${target}/${workloadId}`);
  }
  ratio(w: Workload, num: TargetId, den: TargetId): number | undefined {
    const a = this.get(num, w.id);
    const b = this.get(den, w.id);
    if (!a || !b) return undefined;
    const d = headline(w, b.figures);
    return d > 0 ? headline(w, a.figures) / d : undefined;
  }
}

export interface Table {
  headers: string[];
  /** 'l' or 'r' per column. */
  align: Array<'l' | 'r'>;
  rows: Cell[][];
}

/** Aligned plain-text table for a terminal. */
export function renderText(t: Table): string {
  const widths = t.headers.map((h, i) => Math.max(h.length, ...t.rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => (t.align[i] === 'r' ? c.padStart(widths[i]!) : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(t.headers), widths.map((w) => '-'.repeat(w)).join('  '), ...t.rows.map(line)].join('\n');
}

/** GitHub-flavoured Markdown table. */
export function renderMarkdown(t: Table): string {
  const row = (cells: string[]): string => `| ${cells.join(' | ')} |`;
  const sep = t.align.map((a) => (a === 'r' ? '---:' : '---'));
  return [row(t.headers), row(sep), ...t.rows.map(row)].join('\n');
}

const MOORING_TARGETS: readonly TargetId[] = ['mooring-1', 'mooring-3', 'mooring-3-remote'];

/** Headline figure of every workload on every target, plus the Mooring ratios. */
export function summaryTable(r: BenchResults): Table {
  const idx = new ResultIndex(r.measurements);
  const moorings = MOORING_TARGETS.filter((t) => r.targets.includes(t));
  const headers = ['workload', ...r.targets.map((t) => TARGET_SHORT[t])];
  const ratioCols: Array<{ name: string; f: (w: Workload) => number | undefined }> = [];
  for (const m of moorings) {
    const s = TARGET_SHORT[m];
    if (r.targets.includes(PEER_TARGET)) ratioCols.push({ name: `${s}/qemu raw`, f: (w) => idx.ratio(w, m, PEER_TARGET) });
    if (r.targets.includes(LIMIT_TARGET)) ratioCols.push({ name: `${s}/limit`, f: (w) => idx.ratio(w, m, LIMIT_TARGET) });
  }
  if (moorings.includes('mooring-1') && moorings.includes('mooring-3')) {
    ratioCols.push({ name: 'M3/M1 (writes)', f: (w) => (isWrite(w) ? idx.ratio(w, 'mooring-3', 'mooring-1') : undefined) });
  }
  headers.push(...ratioCols.map((c) => c.name));
  const rows = r.workloads.map((w) => [
    w.label,
    ...r.targets.map((t) => fmtHeadline(w, idx.get(t, w.id)?.figures)),
    ...ratioCols.map((c) => fmtRatio(c.f(w))),
  ]);
  return { headers, align: headers.map((_, i) => (i === 0 ? 'l' : 'r')), rows };
}

/** Every figure of every run. */
export function detailTable(r: BenchResults): Table {
  const idx = new ResultIndex(r.measurements);
  const headers = ['workload', 'target', 'IOPS', 'MiB/s', 'p50 µs', 'p99 µs', 'server CPU', 'vs qemu raw', 'vs limit'];
  const rows: Cell[][] = [];
  for (const w of r.workloads) {
    for (const t of r.targets) {
      const m = idx.get(t, w.id);
      if (!m) {
        rows.push([w.label, TARGET_LABELS[t], '–', '–', '–', '–', '–', '–', '–']);
        continue;
      }
      const f = m.figures;
      const isMooring = MOORING_TARGETS.includes(t);
      rows.push([
        w.label,
        TARGET_LABELS[t],
        fmtIops(f.iops),
        fmtMib(f.mibPerSec),
        fmtUs(f.clatP50Us),
        fmtUs(f.clatP99Us),
        m.serverCpuPct === undefined ? '–' : `${m.serverCpuPct.toFixed(0)}%`,
        isMooring ? fmtRatio(idx.ratio(w, t, PEER_TARGET)) : '',
        isMooring ? fmtRatio(idx.ratio(w, t, LIMIT_TARGET)) : '',
      ]);
    }
  }
  return { headers, align: headers.map((_, i) => (i < 2 ? 'l' : 'r')), rows };
}

/** One performance target, read against the table. */
export interface TargetVerdict {
  goal: string;
  /** 'pass' | 'miss' | 'not measured'. */
  verdict: 'pass' | 'miss' | 'not measured';
  detail: string;
}

export function judgeRatios(
  goal: string,
  threshold: number,
  pairs: Array<{ w: Workload; ratio: number | undefined }>,
): TargetVerdict {
  const have = pairs.filter((p): p is { w: Workload; ratio: number } => p.ratio !== undefined && Number.isFinite(p.ratio));
  if (have.length === 0) return { goal, verdict: 'not measured', detail: 'no matching runs' };
  const worst = have.reduce((a, b) => (b.ratio < a.ratio ? b : a));
  const geomean = Math.exp(have.reduce((s, p) => s + Math.log(p.ratio), 0) / have.length);
  const missed = have.filter((p) => p.ratio < threshold);
  const list = have.map((p) => `${p.w.label} ${fmtRatio(p.ratio)}`).join(', ');
  return {
    goal,
    verdict: missed.length === 0 ? 'pass' : 'miss',
    detail:
      `worst ${fmtRatio(worst.ratio)} (${worst.w.label}), geometric mean ${fmtRatio(geomean)}; ` +
      `${have.length - missed.length}/${have.length} runs meet it [${list}]`,
  };
}

/** Reads the performance targets against the results (printed, never asserted). */
export function judgeTargets(r: BenchResults): TargetVerdict[] {
  const idx = new ResultIndex(r.measurements);
  const random = r.workloads.filter((w) => w.family === 'random-4k');
  const seq = r.workloads.filter((w) => w.family === 'seq-1m');
  const writes = r.workloads.filter(isWrite);
  const verdicts = [
    judgeRatios(
      '1 replica ≥ 1.0× qemu-nbd raw on 4k random IOPS',
      1.0,
      random.map((w) => ({ w, ratio: idx.ratio(w, 'mooring-1', PEER_TARGET) })),
    ),
    judgeRatios(
      '1 replica ≥ 0.9× qemu-nbd raw on 1M throughput',
      0.9,
      seq.map((w) => ({ w, ratio: idx.ratio(w, 'mooring-1', PEER_TARGET) })),
    ),
    judgeRatios(
      '3 replicas ≥ 0.7× of 1 replica on writes',
      0.7,
      writes.map((w) => ({ w, ratio: idx.ratio(w, 'mooring-3', 'mooring-1') })),
    ),
    judgeRatios(
      '3 remote replicas (loopback TCP) ≥ 0.6× of 1 local replica on writes',
      0.6,
      writes.map((w) => ({ w, ratio: idx.ratio(w, 'mooring-3-remote', 'mooring-1') })),
    ),
  ];
  const rb = r.rebuild;
  const rebuildGoal = 'full rebuild ≥ 0.8× the disk\'s sequential write rate';
  const incGoal = 'incremental rebuild sends ≤ 1.2× the changed bytes';
  if (!rb) {
    verdicts.push({ goal: rebuildGoal, verdict: 'not measured', detail: 'skipped or failed' });
    verdicts.push({ goal: incGoal, verdict: 'not measured', detail: 'skipped or failed' });
  } else {
    const ratio = rb.full.mibPerSec / rb.diskSeqWriteMibPerSec;
    verdicts.push({
      goal: rebuildGoal,
      verdict: ratio >= 0.8 ? 'pass' : 'miss',
      detail: `${rb.full.mibPerSec.toFixed(0)} MiB/s vs ${rb.diskSeqWriteMibPerSec.toFixed(0)} MiB/s = ${fmtRatio(ratio)} (${fmtMiB(rb.full.sentBytes)} in ${(rb.full.durationMs / 1000).toFixed(2)} s)`,
    });
    const inc = rb.incremental.sentBytes / rb.incremental.changedBytes;
    verdicts.push({
      goal: incGoal,
      verdict: inc <= 1.2 ? 'pass' : 'miss',
      detail: `${fmtMiB(rb.incremental.sentBytes)} sent for ${fmtMiB(rb.incremental.changedBytes)} of unique 4 KiB blocks changed = ${fmtRatio(inc)}`,
    });
  }
  const mg = r.migration;
  const migGoal = 'live-migration hand-over < 50 ms median on loopback';
  if (!mg) verdicts.push({ goal: migGoal, verdict: 'not measured', detail: 'skipped or failed' });
  else {
    verdicts.push({
      goal: migGoal,
      verdict: mg.handOverMs.median < 50 ? 'pass' : 'miss',
      detail: `median ${mg.handOverMs.median.toFixed(1)} ms, p99 ${mg.handOverMs.p99.toFixed(1)} ms over ${mg.rounds} migrations; client pause ${fmtRatio(mg.clientPauseMs.median / mg.peer.clientPauseMs.median)} of qemu-nbd moved between sockets`,
    });
  }
  const up = r.upgrade;
  const upGoal = 'in-place upgrade: longest client pause < 100 ms, no reconnect (4k randwrite qd16)';
  if (!up) verdicts.push({ goal: upGoal, verdict: 'not measured', detail: 'skipped or failed' });
  else {
    const worst = Math.max(up.engineHost.clientPauseMs.max, up.replicaHosts.clientPauseMs.max);
    verdicts.push({
      goal: upGoal,
      verdict: worst < 100 && up.reconnects === 0 && up.writeErrors === 0 ? 'pass' : 'miss',
      detail: `max ${worst.toFixed(1)} ms over ${up.engineHost.handOffs + up.replicaHosts.handOffs} hand-offs, ${up.reconnects} reconnects, ${up.writeErrors} write errors; restart fallback median ${up.restart.clientPauseMs.median.toFixed(0)} ms, qemu-nbd restarted ${up.peer.clientPauseMs.median.toFixed(0)} ms, Longhorn's published 10–20 s`,
    });
  }
  const gm = r.guestMigration;
  const gmGoal = 'guest live migration: QEMU downtime within +20 ms of two qemu-nbd servers (median), hand-over < 50 ms p99';
  if (!gm) verdicts.push({ goal: gmGoal, verdict: 'not measured', detail: 'skipped or failed' });
  else {
    const extra = gm.downtimeMs.median - gm.peer.downtimeMs.median;
    verdicts.push({
      goal: gmGoal,
      verdict: extra <= 20 && gm.handOverMs.p99 < 50 ? 'pass' : 'miss',
      detail: `downtime median ${gm.downtimeMs.median.toFixed(0)} ms vs ${gm.peer.downtimeMs.median.toFixed(0)} ms (${extra >= 0 ? '+' : ''}${extra.toFixed(0)} ms, ${fmtRatio(gm.downtimeMs.median / gm.peer.downtimeMs.median)}); hand-over median ${gm.handOverMs.median.toFixed(1)} ms, p99 ${gm.handOverMs.p99.toFixed(1)} ms over ${gm.rounds} migrations`,
    });
  }
  const bi = r.backingImageRead;
  const biReadGoal = 'reads over a qcow2 backing image ≥ 1.0× qemu-nbd -r on the same image';
  if (!bi) verdicts.push({ goal: biReadGoal, verdict: 'not measured', detail: 'skipped or failed' });
  else {
    verdicts.push({
      goal: biReadGoal,
      verdict: bi.rows.every((x) => x.ratio >= 1) ? 'pass' : 'miss',
      detail: bi.rows.map((x) => `${x.label} ${fmtRatio(x.ratio)}`).join(', '),
    });
  }
  const bd = r.backingImageDelivery;
  const biDeliveryGoal = 'backing image copy between hosts ≥ 0.8× the disk\'s sequential write rate';
  if (!bd) verdicts.push({ goal: biDeliveryGoal, verdict: 'not measured', detail: 'skipped or failed' });
  else {
    const ratio = bd.delivery.mibPerSec / bd.diskSeqWriteMibPerSec;
    verdicts.push({ goal: biDeliveryGoal, verdict: ratio >= 0.8 ? 'pass' : 'miss', detail: `${bd.delivery.mibPerSec.toFixed(0)} MiB/s vs ${bd.diskSeqWriteMibPerSec.toFixed(0)} MiB/s = ${fmtRatio(ratio)} (${fmtMiB(bd.fileBytes)} in ${(bd.delivery.durationMs / 1000).toFixed(2)} s)` });
  }
  const rssGoal = `peak RSS ≤ 64 MiB for a 1 TiB sparse volume after 10,000 scattered 4 KiB writes`;
  if (!r.rss) verdicts.push({ goal: rssGoal, verdict: 'not measured', detail: 'skipped or failed' });
  else {
    verdicts.push({
      goal: rssGoal,
      verdict: r.rss.peakRssBytes <= RSS_TARGET_BYTES ? 'pass' : 'miss',
      detail: `VmHWM ${fmtMiB(r.rss.peakRssBytes)} (VmRSS at READY ${fmtMiB(r.rss.rssAtReadyBytes)}, ${r.rss.threads} threads)`,
    });
  }
  verdicts.push(...judgeCostTargets(r));
  return verdicts;
}

function migrationText(m: MigrationResults): string {
  const f = (x: MigrationResults['handOverMs']): string => `median ${x.median.toFixed(1)} ms, p99 ${x.p99.toFixed(1)} ms, max ${x.max.toFixed(1)} ms`;
  return (
    `Live migration (3 data-engine processes on loopback, a 3-replica volume migrated ${m.rounds} times between two hosts, ` +
    `a client writing 4 KiB blocks one at a time): hand-over (source drain start → target accepting writes) ${f(m.handOverMs)}; ` +
    `of which the source's drain and flush ${f(m.drainMs)}; client pause (last write acknowledged by the source → first by the target) ${f(m.clientPauseMs)}. ` +
    `Peer: ${m.peer.name}, client pause ${f(m.peer.clientPauseMs)} over ${m.peer.rounds} moves; ratio of medians ${fmtRatio(m.clientPauseMs.median / m.peer.clientPauseMs.median)} (lower is better).`
  );
}

function guestMigrationText(g: GuestMigrationResults): string {
  const f = (x: GuestMigrationResults['downtimeMs']): string => `median ${x.median.toFixed(1)} ms, p99 ${x.p99.toFixed(1)} ms, max ${x.max.toFixed(1)} ms`;
  return (
    `Live migration of a QEMU guest (TCG, 256 MiB, its /init writing 4 KiB blocks with O_DIRECT dd throughout; virtio-blk on a 3-replica volume of 3 data-engine processes on loopback; ` +
    `migrated ${g.rounds} times between two hosts with pause-before-switchover, the hand-over at pre-switchover, max-bandwidth 1 GiB/s): ` +
    `QEMU's downtime ${f(g.downtimeMs)}, of which Mooring's hand-over ${f(g.handOverMs)}; total migration time ${f(g.totalMs)}; ` +
    `the source QEMU quit after completion in ${f(g.quitMs)} (before the confirm). ` +
    `Peer: ${g.peer.name}, downtime ${f(g.peer.downtimeMs)}, total ${f(g.peer.totalMs)} over ${g.peer.rounds} migrations; ` +
    `downtime medians ${fmtRatio(g.downtimeMs.median / g.peer.downtimeMs.median)} (lower is better).`
  );
}

function upgradeText(u: UpgradeResults): string {
  const f = (x: UpgradeResults['restart']['clientPauseMs']): string => `median ${x.median.toFixed(1)} ms, p99 ${x.p99.toFixed(1)} ms, max ${x.max.toFixed(1)} ms`;
  return (
    `Upgrade of a data engine (3 data-engine processes on loopback, a 3-replica volume attached on h0, a client writing 4 KiB blocks at random offsets at queue depth 16; ` +
    `one upgrade session per hand-off, its snapshot deleted after it; the client pause is the longest stretch without a write acknowledged that overlaps the hand-off, from the host's switching-over to its process handed over). ` +
    `In place, engine host: client pause ${f(u.engineHost.clientPauseMs)} over ${u.engineHost.handOffs} hand-offs; export frozen ${f(u.engineHost.frozenMs)}; ` +
    `longest pause over the whole session, the volume's snapshot in its first step included, ${f(u.engineHost.sessionPauseMs)}. ` +
    `In place, replica hosts: client pause ${f(u.replicaHosts.clientPauseMs)} over ${u.replicaHosts.handOffs} hand-offs. ` +
    `${u.reconnects} reconnects and ${u.writeErrors} failed writes in all in-place sessions; the longest gap between acknowledgements in ${(u.quietMs / 1000).toFixed(0)} s of the same writes with no session was ${u.quietGapMs.toFixed(1)} ms. ` +
    `Fallback (method restart; the client connects again at once): client pause ${f(u.restart.clientPauseMs)} over ${u.restart.rounds} restarts. ` +
    `Peer: ${u.peer.name}, client pause ${f(u.peer.clientPauseMs)} over ${u.peer.rounds} restarts; ratio of maxima in place / peer ` +
    `${fmtRatio(Math.max(u.engineHost.clientPauseMs.max, u.replicaHosts.clientPauseMs.max) / u.peer.clientPauseMs.max)} (lower is better). Longhorn publishes 10–20 s for its instance-manager restart.`
  );
}

function backingImageText(b: BackingImageDeliveryResults): string {
  return (
    `Backing image (2 data-engine processes on loopback, a ${fmtMiB(b.fileBytes)} file of random bytes): upload into the first host ` +
    `${(b.upload.durationMs / 1000).toFixed(2)} s = ${b.upload.mibPerSec.toFixed(0)} MiB/s; copy to the second host pulled from the first directly ` +
    `(data engine to data engine over ${b.delivery.via}, SHA-512 verified on arrival) ${(b.delivery.durationMs / 1000).toFixed(2)} s = ${b.delivery.mibPerSec.toFixed(0)} MiB/s` +
    (b.relay ? `, relayed through the bench's process (the fallback) ${(b.relay.durationMs / 1000).toFixed(2)} s = ${b.relay.mibPerSec.toFixed(0)} MiB/s ` : ' ') +
    `(disk sequential write with fsync: ${b.diskSeqWriteMibPerSec.toFixed(0)} MiB/s).`
  );
}

function rebuildText(rb: RebuildResults): string {
  return (
    `Rebuild (3 data-engine processes on loopback, ${fmtMiB(rb.volumeBytes)} volume): full rebuild into an empty replica ` +
    `${fmtMiB(rb.full.sentBytes)} in ${(rb.full.durationMs / 1000).toFixed(2)} s = ${rb.full.mibPerSec.toFixed(0)} MiB/s ` +
    `(disk sequential write with fsync: ${rb.diskSeqWriteMibPerSec.toFixed(0)} MiB/s); incremental after ` +
    `${fmtMiB(rb.incremental.changedBytes)} of unique 4 KiB blocks changed while the replica's host was down: ` +
    `${fmtMiB(rb.incremental.sentBytes)} sent in ${(rb.incremental.durationMs / 1000).toFixed(2)} s.`
  );
}

function backingImageTable(b: BackingImageReadResults): Table {
  return {
    headers: ['workload', 'Mooring', 'qemu-nbd -r', 'ratio', 'Mooring clat p50/p99 µs', 'qemu clat p50/p99 µs', 'ratio per round'],
    align: ['l', 'r', 'r', 'r', 'r', 'r', 'l'],
    rows: b.rows.map((x) => {
      const fig = (f: BackingImageRow['mooring']): string => (x.family === 'random-4k' ? `${f.iops.toFixed(0)} IOPS` : `${f.mibPerSec.toFixed(0)} MiB/s`);
      const lat = (f: BackingImageRow['mooring']): string => `${f.clatP50Us.toFixed(0)} / ${f.clatP99Us.toFixed(0)}`;
      return [x.label, fig(x.mooring), fig(x.qemu), fmtRatio(x.ratio), lat(x.mooring), lat(x.qemu), x.rounds.map(([m, q]) => fmtRatio(m / q)).join(' ')];
    }),
  };
}

function backingImageIntro(b: BackingImageReadResults): string {
  return (
    `Backing image: a ${fmtMiB(b.imageBytes)} qcow2 (${b.clusterBytes / 1024} KiB clusters, random data written by qemu-io, every cluster allocated) ` +
    `beneath an empty 1-replica Mooring volume, against \`qemu-nbd -r -f qcow2 -t -e 8\` (default writeback cache) on the same file; ` +
    `both warmed by one sequential read, then each workload on Mooring and qemu-nbd in turn` +
    `${b.rounds > 1 ? `, median of ${b.rounds} rounds` : ''}. Ratio = Mooring / qemu-nbd (target ≥ 1.0×).`
  );
}

/** The full stderr of a failed child was logged when it happened; summaries keep 3 lines. */
function briefMessage(m: string): string {
  return m
    .split('\n')
    .filter((l) => l.trim())
    .slice(0, 3)
    .join(' / ');
}

function targetsText(v: TargetVerdict[]): string {
  return v.map((x) => `  [${x.verdict.toUpperCase()}] ${x.goal}\n         ${x.detail}`).join('\n');
}

export function machineLines(r: Pick<BenchResults, 'machine' | 'scratchDir' | 'loadBefore' | 'loadAfter'>): string[] {
  const m = r.machine;
  return [
    `CPU: ${m.cpuModel}, ${m.cores} cores; memory ${m.memoryGiB} GiB`,
    `OS: ${m.distro}, kernel ${m.kernel}`,
    `Filesystem (scratch ${r.scratchDir}): ${m.filesystem}`,
    `Versions: ${m.fio}; ${m.qemuNbd}; Node ${m.node}; mooring ${m.mooring}`,
    `Load average before/after: ${r.loadBefore.map((x) => x.toFixed(2)).join(' ')} / ${r.loadAfter.map((x) => x.toFixed(2)).join(' ')}`,
  ];
}

/**
 * The Machine section of a report of its own (scale, control): the machine's lines, `extra`
 * ones, and when the machine was busy a note ending in how to read the figures then.
 */
export function machineSection(r: Pick<BenchResults, 'machine' | 'scratchDir' | 'loadBefore' | 'loadAfter'>, extra: string[], whenShared: string): string[] {
  const lines = ['## Machine', '', ...[...machineLines(r), ...extra].map((l) => `- ${l}`), ''];
  if (r.loadBefore[0]! > BUSY_LOAD) {
    lines.push(
      `> The machine was shared during this run (1-minute load ${r.loadBefore[0]!.toFixed(2)} at the start on ${r.machine.cores} cores): ` +
        `absolute figures are noisy; ${whenShared}`,
      '',
    );
  }
  return lines;
}

/** What goes to stdout at the end of a run. */
export function renderStdout(r: BenchResults): string {
  const parts = [
    '',
    `Mooring benchmark (${r.quick ? 'quick, ' : ''}${r.runtimeSec} s per workload, ${fmtMiB(r.areaBytes)} area` +
      `${r.repeat > 1 ? `, median of ${r.repeat} rounds` : ''})`,
    ...machineLines(r),
    '',
  ];
  if (r.targets.length > 0) {
    parts.push(
      'Summary (4k: IOPS; 1M: MiB/s; ratios on the same figure):',
      renderText(summaryTable(r)),
      '',
      'Detail (clat percentiles; server CPU in % of one core):',
      renderText(detailTable(r)),
      '',
    );
    const cost = costTable(r);
    if (cost.rows.length > 0) parts.push('Cost per I/O (all server processes of a target summed):', renderText(cost), '', renderText(peerRatioTable(r)), '');
  }
  if (r.rss) {
    parts.push(
      `RSS: 1 TiB sparse 1-replica volume after ${r.rss.writes} scattered 4 KiB writes: ` +
        `VmHWM ${fmtMiB(r.rss.peakRssBytes)} (VmRSS at READY ${fmtMiB(r.rss.rssAtReadyBytes)})`,
      '',
    );
  }
  if (r.rebuild) parts.push(rebuildText(r.rebuild), '');
  if (r.migration) parts.push(migrationText(r.migration), '');
  if (r.upgrade) parts.push(upgradeText(r.upgrade), '');
  if (r.guestMigration) parts.push(guestMigrationText(r.guestMigration), '');
  if (r.backingImageRead) parts.push(backingImageIntro(r.backingImageRead), renderText(backingImageTable(r.backingImageRead)), '');
  if (r.backingImageDelivery) parts.push(backingImageText(r.backingImageDelivery), '');
  if (r.serverPeaks.length > 0) {
    parts.push(`Server peak RSS during the runs: ${r.serverPeaks.map((p) => `${TARGET_SHORT[p.targetId]} ${fmtMiB(p.peakRssBytes)} (${p.threads} threads)`).join(', ')}`, '');
  }
  parts.push('Targets (read against, not asserted):', targetsText(judgeTargets(r)), '');
  if (r.failures.length > 0) {
    parts.push('Failures (details above on stderr):', ...r.failures.map((f) => `  ${f.what}: ${briefMessage(f.message)}`), '');
  }
  return parts.join('\n');
}

/** The Markdown report (docs/benchmarks.md). */
export function renderMarkdownReport(r: BenchResults): string {
  const verdicts = judgeTargets(r);
  const out: string[] = [
    '# Benchmarks',
    '',
    `Generated by \`mooring bench${r.quick ? ' --quick' : ''}\` on ${r.startedAt.toISOString()} ` +
      `(${Math.round(r.durationSec)} s wall). Re-run with \`npm run bench\` after \`npm run build\`.`,
    '',
    'Why the figures are what they are (profiles, the 3-replica write ratio on a single disk, what is left to do): ' +
      '[performance-notes.md](performance-notes.md).',
    '',
    'Reports of their own: [benchmarks-hosts.md](benchmarks-hosts.md) (remote replicas and rebuilds), ' +
      '[benchmarks-upgrade.md](benchmarks-upgrade.md) (pauses during an in-place upgrade), ' +
      '[benchmarks-guest-migration.md](benchmarks-guest-migration.md) (a QEMU guest\'s migration downtime), ' +
      '[benchmarks-scale.md](benchmarks-scale.md) (volumes, chain depth, extents), ' +
      '[benchmarks-control.md](benchmarks-control.md) (control operations with the file store and with etcd).',
    '',
    '## Machine',
    '',
    ...machineLines(r).map((l) => `- ${l}`),
    '',
    ...(r.loadBefore[0]! > BUSY_LOAD
      ? [
          `> The machine was shared during this run (1-minute load ${r.loadBefore[0]!.toFixed(2)} at the start on ` +
            `${r.machine.cores} cores): absolute figures are noisy and only the interleaved ratios are meaningful. ` +
            'Re-run on a quiet machine for reference numbers.',
          '',
        ]
      : []),
    '## Method',
    '',
    `- All targets live on the same filesystem under one scratch directory. Every target gets a fresh ` +
      `${fmtMiB(r.areaBytes)} test area that is first written completely (fio 1 MiB sequential writes through the ` +
      `same path), so reads hit data, not holes, alike for all targets.`,
    `- All targets are started and pre-written first; then each workload runs on each target in turn, ` +
      `one fio at a time (never two jobs at once), so a burst of other load on a shared machine is spread over all ` +
      `targets instead of skewing one. \`syncfs\` runs after the pre-writes and after every run so one run's ` +
      `writeback does not land in the next.` +
      (r.repeat > 1 ? ` The whole rotation ran ${r.repeat} times; each figure is the run with the median headline value.` : ''),
    `- fio ${r.quick ? '(quick mode) ' : ''}\`--time_based --runtime=${r.runtimeSec}\`` +
      `${r.rampSec > 0 ? ` \`--ramp_time=${r.rampSec}\`` : ''} \`--group_reporting --output-format=json\`; ` +
      `random workloads use \`--norandommap --randrepeat=0\`. Latencies are fio completion-latency (clat) percentiles.`,
    '- NBD targets are driven by fio `--ioengine=nbd --uri=nbd+unix:///?socket=...` (libnbd; `numjobs=4` opens 4 connections):',
    `  - **Mooring**: 1 replica: \`node dist/cli.js serve --dir D --size ${r.areaBytes} --nbd unix:S\`; ` +
      '3 replicas: an engine started over gRPC in a `mooring data-engine` process, with its three replica directories on the same host ' +
      '(or, remote, on three other data-engine processes reached over loopback TCP). ' +
      'Mooring serves through the page cache (buffered pwrite/pread, fdatasync on FLUSH).',
    '  - **qemu-nbd**: `qemu-nbd -f raw|qcow2 -t -e 8 -k S FILE` with its default `cache=writeback` (also the page cache: ' +
      'the same cache family as Mooring, so this is the primary peer). The qcow2 image is fully allocated by the pre-write.' +
      (r.targets.includes('qemu-raw-nocache') ? ' The `cache=none` row adds `--cache=none --aio=native` (O_DIRECT) for reference.' : ''),
    ...costMethodLines(r).filter((l) => l.startsWith('  - ')),
    '- **Limit**: fio `--ioengine=io_uring` directly on a file, buffered (`direct=0`, same page-cache path, no NBD, no server); ' +
      'this is what "vs limit" divides by. It is one fio process: where the page cache is not the bottleneck ' +
      '(1 MiB copies), a multi-threaded server can exceed it, so a ratio above 1 there is no error.' +
      (r.targets.includes('file-direct') ? ' `file io_uring direct=1` (O_DIRECT, the device itself) is shown for reference only.' : ''),
    '- Server CPU is the user+system time of all of a target\'s server processes during the workload (from /proc/PID/stat), in % of one core. ' +
      'fio and the servers share the same cores, so client CPU competes with the servers.',
    ...costMethodLines(r).filter((l) => l.startsWith('- ')),
    '- RSS: `mooring serve --size 1T` (one replica) on a fresh sparse volume, then fio `randwrite bs=4k --number_ios=10000 --size=1T`; ' +
      'the figure is VmHWM from /proc/PID/status (peak resident set of the whole Node process, including Node\'s own baseline).',
    '',
    '## Results',
    '',
    'Headline figure per workload (4k random: IOPS; 1M sequential: MiB/s). `M1`/`M3` = Mooring with 1/3 replicas; ' +
      '`/qemu raw` = ratio to qemu-nbd raw; `/limit` = ratio to buffered io_uring on a file; `M3/M1` for writes.',
    '',
    renderMarkdown(summaryTable(r)),
    '',
    '### Detail',
    '',
    renderMarkdown(detailTable(r)),
    '',
  ];
  if (r.serverPeaks.length > 0) {
    out.push(
      'Server peak RSS over each target\'s whole run (summed over its server processes): ' +
        r.serverPeaks.map((p) => `${TARGET_LABELS[p.targetId]} ${fmtMiB(p.peakRssBytes)} (${p.threads} threads${p.processes > 1 ? ` in ${p.processes} processes` : ''})`).join('; ') +
        '.',
      '',
    );
  }
  out.push('### Rebuild over loopback TCP', '');
  out.push(r.rebuild ? rebuildText(r.rebuild) : 'Not measured in this run.', '');
  out.push('### Live migration over loopback', '');
  out.push(r.migration ? migrationText(r.migration) : 'Not measured in this run.', '');
  out.push('### Upgrade of a data engine, in place, over loopback', '');
  out.push(r.upgrade ? upgradeText(r.upgrade) : 'Not measured in this run.', '');
  out.push('### Live migration of a QEMU guest', '');
  out.push(r.guestMigration ? guestMigrationText(r.guestMigration) : 'Not measured in this run.', '');
  out.push('### Reads over a qcow2 backing image', '');
  if (r.backingImageRead) out.push(backingImageIntro(r.backingImageRead), '', renderMarkdown(backingImageTable(r.backingImageRead)), '');
  else out.push('Not measured in this run.', '');
  out.push('### Backing image delivery over loopback', '');
  out.push(r.backingImageDelivery ? backingImageText(r.backingImageDelivery) : 'Not measured in this run.', '');
  out.push('### Memory: 1 TiB sparse volume', '');
  if (r.rss) {
    out.push(
      `After ${r.rss.writes.toLocaleString('en-US')} scattered 4 KiB writes to a ${(r.rss.volumeBytes / 1024 ** 4).toFixed(0)} TiB sparse 1-replica volume: ` +
        `peak RSS (VmHWM) **${fmtMiB(r.rss.peakRssBytes)}**; RSS right after READY was ${fmtMiB(r.rss.rssAtReadyBytes)} ` +
        `(${r.rss.threads} threads).`,
      '',
    );
  } else {
    out.push('Not measured in this run.', '');
  }
  out.push(...costSection(r, renderMarkdown));
  out.push(
    '## Targets',
    '',
    'Read against the table, not asserted by any test.',
    '',
    '| target | result | detail |',
    '| --- | --- | --- |',
    ...verdicts.map((v) => `| ${v.goal} | **${v.verdict}** | ${v.detail} |`),
    '',
  );
  if (r.failures.length > 0) {
    out.push('## Failures in this run', '', ...r.failures.map((f) => `- ${f.what}: ${briefMessage(f.message)}`), '');
  }
  return out.join('\n');
}
