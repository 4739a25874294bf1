/**
 * volume.json: the control plane's record of a volume directory.
 *
 *   DIR/volume.json      this file (atomic writes, invariant 4)
 *   DIR/replicas/r0..    native replica directories
 *
 * The file is untrusted input when read (invariant 5): every field is checked, and paths
 * may not leave DIR.
 */
import { randomUUID } from 'node:crypto';
import { join, relative, resolve, sep } from 'node:path';

import type { ReplicaMode } from '../engine/engine.js';
import { MooringError, type MooringErrorCode } from '../errors.js';
import { writeFileAtomic, readFileLimited } from '../util/files.js';
import { REPLICA_COUNT_MAX, REPLICA_COUNT_MIN, UUID_PATTERN, VOLUME_SPEC_BYTES_MAX } from '../util/limits.js';
import { checkName, checkReplicaCount, checkVolumeSize, describe } from '../util/validate.js';

/** The `format` value of every volume.json. */
export const VOLUME_SPEC_FORMAT = 'mooring-volume';
/** The schema version this release writes and reads. Newer versions are refused (UNSUPPORTED). */
export const VOLUME_SPEC_VERSION = 1;
/** The file name inside the volume directory. */
export const VOLUME_SPEC_FILE = 'volume.json';
/** Where replica directories live inside the volume directory. */
export const REPLICAS_SUBDIR = 'replicas';

/** The last failure recorded for a replica. */
export interface ReplicaErrorRecord {
  /** errno (positive). */
  errno: number;
  /** The MooringErrorCode it maps to. */
  code: string;
  /** Message from the engine. */
  message: string;
  /** When it was recorded (ms since the epoch). */
  atMs: number;
}

/** One replica as recorded in volume.json. */
export interface ReplicaSpec {
  /** Id within the volume: `r0`, `r1`, ... */
  id: string;
  /** Directory relative to the volume directory, e.g. `replicas/r0`. Never leaves it. */
  path: string;
  /** Last mode the engine reported (ERR replicas are stale until rebuilt). */
  mode: ReplicaMode;
  /** Reserved for remote replicas (a later release): `host:port` of a replica server. */
  address?: string;
  /** The failure that made it ERR, if any. */
  lastError?: ReplicaErrorRecord;
}

/** The content of volume.json. */
export interface VolumeSpec {
  /** Always {@link VOLUME_SPEC_FORMAT}. */
  format: typeof VOLUME_SPEC_FORMAT;
  /** Schema version, {@link VOLUME_SPEC_VERSION}. */
  version: number;
  /** Volume name ([A-Za-z0-9._-]{1,63}). */
  name: string;
  /** Random UUID given at creation. */
  uuid: string;
  /** Size in bytes. */
  sizeBytes: number;
  /** The replicas, 1 to 16. */
  replicas: ReplicaSpec[];
  /** Creation time, ms since the epoch. */
  createdMs: number;
  /**
   * The last writer epoch allocated to an engine of this volume (docs/single-writer.md):
   * `Volume.open` allocates the next one above it and above every epoch the replicas
   * promised, and writes it here, under the volume's lock, before the engine claims it.
   * Absent in volume.json files of releases before allocated epochs (read as 0).
   */
  lastEpoch?: number;
}

const PATH_SEGMENT_PATTERN = /^[A-Za-z0-9._-]{1,63}$/;
const RELATIVE_PATH_LENGTH_MAX = 255;
const MESSAGE_LENGTH_MAX = 4096;
const MODES: readonly ReplicaMode[] = ['RW', 'WO', 'ERR'];

/**
 * A path relative to the volume directory that cannot leave it: segments of
 * [A-Za-z0-9._-], none "." or "..", no leading "/", at most 255 characters.
 */
