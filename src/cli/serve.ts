// `mooring serve`: create or open a volume, export it over NBD until SIGINT/SIGTERM.
import { join, resolve } from 'node:path';

import { MooringError, toMooringError } from '../errors.js';
import { VOLUME_SPEC_FILE } from '../volume/volume-spec.js';
import { DEFAULT_REPLICA_COUNT, DEFAULT_SOCKET_FILE, DirectoryVolume } from '../volume/directory-volume.js';
import { directoryState, pathExists } from '../util/files.js';
import { formatBytes } from '../util/size.js';
import {
  UsageError,
  addonOf,
  parseCommandArgs,
  parseReplicasOption,
  parseSizeOption,
  installStopSignals,
  requireDir,
  type CliContext,
} from './common.js';
import { STATUS_SOCKET_FILE, serveStatus, type StatusServer } from './status-socket.js';

/** The JSON that follows `READY ` on serve's stdout (the CLI contract). */
export interface ReadyInfo {
  /** NBD URI for clients: `nbd+unix:///?socket=PATH` or `nbd://127.0.0.1:PORT/`. */
  uri: string;
  /** The address in `--nbd` form, with the bound port for TCP. */
  nbd: string;
  /** Volume size in bytes. */
  sizeBytes: number;
  /** Number of replicas. */
  replicas: number;
  /** The writer epoch this server claimed (allocated from the volume's counter in volume.json). */
  epoch: number;
}

/** Help text of `mooring serve`. */
export const SERVE_HELP = `Usage: mooring serve --dir DIR [--size SIZE] [--replicas N] [--nbd ADDRESS] [--export-name NAME]

Serve the volume in DIR over NBD until SIGINT or SIGTERM. When DIR is missing or empty
the volume is created first (--size is then required); otherwise the existing volume is
opened, and a given --size or --replicas must match it.

Options:
  --dir DIR            volume directory (required)
  --size SIZE          volume size: bytes, or K, M, G, T (KiB, MiB, GiB, TiB; binary)
  --replicas N         replicas when creating, 1..16 (default ${DEFAULT_REPLICA_COUNT})
  --nbd ADDRESS        unix:PATH or tcp:HOST:PORT (port 0 = ephemeral)
                       (default unix:DIR/${DEFAULT_SOCKET_FILE})
  --export-name NAME   NBD export name (default: the default export '')
  -h, --help           show this help

Once serving, one line is printed to stdout:
  READY {"uri":"nbd+unix:///?socket=/abs/nbd.sock","nbd":"unix:/abs/nbd.sock","sizeBytes":N,"replicas":N,"epoch":N}
Logs go to stderr. While serving, DIR/${STATUS_SOCKET_FILE} answers mooring info. SIGINT/SIGTERM
stop the export (drain, flush), close the volume and exit 0; a second signal exits 1 at once.
`;

