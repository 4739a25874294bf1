/**
 * The one error class of the library, its stable codes, and the helpers that turn
 * rejections of the native addon into it.
 *
 * @packageDocumentation
 */
import { constants as osConstants } from 'node:os';

/**
 * Every code a {@link MooringError} can carry.
 *
 * The first group is exactly the native `CodeName` strings of
 * `native/src/util/status.h` (except `OK`, which never names an error); keep the two lists
 * in step. The second group exists only in TypeScript.
 */
export const MooringErrorCode = {
  // --- crossing from native code (status.h CodeName) ---
  /** An argument is malformed or outside its allowed range. */
  INVALID_ARGUMENT: 'INVALID_ARGUMENT',
  /** A named object (snapshot, replica directory, file) does not exist. */
  NOT_FOUND: 'NOT_FOUND',
  /** The object to be created exists already. */
  ALREADY_EXISTS: 'ALREADY_EXISTS',
  /** An I/O operation failed; `errno` says how when known. */
  IO_ERROR: 'IO_ERROR',
  /** The filesystem holding a replica is full. */
  NO_SPACE: 'NO_SPACE',
  /** A writer with an older epoch was fenced off (another engine claimed the volume). */
  STALE_EPOCH: 'STALE_EPOCH',
  /** Stored metadata (volume.json, replica.json) is damaged or hostile. */
  CORRUPT_METADATA: 'CORRUPT_METADATA',
  /** The object is in use (for example a volume open in another process). */
  BUSY: 'BUSY',
  /** The object was closed, or is closing. */
  CLOSED: 'CLOSED',
  /** No replica is left that can serve I/O. */
  NO_HEALTHY_REPLICA: 'NO_HEALTHY_REPLICA',
  /** An offset or length lies outside the volume. */
  OUT_OF_RANGE: 'OUT_OF_RANGE',
  /** The operation is not supported (yet, or by this build or platform). */
  UNSUPPORTED: 'UNSUPPORTED',
  /** The operation is not allowed in the object's current state. */
  INVALID_STATE: 'INVALID_STATE',
  /** The NBD address to listen on is taken. */
  ADDRESS_IN_USE: 'ADDRESS_IN_USE',
  /** A host, replica server or data engine cannot be reached, or did not answer in time. */
  UNAVAILABLE: 'UNAVAILABLE',
  /** A peer (replica server, data engine, RPC client) sent something the protocol does not allow. */
  PROTOCOL_ERROR: 'PROTOCOL_ERROR',
  /**
   * A majority of the volume's replicas could not be reached, so the engine cannot know
   * whether another engine serves it: it does not serve (docs/single-writer.md).
   */
  NO_QUORUM: 'NO_QUORUM',
  /**
   * A peer did not prove the cluster secret (a replica server or a data engine's gRPC
   * server configured with one), or a server could not prove it to us (docs/data-engine.md,
   * "Authentication").
   */
  UNAUTHENTICATED: 'UNAUTHENTICATED',
  // --- TypeScript only ---
  /**
   * The filesystem that would hold a file or directory is mounted read-only (EROFS).
   * Native calls report it as IO_ERROR with that errno; the conversion gives it this code.
   */
  READ_ONLY_FILESYSTEM: 'READ_ONLY_FILESYSTEM',
  /** The process may not create, open or change a file or directory (EACCES); refined like READ_ONLY_FILESYSTEM. */
  PERMISSION_DENIED: 'PERMISSION_DENIED',
  /** A compare-and-set write to the state store found another version. */
  CONFLICT: 'CONFLICT',
  /** The native addon could not be loaded; the message lists what was tried and how to fix it. */
  NATIVE_LOAD_FAILED: 'NATIVE_LOAD_FAILED',
  /** A long operation (a download, a copy) was stopped on request. */
  CANCELLED: 'CANCELLED',
  /** What an operation needs does not hold now; `details.reasons` lists every reason, each with its own code. */
  PRECONDITION_FAILED: 'PRECONDITION_FAILED',
  /**
   * Several embedders share the store (`MooringOptions.leadership`) and this one does not
   * lead the cluster now: control operations go to the leader (`details.leader`, or null
   * while none is known). Reads work on every embedder (docs/leadership.md).
   */
  NOT_LEADER: 'NOT_LEADER',
  // --- TypeScript only: backing images ---
  /** A file's SHA-512 is not the one expected; the message gives both. */
  CHECKSUM_MISMATCH: 'CHECKSUM_MISMATCH',
  /** A download could not be completed (HTTP status, a server that stalled or broke off, after the retries). */
  DOWNLOAD_FAILED: 'DOWNLOAD_FAILED',
  // --- TypeScript only: locks (sanlock), src/locks/sanlock-errors.ts ---
  /** sanlock's client library is not installed; the message names the package. */
  SANLOCK_UNAVAILABLE: 'SANLOCK_UNAVAILABLE',
  /** The sanlock daemon is not running (or its socket is not where SANLOCK_RUN_DIR says). */
  SANLOCK_DAEMON_UNAVAILABLE: 'SANLOCK_DAEMON_UNAVAILABLE',
  /** A lock is held by another process or host. */
  LOCK_HELD: 'LOCK_HELD',
  /** A lock's version changed since it was handed over: another host took it in between. */
  LOCK_VERSION_MISMATCH: 'LOCK_VERSION_MISMATCH',
  /** The host id is held by another live host in this lockspace. */
  HOST_ID_IN_USE: 'HOST_ID_IN_USE',
  /** This host has not joined the lockspace (or lost it after a storage failure). */
  LOCKSPACE_NOT_JOINED: 'LOCKSPACE_NOT_JOINED',
} as const;

