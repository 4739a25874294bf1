import { EventEmitter } from 'node:events';
import type * as TE from 'typed-emitter';

import type { BackingImageFileState } from '../data-engine/data-engine.js';
import type { MooringError } from '../errors.js';
import type { BackingImageSource } from './backing-image-records.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/** Options of {@link Mooring.createBackingImage}. */
export interface BackingImageCreateOptions {
  /** Image name ([A-Za-z0-9._-]{1,63}), unique in the cluster. */
  name: string;
  /** Where the first file comes from. */
  source: BackingImageSource;
  /** SHA-512 (128 hex digits) the file must have; a file that differs fails with CHECKSUM_MISMATCH. */
  expectedChecksum?: string;
  /** Ready copies to keep across disks (default 1); cleanup never goes below it. */
  minCopies?: number;
  /** Host that prepares the first file (default: for a snapshot, the host whose engine writes the volume; otherwise the reachable host holding the fewest replicas). */
  host?: string;
}

/** One disk's file of an image, as reported. */
export interface BackingImageFileStatus {
  /** The host whose disk holds (or should hold) the file. */
  hostId: string;
  /** unknown: its host cannot be reached. */
  state: BackingImageFileState;
  /** Percent done (0..100). */
  progress: number;
  /** Why it failed, or what it is doing; '' if nothing to say. */
  message: string;
  /** Since when no replica on this disk uses it (ms since the epoch), or null. */
  lastRefAtMs: number | null;
}

/** A backing image as reported: spec and status. */
export interface BackingImageStatus {
  /** The image's name. */
  name: string;
  /** Its UUID, given when it was created (its files live in `<name>-<uuid>` directories). */
  uuid: string;
  /** ready: a ready copy exists; in-progress: a file is being prepared or copied; pending: waits for its source (an upload); failed: every file failed and nothing is tried again. */
  state: 'pending' | 'in-progress' | 'ready' | 'failed';
  /** Where its first file comes from. */
  source: BackingImageSource;
  /** The SHA-512 asked for at creation, or null. */
  expectedChecksum: string | null;
  /** SHA-512 of the file ('' until the first file is ready). */
  currentChecksum: string;
  /** The file's size in bytes (0 until known). */
  sizeBytes: number;
  /** The size a volume over it sees (qcow2: its virtual size), 0 until ready. */
  virtualSizeBytes: number;
  /** The file's format, null until ready. */
  format: 'raw' | 'qcow2' | null;
  /** Ready copies kept across disks (cleanup never goes below it). */
  minCopies: number;
  /** When it was created, ms since the Unix epoch. */
  createdMs: number;
  /** Host that prepares the first file. */
  firstHost: string;
  /** Spec: hosts whose disk should hold a file. */
  disks: string[];
  /** Status: the file on each disk that holds (or should hold) one. */
  files: BackingImageFileStatus[];
  /** Volumes whose replicas read it. */
  usedBy: string[];
}

/** Events of a {@link BackingImage}. */
export type BackingImageEvents = {
  /** A disk's file changed state or advanced (progress at most as often as its data engine reports). */
  'file-state': (file: BackingImageFileStatus) => void;
  /** A disk's file became ready. */
  ready: (file: BackingImageFileStatus) => void;
  /** A disk's file failed (a copy is retried; a first file of a download source is downloaded again). */
  failed: (file: BackingImageFileStatus & { error: MooringError | null }) => void;
};

/** What a {@link BackingImage} asks of its controller. @internal */
export interface BackingImageOps {
  status(name: string): Promise<BackingImageStatus>;
  waitReady(name: string, timeoutMs: number | undefined): Promise<BackingImageStatus>;
  upload(name: string, data: AsyncIterable<Uint8Array | string>): Promise<BackingImageStatus>;
  cancel(name: string): Promise<void>;
  delete(name: string): Promise<void>;
  cleanup(name: string, hostIds: string[]): Promise<BackingImageStatus>;
  setMinCopies(name: string, minCopies: number): Promise<BackingImageStatus>;
}

/**
 * One backing image of a {@link Mooring}: a raw or qcow2 file beneath the replicas of the
 * volumes created over it, kept once per disk and copied to the hosts that need it. The
 * handle gives its status, waits for the first ready file, uploads its bytes, cancels,
 * deletes, cleans up copies, and emits per-file events. Get it from
 * {@link Mooring.createBackingImage} or {@link Mooring.backingImage}.
 */
export class BackingImage extends (EventEmitter as new () => TypedEmitter<BackingImageEvents>) {
  readonly #ops: BackingImageOps;

  /** @internal */
  constructor(
    /** The image's name. */
    readonly name: string,
    ops: BackingImageOps,
  ) {
    super();
    this.#ops = ops;
  }

  /**
   * Spec and status, as last recorded by the controller.
   *
   * @throws MooringError NOT_FOUND
   */
  status(): Promise<BackingImageStatus> {
    return this.#ops.status(this.name);
  }

  /**
   * Resolves once a ready copy exists (reconciling while it waits).
   *
   * @param options.timeoutMs - how long to wait (default: the cluster's ticketWaitTimeoutMs)
   * @throws MooringError NOT_FOUND; the file's own code (CHECKSUM_MISMATCH, DOWNLOAD_FAILED, CANCELLED, ...) or INVALID_STATE when it failed for good; UNAVAILABLE on timeout
   */
  waitReady(options: { timeoutMs?: number } = {}): Promise<BackingImageStatus> {
    return this.#ops.waitReady(this.name, options?.timeoutMs);
  }

  /**
   * Streams the bytes of an `upload` image into its first host (exactly the declared
   * `sizeBytes`); resolves when the file is verified and ready. A stream that ends early or
   * breaks leaves the file failed; upload again.
   *
   * @param data - an AsyncIterable of Uint8Array chunks (a Node Readable without encoding fits)
   * @throws MooringError INVALID_STATE (not an upload source, or ready already), BUSY (an upload runs), INVALID_ARGUMENT (a chunk that is not bytes), the data engine's code
   */
  upload(data: AsyncIterable<Uint8Array>): Promise<BackingImageStatus> {
    return this.#ops.upload(this.name, data);
  }

  /** Stops the preparation of the first file (it fails with CANCELLED and is not retried by itself). */
  cancel(): Promise<void> {
    return this.#ops.cancel(this.name);
  }

  /**
   * Deletes the image and its files. Files on hosts that cannot be reached are deleted when
   * they are back (their directory's UUID belongs to no image any more).
   *
   * @throws MooringError NOT_FOUND, BUSY (a volume uses it)
   */
  delete(): Promise<void> {
    return this.#ops.delete(this.name);
  }

  /**
   * Deletes the copies on the given hosts now instead of after the cleanup wait (as Longhorn's
   * CleanupDiskImages). If fewer than minCopies ready copies remain, the controller makes new
   * ones where it sees fit.
   *
   * @throws MooringError NOT_FOUND, BUSY (a replica on one of them uses it; nothing is deleted), UNAVAILABLE (a host cannot be reached)
   */
  cleanup(hostIds: string[]): Promise<BackingImageStatus> {
    return this.#ops.cleanup(this.name, hostIds);
  }

  /**
   * Changes how many ready copies the image keeps (1..16, `BACKING_IMAGE_MIN_COPIES_MAX`)
   * while the cluster runs: more are delivered at once, and copies past the new count are
   * cleaned up after the cleanup wait like any unused copy.
   *
   * @throws MooringError INVALID_ARGUMENT, NOT_FOUND
   */
  setMinCopies(minCopies: number): Promise<BackingImageStatus> {
    return this.#ops.setMinCopies(this.name, minCopies);
  }
}
