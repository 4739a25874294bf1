// `mooring info`: size, replicas, epoch and snapshots of a volume.
import { resolve } from 'node:path';

import { DirectoryVolume } from '../volume/directory-volume.js';
import { formatBytes } from '../util/size.js';
import { isoTime, parseCommandArgs, printJson, requireDir, addonOf, type CliContext } from './common.js';

/** Help text of `mooring info`. */
export const INFO_HELP = `Usage: mooring info --dir DIR [--json]

Show a volume: size, writer epoch, replicas (mode, epoch, allocated bytes) and snapshots.
Opening the volume claims a new writer epoch, so it is refused (BUSY) while another
process (e.g. mooring serve) has the volume open.

Options:
  --dir DIR    volume directory (required)
  --json       machine-readable output
  -h, --help   show this help
`;

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
  const volume = await DirectoryVolume.open(dir, { addon: addonOf(ctx) });
  try {
    const status = await volume.status();
    const snapshots = await volume.listSnapshots();
    if (values.json) {
      printJson(ctx, { ...status, replicaCount: status.replicas.length, snapshots });
      return 0;
    }
    const lines = [
      `volume    ${status.name} (${status.uuid})`,
      `dir       ${status.dir}`,
      `size      ${formatBytes(status.sizeBytes)} (${status.sizeBytes} bytes)`,
      `epoch     ${status.epoch}`,
      `replicas  ${status.replicas.length} (${status.healthy ? 'healthy' : 'degraded'})`,
      ...status.replicas.map(
        (r) =>
          `  ${r.id.padEnd(4)} ${r.mode.padEnd(3)}  epoch ${String(r.epoch).padEnd(6)} allocated ${formatBytes(r.allocatedBytes).padEnd(10)} ${r.path}` +
          (r.lastError ? `  last error: ${r.lastError.code} (${r.lastError.message})` : ''),
      ),
      `snapshots ${snapshots.length}`,
      ...snapshots.map(
        (s) =>
          `  ${s.name.padEnd(20)} ${isoTime(s.createdMs)}  ${formatBytes(s.allocatedBytes).padEnd(10)}` +
          (Object.keys(s.labels).length > 0 ? ` ${Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(' ')}` : ''),
      ),
    ];
    ctx.stdout(`${lines.join('\n')}\n`);
    return 0;
  } finally {
    await volume.close();
  }
}
