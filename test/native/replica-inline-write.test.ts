// Small writes and reads on the replica server's connection loop (docs/replica-protocol.md, "Small
// writes on the connection loop"; issue 16): a WRITE of whole 4 KiB blocks up to 16 KiB,
// without FUA, to a replica already marked dirty, is done by the loop that read it
// (ReplicaBackend::TryWrite), without a worker. Through the real addon and a raw client:
// - the first write after the replica was marked clean (the dirty mark must be committed),
//   an unaligned write, a FUA write and a 20 KiB write go to a worker; aligned 4–16 KiB
//   writes are inline (the server's inlineWrites counter says which);
// - fencing holds on the inline path: an older epoch is STALE_EPOCH and changes nothing;
// - every byte written either way reads back; small reads of cached bytes are answered on
//   the loop too (inlineReads), and one whose bytes were dropped from the page cache goes to
//   a worker (preadv2 RWF_NOWAIT would wait) and still returns them.
import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { KiB, MiB, nextEpoch, pattern, Scratch } from './helpers.js';
import { CodeNum, Op, RawClient, RemoteFixture, startHosts } from './remote-helpers.js';

const SIZE = 4 * MiB;
const FLAG_FUA = 1;

describe('small writes and reads on the replica server connection loop', () => {
  let s: Scratch;
  const f = new RemoteFixture();
  beforeAll(() => {
    s = new Scratch('mooring-inline-write-');
  });
  afterEach(() => f.reset());
  afterAll(() => s.cleanup());

  it('takes aligned small writes inline, the rest through a worker; fencing and data hold either way', async () => {
    f.hosts = await startHosts(s, 1, SIZE);
    const server = f.hosts[0]!.server;
    const c = await RawClient.open(server.port, 'vol');
    const expected = Buffer.alloc(SIZE);
    let seq = 1;
    const write = async (epoch: number, offset: number, data: Buffer, flags = 0): Promise<number> => {
      const n = seq++;
      c.send({ op: Op.WRITE, seq: n, epoch, offset, length: data.length, flags, payload: data });
      const r = await c.reply(n);
      if (!r) throw new Error('connection closed');
      return r.code;
    };
    const inline = (): number => server.stats().inlineWrites;
    try {
      const epoch = nextEpoch();
      c.send({ op: Op.CLAIM_EPOCH, seq: seq++, epoch });
      expect((await c.next())?.code).toBe(CodeNum.OK);

      // A claim leaves the replica dirty: the first write is inline already.
      let data = pattern(1, 4 * KiB);
      expect(await write(epoch, 0, data)).toBe(CodeNum.OK);
      data.copy(expected, 0);
      expect(inline(), 'a write after the claim').toBe(1);
      // Marked clean, the next write must commit the dirty mark again: a worker's.
      c.send({ op: Op.FLUSH, seq: seq++ });
      expect((await c.next())?.code).toBe(CodeNum.OK);
      c.send({ op: Op.MARK_CLEAN, seq: seq++, epoch });
      expect((await c.next())?.code).toBe(CodeNum.OK);
      data = pattern(2, 4 * KiB);
      expect(await write(epoch, 4 * KiB, data)).toBe(CodeNum.OK);
      data.copy(expected, 4 * KiB);
      expect(inline(), 'the first write after the replica was marked clean').toBe(1);

      // Aligned 4–16 KiB writes: inline.
      const sizes = [4 * KiB, 8 * KiB, 16 * KiB, 4 * KiB, 12 * KiB];
      for (const [i, n] of sizes.entries()) {
        const off = (i + 1) * 64 * KiB;
        data = pattern(10 + i, n);
        expect(await write(epoch, off, data)).toBe(CodeNum.OK);
        data.copy(expected, off);
      }
      expect(inline(), 'aligned small writes').toBe(1 + sizes.length);

      // Unaligned, FUA and larger: a worker's.
      const before = inline();
      data = pattern(20, 512);
      expect(await write(epoch, 1 * MiB + 100, data)).toBe(CodeNum.OK);
      data.copy(expected, 1 * MiB + 100);
      data = pattern(21, 4 * KiB);
      expect(await write(epoch, 2 * MiB, data, FLAG_FUA)).toBe(CodeNum.OK);
      data.copy(expected, 2 * MiB);
      data = pattern(22, 20 * KiB);
      expect(await write(epoch, 3 * MiB, data)).toBe(CodeNum.OK);
      data.copy(expected, 3 * MiB);
      expect(inline(), 'unaligned, FUA and 20 KiB writes').toBe(before);

      // An older writer on the inline path: refused, nothing written.
      const refusals = server.stats().staleEpochRefusals;
      expect(await write(epoch - 1, 64 * KiB, Buffer.alloc(4 * KiB, 0xee))).toBe(CodeNum.STALE_EPOCH);
      expect(inline()).toBe(before + 1);
      expect(server.stats().staleEpochRefusals).toBe(refusals + 1);

      // Everything reads back as written (1 MiB reads: a worker's).
      const read = async (off: number, length: number): Promise<Buffer> => {
        const n = seq++;
        c.send({ op: Op.READ, seq: n, offset: off, length });
        const r = await c.reply(n);
        expect(r?.code, `read at ${off}`).toBe(CodeNum.OK);
        return r!.payload;
      };
      for (let off = 0; off < SIZE; off += MiB) expect((await read(off, MiB)).equals(expected.subarray(off, off + MiB)), `bytes at ${off}`).toBe(true);
      expect(server.stats().inlineReads, '1 MiB reads').toBe(0);

      // Small reads of cached bytes (just written, or zeros nobody wrote): on the loop.
      for (const off of [0, 64 * KiB, 128 * KiB + 4 * KiB, 2 * MiB, 3 * MiB + 8 * KiB]) {
        expect((await read(off, 8 * KiB)).equals(expected.subarray(off, off + 8 * KiB)), `bytes at ${off}`).toBe(true);
      }
      expect(server.stats().inlineReads, 'small cached reads').toBe(5);

      // Once the replica's files are out of the page cache, a small read goes to a worker
      // (it would wait for the disk) and still returns the bytes.
      c.send({ op: Op.FLUSH, seq: seq++ });
      expect((await c.next())?.code).toBe(CodeNum.OK);
      for (const file of readdirSync(join(f.hosts[0]!.root, 'vol'))) {
        execFileSync('dd', [`if=${join(f.hosts[0]!.root, 'vol', file)}`, 'iflag=nocache', 'count=0', 'status=none']);
      }
      expect((await read(64 * KiB, 4 * KiB)).equals(expected.subarray(64 * KiB, 68 * KiB))).toBe(true);
      expect(server.stats().inlineReads, 'a read that would wait for the disk').toBe(5);
    } finally {
      c.close();
    }
  });
});
