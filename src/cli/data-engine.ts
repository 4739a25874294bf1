// `mooring data-engine`: run this host's data engine as its own process, serving it over
// gRPC until SIGINT/SIGTERM, so a VM manager can restart without cutting its VMs off
// their disks.
import { join, resolve } from 'node:path';

import { DataEngineGrpcServer } from '../data-engine/grpc/data-engine-grpc-server.js';
import { DATA_ENGINE_DEFAULTS, DATA_ENGINE_FILE, DATA_ENGINE_LIMITS, LocalDataEngine } from '../data-engine/local-data-engine.js';
import { pathExists } from '../util/files.js';
import { handOffToSuccessor, takeOverFromPredecessor, type HandOffEpochs, type HandOffProcessResult } from '../data-engine/process-handoff.js';
import { readClusterSecretFile } from '../data-engine/cluster-secret.js';
import { MooringError, toMooringError } from '../errors.js';
import { logDataEngineEvent } from '../util/logger.js';
import { logOf, logSettingsOf } from './log.js';
import { rebuildProgress } from './progress.js';
import { checkSuccessorArgv, spawnSuccessor } from './successor.js';
import {
  TLS_OPTIONS,
  UsageError,
  addonOf,
  installStopSignals,
  parseBytesOption,
  parseCommandArgs,
  parseGroupOption,
  readTlsOptions,
  requireDir,
  type CliContext,
} from './common.js';
import { NBD_LIMITS } from '../nbd/nbd-export.js';
import { DataEngineMetrics } from '../metrics/data-engine-metrics.js';
import type { MetricsServer } from '../metrics/metrics-server.js';
import { METRICS_OPTIONS, closeMetricsServer, metricsHelp, parseMetricsOption, startMetricsServer } from './metrics-option.js';

/** The JSON that follows `READY ` on the data engine's stdout (the CLI contract). */
export interface DataEngineReadyInfo {
  /** Host id. */
  hostId: string;
  /** Where the gRPC server listens (`unix:PATH` or `tcp:HOST:PORT` with the bound port). */
  grpc: string;
  /** Replica server address (`tcp:HOST:PORT`, bound port), or null when it serves none. */
  replicaAddress: string | null;
  /** Whether mutual TLS is on: gRPC on TCP, the replica protocol, NBD exports on TCP. */
  tls: boolean;
  /** Package version. */
  version: string;
  /** With --metrics: where GET /metrics is served (`tcp:HOST:PORT`, the bound port). */
  metrics?: string;
}

