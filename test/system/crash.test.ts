// Crash consistency: SIGKILL `mooring serve` while fio writes (background load, 2 jobs) and
// while two tracked NBD connections write known blocks with FLUSH and FUA; reopen; every
// write acknowledged before a FLUSH was sent (or FUA-acknowledged) must be there, every
// other block must hold one of the writes that may have landed; the volume reopens each
// time; after a final clean close all replicas hold identical bytes. Repeated at several
// instants, including right after a FLUSH reply.
import { afterEach, describe, expect, it } from 'vitest';
import { FlushTracker } from './helpers/flush-tracker.js';
import { NbdClient } from './helpers/nbd-client.js';
import { killAllServers, sleep } from './helpers/serve.js';
import { run } from './helpers/tools.js';
import { expectSameBytes, readRange, readWholeVolume, VolumeFixture } from './helpers/volume.js';

const MiB = 1 << 20;
const SIZE = 64 * MiB;
const TRACKED_BLOCKS = 2048; // 8 MiB at offset 0
const FIO_OFFSET = 32 * MiB;

type KillAt = { afterMs: number } | { afterFlushes: number };
const INSTANTS: KillAt[] = [{ afterMs: 300 }, { afterFlushes: 25 }, { afterMs: 1500 }, { afterFlushes: 120 }];

describe.each([1, 3])('crash of mooring serve on a %i-replica volume', (replicas) => {
  let vol: VolumeFixture | null = null;

  afterEach(async () => {
    await vol?.cleanup();
    vol = null;
    await killAllServers();
  });

  it('keeps every flushed write across SIGKILLs at several instants', async () => {
    vol = new VolumeFixture(SIZE, replicas);
    await vol.start();
    const tracker = new FlushTracker(0, TRACKED_BLOCKS, 77 + replicas);
    for (const [round, instant] of INSTANTS.entries()) {
      const server = vol.server!;
      // Background load: fio randwrite on its own range until the server dies.
      const fio = run(
        'fio',
        ['--name=load', '--ioengine=nbd', `--uri=${vol.uri}`, '--rw=randwrite', '--bs=4k', '--iodepth=16', '--numjobs=2',
          `--offset=${FIO_OFFSET}`, '--size=8m', '--offset_increment=8m', '--time_based', '--runtime=60', '--output-format=json'],
        { allowFailure: true, timeoutMs: 90_000, cwd: vol.tmp.path },
      );
      const clients = [await NbdClient.connect(vol.uri), await NbdClient.connect(vol.uri)];
      let killed = false;
      const kill = (): void => {
        if (!killed) {
          killed = true;
          server.child.kill('SIGKILL');
        }
      };
      tracker.onFlushed = 'afterFlushes' in instant ? (n) => n >= instant.afterFlushes && kill() : null;
      const load = tracker.run(clients);
      if ('afterMs' in instant) {
        await sleep(instant.afterMs);
        kill();
      } else {
        const deadline = Date.now() + 30_000;
        while (!killed && Date.now() < deadline) await sleep(20);
        expect(killed, `round ${round}: fewer than ${instant.afterFlushes} flushes in 30 s${server.diagnostics()}`).toBe(true);
      }
      await vol.crash();
      await load;
      for (const c of clients) c.destroy();
      const fioResult = await fio;
      expect(fioResult.code, `fio should have lost its server\n${fioResult.stdout}${fioResult.stderr}`).not.toBe(0);

      await vol.start();
      // Read the tracked range three times: reads are spread over replicas, so a replica
      // that missed writes and was not reconciled would show up as reads that disagree.
      const check = await NbdClient.connect(vol.uri);
      const region = await readRange(check, 0, TRACKED_BLOCKS * 4096);
      for (let again = 0; again < 2; again++) {
        expectSameBytes(await readRange(check, 0, TRACKED_BLOCKS * 4096), region, `round ${round}: second read of the tracked range`);
      }
      await check.disconnect();
      const { violations, stats } = tracker.verify(region);
      console.log(`crash round ${round} ${JSON.stringify(instant)}: ${JSON.stringify(stats)}, fio exit ${fioResult.code}`);
      expect(violations.slice(0, 20), `round ${round} (${JSON.stringify(instant)}): ${violations.length} blocks lost durable writes; stats ${JSON.stringify(stats)}${vol.diagnostics()}`).toEqual([]);
      // The round must have tested something.
      expect(stats.flushes, JSON.stringify(stats)).toBeGreaterThan(0);
      expect(stats.durableBlocks, JSON.stringify(stats)).toBeGreaterThan(50);
      // After the recovery, a clean close leaves identical replicas (the reopen reconciled).
      const served = await readWholeVolume(vol.uri);
      await vol.checkReplicas(served);
      await vol.start();
    }
    // Clean close after the last recovery: replicas agree, with each other and with what
    // the volume served.
    const served = await readWholeVolume(vol.uri);
    await vol.checkReplicas(served);
  });
});
