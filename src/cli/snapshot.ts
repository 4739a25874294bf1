// `mooring snapshot create|list|delete|revert|export|clone`.
import { resolve } from 'node:path';

import { formatBytes } from '../util/size.js';
import { logOf, logSettingsOf } from './log.js';
import { ProgressReporter, withCopyProgress } from './progress.js';
import { UsageError, isoTime, parseCommandArgs, parseNameOption, parseReplicasOption, printJson, type CliContext } from './common.js';
import { EMBEDDED_HELP, EMBEDDED_OPTIONS, closeEmbedded, openEmbedded, pickVolume, type Embedded } from './embedded.js';

/** Help text of `mooring snapshot`. */
export const SNAPSHOT_HELP = `Usage: mooring snapshot create --dir DIR [--volume V] NAME [--label KEY=VALUE ...] [--json]
       mooring snapshot list   --dir DIR [--volume V] [--json]
       mooring snapshot delete --dir DIR [--volume V] NAME
       mooring snapshot revert --dir DIR [--volume V] NAME
       mooring snapshot export --dir DIR [--volume V] NAME --to FILE [--json]
       mooring snapshot clone  --dir DIR [--volume V] NAME --into NEW [--replicas N] [--json]

Manage the snapshots of a volume while no process has DIR open (they are refused with
BUSY while mooring serve runs there). The volume attaches itself on one of its hosts,
without NBD export, for the command, and detaches again.

  create   take a snapshot NAME ([A-Za-z0-9._-]{1,63}); O(1), no data copied
  list     list snapshots, oldest first
  delete   delete snapshot NAME; its data merges into its child, its space is reclaimed
  revert   make the volume's content that of snapshot NAME
  export   write the volume as of snapshot NAME into a new sparse raw FILE (progress
           lines on stderr; --no-progress silences them)
  clone    create volume NEW with the content of snapshot NAME (same size and backing
           image; progress lines on stderr as for export); NEW stays detached

Options:
${EMBEDDED_HELP}
  --label KEY=VALUE    label stored with a new snapshot (repeatable, at most 64)
  --to FILE            export: the raw file to write (must not exist; its directory must)
  --into NEW           clone: the new volume's name
  --replicas N         clone: its replicas, 1..16, one per host (default: 3, or one per
                       host when fewer hosts are given)
  --json               machine-readable output
  -h, --help           show this help
`;

const SUBCOMMANDS = ['create', 'list', 'delete', 'revert', 'export', 'clone'] as const;
type Subcommand = (typeof SUBCOMMANDS)[number];

function parseLabels(items: string[] | undefined): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const item of items ?? []) {
    const eq = item.indexOf('=');
    if (eq <= 0) throw new UsageError('snapshot', `--label must be KEY=VALUE (got ${JSON.stringify(item)})`);
    const key = item.slice(0, eq);
    if (key in labels) throw new UsageError('snapshot', `label ${key} given twice`);
    labels[key] = item.slice(eq + 1);
  }
  return labels;
}

/** A progress reporter for `task`, or null with --no-progress. */
function reporter(ctx: CliContext, task: string, fields: Record<string, unknown>): ProgressReporter | null {
  const settings = logSettingsOf(ctx);
  return settings.progress ? new ProgressReporter(logOf(ctx), task, { fields, intervalMs: settings.progressIntervalMs }) : null;
}

