// The fault tests' history checker (test/system/helpers/history.ts) on hand-made histories:
// what NBD allows passes, lost durable writes, data nobody wrote and acknowledgements from a
// fenced engine are flagged.
import { describe, expect, it } from 'vitest';

import { History, SECTOR, type FlushOp, type WriteOp } from '../../system/helpers/history.js';

const K4 = 4096;
const REGION = 4 * K4;

// A tiny driver: writes and flushes start and end when the test says, reads return what
// the test composes from the writes' data.
class Script {
  readonly h = new History(7);
  write(client: string, offset: number, length = K4, fua = false): { op: WriteOp; data: Buffer } {
    return this.h.beginWrite(client, offset, length, fua);
  }
  ack(op: WriteOp | FlushOp): void {
    this.h.end(op, null);
  }
  fail(op: WriteOp | FlushOp, why = 'EIO'): void {
    this.h.end(op, why);
  }
  flush(client: string): FlushOp {
    return this.h.beginFlush(client);
  }
  /** A read of the region whose content is `parts` laid over zeros. */
  read(parts: Array<{ offset: number; data: Buffer }>, client = 'check'): void {
    const buf = Buffer.alloc(REGION);
    for (const p of parts) p.data.copy(buf, p.offset);
    const sent = this.h.tick();
    this.h.recordRead(client, 0, sent, buf);
  }
}