/** The union of every {@link MooringErrorCode} value. */
export type MooringErrorCode = (typeof MooringErrorCode)[keyof typeof MooringErrorCode];

const knownCodes: ReadonlySet<string> = new Set(Object.values(MooringErrorCode));

/** Whether `value` is one of the {@link MooringErrorCode} strings. */
export function isMooringErrorCode(value: unknown): value is MooringErrorCode {
  return typeof value === 'string' && knownCodes.has(value);
}

/** Options of the {@link MooringError} constructor. */
export interface MooringErrorOptions {
  /** The error that caused this one (for example the native rejection). */
  cause?: unknown;
  /** The OS errno behind the error (positive), when known. */
  errno?: number;
  /** Extra machine-readable facts about the error (paths, names, limits). */
  details?: Record<string, unknown>;
}

/**
 * The mark every {@link MooringError} carries, under a registered symbol: one process may
 * hold two copies of this class (the package's ESM and CJS builds, each loaded by a
 * different dependency), and each copy must recognise the other's errors.
 */
const BRAND = Symbol.for('mooring.error');

function isBranded(value: unknown): boolean {
  return typeof value === 'object' && value !== null && (value as { [BRAND]?: unknown })[BRAND] === true;
}

/**
 * The only error type Mooring throws or rejects with. Test `code`, never the message:
 * codes are stable, messages are for people.
 *
 * `err instanceof MooringError` and {@link isMooringError} hold for a MooringError of any
 * copy of the package loaded in the process (`import` and `require` load different ones).
 */
export class MooringError extends Error {
  /** A stable code from {@link MooringErrorCode}. */
  readonly code: MooringErrorCode;
  /** The OS errno (positive) behind the error, when known. */
  readonly errno?: number;
  /** Extra machine-readable facts about the error. */
  readonly details?: Record<string, unknown>;

  /**
   * @param code - a {@link MooringErrorCode}
   * @param message - a message for people, naming the object concerned
   * @param options - cause, errno and details
   */
  constructor(code: MooringErrorCode, message: string, options: MooringErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    // Not enumerable: it stays out of JSON, logs and deep-equality checks.
    Object.defineProperty(this, BRAND, { value: true });
    this.name = 'MooringError';
    this.code = code;
    if (options.errno !== undefined && options.errno !== 0) this.errno = Math.abs(options.errno);
    if (options.details !== undefined) this.details = options.details;
  }

  /**
   * Tests the brand, so that errors of another copy of the package count too. A subclass
   * (`class X extends MooringError`) keeps the ordinary prototype-chain test.
   */
  static override [Symbol.hasInstance](value: unknown): boolean {
    if (this !== MooringError) return Function.prototype[Symbol.hasInstance].call(this, value);
    return isBranded(value);
  }
}

/**
 * Whether `err` is a {@link MooringError} (of any copy of the package in the process),
 * optionally with the given code.
 */
export function isMooringError(err: unknown, code?: MooringErrorCode): err is MooringError {
  return isBranded(err) && (code === undefined || (err as MooringError).code === code);
}

/**
 * Converts anything thrown by the addon (or by Node) into a {@link MooringError}: a native
 * `code` that is a known code is kept, a Node `code` such as `ENOENT` is mapped, anything
 * else becomes `IO_ERROR`. A MooringError passes through unchanged.
 *
 * @internal
 */
