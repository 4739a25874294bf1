// `mooring serve`: the embedded default in --dir serves one volume over NBD from this host
// until SIGINT/SIGTERM (created first when the store has none of that name).
import { join } from 'node:path';

import { MooringError, toMooringError } from '../errors.js';
import { formatBytes } from '../util/size.js';
import type { Volume } from '../volume/volume.js';
import {
  TLS_OPTIONS,
  UsageError,
  installStopSignals,
  parseCommandArgs,
  parseGroupOption,
  parseReplicasOption,
  parseSizeOption,
  readTlsOptions,
  type CliContext,
} from './common.js';
import { libraryLoggerOf, logOf, logSettingsOf } from './log.js';
import { rebuildProgress } from './progress.js';
import { METRICS_OPTIONS, closeMetricsServer, metricsHelp, parseMetricsOption, startMetricsServer } from './metrics-option.js';
import { MooringMetrics } from '../metrics/mooring-metrics.js';
import type { MetricsServer } from '../metrics/metrics-server.js';
import { EMBEDDED_HELP, EMBEDDED_OPTIONS, closeEmbedded, openEmbedded, pickVolume, type Embedded } from './embedded.js';
import { STATUS_SOCKET_FILE, serveStatus, type StatusServer } from './status-socket.js';
import { liveReport } from './volume-report.js';

/** Where serve exports by default, under --dir. */
export const DEFAULT_SOCKET_FILE = 'nbd.sock';

/** The JSON that follows `READY ` on serve's stdout (the CLI contract). */
export interface ReadyInfo {
  /** NBD URI for clients: `nbd+unix:///?socket=PATH` or `nbd://127.0.0.1:PORT`. */
  uri: string;
  /** The address in `--nbd` form, with the bound port for TCP. */
  nbd: string;
  /** The volume served. */
  volume: string;
  /** This host's id (where the engine runs). */
  hostId: string;
  /** Volume size in bytes. */
  sizeBytes: number;
  /** Number of replicas. */
  replicas: number;
  /** The writer epoch of the engine serving it (handed out by the store's counter for the volume). */
  epoch: number;
  /** With --metrics: where GET /metrics is served (`tcp:HOST:PORT`, the bound port). */
  metrics?: string;
}

/** Help text of `mooring serve`. */
export const SERVE_HELP = `Usage: mooring serve --dir DIR [--volume NAME] [--size SIZE] [--replicas N] [--host ADDRESS ...] [--nbd ADDRESS] [--socket-group GROUP]
                     [--tls-cert F --tls-key F --tls-ca F] [--metrics tcp:HOST:PORT]

Serve a volume over NBD from this host until SIGINT or SIGTERM. When DIR holds no volume
of that name it is created first (--size is then required); otherwise the existing one is
served, and a given --size or --replicas must match it. Its engine runs in this process;
its replicas are on this host and on the hosts given with --host.

Options:
${EMBEDDED_HELP}
  --size SIZE          size of a new volume: bytes, or K, M, G, T (KiB, MiB, GiB, TiB; binary)
  --replicas N         replicas of a new volume, 1..16, one per host (default: 3, or one
                       per host when fewer hosts are given)
  --nbd ADDRESS        unix:PATH or tcp:HOST:PORT (port 0 = ephemeral)
                       (default unix:DIR/${DEFAULT_SOCKET_FILE}). Without TLS a TCP address
                       must be loopback unless --allow-insecure-remote is given
  --tls-cert FILE      mutual TLS (PEM): a TCP export requires NBD STARTTLS and a client
  --tls-key FILE       certificate signed by the CA (QEMU: a tls-creds-x509 object;
  --tls-ca FILE        nbdinfo: nbds://HOST:PORT/?tls-certificates=DIR); --host data
                       engines on TCP and the replica protocol use it too
  --allow-insecure-remote  serve NBD on a non-loopback TCP address without TLS,
                       unauthenticated and unencrypted (anyone who reaches it reads and
                       writes the disk)
  --socket-group GROUP give the unix socket to GROUP (name or gid), mode 0660, for a QEMU
                       running as another user; without it the socket is 0600
${metricsHelp(23)}  -h, --help           show this help

Once serving, one line is printed to stdout:
  READY {"uri":"nbd+unix:///?socket=/abs/nbd.sock","nbd":"unix:/abs/nbd.sock","volume":"v","hostId":"h","sizeBytes":N,"replicas":N,"epoch":N}
("metrics":"tcp:HOST:PORT" follows with --metrics.)
Logs go to stderr (--log-format, --log-level: see mooring --help). While serving, DIR/${STATUS_SOCKET_FILE} answers mooring info. SIGINT/SIGTERM
stop the export (drain, flush), detach the volume and exit 0; a second signal exits 1 at once.
After a crash the next serve of DIR attaches the volume again with a newer writer epoch.
`;

