// `mooring create`: create a volume directory and close it again.
import { resolve } from 'node:path';

import { DEFAULT_REPLICA_COUNT, DirectoryVolume } from '../volume/directory-volume.js';
import { formatBytes } from '../util/size.js';
import { UsageError, parseCommandArgs, parseReplicasOption, parseSizeOption, printJson, requireDir, addonOf, type CliContext } from './common.js';

/** Help text of `mooring create`. */
export const CREATE_HELP = `Usage: mooring create --dir DIR --size SIZE [--replicas N] [--name NAME] [--json]

Create a volume in DIR (missing or empty) with N empty replicas.

Options:
  --dir DIR        volume directory (required)
  --size SIZE      size: bytes, or K, M, G, T (KiB, MiB, GiB, TiB; binary); a multiple of 4 KiB
  --replicas N     1..16 (default ${DEFAULT_REPLICA_COUNT})
  --name NAME      volume name, [A-Za-z0-9._-]{1,63} (default: the directory's name)
  --json           print the new volume's status as JSON
  -h, --help       show this help
`;

/** Runs `mooring create`. */
export async function runCreate(argv: string[], ctx: CliContext): Promise<number> {
  const { values } = parseCommandArgs(
    'create',
    argv,
    {
      dir: { type: 'string' },
      size: { type: 'string' },
      replicas: { type: 'string' },
      name: { type: 'string' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(CREATE_HELP);
    return 0;
  }
  const dir = resolve(ctx.cwd ?? process.cwd(), requireDir('create', values.dir));
  if (values.size === undefined) throw new UsageError('create', '--size SIZE is required');
  const sizeBytes = parseSizeOption('create', values.size);
  const replicas = values.replicas === undefined ? DEFAULT_REPLICA_COUNT : parseReplicasOption('create', values.replicas);
  const volume = await DirectoryVolume.create({
    dir,
    sizeBytes,
    replicas,
    ...(values.name !== undefined ? { name: values.name } : {}),
    addon: addonOf(ctx),
  });
  try {
    const status = await volume.status();
    if (values.json) printJson(ctx, status);
    else ctx.stdout(`created volume ${volume.name} in ${dir}: ${formatBytes(sizeBytes)}, ${replicas} replica${replicas === 1 ? '' : 's'}\n`);
  } finally {
    await volume.close();
  }
  return 0;
}
