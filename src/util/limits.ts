/**
 * Named limits of volumes, names, labels and I/O, re-exported in the package's `limits`
 * object (src/limits.ts) and grouped in docs/api.md.
 */

/** Volumes, offsets and lengths are multiples of this for sizes (I/O may be unaligned). */
export const BLOCK_SIZE_BYTES = 4096;

/**
 * Largest volume size: the largest multiple of 4096 that a JavaScript number holds exactly
 * (2^53 - 4096). The filesystem under the replicas may allow less (ext4: 16 TiB per file);
 * creating a replica beyond that fails with a coded error from the native store.
 */
export const VOLUME_SIZE_MAX_BYTES = 2 ** 53 - BLOCK_SIZE_BYTES;

/** Replica count bounds of one volume. */
export const REPLICA_COUNT_MIN = 1;
/** Replica count bounds of one volume. */
export const REPLICA_COUNT_MAX = 16;

/**
 * How long a request may wait for a replica-set change that lacks a majority
 * (`quorumHoldMs`): default and largest setting (docs/single-writer.md).
 */
export const QUORUM_HOLD_MS_DEFAULT = 15_000;
/** Largest `quorumHoldMs`. */
export const QUORUM_HOLD_MS_MAX = 600_000;

/** Largest single read or write through the library (32 MiB, the native cap); trim, writeZeroes and blockStatus take any length. */
export const IO_LENGTH_MAX_BYTES = 32 * 1024 * 1024;

/** Names of volumes, snapshots and replicas. */
export const NAME_PATTERN = /^[A-Za-z0-9._-]{1,63}$/;
/** Longest name (see {@link NAME_PATTERN}). */
export const NAME_LENGTH_MAX = 63;

/** Labels per snapshot. */
export const LABEL_COUNT_MAX = 64;
/** Label keys: like names, plus '/' for prefixes (e.g. `example.com/owner`). */
export const LABEL_KEY_PATTERN = /^[A-Za-z0-9._/-]{1,128}$/;
/** Longest label value, in characters. */
export const LABEL_VALUE_LENGTH_MAX = 512;

/** Largest volume.json accepted when reading (hostile files may be huge). */
export const VOLUME_SPEC_BYTES_MAX = 1024 * 1024;

/** sun_path of a unix socket holds 108 bytes including the terminating NUL. */
export const UNIX_SOCKET_PATH_BYTES_MAX = 107;

/** NBD export names (the protocol allows 4096 bytes; we keep them short and printable). */
export const EXPORT_NAME_LENGTH_MAX = 255;

/** UUIDs the library generates and accepts (volumes, backing images): lowercase, 8-4-4-4-12 hex. */
export const UUID_PATTERN = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
