// In-place hand-off of a real `mooring data-engine` process to its successor
// (HandOffProcess, src/data-engine/process-handoff.ts): an NBD client writes at queue depth
// 8 the whole time, through three successors that fail on purpose (a version nobody speaks;
// one that refuses after taking the exports; one that dies after taking them) and a real
// one. The client never sees an error and never reconnects (its socket stays open, the
// server's connection count does not grow); after each failure the old process serves at
// the rollback epoch, after the real one the successor serves at the new epoch, in another
// process, and the data is exactly what was acknowledged.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../../src/bench/nbd-client.js';
import type { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { makeHosts, waitFor, type HostProcess } from '../helpers/hosts.js';
import { killAllServers } from '../helpers/serve.js';
import { TempDir, repoRoot } from '../helpers/tools.js';

const MiB = 1 << 20;
const SIZE = 16 * MiB;
const BLOCK = 4096;

let lastEpoch = 0;
const nextEpoch = (): number => (lastEpoch = Math.max(lastEpoch + 1, Date.now() * 1000));

describe('in-place hand-off of a data engine process, NBD client connected', () => {
  const tmp = new TempDir();
  let host: HostProcess;
  let client: NbdClient;
  const sock = (): string => tmp.join('v.sock');
  const de = (): RemoteDataEngine => host.engine;

  // The client: 8 lanes of 4 KiB writes until stopped; every acknowledged write in `model`.
  const model = new Map<number, number>();
  let stop = false;
  let failures: string[] = [];
  let answered = 0;
  let lanes: Promise<void>[] = [];
  let closed = false;

  beforeAll(async () => {
    [host] = makeHosts(tmp.path, 1, 17890) as [HostProcess];
    host.opts.extraArgs = ['--allow-successor-exec', repoRoot];
    await host.start();
    for (const id of ['r0', 'r1']) await de().createReplica(`v-${id}`, SIZE);
    await de().startEngine({ volume: 'v', replicas: ['r0', 'r1'].map((id) => ({ id, hostId: 'a', name: `v-${id}`, address: null })), epoch: nextEpoch(), nbd: `unix:${sock()}` });
    client = await NbdClient.connect({ socketPath: sock() });
    client.socket.once('close', () => (closed = true));
    let n = 0;
    lanes = Array.from({ length: 8 }, async () => {
      while (!stop) {
        const block = n++ % (SIZE / BLOCK);
        const byte = (block * 31 + n) & 0xff;
        try {
          await client.write(block * BLOCK, Buffer.alloc(BLOCK, byte));
          model.set(block, byte);
          answered++;
        } catch (err) {
          failures.push(String(err));
        }
      }
    });
  });

  afterAll(async () => {
    stop = true;
    await Promise.all(lanes).catch(() => undefined);
    await client?.disconnect().catch(() => undefined);
    await host?.stop().catch(() => undefined);
    await killAllServers();
    tmp.cleanup();
  });

  async function more(k: number): Promise<void> {
    const target = answered + k;
    expect(await waitFor(async () => answered >= target, 20_000, 5), `fewer than ${k} writes answered; failures: ${failures.join('; ')}${host.diagnostics()}`).toBe(true);
  }

  const broken = (mode: string): string[] => [process.execPath, join(repoRoot, 'test/system/upgrade/broken-successor.mjs'), mode];

  for (const [mode, code] of [['bad-version', 'UNSUPPORTED'], ['refuse', 'INVALID_STATE'], ['die', 'UNAVAILABLE']] as const) {
    it(`rolls back when the successor ${mode === 'die' ? 'dies after taking the exports' : mode === 'refuse' ? 'refuses after taking the exports' : 'speaks another version'}: the old process serves on`, async () => {
      await more(100);
      const instance = (await de().info()).instanceId;
      const epochs = new Map([['v', { epoch: nextEpoch(), rollbackEpoch: nextEpoch() }]]);
      const out = await de().handOffProcess(broken(mode), epochs);
      expect(out.committed).toBe(false);
      expect(out.error?.code, out.error?.message).toBe(code);
      expect((await de().info()).instanceId).toBe(instance);
      const eng = await de().engineInfo('v');
      // Before anything moved (bad version), the engine is untouched; after, it claimed the rollback epoch.
      if (mode !== 'bad-version') expect(eng.epoch).toBe(epochs.get('v')!.rollbackEpoch);
      expect(eng.nbdStats?.connectionsTotal).toBe(1);
      await more(100);
      expect(failures).toEqual([]);
      expect(closed).toBe(false);
    });
  }

  it('hands everything to a real successor: another process serves the same connection at the new epoch', async () => {
    await more(100);
    const before = await de().info();
    const epochs = new Map([['v', { epoch: nextEpoch(), rollbackEpoch: nextEpoch() }]]);
    const out = await de().handOffProcess([process.execPath, join(repoRoot, 'dist/cli.js')], epochs);
    expect(out, JSON.stringify(out)).toMatchObject({ committed: true, error: null, engines: 1 });
    expect(out.pauseMs).toBeGreaterThan(0);
    // The old process exits; the successor answers on the same gRPC socket.
    expect(await waitFor(async () => (await de().info()).instanceId !== before.instanceId, 20_000)).toBe(true);
    const eng = await de().engineInfo('v');
    expect(eng.epoch).toBe(epochs.get('v')!.epoch);
    // The connection was adopted, not made again.
    expect(eng.nbdStats?.connectionsTotal).toBe(1);
    await more(200);
    stop = true;
    await Promise.all(lanes);
    expect(failures).toEqual([]);
    expect(closed).toBe(false);
    for (const [block, byte] of model) {
      const got = await client.read(block * BLOCK, BLOCK);
      if (!got.equals(Buffer.alloc(BLOCK, byte))) throw new Error(`block ${block}: expected 0x${byte.toString(16)}, got 0x${got[0]!.toString(16)}`);
    }
    console.log(`in-place hand-off: exports frozen ${out.pauseMs.toFixed(1)} ms; ${answered} writes answered, none failed`);
    failures = [];
  });
});