export function checkRelativePath(what: string, value: unknown, code: MooringErrorCode): string {
  const ok =
    typeof value === 'string' &&
    value.length > 0 &&
    value.length <= RELATIVE_PATH_LENGTH_MAX &&
    value.split('/').every((seg) => PATH_SEGMENT_PATTERN.test(seg) && seg !== '.' && seg !== '..');
  if (!ok) {
    throw new MooringError(code, `${what} must be a relative path inside the volume directory without "." or ".." segments (got ${describe(value)})`, {
      details: { what, value },
    });
  }
  return value;
}

/** Absolute path of a replica directory, checked to stay inside `dir`. */
export function replicaDir(dir: string, replica: Pick<ReplicaSpec, 'id' | 'path'>): string {
  const root = resolve(dir);
  const full = resolve(root, replica.path);
  const rel = relative(root, full);
  if (rel === '' || rel.startsWith('..') || rel.split(sep).includes('..')) {
    throw new MooringError('CORRUPT_METADATA', `replica ${replica.id} path ${describe(replica.path)} leaves ${root}`);
  }
  return full;
}

function fail(code: MooringErrorCode, source: string, why: string): MooringError {
  return new MooringError(code, `${source}: ${why}`, { details: { source } });
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function checkReplica(value: unknown, i: number, code: MooringErrorCode, source: string): ReplicaSpec {
  if (!isRecord(value)) throw fail(code, source, `replicas[${i}] must be an object`);
  const id = checkName(`${source}: replicas[${i}].id`, value.id, code);
  const path = checkRelativePath(`${source}: replicas[${i}].path`, value.path, code);
  if (typeof value.mode !== 'string' || !MODES.includes(value.mode as ReplicaMode)) {
    throw fail(code, source, `replicas[${i}].mode must be one of ${MODES.join(', ')} (got ${describe(value.mode)})`);
  }
  const out: ReplicaSpec = { id, path, mode: value.mode as ReplicaMode };
  if (value.address !== undefined) {
    if (typeof value.address !== 'string' || value.address.length === 0 || value.address.length > 255) {
      throw fail(code, source, `replicas[${i}].address must be a host:port string`);
    }
    out.address = value.address;
  }
  if (value.lastError !== undefined) {
    const e = value.lastError;
    if (
      !isRecord(e) ||
      typeof e.errno !== 'number' ||
      !Number.isInteger(e.errno) ||
      e.errno < 0 ||
      typeof e.code !== 'string' ||
      e.code.length > 64 ||
      typeof e.message !== 'string' ||
      e.message.length > MESSAGE_LENGTH_MAX ||
      typeof e.atMs !== 'number' ||
      !Number.isSafeInteger(e.atMs)
    ) {
      throw fail(code, source, `replicas[${i}].lastError is malformed`);
    }
    out.lastError = { errno: e.errno, code: e.code, message: e.message, atMs: e.atMs };
  }
  return out;
}

/**
 * Checks a parsed volume.json (or a spec built by the API) field by field.
 *
 * @param code - CORRUPT_METADATA for stored files, INVALID_ARGUMENT for API input
 * @param source - names the file or caller in messages
 */
export function validateVolumeSpec(value: unknown, code: MooringErrorCode, source: string): VolumeSpec {
  if (!isRecord(value)) throw fail(code, source, 'must be a JSON object');
  if (value.format !== VOLUME_SPEC_FORMAT) {
    throw fail(code, source, `format must be ${JSON.stringify(VOLUME_SPEC_FORMAT)} (got ${describe(value.format)})`);
  }
  if (typeof value.version !== 'number' || !Number.isInteger(value.version) || value.version < 1) {
    throw fail(code, source, `version must be a positive integer (got ${describe(value.version)})`);
  }
  if (value.version > VOLUME_SPEC_VERSION) {
    throw fail('UNSUPPORTED', source, `schema version ${value.version} is newer than this release reads (${VOLUME_SPEC_VERSION}); upgrade mooring`);
  }
  const name = checkName(`${source}: name`, value.name, code);
  if (typeof value.uuid !== 'string' || !UUID_PATTERN.test(value.uuid)) {
    throw fail(code, source, `uuid must be a lowercase UUID (got ${describe(value.uuid)})`);
  }
  let sizeBytes: number;
  try {
    sizeBytes = checkVolumeSize(value.sizeBytes, code);
  } catch (err) {
    throw fail(code, source, (err as Error).message);
  }
  if (!Array.isArray(value.replicas) || value.replicas.length < REPLICA_COUNT_MIN || value.replicas.length > REPLICA_COUNT_MAX) {
    throw fail(code, source, `replicas must be an array of ${REPLICA_COUNT_MIN}..${REPLICA_COUNT_MAX} entries`);
  }
  const replicas = value.replicas.map((r, i) => checkReplica(r, i, code, source));
  const ids = new Set(replicas.map((r) => r.id));
  const paths = new Set(replicas.map((r) => r.path));
  if (ids.size !== replicas.length) throw fail(code, source, 'replica ids must be unique');
  if (paths.size !== replicas.length) throw fail(code, source, 'replica paths must be unique');
  // No replica directory may contain another (one would see the other's files as its own).
  for (const a of replicas) {
    for (const b of replicas) {
      if (a !== b && b.path.startsWith(`${a.path}/`)) throw fail(code, source, `replica path ${b.path} lies inside ${a.path}`);
    }
  }
  if (typeof value.createdMs !== 'number' || !Number.isSafeInteger(value.createdMs) || value.createdMs < 0) {
    throw fail(code, source, `createdMs must be a non-negative integer (got ${describe(value.createdMs)})`);
  }
  const spec: VolumeSpec = { format: VOLUME_SPEC_FORMAT, version: value.version, name, uuid: value.uuid, sizeBytes, replicas, createdMs: value.createdMs };
  if (value.lastEpoch !== undefined) {
    if (typeof value.lastEpoch !== 'number' || !Number.isSafeInteger(value.lastEpoch) || value.lastEpoch < 0) {
      throw fail(code, source, `lastEpoch must be a non-negative integer (got ${describe(value.lastEpoch)})`);
    }
    spec.lastEpoch = value.lastEpoch;
  }
  return spec;
}

/** Parses and validates volume.json text; anything wrong is CORRUPT_METADATA. */
export function parseVolumeSpec(text: string, source: string): VolumeSpec {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new MooringError('CORRUPT_METADATA', `${source}: not valid JSON (${(err as Error).message})`, { cause: err });
  }
  return validateVolumeSpec(parsed, 'CORRUPT_METADATA', source);
}