/** Runs `mooring snapshot ...`. */
export async function runSnapshot(argv: string[], ctx: CliContext): Promise<number> {
  const sub = argv[0];
  if (sub === undefined) {
    // A usage error: the help goes where errors go.
    ctx.stderr(SNAPSHOT_HELP);
    return 2;
  }
  if (sub === '--help' || sub === '-h' || sub === 'help') {
    ctx.stdout(SNAPSHOT_HELP);
    return 0;
  }
  if (!(SUBCOMMANDS as readonly string[]).includes(sub)) {
    throw new UsageError('snapshot', `unknown snapshot command ${JSON.stringify(sub)} (expected ${SUBCOMMANDS.join(', ')})`);
  }
  const command = sub as Subcommand;
  const needsName = command !== 'list';
  const { values, positionals } = parseCommandArgs(
    'snapshot',
    argv.slice(1),
    {
      ...EMBEDDED_OPTIONS,
      label: { type: 'string', multiple: true },
      to: { type: 'string' },
      into: { type: 'string' },
      replicas: { type: 'string' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    { min: 0, max: needsName ? 1 : 0 },
  );
  if (values.help) {
    ctx.stdout(SNAPSHOT_HELP);
    return 0;
  }
  const name = positionals[0];
  if (needsName && name === undefined) throw new UsageError('snapshot', `snapshot ${command} needs a snapshot NAME`);
  if (command !== 'create' && values.label !== undefined) throw new UsageError('snapshot', `--label only applies to snapshot create`);
  const labels = parseLabels(values.label);
  if (command === 'export' && (values.to === undefined || values.to === '')) throw new UsageError('snapshot', 'snapshot export needs --to FILE');
  if (command !== 'export' && values.to !== undefined) throw new UsageError('snapshot', '--to only applies to snapshot export');
  if (command === 'clone' && (values.into === undefined || values.into === '')) throw new UsageError('snapshot', 'snapshot clone needs --into NEW');
  if (command !== 'clone' && values.into !== undefined) throw new UsageError('snapshot', '--into only applies to snapshot clone');
  if (command !== 'clone' && values.replicas !== undefined) throw new UsageError('snapshot', '--replicas only applies to snapshot clone');
  if (values.into !== undefined) parseNameOption('snapshot', '--into', values.into);
  const replicas = values.replicas === undefined ? undefined : parseReplicasOption('snapshot', values.replicas);

  let embedded: Embedded | null = null;
  try {
    embedded = await openEmbedded('snapshot', values, ctx, { repairIntervalMs: 0 });
    const volume = embedded.mooring.volume((await pickVolume('snapshot', embedded.mooring, embedded.dir, values.volume)).name);
    switch (command) {
      case 'create': {
        const snap = await volume.createSnapshot(name!, { labels });
        if (values.json) printJson(ctx, snap);
        else ctx.stdout(`created snapshot ${snap.name} of ${volume.name}\n`);
        break;
      }
      case 'list': {
        const snaps = await volume.listSnapshots();
        if (values.json) printJson(ctx, snaps);
        else if (snaps.length === 0) ctx.stdout('no snapshots\n');
        else {
          const rows = snaps.map(
            (s) =>
              `${s.name.padEnd(20)} ${isoTime(s.createdMs)}  ${formatBytes(s.allocatedBytes).padEnd(10)} ${(s.parent ?? '-').padEnd(20)}` +
              ` ${Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(' ')}`,
          );
          ctx.stdout(`${'NAME'.padEnd(20)} ${'CREATED'.padEnd(24)}  ${'ALLOCATED'.padEnd(10)} ${'PARENT'.padEnd(20)} LABELS\n${rows.map((r) => r.trimEnd()).join('\n')}\n`);
        }
        break;
      }
      case 'delete':
        await volume.deleteSnapshot(name!);
        if (values.json) printJson(ctx, { deleted: name });
        else ctx.stdout(`deleted snapshot ${name}\n`);
        break;
      case 'revert':
        await volume.revertToSnapshot(name!);
        if (values.json) printJson(ctx, { reverted: name });
        else ctx.stdout(`reverted ${volume.name} to snapshot ${name}\n`);
        break;
      case 'export': {
        const path = resolve(ctx.cwd ?? process.cwd(), values.to!);
        // Progress counts the snapshot's allocated bytes read (totalBytes: all of them).
        const progress = reporter(ctx, `export of snapshot ${name} of ${volume.name}`, { volume: volume.name, snapshot: name });
        const r = await withCopyProgress(embedded.mooring, volume.name, name!, progress, () => volume.exportSnapshot(name!, { path }));
        if (values.json) printJson(ctx, { exported: name, path, ...r });
        else ctx.stdout(`exported snapshot ${name} of ${volume.name} to ${path} (${formatBytes(r.sizeBytes)}, ${formatBytes(r.copiedBytes)} of data)\n`);
        break;
      }
      case 'clone': {
        const into = values.into!;
        const progress = reporter(ctx, `clone of snapshot ${name} of ${volume.name} into ${into}`, { volume: volume.name, snapshot: name, into });
        const r = await withCopyProgress(embedded.mooring, volume.name, name!, progress, () =>
          volume.clone({ name: into, snapshot: name!, ...(replicas !== undefined ? { replicas } : {}) }),
        );
        const status = await r.volume.status();
        if (values.json) printJson(ctx, { cloned: name, from: volume.name, volume: into, sizeBytes: status.sizeBytes, replicaCount: status.replicaCount, copiedBytes: r.copiedBytes });
        else ctx.stdout(`cloned snapshot ${name} of ${volume.name} into volume ${into} (${formatBytes(status.sizeBytes)}, ${status.replicaCount} replica${status.replicaCount === 1 ? '' : 's'}, ${formatBytes(r.copiedBytes)} of data)\n`);
        break;
      }
    }
  } finally {
    await closeEmbedded(embedded, ctx);
  }
  return 0;
}
