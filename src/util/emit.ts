// Emitting from places where a throwing listener must not break our own bookkeeping (close
// paths, callbacks from native code): the listener's exception is rethrown on its own tick,
// where it surfaces as an ordinary uncaught exception of the application.
import type { EventEmitter } from 'node:events';

/** Emits `event`; a listener that throws is reported asynchronously instead of unwinding us. */
export function safeEmit(emitter: unknown, event: string, ...args: unknown[]): void {
  try {
    (emitter as EventEmitter).emit(event, ...args);
  } catch (err) {
    process.nextTick(() => {
      throw err;
    });
  }
}
