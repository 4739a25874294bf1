/**
 * The target's end of a direct copy of a backing image file (issue 16): this data engine
 * connects to the source data engine's gRPC server as a client, with its own TLS
 * certificate and cluster secret (the credentials its replica connections use), checks that
 * it reached the host it was told of, and reads the file's stream into its own write. The
 * bytes go from data engine to data engine; the caller (the controller) only waits for the
 * answer. docs/backing-images.md, "Delivery".
 */
import { MooringError } from '../errors.js';
import { parseNbdAddress } from '../nbd/nbd-address.js';
import { checkName, describe } from '../util/validate.js';
import type { DataEngineTlsOptions } from './addresses.js';
import type { BackingImageFileRef, BackingImagePullOptions } from './data-engine.js';

/** Deadline of the connection to the source (its Info call): a source that does not answer fails the pull, it does not hang it. */
export const PULL_CONNECT_TIMEOUT_MS = 15_000;

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
 * Opens the source's read stream of `ref` from `offset`; a source alive but sending nothing
 * for `stallTimeoutMs` fails it UNAVAILABLE (a dead connection is found by keepalive). The
 * returned `close` ends the connection (call it once the stream is consumed or abandoned).
 */
export async function openPullSource(
  creds: PullCredentials,
  source: { address: string; hostId: string },
  selfHostId: string,
  ref: BackingImageFileRef,
  offset: number,
  stallTimeoutMs: number,
): Promise<{ data: AsyncIterable<Uint8Array>; close: () => Promise<void> }> {
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
  return { data: remote.readBackingImageFile(ref, { offset, stallTimeoutMs }), close: () => remote.close() };
}
