/**
 * The document a cluster keeps per backing image (Longhorn's BackingImage object) in its
 * {@link StateStore}: spec (source, expected checksum, minCopies, which disks should hold a
 * file) and status (current checksum, size, format, per-disk file states). One disk per
 * host: a data engine's directory is its disk. Validated on read, like the cluster records:
 * a store may be shared and is treated as untrusted.
 *
 * @packageDocumentation
 */
import type { BackingImageFileState } from '../data-engine/data-engine.js';
import { RecordFields } from '../state/record-fields.js';
import { NAME_PATTERN, REPLICA_COUNT_MAX, VOLUME_SIZE_MAX_BYTES } from '../util/limits.js';

/** Schema of backing image documents (their own kind: volumes and replicas keep schema 2). */
export const BACKING_IMAGE_SCHEMA_VERSION = 1;
/** Store kind of backing image documents. Key: the image name. */
export const BACKING_IMAGE_KIND = 'backing-image';
/** Longest download URL accepted. */
export const BACKING_IMAGE_URL_LENGTH_MAX = 2048;
/** Longest per-disk message kept (a data engine's error text). */
export const BACKING_IMAGE_MESSAGE_LENGTH_MAX = 1024;
/** Copies an image may be asked to keep ready (the most hosts a volume spans). */
export const BACKING_IMAGE_MIN_COPIES_MAX = REPLICA_COUNT_MAX;
/** Disks recorded per image (a bound for hostile documents). */
export const BACKING_IMAGE_DISKS_MAX = 1024;
/** A SHA-512 in hex. */
export const SHA512_PATTERN = /^[0-9a-f]{128}$/;
const UUID_PATTERN = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/**
 * Where the first file of an image comes from, told apart by `type`: `download` (`url`),
 * `upload` (`sizeBytes`) or `volume-snapshot` (`volume`, `snapshot`).
 */
export type BackingImageSource =
  /** Downloaded over http(s) by the data engine of the first host. */
  | { type: 'download'; url: string }
  /** Streamed in by the embedder ({@link BackingImage.upload}); `sizeBytes` declared up front. */
  | { type: 'upload'; sizeBytes: number }
  /** Exported from a snapshot of a volume of the cluster, on the host whose engine writes it. */
  | { type: 'volume-snapshot'; volume: string; snapshot: string };

/** One disk's file as last seen. */
export interface BackingImageDiskStatus {
  /** pending/starting/in-progress/ready/failed as the data engine reports; unknown when its host cannot be reached. */
  state: BackingImageFileState;
  /** Percent done (0..100). */
  progress: number;
  /** Why it failed, or what it is doing; '' if nothing to say. */
  message: string;
  /** Bytes on the disk so far: a copy resumes from here. */
  receivedBytes: number;
  /** Since when no replica on this disk uses the file (ms since the epoch), or null while one does (or never checked). */
  lastRefAtMs: number | null;
}

/** A backing image: spec and status. Key: its name. */
export interface BackingImageRecord {
  /** Schema version of the document. */
  schema: number;
  /** The image's name. */
  name: string;
  /** Generated at creation and stored before anything else: its files live in `<name>-<uuid>`. */
  uuid: string;
  /** When it was created, ms since the Unix epoch. */
  createdMs: number;
  /** Where its first file comes from. */
  source: BackingImageSource;
  /** SHA-512 the file must have (hex), or null to take what the source gives. */
  expectedChecksum: string | null;
  /** Ready copies to keep across disks (cleanup never goes below it). */
  minCopies: number;
  /** Host that prepares the first file. */
  firstHost: string;
  /** Spec: hosts whose disk should hold a file. */
  disks: string[];
  /** Preparations of the first file so far (a download is retried while every file failed). */
  sourceAttempts: number;
  /** The embedder cancelled: no automatic retry of the first file. */
  cancelled: boolean;
  /** Status: SHA-512 of the first ready file ('' until one is ready). Copies must match it. */
  currentChecksum: string;
  /** Status: the file's size in bytes (0 until known). */
  sizeBytes: number;
  /** Status: the size of the disk the image holds (0 until ready). */
  virtualSizeBytes: number;
  /** Status: the file's format, null until ready. */
  format: 'raw' | 'qcow2' | null;
  /** Status: the file on each host's disk. */
  files: Record<string, BackingImageDiskStatus>;
}

