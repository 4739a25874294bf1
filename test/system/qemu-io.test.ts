// qemu-io (QEMU's own NBD client, format raw) writes aligned, unaligned and large
// patterns; read -P verifies them, before and after a server restart; the whole volume is
// compared with a model, by our client and by qemu-img compare; replicas stay identical.
import { writeFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { patternBytes, VolumeModel } from './helpers/pattern.js';
import { killAllServers } from './helpers/serve.js';
import { qemuIo, run } from './helpers/tools.js';
import { expectSameBytes, readWholeVolume, VolumeFixture } from './helpers/volume.js';

const SIZE = 64 << 20;
const KiB = 1024;
const MiB = 1 << 20;

interface Op {
  offset: number;
  length: number;
  /** Constant byte (qemu-io -P) or, when undefined, pseudo-random data from a file (-s). */
  byte?: number;
  fua?: boolean;
}

// Aligned, unaligned (odd offsets, single bytes, spanning 4 KiB boundaries), large, overlapping.
const OPS: Op[] = [
  { offset: 0, length: 64 * KiB, byte: 0x11 },
  { offset: 1 * MiB, length: 4 * KiB, byte: 0x22, fua: true },
  { offset: 513, length: 512, byte: 0x33 },
  { offset: 12345, length: 1, byte: 0x44 },
  { offset: 5 * 4096 - 1024, length: 3 * KiB, byte: 0x55 },
  { offset: 2 * MiB + 7, length: 10_000 },
  { offset: 3 * MiB - 1, length: 2 },
  { offset: 8 * MiB, length: 9 * MiB, byte: 0x77 },
  { offset: 20 * MiB + 100, length: 8 * MiB + 333 },
  { offset: 100, length: 5000, byte: 0x99 }, // overlaps the first three
  { offset: SIZE - 4 * KiB - 1, length: 4 * KiB + 1, byte: 0xee }, // up to the last byte
  { offset: SIZE - 1, length: 1, byte: 0xfe },
];

describe.each([1, 3])('qemu-io on a %i-replica volume', (replicas) => {
  let vol: VolumeFixture | null = null;

  afterEach(async () => {
    await vol?.cleanup();
    vol = null;
    await killAllServers();
  });

  it('writes and verifies aligned, unaligned and large patterns, also after a restart', async () => {
    vol = new VolumeFixture(SIZE, replicas);
    await vol.start();
    const model = new VolumeModel(SIZE);
    const writes: string[] = [];
    OPS.forEach((op, i) => {
      const f = op.fua ? '-f ' : '';
      if (op.byte !== undefined) {
        writes.push(`write ${f}-P ${op.byte} ${op.offset} ${op.length}`);
        model.fill(op.offset, op.length, op.byte);
      } else {
        const data = patternBytes(1000 + i, op.length);
        const file = vol!.tmp.join(`pat-${i}`);
        writeFileSync(file, data);
        writes.push(`write ${f}-s ${file} ${op.offset} ${op.length}`);
        model.write(op.offset, data);
      }
    });
    const out = await qemuIo(vol.uri, writes);
    expect(out.match(/^wrote /gm)?.length).toBe(OPS.length);

    // read -P checks each constant-pattern range that no later write overwrote.
    const verifyCommands = (): string[] => {
      const cmds: string[] = [];
      for (const op of OPS) {
        if (op.byte === undefined) continue;
        const now = model.slice(op.offset, op.length);
        if (now.every((b) => b === op.byte)) cmds.push(`read -P ${op.byte} ${op.offset} ${op.length}`);
      }
      // Untouched space reads as zeroes, around and between the writes.
      cmds.push(`read -P 0 ${4 * MiB} ${4 * MiB}`, `read -P 0 ${SIZE - MiB} ${MiB - 8 * KiB}`);
      return cmds;
    };
    const verify = verifyCommands();
    expect(verify.length).toBeGreaterThanOrEqual(8);
    const readOut = await qemuIo(vol.uri, verify);
    expect(readOut.match(/^read /gm)?.length).toBe(verify.length);

    // A read -P with the wrong pattern must fail, or the checks above prove nothing.
    await expect(qemuIo(vol.uri, [`read -P 0x12 0 4096`])).rejects.toThrow(/verification failed/);

    expectSameBytes(await readWholeVolume(vol.uri), model.data, 'volume after qemu-io writes');

    await vol.restart();
    await qemuIo(vol.uri, verify);
    expectSameBytes(await readWholeVolume(vol.uri), model.data, 'volume after restart');

    // An independent client agrees: qemu-img compare with a raw file of the model.
    const raw = vol.tmp.join('model.raw');
    writeFileSync(raw, model.data);
    await run('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', raw, vol.uri]);

    await vol.checkReplicas(model.data);
  });
});
