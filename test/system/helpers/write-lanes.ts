// A client writing whole 4 KiB blocks through one NBD connection, `depth` requests at a time,
// for the tests that keep I/O in flight through an upgrade: what each block last held when
// its write was acknowledged, and every failure, for checking afterwards.
import type { NbdClient } from '../../../src/bench/nbd-client.js';

const BLOCK = 4096;

export interface WriteLanes {
  /** Block number → the byte it was filled with by its last acknowledged write. */
  readonly model: Map<number, number>;
  /** Every write that failed. */
  readonly failures: string[];
  /** Writes started so far. */
  readonly started: () => number;
  /** Stops starting writes and waits for those in flight. */
  stop(): Promise<void>;
  /** Reads every block of the model back; throws at the first that differs. */
  verify(): Promise<void>;
}

/** Writes blocks 0..blocks-1 round and round, each filled with a byte that changes every pass. */
export function startWriteLanes(client: NbdClient, blocks: number, depth: number): WriteLanes {
  const model = new Map<number, number>();
  const failures: string[] = [];
  let stop = false;
  let n = 0;
  const lanes = Array.from({ length: depth }, async () => {
    while (!stop) {
      const block = n++ % blocks;
      const byte = (block * 13 + n) & 0xff;
      try {
        await client.write(block * BLOCK, Buffer.alloc(BLOCK, byte));
        model.set(block, byte);
      } catch (err) {
        failures.push(String(err));
      }
    }
  });
  return {
    model,
    failures,
    started: () => n,
    stop: async () => {
      stop = true;
      await Promise.all(lanes);
    },
    verify: async () => {
      for (const [block, byte] of model) {
        const got = await client.read(block * BLOCK, BLOCK);
        if (!got.equals(Buffer.alloc(BLOCK, byte))) throw new Error(`block ${block}: expected 0x${byte.toString(16)}, got 0x${got[0]!.toString(16)}`);
      }
    },
  };
}
