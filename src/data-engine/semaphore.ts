// A counting semaphore: at most `permits` holders at once, the rest wait in arrival order.
// The data engine uses it to bound rebuilds across all of its engines.
import { MooringError } from '../errors.js';

/** Bounds concurrent work; waiters queue in FIFO order. */
export class Semaphore {
  readonly #waiters: Array<() => void> = [];
  #free: number;

  /**
   * @param permits - how many holders at once (at least 1)
   * @param waitersMax - longest queue; a caller beyond it is refused with BUSY
   */
  constructor(
    permits: number,
    readonly waitersMax: number,
  ) {
    this.#free = permits;
  }

  /** Holders waiting for a permit. */
  get waiting(): number {
    return this.#waiters.length;
  }

  /** Waits for a permit; the returned function gives it back (call it exactly once). */
  async acquire(): Promise<() => void> {
    if (this.#free > 0) {
      this.#free--;
    } else {
      if (this.#waiters.length >= this.waitersMax) {
        throw new MooringError('BUSY', `${this.#waiters.length} callers wait already (the limit is ${this.waitersMax})`);
      }
      await new Promise<void>((res) => this.#waiters.push(res));
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.#waiters.shift();
      // The permit passes straight to the next waiter, so none can jump the queue.
      if (next) next();
      else this.#free++;
    };
  }
}
