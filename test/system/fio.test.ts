// fio with its nbd engine: several jobs, one NBD connection each (multi-conn), writing
// with verify=crc32c headers; fio verifies in the same run, again in a verify-only pass, and
// once more after the server restarts. Replicas stay identical.
import { afterEach, describe, expect, it } from 'vitest';
import { killAllServers } from './helpers/serve.js';
import { parseFioJson, run, type FioResult } from './helpers/tools.js';
import { VolumeFixture } from './helpers/volume.js';

const MiB = 1 << 20;
const JOBS = 4;
const PER_JOB = 8 * MiB;
const SIZE = 64 * MiB;

/** fio arguments shared by the write and verify-only runs (same seed, same layout). */
function fioArgs(uri: string, rw: string, bs: string[], extra: string[] = []): string[] {
  return [
    '--name=mooring',
    '--ioengine=nbd',
    `--uri=${uri}`,
    `--rw=${rw}`,
    ...bs,
    `--size=${PER_JOB}`,
    `--offset_increment=${PER_JOB}`, // job i owns [i*8M, (i+1)*8M): jobs never overwrite each other
    `--numjobs=${JOBS}`,
    '--iodepth=16',
    '--verify=crc32c',
    '--verify_fatal=1',
    '--randrepeat=1',
    '--randseed=4242',
    '--output-format=json',
    '--verify_state_save=0', // no *-verify.state files left behind
    ...extra,
  ];
}

async function fio(args: string[], cwd: string): Promise<FioResult> {
  const r = await run('fio', args, { timeoutMs: 120_000, cwd });
  // The nbd engine announces each connection on stdout.
  expect(r.stdout.match(/fio: connected to NBD server/g)?.length ?? 0, r.stdout).toBeGreaterThanOrEqual(JOBS);
  const res = parseFioJson(r.stdout);
  expect(res.jobs).toHaveLength(JOBS);
  for (const j of res.jobs) expect(j.error, `fio job error\n${r.stdout}\n${r.stderr}`).toBe(0);
  return res;
}

describe.each([1, 3])('fio nbd engine on a %i-replica volume', (replicas) => {
  let vol: VolumeFixture | null = null;

  afterEach(async () => {
    await vol?.cleanup();
    vol = null;
    await killAllServers();
  });

  it('randwrite with crc32c verify, 4 jobs, then verify-only passes (also after restart)', async () => {
    vol = new VolumeFixture(SIZE, replicas);
    await vol.start();
    const written: number[][] = [];
    for (const [i, bs] of [['--bs=4k'], ['--bsrange=512-128k', '--bs_unaligned=1']].entries()) {
      // Second layout writes to the upper half so both stay verifiable.
      const extra = i === 0 ? [] : [`--offset=${JOBS * PER_JOB}`];
      const w = await fio(fioArgs(vol.uri, 'randwrite', bs, extra), vol.tmp.path);
      for (const j of w.jobs) {
        // Every block written once (random map); variable sizes may leave a tail unused.
        if (i === 0) expect(j.write.io_bytes).toBe(PER_JOB);
        else expect(j.write.io_bytes).toBeGreaterThan(PER_JOB * 0.9);
        expect(j.read.io_bytes).toBe(j.write.io_bytes); // ...and read back by the verify phase
      }
      const v = await fio(fioArgs(vol.uri, 'randwrite', bs, [...extra, '--verify_only=1']), vol.tmp.path);
      v.jobs.forEach((j, k) => expect(j.read.io_bytes).toBe(w.jobs[k]!.write.io_bytes));
      written.push(w.jobs.map((j) => j.write.io_bytes));
    }
    await vol.restart();
    for (const [i, bs] of [['--bs=4k'], ['--bsrange=512-128k', '--bs_unaligned=1']].entries()) {
      const extra = i === 0 ? [] : [`--offset=${JOBS * PER_JOB}`];
      const v = await fio(fioArgs(vol.uri, 'randwrite', bs, [...extra, '--verify_only=1']), vol.tmp.path);
      v.jobs.forEach((j, k) => expect(j.read.io_bytes).toBe(written[i]![k]));
    }
    await vol.checkReplicas();
  });
});
