/**
 * sanlock return values and the {@link MooringError} codes they map to. sanlock answers 0
 * or a positive value for success, a value <= -200 named in sanlock_rv.h for lease errors,
 * and -errno otherwise. The mapping keeps sanlock's own name in `details.sanlock` (and in
 * the message), so nothing sanlock said is lost.
 *
 * @packageDocumentation
 */
import { constants as osConstants } from 'node:os';

import { MooringError, codeFromErrno, type MooringErrorCode } from '../errors.js';

/** sanlock_rv.h (sanlock 3.8): the errors sanlock defines itself. */
export const SANLOCK_RV_NAMES: Readonly<Record<number, string>> = {
  [-201]: 'SANLK_ERROR',
  [-202]: 'SANLK_AIO_TIMEOUT',
  [-203]: 'SANLK_WD_ERROR',
  [-210]: 'SANLK_DBLOCK_READ',
  [-211]: 'SANLK_DBLOCK_WRITE',
  [-212]: 'SANLK_DBLOCK_LVER',
  [-213]: 'SANLK_DBLOCK_MBAL',
  [-214]: 'SANLK_DBLOCK_CHECKSUM',
  [-220]: 'SANLK_LEADER_READ',
  [-221]: 'SANLK_LEADER_WRITE',
  [-222]: 'SANLK_LEADER_DIFF',
  [-223]: 'SANLK_LEADER_MAGIC',
  [-224]: 'SANLK_LEADER_VERSION',
  [-225]: 'SANLK_LEADER_SECTORSIZE',
  [-226]: 'SANLK_LEADER_LOCKSPACE',
  [-227]: 'SANLK_LEADER_RESOURCE',
  [-228]: 'SANLK_LEADER_NUMHOSTS',
  [-229]: 'SANLK_LEADER_CHECKSUM',
  [-230]: 'SANLK_ADDLS_SIZES',
  [-231]: 'SANLK_ADDLS_INVALID_HOSTID',
  [-240]: 'SANLK_ACQUIRE_LVER',
  [-241]: 'SANLK_ACQUIRE_LOCKSPACE',
  [-242]: 'SANLK_ACQUIRE_IDDISK',
  [-243]: 'SANLK_ACQUIRE_IDLIVE',
  [-244]: 'SANLK_ACQUIRE_OWNED',
  [-245]: 'SANLK_ACQUIRE_OTHER',
  [-246]: 'SANLK_ACQUIRE_SHRETRY',
  [-247]: 'SANLK_ACQUIRE_OWNED_RETRY',
  [-250]: 'SANLK_RELEASE_LVER',
  [-251]: 'SANLK_RELEASE_OWNER',
  [-260]: 'SANLK_RENEW_OWNER',
  [-261]: 'SANLK_RENEW_DIFF',
  [-262]: 'SANLK_HOSTID_BUSY',
  [-270]: 'SANLK_REQUEST_MAGIC',
  [-271]: 'SANLK_REQUEST_VERSION',
  [-272]: 'SANLK_REQUEST_OLD',
  [-273]: 'SANLK_REQUEST_LVER',
  [-274]: 'SANLK_RINDEX_MAGIC',
  [-275]: 'SANLK_RINDEX_VERSION',
  [-276]: 'SANLK_RINDEX_LOCKSPACE',
  [-277]: 'SANLK_RINDEX_OFFSET',
  [-278]: 'SANLK_RINDEX_DIFF',
};

const SANLOCK_RV_CODES: Readonly<Record<string, MooringErrorCode>> = {
  SANLK_AIO_TIMEOUT: 'IO_ERROR',
  SANLK_DBLOCK_READ: 'IO_ERROR',
  SANLK_DBLOCK_WRITE: 'IO_ERROR',
  SANLK_LEADER_READ: 'IO_ERROR',
  SANLK_LEADER_WRITE: 'IO_ERROR',
  // The lease area holds something else, or was never initialised.
  SANLK_LEADER_MAGIC: 'CORRUPT_METADATA',
  SANLK_LEADER_VERSION: 'CORRUPT_METADATA',
  SANLK_LEADER_SECTORSIZE: 'CORRUPT_METADATA',
  SANLK_LEADER_LOCKSPACE: 'CORRUPT_METADATA',
  SANLK_LEADER_RESOURCE: 'CORRUPT_METADATA',
  SANLK_LEADER_NUMHOSTS: 'CORRUPT_METADATA',
  SANLK_LEADER_CHECKSUM: 'CORRUPT_METADATA',
  SANLK_DBLOCK_CHECKSUM: 'CORRUPT_METADATA',
  SANLK_RINDEX_MAGIC: 'CORRUPT_METADATA',
  SANLK_RINDEX_VERSION: 'CORRUPT_METADATA',
  SANLK_RINDEX_LOCKSPACE: 'CORRUPT_METADATA',
  SANLK_RINDEX_OFFSET: 'INVALID_ARGUMENT',
  SANLK_RINDEX_DIFF: 'CORRUPT_METADATA',
  SANLK_ADDLS_SIZES: 'INVALID_ARGUMENT',
  SANLK_ADDLS_INVALID_HOSTID: 'INVALID_ARGUMENT',
  SANLK_ACQUIRE_LVER: 'LOCK_VERSION_MISMATCH',
  SANLK_RELEASE_LVER: 'LOCK_VERSION_MISMATCH',
  SANLK_REQUEST_LVER: 'LOCK_VERSION_MISMATCH',
  SANLK_DBLOCK_LVER: 'LOCK_VERSION_MISMATCH',
  SANLK_ACQUIRE_LOCKSPACE: 'LOCKSPACE_NOT_JOINED',
  SANLK_ACQUIRE_IDDISK: 'LOCKSPACE_NOT_JOINED',
  SANLK_ACQUIRE_IDLIVE: 'LOCK_HELD',
  SANLK_ACQUIRE_OWNED: 'LOCK_HELD',
  SANLK_ACQUIRE_OTHER: 'LOCK_HELD',
  SANLK_ACQUIRE_SHRETRY: 'LOCK_HELD',
  SANLK_ACQUIRE_OWNED_RETRY: 'LOCK_HELD',
  SANLK_DBLOCK_MBAL: 'LOCK_HELD',
  SANLK_RELEASE_OWNER: 'INVALID_STATE',
  SANLK_RENEW_OWNER: 'LOCK_HELD',
  SANLK_RENEW_DIFF: 'LOCK_HELD',
  SANLK_HOSTID_BUSY: 'HOST_ID_IN_USE',
};

