/**
 * docs/benchmarks-scale.md: each curve's figures per size, the growth factor per step next to
 * the step's growth in the size, failures with their codes, and issue 21's targets.
 */
import type { MachineInfo } from '../machine.js';
import { machineSection, renderMarkdown, renderText, type Table } from '../report.js';
import type { ScaleCurve, ScalePoint } from './curve.js';
import type { ScaleResults } from './index.js';

export interface ScaleReportMeta {
  startedAt: Date;
  durationSec: number;
  machine: MachineInfo;
  scratchDir: string;
  loadBefore: number[];
  loadAfter: number[];
  /** The git commit the measured build was made from, if known. */
  commit: string | undefined;
  /** The command line of the run. */
  command: string;
}

function fmt(v: number | undefined, digits: number): string {
  if (v === undefined || !Number.isFinite(v)) return '–';
  return v.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

/** Figures per size; a failed size shows its code. */
export function curveTable(c: ScaleCurve): Table {
  return {
    headers: [c.sizeLabel, ...c.columns.map((col) => col.label), 'wall s', 'status'],
    align: ['r', ...c.columns.map(() => 'r' as const), 'r', 'l'],
    rows: c.points.map((p) => [
      fmt(p.size, 0),
      ...c.columns.map((col) => fmt(p.figures[col.key], col.digits)),
      fmt(p.wallSec, 1),
      p.failure ? `failed: ${p.failure.code}` : 'ok',
    ]),
  };
}

/** value_k / value_{k-1}, and that over N_k / N_{k-1} (1 = linear, 0 = flat); '–' when either side is missing. */
function growthCell(prev: ScalePoint, cur: ScalePoint, key: string): string {
  const a = prev.figures[key];
  const b = cur.figures[key];
  if (a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || a === 0) return '–';
  const g = b / a;
  const n = prev.size > 0 ? cur.size / prev.size : undefined;
  return n === undefined ? `×${fmt(g, 2)}` : `×${fmt(g, 2)} (${fmt(g / n, 2)} of N's)`;
}

/** One row per step between two measured sizes. */
export function growthTable(c: ScaleCurve): Table | undefined {
  const ok = c.points.filter((p) => !p.failure);
  if (ok.length < 2) return undefined;
  const rows = ok.slice(1).map((cur, i) => {
    const prev = ok[i]!;
    const n = prev.size > 0 ? `×${fmt(cur.size / prev.size, 1)}` : 'from 0';
    return [`${fmt(prev.size, 0)} → ${fmt(cur.size, 0)} (${n})`, ...c.columns.map((col) => growthCell(prev, cur, col.key))];
  });
  return { headers: ['step (growth in N)', ...c.columns.map((col) => col.label)], align: ['l', ...c.columns.map(() => 'r' as const)], rows };
}

function pointAt(r: ScaleResults, id: ScaleCurve['id'], size: number): ScalePoint | undefined {
  return r.curves.find((c) => c.id === id)?.points.find((p) => p.size === size && !p.failure);
}

/** Issue 21's targets that this run measured (at the sizes they name), each pass or miss. */
export function scaleVerdicts(r: ScaleResults): string[] {
  const out: string[] = [];
  const judge = (what: string, value: number | undefined, ok: (v: number) => boolean, shown: string): void => {
    if (value !== undefined && Number.isFinite(value)) out.push(`| ${what} | ${shown} | **${ok(value) ? 'pass' : 'miss'}** |`);
  };
  const c1000 = pointAt(r, 'cluster', 1000);
  const c10 = pointAt(r, 'cluster', 10);
  judge('cluster, 1,000 volumes: listVolumes < 200 ms', c1000?.figures['listMs'], (v) => v < 200, `${fmt(c1000?.figures['listMs'], 1)} ms`);
  judge('cluster, 1,000 volumes: full pass < 2 s', c1000?.figures['passMs'], (v) => v < 2000, `${fmt(c1000?.figures['passMs'], 1)} ms`);
  judge('cluster, 1,000 volumes: idle control-plane CPU < 5% of a core', c1000?.figures['idleCpuPct'], (v) => v < 5, `${fmt(c1000?.figures['idleCpuPct'], 1)}%`);
  const p99 = c1000?.figures['attachP99Ms'];
  const base = c10?.figures['attachP99Ms'];
  if (p99 !== undefined && base !== undefined) judge('cluster, 1,000 volumes: attach p99 within 2× of 10 volumes', p99 / base, (v) => v <= 2, `×${fmt(p99 / base, 2)}`);
  const h1000 = pointAt(r, 'host', 1000);
  judge('host, 1,000 attached volumes, an NBD client on each: < 100 threads in the data engine', h1000?.figures['threads'], (v) => v < 100, fmt(h1000?.figures['threads'], 0));
  const d1000 = pointAt(r, 'depth', 1000);
  judge('depth 1,000: 4k random reads ≥ 0.9× a flat volume', d1000?.figures['ratio'], (v) => v >= 0.9, `${fmt(d1000?.figures['ratio'], 2)}×`);
  // "Independent of depth": ten times the depth, at most half as slow again (a shared
  // machine moves single figures by a third either way).
  const snap1000 = d1000?.figures['snapshotMs'];
  const snap100 = pointAt(r, 'depth', 100)?.figures['snapshotMs'];
  if (snap1000 !== undefined && snap100 !== undefined)
    judge('depth 100 → 1,000: snapshot create within 1.5× (independent of depth)', snap1000 / snap100, (v) => v <= 1.5, `×${fmt(snap1000 / snap100, 2)} (${fmt(snap100, 1)} → ${fmt(snap1000, 1)} ms)`);
  return out;
}

function failureLines(c: ScaleCurve): string[] {
  return c.points.filter((p) => p.failure).map((p) => `- At ${fmt(p.size, 0)} ${c.sizeLabel}: **${p.failure!.code}**: ${p.failure!.message.replace(/\s+/g, ' ').slice(0, 600)} (the curve stops here).`);
}

export function renderScaleMarkdown(r: ScaleResults, meta: ScaleReportMeta): string {
  const lines = [
    '# Scale benchmarks',
    '',
    `Generated by \`${meta.command}\` on ${meta.startedAt.toISOString()} (${Math.round(meta.durationSec)} s wall)` +
      `${meta.commit ? `, measured at commit \`${meta.commit}\`` : ''}. Re-run with \`npm run bench -- --scale-only\` after \`npm run build\` ` +
      '(`--scale-max N` caps every curve at N, `--quick` keeps the first two sizes); the figures answer issue 21.',
    '',
    'Each curve grows one thing at a time. Under each table, the growth factor per step is the figure at a size over the figure at the ' +
      "previous size, and in brackets that factor over the step's growth in the size itself (\"of N's\"): about 1 means the cost grows " +
      'linearly, about 0 that it stays flat, above 1 faster than linearly. A size that failed is listed with its error code and ends its curve.',
    '',
    ...machineSection(meta, [`Open-file limit of the bench and its data engines (soft): ${r.openFileLimit}`], 'read the growth factors, and a single step\'s factor only roughly.'),
  ];
  const verdicts = scaleVerdicts(r);
  if (verdicts.length > 0) lines.push('## Targets (issue 21)', '', '| target | measured | verdict |', '| --- | ---: | --- |', ...verdicts, '');
  for (const c of r.curves) {
    lines.push(`## ${c.title}`, '', c.method, '', renderMarkdown(curveTable(c)), '');
    const g = growthTable(c);
    if (g) lines.push('Growth per step:', '', renderMarkdown(g), '');
    const f = failureLines(c);
    if (f.length > 0) lines.push(...f, '');
  }
  for (const f of r.failures) lines.push(`## ${f.curve}: not measured`, '', `**${f.code}**: ${f.message}`, '');
  return `${lines.join('\n').trimEnd()}\n`;
}

/** The curves as text tables for stdout. */
export function renderScaleStdout(r: ScaleResults): string {
  const parts: string[] = [];
  for (const c of r.curves) {
    parts.push(`${c.title}:`, renderText(curveTable(c)));
    const g = growthTable(c);
    if (g) parts.push('growth per step:', renderText(g));
    parts.push(...failureLines(c), '');
  }
  for (const f of r.failures) parts.push(`${f.curve}: not measured: ${f.code}: ${f.message}`);
  return `${parts.join('\n')}\n`;
}
