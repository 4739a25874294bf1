// The data engine's side of an in-place upgrade, in one process: a data engine hands its
// engines over (every NBD export frozen and detached, the engines stopped) and closes; a
// new data engine over the same directory starts each engine again at a newer epoch with
// the export it was handed. The NBD client keeps its connection and its connection id, no
// request fails, the data is as written. Then the rollback path: the exports handed over
// are served again by a data engine of the old side, at a still newer epoch.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../src/bench/nbd-client.js';
import { LocalDataEngine } from '../../src/data-engine/local-data-engine.js';
import { MiB, Scratch, nextEpoch } from './helpers.js';

const SIZE = 8 * MiB;
const BLOCK = 4096;

describe('LocalDataEngine: engines handed over to a new data engine on the same directory', () => {
  let s: Scratch;
  const open: LocalDataEngine[] = [];

  beforeAll(() => {
    s = new Scratch('mooring-de-handoff-');
  });

  afterAll(async () => {
    for (const de of open) await de.close().catch(() => undefined);
    s.cleanup();
  });

  const start = async (): Promise<LocalDataEngine> => {
    const de = await LocalDataEngine.start({ dir: s.path('host'), hostId: 'h', replicaListen: null });
    open.push(de);
    return de;
  };

  it('keeps the client connected through a hand-over and a rollback; epochs go up each time', async () => {
    const a = await start();
    await a.createReplica('v-r0', SIZE);
    await a.createReplica('v-r1', SIZE);
    const refs = ['r0', 'r1'].map((id) => ({ id, hostId: 'h', name: `v-${id}`, address: null }));
    const sock = s.path('v.sock');
    const e0 = nextEpoch();
    await a.startEngine({ volume: 'v', replicas: refs, epoch: e0, nbd: `unix:${sock}` });
    const client = await NbdClient.connect({ socketPath: sock });
    const model = new Map<number, number>();
    let stop = false;
    let failed = 0;
    let answered = 0;
    let n = 0;
    const lanes = Array.from({ length: 8 }, async () => {
      while (!stop) {
        const block = n++ % (SIZE / BLOCK);
        const byte = (block + n) & 0xff;
        try {
          await client.write(block * BLOCK, Buffer.alloc(BLOCK, byte));
          model.set(block, byte);
          answered++;
        } catch {
          failed++;
        }
      }
    });
    const more = async (k: number): Promise<void> => {
      const target = answered + k;
      const deadline = Date.now() + 20_000;
      while (answered < target) {
        if (Date.now() > deadline) throw new Error(`fewer than ${k} writes answered in 20 s`);
        await new Promise((r) => setTimeout(r, 5));
      }
    };
    await more(200);

    // Hand-over: a gives everything up (and its directory), b takes over at e1.
    const handed = await a.detachEnginesForHandOff(5000);
    expect(handed.map((h) => h.volume)).toEqual(['v']);
    const connectionIds = handed[0]!.nbd!.record.connectionIds;
    expect(connectionIds).toHaveLength(1);
    await a.close();
    const b = await start();
    const e1 = nextEpoch();
    const exp = await b.startEngineOver({ volume: 'v', replicas: handed[0]!.refs, epoch: e1, ioTimeoutMs: handed[0]!.ioTimeoutMs }, { record: handed[0]!.nbd!.record });
    await exp.unfreeze();
    await handed[0]!.nbd!.export.close();
    expect(exp.connectionIds()).toEqual(connectionIds);
    expect((await b.engineInfo('v')).epoch).toBe(e1);
    await more(200);

    // Rollback: b hands over, the successor "fails", and a data engine of b's side serves
    // the exports it kept, at e2.
    const again = await b.detachEnginesForHandOff(5000);
    again[0]!.nbd!.record.close();
    await b.close();
    const c = await start();
    const e2 = nextEpoch();
    const back = await c.startEngineOver({ volume: 'v', replicas: again[0]!.refs, epoch: e2, ioTimeoutMs: again[0]!.ioTimeoutMs }, { resume: again[0]!.nbd!.export });
    expect(back.connectionIds()).toEqual(connectionIds);
    expect((await c.engineInfo('v')).epoch).toBe(e2);
    await more(200);

    stop = true;
    await Promise.all(lanes);
    expect(failed).toBe(0);
    for (const [block, byte] of model) {
      const got = await client.read(block * BLOCK, BLOCK);
      if (!got.equals(Buffer.alloc(BLOCK, byte))) throw new Error(`block ${block}: expected 0x${byte.toString(16)}, got 0x${got[0]!.toString(16)}`);
    }
    await client.disconnect();
    await c.stopEngine('v');
  });

  it('refuses while an engine is a standby, and changes nothing', async () => {
    const d = await LocalDataEngine.start({ dir: s.path('other'), hostId: 'o', replicaListen: null });
    open.push(d);
    await d.createReplica('w-r0', SIZE);
    await d.startEngine({ volume: 'w', replicas: [{ id: 'r0', hostId: 'o', name: 'w-r0', address: null }], standby: true, nbd: `unix:${join(s.root, 'w.sock')}` });
    await expect(d.detachEnginesForHandOff(1000)).rejects.toMatchObject({ code: 'INVALID_STATE' });
    expect((await d.engineInfo('w')).role).toBe('standby');
  });
});
