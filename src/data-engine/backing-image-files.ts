/**
 * BackingImageFiles: the backing image files on one data engine's disk (Longhorn's
 * BackingImageManager and data source, per disk). Layout:
 *
 * ```
 * DIR/backing-images/<name>-<uuid>/image       the complete, verified file (read-only)
 * DIR/backing-images/<name>-<uuid>/image.part  being prepared; kept for a resume
 * DIR/backing-images/<name>-<uuid>/file.json   name, uuid, sizes, checksum, format, state, message
 * ```
 *
 * A file is prepared by a download, a stream of its bytes (an upload or a copy from another
 * data engine) or a snapshot export; each ends with the same adoption: SHA-512 compared with
 * the expected one, the image opened by the native reader (format, virtual size), then
 * `image.part` renamed to `image`. States: pending → starting → in-progress → ready | failed.
 * docs/data-engine.md, "Backing image files".
 */
import { open, readdir, rename, rm, truncate, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';

import { checkDownloadSettings, checkDownloadUrl, download, partialSize, type DownloadSettings } from '../backing-image/download.js';
import { checkChecksum, hashFileInto, newSha512 } from '../backing-image/sha512.js';
import { MooringError, toMooringError, type MooringErrorCode } from '../errors.js';
import { openImage } from '../image/image-reader.js';
import type { NativeAddon } from '../native/binding.js';
import { PRIVATE_FILE_MODE, ensureDirectory, pathExists, readFileLimited, syncDirectory, writeFileAtomic } from '../util/files.js';
import { UUID_PATTERN, VOLUME_SIZE_MAX_BYTES } from '../util/limits.js';
import { checkIntIn, checkName, checkUuid, describe } from '../util/validate.js';
import type {
  BackingImageDownloadOptions,
  BackingImageFileInfo,
  BackingImageFileRef,
  BackingImageFileState,
  BackingImageWriteOptions,
  DataEngineEvent,
  SnapshotCopyResult,
} from './data-engine.js';

/** Subdirectory of a data engine's DIR holding the backing image files. */
export const BACKING_IMAGES_SUBDIR = 'backing-images';
/** The verified file in an image's directory. */
export const BACKING_IMAGE_FILE = 'image';
/** The file being prepared. */
export const BACKING_IMAGE_PART_FILE = 'image.part';
/** The record of an image's directory. */
export const BACKING_IMAGE_RECORD_FILE = 'file.json';
const RECORD_SCHEMA = 'mooring-backing-image-file';

/** Limits of backing image files on one disk. */
export const BACKING_IMAGE_FILE_LIMITS = {
  /** Reads (sends to other disks) of one file at once (as Longhorn: at most 3 sends per source file); more get BUSY. */
  readsPerFileMax: 3,
  /** Size of each chunk {@link DataEngine.readBackingImageFile} yields (also the gRPC data message). */
  readChunkBytes: 1024 * 1024,
  /** Most bytes queued for the disk while a write is in flight (then the stream waits). */
  writeBatchBytesMax: 8 * 1024 * 1024,
  /** Progress events at most every 1 % ... */
  progressStepPercent: 1,
  /** ... or every 250 ms, whichever comes first. */
  progressIntervalMs: 250,
  /** Largest file.json read (hostile files may be huge). */
  recordBytesMax: 64 * 1024,
  /** Longest message kept in file.json and events. */
  messageLengthMax: 4096,
  /** Image directories listed on one disk; a disk with more is refused. */
  filesMax: 10_000,
} as const;

/** Options of {@link BackingImageFiles.open}. */
export interface BackingImageFilesOptions {
  /** The data engine's directory (files live under `DIR/backing-images`). */
  dir: string;
  /** The addon whose image reader checks finished files. */
  addon: NativeAddon;
  /** Where 'backing-image-file' events go (the data engine's watchers). */
  emit: (event: DataEngineEvent) => void;
  /** Replicas on this disk by the image directory (`<name>-<uuid>`) their chain reads. */
  usedBy: () => Promise<Map<string, string[]>>;
  /** Exports a snapshot of a volume whose engine runs here into a new raw file at `path`. */
  exportSnapshot: (volume: string, snapshot: string, path: string) => Promise<SnapshotCopyResult>;
  /** Download timing for every download (per-call startTimeoutMs and retries override). */
  download?: DownloadSettings;
}

interface FileRecord {
  name: string;
  uuid: string;
  /** `<name>-<uuid>`. */
  key: string;
  /** Absolute directory. */
  dir: string;
  state: BackingImageFileState;
  message: string;
  sizeBytes: number;
  receivedBytes: number;
  checksum: string;
  expectedChecksum: string;
  format: 'raw' | 'qcow2' | null;
  virtualSizeBytes: number;
  progress: number;
  /** A preparation (or a verification) in progress. */
  job?: { abort: AbortController; done: Promise<unknown> };
  readers: number;
  deleting: boolean;
  lastProgressMs: number;
  /** The last file.json write: writes are chained so the last state set is the one on disk. */
  persisted: Promise<void>;
}

/** A record of a file nothing is known of yet but its state and the bytes on disk. */
function newFileRecord(ref: BackingImageFileRef, key: string, dir: string, state: BackingImageFileState, receivedBytes: number): FileRecord {
  return {
    name: ref.name,
    uuid: ref.uuid,
    key,
    dir,
    state,
    message: '',
    sizeBytes: 0,
    receivedBytes,
    checksum: '',
    expectedChecksum: '',
    format: null,
    virtualSizeBytes: 0,
    progress: 0,
    readers: 0,
    deleting: false,
    lastProgressMs: 0,
    persisted: Promise.resolve(),
  };
}

/** The stored form of {@link FileRecord} (file.json). */
interface StoredRecord {
  schema: typeof RECORD_SCHEMA;
  schemaVersion: 1;
  name: string;
  uuid: string;
  sizeBytes: number;
  checksum: string;
  expectedChecksum: string;
  format: 'raw' | 'qcow2' | null;
  virtualSizeBytes: number;
  state: BackingImageFileState;
  message: string;
}

const STATES: ReadonlySet<string> = new Set(['pending', 'starting', 'in-progress', 'ready', 'failed', 'unknown']);

/** The backing image files of one disk; see the module comment. */
export class BackingImageFiles {
  /** `DIR/backing-images`. */
  readonly root: string;
  readonly #o: BackingImageFilesOptions;
  readonly #files = new Map<string, FileRecord>();
  /** Refs with a preparation being set up or running, each with its claim's token. */
  readonly #claimed = new Map<string, object>();
  /** Ready files found at open, verified one at a time in the background. */
  #verifying: Promise<void> = Promise.resolve();
  #closed = false;

  private constructor(options: BackingImageFilesOptions) {
    this.#o = options;
    this.root = join(options.dir, BACKING_IMAGES_SUBDIR);
  }

  /**
   * Opens the files of a disk: reads every image directory in `DIR/backing-images` (made on
   * the first preparation), and starts verifying the files recorded ready (their checksum is computed again, one
   * file at a time, before they report ready). A partial file reports `failed` with its
   * `receivedBytes`, ready to be resumed.
   */
  static async open(options: BackingImageFilesOptions): Promise<BackingImageFiles> {
    const self = new BackingImageFiles(options);
    if (await pathExists(self.root)) await self.#load();
    return self;
  }

  /** The files on this disk, by name then uuid. */
  async list(): Promise<BackingImageFileInfo[]> {
    this.#assertOpen();
    const used = await this.#o.usedBy();
    return [...this.#files.values()]
      .filter((r) => !r.deleting)
      .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))
      .map((r) => this.#info(r, used.get(r.key) ?? []));
  }

  /** One file, or null. */
  async get(ref: BackingImageFileRef): Promise<BackingImageFileInfo | null> {
    this.#assertOpen();
    const key = checkRef(ref);
    const r = this.#files.get(key);
    if (!r || r.deleting) return null;
    return this.#info(r, (await this.#o.usedBy()).get(key) ?? []);
  }

  /** Whether the file of `dir` (`<name>-<uuid>`) is ready on this disk (for replica creation). */
  readyFile(dir: string): { path: string; format: 'raw' | 'qcow2'; virtualSizeBytes: number } | null {
    const r = this.#files.get(dir);
    if (!r || r.deleting || r.state !== 'ready' || r.format === null) return null;
    return { path: join(r.dir, BACKING_IMAGE_FILE), format: r.format, virtualSizeBytes: r.virtualSizeBytes };
  }

  /** Whether any record exists for `dir` (any state). */
  has(dir: string): boolean {
    const r = this.#files.get(dir);
    return r !== undefined && !r.deleting;
  }

  /** @see DataEngine.downloadBackingImageFile */
  async download(ref: BackingImageFileRef, options: BackingImageDownloadOptions): Promise<BackingImageFileInfo> {
    this.#assertOpen();
    const key = checkRef(ref);
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `download options must be an object (got ${describe(options)})`);
    // Validated before anything changes on disk.
    checkDownloadUrl(options.url);
    const expected = checkChecksum('expectedChecksum', options.expectedChecksum);
    const settings = checkDownloadSettings({
      ...this.#o.download,
      ...(options.startTimeoutMs !== undefined ? { startTimeoutMs: options.startTimeoutMs } : {}),
      ...(options.retries !== undefined ? { retries: options.retries } : {}),
    });
    return this.#prepare(ref, key, expected, undefined, async (r, signal) => {
      const res = await download({
        ...settings,
        url: options.url,
        path: join(r.dir, BACKING_IMAGE_PART_FILE),
        signal,
        onStart: () => {
          if (r.state === 'starting') void this.#setState(r, 'in-progress', `downloading ${options.url}`).catch(() => undefined);
        },
        onProgress: (received, total) => {
          if (total > 0 && r.sizeBytes !== total) r.sizeBytes = total;
          this.#progress(r, received);
        },
      });
      return { sizeBytes: res.sizeBytes, checksum: res.checksum };
    });
  }

  /** @see DataEngine.writeBackingImageFile */
  async write(ref: BackingImageFileRef, options: BackingImageWriteOptions, data: AsyncIterable<Uint8Array>): Promise<BackingImageFileInfo> {
    this.#assertOpen();
    const key = checkRef(ref);
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `write options must be an object (got ${describe(options)})`);
    const sizeBytes = options.sizeBytes;
    if (typeof sizeBytes !== 'number' || !Number.isSafeInteger(sizeBytes) || sizeBytes <= 0 || sizeBytes > VOLUME_SIZE_MAX_BYTES) {
      throw new MooringError('INVALID_ARGUMENT', `sizeBytes must be an integer in 1..${VOLUME_SIZE_MAX_BYTES} (got ${describe(sizeBytes)})`);
    }
    const offset = checkIntIn('offset', options.offset, 0, sizeBytes, 0);
    const expected = checkChecksum('expectedChecksum', options.expectedChecksum);
    if (data === null || typeof data !== 'object' || typeof (data as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] !== 'function') {
      throw new MooringError('INVALID_ARGUMENT', 'data must be an async iterable of Uint8Array chunks');
    }
    return this.#prepare(ref, key, expected, { sizeBytes, offset }, async (r, signal) => {
      const part = join(r.dir, BACKING_IMAGE_PART_FILE);
      const hash = newSha512();
      if (offset === 0) await truncateOrCreate(part);
      else await hashFileInto(part, hash, offset, signal);
      r.sizeBytes = sizeBytes;
      await this.#setState(r, 'in-progress', offset > 0 ? `receiving from byte ${offset}` : 'receiving');
      const fh = await open(part, 'a', PRIVATE_FILE_MODE).catch((err: unknown) => Promise.reject(toMooringError(err, `opening ${part}`)));
      let received = offset;
      // The disk write runs beside the hashing and the receiving: chunks that arrive while a
      // write is in flight are written together by the next one (one writev of at most
      // writeBatchBytesMax), so the file always grows by whole, contiguous batches. No fsync
      // until the end (the file is verified before it is used, and resumed from its size).
      const batch = new WriteBatch(fh);
      try {
        for await (const chunk of abortable(data, signal)) {
          if (!(chunk instanceof Uint8Array)) throw new MooringError('INVALID_ARGUMENT', `data chunks must be Uint8Array (got ${describe(chunk)})`);
          if (received + chunk.length > sizeBytes) {
            // Which bytes are wrong is unknown: the next attempt starts over.
            await batch.settle();
            await fh.truncate(0);
            throw new MooringError('INVALID_ARGUMENT', `the stream sent more than the ${sizeBytes} bytes declared`);
          }
          hash.update(chunk);
          await batch.add(chunk);
          received += chunk.length;
          this.#progress(r, received);
        }
        await batch.flush();
        if (received < sizeBytes) {
          throw new MooringError('UNAVAILABLE', `the stream ended after ${received} of ${sizeBytes} bytes; resume from offset ${received}`, {
            details: { receivedBytes: received },
          });
        }
        await fh.sync();
      } finally {
        await batch.settle();
        await fh.close().catch(() => undefined);
      }
      return { sizeBytes, checksum: hash.digest('hex') };
    });
  }

  /** @see DataEngine.exportSnapshotToBackingImageFile */
  async exportSnapshot(volume: string, snapshot: string, ref: BackingImageFileRef, options: { expectedChecksum?: string } = {}): Promise<BackingImageFileInfo> {
    this.#assertOpen();
    const key = checkRef(ref);
    checkName('volume', volume);
    checkName('snapshot name', snapshot);
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `options must be an object (got ${describe(options)})`);
    const expected = checkChecksum('expectedChecksum', options.expectedChecksum);
    return this.#prepare(ref, key, expected, undefined, async (r, signal) => {
      const part = join(r.dir, BACKING_IMAGE_PART_FILE);
      // The export writes a new file; a partial one of an earlier attempt cannot be resumed.
      await rm(part, { force: true });
      await this.#setState(r, 'in-progress', `exporting snapshot ${snapshot} of ${volume}`);
      const res = await this.#o.exportSnapshot(volume, snapshot, part);
      if (signal.aborted) throw new MooringError('CANCELLED', `export of ${volume}/${snapshot} was cancelled`);
      r.sizeBytes = res.sizeBytes;
      this.#progress(r, res.sizeBytes);
      const hash = newSha512();
      const n = await hashFileInto(part, hash, undefined, signal);
      return { sizeBytes: n, checksum: hash.digest('hex') };
    });
  }

  /** @see DataEngine.readBackingImageFile */
  async *read(ref: BackingImageFileRef, options: { offset?: number } = {}): AsyncGenerator<Uint8Array> {
    this.#assertOpen();
    const key = checkRef(ref);
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `read options must be an object (got ${describe(options)})`);
    const r = this.#files.get(key);
    if (!r || r.deleting) throw new MooringError('NOT_FOUND', `no backing image file ${key} on this disk`, { details: { name: ref.name, uuid: ref.uuid } });
    if (r.state !== 'ready') throw new MooringError('INVALID_STATE', `backing image file ${key} is ${r.state}, not ready`, { details: { state: r.state } });
    const offset = checkIntIn('offset', options.offset, 0, r.sizeBytes, 0);
    if (r.readers >= BACKING_IMAGE_FILE_LIMITS.readsPerFileMax) {
      throw new MooringError('BUSY', `backing image file ${key} is being read ${r.readers} times already (at most ${BACKING_IMAGE_FILE_LIMITS.readsPerFileMax})`);
    }
    r.readers++;
    const path = join(r.dir, BACKING_IMAGE_FILE);
    let fh;
    let ahead: Promise<Buffer> | undefined;
    try {
      fh = await open(path, 'r').catch((err: unknown) => Promise.reject(toMooringError(err, `opening ${path}`)));
      const file = fh;
      // One read ahead: the next chunk is read from the disk while the consumer sends this one.
      // A fresh buffer per chunk: the consumer may keep it (e.g. queued in a gRPC stream).
      const readAt = async (at: number): Promise<Buffer> => {
        const buf = Buffer.allocUnsafe(Math.min(BACKING_IMAGE_FILE_LIMITS.readChunkBytes, r.sizeBytes - at));
        const { bytesRead } = await file.read(buf, 0, buf.length, at);
        if (bytesRead === 0) throw new MooringError('IO_ERROR', `${path} ended at ${at} bytes, ${r.sizeBytes} recorded`);
        return bytesRead === buf.length ? buf : buf.subarray(0, bytesRead);
      };
      let at = offset;
      if (at < r.sizeBytes) ahead = readAt(at);
      while (ahead) {
        if (this.#closed) throw new MooringError('CLOSED', 'the data engine is closing');
        const chunk = await ahead;
        at += chunk.length;
        ahead = at < r.sizeBytes ? readAt(at) : undefined;
        yield chunk;
      }
    } finally {
      r.readers--;
      // A read still running is waited for before its file is closed.
      await ahead?.catch(() => undefined);
      await fh?.close().catch(() => undefined);
    }
  }

  /** @see DataEngine.cancelBackingImageFile */
  async cancel(ref: BackingImageFileRef): Promise<void> {
    this.#assertOpen();
    const r = this.#files.get(checkRef(ref));
    if (!r?.job) return;
    r.job.abort.abort();
    await r.job.done.catch(() => undefined);
  }

  /** @see DataEngine.deleteBackingImageFile */
  async delete(ref: BackingImageFileRef): Promise<void> {
    this.#assertOpen();
    const key = checkRef(ref);
    const r = this.#files.get(key);
    if (!r) {
      // A directory the records do not know (file.json lost): still ours to remove.
      await rm(join(this.root, key), { recursive: true, force: true }).catch((err: unknown) => Promise.reject(toMooringError(err, `deleting ${key}`)));
      return;
    }
    if (r.deleting) throw new MooringError('BUSY', `backing image file ${key} is being deleted`);
    // A preparation between its checks and its start cannot be cancelled yet.
    if (this.#claimed.has(key) && !r.job) throw new MooringError('BUSY', `backing image file ${key} is being set up for a preparation; try again`);
    const users = (await this.#o.usedBy()).get(key) ?? [];
    if (users.length > 0) {
      throw new MooringError('BUSY', `backing image file ${key} is used by replica${users.length > 1 ? 's' : ''} ${users.join(', ')}`, { details: { usedBy: users } });
    }
    r.deleting = true;
    try {
      if (r.job) {
        r.job.abort.abort();
        await r.job.done.catch(() => undefined);
      }
      await r.persisted;
      await rm(r.dir, { recursive: true, force: true });
      await syncDirectory(this.root);
      this.#files.delete(key);
    } catch (err) {
      r.deleting = false;
      throw toMooringError(err, `deleting backing image file ${key}`);
    }
  }

  /** Stops preparations and verifications (partial files stay for a resume). Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const jobs = [...this.#files.values()].flatMap((r) => (r.job ? [r.job] : []));
    for (const j of jobs) j.abort.abort();
    await Promise.allSettled([...jobs.map((j) => j.done), this.#verifying]);
  }

  // --- preparation ----------------------------------------------------------------

  // The frame shared by the three sources: reuse of a ready file, one preparation at a time,
  // states and file.json, and adoption (checksum, image reader, rename) of what `body` wrote
  // into image.part.
  async #prepare(
    ref: BackingImageFileRef,
    key: string,
    expected: string | undefined,
    write: { sizeBytes: number; offset: number } | undefined,
    body: (r: FileRecord, signal: AbortSignal) => Promise<{ sizeBytes: number; checksum: string }>,
  ): Promise<BackingImageFileInfo> {
    const found = this.#files.get(key);
    // A ready file found at open is being verified: its outcome decides reuse.
    if (found?.job && found.state === 'pending' && found.checksum !== '' && !found.deleting) await found.job.done.catch(() => undefined);
    // Claimed synchronously, so two calls for one ref never both pass the checks below
    // (they await the disk between checking and starting).
    if (this.#claimed.has(key)) throw new MooringError('BUSY', `backing image file ${key} is being prepared already`);
    const claim = {};
    this.#claimed.set(key, claim);
    const release = (): void => {
      if (this.#claimed.get(key) === claim) this.#claimed.delete(key);
    };
    try {
      return await this.#prepareClaimed(ref, key, expected, write, body, release);
    } finally {
      release();
    }
  }

  async #prepareClaimed(
    ref: BackingImageFileRef,
    key: string,
    expected: string | undefined,
    write: { sizeBytes: number; offset: number } | undefined,
    body: (r: FileRecord, signal: AbortSignal) => Promise<{ sizeBytes: number; checksum: string }>,
    releaseClaim: () => void,
  ): Promise<BackingImageFileInfo> {
    let r = this.#files.get(key);
    if (r?.deleting) throw new MooringError('BUSY', `backing image file ${key} is being deleted`);
    if (r?.job) throw new MooringError('BUSY', `backing image file ${key} is being prepared already`, { details: { state: r.state } });
    if (r?.state === 'ready') return this.#info(r, (await this.#o.usedBy()).get(key) ?? []);
    if (r && expected && r.expectedChecksum && expected !== r.expectedChecksum && r.receivedBytes > 0) {
      // Another expected checksum: the partial bytes may be of another file version.
      await rm(join(r.dir, BACKING_IMAGE_PART_FILE), { force: true });
      r.receivedBytes = 0;
    }
    if (write) {
      const have = r ? await partialSize(join(r.dir, BACKING_IMAGE_PART_FILE)) : 0;
      if (write.offset !== 0 && write.offset !== have) {
        throw new MooringError('INVALID_ARGUMENT', `offset must be 0 (start over) or ${have} (the bytes of ${key} on this disk; got ${write.offset})`, {
          details: { receivedBytes: have },
        });
      }
      if (write.offset !== 0 && r && r.sizeBytes !== 0 && r.sizeBytes !== write.sizeBytes) {
        throw new MooringError('INVALID_ARGUMENT', `sizeBytes ${write.sizeBytes} differs from the ${r.sizeBytes} of the partial file being resumed`);
      }
    }
    const isNew = !r;
    if (!r) {
      r = newFileRecord(ref, key, join(this.root, key), 'pending', 0);
      this.#files.set(key, r);
    }
    const rec = r;
    const abort = new AbortController();
    // Released before the final state is announced: whoever sees ready or failed may start
    // the next preparation at once (file.json writes stay in order, see #setState).
    const finish = (): void => {
      if (rec.job?.abort === abort) rec.job = undefined;
      releaseClaim();
    };
    const run = async (): Promise<BackingImageFileInfo> => {
      try {
        await ensureDirectory(rec.dir);
        // A new file is recorded (and announced) before anything else happens to it.
        if (isNew) await this.#setState(rec, 'pending', '');
        // A complete file that failed verification is not reused: remove it (no replica
        // uses it, or the ready check above would not have been reached by a user of it).
        const users = (await this.#o.usedBy()).get(key) ?? [];
        if (await pathExists(join(rec.dir, BACKING_IMAGE_FILE))) {
          if (users.length > 0) throw new MooringError('BUSY', `backing image file ${key} failed verification but replicas ${users.join(', ')} use it`);
          await rm(join(rec.dir, BACKING_IMAGE_FILE), { force: true });
        }
        rec.expectedChecksum = expected ?? '';
        rec.checksum = '';
        rec.format = null;
        rec.virtualSizeBytes = 0;
        if (write) rec.sizeBytes = write.sizeBytes;
        rec.receivedBytes = await partialSize(join(rec.dir, BACKING_IMAGE_PART_FILE));
        await this.#setState(rec, 'starting', '');
        const got = await body(rec, abort.signal);
        await this.#adopt(rec, got, abort.signal);
      } catch (err) {
        const e = toMooringError(err);
        rec.receivedBytes = await partialSize(join(rec.dir, BACKING_IMAGE_PART_FILE));
        finish();
        if (!rec.deleting) await this.#setState(rec, 'failed', `${e.code}: ${e.message}`).catch(() => undefined);
        throw e;
      }
      finish();
      await this.#setState(rec, 'ready', '');
      return this.#info(rec, (await this.#o.usedBy()).get(key) ?? []);
    };
    const done = run();
    rec.job = { abort, done };
    try {
      return await done;
    } finally {
      finish();
    }
  }

  // Checks what a source wrote into image.part and makes it the image (the caller records it ready).
  async #adopt(r: FileRecord, got: { sizeBytes: number; checksum: string }, signal: AbortSignal): Promise<void> {
    const part = join(r.dir, BACKING_IMAGE_PART_FILE);
    if (signal.aborted) throw new MooringError('CANCELLED', `preparation of ${r.key} was cancelled`);
    if (r.expectedChecksum !== '' && got.checksum !== r.expectedChecksum) {
      // Bad bytes are not kept: the next attempt starts over.
      await rm(part, { force: true });
      throw new MooringError('CHECKSUM_MISMATCH', `SHA-512 of ${r.key} is ${got.checksum}, expected ${r.expectedChecksum}`, {
        details: { checksum: got.checksum, expectedChecksum: r.expectedChecksum },
      });
    }
    let format: 'raw' | 'qcow2';
    let virtualSizeBytes: number;
    try {
      const img = await openImage(part, { format: 'auto', addon: this.#o.addon });
      format = img.format;
      virtualSizeBytes = img.sizeBytes;
      await img.close();
    } catch (err) {
      // The bytes are what the source holds: trying them again gives the same refusal.
      await rm(part, { force: true });
      const e = toMooringError(err);
      throw new MooringError(e.code, `${r.key} is not a usable image: ${e.message}`, { cause: err });
    }
    await rename(part, join(r.dir, BACKING_IMAGE_FILE));
    await syncDirectory(r.dir);
    r.sizeBytes = got.sizeBytes;
    r.receivedBytes = got.sizeBytes;
    r.checksum = got.checksum;
    r.format = format;
    r.virtualSizeBytes = virtualSizeBytes;
  }

  // --- records, events ----------------------------------------------------------

  async #setState(r: FileRecord, state: BackingImageFileState, message: string): Promise<void> {
    r.state = state;
    r.message = message.slice(0, BACKING_IMAGE_FILE_LIMITS.messageLengthMax);
    r.progress = state === 'ready' ? 100 : percent(r.receivedBytes, r.sizeBytes);
    r.lastProgressMs = Date.now();
    this.#emit(r);
    if (r.deleting) return;
    const stored: StoredRecord = {
      schema: RECORD_SCHEMA,
      schemaVersion: 1,
      name: r.name,
      uuid: r.uuid,
      sizeBytes: r.sizeBytes,
      checksum: r.checksum,
      expectedChecksum: r.expectedChecksum,
      format: r.format,
      virtualSizeBytes: r.virtualSizeBytes,
      state: r.state,
      message: r.message,
    };
    const write = r.persisted.then(() => writeFileAtomic(join(r.dir, BACKING_IMAGE_RECORD_FILE), `${JSON.stringify(stored)}\n`));
    r.persisted = write.catch(() => undefined);
    await write;
  }

  // Bytes arrived: an event when the percentage moved a step or the interval passed.
  #progress(r: FileRecord, receivedBytes: number): void {
    r.receivedBytes = receivedBytes;
    const p = percent(receivedBytes, r.sizeBytes);
    const now = Date.now();
    if (p - r.progress >= BACKING_IMAGE_FILE_LIMITS.progressStepPercent || now - r.lastProgressMs >= BACKING_IMAGE_FILE_LIMITS.progressIntervalMs) {
      r.progress = p;
      r.lastProgressMs = now;
      this.#emit(r);
    }
  }

  #emit(r: FileRecord): void {
    if (this.#closed) return;
    const { usedBy: _u, ...info } = this.#info(r, []);
    this.#o.emit({ type: 'backing-image-file', ...info });
  }

  #info(r: FileRecord, usedBy: string[]): BackingImageFileInfo {
    return {
      name: r.name,
      uuid: r.uuid,
      state: r.state,
      progress: r.state === 'ready' ? 100 : r.progress,
      message: r.message,
      sizeBytes: r.sizeBytes,
      receivedBytes: r.receivedBytes,
      checksum: r.state === 'ready' ? r.checksum : '',
      format: r.state === 'ready' ? r.format : null,
      virtualSizeBytes: r.state === 'ready' ? r.virtualSizeBytes : 0,
      usedBy: [...usedBy].sort(),
    };
  }

  // --- after a restart ------------------------------------------------------------

  async #load(): Promise<void> {
    const entries = await readdir(this.root, { withFileTypes: true }).catch((err: unknown) => Promise.reject(toMooringError(err, `listing ${this.root}`)));
    const dirs = entries.filter((e) => e.isDirectory()).map((e) => e.name);
    if (dirs.length > BACKING_IMAGE_FILE_LIMITS.filesMax) {
      throw new MooringError('INVALID_STATE', `${this.root} holds ${dirs.length} entries, more than the ${BACKING_IMAGE_FILE_LIMITS.filesMax} allowed`);
    }
    for (const key of dirs.sort()) {
      const ref = parseKey(key);
      // Not a directory this class made: leave it alone.
      if (!ref) continue;
      const dir = join(this.root, key);
      const r = newFileRecord(ref, key, dir, 'failed', await partialSize(join(dir, BACKING_IMAGE_PART_FILE)));
      this.#files.set(key, r);
      let stored: StoredRecord;
      try {
        stored = parseRecord(await readFileLimited(join(dir, BACKING_IMAGE_RECORD_FILE), BACKING_IMAGE_FILE_LIMITS.recordBytesMax), ref);
      } catch (err) {
        r.message = `CORRUPT_METADATA: ${toMooringError(err).message}`;
        r.progress = percent(r.receivedBytes, r.sizeBytes);
        continue;
      }
      Object.assign(r, {
        sizeBytes: stored.sizeBytes,
        expectedChecksum: stored.expectedChecksum,
        checksum: stored.checksum,
        format: stored.format,
        virtualSizeBytes: stored.virtualSizeBytes,
      });
      if (stored.state === 'ready') {
        // Verified again before it is trusted: the disk may have changed while we were away.
        r.state = 'pending';
        r.message = 'verifying the checksum after a restart';
        this.#queueVerify(r);
      } else {
        r.state = 'failed';
        r.message =
          stored.state === 'failed' && stored.message !== ''
            ? stored.message
            : `interrupted by a data engine restart${r.receivedBytes > 0 ? `; ${r.receivedBytes} bytes kept for a resume` : ''}`;
        r.progress = percent(r.receivedBytes, r.sizeBytes);
      }
    }
  }

  #queueVerify(r: FileRecord): void {
    const abort = new AbortController();
    let release!: () => void;
    const turn = new Promise<void>((res) => (release = res));
    const prev = this.#verifying;
    const job: { abort: AbortController; done: Promise<unknown> } = { abort, done: Promise.resolve() };
    job.done = (async () => {
      await prev;
      try {
        if (abort.signal.aborted || this.#closed) return;
        const path = join(r.dir, BACKING_IMAGE_FILE);
        const hash = newSha512();
        const n = await hashFileInto(path, hash, undefined, abort.signal);
        const sum = hash.digest('hex');
        if (n !== r.sizeBytes || sum !== r.checksum) {
          await this.#setState(r, 'failed', `CHECKSUM_MISMATCH: ${r.key} changed on disk: ${n} bytes with SHA-512 ${sum}, recorded ${r.sizeBytes} bytes with ${r.checksum}`);
          return;
        }
        r.receivedBytes = n;
        await this.#setState(r, 'ready', '');
      } catch (err) {
        if (abort.signal.aborted || this.#closed) return;
        const e = toMooringError(err);
        await this.#setState(r, 'failed', `${e.code}: verification after a restart failed: ${e.message}`).catch(() => undefined);
      } finally {
        if (r.job === job) r.job = undefined;
        release();
      }
    })();
    r.job = job;
    this.#verifying = turn;
  }

  #assertOpen(): void {
    if (this.#closed) throw new MooringError('CLOSED', 'the data engine is closed');
  }
}

/** Checks a ref and returns its directory name `<name>-<uuid>`. */
export function checkRef(ref: unknown, code: MooringErrorCode = 'INVALID_ARGUMENT'): string {
  if (typeof ref !== 'object' || ref === null) throw new MooringError(code, `a backing image file ref must be {name, uuid} (got ${describe(ref)})`);
  const r = ref as Partial<BackingImageFileRef>;
  return `${checkName('backing image name', r.name, code)}-${checkUuid('backing image uuid', r.uuid, code)}`;
}

// `<name>-<uuid>` back into its parts (a UUID is 36 characters at the end).
function parseKey(key: string): { name: string; uuid: string } | undefined {
  if (key.length < 38 || key[key.length - 37] !== '-') return undefined;
  const name = key.slice(0, key.length - 37);
  const uuid = key.slice(key.length - 36);
  if (!UUID_PATTERN.test(uuid)) return undefined;
  try {
    checkName('name', name);
  } catch {
    return undefined;
  }
  return { name, uuid };
}

function parseRecord(text: string, ref: { name: string; uuid: string }): StoredRecord {
  const bad = (why: string): MooringError => new MooringError('CORRUPT_METADATA', `${BACKING_IMAGE_RECORD_FILE} of ${ref.name}-${ref.uuid}: ${why}`);
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw bad('not valid JSON');
  }
  const d = v as Partial<StoredRecord> | null;
  if (typeof d !== 'object' || d === null || d.schema !== RECORD_SCHEMA || d.schemaVersion !== 1) throw bad('not a backing image file record');
  if (d.name !== ref.name || d.uuid !== ref.uuid) throw bad(`names ${describe(d.name)}/${describe(d.uuid)}, not its directory`);
  const size = (x: unknown): boolean => typeof x === 'number' && Number.isSafeInteger(x) && x >= 0;
  if (!size(d.sizeBytes) || !size(d.virtualSizeBytes)) throw bad('sizes must be non-negative integers');
  if (typeof d.checksum !== 'string' || (d.checksum !== '' && checkChecksum('checksum', d.checksum) !== d.checksum)) throw bad('checksum is not a SHA-512');
  if (typeof d.expectedChecksum !== 'string' || (d.expectedChecksum !== '' && checkChecksum('expectedChecksum', d.expectedChecksum) !== d.expectedChecksum)) throw bad('expectedChecksum is not a SHA-512');
  if (d.format !== null && d.format !== 'raw' && d.format !== 'qcow2') throw bad('format must be raw, qcow2 or null');
  if (typeof d.state !== 'string' || !STATES.has(d.state)) throw bad('unknown state');
  if (typeof d.message !== 'string') throw bad('message must be a string');
  if (d.state === 'ready' && (d.checksum === '' || d.format === null)) throw bad('a ready file needs a checksum and a format');
  return d as StoredRecord;
}

function percent(received: number, size: number): number {
  return size > 0 ? Math.min(100, Math.floor((received * 100) / size)) : 0;
}

async function truncateOrCreate(path: string): Promise<void> {
  try {
    await truncate(path, 0);
  } catch {
    const fh = await open(path, 'w', PRIVATE_FILE_MODE);
    await fh.close();
  }
}

/**
 * Appends chunks to a file with at most one write in flight: what arrives meanwhile is
 * queued (up to writeBatchBytesMax; then the caller waits) and written by the next writev,
 * started as soon as the one in flight ends. Writes stay in order, so the file is always a
 * prefix of the stream. A failed write is reported by the next add or flush.
 */
class WriteBatch {
  readonly #fh: FileHandle;
  #queued: Uint8Array[] = [];
  #queuedBytes = 0;
  /** The write in flight; it never rejects (a failure is kept in #failure). */
  #writing: Promise<void> | undefined;
  #failure: { error: unknown } | undefined;

  constructor(fh: FileHandle) {
    this.#fh = fh;
  }

  async add(chunk: Uint8Array): Promise<void> {
    this.#throwIfFailed();
    while (this.#writing && this.#queuedBytes + chunk.length > BACKING_IMAGE_FILE_LIMITS.writeBatchBytesMax) {
      await this.#writing;
      this.#throwIfFailed();
    }
    this.#queued.push(chunk);
    this.#queuedBytes += chunk.length;
    if (!this.#writing) this.#start();
  }

  /** Waits until everything queued is written; throws the first write's error. */
  async flush(): Promise<void> {
    await this.settle();
    this.#throwIfFailed();
  }

  /** Waits until no write is in flight, whatever its outcome. */
  async settle(): Promise<void> {
    while (this.#writing) await this.#writing;
  }

  #start(): void {
    const bufs = this.#queued;
    this.#queued = [];
    this.#queuedBytes = 0;
    const w: Promise<void> = writeAllV(this.#fh, bufs).then(
      () => {
        if (this.#writing !== w) return;
        this.#writing = undefined;
        if (this.#queued.length > 0) this.#start();
      },
      (error: unknown) => {
        this.#failure = { error };
        if (this.#writing === w) this.#writing = undefined;
      },
    );
    this.#writing = w;
  }

  #throwIfFailed(): void {
    if (this.#failure) throw toMooringError(this.#failure.error, 'writing the backing image file');
  }
}

async function writeAllV(fh: FileHandle, bufs: Uint8Array[]): Promise<void> {
  let rest = bufs;
  while (rest.length > 0) {
    let n = (await fh.writev(rest)).bytesWritten;
    // A short write: go on from the first byte not written.
    while (rest.length > 0 && n >= rest[0]!.length) {
      n -= rest[0]!.length;
      rest = rest.slice(1);
    }
    if (n > 0) rest = [rest[0]!.subarray(n), ...rest.slice(1)];
  }
}

// Iterates `data`, stopping at once (CANCELLED) when `signal` aborts, even while waiting for
// the next chunk; the source is told to stop (return()).
async function* abortable<T>(data: AsyncIterable<T>, signal: AbortSignal): AsyncGenerator<T> {
  const it = data[Symbol.asyncIterator]();
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, rej) => {
    onAbort = () => rej(new MooringError('CANCELLED', 'the preparation was cancelled'));
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
  });
  aborted.catch(() => undefined);
  let finished = false;
  try {
    for (;;) {
      const next = await Promise.race([it.next(), aborted]);
      if (next.done) {
        finished = true;
        return;
      }
      yield next.value;
    }
  } finally {
    if (onAbort) signal.removeEventListener('abort', onAbort);
    if (!finished) await Promise.resolve(it.return?.()).catch(() => undefined);
  }
}
