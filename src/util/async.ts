// Small async helpers shared by the control plane (the cluster and the backing image
// controller, the downloader, the bench): a timer that never keeps the process alive, one
// that an AbortSignal ends, a deadline on a promise, and a per-key chain that runs decisions about one object one at a time.
import { MooringError } from '../errors.js';

/** Resolves after `ms`; the timer does not keep the process alive. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms).unref());
}

/**
 * Resolves after `ms`; unlike {@link sleep} its timer keeps the process alive: for the polls
 * of a call the embedder awaits (a script that awaits nothing else must not exit midway).
 */
export function delay(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Resolves after `ms`, or rejects with `signal.reason` as soon as `signal` aborts (at once
 * if it already has). Unlike {@link sleep} its timer keeps the process alive: the caller is
 * waiting on it.
 */
export function sleepUnlessAborted(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** `p`, or UNAVAILABLE naming `what` if it does not settle within `ms`. */
export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new MooringError('UNAVAILABLE', `${what}: no answer within ${ms} ms`)), ms);
    t.unref();
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
}

/** Runs functions one at a time per key (in call order); a failure does not stop the chain. */
export class KeyedSerial {
  readonly #chains = new Map<string, Promise<unknown>>();

  /** Runs `fn` after every earlier function of `key` settled; resolves with its result. */
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#chains.get(key) ?? Promise.resolve();
    const next = prev.catch(() => undefined).then(fn);
    const tail = next.catch(() => undefined);
    this.#chains.set(key, tail);
    void tail.then(() => {
      if (this.#chains.get(key) === tail) this.#chains.delete(key);
    });
    return next;
  }
}
