// The cluster secret (docs/data-engine.md, "Authentication"): bytes every data engine and
// control plane of one cluster share. The replica protocol proves it with a
// challenge-response in both directions (native/src/remote/replica-auth.h); gRPC calls
// carry a token derived from it, checked before any method runs.
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { open } from 'node:fs/promises';

import { MooringError, toMooringError } from '../errors.js';
import { describe } from '../util/validate.js';

/** Bounds of a cluster secret. */
export const CLUSTER_SECRET_LIMITS = {
  /** Shortest secret (bytes). */
  bytesMin: 16,
  /** Longest secret (bytes). */
  bytesMax: 1024,
} as const;

/** The gRPC metadata key of the token. */
export const GRPC_AUTH_METADATA_KEY = 'mooring-auth';
const GRPC_TOKEN_LABEL = 'mooring data-engine grpc v1';

/**
 * Checks a clusterSecret option: undefined (none given) or 16 to 1024 bytes.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function checkClusterSecret(value: unknown, what = 'clusterSecret'): Buffer | undefined {
  if (value === undefined) return undefined;
  if (!(value instanceof Uint8Array)) throw new MooringError('INVALID_ARGUMENT', `${what} must be a Uint8Array or Buffer (got ${describe(value)})`);
  const { bytesMin, bytesMax } = CLUSTER_SECRET_LIMITS;
  if (value.byteLength < bytesMin || value.byteLength > bytesMax) {
    throw new MooringError('INVALID_ARGUMENT', `${what} must be ${bytesMin} to ${bytesMax} bytes (got ${value.byteLength})`);
  }
  return Buffer.from(value);
}

/**
 * Reads a cluster secret file (`--cluster-secret-file`): its bytes, trailing white space
 * (a final newline) removed. The file must not be readable by group or others.
 *
 * @throws MooringError INVALID_ARGUMENT (size, mode), NOT_FOUND, PERMISSION_DENIED
 */
export async function readClusterSecretFile(path: string): Promise<Buffer> {
  const f = await open(path, 'r').catch((err: unknown) => Promise.reject(toMooringError(err, `opening the cluster secret file ${path}`)));
  try {
    const st = await f.stat();
    if (!st.isFile()) throw new MooringError('INVALID_ARGUMENT', `the cluster secret file ${path} is not a regular file`);
    if ((st.mode & 0o077) !== 0) {
      throw new MooringError('INVALID_ARGUMENT', `the cluster secret file ${path} is readable by group or others (mode ${(st.mode & 0o777).toString(8)}); chmod 600 it`);
    }
    if (st.size > CLUSTER_SECRET_LIMITS.bytesMax + 64) throw new MooringError('INVALID_ARGUMENT', `the cluster secret file ${path} is larger than ${CLUSTER_SECRET_LIMITS.bytesMax} bytes`);
    const raw = await f.readFile();
    let end = raw.length;
    while (end > 0 && (raw[end - 1] === 0x0a || raw[end - 1] === 0x0d || raw[end - 1] === 0x20 || raw[end - 1] === 0x09)) end--;
    return checkClusterSecret(raw.subarray(0, end), `the cluster secret in ${path}`)!;
  } finally {
    await f.close().catch(() => undefined);
  }
}

/**
 * A new cluster secret: 32 random bytes written as 64 hex digits. Text, so it survives a
 * secret file unchanged (readClusterSecretFile drops trailing white space, which a binary
 * secret may end with: 0x0a, 0x0d, 0x20 or 0x09 in 1 of 64 draws).
 */
export function generateClusterSecret(): Buffer {
  return Buffer.from(randomBytes(32).toString('hex'), 'ascii');
}

let processSecret: Buffer | undefined;

/**
 * The secret in-process data engines use when given none: generateClusterSecret(), made
 * once per process, so several data engines of one process (hosts of a test, an embedding
 * VM manager) reach each other's replicas while no other process can.
 */
export function processClusterSecret(): Buffer {
  processSecret ??= generateClusterSecret();
  return processSecret;
}

/** The token gRPC calls carry: HMAC-SHA256(secret, label), hex. Not the secret itself. */
export function grpcAuthToken(secret: Uint8Array): string {
  return createHmac('sha256', secret).update(GRPC_TOKEN_LABEL).digest('hex');
}

/** Whether `got` is the token (constant time whatever its length). */
export function grpcAuthTokenMatches(expected: string, got: unknown): boolean {
  if (typeof got !== 'string') return false;
  const a = createHash('sha256').update(expected).digest();
  const b = createHash('sha256').update(got).digest();
  return timingSafeEqual(a, b);
}
