/**
 * What the NBD export of an engine that handed its volume over does with the requests its
 * clients still send: it holds them, unread, until the engine is the writer again
 * (a migration rolled back: they are served, in order) or stops (a migration confirmed:
 * the connections close, nothing held was applied). QEMU resumes a migration's source VM
 * by itself when the migration is cancelled or fails after the switch-over, before the
 * embedder can roll back; held, the guest's requests wait instead of failing
 * (docs/migration.md, "What A's clients send after the hand-over is held").
 *
 * The hold is the export's hand-off freeze (docs/nbd-frontend.md): every connection parked
 * at a request boundary with nothing in flight, new clients waiting in the listen backlog.
 * Its memory is the sockets' kernel buffers, nothing in this process. A FLUSH at the head
 * of a connection is still answered (NbdServer::Freeze with hold). It lasts at most
 * `holdMs`; then requests are refused (NBD EPERM), as without a hold.
 *
 * @packageDocumentation
 */
import type { NbdExport } from '../nbd/nbd-export.js';

/** See the module comment. */
export class ExportHold {
  #timer: NodeJS.Timeout | undefined;
  #released: Promise<void> | null = null;

  private constructor(
    private readonly exp: NbdExport,
    holdMs: number,
  ) {
    this.#timer = setTimeout(() => void this.release().catch(() => undefined), holdMs);
    this.#timer.unref();
  }

  /**
   * Freezes `exp` (its engine still active, so what is in flight is answered first) and
   * holds it for at most `holdMs`.
   *
   * @throws MooringError BUSY (a connection did not reach a request boundary in
   *   `freezeTimeoutMs`: nothing is held), INVALID_STATE, CLOSED, UNSUPPORTED
   */
  static async start(exp: NbdExport, freezeTimeoutMs: number, holdMs: number): Promise<ExportHold> {
    await exp.freeze(freezeTimeoutMs, { hold: true });
    return new ExportHold(exp, holdMs);
  }

  /** Lets the held requests go to the engine, which serves them if it writes, else refuses them. Idempotent. */
  release(): Promise<void> {
    clearTimeout(this.#timer);
    this.#released ??= this.exp.closed ? Promise.resolve() : this.exp.unfreeze();
    return this.#released;
  }

  /** Forgets the hold without releasing it: the export closes, and with it the held connections. */
  dispose(): void {
    clearTimeout(this.#timer);
  }
}