/** Help text of `mooring data-engine`. */
export const DATA_ENGINE_HELP = `Usage: mooring data-engine --dir DIR --host-id ID --listen ADDRESS [options]

Run this host's data engine (its replicas and engines) as its own process, serving it over
gRPC until SIGINT or SIGTERM. Reach it with RemoteDataEngine.connect({ address }).

Options:
  --dir DIR                     directory the data engine owns (created if missing)
  --host-id ID                  this host's id, as other hosts name it ([A-Za-z0-9._-]{1,63})
  --listen ADDRESS              gRPC address: unix:PATH or tcp:HOST:PORT (port 0 = any)
  --replica-listen ADDRESS      replica server: tcp:HOST:PORT, or none
                                (default ${DATA_ENGINE_DEFAULTS.replicaListen})
  --tls-cert FILE               mutual TLS for gRPC, the replica protocol and NBD exports
  --tls-key FILE                on TCP: this host's certificate, its key, and the CA peers
  --tls-ca FILE                 and NBD clients must chain to (all three, PEM); gRPC on a
                                unix socket takes none (its file mode guards it)
  --allow-insecure-remote       allow non-loopback TCP addresses without TLS
  --cluster-secret-file FILE    the cluster's secret (16 to 1024 bytes, mode 0600): gRPC
                                callers and replica-protocol peers must prove it, and
                                this data engine proves it to the replica servers it
                                reaches (every data engine of the cluster has the same)
  --insecure                    run without a cluster secret and without TLS: any local
                                process may then call the gRPC API on TCP and use the
                                replica port (for clusters with data engines of a release
                                before authentication)
  --max-concurrent-rebuilds N   rebuilds at once, 1..${DATA_ENGINE_LIMITS.maxConcurrentRebuildsMax} (default ${DATA_ENGINE_DEFAULTS.maxConcurrentRebuilds})
  --hand-over-hold-ms MS        how long an export that handed its volume over holds what
                                its clients send, for a rollback (default ${DATA_ENGINE_DEFAULTS.handOverHoldMs};
                                0: refuse it at once)
  --replica-buffer-bytes SIZE   request and reply bytes the replica server holds at once
                                across its connections (default 256M); past it a peer's
                                requests wait
  --nbd-buffer-bytes SIZE       the same for each NBD export (default 128M, at least 32M)
  --socket-group GROUP          give the NBD sockets of this host's exports to GROUP (name
                                or gid), mode 0660, for a QEMU running as another user;
                                without it they are 0600
  --allow-successor-exec PREFIX let a gRPC caller replace this process by a program under
                                PREFIX (an upgrade): it stops as on SIGTERM and starts
                                PROGRAM data-engine <these arguments>, detached, or hands
                                its engines, NBD clients connected, to it (in place)
  --take-over SOCK              (started by the above) take the engines over from the
                                process listening on the hand-off socket SOCK
${metricsHelp(32)}  -h, --help                    show this help

Without TLS, TCP addresses must be loopback unless --allow-insecure-remote is given.
Without TLS and without --cluster-secret-file, a gRPC TCP listener is refused unless
--insecure is given (or the process takes over with --take-over), and so is a replica
server in a new directory; in a directory an earlier run made, the replica server starts
with a warning on stderr (--insecure silences it).
Once serving, one line is printed to stdout:
  READY {"hostId":"h1","grpc":"unix:/run/de.sock","replicaAddress":"tcp:127.0.0.1:PORT","tls":false,"version":"..."}
("metrics":"tcp:HOST:PORT" follows with --metrics. An upgrade's successor is given the same
--metrics: this process closes its endpoint before starting it.)
Logs (engine events) go to stderr (--log-format, --log-level: see mooring --help). SIGINT/SIGTERM stop the gRPC server, stop every engine
(NBD exports drain, replicas flush and are marked clean) and exit 0; a second signal
exits 1 at once.
`;


