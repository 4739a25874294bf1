/**
 * The backing image decision (Longhorn's BackingImageController and the delivery part of its
 * BackingImageManager): a pure function from what each disk holds, which disks replicas
 * need, and what runs, to the next spec and the actions that move towards it. The
 * controller observes, calls it, applies the actions, and calls it again.
 *
 * Rules:
 * 1. Protected disks: those whose replicas use the file, those a volume waits for, and the
 *    best `minCopies` disks for availability (ready files a replica uses or waits for first,
 *    as they stay anyway; then other ready files, ones being prepared, unknown, failed; then
 *    any reachable disk, once a first file exists).
 * 2. A disk with a file that is not protected gets `lastRefAtMs` (kept if set); a protected
 *    one loses it. A file whose `lastRefAtMs` is older than the cleanup wait is deleted
 *    (never a file in use or one being prepared: those are protected or running).
 * 3. Spec (disks that should hold a file) = protected disks, plus the first host until a
 *    first file is ready.
 * 4. Each spec disk that is reachable and not ready (and does not hold a mismatched file in
 *    use) gets a copy from a ready disk with fewer
 *    than {@link SENDS_PER_SOURCE_MAX} sends running, starting at the partial file's
 *    `receivedBytes` (resume), unless a copy into it runs or its last one failed recently.
 * 5. No ready file anywhere, nothing being prepared, and every file there is failed (none
 *    unknown: a host that is away may still hold a good copy): the first file is prepared
 *    again on the first host (or another reachable one) if the source allows it.
 *
 * @packageDocumentation
 */
import type { BackingImageFileState } from '../data-engine/data-engine.js';

/** Copies one ready file may send at once (3, as in Longhorn). */
export const SENDS_PER_SOURCE_MAX = 3;

/** One disk as the controller saw it. */
export interface DiskObservation {
  /** The host whose disk it is. */
  hostId: string;
  /** Whether its data engine answered. */
  reachable: boolean;
  /** The file's state and size so far, or null if the disk holds none (unreachable: its last known state, as `unknown`). */
  file: {
    /** The file's state. */
    state: BackingImageFileState;
    /** Bytes of it on the disk. */
    receivedBytes: number;
  } | null;
  /** A replica on this disk uses the file (its data engine says so, or the records do). */
  used: boolean;
  /** A volume waits for a file here (its replica is about to be created, or is being replaced). */
  requested: boolean;
  /** When the file became unreferenced, as recorded. */
  lastRefAtMs: number | null;
  /** A copy into this disk runs now. */
  receiving: boolean;
  /** The first file is being prepared on this disk now. */
  preparing: boolean;
  /** A recent copy into this disk failed: wait before trying again. */
  backingOff: boolean;
  /**
   * Its file is not this image's (another SHA-512) and a replica uses it, so it stays: never
   * a copy, never a target, counted last for minCopies.
   */
  mismatched?: boolean;
  /**
   * Its host is being evicted: its file is never a target, does not count toward minCopies
   * once enough copies are ready elsewhere, and then goes at once when no replica uses it.
   */
  evicting?: boolean;
}

/** What the backing image decision (`decideBackingImage` in `mooring/internal`) needs to know about one image. */
export interface BackingImageDecisionInput {
  /** The time of the decision, ms since the Unix epoch. */
  nowMs: number;
  /** How long an unused file stays before it is deleted. */
  cleanupWaitMs: number;
  /** Ready copies to keep. */
  minCopies: number;
  /** Host that prepares the first file. */
  firstHost: string;
  /** A first file was ready once (currentChecksum is known): copies can be made. */
  firstFileKnown: boolean;
  /**
   * Whether the first file may be prepared again without the embedder: `now`; `later` (a
   * download backing off between attempts); `never` (an upload, a cancelled image, attempts
   * used up, or a snapshot export tried once).
   */
  sourceRetry: 'now' | 'later' | 'never';
  /** The first file was prepared (or an upload tried) at least once: with nothing left to try, the image failed even if no failed file remains on a disk. */
  sourceAttempted: boolean;
  /** Copies running per source host. */
  sendsBySource: Record<string, number>;
  /** Every host offered, and every host with a recorded file. */
  disks: DiskObservation[];
}

/** A copy to start. */
export interface Delivery {
  /** Host whose ready file is sent. */
  source: string;
  /** Host whose disk receives it. */
  target: string;
  /** The target's partial `receivedBytes` (0 for a new file). */
  offsetBytes: number;
}

/** The next spec and the actions. */
export interface BackingImageDecision {
  /** Hosts whose disk should hold a file, sorted. */
  spec: string[];
  /** lastRefAtMs per disk that holds a file or is in the spec. */
  lastRefAtMs: Record<string, number | null>;
  /** Host to prepare the first file on now, or null. */
  prepareFirstOn: string | null;
  /** Copies to start now. */
  deliveries: Delivery[];
  /** Hosts whose file is deleted now. */
  deletions: string[];
  /** The image as a whole: ready (a ready copy exists), failed (nothing left to try), pending (waits for its source), in-progress. */
  state: 'pending' | 'in-progress' | 'ready' | 'failed';
}

