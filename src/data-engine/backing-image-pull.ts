/**
 * The target's end of a direct copy of a backing image file (issue 16): this data engine
 * connects to the source data engine's gRPC server as a client, with its own TLS
 * certificate and cluster secret (the credentials its replica connections use), checks that
 * it reached the host it was told of, and reads the file into its own write. Where the
 * source announces `backing-file-read`, the bytes come over the replica protocol from the
 * source's replica server (native on both ends, the same credentials); else over the gRPC
 * stream `ReadBackingImageFile`. The bytes go from data engine to data engine; the caller
 * (the controller) only waits for the answer. docs/backing-images.md, "Delivery".
 */
import { callNative, MooringError } from '../errors.js';
import type { NativeAddon, NativeReplica } from '../native/binding.js';
import { parseNbdAddress } from '../nbd/nbd-address.js';
import { checkName, describe } from '../util/validate.js';
import { parseTcpAddress, type DataEngineTlsOptions } from './addresses.js';
import { checkRef } from './backing-image-files.js';
import { DATA_ENGINE_FEATURES, type BackingImageFileRef, type BackingImagePullOptions } from './data-engine.js';

/** Deadline of the connection to the source (its Info call): a source that does not answer fails the pull, it does not hang it. */
export const PULL_CONNECT_TIMEOUT_MS = 15_000;

/** Bytes asked for by one read of a pull over the replica protocol (its largest frame). */
export const PULL_READ_BYTES = 4 * 1024 * 1024;
/** Reads of a pull in flight at once: the next chunks arrive while one is written and hashed. */
export const PULL_READS_AHEAD = 2;

/** How a pull's bytes travel. */
export type PullPath = 'replica-protocol' | 'grpc';

/** What the target needs to reach another data engine as it reaches its replicas. */
export interface PullCredentials {
  tls: DataEngineTlsOptions | undefined;
  clusterSecret: Uint8Array | undefined;
  allowInsecureRemote: boolean;
}

/** Checks the pull-only options (the write options are checked by the write). */
export function checkPullSource(options: unknown): { address: string; hostId: string } {
  if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `pull options must be an object (got ${describe(options)})`);
  const src = (options as Partial<BackingImagePullOptions>).source;
  if (typeof src !== 'object' || src === null) throw new MooringError('INVALID_ARGUMENT', `source must be {address, hostId} (got ${describe(src)})`);
  if (typeof src.address !== 'string') throw new MooringError('INVALID_ARGUMENT', `source.address must be a string (got ${describe(src.address)})`);
  parseNbdAddress(src.address);
  checkName('source.hostId', src.hostId);
  return { address: src.address, hostId: src.hostId };
}

/**
 * Opens the source's read stream of `ref` from `offset`: over the replica protocol where
 * the source announces it (`via` says which), else the gRPC stream. A source alive but
 * sending nothing for `stallTimeoutMs` fails it UNAVAILABLE (a dead connection is found by
 * keepalive, or by the replica protocol's pings). The returned `close` ends the connections
 * (call it once the stream is consumed or abandoned).
 */
export async function openPullSource(
  creds: PullCredentials,
  source: { address: string; hostId: string },
  selfHostId: string,
  ref: BackingImageFileRef,
  offset: number,
  stallTimeoutMs: number,
  addon?: NativeAddon,
): Promise<{ data: AsyncIterable<Uint8Array>; close: () => Promise<void>; via: PullPath }> {
  if (source.hostId === selfHostId) throw new MooringError('INVALID_ARGUMENT', `source ${source.hostId} is this data engine`);
  // Loaded here: an embedded data engine that never pulls does not load gRPC.
  const { RemoteDataEngine } = await import('./grpc/remote-data-engine.js');
  const remote = await RemoteDataEngine.connect({
    address: source.address,
    timeoutMs: PULL_CONNECT_TIMEOUT_MS,
    allowInsecureRemote: creds.allowInsecureRemote,
    ...(creds.tls ? { tls: creds.tls } : {}),
    ...(creds.clusterSecret ? { clusterSecret: creds.clusterSecret } : {}),
  }).catch((err: unknown) => {
    const e = err instanceof MooringError ? err : new MooringError('UNAVAILABLE', String(err));
    throw new MooringError(e.code, `source data engine ${source.hostId} at ${source.address}: ${e.message}`, { cause: err });
  });
  if (remote.hostId !== source.hostId) {
    await remote.close();
    throw new MooringError('INVALID_ARGUMENT', `${source.address} is data engine ${remote.hostId}, not the source ${source.hostId}`);
  }
  try {
    const info = await remote.info();
    if (addon && info.replicaAddress !== null && info.features.includes(DATA_ENGINE_FEATURES.backingFileRead)) {
      const a = parseTcpAddress(info.replicaAddress, `source ${source.hostId} replica address`, false);
      const file = await callNative(
        () =>
          addon.openReplica({
            host: a.host,
            port: a.port,
            name: checkRef(ref),
            backingFile: true,
            ioTimeoutMs: Math.min(Math.max(stallTimeoutMs, 100), 600_000),
            ...(creds.tls ? { tls: { ...creds.tls, serverName: '' } } : {}),
            ...(creds.clusterSecret ? { clusterSecret: creds.clusterSecret } : {}),
          }),
        `source data engine ${source.hostId}: opening backing image file ${ref.name}-${ref.uuid} at ${info.replicaAddress}`,
      );
      await remote.close();
      return { data: readAhead(file, offset, source.hostId), close: () => file.close(), via: 'replica-protocol' };
    }
  } catch (err) {
    await remote.close();
    throw err;
  }
  return { data: remote.readBackingImageFile(ref, { offset, stallTimeoutMs }), close: () => remote.close(), via: 'grpc' };
}

/**
 * The file from `offset` to its end, in order, with {@link PULL_READS_AHEAD} reads in
 * flight. A read that fails (the source gone, a read slower than the stall timeout) ends
 * the stream with its error.
 */
async function* readAhead(file: NativeReplica, offset: number, hostId: string): AsyncGenerator<Uint8Array> {
  const size = file.sizeBytes;
  if (offset > size) throw new MooringError('INVALID_ARGUMENT', `offset ${offset} is beyond the ${size} bytes of the source's file on ${hostId}`);
  const pending: Array<Promise<Buffer>> = [];
  let next = offset;
  try {
    for (;;) {
      while (pending.length < PULL_READS_AHEAD && next < size) {
        const length = Math.min(PULL_READ_BYTES, size - next);
        const read = callNative(() => file.read(next, length), `source data engine ${hostId}: reading its backing image file at byte ${next}`);
        read.catch(() => undefined); // awaited in order below; an early failure must not go unhandled
        pending.push(read);
        next += length;
      }
      const first = pending.shift();
      if (first === undefined) return;
      yield await first;
    }
  } finally {
    await Promise.allSettled(pending);
  }
}
