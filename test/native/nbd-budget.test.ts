// An NBD export's memory budget (docs/hardening.md): connections that send 32 MiB READs and
// never read the replies, and one that starts a 32 MiB WRITE and stops, may make the export
// hold at most its budget plus one request; while the budget is exhausted those whose replies
// do not move for 2 s are dropped, so a well-behaved client on the same export keeps writing
// and reading back; the process's memory does not grow with what they ask for.
// Without the budget each of those connections pinned up to 64 MiB (1.3 GiB for 20).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../src/bench/nbd-client.js';
import { LocalEngine } from '../../src/engine/engine.js';
import { ASAN_QUARANTINE_BYTES, MiB, Scratch, createReplicas, nextEpoch, type ReplicaDir } from './helpers.js';

const SIZE = 256 * MiB;
const BUDGET = 32 * MiB;
const HOSTILE = 20;
const READS_EACH = 16; // 32 MiB each: 512 MiB asked per connection, 10 GiB in all
const NBD_REQUEST_MAGIC = 0x25609513;

function request(type: number, cookie: number, offset: number, length: number): Buffer {
  const b = Buffer.alloc(28);
  b.writeUInt32BE(NBD_REQUEST_MAGIC, 0);
  b.writeUInt16BE(0, 4); // flags
  b.writeUInt16BE(type, 6);
  b.writeBigUInt64BE(BigInt(cookie), 8);
  b.writeBigUInt64BE(BigInt(offset), 16);
  b.writeUInt32BE(length, 24);
  return b;
}

describe('NBD export memory budget', () => {
  let s: Scratch;
  let replicas: ReplicaDir[];
  let engine: LocalEngine;

  beforeAll(async () => {
    s = new Scratch('mooring-nbd-budget-');
    replicas = await createReplicas(s.path('replicas'), 1, SIZE);
    engine = await LocalEngine.open({ replicas, epoch: nextEpoch() });
  });

  afterAll(async () => {
    await engine?.close().catch(() => undefined);
    s.cleanup();
  });

  it('bounds what clients that do not read can make it hold, and serves a good client meanwhile', async () => {
    const sock = s.path('v.sock');
    await engine.exportNbd({ nbd: `unix:${sock}`, bufferBytesMax: BUDGET, maxConnections: 64 });
    const good = await NbdClient.connect({ socketPath: sock });
    // Warm the allocator up with the good client's own traffic, then take the baseline.
    for (let i = 0; i < 8; i++) await good.write(i * 4 * MiB, Buffer.alloc(4 * MiB, i + 1));
    const baseline = process.memoryUsage().rss;

    const hostile: NbdClient[] = [];
    for (let i = 0; i < HOSTILE; i++) {
      const c = await NbdClient.connect({ socketPath: sock });
      c.socket.pause(); // never read a reply
      hostile.push(c);
      for (let k = 0; k < READS_EACH; k++) c.socket.write(request(0 /* READ */, 1000 + k, (k % 8) * 32 * MiB, 32 * MiB));
    }
    const writer = await NbdClient.connect({ socketPath: sock });
    writer.socket.pause();
    writer.socket.write(Buffer.concat([request(1 /* WRITE */, 1, 0, 32 * MiB), Buffer.alloc(8 * MiB, 0xee)]));
    hostile.push(writer);

    let peak = baseline;
    let rounds = 0;
    const started = Date.now();
    while (Date.now() - started < 6000) {
      const byte = 0x40 + (rounds % 100);
      const at = 32 * MiB + (rounds % 16) * MiB;
      await good.write(at, Buffer.alloc(MiB, byte));
      const back = await good.read(at, MiB);
      expect(back.equals(Buffer.alloc(MiB, byte)), `round ${rounds}: read back differs`).toBe(true);
      peak = Math.max(peak, process.memoryUsage().rss);
      rounds++;
    }
    const growth = peak - baseline;
    console.log(`NBD budget ${BUDGET / MiB} MiB: RSS grew ${(growth / MiB).toFixed(0)} MiB with ${HOSTILE + 1} clients not reading; ${rounds} good rounds in 6 s`);
    expect(rounds).toBeGreaterThanOrEqual(5);
    // Budget + one request in the reserve + a fixed slack (connection threads, receive
    // buffers, this test's own buffers); what they asked for was 10 GiB. Under ASan (the
    // sanitizer pass) the freed 32 MiB buffers stay resident in its quarantine.
    expect(growth).toBeLessThanOrEqual(BUDGET + 32 * MiB + 128 * MiB + ASAN_QUARANTINE_BYTES);
    for (const c of hostile) c.socket.destroy();
    await good.disconnect();
  });
});
