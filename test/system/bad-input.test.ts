// Hostile NBD traffic: a generated, seeded corpus of more than 10,000 cases (malformed
// handshakes, unknown options and commands, lying lengths, oversized and out-of-range
// requests, vanishing clients, truncated frames, garbage), played over parallel
// connections while well-behaved clients (our own, and qemu-io) keep writing and verifying
// data. The server must answer each case with the right NBD error or drop that connection,
// keep serving everyone else, stay alive, and leave every modelled byte intact on all
// replicas. Also: damaged replica metadata gives a coded error, not a crash.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { mergeTallies, MiB, newTally, runHandshakeWorker, runTransmissionWorker, type FuzzLayout } from './helpers/fuzz.js';
import { NbdClient, parseTarget } from './helpers/nbd-client.js';
import { Rng } from './helpers/pattern.js';
import { loadAddon } from './helpers/replicas.js';
import { killAllServers, startServe } from './helpers/serve.js';
import { qemuIo, TempDir } from './helpers/tools.js';
import { expectSameBytes, readRange, readWholeVolume, VolumeFixture } from './helpers/volume.js';

const SIZE = 64 * MiB;
const TX_WORKERS = 12;
const TX_CASES_PER_WORKER = 720;
const HS_WORKERS = 6;
const HS_CASES_PER_WORKER = 420;
const SEED = 20260522;

const GOOD_REGION = { offset: 0, length: 1 * MiB };
const QEMU_REGION = { offset: 16 * MiB, length: 4 * MiB };
const LAYOUT: FuzzLayout = { sizeBytes: SIZE, homeBase: 1 * MiB, homeBytes: 256 * 1024, scratchBase: 32 * MiB, scratchBytes: 32 * MiB };

