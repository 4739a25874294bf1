// Writes known data over NBD while recording exactly which writes a FLUSH (or FUA) made
// durable, so that after a crash the survivors can be checked against NBD's promise:
// a write whose reply arrived before a FLUSH was sent is durable once that FLUSH replies
// (on any connection, with CAN_MULTI_CONN); a FUA write is durable at its own reply.
//
// Writes to one block never overlap in time (a block is busy until its write is answered),
// so the writes to a block are totally ordered and after a crash each sector of the block
// must hold one of: the last durable write, or any write issued after it.
import { CMD_FLAG, NbdClient, NbdClosedError, NbdReplyError } from './nbd-client.js';
import { Rng } from './pattern.js';

const BLOCK = 4096;
const SECTOR = 512;
const MAGIC = 0x4d4f4f52; // "MOOR"

interface WriteRecord {
  gen: number;
  fua: boolean;
  /** Event tick at which the reply was processed; null while unanswered (or never). */
  ackTick: number | null;
}

interface BlockState {
  /** Content known to be there when this round began. */
  baseline: Buffer;
  writes: WriteRecord[];
  busy: boolean;
}

export interface TrackerRoundStats {
  writes: number;
  acked: number;
  flushes: number;
  /** Blocks whose content after the crash is pinned to a durable write. */
  durableBlocks: number;
}

export class FlushTracker {
  private blocks: BlockState[];
  private tick = 0;
  private durableTick = 0;
  private gen = 0;
  private stopped = false;
  private rng: Rng;
  private stats: TrackerRoundStats = { writes: 0, acked: 0, flushes: 0, durableBlocks: 0 };
  /**
   * A write answered with an error (EIO once an engine lost its quorum) is not acknowledged
   * and may or may not have landed, as NBD allows: with this set, its writer stops there
   * instead of failing the run.
   */
  allowWriteErrors = false;
  /** Called after each FLUSH reply is recorded (a test may crash the server right there). */
  onFlushed: ((flushCount: number) => void) | null = null;

  constructor(
    readonly offset: number,
    readonly blockCount: number,
    readonly seed: number,
  ) {
    this.rng = new Rng(seed);
    this.blocks = Array.from({ length: blockCount }, () => ({ baseline: Buffer.alloc(BLOCK), writes: [], busy: false }));
  }

  /** The data of write `gen` to block `b`: a header naming both, then pseudo-random bytes. */
  blockData(b: number, gen: number): Buffer {
    const buf = new Rng((this.seed * 2654435761) ^ (b * 40503) ^ (gen * 2246822519)).bytes(BLOCK);
    // Stamp every sector, so a torn write still shows whose sectors are where.
    for (let s = 0; s < BLOCK; s += SECTOR) {
      buf.writeUInt32LE(MAGIC, s);
      buf.writeUInt32LE(b, s + 4);
      buf.writeUInt32LE(gen, s + 8);
    }
    return buf;
  }

  /**
   * Runs writers on every client (`depth` writes in flight each, FLUSH every `flushEvery`
   * writes, FUA on some) until stop() or the connections drop. Never rejects.
   */
  async run(clients: NbdClient[], depth = 8, flushEvery = 24): Promise<void> {
    this.stopped = false;
    await Promise.all(clients.map((c) => this.runClient(c, depth, flushEvery)));
  }

  stop(): void {
    this.stopped = true;
  }

  /** Writes acknowledged so far in this round (verify() starts a new round). */
  get acked(): number {
    return this.stats.acked;
  }

  private async runClient(c: NbdClient, depth: number, flushEvery: number): Promise<void> {
    let sinceFlush = 0;
    let flushing = false;
    const writer = async (): Promise<void> => {
      while (!this.stopped && !c.isClosed) {
        let b = this.rng.int(this.blockCount);
        for (let tries = 0; this.blocks[b]!.busy && tries < 64; tries++) b = this.rng.int(this.blockCount);
        const block = this.blocks[b]!;
        if (block.busy) {
          await new Promise((r) => setImmediate(r));
          continue;
        }
        const rec: WriteRecord = { gen: ++this.gen, fua: this.rng.chance(0.1), ackTick: null };
        block.busy = true;
        block.writes.push(rec);
        this.stats.writes++;
        try {
          await c.write(this.offset + b * BLOCK, this.blockData(b, rec.gen), rec.fua ? CMD_FLAG.FUA : 0);
          rec.ackTick = ++this.tick;
          this.stats.acked++;
        } catch (e) {
          if (!(e instanceof NbdClosedError) && !c.isClosed && !(this.allowWriteErrors && e instanceof NbdReplyError)) throw e;
          return;
        } finally {
          block.busy = false;
        }
        if (++sinceFlush >= flushEvery && !flushing) {
          sinceFlush = 0;
          flushing = true;
          const sendTick = ++this.tick;
          c.flush().then(
            () => {
              flushing = false;
              this.durableTick = Math.max(this.durableTick, sendTick);
              this.stats.flushes++;
              this.onFlushed?.(this.stats.flushes);
            },
            () => {
              flushing = false;
            },
          );
        }
      }
    };
    await Promise.all(Array.from({ length: depth }, writer));
  }

  /**
   * Checks what a reopened volume holds (`region` = the tracked range, read back) against
   * the record. Returns a list of violations (empty = fine), then makes what was read the
   * baseline for the next round.
   */
  verify(region: Buffer): { violations: string[]; stats: TrackerRoundStats } {
    const violations: string[] = [];
    let durableBlocks = 0;
    for (let b = 0; b < this.blockCount; b++) {
      const block = this.blocks[b]!;
      const got = region.subarray(b * BLOCK, (b + 1) * BLOCK);
      let d = -1;
      block.writes.forEach((w, i) => {
        if (w.ackTick !== null && (w.fua || w.ackTick < this.durableTick)) d = i;
      });
      if (d >= 0) durableBlocks++;
      const candidates: Buffer[] = d >= 0 ? [] : [block.baseline];
      for (const w of block.writes.slice(Math.max(d, 0))) candidates.push(this.blockData(b, w.gen));
      for (let s = 0; s < BLOCK; s += SECTOR) {
        const sector = got.subarray(s, s + SECTOR);
        if (!candidates.some((c) => c.subarray(s, s + SECTOR).equals(sector))) {
          const durable = d >= 0 ? `gen ${block.writes[d]!.gen} (${block.writes[d]!.fua ? 'FUA' : 'flushed'})` : 'none';
          const found = sector.readUInt32LE(0) === MAGIC ? `block ${sector.readUInt32LE(4)} gen ${sector.readUInt32LE(8)}` : `bytes ${sector.subarray(0, 12).toString('hex')}`;
          violations.push(`block ${b} (offset ${this.offset + b * BLOCK}) sector ${s / SECTOR}: holds ${found}; last durable write ${durable}; allowed gens ${block.writes.slice(Math.max(d, 0)).map((w) => w.gen).join(',') || '-'}`);
          break;
        }
      }
      block.baseline = Buffer.from(got);
      block.writes = [];
    }
    const stats = { ...this.stats, durableBlocks };
    this.stats = { writes: 0, acked: 0, flushes: 0, durableBlocks: 0 };
    this.durableTick = 0;
    this.tick = 0;
    return { violations, stats };
  }
}
