/**
 * BackingImageController: the reconcile loop of a cluster's backing images (Longhorn's
 * BackingImageController, data source and manager, as one library object). Per image it
 * observes each host's file, asks {@link decideBackingImage} what to do, records spec and
 * status, and runs the actions in the background: prepare the first file from its source,
 * relay copies from a ready disk to the disks that need one (resuming partial files), delete
 * files nobody used for the cleanup wait, and delete files of images that no longer exist
 * (their UUID belongs to no record). The cluster runs it from its repair pass, and on demand
 * (create, wait, volumes that need a file on a host).
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';

import type { BackingImageFileInfo, BackingImageFileRef, DataEngine, DataEngineEvent, ReplicaBackingImage } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import type { StateStore } from '../state/state-store.js';
import { KeyedSerial, sleep, withTimeout } from '../util/async.js';
import { safeEmit } from '../util/emit.js';
import { VOLUME_SIZE_MAX_BYTES } from '../util/limits.js';
import { checkIntIn, checkName, describe } from '../util/validate.js';
import { decideBackingImage, type BackingImageDecision, type Delivery, type DiskObservation } from './backing-image-decide.js';
import {
  BACKING_IMAGE_KIND,
  BACKING_IMAGE_MESSAGE_LENGTH_MAX,
  BACKING_IMAGE_MIN_COPIES_MAX,
  BACKING_IMAGE_SCHEMA_VERSION,
  SHA512_PATTERN,
  isDownloadUrl,
  parseBackingImageRecord,
  type BackingImageDiskStatus,
  type BackingImageRecord,
  type BackingImageSource,
} from './backing-image-records.js';
import { copyBackingImageFile, newCopyState, type CopyState } from './copy.js';
import { BackingImage, type BackingImageCreateOptions, type BackingImageFileStatus, type BackingImageOps, type BackingImageStatus } from './backing-image.js';

/** Preparations of the first file of a download before the image stays failed (Longhorn resets the source while every file failed). */
export const FIRST_FILE_ATTEMPTS_MAX = 5;
/** Wait after the second failure in a row of a copy (or a first file), doubled per failure up to {@link RETRY_DELAY_MAX_MS}; the first retry is immediate (a host that came back should not wait). */
export const RETRY_DELAY_MS = 500;
/** Longest wait between retries. */
export const RETRY_DELAY_MAX_MS = 30_000;
/** How often a waiter (waitReady, a volume waiting for its file) reconciles again. */
export const BACKING_IMAGE_POLL_MS = 100;
/** Longest wait a caller may ask of waitReady (a week, as the cluster's other settings). */
const WAIT_TIMEOUT_MAX_MS = 7 * 24 * 3600 * 1000;
/** Hosts one cleanup call may name. */
export const CLEANUP_HOSTS_MAX = 1024;

/** What the controller needs from its cluster. @internal */
export interface BackingImageContext {
  store: StateStore;
  /** Host ids of the cluster. */
  hostIds(): string[];
  /** Hosts being evicted: their files go once copies are ready elsewhere and no replica uses them. */
  evictingHosts(): Promise<Set<string>>;
  /** The host's data engine; NOT_FOUND if it is not a host of the cluster. */
  engineOf(hostId: string): DataEngine;
  /** Volumes on each image and the hosts holding their replicas, from the cluster's records. */
  usage(): Promise<Map<string, { volumes: Set<string>; hosts: Set<string> }>>;
  /** A reachable host to prepare a first file on (the one with the fewest replicas). */
  pickHost(): Promise<string>;
  /** The host an operation on `volume` runs on (attached host, else a reachable replica host). NOT_FOUND for no such volume. */
  operationHost(volume: string): Promise<string>;
  /** Runs `fn` on the host whose engine writes `volume` (attached host, else a reachable replica host), holding a `backing-image-export` ticket there. */
  withExportTicket<T>(volume: string, fn: (writer: string) => Promise<T>): Promise<T>;
  warn(error: MooringError): void;
  cleanupWaitMs: number;
  probeTimeoutMs: number;
  waitTimeoutMs: number;
}

/** The message of a file whose checksum is not the image's. */
const MISMATCH_MESSAGE = 'checksum mismatch: not a copy of this image';

/** What runs for one image in this process. */
interface Runs {
  uuid: string;
  /** Host whose first file is being prepared, or null. */
  preparing: string | null;
  /** Copies running: target host → source host. */
  receiving: Map<string, string>;
}

/** A pass over one image: the record written and the decision taken. */
interface Pass {
  rec: BackingImageRecord;
  decision: BackingImageDecision;
  usedBy: string[];
}

/** Largest backing image file an upload may declare. */
const UPLOAD_SIZE_MAX_BYTES = VOLUME_SIZE_MAX_BYTES;

function refOf(rec: BackingImageRecord): BackingImageFileRef {
  return { name: rec.name, uuid: rec.uuid };
}