/** A new spec for `replicas` replicas under `replicas/r<i>`. */
export function newVolumeSpec(name: string, sizeBytes: number, replicas: number, nowMs = Date.now()): VolumeSpec {
  checkName('volume name', name);
  checkVolumeSize(sizeBytes);
  checkReplicaCount(replicas);
  return {
    format: VOLUME_SPEC_FORMAT,
    version: VOLUME_SPEC_VERSION,
    name,
    uuid: randomUUID(),
    sizeBytes,
    replicas: Array.from({ length: replicas }, (_, i) => ({ id: `r${i}`, path: `${REPLICAS_SUBDIR}/r${i}`, mode: 'RW' as const })),
    createdMs: nowMs,
  };
}

/** Reads and validates DIR/volume.json. */
export async function readVolumeSpec(dir: string): Promise<VolumeSpec> {
  const file = join(dir, VOLUME_SPEC_FILE);
  const text = await readFileLimited(file, VOLUME_SPEC_BYTES_MAX, 'CORRUPT_METADATA');
  return parseVolumeSpec(text, file);
}

/** Writes DIR/volume.json atomically and durably. */
export async function writeVolumeSpec(dir: string, spec: VolumeSpec): Promise<void> {
  const file = join(dir, VOLUME_SPEC_FILE);
  // Validate what we write too: a bug here must not produce a file we then refuse to open.
  validateVolumeSpec(spec, 'INVALID_ARGUMENT', file);
  await writeFileAtomic(file, `${JSON.stringify(spec, null, 2)}\n`);
}