describe('History checker', () => {
  it('passes a flushed write that reads back, and unflushed data either way', () => {
    const s = new Script();
    const w1 = s.write('a1', 0);
    s.ack(w1.op);
    const f = s.flush('a1');
    s.ack(f);
    const w2 = s.write('a1', K4); // acknowledged, never flushed: may be lost
    s.ack(w2.op);
    const w3 = s.write('a2', 2 * K4); // never answered: may or may not be there
    s.read([{ offset: 0, data: w1.data }, { offset: 2 * K4, data: w3.data }]);
    s.read([{ offset: 0, data: w1.data }, { offset: K4, data: w2.data }]);
    const v = s.h.check();
    expect(v.summary).toMatch(/ok/);
    expect(v.ok).toBe(true);
    expect(v.stats).toMatchObject({ writes: 3, acked: 2, unanswered: 1, durableWrites: 1, flushesAcked: 1 });
    expect(v.stats.durableSectors).toBe(2 * (K4 / SECTOR));
  });

  it('flags a flushed write that is gone (zeros) as lost', () => {
    const s = new Script();
    const w1 = s.write('a1', K4);
    s.ack(w1.op);
    const f = s.flush('a2'); // another connection's FLUSH covers it too
    s.ack(f);
    s.read([]);
    const v = s.h.check();
    expect(v.ok).toBe(false);
    expect(v.violations).toHaveLength(1);
    expect(v.violations[0]).toMatchObject({ kind: 'lost', offset: K4, length: K4 });
    expect(v.violations[0]!.message).toMatch(/initial content, but write #1 .*durable by a FLUSH/);
    expect(v.summary).toMatch(/1 lost, 0 foreign, 0 dual-writer/);
  });

  it('flags older data over a durable write as lost, allows a later unacknowledged one', () => {
    const s = new Script();
    const old = s.write('a1', 0);
    s.ack(old.op);
    const fua = s.write('a1', 0, K4, true); // FUA: durable at its reply
    s.ack(fua.op);
    const later = s.write('b1', 0); // sent after, never answered: NBD allows it to be seen
    s.read([{ offset: 0, data: later.data }]);
    expect(s.h.check().ok).toBe(true);
    s.read([{ offset: 0, data: fua.data }]);
    expect(s.h.check().ok).toBe(true);
    s.read([{ offset: 0, data: old.data }]);
    const v = s.h.check();
    expect(v.ok).toBe(false);
    expect(v.violations[0]!.kind).toBe('lost');
    expect(v.violations[0]!.message).toMatch(/holds write #1 .*older than write #2 .*FUA/);
  });

  it('allows either of two overlapping writes in flight together, and a torn mix sector by sector', () => {
    const s = new Script();
    const x = s.write('a1', 0, 2 * K4);
    const y = s.write('a2', K4, 2 * K4); // overlaps x on [4K, 8K), both in flight
    s.ack(y.op);
    s.ack(x.op);
    const f = s.flush('a1');
    s.ack(f);
    // x's data everywhere it wrote (y "happened first" on the overlap) ...
    s.read([{ offset: 0, data: x.data }, { offset: 2 * K4, data: y.data.subarray(K4) }]);
    // ... or y's on the overlap, or a mix of whole sectors.
    const mix = Buffer.from(x.data);
    y.data.copy(mix, K4, 0, 3 * SECTOR);
    s.read([{ offset: 0, data: mix }, { offset: 2 * K4, data: y.data.subarray(K4) }]);
    expect(s.h.check().summary).toMatch(/ok/);
  });

  it('a flush sent before the write was acknowledged does not make it durable; a failed flush neither', () => {
    const s = new Script();
    const w = s.write('a1', 0);
    const early = s.flush('a2');
    s.ack(w.op);
    s.ack(early);
    const failed = s.flush('a1');
    s.fail(failed);
    s.read([]);
    const v = s.h.check();
    expect(v.ok).toBe(true);
    expect(v.stats.durableWrites).toBe(0);
  });

  it('durability counts from the read start: a read before the flush may miss the write', () => {
    const s = new Script();
    const w = s.write('a1', 0);
    s.ack(w.op);
    s.read([]); // before any flush: zeros are fine
    const f = s.flush('a1');
    s.ack(f);
    expect(s.h.check().ok).toBe(true);
    s.read([]); // after it: lost
    expect(s.h.check().violations.map((v) => v.kind)).toEqual(['lost']);
  });

  it('with ackedIsDurable (no crash in the history), an acknowledged write lost without a FLUSH is flagged too', () => {
    const s = new Script();
    const w = s.write('a1', 0);
    s.ack(w.op);
    s.read([]);
    expect(s.h.check().ok).toBe(true);
    const v = s.h.check({ ackedIsDurable: true });
    expect(v.violations.map((x) => x.kind)).toEqual(['lost']);
    expect(v.violations[0]!.message).toMatch(/initial content, but write #1 \(0\+4096 on a1, sent t\d+, acknowledged at t\d+\) covers it/);
  });

  it('flags data nobody wrote: junk, a torn sector, misplaced data, a write sent after the read', () => {
    const junk = new Script();
    junk.read([{ offset: 0, data: Buffer.alloc(SECTOR, 0xee) }]);
    expect(junk.h.check().violations.map((v) => v.kind)).toEqual(['foreign']);

    const torn = new Script();
    const w = torn.write('a1', 0);
    torn.ack(w.op);
    const bad = Buffer.from(w.data);
    bad[SECTOR + 100] ^= 0xff;
    torn.read([{ offset: 0, data: bad }]);
    const tv = torn.h.check();
    expect(tv.violations).toHaveLength(1);
    expect(tv.violations[0]!.message).toMatch(/torn or corrupt sector of write #1/);

    const moved = new Script();
    const m = moved.write('a1', 0);
    moved.ack(m.op);
    moved.read([{ offset: K4, data: m.data }]);
    expect(moved.h.check().violations[0]!.message).toMatch(/misplaced/);

    const future = new Script();
    future.read([]);
    const late = future.write('a1', 0);
    // The read (recorded above) returned data of a write sent after it: impossible.
    future.h.reads[0]!.data = Buffer.concat([late.data, Buffer.alloc(REGION - K4)]);
    expect(future.h.check().violations[0]!.message).toMatch(/after the read returned/);

    const other = new Script();
    const alien = new History(8).beginWrite('x', 0, K4, false);
    other.read([{ offset: 0, data: alien.data }]);
    expect(other.h.check().violations[0]!.message).toMatch(/history 8/);
  });

  it('flags a write acknowledged by a fenced engine after its fence (dual writer)', () => {
    const s = new Script();
    s.h.client('a1', 'a');
    s.h.client('b1', 'b');
    const before = s.write('a1', 0); // sent before the fence: may complete after it
    s.h.fence('a', 'b took over');
    s.ack(before.op);
    const after = s.write('a1', K4);
    s.ack(after.op);
    const refused = s.write('a1', 2 * K4);
    s.fail(refused.op);
    const fromB = s.write('b1', 3 * K4);
    s.ack(fromB.op);
    s.read([{ offset: 0, data: before.data }, { offset: K4, data: after.data }, { offset: 3 * K4, data: fromB.data }]);
    const v = s.h.check();
    expect(v.violations.map((x) => x.kind)).toEqual(['dual-writer']);
    expect(v.violations[0]!.message).toMatch(/write #\d+ 4096\+4096 on a1 \(engine a\) was sent at t\d+, after that engine was fenced/);
    expect(v.stats.ackedAfterFence).toBe(1);
  });

  it('a lifted fence (rollback to that engine) allows acknowledgements after it ends, not before', () => {
    const s = new Script();
    s.h.client('a1', 'a');
    s.h.fence('a', 'hand-over to b');
    const held = s.write('a1', 0); // held by the engine that handed over ...
    const early = s.write('a1', K4);
    s.ack(early.op); // ... this one was acknowledged while b was the writer: a violation
    s.h.unfence('a', 'rollback');
    s.ack(held.op); // acknowledged once a is the writer again: fine
    s.read([{ offset: 0, data: held.data }, { offset: K4, data: early.data }]);
    const v = s.h.check();
    expect(v.violations.map((x) => x.kind)).toEqual(['dual-writer']);
    expect(v.violations[0]!.message).toMatch(/write #2 .*fence lifted at t/);
  });

  it('reports lost runs of sectors as one range and counts them all', () => {
    const s = new Script();
    const ws = [0, 1, 2].map((i) => s.write('a1', i * K4));
    for (const w of ws) s.ack(w.op);
    s.ack(s.flush('a1'));
    s.read([{ offset: K4, data: ws[1]!.data }]);
    const v = s.h.check();
    expect(v.violations.map((x) => [x.offset, x.length])).toEqual([
      [0, K4],
      [2 * K4, K4],
    ]);
    expect(v.violations[0]!.message).toMatch(/and the 7 sectors after it alike/);
  });

  it('refuses to record a request twice or a write that is not in whole sectors', () => {
    const s = new Script();
    const w = s.write('a1', 0);
    s.ack(w.op);
    expect(() => s.ack(w.op)).toThrow(/ended twice/);
    expect(() => s.h.beginWrite('a1', 100, K4, false)).toThrow(/whole sectors/);
  });

  it('refuses an id that is not a uint32 (it would stamp another history\'s id, and its own reads would look foreign)', () => {
    expect(() => new History(undefined as unknown as number)).toThrow(/uint32, got undefined/);
    expect(() => new History(-1)).toThrow(/uint32/);
    expect(() => new History(1.5)).toThrow(/uint32/);
    expect(new History(0xffffffff).id).toBe(0xffffffff);
  });
});