const FILE_STATES: readonly BackingImageFileState[] = ['pending', 'starting', 'in-progress', 'ready', 'failed', 'unknown'];

/** Checks a download URL: http or https, bounded, parseable. */
export function isDownloadUrl(url: unknown): url is string {
  if (typeof url !== 'string' || url.length > BACKING_IMAGE_URL_LENGTH_MAX) return false;
  try {
    const u = new URL(url);
    return u.protocol === 'http:' || u.protocol === 'https:';
  } catch {
    return false;
  }
}

function parseSource(f: RecordFields): BackingImageSource {
  switch (f.raw('type')) {
    case 'download': {
      const url = f.raw('url');
      if (!isDownloadUrl(url)) f.fail('source.url is not an http(s) URL');
      return { type: 'download', url };
    }
    case 'upload':
      return { type: 'upload', sizeBytes: f.int('sizeBytes', 1, VOLUME_SIZE_MAX_BYTES) };
    case 'volume-snapshot':
      return { type: 'volume-snapshot', volume: f.str('volume', NAME_PATTERN), snapshot: f.str('snapshot', NAME_PATTERN) };
    default:
      return f.fail('source.type is not download, upload or volume-snapshot');
  }
}

/** @internal */
export function parseBackingImageRecord(v: unknown, key: string): BackingImageRecord {
  const f: RecordFields = new RecordFields(BACKING_IMAGE_KIND, key, v);
  const schema = f.int('schema', 1, Number.MAX_SAFE_INTEGER);
  if (schema > BACKING_IMAGE_SCHEMA_VERSION) f.fail(`schema ${schema} is newer than this release understands (${BACKING_IMAGE_SCHEMA_VERSION})`);
  const disks = f.list('disks', BACKING_IMAGE_DISKS_MAX);
  if (!disks.every((d) => typeof d === 'string' && NAME_PATTERN.test(d))) f.fail('disks is not a list of host ids');
  const filesOf = f.obj('files');
  const files: Record<string, BackingImageDiskStatus> = {};
  for (const host of f.mapKeys('files', BACKING_IMAGE_DISKS_MAX, NAME_PATTERN)) {
    const d = filesOf.obj(host);
    const message = d.raw('message');
    files[host] = {
      state: d.oneOf('state', FILE_STATES),
      progress: d.int('progress', 0, 100),
      message: typeof message === 'string' ? message.slice(0, BACKING_IMAGE_MESSAGE_LENGTH_MAX) : '',
      receivedBytes: d.int('receivedBytes', 0, Number.MAX_SAFE_INTEGER),
      lastRefAtMs: d.optInt('lastRefAtMs', 0, Number.MAX_SAFE_INTEGER),
    };
  }
  const expected = f.raw('expectedChecksum');
  if (expected !== null && (typeof expected !== 'string' || !SHA512_PATTERN.test(expected))) f.fail('expectedChecksum is not a SHA-512 or null');
  const current = f.raw('currentChecksum');
  if (current !== '' && (typeof current !== 'string' || !SHA512_PATTERN.test(current))) f.fail('currentChecksum is not a SHA-512 or empty');
  const format = f.raw('format');
  if (format !== null && format !== 'raw' && format !== 'qcow2') f.fail('format is not raw, qcow2 or null');
  const r: BackingImageRecord = {
    schema,
    name: f.str('name', NAME_PATTERN),
    uuid: f.str('uuid', UUID_PATTERN),
    createdMs: f.int('createdMs', 0, Number.MAX_SAFE_INTEGER),
    source: parseSource(f.obj('source')),
    expectedChecksum: expected as string | null,
    minCopies: f.int('minCopies', 1, BACKING_IMAGE_MIN_COPIES_MAX),
    firstHost: f.str('firstHost', NAME_PATTERN),
    disks: [...new Set(disks as string[])],
    sourceAttempts: f.int('sourceAttempts', 0, Number.MAX_SAFE_INTEGER),
    cancelled: f.raw('cancelled') === true,
    currentChecksum: current as string,
    sizeBytes: f.int('sizeBytes', 0, Number.MAX_SAFE_INTEGER),
    virtualSizeBytes: f.int('virtualSizeBytes', 0, Number.MAX_SAFE_INTEGER),
    format,
    files,
  };
  if (r.name !== key) f.fail(`name ${r.name} does not match its key`);
  return r;
}
