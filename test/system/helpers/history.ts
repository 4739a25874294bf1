// A history of what NBD clients sent and were told, and a checker of what a volume holds
// against it (the fault tests, docs/fault-tests.md).
//
// Every write carries data that names itself: each 512-byte sector starts with a magic, the
// history's id, the write's id and the sector's own number, then a filler derived from those.
// So any sector read back says which write put it there (or that nobody did).
//
// Time is a logical clock: one tick per event, taken in this (single) JS thread. A request's
// `sent` tick is taken before it is handed to the socket and its `acked` tick when its reply
// is processed, so a recorded order "A acked before B sent" is true of the real one too.
//
// The rules (NBD's, and invariants 1-2 of the design):
// - Durable: a write whose reply arrived before a FLUSH was sent is durable once that FLUSH
//   replies successfully, on any connection (CAN_MULTI_CONN); a FUA write is durable at its
//   own reply.
// - A read of a sector may return the data of write W when some order of the writes that
//   respects real time (A before B whenever A was acknowledged before B was sent) puts W last
//   among the writes durable by the read's start: i.e. W was sent before the read ended and
//   W was not acknowledged before any of those durable writes was sent. Writes not (yet)
//   acknowledged, or that failed, may or may not have happened. The initial content (the
//   baseline, zeros) is allowed only where no durable write covers the sector.
// - Anything else is a violation: `lost` (a durable write is not visible: the sector holds
//   older data, or the baseline) or `foreign` (data no write put there: unknown id, another
//   sector's data, a torn or corrupt sector, or a write sent after the read ended).
// - Fences (dual writer): once fence(group) is called (a newer engine serves the volume),
//   no write sent on a connection of that group afterwards may be acknowledged.
import { createHash } from 'node:crypto';

export const SECTOR = 512;
/** "MFTS" */
const MAGIC = 0x5354464d;
const HEADER = 20;

export interface WriteOp {
  kind: 'write';
  id: number;
  client: string;
  offset: number;
  length: number;
  fua: boolean;
  sent: number;
  /** Tick of a successful reply; null if none (yet). */
  acked: number | null;
  /** Tick of an error reply or of the connection's loss, with why. */
  failed: number | null;
  error: string | null;
}

export interface FlushOp {
  kind: 'flush';
  id: number;
  client: string;
  sent: number;
  acked: number | null;
  failed: number | null;
  error: string | null;
}

export interface ReadOp {
  id: number;
  client: string;
  offset: number;
  length: number;
  sent: number;
  acked: number;
  data: Buffer;
}

export interface Violation {
  kind: 'lost' | 'foreign' | 'dual-writer';
  /** Byte range concerned (for reads: consecutive sectors with the same finding). */
  offset: number;
  length: number;
  message: string;
}

export interface HistoryStats {
  writes: number;
  acked: number;
  failed: number;
  unanswered: number;
  fua: number;
  flushes: number;
  flushesAcked: number;
  durableWrites: number;
  reads: number;
  sectorsChecked: number;
  /** Sectors read that a durable write covered (what the check could have found lost). */
  durableSectors: number;
  /** Writes acknowledged on a fenced connection that were sent after its fence. */
  ackedAfterFence: number;
}

export interface Verdict {
  ok: boolean;
  /** Lost first, then foreign, then dual-writer (at most maxViolations of each). */
  violations: Violation[];
  stats: HistoryStats;
  /** One paragraph: the counts, then the first violations. */
  summary: string;
}

/** Where a sector's data came from, as its header says. */
export interface SectorStamp {
  history: number;
  writeId: number;
  sector: number;
}

export class History {
  readonly writes: WriteOp[] = [];
  readonly flushes: FlushOp[] = [];
  readonly reads: ReadOp[] = [];
  private clock = 0;
  private nextId = 1;
  private readonly groups = new Map<string, string>();
  /** Per group, the intervals in which it was fenced (to: null while still fenced). */
  private readonly fences = new Map<string, Array<{ from: number; to: number | null }>>();
  private readonly fenceLog: Array<{ group: string; tick: number; note: string }> = [];

  /** `id` tells this history's data from any other's; `baseline` fills sectors nobody wrote (default zeros). */
  constructor(
    readonly id: number,
    readonly baseline: Buffer = Buffer.alloc(SECTOR),
  ) {
    if (baseline.length !== SECTOR) throw new Error(`baseline must be one ${SECTOR}-byte sector`);
    // The id is stamped into every sector as a uint32: anything else would read back as another history's.
    if (!Number.isInteger(id) || id < 0 || id > 0xffffffff) throw new Error(`history id must be a uint32, got ${String(id)}`);
  }