export function toMooringError(err: unknown, context?: string): MooringError {
  if (err instanceof MooringError) return err;
  const e = (typeof err === 'object' && err !== null ? err : {}) as {
    code?: unknown;
    errno?: unknown;
    message?: unknown;
  };
  const rawMessage = typeof e.message === 'string' ? e.message : String(err);
  const message = context ? `${context}: ${rawMessage}` : rawMessage;
  const errno = typeof e.errno === 'number' ? e.errno : undefined;
  let code: MooringErrorCode;
  if (isMooringErrorCode(e.code)) code = e.code;
  else if (typeof e.code === 'string' && e.code in errnoCodes) code = errnoCodes[e.code]!;
  else code = MooringErrorCode.IO_ERROR;
  // Native statuses keep their codes in step with status.h (and the replica protocol's
  // wire codes), so a read-only filesystem or a refused permission reaches here as IO_ERROR
  // with its errno: say what it is.
  if (code === MooringErrorCode.IO_ERROR && errno !== undefined) code = refinedIoCode(errno) ?? code;
  return new MooringError(code, message, { cause: err, ...(errno === undefined ? {} : { errno }) });
}

// Node's fs errors carry the errno name as `code`; map the ones with a meaning of their own
// the same way status.h CodeFromErrno does.
const errnoCodes: Record<string, MooringErrorCode> = {
  ENOSPC: 'NO_SPACE',
  EDQUOT: 'NO_SPACE',
  EINVAL: 'INVALID_ARGUMENT',
  ENOENT: 'NOT_FOUND',
  EEXIST: 'ALREADY_EXISTS',
  ENOTEMPTY: 'ALREADY_EXISTS',
  ESTALE: 'STALE_EPOCH',
  ENOTSUP: 'UNSUPPORTED',
  EOPNOTSUPP: 'UNSUPPORTED',
  EBUSY: 'BUSY',
  ERANGE: 'OUT_OF_RANGE',
  EADDRINUSE: 'ADDRESS_IN_USE',
  ENOTCONN: 'UNAVAILABLE',
  ECONNREFUSED: 'UNAVAILABLE',
  ECONNRESET: 'UNAVAILABLE',
  ETIMEDOUT: 'UNAVAILABLE',
  EHOSTUNREACH: 'UNAVAILABLE',
  EPROTO: 'PROTOCOL_ERROR',
  EROFS: 'READ_ONLY_FILESYSTEM',
  EACCES: 'PERMISSION_DENIED',
};

// errno (either sign) -> the TypeScript-only code an IO_ERROR with that errno becomes.
function refinedIoCode(errno: number): MooringErrorCode | undefined {
  const e = Math.abs(errno);
  if (e === osConstants.errno.EROFS) return MooringErrorCode.READ_ONLY_FILESYSTEM;
  if (e === osConstants.errno.EACCES) return MooringErrorCode.PERMISSION_DENIED;
  return undefined;
}

/**
 * The code an errno (sign ignored) is reported with: status.h's CodeFromErrno, refined as
 * {@link toMooringError} refines it (EROFS, EACCES).
 *
 * @internal
 */
export function codeFromErrno(errno: number): MooringErrorCode {
  const e = Math.abs(errno);
  for (const [name, value] of Object.entries(osConstants.errno)) {
    if (value === e && name in errnoCodes) return errnoCodes[name]!;
  }
  return 'IO_ERROR';
}

// Replaces the (useless, native-side) stack of `err` with the caller's stack captured
// before the native call, keeping the error's own first line: the frames a user needs
// are the ones that led to the call, which an async native rejection has lost.
function mergeStack(err: MooringError, callerStack: string | undefined): MooringError {
  if (!callerStack) return err;
  const frames = callerStack.split('\n').slice(1).join('\n');
  err.stack = `${err.name}: ${err.message}\n${frames}`;
  return err;
}

/**
 * Runs `call` (a native method returning a promise) and converts a rejection, or a
 * synchronous throw, into a {@link MooringError} carrying the caller's stack.
 *
 * @param call - the native call
 * @param context - prefixed to the message (e.g. `"write r0"`), optional
 * @internal
 */
export async function callNative<T>(call: () => Promise<T>, context?: string): Promise<T> {
  // Captured now, while the caller's frames are still on the stack.
  const holder: { stack?: string } = {};
  Error.captureStackTrace(holder, callNative);
  try {
    return await call();
  } catch (err) {
    if (err instanceof MooringError) throw err;
    throw mergeStack(toMooringError(err, context), holder.stack);
  }
}

/**
 * The synchronous counterpart of {@link callNative}.
 *
 * @internal
 */
export function callNativeSync<T>(call: () => T, context?: string): T {
  try {
    return call();
  } catch (err) {
    if (err instanceof MooringError) throw err;
    const holder: { stack?: string } = {};
    Error.captureStackTrace(holder, callNativeSync);
    throw mergeStack(toMooringError(err, context), holder.stack);
  }
}