function checkSource(v: unknown): BackingImageSource {
  if (typeof v !== 'object' || v === null) throw new MooringError('INVALID_ARGUMENT', `source must be an object (got ${describe(v)})`);
  const s = v as Record<string, unknown>;
  switch (s['type']) {
    case 'download':
      if (!isDownloadUrl(s['url'])) throw new MooringError('INVALID_ARGUMENT', `source.url must be an http:// or https:// URL of at most 2048 characters (got ${describe(s['url'])})`);
      return { type: 'download', url: s['url'] };
    case 'upload': {
      const size = s['sizeBytes'];
      if (typeof size !== 'number' || !Number.isSafeInteger(size) || size < 1 || size > UPLOAD_SIZE_MAX_BYTES) {
        throw new MooringError('INVALID_ARGUMENT', `source.sizeBytes must be an integer in 1..${UPLOAD_SIZE_MAX_BYTES} (got ${describe(size)})`);
      }
      return { type: 'upload', sizeBytes: size };
    }
    case 'volume-snapshot':
      return { type: 'volume-snapshot', volume: checkName('source.volume', s['volume']), snapshot: checkName('source.snapshot', s['snapshot']) };
    default:
      throw new MooringError('INVALID_ARGUMENT', `source.type must be 'download', 'upload' or 'volume-snapshot' (got ${describe(s['type'])})`);
  }
}

function retryDelayMs(failures: number): number {
  return failures <= 1 ? 0 : Math.min(RETRY_DELAY_MAX_MS, RETRY_DELAY_MS * 2 ** (failures - 2));
}

/** The controller; see the module comment. @internal */
export class BackingImageController {
  readonly #ctx: BackingImageContext;
  readonly #serial = new KeyedSerial();
  readonly #handles = new Map<string, BackingImage>();
  readonly #runs = new Map<string, Runs>();
  /** Hosts a volume waits on, per image (counted: several volumes may wait on one host). */
  readonly #requests = new Map<string, Map<string, number>>();
  /** Failures in a row and the time before which no retry starts, per `<image>/<host>` (host `*`: the first file). */
  readonly #retries = new Map<string, { failures: number; notBeforeMs: number; error: MooringError }>();
  /** Copies' shared state: targets that cannot pull (relayed to), bytes relayed through this process. */
  readonly #copies: CopyState = newCopyState();
  #closed = false;
  /** What {@link BackingImage} handles call. */
  readonly ops: BackingImageOps = {
    status: (n) => this.status(n),
    waitReady: (n, t) => this.waitReady(n, t),
    upload: (n, d) => this.#upload(n, d),
    cancel: (n) => this.#cancel(n),
    delete: (n) => this.#delete(n),
    cleanup: (n, h) => this.#cleanup(n, h),
    setMinCopies: (n, m) => this.#setMinCopies(n, m),
  };

  constructor(ctx: BackingImageContext) {
    this.#ctx = ctx;
  }

  /** Bytes of copies relayed through this process (targets that cannot pull). @internal */
  get relayedBytes(): number {
    return this.#copies.relayedBytes;
  }

  /** The handle of an image (one object per name). */
  handle(name: string): BackingImage {
    checkName('backing image name', name);
    let h = this.#handles.get(name);
    if (!h) {
      h = new BackingImage(name, this.ops);
      this.#handles.set(name, h);
    }
    return h;
  }

  /**
   * Records a new image (its UUID first, before anything else happens) and starts preparing
   * its first file.
   */
  async create(options: BackingImageCreateOptions): Promise<BackingImage> {
    this.#checkOpen();
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `backing image options must be an object (got ${describe(options)})`);
    const name = checkName('backing image name', options.name);
    const source = checkSource(options.source);
    let expectedChecksum: string | null = null;
    if (options.expectedChecksum !== undefined) {
      const c = typeof options.expectedChecksum === 'string' ? options.expectedChecksum.toLowerCase() : options.expectedChecksum;
      if (typeof c !== 'string' || !SHA512_PATTERN.test(c)) throw new MooringError('INVALID_ARGUMENT', `expectedChecksum must be a SHA-512 of 128 hex digits (got ${describe(options.expectedChecksum)})`);
      expectedChecksum = c;
    }
    const minCopies = checkIntIn('minCopies', options.minCopies, 1, BACKING_IMAGE_MIN_COPIES_MAX, 1);
    if (await this.#ctx.store.get(BACKING_IMAGE_KIND, name)) throw new MooringError('ALREADY_EXISTS', `backing image ${name} exists already`);
    let firstHost: string;
    if (options.host !== undefined) {
      firstHost = checkName('host id', options.host);
      this.#ctx.engineOf(firstHost);
    } else if (source.type === 'volume-snapshot') {
      firstHost = await this.#ctx.operationHost(source.volume);
    } else {
      firstHost = await this.#ctx.pickHost();
    }
    const rec: BackingImageRecord = {
      schema: BACKING_IMAGE_SCHEMA_VERSION,
      name,
      uuid: randomUUID(),
      createdMs: Date.now(),
      source,
      expectedChecksum,
      minCopies,
      firstHost,
      disks: [firstHost],
      sourceAttempts: 0,
      cancelled: false,
      currentChecksum: '',
      sizeBytes: source.type === 'upload' ? source.sizeBytes : 0,
      virtualSizeBytes: 0,
      format: null,
      files: { [firstHost]: { state: 'pending', progress: 0, message: '', receivedBytes: 0, lastRefAtMs: null } },
    };
    // The UUID is stored before any file exists: a file is only ever made for a stored UUID,
    // so files of an older image with this name are never taken for this one's.
    await this.#ctx.store.put(BACKING_IMAGE_KIND, name, rec, { expectedVersion: 0 });
    this.#forget(name);
    this.#kick(name);
    return this.handle(name);
  }

