// `mooring info`: size, replicas, epochs and snapshots of a volume, read without changing
// anything: a volume no process serves is inspected under its lock (no writer epoch is
// claimed); a served one is asked through its server's status socket.
import { join, resolve } from 'node:path';

import { MooringError } from '../errors.js';
import { formatBytes } from '../util/size.js';
import type { SnapshotInfo } from '../volume/directory-volume.js';
import { inspectVolume } from '../volume/directory-inspect.js';
import { addonOf, isoTime, parseCommandArgs, printJson, requireDir, type CliContext } from './common.js';
import { STATUS_SOCKET_FILE, queryStatus } from './status-socket.js';

/** Help text of `mooring info`. */
export const INFO_HELP = `Usage: mooring info --dir DIR [--json]

Show a volume: size, writer epoch, replicas (mode, epoch, allocated bytes) and snapshots.
Nothing is changed: a volume that no process serves is read under its lock, and a volume
that mooring serve serves is asked through DIR/${STATUS_SOCKET_FILE} (the answer is live).

Options:
  --dir DIR    volume directory (required)
  --json       machine-readable output
  -h, --help   show this help
`;

/** One replica line, as both sources report it. */
interface ReplicaLine {
  id: string;
  mode: string;
  epoch: number;
  allocatedBytes: number;
  path: string;
  lastError?: { code: string; message: string };
  unreadable?: string;
}

/** What info prints, from either source. */
interface InfoReport {
  name: string;
  uuid: string;
  dir: string;
  sizeBytes: number;
  /** The engine's epoch when served, else the last one handed out. */
  epoch: number;
  healthy: boolean;
  replicaCount: number;
  replicas: ReplicaLine[];
  snapshots: SnapshotInfo[];
  /** The serving process, or null when the volume is not served. */
  servedBy: { pid: number; nbd: string | null } | null;
}

/** Runs `mooring info`. */
export async function runInfo(argv: string[], ctx: CliContext): Promise<number> {
  const { values } = parseCommandArgs(
    'info',
    argv,
    { dir: { type: 'string' }, json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(INFO_HELP);
    return 0;
  }
  const dir = resolve(ctx.cwd ?? process.cwd(), requireDir('info', values.dir));
  const report = await readReport(dir, ctx);
  if (values.json) {
    printJson(ctx, report);
    return 0;
  }
  const lines = [
    `volume    ${report.name} (${report.uuid})`,
    `dir       ${report.dir}`,
    `size      ${formatBytes(report.sizeBytes)} (${report.sizeBytes} bytes)`,
    report.servedBy
      ? `served    by pid ${report.servedBy.pid}${report.servedBy.nbd ? ` at ${report.servedBy.nbd}` : ''}; writer epoch ${report.epoch}`
      : `served    no; last writer epoch ${report.epoch}`,
    `replicas  ${report.replicas.length} (${report.healthy ? 'healthy' : 'degraded'})`,
    ...report.replicas.map(
      (r) =>
        `  ${r.id.padEnd(4)} ${r.mode.padEnd(3)}  epoch ${String(r.epoch).padEnd(6)} allocated ${formatBytes(r.allocatedBytes).padEnd(10)} ${r.path}` +
        (r.lastError ? `  last error: ${r.lastError.code} (${r.lastError.message})` : '') +
        (r.unreadable ? `  unreadable: ${r.unreadable}` : ''),
    ),
    `snapshots ${report.snapshots.length}`,
    ...report.snapshots.map(
      (s) =>
        `  ${s.name.padEnd(20)} ${isoTime(s.createdMs)}  ${formatBytes(s.allocatedBytes).padEnd(10)}` +
        (Object.keys(s.labels).length > 0 ? ` ${Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(' ')}` : ''),
    ),
  ];
  ctx.stdout(`${lines.join('\n')}\n`);
  return 0;
}

// The volume as its server reports it, else as its files say.
async function readReport(dir: string, ctx: CliContext): Promise<InfoReport> {
  try {
    const v = await inspectVolume(dir, addonOf(ctx));
    return { ...v, epoch: v.lastEpoch, replicaCount: v.replicas.length, servedBy: null };
  } catch (err) {
    if (!(err instanceof MooringError) || err.code !== 'BUSY') throw err;
    const live = await queryStatus(join(dir, STATUS_SOCKET_FILE));
    if (live === null) throw new MooringError('BUSY', `${err.message}; it has no status socket to ask (${STATUS_SOCKET_FILE}), so it cannot be shown while it is open`, { cause: err });
    const s = live.status as Omit<InfoReport, 'servedBy'> & { exported: { address: string } | null };
    return {
      name: s.name,
      uuid: s.uuid,
      dir: s.dir,
      sizeBytes: s.sizeBytes,
      epoch: s.epoch,
      healthy: s.healthy,
      replicaCount: s.replicaCount,
      replicas: s.replicas,
      snapshots: s.snapshots,
      servedBy: { pid: live.pid, nbd: s.exported?.address ?? null },
    };
  }
}