// -errno values with a meaning of their own in sanlock's answers.
const ERRNO_CODES: Readonly<Record<string, MooringErrorCode>> = {
  ECONNREFUSED: 'SANLOCK_DAEMON_UNAVAILABLE',
  ENOTCONN: 'SANLOCK_DAEMON_UNAVAILABLE',
  ECONNRESET: 'SANLOCK_DAEMON_UNAVAILABLE',
  EPIPE: 'SANLOCK_DAEMON_UNAVAILABLE',
  EAGAIN: 'BUSY',
  EINPROGRESS: 'BUSY',
};

/** The name of a sanlock return value: `SANLK_ACQUIRE_IDLIVE`, `-EEXIST`, `OK`. */
export function sanlockRvName(rv: number): string {
  if (rv >= 0) return 'OK';
  const own = SANLOCK_RV_NAMES[rv];
  if (own) return own;
  for (const [name, value] of Object.entries(osConstants.errno)) if (value === -rv) return `-${name}`;
  return `rv ${rv}`;
}

/**
 * The {@link MooringErrorCode} of a failed sanlock call (rv < 0).
 *
 * @param rv - sanlock's return value
 * @param op - the call, for the operation-specific meanings of some errnos
 */
export function sanlockErrorCode(rv: number, op?: string): MooringErrorCode {
  const own = SANLOCK_RV_NAMES[rv];
  if (own) return SANLOCK_RV_CODES[own] ?? 'IO_ERROR';
  const name = sanlockRvName(rv).slice(1);
  // The daemon's socket is missing: no daemon (ENOENT on connect means the same).
  if (op === 'connect' && name === 'ENOENT') return 'SANLOCK_DAEMON_UNAVAILABLE';
  // A call about a lockspace this host has not joined.
  if (name === 'ENOENT' && (op === 'getHosts' || op === 'inqLockspace' || op === 'remLockspace' || op === 'createResource'))
    return 'LOCKSPACE_NOT_JOINED';
  // acquire: another process of this host holds the lease (or this one already does).
  if (name === 'EEXIST' && op === 'acquire') return 'LOCK_HELD';
  const mapped = ERRNO_CODES[name];
  return mapped ?? codeFromErrno(rv);
}

/**
 * A {@link MooringError} for a failed sanlock call: `details.sanlock` is sanlock's name of
 * rv, `details.rv` the number, `details.op` the call.
 *
 * @param rv - sanlock's return value (< 0)
 * @param op - the call (`acquire`, `addLockspace`...)
 * @param what - the object concerned, for the message (`lock disk1 in ls1`)
 * @param details - more facts for `details`
 */
export function sanlockError(rv: number, op: string, what: string, details: Record<string, unknown> = {}): MooringError {
  const name = sanlockRvName(rv);
  const code = sanlockErrorCode(rv, op);
  const hint = HINTS[code] ? `: ${HINTS[code]}` : '';
  const errno = rv > -200 && rv < 0 ? -rv : undefined;
  return new MooringError(code, `${op} ${what}: sanlock ${name} (${rv})${hint}`, {
    ...(errno === undefined ? {} : { errno }),
    details: { ...details, sanlock: name, rv, op },
  });
}

const HINTS: Partial<Record<MooringErrorCode, string>> = {
  SANLOCK_DAEMON_UNAVAILABLE: 'is the sanlock daemon running (and SANLOCK_RUN_DIR pointing at its socket)?',
  LOCK_HELD: 'the lock is held by another process or host',
  LOCK_VERSION_MISMATCH: 'the lease version changed: another host acquired it in between',
  HOST_ID_IN_USE: 'another live host holds this host id',
  LOCKSPACE_NOT_JOINED: 'this host has not joined the lockspace',
  CORRUPT_METADATA: 'the lease area is not initialised or holds something else',
};
