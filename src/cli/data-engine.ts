// `mooring data-engine`: run this host's data engine as its own process, serving it over
// gRPC until SIGINT/SIGTERM, so a VM manager can restart without cutting its VMs off
// their disks.
import { resolve } from 'node:path';

import { DataEngineGrpcServer } from '../data-engine/grpc/data-engine-grpc-server.js';
import { DATA_ENGINE_DEFAULTS, DATA_ENGINE_LIMITS, LocalDataEngine } from '../data-engine/local-data-engine.js';
import { TLS_PEM_BYTES_MAX, type DataEngineTlsOptions } from '../data-engine/addresses.js';
import { MooringError } from '../errors.js';
import { readFileLimited } from '../util/files.js';
import { describeEvent } from './describe-event.js';
import { checkSuccessorArgv, spawnSuccessor } from './successor.js';
import { UsageError, addonOf, installStopSignals, parseCommandArgs, requireDir, type CliContext } from './common.js';

/** The JSON that follows `READY ` on the data engine's stdout (the CLI contract). */
export interface DataEngineReadyInfo {
  /** Host id. */
  hostId: string;
  /** Where the gRPC server listens (`unix:PATH` or `tcp:HOST:PORT` with the bound port). */
  grpc: string;
  /** Replica server address (`tcp:HOST:PORT`, bound port), or null when it serves none. */
  replicaAddress: string | null;
  /** Whether mutual TLS is on. */
  tls: boolean;
  /** Package version. */
  version: string;
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
  --tls-cert FILE               mutual TLS for gRPC and the replica protocol: this host's
  --tls-key FILE                certificate, its key, and the CA peers must chain to
  --tls-ca FILE                 (all three, PEM)
  --allow-insecure-remote       allow non-loopback TCP addresses without TLS
  --max-concurrent-rebuilds N   rebuilds at once, 1..${DATA_ENGINE_LIMITS.maxConcurrentRebuildsMax} (default ${DATA_ENGINE_DEFAULTS.maxConcurrentRebuilds})
  --allow-successor-exec PREFIX let a gRPC caller replace this process by a program under
                                PREFIX (an upgrade: it stops as on SIGTERM, then starts
                                PROGRAM data-engine <these arguments>, detached)
  -h, --help                    show this help

Without TLS, TCP addresses must be loopback unless --allow-insecure-remote is given.
Once serving, one line is printed to stdout:
  READY {"hostId":"h1","grpc":"unix:/run/de.sock","replicaAddress":"tcp:127.0.0.1:PORT","tls":false,"version":"..."}
Logs (engine events) go to stderr. SIGINT/SIGTERM stop the gRPC server, stop every engine
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
      'tls-cert': { type: 'string' },
      'tls-key': { type: 'string' },
      'tls-ca': { type: 'string' },
      'allow-insecure-remote': { type: 'boolean' },
      'max-concurrent-rebuilds': { type: 'string' },
      'allow-successor-exec': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(DATA_ENGINE_HELP);
    return 0;
  }
  const cwd = ctx.cwd ?? process.cwd();
  const dir = resolve(cwd, requireDir('data-engine', values.dir));
  const hostId = values['host-id'];
  if (hostId === undefined || hostId === '') throw new UsageError('data-engine', '--host-id ID is required');
  const listenText = values.listen;
  if (listenText === undefined || !/^(unix|tcp):/.test(listenText)) {
    throw new UsageError('data-engine', `--listen must be unix:PATH or tcp:HOST:PORT (got ${JSON.stringify(listenText)})`);
  }
  // A relative socket path is relative to where the command runs.
  const listen = listenText.startsWith('unix:') ? `unix:${resolve(cwd, listenText.slice('unix:'.length))}` : listenText;
  const replicaListenText = values['replica-listen'];
  const replicaListen = replicaListenText === 'none' ? null : replicaListenText;
  const tlsFiles = [values['tls-cert'], values['tls-key'], values['tls-ca']];
  if (tlsFiles.some((f) => f !== undefined) && tlsFiles.some((f) => f === undefined)) {
    throw new UsageError('data-engine', '--tls-cert, --tls-key and --tls-ca go together');
  }
  let maxConcurrentRebuilds: number | undefined;
  if (values['max-concurrent-rebuilds'] !== undefined) {
    const text = values['max-concurrent-rebuilds'];
    if (!/^\d{1,3}$/.test(text)) throw new UsageError('data-engine', `--max-concurrent-rebuilds must be an integer (got ${JSON.stringify(text)})`);
    maxConcurrentRebuilds = Number(text);
  }
  let tls: DataEngineTlsOptions | undefined;
  if (tlsFiles[0] !== undefined) {
    const [cert, key, ca] = await Promise.all(tlsFiles.map((f) => readFileLimited(resolve(cwd, f!), TLS_PEM_BYTES_MAX, 'INVALID_ARGUMENT')));
    tls = { cert: cert!, key: key!, ca: ca! };
  }
  const allowInsecureRemote = values['allow-insecure-remote'] === true;
  const successorPrefix = values['allow-successor-exec'] === undefined ? null : resolve(cwd, values['allow-successor-exec']);
  const addon = addonOf(ctx);
  // ReplaceProcess: once the successor's argv passed its checks, this process stops as on
  // SIGTERM and starts it.
  let successor: string[] | null = null;
  let successorAsked: (() => void) | undefined;
  const successorWanted = new Promise<string>((res) => (successorAsked = () => res('a successor was asked for')));

  const stop = installStopSignals(ctx, 'engines to drain');
  let de: LocalDataEngine | undefined;
  let server: DataEngineGrpcServer | undefined;
  try {
    de = await LocalDataEngine.start({
      dir,
      hostId,
      addon,
      allowInsecureRemote,
      ...(replicaListen !== undefined ? { replicaListen } : {}),
      ...(tls ? { tls } : {}),
      ...(maxConcurrentRebuilds !== undefined ? { maxConcurrentRebuilds } : {}),
    });
    de.watch((e) => ctx.stderr(`mooring: ${describeEvent(e)}\n`));
    const replaceProcess = successorPrefix === null
      ? undefined
      : async (argv: string[]): Promise<void> => {
          if (successor) throw new MooringError('BUSY', 'a successor is being started already');
          await checkSuccessorArgv(argv, successorPrefix);
          successor = argv;
          successorAsked!();
        };
    server = await DataEngineGrpcServer.start({ engine: de, listen, allowInsecureRemote, ...(tls ? { tls } : {}), ...(replaceProcess ? { replaceProcess } : {}) });
    const info = await de.info();
    const ready: DataEngineReadyInfo = { hostId, grpc: server.address, replicaAddress: info.replicaAddress, tls: tls !== undefined, version: info.version };
    ctx.stdout(`READY ${JSON.stringify(ready)}\n`);
    ctx.stderr(`mooring: data engine ${hostId} serving ${dir} at ${server.address}${info.replicaAddress ? `, replicas at ${info.replicaAddress}` : ''}${tls ? ' (mutual TLS)' : ''}\n`);

    const signal = await Promise.race([stop.wait(), successorWanted]);
    ctx.stderr(`mooring: ${signal}: stopping the gRPC server and every engine (drain, flush)\n`);
    await server.close();
    await de.close();
    ctx.stderr('mooring: data engine stopped\n');
    if (successor) {
      const pid = spawnSuccessor(successor, argv);
      ctx.stderr(`mooring: started the successor ${(successor as string[]).join(' ')} (pid ${pid})\n`);
    }
    return 0;
  } finally {
    if (server) await server.close().catch(() => undefined);
    if (de) await de.close().catch(() => undefined);
    stop.dispose();
  }
}