  /** Every image's status. */
  async list(): Promise<BackingImageStatus[]> {
    const out: BackingImageStatus[] = [];
    const usage = await this.#ctx.usage();
    for (const d of await this.#ctx.store.list<unknown>(BACKING_IMAGE_KIND)) {
      const rec = parseBackingImageRecord(d.value, d.key);
      out.push(this.#statusOf(rec, [...(usage.get(rec.name)?.volumes ?? [])].sort()));
    }
    return out;
  }

  /** One image's status, as last recorded. */
  async status(name: string): Promise<BackingImageStatus> {
    const rec = await this.#record(name);
    const usage = (await this.#ctx.usage()).get(name);
    return this.#statusOf(rec, [...(usage?.volumes ?? [])].sort());
  }

  /** The record of an image, or NOT_FOUND. */
  async #record(name: string): Promise<BackingImageRecord> {
    checkName('backing image name', name);
    const d = await this.#ctx.store.get<unknown>(BACKING_IMAGE_KIND, name);
    if (!d) throw new MooringError('NOT_FOUND', `no backing image ${name}`);
    return parseBackingImageRecord(d.value, d.key);
  }

  /** Waits until a ready copy exists; see {@link BackingImage.waitReady}. */
  async waitReady(name: string, timeoutMs: number | undefined): Promise<BackingImageStatus> {
    this.#checkOpen();
    const waitMs = checkIntIn('timeoutMs', timeoutMs, 0, WAIT_TIMEOUT_MAX_MS, this.#ctx.waitTimeoutMs);
    const deadline = Date.now() + waitMs;
    for (;;) {
      const pass = await this.reconcile(name);
      if (!pass) throw new MooringError('NOT_FOUND', `no backing image ${name}`);
      if (pass.decision.state === 'ready') return this.#statusOf(pass.rec, pass.usedBy);
      if (pass.decision.state === 'failed') throw this.#failure(pass.rec);
      if (Date.now() >= deadline) throw new MooringError('UNAVAILABLE', `backing image ${name} is not ready within ${waitMs} ms (${pass.decision.state})`, { details: { state: pass.decision.state } });
      await sleep(BACKING_IMAGE_POLL_MS);
      this.#checkOpen();
    }
  }

  /**
   * Makes sure a ready file of the image is on each of `hosts` (delivering copies and
   * waiting for them) and keeps them from cleanup until `release` is called (by then a
   * replica uses them). Returns the reference a replica's creation takes.
   */
  async acquire(name: string, hosts: string[], timeoutMs?: number): Promise<{ backingImage: ReplicaBackingImage; release: () => void }> {
    this.#checkOpen();
    const waitMs = timeoutMs ?? this.#ctx.waitTimeoutMs;
    const req = this.#requests.get(name) ?? new Map<string, number>();
    this.#requests.set(name, req);
    for (const h of hosts) req.set(h, (req.get(h) ?? 0) + 1);
    let released = false;
    const release = (): void => {
      if (released) return;
      released = true;
      for (const h of hosts) {
        const n = (req.get(h) ?? 1) - 1;
        if (n <= 0) req.delete(h);
        else req.set(h, n);
      }
      if (req.size === 0 && this.#requests.get(name) === req) this.#requests.delete(name);
    };
    try {
      const deadline = Date.now() + waitMs;
      for (;;) {
        const pass = await this.reconcile(name);
        if (!pass) throw new MooringError('NOT_FOUND', `no backing image ${name}`);
        const missing = hosts.filter((h) => pass.rec.files[h]?.state !== 'ready');
        if (missing.length === 0 && pass.rec.format !== null) {
          return { backingImage: { dir: `${pass.rec.name}-${pass.rec.uuid}`, format: pass.rec.format, virtualSizeBytes: pass.rec.virtualSizeBytes }, release };
        }
        if (pass.decision.state === 'failed') throw this.#failure(pass.rec);
        if (Date.now() >= deadline) {
          const why = missing.map((h) => `${h}: ${pass.rec.files[h]?.state ?? 'none'}`).join(', ');
          throw new MooringError('UNAVAILABLE', `backing image ${name} is not ready on ${missing.join(', ')} within ${waitMs} ms (${why})`, { details: { missing } });
        }
        await sleep(BACKING_IMAGE_POLL_MS);
        this.#checkOpen();
      }
    } catch (err) {
      release();
      throw err;
    }
  }

  /** One pass over every image, then deletes files whose image is gone (or was recreated under a new UUID). */
  async reconcileAll(): Promise<void> {
    for (const d of await this.#ctx.store.list<unknown>(BACKING_IMAGE_KIND)) {
      if (this.#closed) return;
      await this.reconcile(d.key).catch((err: unknown) => this.#ctx.warn(toMooringError(err, `reconciling backing image ${d.key}`)));
    }
    for (const hostId of this.#ctx.hostIds()) {
      if (this.#closed) return;
      let files: BackingImageFileInfo[];
      try {
        files = await withTimeout(this.#ctx.engineOf(hostId).listBackingImageFiles(), this.#ctx.probeTimeoutMs, `backing image files of ${hostId}`);
      } catch {
        continue; // away: its leftovers go when it is back
      }
      for (const f of files) {
        if (f.usedBy.length > 0) continue;
        // Read again now: an image created after the list above has its record before any file.
        // Delete only when sure: no record, or a record naming another UUID; a store that
        // fails or a record without a readable UUID keeps the file.
        let uuid: unknown;
        try {
          const d = await this.#ctx.store.get<unknown>(BACKING_IMAGE_KIND, f.name);
          uuid = d ? (d.value as { uuid?: unknown } | null)?.uuid : null;
        } catch {
          continue;
        }
        if (uuid === f.uuid || (uuid !== null && typeof uuid !== 'string')) continue;
        await this.#ctx
          .engineOf(hostId)
          .deleteBackingImageFile({ name: f.name, uuid: f.uuid })
          .catch((err: unknown) => this.#ctx.warn(toMooringError(err, `deleting the leftover backing image file ${f.name}-${f.uuid} on ${hostId}`)));
      }
    }
  }

  /** One pass over one image (serialised per image); null if it does not exist. */
  reconcile(name: string): Promise<Pass | null> {
    return this.#serial.run(name, () => this.#reconcileLocked(name));
  }

  /** A data engine event: live progress of a file for the handle's listeners. */
  onDataEngineEvent(hostId: string, e: DataEngineEvent): void {
    if (e.type !== 'backing-image-file') return;
    const h = this.#handles.get(e.name);
    const runs = this.#runs.get(e.name);
    if (!h || !runs || runs.uuid !== e.uuid) return;
    safeEmit(h, 'file-state', { hostId, state: e.state, progress: e.progress, message: e.message, lastRefAtMs: null });
  }

  /** Stops waiting and starting work (files being prepared or copied finish on their hosts). */
  close(): void {
    this.#closed = true;
  }

  // --- the pass ---

  async #reconcileLocked(name: string): Promise<Pass | null> {
    const d = await this.#ctx.store.get<unknown>(BACKING_IMAGE_KIND, name);
    if (!d) return null;
    const old = parseBackingImageRecord(d.value, d.key);
    const ref = refOf(old);
    const runs = this.#runsOf(old);
    const usage = (await this.#ctx.usage()).get(name);
    const now = Date.now();
    // A host that left the cluster (removeHost) takes its file's record with it: it is no
    // copy any more (not even `unknown`), so minCopies is restored on the hosts that remain.
    const hosts = [...new Set(this.#ctx.hostIds())].sort();
    const seen = await Promise.all(
      hosts.map(async (hostId): Promise<{ hostId: string; info: BackingImageFileInfo | null; reachable: boolean }> => {
        try {
          const info = await withTimeout(this.#ctx.engineOf(hostId).backingImageFile(ref), this.#ctx.probeTimeoutMs, `backing image ${name} on ${hostId}`);
          return { hostId, info, reachable: true };
        } catch {
          return { hostId, info: null, reachable: false };
        }
      }),
    );
    const rec: BackingImageRecord = { ...old, files: { ...old.files } };
    // The first ready file sets the image's checksum, size and format; copies must match it.
    if (rec.currentChecksum === '') {
      const first = seen.find((s) => s.info?.state === 'ready' && s.info.checksum !== '');
      if (first?.info) {
        rec.currentChecksum = first.info.checksum;
        rec.sizeBytes = first.info.sizeBytes;
        rec.virtualSizeBytes = first.info.virtualSizeBytes;
        rec.format = first.info.format;
      }
    }
    const mismatched = await this.#checkCopies(rec, old, seen, usage?.hosts);
    const requests = this.#requests.get(name);
    const evicting = await this.#ctx.evictingHosts();
    const disks: DiskObservation[] = seen.map((s) => {
      const was = old.files[s.hostId];
      let file = s.reachable ? (s.info ? { state: s.info.state, receivedBytes: s.info.receivedBytes } : null) : was ? { state: 'unknown' as const, receivedBytes: was.receivedBytes } : null;
      // Not a copy of this image: no source, nothing to resume from.
      if (mismatched.has(s.hostId)) file = { state: 'failed', receivedBytes: s.info?.receivedBytes ?? 0 };
      return {
        hostId: s.hostId,
        reachable: s.reachable,
        file,
        used: (s.info?.usedBy.length ?? 0) > 0 || (usage?.hosts.has(s.hostId) ?? false),
        requested: requests?.has(s.hostId) ?? false,
        lastRefAtMs: was?.lastRefAtMs ?? null,
        receiving: runs.receiving.has(s.hostId),
        preparing: runs.preparing === s.hostId,
        backingOff: (this.#retries.get(`${name}/${s.hostId}`)?.notBeforeMs ?? 0) > now,
        mismatched: mismatched.has(s.hostId),
        evicting: evicting.has(s.hostId),
      };
    });
    const decision = decideBackingImage({
      nowMs: now,
      cleanupWaitMs: this.#ctx.cleanupWaitMs,
      minCopies: rec.minCopies,
      firstHost: rec.firstHost,
      firstFileKnown: rec.currentChecksum !== '' && rec.sizeBytes > 0,
      sourceRetry: this.#sourceRetry(rec, now),
      sourceAttempted: rec.sourceAttempts > 0,
      sendsBySource: [...runs.receiving.values()].reduce<Record<string, number>>((m, src) => ({ ...m, [src]: (m[src] ?? 0) + 1 }), {}),
      disks,
    });

    // Deletions first: a file whose wait is over goes, unless its data engine refuses (in use).
    const deleted = new Set<string>();
    for (const hostId of decision.deletions) {
      try {
        await this.#ctx.engineOf(hostId).deleteBackingImageFile(ref);
        deleted.add(hostId);
      } catch (err) {
        this.#ctx.warn(toMooringError(err, `cleaning up backing image ${name} on ${hostId}`));
      }
    }
    const files: Record<string, BackingImageDiskStatus> = {};
    for (const s of seen) {
      if (deleted.has(s.hostId)) continue;
      const inSpec = decision.spec.includes(s.hostId);
      const was = old.files[s.hostId];
      if (!s.info && !inSpec && !(was && !s.reachable)) continue;
      const lastRefAtMs = decision.lastRefAtMs[s.hostId] ?? null;
      if (!s.reachable) {
        files[s.hostId] = { state: 'unknown', progress: was?.progress ?? 0, message: `host ${s.hostId} cannot be reached`, receivedBytes: was?.receivedBytes ?? 0, lastRefAtMs: was?.lastRefAtMs ?? null };
      } else if (s.info && mismatched.has(s.hostId)) {
        files[s.hostId] = { state: 'failed', progress: 0, message: MISMATCH_MESSAGE, receivedBytes: s.info.receivedBytes, lastRefAtMs };
      } else if (s.info) {
        files[s.hostId] = { state: s.info.state, progress: s.info.progress, message: s.info.message.slice(0, BACKING_IMAGE_MESSAGE_LENGTH_MAX), receivedBytes: s.info.receivedBytes, lastRefAtMs };
      } else {
        files[s.hostId] = { state: 'pending', progress: 0, message: '', receivedBytes: 0, lastRefAtMs };
      }
    }
    rec.files = files;
    rec.disks = decision.spec;
    let prepareOn: string | null = null;
    if (decision.prepareFirstOn !== null && runs.preparing === null) {
      prepareOn = decision.prepareFirstOn;
      rec.firstHost = prepareOn;
      rec.sourceAttempts++;
      // A new first file: the image's checksum is whatever it yields (or the expected one).
      if (rec.source.type === 'download') rec.currentChecksum = '';
    }
    if (JSON.stringify(rec) !== JSON.stringify(old)) await this.#ctx.store.put(BACKING_IMAGE_KIND, name, rec);
    this.#emitChanges(old, rec);

    if (prepareOn !== null) this.#startFirst(rec, prepareOn, runs);
    for (const dl of decision.deliveries) this.#startDelivery(rec, dl, runs);
    return { rec, decision, usedBy: [...(usage?.volumes ?? [])].sort() };
  }

  // Seed 003's reuse rule: a ready file is a copy of the image only if its SHA-512 is the
  // image's current one (a disk that came back holding another file of that name, or one
  // damaged in place, is not). Unused, such a file is deleted here and the disk is treated
  // as empty (delivered again if it is wanted); used by a replica, it stays, reported failed,
  // and counts for nothing. Returns the hosts of files that stay mismatched.
  async #checkCopies(
    rec: BackingImageRecord,
    old: BackingImageRecord,
    seen: Array<{ hostId: string; info: BackingImageFileInfo | null; reachable: boolean }>,
    usedOn: ReadonlySet<string> | undefined,
  ): Promise<Set<string>> {
    const mismatched = new Set<string>();
    if (rec.currentChecksum === '') return mismatched;
    for (const s of seen) {
      const info = s.info;
      if (!info || info.state !== 'ready' || info.checksum === rec.currentChecksum) continue;
      const what = `backing image ${rec.name} on ${s.hostId}: the file's SHA-512 ${info.checksum.slice(0, 16)}… is not the image's ${rec.currentChecksum.slice(0, 16)}…`;
      const details = { image: rec.name, hostId: s.hostId, checksum: info.checksum, expected: rec.currentChecksum };
      if (info.usedBy.length === 0 && !usedOn?.has(s.hostId)) {
        try {
          await this.#ctx.engineOf(s.hostId).deleteBackingImageFile(refOf(rec));
          this.#ctx.warn(new MooringError('CHECKSUM_MISMATCH', `${what}: deleted; a copy is delivered again if one is wanted there`, { details }));
          s.info = null;
          continue;
        } catch (err) {
          this.#ctx.warn(toMooringError(err, `deleting the mismatched file of backing image ${rec.name} on ${s.hostId}`));
        }
      }
      if (old.files[s.hostId]?.message !== MISMATCH_MESSAGE) {
        this.#ctx.warn(new MooringError('CHECKSUM_MISMATCH', `${what}: left in place (${info.usedBy.length > 0 ? `used by ${info.usedBy.join(', ')}` : 'in use'}) and not counted as a copy`, { details }));
      }
      mismatched.add(s.hostId);
    }
    return mismatched;
  }

  #sourceRetry(rec: BackingImageRecord, nowMs: number): 'now' | 'later' | 'never' {
    if (rec.cancelled || this.#closed) return 'never';
    let can: boolean;
    switch (rec.source.type) {
      case 'download':
        can = rec.sourceAttempts < FIRST_FILE_ATTEMPTS_MAX;
        break;
      case 'volume-snapshot':
        can = rec.sourceAttempts === 0;
        break;
      case 'upload':
        can = false; // only the embedder's stream can fill it
        break;
    }
    if (!can) return 'never';
    return (this.#retries.get(`${rec.name}/*`)?.notBeforeMs ?? 0) > nowMs ? 'later' : 'now';
  }

  #emitChanges(old: BackingImageRecord, rec: BackingImageRecord): void {
    const h = this.#handles.get(rec.name);
    if (!h) return;
    for (const [hostId, f] of Object.entries(rec.files)) {
      const was = old.files[hostId];
      if (was && was.state === f.state && was.progress === f.progress) continue;
      const st: BackingImageFileStatus = { hostId, state: f.state, progress: f.progress, message: f.message, lastRefAtMs: f.lastRefAtMs };
      safeEmit(h, 'file-state', st);
      if (f.state === 'ready' && was?.state !== 'ready') safeEmit(h, 'ready', st);
      if (f.state === 'failed' && was?.state !== 'failed') {
        const err = this.#retries.get(`${rec.name}/${hostId}`)?.error ?? (hostId === rec.firstHost ? (this.#retries.get(`${rec.name}/*`)?.error ?? null) : null);
        safeEmit(h, 'failed', { ...st, error: err });
      }
    }
  }

  // --- background work: first file, copies ---

  #startFirst(rec: BackingImageRecord, hostId: string, runs: Runs): void {
    runs.preparing = hostId;
    const ref = refOf(rec);
    const src = rec.source;
    const expected = rec.expectedChecksum !== null ? { expectedChecksum: rec.expectedChecksum } : {};
    const run = async (): Promise<unknown> => {
      switch (src.type) {
        case 'download':
          return this.#ctx.engineOf(hostId).downloadBackingImageFile(ref, { url: src.url, ...expected });
        case 'volume-snapshot':
          return this.#ctx.withExportTicket(src.volume, (writer) => this.#ctx.engineOf(writer).exportSnapshotToBackingImageFile(src.volume, src.snapshot, ref, expected));
        case 'upload':
          throw new MooringError('INVALID_STATE', `backing image ${rec.name} waits for an upload`);
      }
    };
    void this.#track(rec.name, '*', runs, run, () => {
      runs.preparing = null;
    });
  }

  #startDelivery(rec: BackingImageRecord, dl: Delivery, runs: Runs): void {
    runs.receiving.set(dl.target, dl.source);
    const ref = refOf(rec);
    const run = async (): Promise<unknown> => {
      const source = this.#ctx.engineOf(dl.source);
      const target = this.#ctx.engineOf(dl.target);
      // The target pulls from the source directly (else this process relays) and verifies
      // the whole file against the image's checksum on arrival.
      const { info } = await copyBackingImageFile(this.#copies, { engine: source, hostId: dl.source }, target, ref, {
        sizeBytes: rec.sizeBytes,
        offset: dl.offsetBytes,
        expectedChecksum: rec.currentChecksum,
      });
      // A write that resolves without a ready file would be retried at once, forever: count it as a failure (it backs off).
      if (info.state !== 'ready') throw new MooringError('INVALID_STATE', `copy of backing image ${rec.name} to ${dl.target} ended ${info.state}: ${info.message}`);
      return info;
    };
    void this.#track(rec.name, dl.target, runs, run, () => {
      if (runs.receiving.get(dl.target) === dl.source) runs.receiving.delete(dl.target);
    });
  }

  // Runs one piece of background work: records failures for the back-off, then reconciles.
  async #track(name: string, hostKey: string, runs: Runs, run: () => Promise<unknown>, done: () => void): Promise<void> {
    const key = `${name}/${hostKey}`;
    try {
      await run();
      this.#retries.delete(key);
    } catch (err) {
      const e = toMooringError(err, hostKey === '*' ? `preparing backing image ${name}` : `copying backing image ${name} to ${hostKey}`);
      const failures = (this.#retries.get(key)?.failures ?? 0) + 1;
      this.#retries.set(key, { failures, notBeforeMs: Date.now() + retryDelayMs(failures), error: e });
      if (e.code !== 'CANCELLED') this.#ctx.warn(e);
    } finally {
      done();
    }
    if (this.#closed || this.#runs.get(name) !== runs) return;
    await this.reconcile(name).catch((err: unknown) => this.#ctx.warn(toMooringError(err, `reconciling backing image ${name}`)));
  }

  // --- calls of the handle ---

  async #upload(name: string, data: AsyncIterable<Uint8Array | string>): Promise<BackingImageStatus> {
    this.#checkOpen();
    if (typeof data !== 'object' || data === null || typeof (data as AsyncIterable<unknown>)[Symbol.asyncIterator] !== 'function') {
      throw new MooringError('INVALID_ARGUMENT', `upload needs an AsyncIterable of bytes (a Readable, an async generator) (got ${describe(data)})`);
    }
    const { rec, runs } = await this.#serial.run(name, async () => {
      const r = await this.#record(name);
      if (r.source.type !== 'upload') throw new MooringError('INVALID_STATE', `backing image ${name} comes from a ${r.source.type}, not an upload`);
      if (r.currentChecksum !== '') throw new MooringError('INVALID_STATE', `backing image ${name} is uploaded already`);
      const rs = this.#runsOf(r);
      if (rs.preparing !== null) throw new MooringError('BUSY', `an upload of backing image ${name} runs`);
      // The first host is away: the upload goes to another reachable host instead of failing.
      let firstHost = r.firstHost;
      const here = await withTimeout(this.#ctx.engineOf(firstHost).backingImageFile(refOf(r)), this.#ctx.probeTimeoutMs, `host ${firstHost}`).then(
        () => true,
        () => false,
      );
      if (!here) firstHost = await this.#ctx.pickHost();
      rs.preparing = firstHost;
      const next = { ...r, firstHost, sourceAttempts: r.sourceAttempts + 1, cancelled: false };
      await this.#ctx.store.put(BACKING_IMAGE_KIND, name, next);
      return { rec: next, runs: rs };
    });
    const source = rec.source as { type: 'upload'; sizeBytes: number };
    const expected = rec.expectedChecksum !== null ? { expectedChecksum: rec.expectedChecksum } : {};
    let failure: MooringError | null = null;
    await this.#track(
      name,
      '*',
      runs,
      async () => {
        try {
          return await this.#ctx.engineOf(rec.firstHost).writeBackingImageFile(refOf(rec), { sizeBytes: source.sizeBytes, offset: 0, ...expected }, bytesOnly(data, name));
        } catch (err) {
          failure = toMooringError(err, `uploading backing image ${name}`);
          throw failure;
        }
      },
      () => {
        runs.preparing = null;
      },
    );
    if (failure) throw failure;
    return this.status(name);
  }

  async #cancel(name: string): Promise<void> {
    this.#checkOpen();
    await this.#serial.run(name, async () => {
      const rec = await this.#record(name);
      await this.#ctx.store.put(BACKING_IMAGE_KIND, name, { ...rec, cancelled: true });
      const runs = this.#runs.get(name);
      if (runs?.preparing) await this.#ctx.engineOf(runs.preparing).cancelBackingImageFile(refOf(rec));
    });
  }

  async #delete(name: string): Promise<void> {
    this.#checkOpen();
    await this.#serial.run(name, async () => {
      const rec = await this.#record(name);
      const usedBy = [...((await this.#ctx.usage()).get(name)?.volumes ?? [])].sort();
      if (usedBy.length > 0) throw new MooringError('BUSY', `backing image ${name} is used by volume(s) ${usedBy.join(', ')}; delete them first`, { details: { usedBy } });
      if ((this.#requests.get(name)?.size ?? 0) > 0) throw new MooringError('BUSY', `backing image ${name} is being delivered for a new volume`);
      const ref = refOf(rec);
      for (const hostId of new Set([...this.#ctx.hostIds(), ...Object.keys(rec.files)])) {
        let engine: DataEngine;
        try {
          engine = this.#ctx.engineOf(hostId);
        } catch {
          continue;
        }
        try {
          await withTimeout(engine.deleteBackingImageFile(ref), this.#ctx.probeTimeoutMs, `deleting backing image ${name} on ${hostId}`);
        } catch (err) {
          const e = toMooringError(err);
          // A replica the records do not know of still reads it: keep everything.
          if (e.code === 'BUSY') throw toMooringError(err, `deleting backing image ${name} on ${hostId}`);
          // A host that is away: its file has no record once this one is gone; reconcileAll deletes it when the host is back.
        }
      }
      await this.#ctx.store.delete(BACKING_IMAGE_KIND, name);
      this.#forget(name);
    });
  }

  async #cleanup(name: string, hostIds: string[]): Promise<BackingImageStatus> {
    this.#checkOpen();
    if (!Array.isArray(hostIds) || hostIds.length > CLEANUP_HOSTS_MAX) throw new MooringError('INVALID_ARGUMENT', `cleanup needs a list of at most ${CLEANUP_HOSTS_MAX} host ids (got ${describe(hostIds)})`);
    const named = [...new Set(hostIds.map((h) => checkName('host id', h)))];
    await this.#serial.run(name, async () => {
      const rec = await this.#record(name);
      // The record of a host that is no longer in the cluster just goes (nothing to ask there).
      const members = new Set(this.#ctx.hostIds());
      const hosts = named.filter((h) => members.has(h) || !(h in rec.files));
      const ref = refOf(rec);
      const usage = (await this.#ctx.usage()).get(name);
      const runs = this.#runsOf(rec);
      // Check every host before deleting anything: the call does all or nothing it can check.
      for (const h of hosts) {
        const info = await withTimeout(this.#ctx.engineOf(h).backingImageFile(ref), this.#ctx.probeTimeoutMs, `backing image ${name} on ${h}`);
        if ((info?.usedBy.length ?? 0) > 0 || usage?.hosts.has(h) || this.#requests.get(name)?.has(h)) {
          throw new MooringError('BUSY', `backing image ${name} on ${h} is used by a replica; it cannot be cleaned up`, { details: { hostId: h } });
        }
        if (runs.preparing === h) throw new MooringError('BUSY', `the first file of backing image ${name} is being prepared on ${h}`);
      }
      const files = { ...rec.files };
      for (const h of hosts) {
        await this.#ctx.engineOf(h).deleteBackingImageFile(ref);
        delete files[h];
      }
      for (const h of named) delete files[h];
      await this.#ctx.store.put(BACKING_IMAGE_KIND, name, { ...rec, files, disks: rec.disks.filter((h) => !named.includes(h)) });
    });
    return this.status(name);
  }

  async #setMinCopies(name: string, minCopies: number): Promise<BackingImageStatus> {
    this.#checkOpen();
    if (minCopies === undefined) throw new MooringError('INVALID_ARGUMENT', 'setMinCopies needs a number of copies');
    const n = checkIntIn('minCopies', minCopies, 1, BACKING_IMAGE_MIN_COPIES_MAX, 1);
    await this.#serial.run(name, async () => {
      const rec = await this.#record(name);
      if (rec.minCopies !== n) await this.#ctx.store.put(BACKING_IMAGE_KIND, name, { ...rec, minCopies: n });
    });
    await this.reconcile(name);
    return this.status(name);
  }

  /** How long an unused copy stays (the cleanup wait), from the next pass on. */
  setCleanupWaitMs(ms: number): void {
    this.#ctx.cleanupWaitMs = ms;
  }

  // --- internals ---

  #runsOf(rec: BackingImageRecord): Runs {
    let r = this.#runs.get(rec.name);
    if (!r || r.uuid !== rec.uuid) {
      // A new image under an old name: nothing of the old one's work applies.
      r = { uuid: rec.uuid, preparing: null, receiving: new Map() };
      this.#runs.set(rec.name, r);
    }
    return r;
  }

  #forget(name: string): void {
    this.#runs.delete(name);
    for (const k of [...this.#retries.keys()]) if (k.startsWith(`${name}/`)) this.#retries.delete(k);
  }

  #kick(name: string): void {
    void this.reconcile(name).catch((err: unknown) => this.#ctx.warn(toMooringError(err, `reconciling backing image ${name}`)));
  }

  #failure(rec: BackingImageRecord): MooringError {
    const last = this.#retries.get(`${rec.name}/*`)?.error;
    if (last) return last;
    const why = Object.entries(rec.files).map(([h, f]) => `${h}: ${f.state}${f.message ? ` (${f.message})` : ''}`).join(', ');
    return new MooringError('INVALID_STATE', `backing image ${rec.name} failed: ${why || 'no file'}`);
  }

  #statusOf(rec: BackingImageRecord, usedBy: string[]): BackingImageStatus {
    const runs = this.#runs.get(rec.name);
    const live = runs?.uuid === rec.uuid ? runs : null;
    const state = decideBackingImage({
      nowMs: Date.now(),
      cleanupWaitMs: this.#ctx.cleanupWaitMs,
      minCopies: rec.minCopies,
      firstHost: rec.firstHost,
      firstFileKnown: rec.currentChecksum !== '',
      sourceRetry: this.#sourceRetry(rec, 0),
      sourceAttempted: rec.sourceAttempts > 0,
      sendsBySource: {},
      disks: Object.entries(rec.files).map(([hostId, f]) => ({
        hostId,
        reachable: f.state !== 'unknown',
        file: f.state === 'pending' ? null : { state: f.state, receivedBytes: f.receivedBytes },
        used: false,
        requested: false,
        lastRefAtMs: f.lastRefAtMs,
        receiving: live?.receiving.has(hostId) ?? false,
        preparing: live?.preparing === hostId,
        backingOff: false,
      })),
    }).state;
    return {
      name: rec.name,
      uuid: rec.uuid,
      state,
      source: { ...rec.source },
      expectedChecksum: rec.expectedChecksum,
      currentChecksum: rec.currentChecksum,
      sizeBytes: rec.sizeBytes,
      virtualSizeBytes: rec.virtualSizeBytes,
      format: rec.format,
      minCopies: rec.minCopies,
      createdMs: rec.createdMs,
      firstHost: rec.firstHost,
      disks: [...rec.disks],
      files: Object.entries(rec.files)
        .map(([hostId, f]) => ({ hostId, state: f.state, progress: f.progress, message: f.message, lastRefAtMs: f.lastRefAtMs }))
        .sort((a, b) => (a.hostId < b.hostId ? -1 : 1)),
      usedBy,
    };
  }

  #checkOpen(): void {
    if (this.#closed) throw new MooringError('CLOSED', 'cluster is closed');
  }
}

// Passes an embedder's stream on, refusing anything that is not bytes (a Readable with an
// encoding set yields strings).
async function* bytesOnly(data: AsyncIterable<Uint8Array | string>, name: string): AsyncIterable<Uint8Array> {
  for await (const chunk of data) {
    if (!(chunk instanceof Uint8Array)) throw new MooringError('INVALID_ARGUMENT', `upload of backing image ${name}: a chunk is not bytes (${describe(typeof chunk)}); read the stream without an encoding`);
    yield chunk;
  }
}
