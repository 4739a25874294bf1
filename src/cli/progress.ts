// Progress lines of long CLI work (docs/logging.md, "Progress"): info records of the run's
// logger, so they come out as human lines or JSON like every other record. At most one line
// per interval (--progress-interval-ms) while the work goes on, always a final one.
import type { DataEngineEvent } from '../data-engine/data-engine.js';
import type { Logger } from '../util/logger.js';
import { formatBytes } from '../util/size.js';

/** The `progress` field of a progress record. */
export interface ProgressFields {
  /** What is being done, e.g. `export of snapshot s1 of v`. */
  task: string;
  doneBytes: number;
  totalBytes: number;
  /** 0..100, whole. */
  percent: number;
  /** Average since the start. */
  bytesPerSecond: number;
  elapsedMs: number;
  /** True on the final record. */
  done: boolean;
}

/** Reports the progress of one task. */
export class ProgressReporter {
  readonly #log: Logger;
  readonly #task: string;
  readonly #fields: Record<string, unknown>;
  readonly #intervalMs: number;
  readonly #now: () => number;
  readonly #start: number;
  #lastAt = -Infinity;
  #lastDone = -1;
  #finished = false;

  constructor(log: Logger, task: string, options: { fields?: Record<string, unknown>; intervalMs: number; now?: () => number }) {
    this.#log = log;
    this.#task = task;
    this.#fields = options.fields ?? {};
    this.#intervalMs = options.intervalMs;
    this.#now = options.now ?? (() => performance.now());
    this.#start = this.#now();
  }

  /** `done` of `total` bytes so far: a line unless one was printed less than the interval ago (or the work is complete: {@link finish} says so). */
  update(done: number, total: number): void {
    if (this.#finished || done >= total || done <= this.#lastDone) return;
    const now = this.#now();
    if (now - this.#lastAt < this.#intervalMs) return;
    this.#lastAt = now;
    this.#lastDone = done;
    this.#print(done, total, now, false);
  }

  /** The final line (once). */
  finish(done: number, total: number): void {
    if (this.#finished) return;
    this.#finished = true;
    this.#print(done, total, this.#now(), true);
  }

  #print(done: number, total: number, now: number, final: boolean): void {
    const elapsedMs = Math.max(0, now - this.#start);
    const percent = total > 0 ? Math.min(100, Math.floor((done / total) * 100)) : 100;
    const bytesPerSecond = elapsedMs > 0 ? Math.round((done * 1000) / elapsedMs) : 0;
    const progress: ProgressFields = { task: this.#task, doneBytes: done, totalBytes: total, percent, bytesPerSecond, elapsedMs: Math.round(elapsedMs), done: final };
    const rate = elapsedMs > 0 ? `, ${formatBytes(bytesPerSecond)}/s` : '';
    const msg = `${this.#task}: ${percent}% (${formatBytes(done)} of ${formatBytes(total)}${rate})${final ? `, done in ${(elapsedMs / 1000).toFixed(1)} s` : ''}`;
    try {
      this.#log.info({ ...this.#fields, progress }, msg);
    } catch {
      // A failing logger does not stop the work.
    }
  }
}

/**
 * Runs `copy` (a snapshot export or clone) while printing its progress: the
 * `snapshot-copy-progress` events of `volume`'s snapshot `snapshot`, bytes of the snapshot's
 * data handled of all of it; the final line at the total when `copy` resolves. `reporter`
 * null (--no-progress) prints nothing.
 */
export async function withCopyProgress<T extends { copiedBytes: number }>(
  events: { on(event: 'data-engine-event', l: (hostId: string, e: DataEngineEvent) => void): unknown; off(event: 'data-engine-event', l: (hostId: string, e: DataEngineEvent) => void): unknown },
  volume: string,
  snapshot: string,
  reporter: ProgressReporter | null,
  copy: () => Promise<T>,
): Promise<T> {
  let total: number | null = null;
  const onEvent = (_host: string, e: DataEngineEvent): void => {
    if (e.type !== 'snapshot-copy-progress' || e.volume !== volume || e.snapshot !== snapshot) return;
    total = e.totalBytes;
    reporter?.update(e.copiedBytes, e.totalBytes);
  };
  events.on('data-engine-event', onEvent);
  let r: T;
  try {
    r = await copy();
  } finally {
    events.off('data-engine-event', onEvent);
  }
  const all: number = total ?? r.copiedBytes;
  reporter?.finish(all, all);
  return r;
}

/**
 * Progress lines of the rebuilds a long-running command sees in data-engine events (serve,
 * data-engine): one task per volume and replica, from `rebuild-started` to
 * `rebuild-completed` (the final line) or `rebuild-failed` (no final line: the failure is
 * logged as its own record). Returns the listener to give the events to.
 */
export function rebuildProgress(log: Logger, intervalMs: number): (hostId: string, e: DataEngineEvent) => void {
  const running = new Map<string, ProgressReporter>();
  return (hostId, e) => {
    if (e.type !== 'rebuild-started' && e.type !== 'rebuild-progress' && e.type !== 'rebuild-completed' && e.type !== 'rebuild-failed') return;
    const key = `${hostId}/${e.volume}/${e.replicaId}`;
    if (e.type === 'rebuild-failed') {
      running.delete(key);
      return;
    }
    let p = running.get(key);
    if (!p) {
      p = new ProgressReporter(log, `rebuild of replica ${e.replicaId} of ${e.volume}`, { fields: { volume: e.volume, hostId, replicaId: e.replicaId }, intervalMs });
      running.set(key, p);
    }
    if (e.type === 'rebuild-completed') {
      running.delete(key);
      p.finish(e.totalBytes, e.totalBytes);
    } else if (e.type === 'rebuild-progress') p.update(e.scannedBytes, e.totalBytes);
  };
}