// Lower is better for availability. A ready file a replica uses counts first: it stays anyway.
function rank(d: DiskObservation): number {
  if (d.mismatched) return 7;
  if (!d.file) return d.reachable ? 5 : 6;
  if (d.reachable && d.file.state === 'ready' && (d.used || d.requested)) return -1;
  if (!d.reachable) return d.file.state === 'failed' ? 4 : 2;
  switch (d.file.state) {
    case 'ready':
      return 0;
    case 'in-progress':
    case 'starting':
    case 'pending':
      return 1;
    case 'unknown':
      return 2;
    case 'failed':
      return 3;
  }
}

function byId(a: DiskObservation, b: DiskObservation): number {
  return a.hostId < b.hostId ? -1 : a.hostId > b.hostId ? 1 : 0;
}

/** The decision for one image; see the module comment. Pure. */
export function decideBackingImage(input: BackingImageDecisionInput): BackingImageDecision {
  const disks = [...input.disks].sort(byId);
  const ready = (d: DiskObservation): boolean => d.reachable && d.file?.state === 'ready';
  const anyReady = disks.some(ready);

  // 1. Protected disks. An evicting disk's file keeps counting only until enough copies are
  // ready elsewhere: it may be the source they are made from.
  const protectedIds = new Set<string>();
  for (const d of disks) if (d.used || d.requested) protectedIds.add(d.hostId);
  const readyElsewhere = disks.filter((d) => ready(d) && !d.evicting && !d.mismatched).length;
  const candidates = disks.filter((d) => (d.file !== null || (input.firstFileKnown && d.reachable)) && !(d.evicting && (readyElsewhere >= input.minCopies || d.file === null)));
  candidates.sort((a, b) => Number(a.evicting === true) - Number(b.evicting === true) || rank(a) - rank(b) || byId(a, b));
  for (const d of candidates.slice(0, input.minCopies)) protectedIds.add(d.hostId);
  if (readyElsewhere < input.minCopies) for (const d of disks) if (d.evicting && ready(d)) protectedIds.add(d.hostId);
  if (!anyReady) protectedIds.add(input.firstHost);

  // 2. lastRefAtMs and cleanup.
  const lastRefAtMs: Record<string, number | null> = {};
  const deletions: string[] = [];
  for (const d of disks) {
    if (d.file === null && !protectedIds.has(d.hostId)) continue;
    const busy = d.receiving || d.preparing;
    const ref = protectedIds.has(d.hostId) || busy || d.file === null ? null : (d.lastRefAtMs ?? input.nowMs);
    lastRefAtMs[d.hostId] = ref;
    if (ref !== null && d.reachable && (d.evicting || input.nowMs - ref >= input.cleanupWaitMs)) deletions.push(d.hostId);
  }
  const deleted = new Set(deletions);

  // 3. Spec.
  const spec = disks.filter((d) => protectedIds.has(d.hostId)).map((d) => d.hostId);
  if (!spec.includes(input.firstHost) && !anyReady) spec.push(input.firstHost);
  spec.sort();

  // 4. Deliveries.
  const deliveries: Delivery[] = [];
  const sends: Record<string, number> = { ...input.sendsBySource };
  if (input.firstFileKnown) {
    const sources = disks.filter((d) => ready(d) && !deleted.has(d.hostId));
    for (const d of disks) {
      if (!protectedIds.has(d.hostId) || !d.reachable || ready(d) || d.receiving || d.preparing || d.backingOff || d.mismatched) continue;
      if (d.evicting && !d.used && !d.requested) continue;
      const src = sources.filter((s) => (sends[s.hostId] ?? 0) < SENDS_PER_SOURCE_MAX).sort((a, b) => (sends[a.hostId] ?? 0) - (sends[b.hostId] ?? 0) || byId(a, b))[0];
      if (!src) break;
      sends[src.hostId] = (sends[src.hostId] ?? 0) + 1;
      deliveries.push({ source: src.hostId, target: d.hostId, offsetBytes: d.file?.receivedBytes ?? 0 });
    }
  }

  // 5. The first file, again.
  const running = disks.some((d) => d.preparing || d.receiving);
  const maybeGood = disks.some((d) => d.file !== null && d.file.state !== 'failed');
  let prepareFirstOn: string | null = null;
  if (!anyReady && !running && !maybeGood && input.sourceRetry === 'now') {
    const first = disks.find((d) => d.hostId === input.firstHost);
    prepareFirstOn = first?.reachable ? first.hostId : (disks.find((d) => d.reachable)?.hostId ?? null);
  }

  let state: BackingImageDecision['state'];
  if (anyReady) state = 'ready';
  else if (running || maybeGood || prepareFirstOn !== null) state = 'in-progress';
  // Every file failed (or the attempts left none): final unless the source can be tried again.
  else if (disks.some((d) => d.file?.state === 'failed') || input.sourceAttempted) state = input.sourceRetry === 'never' ? 'failed' : 'pending';
  else state = 'pending';
  return { spec, lastRefAtMs, prepareFirstOn, deliveries, deletions, state };
}
