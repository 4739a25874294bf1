// `mooring info`: size, replicas, epochs and snapshots of the volumes in a directory, read
// without changing anything: a directory no process has open is inspected under its locks
// (no writer epoch is claimed); one that mooring serve has open is asked through its
// status socket.
import { join, resolve } from 'node:path';

import { MooringError } from '../errors.js';
import { pathExists } from '../util/files.js';
import { formatBytes } from '../util/size.js';
import { inspectVolume } from '../volume/directory-inspect.js';
import { VOLUME_SPEC_FILE } from '../volume/volume-spec.js';
import { inspectStoredVolumes } from '../volume/volume-inspect.js';
import { UsageError, addonOf, isoTime, parseCommandArgs, printJson, requireDir, type CliContext } from './common.js';
import { STATUS_SOCKET_FILE, queryStatus } from './status-socket.js';
import { legacyReport, storedReports, type InfoReport } from './volume-report.js';

/** Help text of `mooring info`. */
export const INFO_HELP = `Usage: mooring info --dir DIR [--volume NAME] [--json]

Show the volumes in DIR: size, writer epoch, replicas (host, mode, epoch, allocated bytes)
and snapshots. Nothing is changed: a directory no process has open is read under its
locks, and a volume that mooring serve serves is asked through DIR/${STATUS_SOCKET_FILE}
(the answer is live). Replicas on other hosts show what the store last recorded.

Options:
  --dir DIR        Mooring's directory (required)
  --volume NAME    only this volume
  --json           machine-readable output (an array of volumes)
  -h, --help       show this help
`;

/** Runs `mooring info`. */
export async function runInfo(argv: string[], ctx: CliContext): Promise<number> {
  const { values } = parseCommandArgs(
    'info',
    argv,
    { dir: { type: 'string' }, volume: { type: 'string' }, json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(INFO_HELP);
    return 0;
  }
  const dir = resolve(ctx.cwd ?? process.cwd(), requireDir('info', values.dir));
  if (values.volume === '') throw new UsageError('info', '--volume needs a NAME');
  const reports = await readReports(dir, values.volume, ctx);
  if (values.json) {
    printJson(ctx, reports);
    return 0;
  }
  ctx.stdout(reports.length === 0 ? `no volumes in ${dir}\n` : `${reports.map(formatReport).join('\n')}`);
  return 0;
}

function formatReport(r: InfoReport): string {
  const lines = [
    `volume    ${r.volume} (${r.uuid})`,
    `dir       ${r.dir}${r.hostId ? ` (host ${r.hostId})` : ''}`,
    `size      ${formatBytes(r.sizeBytes)} (${r.sizeBytes} bytes)`,
    r.servedBy
      ? `served    by pid ${r.servedBy.pid}${r.servedBy.nbd ? ` at ${r.servedBy.nbd}` : ''}; ${r.state}; writer epoch ${r.epoch}`
      : `served    no (${r.state}); last writer epoch ${r.epoch}`,
    `replicas  ${r.replicas.length} of ${r.replicaCount}`,
    ...r.replicas.map(
      (x) =>
        `  ${x.id.padEnd(4)} ${(x.hostId ?? '').padEnd(12)} ${x.mode.padEnd(7)}` +
        (x.epoch !== undefined ? ` epoch ${String(x.epoch).padEnd(6)}` : '') +
        (x.allocatedBytes !== undefined ? ` allocated ${formatBytes(x.allocatedBytes).padEnd(10)}` : '') +
        (x.path ? ` ${x.path}` : '') +
        (x.rebuild ? `  rebuilding ${x.rebuild.scannedBytes}/${x.rebuild.totalBytes}` : '') +
        (x.lastError ? `  last error: ${x.lastError}` : '') +
        (x.unreadable ? `  unreadable: ${x.unreadable}` : ''),
    ),
    `snapshots ${r.snapshots.length}`,
    ...r.snapshots.map(
      (s) =>
        `  ${s.name.padEnd(20)} ${isoTime(s.createdMs)}  ${formatBytes(s.allocatedBytes).padEnd(10)}` +
        (Object.keys(s.labels).length > 0 ? ` ${Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(' ')}` : ''),
    ),
  ];
  return `${lines.map((l) => l.trimEnd()).join('\n')}\n`;
}

// The volumes as the serving process reports them, else as the files say.
async function readReports(dir: string, volume: string | undefined, ctx: CliContext): Promise<InfoReport[]> {
  const addon = addonOf(ctx);
  if (await pathExists(join(dir, VOLUME_SPEC_FILE))) {
    const report = legacyReport(await inspectVolume(dir, addon).catch((err: unknown) => Promise.reject(busyHint(err, dir))));
    if (volume !== undefined && volume !== report.volume) throw new MooringError('NOT_FOUND', `${dir} holds no volume ${volume}`);
    return [report];
  }
  if (!(await pathExists(dir))) throw new MooringError('NOT_FOUND', `${dir} does not exist`);
  try {
    return storedReports(dir, await inspectStoredVolumes(dir, addon, volume));
  } catch (err) {
    if (!(err instanceof MooringError) || err.code !== 'BUSY') throw err;
    const live = await queryStatus(join(dir, STATUS_SOCKET_FILE));
    if (live === null) throw busyHint(err, dir);
    const report = { ...(live.status as InfoReport), servedBy: { pid: live.pid, nbd: (live.status as InfoReport).servedBy?.nbd ?? null } };
    if (volume !== undefined && volume !== report.volume) {
      throw new MooringError('BUSY', `${dir} is open in pid ${live.pid}, which serves ${report.volume}; ${volume} cannot be read while it is open`, { cause: err });
    }
    return [report];
  }
}

function busyHint(err: unknown, dir: string): unknown {
  if (!(err instanceof MooringError) || err.code !== 'BUSY') return err;
  return new MooringError('BUSY', `${err.message}; it has no status socket to ask (${join(dir, STATUS_SOCKET_FILE)}), so it cannot be shown while it is open`, { cause: err, ...(err.details ? { details: err.details } : {}) });
}