describe('bad NBD input', () => {
  let vol: VolumeFixture | null = null;
  const temps: TempDir[] = [];

  afterEach(async () => {
    await vol?.cleanup();
    vol = null;
    for (const t of temps.splice(0)) t.cleanup();
    await killAllServers();
  });

  it('answers a 10,000+ case corpus correctly while good clients keep working', async () => {
    vol = new VolumeFixture(SIZE, 3);
    await vol.start();
    const target = parseTarget(vol.server!.ready.nbd);
    const started = Date.now();

    // Well-behaved client: keeps writing and verifying its region for the whole run.
    const good = Buffer.alloc(GOOD_REGION.length);
    const goodRng = new Rng(SEED ^ 1);
    const goodClient = await NbdClient.connect(target);
    let fuzzing = true;
    let goodRounds = 0;
    const goodLoop = (async () => {
      while (fuzzing) {
        const len = goodRng.pick([512, 4096, 65536, 200_000]);
        const off = goodRng.int(GOOD_REGION.length - len);
        const data = goodRng.bytes(len);
        await goodClient.write(GOOD_REGION.offset + off, data);
        data.copy(good, off);
        const back = await goodClient.read(GOOD_REGION.offset + off, len);
        if (!back.equals(data)) throw new Error(`good client read back wrong data at ${off}+${len}`);
        goodRounds++;
      }
    })();

    // qemu-io, a real client, in parallel: patterns into its own region, each verified.
    const qemuPatterns: number[] = [];
    const qemuLoop = (async () => {
      for (let k = 0; fuzzing || k < 2; k++) {
        const piece = QEMU_REGION.length / 16;
        const off = QEMU_REGION.offset + (k % 16) * piece;
        const byte = (k * 37 + 11) & 0xff;
        await qemuIo(vol!.uri, [`write -P ${byte} ${off} ${piece}`, `read -P ${byte} ${off} ${piece}`]);
        qemuPatterns[k % 16] = byte;
      }
    })();

    // A read a fresh client does after bad handshakes: the good region, checked.
    const goodRead = async (c: NbdClient): Promise<void> => {
      const back = await c.read(QEMU_REGION.offset, 4096);
      if (back.length !== 4096) throw new Error('short read');
    };

    const tallies = Array.from({ length: TX_WORKERS + HS_WORKERS }, newTally);
    const homes = await Promise.all([
      ...Array.from({ length: TX_WORKERS }, (_, i) => runTransmissionWorker(i, SEED + i, target, LAYOUT, TX_CASES_PER_WORKER, tallies[i]!)),
      ...Array.from({ length: HS_WORKERS }, (_, i) => runHandshakeWorker(i, SEED + 1000 + i, target, HS_CASES_PER_WORKER, tallies[TX_WORKERS + i]!, goodRead).then(() => null)),
    ]);
    const tally = mergeTallies(tallies);
    fuzzing = false;
    await goodLoop;
    await qemuLoop;
    const ms = Date.now() - started;
    console.log(`bad-input corpus: ${tally.cases} cases on ${tally.connections} connections in ${ms} ms; answered ${tally.answered}, dropped ${tally.dropped}; good client rounds ${goodRounds}\n${JSON.stringify(tally.kinds)}`);

    expect(tally.failures, `${tally.failures.length}+ wrong answers${vol.diagnostics()}`).toEqual([]);
    expect(tally.cases).toBeGreaterThanOrEqual(10_000);
    expect(goodRounds).toBeGreaterThan(10);
    expect(vol.server!.alive, vol.diagnostics()).toBe(true);

    // The good client's connection survived everything, and its data is right.
    expectSameBytes(await readRange(goodClient, GOOD_REGION.offset, GOOD_REGION.length), good, 'good client region');
    await goodClient.disconnect();

    // Every modelled byte of the volume: good region, worker homes, qemu-io region, zeroes.
    const served = await readWholeVolume(vol.uri);
    expectSameBytes(served.subarray(GOOD_REGION.offset, GOOD_REGION.offset + GOOD_REGION.length), good, 'good region');
    homes.forEach((home, i) => {
      if (!home) return;
      const at = LAYOUT.homeBase + i * LAYOUT.homeBytes;
      expectSameBytes(served.subarray(at, at + LAYOUT.homeBytes), home, `worker ${i} home region`);
    });
    const piece = QEMU_REGION.length / 16;
    qemuPatterns.forEach((b, k) => {
      const at = QEMU_REGION.offset + k * piece;
      expectSameBytes(served.subarray(at, at + piece), Buffer.alloc(piece, b), `qemu-io piece ${k}`);
    });
    const homesEnd = LAYOUT.homeBase + TX_WORKERS * LAYOUT.homeBytes;
    expectSameBytes(served.subarray(homesEnd, QEMU_REGION.offset), Buffer.alloc(QEMU_REGION.offset - homesEnd), 'untouched space before the qemu-io region');
    const qEnd = QEMU_REGION.offset + QEMU_REGION.length;
    expectSameBytes(served.subarray(qEnd, LAYOUT.scratchBase), Buffer.alloc(LAYOUT.scratchBase - qEnd), 'untouched space before scratch');

    // Clean shutdown still works, and the 3 replicas agree with what was served.
    await vol.checkReplicas(served);
  });

  it('refuses damaged replica metadata with a coded error, not a crash', async () => {
    vol = new VolumeFixture(8 * MiB, 3);
    await vol.start();
    await qemuIo(vol.uri, ['write -P 0x42 0 64k']);
    await vol.stop();
    // This host's replica (the peers' data engines keep running, with theirs).
    const r1 = vol.replicaDirs()[0]!;
    const metaFile = join(r1, 'replica.json');
    const original = readFileSync(metaFile);

    const damages: [string, Buffer][] = [
      ['truncated', original.subarray(0, Math.floor(original.length / 2))],
      ['empty', Buffer.alloc(0)],
      ['garbage', new Rng(5).bytes(300)],
      ['wrong types', Buffer.from(JSON.stringify({ ...JSON.parse(original.toString()), sizeBytes: 'lots', layers: 7 }))],
      ['path escape', Buffer.from(original.toString().replace(/layer-[0-9a-zA-Z_-]+\.img/, '../../../../etc/passwd'))],
    ];
    for (const [what, bytes] of damages) {
      writeFileSync(metaFile, bytes);
      // The addon, directly: a rejected promise with a code, never an abort.
      const err = await loadAddon().openEngine({ replicas: [r1], members: ['r0'], epoch: 1 }).then(
        async (e) => {
          await e.close();
          return null;
        },
        (e: Error & { code?: string }) => e,
      );
      expect(err, `opening a replica with ${what} metadata succeeded`).not.toBeNull();
      expect(err!.code, `${what}: ${err!.message}`).toMatch(/^(CORRUPT_METADATA|INVALID_ARGUMENT|NOT_FOUND|IO_ERROR)$/);
      // The CLI: exit 1 with `mooring: CODE: message`, or it opens without the damaged
      // replica; it must never die of a signal.
      const s = await startServe({ dir: vol.dir, hosts: vol.peers.map((p) => `unix:${p.grpcSocket}`) }).catch((e: Error) => e);
      if (s instanceof Error) {
        expect(s.message).toMatch(/mooring: [A-Z_]+: /);
        expect(s.message).toMatch(/exited code=1 signal=null/);
      } else {
        const code = await s.stop();
        expect(code).toBe(0);
      }
      const cli = s instanceof Error ? /mooring: [A-Z_]+: [^\n]*/.exec(s.message)?.[0] : 'served without the damaged replica';
      console.log(`damaged metadata (${what}): addon ${err!.code}; serve: ${cli}`);
    }
    writeFileSync(metaFile, original);
    expect(readdirSync(r1).length).toBeGreaterThan(0);
  });
});