/** Runs `mooring serve`; resolves to the exit status once the server has stopped. */
export async function runServe(argv: string[], ctx: CliContext): Promise<number> {
  const { values } = parseCommandArgs(
    'serve',
    argv,
    {
      ...EMBEDDED_OPTIONS,
      size: { type: 'string' },
      replicas: { type: 'string' },
      nbd: { type: 'string' },
      'allow-insecure-remote': { type: 'boolean' },
      'socket-group': { type: 'string' },
      ...TLS_OPTIONS,
      ...METRICS_OPTIONS,
      help: { type: 'boolean', short: 'h' },
    },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(SERVE_HELP);
    return 0;
  }
  const sizeBytes = values.size === undefined ? undefined : parseSizeOption('serve', values.size);
  const replicas = values.replicas === undefined ? undefined : parseReplicasOption('serve', values.replicas);
  if (values.nbd !== undefined && !/^(unix|tcp):/.test(values.nbd)) {
    throw new UsageError('serve', `--nbd must be unix:PATH or tcp:HOST:PORT (got ${JSON.stringify(values.nbd)})`);
  }

  const metricsAddress = parseMetricsOption('serve', values);
  const nbdSocketGroup = values['socket-group'] === undefined ? undefined : await parseGroupOption('serve', values['socket-group']);

  const log = logOf(ctx);
  const stop = installStopSignals(ctx, 'the drain');
  let embedded: Embedded | null = null;
  let status: StatusServer | null = null;
  let metrics: MooringMetrics | null = null;
  let metricsServer: MetricsServer | null = null;
  try {
    const tls = await readTlsOptions('serve', values, ctx.cwd ?? process.cwd());
    embedded = await openEmbedded('serve', values, ctx, {
      logger: libraryLoggerOf(ctx, false),
      dataEngine: {
        ...(values['allow-insecure-remote'] === true ? { allowInsecureRemote: true } : {}),
        ...(nbdSocketGroup !== undefined ? { nbdSocketGroup } : {}),
        ...(tls !== undefined ? { tls } : {}),
      },
    });
    const { mooring: m, dir } = embedded;
    const hostId = m.hostId!;
    const picked = await pickVolume('serve', m, dir, values.volume, true);
    let v: Volume;
    if (!picked.exists) {
      if (sizeBytes === undefined) throw new UsageError('serve', `${dir} holds no volume ${picked.name} yet: --size is required to create one`);
      // The library logs "volume NAME created (SIZE, N replicas on HOSTS)".
      v = await m.createVolume({ name: picked.name, sizeBytes, ...(replicas !== undefined ? { replicas } : {}) });
    } else {
      v = m.volume(picked.name);
      const st = await v.status();
      if (sizeBytes !== undefined && sizeBytes !== st.sizeBytes) {
        throw new MooringError('INVALID_ARGUMENT', `--size ${sizeBytes} does not match the ${st.sizeBytes} bytes of volume ${v.name} (grow it with Volume.resize)`);
      }
      if (replicas !== undefined && replicas !== st.replicaCount) {
        throw new MooringError('INVALID_ARGUMENT', `--replicas ${replicas} does not match the ${st.replicaCount} replicas of volume ${v.name}`);
      }
    }
    // Data-engine events (replica errors, epochs, rebuilds) are logged by the library;
    // rebuilds of this volume also as progress lines.
    const settings = logSettingsOf(ctx);
    if (settings.progress) {
      const rebuilds = rebuildProgress(log, settings.progressIntervalMs);
      m.on('data-engine-event', (host, e) => {
        if (e.type !== 'backing-image-file' && e.volume === v.name) rebuilds(host, e);
      });
    }
    if (stop.pending) {
      log.info({ signal: stop.pending }, `${stop.pending} before serving started: closing`);
      return 0;
    }
    const st = await v.attach({ nbd: values.nbd ?? `unix:${join(dir, DEFAULT_SOCKET_FILE)}` });
    if (!st.nbd) throw new MooringError('UNAVAILABLE', `volume ${v.name} attached on ${hostId} without its NBD export`);
    // `mooring info` asks here while this process serves (the store is locked meanwhile).
    status = await serveStatus(join(dir, STATUS_SOCKET_FILE), () => liveReport(m, v, dir)).catch((err: unknown) => {
      const e = toMooringError(err);
      log.warn({ code: e.code }, `no status socket (mooring info cannot ask this process): ${e.message}`);
      return null;
    });
    if (metricsAddress) {
      metrics = new MooringMetrics(m);
      metricsServer = await startMetricsServer(metrics.registry, metricsAddress, ctx);
    }
    const ready: ReadyInfo = { uri: st.nbd.uri, nbd: st.nbd.address, volume: v.name, hostId, sizeBytes: st.sizeBytes, replicas: st.replicaCount, epoch: st.epoch, ...(metricsServer ? { metrics: metricsServer.address } : {}) };
    ctx.stdout(`READY ${JSON.stringify(ready)}\n`);
    log.info(
      { volume: v.name, hostId, sizeBytes: st.sizeBytes, replicas: st.replicaCount, state: st.state, epoch: st.epoch, nbd: st.nbd.uri },
      `serving ${v.name} (${formatBytes(st.sizeBytes)}, ${st.replicaCount} replicas, ${st.state}, writer epoch ${st.epoch}) at ${st.nbd.uri}`,
    );

    const signal = await stop.wait();
    log.info({ signal, volume: v.name }, `${signal}: stopping the export (drain, flush) and detaching ${v.name}`);
    const stats = (await v.engine().catch(() => null))?.nbdStats;
    await status?.close();
    await closeMetricsServer(metricsServer, ctx);
    metricsServer = null;
    await v.detach({ host: hostId });
    log.info({ volume: v.name, ...(stats ? { connections: stats.connectionsTotal, requests: stats.requests } : {}) }, `stopped${stats ? ` after ${stats.connectionsTotal} connections, ${stats.requests} requests` : ''}`);
    return 0;
  } finally {
    await status?.close();
    await closeMetricsServer(metricsServer, ctx);
    metrics?.close();
    await closeEmbedded(embedded, ctx);
    stop.dispose();
  }
}
