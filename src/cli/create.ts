// `mooring create`: create a volume in the embedded default of --dir (detached).
import { formatBytes } from '../util/size.js';
import { UsageError, parseCommandArgs, parseReplicasOption, parseSizeOption, printJson, type CliContext } from './common.js';
import { EMBEDDED_HELP, EMBEDDED_OPTIONS, closeEmbedded, openEmbedded, pickVolume, type Embedded } from './embedded.js';

/** Help text of `mooring create`. */
export const CREATE_HELP = `Usage: mooring create --dir DIR --size SIZE [--volume NAME] [--replicas N] [--host ADDRESS ...] [--json]

Create a volume with N empty replicas, one per host, and leave it
detached: mooring serve serves it.

Options:
${EMBEDDED_HELP}
  --size SIZE          size: bytes, or K, M, G, T (KiB, MiB, GiB, TiB; binary); a multiple of 4 KiB
  --replicas N         1..16 (default: 3, or one per host when fewer hosts are given)
  --json               print the new volume's status as JSON
  -h, --help           show this help
`;

/** Runs `mooring create`. */
export async function runCreate(argv: string[], ctx: CliContext): Promise<number> {
  const { values } = parseCommandArgs(
    'create',
    argv,
    { ...EMBEDDED_OPTIONS, size: { type: 'string' }, replicas: { type: 'string' }, json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(CREATE_HELP);
    return 0;
  }
  if (values.size === undefined) throw new UsageError('create', '--size SIZE is required');
  const sizeBytes = parseSizeOption('create', values.size);
  const replicas = values.replicas === undefined ? undefined : parseReplicasOption('create', values.replicas);
  let embedded: Embedded | null = null;
  try {
    embedded = await openEmbedded('create', values, ctx, { repairIntervalMs: 0 });
    const m = embedded.mooring;
    const { name } = await pickVolume('create', m, embedded.dir, values.volume, true);
    const volume = await m.createVolume({ name, sizeBytes, ...(replicas !== undefined ? { replicas } : {}) });
    const status = await volume.status();
    if (values.json) printJson(ctx, status);
    else {
      const hosts = [...new Set(status.replicas.map((r) => r.hostId))].join(', ');
      ctx.stdout(`created volume ${volume.name} in ${embedded.dir}: ${formatBytes(sizeBytes)}, ${status.replicaCount} replica${status.replicaCount === 1 ? '' : 's'} (${hosts})\n`);
    }
  } finally {
    await closeEmbedded(embedded, ctx);
  }
  return 0;
}
