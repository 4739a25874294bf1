// LocalEngine's side of an NBD export hand-off, in one process: an export is frozen and
// detached from one engine, that engine closes, a new engine over the same replicas (a
// newer epoch) adopts the export, and the client never notices: same socket, same
// connection id, every request answered once, the data as written. Then a rollback: the
// adopted export is detached again and resumed by a third engine (as the old process does
// when its successor fails). The cross-process channel is test/native/nbd-handoff.test.ts.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../src/bench/nbd-client.js';
import { LocalEngine } from '../../src/engine/engine.js';
import type { NbdExport } from '../../src/nbd/nbd-export.js';
import { MiB, Scratch, createReplicas, nextEpoch, type ReplicaDir } from './helpers.js';

const SIZE = 8 * MiB;
const BLOCK = 4096;

describe('LocalEngine: NBD export hand-off between engines', () => {
  let s: Scratch;
  let replicas: ReplicaDir[];
  const engines: LocalEngine[] = [];

  beforeAll(async () => {
    s = new Scratch('mooring-export-handoff-');
    replicas = await createReplicas(s.path('replicas'), 2, SIZE);
  });

  afterAll(async () => {
    for (const e of engines) await e.close().catch(() => undefined);
    s.cleanup();
  });

  const open = async (): Promise<LocalEngine> => {
    const e = await LocalEngine.open({ replicas, epoch: nextEpoch() });
    engines.push(e);
    return e;
  };

  // Writes block i with a byte derived from (i, round) at queue depth 8, until stopped;
  // returns what every acknowledged write left, and how many requests failed.
  function writer(client: NbdClient) {
    const model = new Map<number, number>();
    let stop = false;
    let failed = 0;
    let answered = 0;
    let round = 0;
    const lanes = Array.from({ length: 8 }, async (_, lane) => {
      while (!stop) {
        const block = (round++ * 8 + lane) % (SIZE / BLOCK);
        const byte = (block * 7 + round) & 0xff;
        try {
          await client.write(block * BLOCK, Buffer.alloc(BLOCK, byte));
          model.set(block, byte);
          answered++;
        } catch {
          failed++;
        }
      }
    });
    return {
      model,
      answered: () => answered,
      stop: async () => {
        stop = true;
        await Promise.all(lanes);
        return failed;
      },
    };
  }

  async function waitAnswered(w: { answered: () => number }, more: number): Promise<void> {
    const target = w.answered() + more;
    const deadline = Date.now() + 20_000;
    while (w.answered() < target) {
      if (Date.now() > deadline) throw new Error(`fewer than ${more} writes answered in 20 s`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  async function handOff(exp: NbdExport, from: LocalEngine, to: () => Promise<LocalEngine>, w: { answered: () => number }): Promise<{ exp: NbdExport; engine: LocalEngine }> {
    await exp.freeze(5000);
    const record = await exp.detach();
    // The old engine no longer owns the export: closing it leaves the clients connected.
    await from.close();
    const engine = await to();
    const adopted = await engine.adoptNbd(record);
    // Frozen until the hand-off is committed: nothing is answered meanwhile.
    const before = w.answered();
    await new Promise((r) => setTimeout(r, 50));
    expect(w.answered()).toBe(before);
    await adopted.unfreeze();
    // The detached export only releases its copies of the sockets.
    await exp.close();
    return { exp: adopted, engine };
  }

  it('moves a served export to a new engine with writes in flight; the client keeps its connection', async () => {
    const first = await open();
    const sock = s.path('vol.sock');
    const exp = await first.exportNbd({ nbd: `unix:${sock}` });
    const client = await NbdClient.connect({ socketPath: sock });
    const ids = exp.connectionIds();
    expect(ids).toHaveLength(1);
    const w = writer(client);
    await waitAnswered(w, 200);

    const moved = await handOff(exp, first, open, w);
    expect(moved.exp.addressString).toBe(`unix:${sock}`);
    expect(moved.exp.connectionIds()).toEqual(ids);
    await waitAnswered(w, 200);

    // Rollback: detached again, then resumed by a third engine (the one that "stays").
    await moved.exp.freeze(5000);
    await moved.exp.detach();
    await moved.engine.close();
    const third = await open();
    await third.resumeExport(moved.exp);
    expect(moved.exp.connectionIds()).toEqual(ids);
    await waitAnswered(w, 200);

    expect(await w.stop()).toBe(0);
    for (const [block, byte] of w.model) {
      const got = await client.read(block * BLOCK, BLOCK);
      if (!got.equals(Buffer.alloc(BLOCK, byte))) throw new Error(`block ${block}: expected 0x${byte.toString(16)}, got 0x${got[0]!.toString(16)}`);
    }
    await client.disconnect();
    // A new client reaches the export where it always was.
    const again = await NbdClient.connect({ socketPath: sock });
    expect(moved.exp.connectionIds()).toEqual([ids[0]! + 1]);
    await again.disconnect();
    // Closing the engine closes the export it resumed.
    await third.close();
    expect(moved.exp.closed).toBe(true);
  });

  it('refuses what does not follow the steps: resume without detach, detach without freeze', async () => {
    const e = await open();
    const exp = await e.exportNbd({ nbd: `unix:${s.path('b.sock')}` });
    await expect(e.resumeExport(exp)).rejects.toMatchObject({ code: 'INVALID_STATE' });
    await expect(exp.detach()).rejects.toMatchObject({ code: 'INVALID_STATE' });
    await e.close();
    expect(exp.closed).toBe(true);
  });
});