/** Runs `mooring serve`; resolves to the exit status once the server has stopped. */
export async function runServe(argv: string[], ctx: CliContext): Promise<number> {
  const { values } = parseCommandArgs(
    'serve',
    argv,
    {
      dir: { type: 'string' },
      size: { type: 'string' },
      replicas: { type: 'string' },
      nbd: { type: 'string' },
      'export-name': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(SERVE_HELP);
    return 0;
  }
  const dir = resolve(ctx.cwd ?? process.cwd(), requireDir('serve', values.dir));
  const sizeBytes = values.size === undefined ? undefined : parseSizeOption('serve', values.size);
  const replicas = values.replicas === undefined ? undefined : parseReplicasOption('serve', values.replicas);
  const nbd = values.nbd ?? `unix:${join(dir, DEFAULT_SOCKET_FILE)}`;
  const addon = addonOf(ctx);
  if (values.nbd !== undefined && !/^(unix|tcp):/.test(values.nbd)) {
    throw new UsageError('serve', `--nbd must be unix:PATH or tcp:HOST:PORT (got ${JSON.stringify(values.nbd)})`);
  }

  const stop = installStopSignals(ctx, 'the drain');
  let volume: DirectoryVolume | undefined;
  let status: StatusServer | null = null;
  try {
    const state = await directoryState(dir);
    if (state === 'missing' || state === 'empty') {
      if (sizeBytes === undefined) throw new UsageError('serve', `${dir} holds no volume yet: --size is required to create one`);
      ctx.stderr(`mooring: creating volume in ${dir} (${formatBytes(sizeBytes)}, ${replicas ?? DEFAULT_REPLICA_COUNT} replicas)\n`);
      volume = await DirectoryVolume.create({ dir, sizeBytes, replicas: replicas ?? DEFAULT_REPLICA_COUNT, addon });
    } else {
      if (!(await pathExists(join(dir, VOLUME_SPEC_FILE)))) {
        throw new MooringError('NOT_FOUND', `${dir} is not empty and holds no ${VOLUME_SPEC_FILE}; use an empty directory to create a volume`);
      }
      volume = await DirectoryVolume.open(dir, { addon });
      if (sizeBytes !== undefined && sizeBytes !== volume.sizeBytes) {
        throw new MooringError('INVALID_ARGUMENT', `--size ${sizeBytes} does not match the volume's ${volume.sizeBytes} bytes (${dir}); resizing is not supported`);
      }
      if (replicas !== undefined && replicas !== volume.replicaCount) {
        throw new MooringError('INVALID_ARGUMENT', `--replicas ${replicas} does not match the volume's ${volume.replicaCount} replicas (${dir})`);
      }
    }
    const v = volume;
    v.on('replica-error', (e) => ctx.stderr(`mooring: replica ${e.replicaId} failed (${e.code}, errno ${e.errno}): ${e.message}; serving from the others\n`));
    v.on('epoch-claimed', (e) => ctx.stderr(`mooring: writer epoch ${e.epoch} claimed\n`));
    v.on('replica-set-changed', (e) => ctx.stderr(`mooring: replica set ${e.epoch}/${e.generation} committed (RW: ${e.rwReplicaIds.join(', ') || 'none'})\n`));
    v.on('reconciled', (e) => ctx.stderr(`mooring: reconciled replicas after an unclean stop (${e.bytes} bytes copied): ${e.message}\n`));
    v.on('warning', (e) => ctx.stderr(`mooring: warning: ${e.code}: ${e.message}\n`));
    for (const e of v.engine?.openEvents ?? []) {
      if (e.type === 'reconciled') ctx.stderr(`mooring: reconciled replicas after an unclean stop (${e.bytes} bytes copied): ${e.message}\n`);
      if (e.type === 'replica-error') ctx.stderr(`mooring: replica ${e.replicaId} is out of date or failed (${e.message}); serving from the others\n`);
    }

    if (stop.pending) {
      ctx.stderr(`mooring: ${stop.pending} before serving started: closing the volume\n`);
      await v.close();
      return 0;
    }
    const exp = await v.export({ nbd, ...(values['export-name'] !== undefined ? { exportName: values['export-name'] } : {}) });
    // `mooring info` asks here while this process serves (opening the volume would fence it).
    status = await serveStatus(join(dir, STATUS_SOCKET_FILE), async () => ({ ...(await v.status()), lastEpoch: v.epoch, replicaCount: v.replicaCount, snapshots: await v.listSnapshots() })).catch((err: unknown) => {
      ctx.stderr(`mooring: warning: no status socket (mooring info cannot ask this process): ${toMooringError(err).message}\n`);
      return null;
    });
    const ready: ReadyInfo = { uri: exp.uri, nbd: exp.addressString, sizeBytes: v.sizeBytes, replicas: v.replicaCount, epoch: v.epoch };
    ctx.stdout(`READY ${JSON.stringify(ready)}\n`);
    ctx.stderr(`mooring: serving ${v.name} (${formatBytes(v.sizeBytes)}, ${v.replicaCount} replicas, epoch ${ready.epoch}) at ${exp.uri}\n`);

    const signal = await stop.wait();
    ctx.stderr(`mooring: ${signal}: stopping the export (drain, flush) and closing the volume\n`);
    const stats = exp.closed ? undefined : exp.stats();
    await status?.close();
    await v.close();
    ctx.stderr(
      `mooring: stopped${stats ? ` after ${stats.connectionsTotal} connections, ${stats.requests} requests` : ''}\n`,
    );
    return 0;
  } finally {
    await status?.close();
    if (volume && volume.state !== 'closed') await volume.close().catch(() => undefined);
    stop.dispose();
  }
}