  /** The next tick of the logical clock. */
  tick(): number {
    return ++this.clock;
  }

  /** Names a client and the group (the engine, e.g. its host) whose connection it is. */
  client(name: string, group: string): void {
    this.groups.set(name, group);
  }

  groupOf(client: string): string {
    return this.groups.get(client) ?? client;
  }

  /**
   * From now on (until unfence), no write sent on a connection of `group` may be
   * acknowledged: call it once another engine is known to be the writer (its takeover or
   * activation returned).
   */
  fence(group: string, note = ''): number {
    const t = this.tick();
    const list = this.fences.get(group) ?? [];
    if (list.length === 0 || list[list.length - 1]!.to !== null) list.push({ from: t, to: null });
    this.fences.set(group, list);
    this.fenceLog.push({ group, tick: t, note });
    return t;
  }

  /**
   * Ends `group`'s fence: its engine may be the writer again (e.g. a migration rolled back
   * to it). Call it before the call that makes it the writer: a write it received while
   * fenced may then be acknowledged (it was held), but not before this tick.
   */
  unfence(group: string, note = ''): number {
    const t = this.tick();
    const list = this.fences.get(group);
    const open = list?.[list.length - 1];
    if (open && open.to === null) open.to = t;
    this.fenceLog.push({ group, tick: t, note: `unfenced${note ? `: ${note}` : ''}` });
    return t;
  }

  /** The data of a new write (call before sending it); `length` and `offset` in whole sectors. */
  beginWrite(client: string, offset: number, length: number, fua: boolean): { op: WriteOp; data: Buffer } {
    if (offset % SECTOR !== 0 || length % SECTOR !== 0 || length <= 0) throw new Error(`write ${offset}+${length} is not in whole sectors`);
    const op: WriteOp = { kind: 'write', id: this.nextId++, client, offset, length, fua, sent: 0, acked: null, failed: null, error: null };
    const data = this.dataOf(op.id, offset, length);
    op.sent = this.tick();
    this.writes.push(op);
    return { op, data };
  }

  beginFlush(client: string): FlushOp {
    const op: FlushOp = { kind: 'flush', id: this.nextId++, client, sent: this.tick(), acked: null, failed: null, error: null };
    this.flushes.push(op);
    return op;
  }

  /** Records the outcome of a write or flush: success, or an error (reply or lost connection). */
  end(op: WriteOp | FlushOp, error: string | null): void {
    if (op.acked !== null || op.failed !== null) throw new Error(`${op.kind} ${op.id} ended twice`);
    if (error === null) op.acked = this.tick();
    else {
      op.failed = this.tick();
      op.error = error;
    }
  }

  /** Records a read that was sent at tick `sent` (take it with tick() before sending) and returned `data`. */
  recordRead(client: string, offset: number, sent: number, data: Buffer): ReadOp {
    if (offset % SECTOR !== 0 || data.length % SECTOR !== 0) throw new Error(`read ${offset}+${data.length} is not in whole sectors`);
    const op: ReadOp = { id: this.nextId++, client, offset, length: data.length, sent, acked: this.tick(), data: Buffer.from(data) };
    this.reads.push(op);
    return op;
  }

  /** What write `id` puts at [offset, offset+length). */
  dataOf(id: number, offset: number, length: number): Buffer {
    const buf = Buffer.allocUnsafe(length);
    for (let s = 0; s < length; s += SECTOR) this.sectorData(id, (offset + s) / SECTOR).copy(buf, s);
    return buf;
  }

  /** The 512 bytes write `id` puts in sector number `sector`. */
  sectorData(id: number, sector: number): Buffer {
    const b = Buffer.allocUnsafe(SECTOR);
    b.writeUInt32LE(MAGIC, 0);
    b.writeUInt32LE(this.id >>> 0, 4);
    b.writeUInt32LE(id >>> 0, 8);
    b.writeUInt32LE(sector % 0x1_0000_0000, 12);
    b.writeUInt32LE(Math.floor(sector / 0x1_0000_0000), 16);
    // Filler: an 8-byte pattern from the header (cheap to make and to compare).
    const h = createHash('sha1').update(b.subarray(0, HEADER)).digest();
    b.fill(h.subarray(0, 8), HEADER);
    return b;
  }

  /** The header of a sector, or null if it carries none. */
  static stamp(sector: Buffer): SectorStamp | null {
    if (sector.length < HEADER || sector.readUInt32LE(0) !== MAGIC) return null;
    return { history: sector.readUInt32LE(4), writeId: sector.readUInt32LE(8), sector: sector.readUInt32LE(12) + sector.readUInt32LE(16) * 0x1_0000_0000 };
  }

