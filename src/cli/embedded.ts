// What the volume commands (serve, create, snapshot) share: the embedded default in --dir
// (Mooring.open: the store in DIR/state, this host's data engine in DIR/host), the data
// engines of other hosts given by --host, and which volume --volume names.
import { basename, resolve } from 'node:path';

import { MooringError, toMooringError } from '../errors.js';
import { readClusterSecretFile } from '../data-engine/cluster-secret.js';
import { RemoteDataEngine } from '../data-engine/grpc/remote-data-engine.js';
import { Mooring, type MooringOptions } from '../mooring.js';
import { checkName } from '../util/validate.js';
import { libraryLoggerOf, logOf } from './log.js';
import { UsageError, addonOf, parseNameOption, requireDir, type CliContext } from './common.js';

/** The options every volume command takes (for parseCommandArgs). */
export const EMBEDDED_OPTIONS = {
  dir: { type: 'string' },
  volume: { type: 'string' },
  host: { type: 'string', multiple: true },
  'host-id': { type: 'string' },
  'cluster-secret-file': { type: 'string' },
} as const;

/** Their help lines. */
export const EMBEDDED_HELP = `  --dir DIR            Mooring's directory on this host (required; created if missing):
                       the store in DIR/state, this host's data engine in DIR/host.
                       A volume directory of an earlier release (DIR/volume.json) is
                       imported in place the first time
  --volume NAME        the volume (default: the only one in DIR; a new one is named
                       after DIR)
  --host ADDRESS       the data engine of another host, as 'mooring data-engine --listen'
                       serves it: unix:PATH or tcp:HOST:PORT (repeat for each host).
                       Replicas go one per host: N replicas need N-1 of them
  --host-id ID         this host's id (default: the one DIR/host was made with, else
                       this machine's host name)
  --cluster-secret-file FILE
                       the cluster's secret (mode 0600), as the --host data engines
                       were given it: calls to them carry it and this host's replicas
                       require it. Without it: with --host, no authentication (those
                       data engines run with --insecure); without --host, a secret made
                       for this process alone`;

/** The values parseCommandArgs gives for {@link EMBEDDED_OPTIONS}. */
export interface EmbeddedValues {
  dir?: string | undefined;
  volume?: string | undefined;
  host?: string[] | undefined;
  'host-id'?: string | undefined;
  'cluster-secret-file'?: string | undefined;
}

/** An open embedded default and the handles of the other hosts it was given. */
export interface Embedded {
  mooring: Mooring;
  dir: string;
  /** Closes the Mooring (this host's engines drain and flush) and the other hosts' handles. */
  close(): Promise<void>;
}

/**
 * Opens the embedded default of `values.dir` for `command`, offering the hosts of --host.
 *
 * @throws MooringError BUSY (another process has DIR open), UNAVAILABLE, INVALID_ARGUMENT
 */
export async function openEmbedded(command: string, values: EmbeddedValues, ctx: CliContext, extra: Partial<MooringOptions> = {}): Promise<Embedded> {
  const dir = resolve(ctx.cwd ?? process.cwd(), requireDir(command, values.dir));
  if (values['host-id'] !== undefined) parseNameOption(command, '--host-id', values['host-id']);
  const hosts: RemoteDataEngine[] = [];
  const closeHosts = async (): Promise<void> => {
    for (const h of hosts) await h.close().catch(() => undefined);
  };
  try {
    const file = values['cluster-secret-file'];
    const clusterSecret = file === undefined ? undefined : await readClusterSecretFile(resolve(ctx.cwd ?? process.cwd(), file));
    for (const address of values.host ?? []) {
      if (!/^(unix|tcp):/.test(address)) throw new UsageError(command, `--host must be unix:PATH or tcp:HOST:PORT (got ${JSON.stringify(address)})`);
      // The TLS material of this host's data engine reaches the others' gRPC on TCP too.
      const tls = extra.dataEngine ? extra.dataEngine.tls : undefined;
      hosts.push(
        await RemoteDataEngine.connect({ address, ...(tls !== undefined && address.startsWith('tcp:') ? { tls } : {}), ...(clusterSecret ? { clusterSecret } : {}) }),
      );
    }
    // Other hosts' data engines must reach this one's replicas: with their secret, or with
    // none if they were given none. Alone, the default (a secret of this process) holds.
    const secretOption = clusterSecret ? { clusterSecret } : (values.host ?? []).length > 0 ? { clusterSecret: null } : {};
    const mooring = await Mooring.open({
      logger: libraryLoggerOf(ctx, true),
      ...extra,
      dir,
      hosts,
      dataEngine: { ...(extra.dataEngine || {}), addon: addonOf(ctx), ...secretOption },
      ...(values['host-id'] !== undefined ? { hostId: values['host-id'] } : {}),
    });
    // Background warnings are logged by the library (its `logger`).
    if (mooring.imported) {
      const i = mooring.imported;
      logOf(ctx).info({ volume: i.volume, replicas: i.replicas, lastEpoch: i.lastEpoch }, `imported the volume ${i.volume} of ${dir}/volume.json (${i.replicas} replicas; writer epochs go on from ${i.lastEpoch})`);
    }
    return {
      mooring,
      dir,
      close: async () => {
        await mooring.close();
        await closeHosts();
      },
    };
  } catch (err) {
    await closeHosts();
    throw err;
  }
}

/**
 * The volume a command works on: --volume, else the only one in the store. With `orNew`,
 * an empty store names the new volume after DIR.
 *
 * @throws UsageError (several volumes and no --volume; DIR's name is no volume name), MooringError NOT_FOUND
 */
export async function pickVolume(command: string, m: Mooring, dir: string, name: string | undefined, orNew = false): Promise<{ name: string; exists: boolean }> {
  const names = (await m.listVolumes()).map((v) => v.name);
  if (name !== undefined) {
    parseNameOption(command, '--volume', name);
    if (!orNew && !names.includes(name)) throw new MooringError('NOT_FOUND', `${dir} holds no volume ${name} (it holds: ${names.join(', ') || 'none'})`);
    return { name, exists: names.includes(name) };
  }
  if (names.length === 1) return { name: names[0]!, exists: true };
  if (names.length > 1) throw new UsageError(command, `${dir} holds ${names.length} volumes (${names.join(', ')}): name one with --volume`);
  if (!orNew) throw new MooringError('NOT_FOUND', `${dir} holds no volume`);
  const fromDir = basename(dir);
  try {
    return { name: checkName('volume name', fromDir), exists: false };
  } catch {
    throw new UsageError(command, `${JSON.stringify(fromDir)} (the directory's name) is no volume name: give one with --volume`);
  }
}

/** Closes `e`, reporting a failure on stderr instead of hiding what went before. */
export async function closeEmbedded(e: Embedded | null, ctx: CliContext): Promise<void> {
  await e?.close().catch((err: unknown) => {
    const m = toMooringError(err);
    logOf(ctx).warn({ code: m.code }, `closing ${e.dir}: ${m.message}`);
  });
}