/** Runs `mooring data-engine`; resolves to the exit status once it has stopped. */
export async function runDataEngine(argv: string[], ctx: CliContext): Promise<number> {
  const { values } = parseCommandArgs(
    'data-engine',
    argv,
    {
      dir: { type: 'string' },
      'host-id': { type: 'string' },
      listen: { type: 'string' },
      'replica-listen': { type: 'string' },
      ...TLS_OPTIONS,
      'allow-insecure-remote': { type: 'boolean' },
      'cluster-secret-file': { type: 'string' },
      insecure: { type: 'boolean' },
      'max-concurrent-rebuilds': { type: 'string' },
      'hand-over-hold-ms': { type: 'string' },
      'socket-group': { type: 'string' },
      'replica-buffer-bytes': { type: 'string' },
      'nbd-buffer-bytes': { type: 'string' },
      'allow-successor-exec': { type: 'string' },
      'take-over': { type: 'string' },
      ...METRICS_OPTIONS,
      help: { type: 'boolean', short: 'h' },
    },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(DATA_ENGINE_HELP);
    return 0;
  }
  const log = logOf(ctx);
  const settings = logSettingsOf(ctx);
  const cwd = ctx.cwd ?? process.cwd();
  const dir = resolve(cwd, requireDir('data-engine', values.dir));
  const hostId = values['host-id'];
  if (hostId === undefined || hostId === '') throw new UsageError('data-engine', '--host-id ID is required');
  const listenText = values.listen;
  if (listenText === undefined) throw new UsageError('data-engine', '--listen ADDRESS is required (unix:PATH or tcp:HOST:PORT)');
  if (!/^(unix|tcp):/.test(listenText)) {
    throw new UsageError('data-engine', `--listen must be unix:PATH or tcp:HOST:PORT (got ${JSON.stringify(listenText)})`);
  }
  // A relative socket path is relative to where the command runs.
  const listen = listenText.startsWith('unix:') ? `unix:${resolve(cwd, listenText.slice('unix:'.length))}` : listenText;
  const replicaListenText = values['replica-listen'];
  const replicaListen = replicaListenText === 'none' ? null : replicaListenText;
  const tls = await readTlsOptions('data-engine', values, cwd);
  let maxConcurrentRebuilds: number | undefined;
  if (values['max-concurrent-rebuilds'] !== undefined) {
    const text = values['max-concurrent-rebuilds'];
    if (!/^\d{1,3}$/.test(text)) throw new UsageError('data-engine', `--max-concurrent-rebuilds must be an integer (got ${JSON.stringify(text)})`);
    maxConcurrentRebuilds = Number(text);
  }
  let handOverHoldMs: number | undefined;
  if (values['hand-over-hold-ms'] !== undefined) {
    const text = values['hand-over-hold-ms'];
    if (!/^\d{1,9}$/.test(text)) throw new UsageError('data-engine', `--hand-over-hold-ms must be an integer (got ${JSON.stringify(text)})`);
    handOverHoldMs = Number(text);
  }
  const nbdSocketGroup = values['socket-group'] === undefined ? undefined : await parseGroupOption('data-engine', values['socket-group']);
  const replicaServerBufferBytesMax =
    values['replica-buffer-bytes'] === undefined
      ? undefined
      : parseBytesOption('data-engine', '--replica-buffer-bytes', values['replica-buffer-bytes'], DATA_ENGINE_LIMITS.replicaServerBufferBytesMaxMin, DATA_ENGINE_LIMITS.replicaServerBufferBytesMaxMax);
  const nbdExportBufferBytesMax =
    values['nbd-buffer-bytes'] === undefined
      ? undefined
      : parseBytesOption('data-engine', '--nbd-buffer-bytes', values['nbd-buffer-bytes'], NBD_LIMITS.bufferBytesMaxMin, NBD_LIMITS.bufferBytesMaxMax);
  const allowInsecureRemote = values['allow-insecure-remote'] === true;
  const metricsAddress = parseMetricsOption('data-engine', values);
  const secretFile = values['cluster-secret-file'];
  const insecure = values.insecure === true;
  if (secretFile !== undefined && insecure) throw new UsageError('data-engine', '--cluster-secret-file and --insecure exclude each other');
  const clusterSecret = secretFile === undefined ? undefined : await readClusterSecretFile(resolve(cwd, secretFile));
  const takingOver = values['take-over'] !== undefined;
  if (clusterSecret === undefined && tls === undefined && !insecure) {
    // Anyone on this host could create and delete replicas through an unauthenticated TCP
    // listener. A unix socket is this user's only (0600). A successor that takes over (an
    // in-place upgrade) keeps its predecessor's settings: its peers may know no secret.
    if (listen.startsWith('tcp:') && !takingOver) {
      throw new MooringError('INVALID_ARGUMENT', `--listen ${listen}: a gRPC TCP listener without TLS needs --cluster-secret-file (or --insecure: any local process could then create and delete replicas through it)`);
    }
    if (replicaListen !== null) {
      // A new data engine must say how its replica port is guarded. One whose directory an
      // earlier release made (started again, or by an upgrade with its old command line,
      // from a cluster that knows no secret yet) is warned instead of refused.
      if (!takingOver && !(await pathExists(join(dir, DATA_ENGINE_FILE)))) {
        throw new MooringError(
          'INVALID_ARGUMENT',
          `--replica-listen ${replicaListen ?? DATA_ENGINE_DEFAULTS.replicaListen}: a replica server without TLS needs --cluster-secret-file (or --insecure: any local process could then claim and write its replicas; --replica-listen none serves no replicas to other hosts)`,
        );
      }
      log.warn({ hostId }, 'no --cluster-secret-file and no TLS: any process that reaches the replica port can use the replicas (--insecure silences this)');
    }
  }
  const successorPrefix = values['allow-successor-exec'] === undefined ? null : resolve(cwd, values['allow-successor-exec']);
  const addon = addonOf(ctx);
  const takeOver = values['take-over'] === undefined ? undefined : resolve(cwd, values['take-over']);
  const openDataEngine = async (): Promise<LocalDataEngine> => {
    const opened = await LocalDataEngine.start({
      dir,
      hostId,
      addon,
      logger: log.child({ component: 'data-engine' }),
      allowInsecureRemote,
      // A process of its own shares no generated secret with anyone: none unless given.
      clusterSecret: clusterSecret ?? null,
      ...(replicaListen !== undefined ? { replicaListen } : {}),
      ...(tls ? { tls } : {}),
      ...(maxConcurrentRebuilds !== undefined ? { maxConcurrentRebuilds } : {}),
      ...(handOverHoldMs !== undefined ? { handOverHoldMs } : {}),
      ...(nbdSocketGroup !== undefined ? { nbdSocketGroup } : {}),
      ...(replicaServerBufferBytesMax !== undefined ? { replicaServerBufferBytesMax } : {}),
      ...(nbdExportBufferBytesMax !== undefined ? { nbdExportBufferBytesMax } : {}),
    });
    const rebuilds = settings.progress ? rebuildProgress(log, settings.progressIntervalMs) : null;
    opened.watch((e) => {
      logDataEngineEvent(log, hostId, e);
      rebuilds?.(hostId, e);
    });
    return opened;
  };
  // What ends or changes the serving: a signal, a successor to start (ReplaceProcess), an
  // in-place hand-off that committed or rolled back (HandOffProcess). One at a time.
  let wake!: (w: Wake) => void;
  let woken = new Promise<Wake>((r) => (wake = r));
  let changing = false;
  const claim = (): void => {
    if (changing) throw new MooringError('BUSY', 'a successor is being started already');
    changing = true;
  };

  const stop = installStopSignals(ctx, 'engines to drain');
  void stop.wait().then((signal) => wake({ kind: 'signal', signal }));
  let de: LocalDataEngine | undefined;
  let server: DataEngineGrpcServer | undefined;
  // Metrics follow the data engine running now (a rolled-back hand-off reopens it).
  const metrics = metricsAddress ? new DataEngineMetrics(() => de ?? null) : null;
  let metricsServer: MetricsServer | null = null;
  const openMetrics = async (): Promise<void> => {
    if (metrics && metricsAddress && !metricsServer) metricsServer = await startMetricsServer(metrics.registry, metricsAddress, ctx);
  };
  const closeMetrics = async (): Promise<void> => {
    const s = metricsServer;
    metricsServer = null;
    await closeMetricsServer(s, ctx);
  };
  try {
    if (takeOver !== undefined) {
      const taken = await takeOverFromPredecessor({ addon, socketPath: takeOver, start: openDataEngine });
      de = taken.de;
      log.info(
        { hostId, engines: taken.engines, openMs: taken.openMs, startMs: taken.startMs },
        `took over ${taken.engines} engine(s) from the previous process, clients connected (data engine opened in ${taken.openMs.toFixed(1)} ms, engines started in ${taken.startMs.toFixed(1)} ms)`,
      );
    } else {
      de = await openDataEngine();
    }
    const prefix = successorPrefix;
    const hooks =
      prefix === null
        ? {}
        : {
            replaceProcess: async (successor: string[]): Promise<void> => {
              claim();
              await checkSuccessorArgv(successor, prefix).catch((err: unknown) => {
                changing = false;
                throw err;
              });
              wake({ kind: 'successor', argv: successor });
            },
            handOffProcess: async (successor: string[], epochs: Map<string, HandOffEpochs>): Promise<HandOffProcessResult> => {
              claim();
              try {
                await checkSuccessorArgv(successor, prefix);
                // The successor is given the same --metrics address: free it first.
                await closeMetrics();
                const running = de!;
                const out = await handOffToSuccessor({
                  addon,
                  socketPath: join(dir, HANDOFF_SOCKET_FILE),
                  de: running,
                  epochs,
                  startSuccessor: (sock) => spawnSuccessor(successor, [...withoutTakeOver(argv), '--take-over', sock]),
                  reopen: openDataEngine,
                });
                if (out.committed) {
                  const st = out.steps;
                  log.info(
                    { hostId, engines: out.engines, pauseMs: out.pauseMs, steps: st },
                    `${out.engines} engine(s) handed over, exports frozen ${out.pauseMs.toFixed(1)} ms (detach ${st.detachMs.toFixed(1)}, ` +
                      `replica clients away ${st.goAwayMs.toFixed(1)}, close ${st.closeMs.toFixed(1)}, successor ready ${st.successorMs.toFixed(1)})`,
                  );
                  wake({ kind: 'handed-off', release: out.release });
                  return { committed: true, error: null, pauseMs: out.pauseMs, engines: out.engines };
                }
                log.warn({ hostId, code: out.reason.code }, `hand-off to ${successor.join(' ')} rolled back: ${out.reason.message}`);
                await openMetrics().catch((err: unknown) => log.warn({ hostId, code: toMooringError(err).code }, `metrics endpoint not reopened: ${toMooringError(err).message}`));
                if (out.de !== running) wake({ kind: 'rolled-back', de: out.de });
                else changing = false;
                return { committed: false, error: { code: out.reason.code, message: out.reason.message }, pauseMs: 0, engines: 0 };
              } catch (err) {
                changing = false;
                await openMetrics().catch(() => undefined);
                throw err;
              }
            },
          };
    const serve = (): Promise<DataEngineGrpcServer> =>
      DataEngineGrpcServer.start({ engine: de!, listen, allowInsecureRemote, ...(tls && !listen.startsWith('unix:') ? { tls } : {}), ...(clusterSecret ? { clusterSecret } : {}), ...hooks });
    server = await serve();
    await openMetrics();
    const info = await de.info();
    const ready: DataEngineReadyInfo = {
      hostId,
      grpc: server.address,
      replicaAddress: info.replicaAddress,
      tls: tls !== undefined,
      version: info.version,
      ...(metricsServer ? { metrics: (metricsServer as MetricsServer).address } : {}),
    };
    ctx.stdout(`READY ${JSON.stringify(ready)}\n`);
    log.info(
      { hostId, dir, grpc: server.address, replicaAddress: info.replicaAddress, tls: tls !== undefined, clusterSecret: clusterSecret !== undefined },
      `data engine ${hostId} serving ${dir} at ${server.address}${info.replicaAddress ? `, replicas at ${info.replicaAddress}` : ''}${tls ? ' (mutual TLS)' : ''}${clusterSecret ? ' (cluster secret)' : ''}`,
    );

    for (;;) {
      const w = await woken;
      woken = new Promise<Wake>((r) => (wake = r));
      if (w.kind === 'rolled-back') {
        // A data engine opened again serves the same engines: the gRPC server follows it.
        de = w.de;
        server.setEngine(de);
        changing = false;
        continue;
      }
      if (w.kind === 'handed-off') {
        await closeMetrics();
        await server.close();
        server = undefined;
        de = undefined; // closed by the hand-off
        await w.release();
        log.info({ hostId }, 'handed every engine over to the successor; exiting');
        return 0;
      }
      log.info({ hostId, ...(w.kind === 'signal' ? { signal: w.signal } : {}) }, `${w.kind === 'signal' ? w.signal : 'a successor was asked for'}: stopping the gRPC server and every engine (drain, flush)`);
      await closeMetrics();
      await server.close();
      await de.close();
      log.info({ hostId }, 'data engine stopped');
      if (w.kind === 'successor') {
        const { pid } = spawnSuccessor(w.argv, withoutTakeOver(argv));
        log.info({ hostId, successorPid: pid, successor: w.argv }, `started the successor ${w.argv.join(' ')} (pid ${pid})`);
      }
      return 0;
    }
  } finally {
    await closeMetrics();
    metrics?.close();
    if (server) await server.close().catch(() => undefined);
    if (de) await de.close().catch(() => undefined);
    stop.dispose();
  }
}

/** The hand-off channel's socket, in the data engine's directory. */
const HANDOFF_SOCKET_FILE = 'handoff.sock';

type Wake =
  | { kind: 'signal'; signal: string }
  | { kind: 'successor'; argv: string[] }
  | { kind: 'handed-off'; release: () => Promise<void> }
  | { kind: 'rolled-back'; de: LocalDataEngine };

// This process's arguments without --take-over (a successor gets its own).
function withoutTakeOver(args: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--take-over') i++;
    else if (!args[i]!.startsWith('--take-over=')) out.push(args[i]!);
  }
  return out;
}