  /**
   * Tick at which each acknowledged write became durable (absent: never). With
   * `ackedIsDurable`, every write is durable at its reply: right where no process crashed
   * (invariant 1: a write whose reply was sent is on every RW replica).
   */
  durableTicks(ackedIsDurable = false): Map<number, number> {
    const out = new Map<number, number>();
    // Flushes that succeeded, by send tick, with the earliest reply among those sent later.
    const ok = this.flushes.filter((f) => f.acked !== null).sort((a, b) => a.sent - b.sent);
    const minAckFrom = new Array<number>(ok.length + 1).fill(Infinity);
    for (let i = ok.length - 1; i >= 0; i--) minAckFrom[i] = Math.min(minAckFrom[i + 1]!, ok[i]!.acked!);
    for (const w of this.writes) {
      if (w.acked === null) continue;
      let d = w.fua || ackedIsDurable ? w.acked : Infinity;
      // First flush sent after the write's reply.
      let lo = 0;
      let hi = ok.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (ok[mid]!.sent > w.acked) hi = mid;
        else lo = mid + 1;
      }
      d = Math.min(d, minAckFrom[lo]!);
      if (d !== Infinity) out.set(w.id, d);
    }
    return out;
  }

  /** Runs every rule over the whole history (see the module comment). */
  check(opts: { maxViolations?: number; ackedIsDurable?: boolean } = {}): Verdict {
    const max = opts.maxViolations ?? 50;
    // Kept per kind (up to `max` each), so one kind's flood does not hide another.
    const kept: Record<Violation['kind'], Violation[]> = { lost: [], foreign: [], 'dual-writer': [] };
    const total = { lost: 0, foreign: 0, 'dual-writer': 0 };
    const push = (v: Violation): void => {
      total[v.kind]++;
      if (kept[v.kind].length < max) kept[v.kind].push(v);
    };
    const durable = this.durableTicks(opts.ackedIsDurable === true);
    const byId = new Map<number, WriteOp>();
    for (const w of this.writes) byId.set(w.id, w);

    // Dual writer: sent after a fence began and acknowledged before it ended.
    let ackedAfterFence = 0;
    for (const w of this.writes) {
      if (w.acked === null) continue;
      const f = (this.fences.get(this.groupOf(w.client)) ?? []).find((x) => w.sent > x.from && (x.to === null || w.acked! < x.to));
      if (!f) continue;
      ackedAfterFence++;
      push({
        kind: 'dual-writer',
        offset: w.offset,
        length: w.length,
        message: `write #${w.id} ${w.offset}+${w.length}${w.fua ? ' FUA' : ''} on ${w.client} (engine ${this.groupOf(w.client)}) was sent at t${w.sent}, after that engine was fenced at t${f.from}, and acknowledged at t${w.acked}${f.to !== null ? ` (fence lifted at t${f.to})` : ''}${durable.has(w.id) ? ` (durable at t${durable.get(w.id)})` : ''}`,
      });
    }

    let sectorsChecked = 0;
    let durableSectors = 0;
    for (const r of this.reads) {
      const first = r.offset / SECTOR;
      const n = r.length / SECTOR;
      // Per sector of the read: the latest send tick of a write durable before the read
      // began (and that write), from every write covering it.
      const maxDurableSent = new Float64Array(n).fill(-1);
      const latestDurable = new Int32Array(n).fill(0);
      for (const w of this.writes) {
        const dt = durable.get(w.id);
        if (dt === undefined || dt > r.sent) continue;
        const a = Math.max(w.offset / SECTOR, first);
        const b = Math.min((w.offset + w.length) / SECTOR, first + n);
        for (let s = a; s < b; s++) {
          if (w.sent > maxDurableSent[s - first]!) {
            maxDurableSent[s - first] = w.sent;
            latestDurable[s - first] = w.id;
          }
        }
      }
      // Consecutive sectors with the same finding are reported as one range.
      let run: { start: number; count: number; kind: Violation['kind']; key: string; message: string } | null = null;
      const flush = (): void => {
        if (!run) return;
        const extra = run.count > 1 ? ` (and the ${run.count - 1} sectors after it alike)` : '';
        push({ kind: run.kind, offset: run.start * SECTOR, length: run.count * SECTOR, message: `${run.message}${extra}` });
        run = null;
      };
      const report = (sector: number, kind: Violation['kind'], key: string, message: string): void => {
        if (run && run.kind === kind && run.key === key && run.start + run.count === sector) {
          run.count++;
          return;
        }
        flush();
        run = { start: sector, count: 1, kind, key, message };
      };
      for (let i = 0; i < n; i++) {
        sectorsChecked++;
        const sector = first + i;
        const got = r.data.subarray(i * SECTOR, (i + 1) * SECTOR);
        const dId = latestDurable[i]!;
        if (dId !== 0) durableSectors++;
        const d = dId !== 0 ? byId.get(dId)! : null;
        const describeD = (): string => (d ? `write #${d.id} ${this.describeWrite(d, durable)}` : 'none');
        const where = `read #${r.id} on ${r.client} (t${r.sent}-t${r.acked}), sector ${sector} (byte ${sector * SECTOR})`;
        const st = History.stamp(got);
        if (!st || st.history !== this.id) {
          if (got.equals(this.baseline)) {
            if (d) report(sector, 'lost', `base/${dId}`, `${where}: holds the initial content, but ${describeD()} covers it`);
          } else {
            report(sector, 'foreign', 'junk', `${where}: holds data no write of this history made (${st ? `history ${st.history}` : `bytes ${got.subarray(0, 16).toString('hex')}`})`);
          }
          continue;
        }
        const w = byId.get(st.writeId);
        if (!w) {
          report(sector, 'foreign', `unknown/${st.writeId}`, `${where}: holds data of write #${st.writeId}, which was never sent`);
          continue;
        }
        if (st.sector !== sector) {
          report(sector, 'foreign', `moved/${w.id}`, `${where}: holds write #${w.id}'s data for sector ${st.sector} (misplaced)`);
          continue;
        }
        if (sector < w.offset / SECTOR || sector >= (w.offset + w.length) / SECTOR) {
          report(sector, 'foreign', `outside/${w.id}`, `${where}: holds data of write #${w.id}, which did not cover it`);
          continue;
        }
        if (!got.equals(this.sectorData(w.id, sector))) {
          report(sector, 'foreign', `torn/${w.id}`, `${where}: holds a torn or corrupt sector of write #${w.id}`);
          continue;
        }
        if (w.sent > r.acked) {
          report(sector, 'foreign', `future/${w.id}`, `${where}: holds write #${w.id}, sent at t${w.sent}, after the read returned`);
          continue;
        }
        if (w.acked !== null && w.acked < maxDurableSent[i]!) {
          report(sector, 'lost', `stale/${w.id}/${dId}`, `${where}: holds write #${w.id} ${this.describeWrite(w, durable)}, older than ${describeD()}, which is lost`);
        }
      }
      flush();
    }

    const stats: HistoryStats = {
      writes: this.writes.length,
      acked: this.writes.filter((w) => w.acked !== null).length,
      failed: this.writes.filter((w) => w.failed !== null).length,
      unanswered: this.writes.filter((w) => w.acked === null && w.failed === null).length,
      fua: this.writes.filter((w) => w.fua && w.acked !== null).length,
      flushes: this.flushes.length,
      flushesAcked: this.flushes.filter((f) => f.acked !== null).length,
      durableWrites: durable.size,
      reads: this.reads.length,
      sectorsChecked,
      durableSectors,
      ackedAfterFence,
    };
    const violations = [...kept.lost, ...kept.foreign, ...kept['dual-writer']];
    const ok = total.lost + total.foreign + total['dual-writer'] === 0;
    const counts = `${total.lost} lost, ${total.foreign} foreign, ${total['dual-writer']} dual-writer`;
    const fences = this.fenceLog.map((f) => `${f.group}@t${f.tick}${f.note ? ` (${f.note})` : ''}`).join(', ') || 'none';
    const summary = ok
      ? `history ${this.id}: ok; ${JSON.stringify(stats)}; fences: ${fences}`
      : `history ${this.id}: VIOLATIONS (${counts}); ${JSON.stringify(stats)}; fences: ${fences}\n` +
        [...kept.lost.slice(0, 5), ...kept.foreign.slice(0, 5), ...kept['dual-writer'].slice(0, 5)].map((v) => `  [${v.kind}] ${v.message}`).join('\n');
    return { ok, violations, stats, summary };
  }

  private describeWrite(w: WriteOp, durable: Map<number, number>): string {
    const state = w.acked !== null ? `acknowledged at t${w.acked}` : w.failed !== null ? `failed at t${w.failed} (${w.error})` : 'never answered';
    const dt = durable.get(w.id);
    const dur = dt === undefined ? '' : w.fua ? ', FUA' : dt === w.acked ? '' : `, durable by a FLUSH at t${dt}`;
    return `(${w.offset}+${w.length} on ${w.client}, sent t${w.sent}, ${state}${dur})`;
  }
}
