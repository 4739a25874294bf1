// A lockspace's lifecycle over real sanlock daemons (one per simulated host, as in
// sanlock.test.ts, with host names of their own: host-l*, host-c*, host-r*, host-k*):
// delete (refused while hosts or locks are live, and after a crash only once the crashed
// host is dead), a host that re-joins after its storage failed and came back, and a
// lockspace on a block device (a loop device). io_timeout is 1 s.
//
// The two slow scenarios (delete after a crash: 8N + 60 s; the storage failure, which waits
// until the other host sees the failed host dead) run in the background from beforeAll and
// are awaited by their own tests.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { failureTimings, hostDeadSeconds, renewalIntervalSeconds } from '../../../src/locks/timing.js';
import { killAllDaemons, requireSanlock } from '../helpers/sanlock-daemon.js';
import { AgentError, SimHost, VM_SCRIPT, stopAllHosts } from '../helpers/sanlock-host.js';

/** io_timeout of every lockspace here, seconds. */
const N = 1;
/** How late a measured moment may come past its bound on this loaded 2-core machine (as sanlock.test.ts). */
const TIMING_SLACK_MS = 5_000;
const MIB = 1024 * 1024;
const VM_STDIO = ['pipe', 'pipe', 'inherit'] as ['pipe', 'pipe', 'inherit'];

let dir: string;
let crashDelete: Promise<CrashDeleteResult>;
let rejoin: Promise<RejoinResult>;
/** Loop devices and mounts made here, undone in afterAll if a scenario could not. */
const loops = new Set<string>();
const mounts = new Set<string>();
const frozen = new Set<string>();

/** Runs a command; a failure throws with its stderr. */
function run(cmd: string, args: string[]): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.status ?? r.signal}): ${r.stderr}`);
  return r.stdout;
}

function attachLoop(file: string, opts: string[] = []): string {
  const dev = run('losetup', ['-f', '--show', ...opts, file]).trim();
  loops.add(dev);
  return dev;
}

function detachLoop(dev: string): void {
  run('losetup', ['-d', dev]);
  loops.delete(dev);
}

async function code(p: Promise<unknown>): Promise<AgentError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err, 'expected the call to fail').toBeInstanceOf(AgentError);
  return err as AgentError;
}

beforeAll(() => {
  requireSanlock();
  for (const tool of ['losetup', 'fsfreeze', 'filefrag', 'mkfs.ext4']) {
    if (spawnSync('sh', ['-c', `command -v ${tool}`]).status !== 0)
      throw new Error(`${tool} is missing: install util-linux and e2fsprogs (bash .ci/setup.sh)`);
  }
  dir = mkdtempSync(join(tmpdir(), 'mooring-lslife-'));
  crashDelete = runCrashDelete(join(dir, 'crash'));
  crashDelete.catch(() => undefined);
  rejoin = runRejoin(join(dir, 'rejoin'));
  rejoin.catch(() => undefined);
});

afterAll(async () => {
  await Promise.allSettled([crashDelete, rejoin]);
  await stopAllHosts();
  await killAllDaemons();
  for (const m of frozen) spawnSync('fsfreeze', ['-u', m]);
  for (const m of mounts) spawnSync('umount', ['-l', m]);
  for (const d of loops) spawnSync('losetup', ['-d', d]);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('Lockspace lifecycle over real sanlock daemons', () => {
  it('delete is refused while a host is a member or another host renews its lease (naming them and the locks they hold), then removes the lockspace', async () => {
    const path = join(dir, 'lsdel.img');
    const [L1, L2] = await Promise.all([SimHost.start('host-l1'), SimHost.start('host-l2')]);
    try {
      await L1.run(
        async (m, s, a) => {
          s.ls = await m.Lockspace.create({ name: 'lsdel', path: a.path, maxLocks: 2, ioTimeoutSeconds: a.N });
          await s.ls.join({ hostId: 1, hostName: 'host-l1' });
          await s.ls.createLock('dd1');
          s.w = s.ls.watch({ pollIntervalMs: 200, hostIds: [2] });
          s.w.on('change', (e: { to: string }) => s.emit('host2', e.to));
          s.w.start();
        },
        { path, N },
      );
      await L2.run(
        async (m, s, a) => {
          s.ls = await m.Lockspace.open({ name: 'lsdel', path: a.path });
          await s.ls.join({ hostId: 2, hostName: 'host-l2' });
          s.vm = await s.start({ command: 'sleep', args: ['300'], locks: [await s.ls.openLock('dd1')], ownerName: 'vm-dd1' });
        },
        { path },
      );
      await L1.waitEvent((e) => e.event === 'host2' && e.data === 'live', 20_000);

      // Host 1 is a member: refused at once, naming itself and host 2 with its lock.
      const asMember = await code(L1.run(async (_m, s) => s.ls.delete()));
      expect(asMember.code, asMember.message).toBe('BUSY');
      expect(asMember.details).toMatchObject({
        lockspace: 'lsdel',
        hosts: [
          { hostId: 1, hostName: 'host-l1', state: 'joined-here' },
          { hostId: 2, hostName: 'host-l2', state: 'live' },
        ],
        locks: [{ name: 'dd1', hostIds: [2] }],
      });
      expect(asMember.message).toMatch(/leave\(\)/);

      // Host 1 leaves: host 2's lease still renews, so delete refuses within one renewal interval.
      const refused = await L1.run(async (_m, s) => {
        await s.w.stop();
        await s.ls.leave();
        const t0 = Date.now();
        const err = await s.ls.delete().then(
          () => null,
          (e: { code: string; message: string; details: unknown }) => ({ code: e.code, message: e.message, details: e.details }),
        );
        return { err, ms: Date.now() - t0 };
      });
      expect(refused.err?.code, refused.err?.message).toBe('BUSY');
      expect(refused.err?.details).toMatchObject({ hosts: [{ hostId: 2, hostName: 'host-l2', state: 'live' }], locks: [{ name: 'dd1', hostIds: [2] }] });
      expect(refused.ms).toBeLessThan((renewalIntervalSeconds(N) + 1) * 1000 + TIMING_SLACK_MS);
      expect(existsSync(path)).toBe(true);

      // Host 2 stops its VM and leaves: nothing is live, delete removes the file at once.
      await L2.run(async (_m, s) => {
        s.vm.kill('SIGKILL');
        await s.vm.exited;
        await s.ls.leave();
      });
      const deleted = await L1.run(
        async (m, s, a) => {
          const t0 = Date.now();
          await s.ls.delete();
          const ms = Date.now() - t0;
          const reopen = await m.Lockspace.open({ name: 'lsdel', path: a.path }).then(
            () => 'opened',
            (e: { code: string }) => e.code,
          );
          // The storage can hold a new lockspace.
          const again = await m.Lockspace.create({ name: 'lsdel', path: a.path, maxLocks: 1, ioTimeoutSeconds: a.N });
          return { ms, reopen, again: (await again.status()).maxLocks };
        },
        { path, N },
      );
      expect(deleted.reopen).toBe('NOT_FOUND');
      expect(deleted.again).toBe(1);
      console.log(`delete: refused ${refused.ms} ms after it began (a live host renews every ${renewalIntervalSeconds(N)} s); with every host gone it took ${deleted.ms} ms`);
    } finally {
      await Promise.all([L1.stop(), L2.stop()]);
    }
  });

  it('a lockspace on a block device (a loop device): two hosts join, a lock is taken and handed over with its version, and delete zeroes it', async () => {
    const backing = join(dir, 'lun.img');
    writeFileSync(backing, '');
    run('truncate', ['-s', '64M', backing]); // sparse: a LUN larger than the lockspace
    const dev = attachLoop(backing);
    const [K1, K2] = await Promise.all([SimHost.start('host-k1'), SimHost.start('host-k2')]);
    try {
      const vmDisk = join(dir, 'vmk.img');
      writeFileSync(vmDisk, Buffer.alloc(MIB));
      const created = await K1.run(
        async (m, s, a) => {
          s.ls = await m.Lockspace.create({ name: 'lsblk', path: a.dev, maxLocks: 4, ioTimeoutSeconds: a.N });
          await s.ls.join({ hostId: 1, hostName: 'host-k1' });
          s.lock = await s.ls.createLock('diskk');
          s.src = await s.start({ command: process.execPath, args: [a.vm, a.vmDisk], locks: [s.lock], ownerName: 'vm-k', stdio: a.stdio });
          return { wrote: await s.talk(s.src, 'write 0 65536 5'), status: await s.ls.status() };
        },
        { dev, N, vm: VM_SCRIPT, vmDisk, stdio: VM_STDIO },
      );
      expect(created.wrote).toBe('ok');
      expect(created.status).toMatchObject({ path: dev, maxLocks: 4, membership: 'joined', hostId: 1 });

      // Host 2 opens it from the device (maxLocks from its index: stat says 0 for a device).
      const opened = await K2.run(
        async (m, s, a) => {
          s.ls = await m.Lockspace.open({ name: 'lsblk', path: a.dev });
          await s.ls.join({ hostId: 2, hostName: 'host-k2' });
          s.lock = await s.ls.openLock('diskk');
          s.tgt = await s.start({ command: process.execPath, args: [a.vm, a.vmDisk], ownerName: 'vm-k', stdio: a.stdio });
          const refused = await s.lock.acquire(s.tgt).then(
            () => 'acquired',
            (e: { code: string }) => e.code,
          );
          return { status: await s.ls.status(), refused, info: await s.lock.inspect() };
        },
        { dev, vm: VM_SCRIPT, vmDisk, stdio: VM_STDIO },
      );
      expect(opened.status).toMatchObject({ maxLocks: 4, ioTimeoutSeconds: N, membership: 'joined', hostId: 2 });
      expect(opened.refused).toBe('LOCK_HELD');
      expect(opened.info).toMatchObject({ version: 1, owners: [{ hostId: 1 }] });

      // Hand-over: host 1 releases at its version, host 2 acquires at that version.
      const h = await K1.run(async (_m, s) => s.src.handOver());
      expect(h.leases).toMatchObject([{ lockspace: 'lsblk', name: 'diskk', version: 1 }]);
      const taken = await K2.run(
        async (_m, s, a) => {
          await s.tgt.takeOver(a.h, [s.ls]);
          return { held: await s.tgt.inquire(), check: await s.talk(s.tgt, 'check 0 65536 5'), info: await s.lock.inspect() };
        },
        { h },
      );
      expect(taken.held).toMatchObject([{ name: 'diskk', version: 2 }]);
      expect(taken.check).toBe('ok');
      expect(taken.info.owners.map((o: { hostId: number }) => o.hostId)).toEqual([2]);
      const back = await K1.run(async (_m, s, a) => s.src.takeOver(a.h, [s.ls]).then(() => 'taken', (e: { code: string }) => e.code), { h });
      expect(['LOCK_HELD', 'LOCK_VERSION_MISMATCH']).toContain(back);

      // Everyone leaves; delete zeroes the area on the device (it cannot be removed).
      await Promise.all(
        [K1, K2].map((k) =>
          k.run(async (_m, s) => {
            for (const p of s.procs) p.kill('SIGKILL');
            await Promise.all(s.procs.map((p: { exited: Promise<unknown> }) => p.exited));
            await s.ls.leave();
          }),
        ),
      );
      const gone = await K1.run(
        async (m, s, a) => {
          await s.ls.delete();
          return m.Lockspace.open({ name: 'lsblk', path: a.dev }).then(
            () => 'opened',
            (e: { code: string }) => e.code,
          );
        },
        { dev },
      );
      expect(gone).toBe('CORRUPT_METADATA');
      const head = execFileSync('dd', [`if=${dev}`, 'bs=1M', 'count=3', 'iflag=direct', 'status=none'], { maxBuffer: 4 * MIB });
      expect(head.length).toBe(3 * MIB);
      expect(head.every((b) => b === 0)).toBe(true);
    } finally {
      await Promise.all([K1.stop(), K2.stop()]);
      detachLoop(dev);
    }
  });

  it('delete after a host crashed waits until the crashed host is dead (8N + 60 s of silence), then removes the lockspace', async () => {
    const r = await crashDelete;
    const deadMs = hostDeadSeconds(N) * 1000;
    expect(r.existedWhileWaiting).toBe(true);
    expect(r.deleteMs).toBeGreaterThanOrEqual(deadMs);
    expect(r.deleteMs).toBeLessThan(deadMs + TIMING_SLACK_MS);
    expect(r.existsAfter).toBe(false);
    console.log(`delete after a crash: ${r.deleteMs} ms (a host is dead after ${deadMs / 1000} s of silence)`);
  }, 200_000);

  it('a host whose storage failed re-joins with the same host id once it is back, and its lock works again; the other host sees it live, fail, dead, then live in a new generation', async () => {
    const r = await rejoin;
    expect(r.killed).toMatchObject({ reason: 'renewal-failed', lockspace: 'lsr', locks: ['diskr'] });
    expect(r.lost).toMatchObject({ lockspace: 'lsr', hostId: 1, reason: 'renewal-failed' });
    expect(r.membershipWhileFailed).not.toBe('joined');
    // After the thaw the daemon gives the failed lockspace up, which may write its lease as
    // released: a watcher that polls in that window sees it free before it is live again.
    const seen = r.transitions.filter((t) => t.to !== 'unknown').map((t) => t.to);
    expect([
      ['live', 'fail', 'dead', 'live'],
      ['live', 'fail', 'dead', 'free', 'live'],
    ]).toContainEqual(seen);
    const gens = r.transitions.filter((t) => t.to === 'live').map((t) => t.generation);
    expect(gens[1]).toBe(gens[0] + 1);
    // The other host's windows hold through it (T3, T4 after the failure).
    const { t3MarkedFailed: t3, t4Recoverable: t4 } = failureTimings(N);
    expect(r.failAfterMs).toBeLessThan(t3.maxSeconds * 1000 + TIMING_SLACK_MS);
    expect(r.deadAfterMs).toBeGreaterThanOrEqual(t4.minSeconds * 1000);
    expect(r.deadAfterMs).toBeLessThan(t4.maxSeconds * 1000 + TIMING_SLACK_MS);
    expect(r.status).toMatchObject({ membership: 'joined', hostId: 1 });
    // Its lock works again: held by its new VM (next version), refused to the other host.
    expect(r.heldAgain).toMatchObject([{ lockspace: 'lsr', name: 'diskr', version: 2 }]);
    expect(r.owners).toEqual([{ hostId: 1, generation: gens[1] }]);
    expect(r.otherHostRefused).toBe('LOCK_HELD');
    console.log(
      `re-join: fail seen ${r.failAfterMs} ms and dead ${r.deadAfterMs} ms after the freeze; after the thaw the lockspace was gone in ${r.removedAfterThawMs} ms, the join took ${r.joinMs} ms, the other host saw it live ${r.liveAgainAfterThawMs} ms after the thaw`,
    );
  }, 240_000);
});

interface CrashDeleteResult {
  deleteMs: number;
  existedWhileWaiting: boolean;
  existsAfter: boolean;
}

// Host C1 holds a lock and crashes (daemon and VM killed); host C2, which never joined,
// deletes the lockspace: C1's lease stays held on storage, so delete must wait until it is dead.
async function runCrashDelete(work: string): Promise<CrashDeleteResult> {
  mkdirSync(work, { recursive: true });
  const path = join(work, 'lsx.img');
  const [C1, C2] = await Promise.all([SimHost.start('host-c1'), SimHost.start('host-c2')]);
  try {
    await C1.run(
      async (m, s, a) => {
        s.ls = await m.Lockspace.create({ name: 'lsx', path: a.path, maxLocks: 1, ioTimeoutSeconds: a.N });
        await s.ls.join({ hostId: 1, hostName: 'host-c1' });
        s.vm = await s.start({ command: 'sleep', args: ['600'], locks: [await s.ls.createLock('diskx')] });
      },
      { path, N },
    );
    C1.daemon.kill();
    await C1.run(async (_m, s) => {
      s.vm.kill('SIGKILL');
      await s.vm.exited;
    });
    const started = Date.now();
    const deleting = C2.run(
      async (m, s, a) => {
        s.ls = await m.Lockspace.open({ name: 'lsx', path: a.path });
        const t0 = Date.now();
        await s.ls.delete();
        return Date.now() - t0;
      },
      { path },
      200_000,
    );
    // Half-way through the wait the lockspace is still there.
    let existedWhileWaiting = false;
    const halfWay = new Promise<void>((resolve) => {
      const t = setInterval(() => {
        if (Date.now() - started < (hostDeadSeconds(N) * 1000) / 2) return;
        clearInterval(t);
        existedWhileWaiting = existsSync(path);
        resolve();
      }, 200);
    });
    const deleteMs = await deleting;
    await halfWay;
    return { deleteMs, existedWhileWaiting, existsAfter: existsSync(path) };
  } finally {
    await Promise.all([C1.stop(), C2.stop()]);
  }
}

interface RejoinResult {
  killed: unknown;
  lost: unknown;
  membershipWhileFailed: string;
  transitions: Array<{ to: string; generation: number; atMs: number }>;
  failAfterMs: number;
  deadAfterMs: number;
  removedAfterThawMs: number;
  joinMs: number;
  liveAgainAfterThawMs: number;
  status: unknown;
  heldAgain: unknown;
  owners: Array<{ hostId: number; generation: number }>;
  otherHostRefused: string;
}

// One storage, two paths to it: host R1 reaches the lockspace as a file on an ext4
// filesystem (frozen with fsfreeze: R1's storage fails), host R2 through a loop device
// onto the same bytes underneath the filesystem (its path stays up), as two hosts reach one
// LUN through their own paths. R2's watcher reports R1 across the failure and the re-join.
async function runRejoin(work: string): Promise<RejoinResult> {
  mkdirSync(work, { recursive: true });
  const img = join(work, 'fs.img');
  const mnt = join(work, 'mnt');
  mkdirSync(mnt);
  writeFileSync(img, '');
  run('truncate', ['-s', '64M', img]);
  run('mkfs.ext4', ['-q', '-b', '4096', img]);
  run('mount', ['-o', 'loop', img, mnt]);
  mounts.add(mnt);
  let dev: string | undefined;
  let R1: SimHost | undefined;
  let R2: SimHost | undefined;
  try {
    // Written out (not sparse), so the file's blocks are allocated and one extent long.
    const file = join(mnt, 'lsr.img');
    const size = (2 + 3) * MIB;
    run('dd', ['if=/dev/zero', `of=${file}`, 'bs=1M', `count=${size / MIB}`, 'conv=fsync', 'status=none']);
    const frag = run('filefrag', ['-v', file]);
    const extents = [...frag.matchAll(/^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):/gm)];
    if (extents.length !== 1 || Number(extents[0][1]) !== 0 || (Number(extents[0][2]) + 1) * 4096 !== size)
      throw new Error(`expected ${file} in one extent:\n${frag}`);
    dev = attachLoop(img, ['--offset', String(Number(extents[0][3]) * 4096), '--sizelimit', String(size)]);

    [R1, R2] = await Promise.all([SimHost.start('host-r1'), SimHost.start('host-r2')]);
    await R1.run(
      async (m, s, a) => {
        s.ls = await m.Lockspace.create({ name: 'lsr', path: a.file, maxLocks: 2, ioTimeoutSeconds: a.N });
        await s.ls.join({ hostId: 1, hostName: 'host-r1' });
        s.lock = await s.ls.createLock('diskr');
        s.vm = await s.start({ command: 'sleep', args: ['600'], locks: [s.lock], ownerName: 'vm-r' });
        s.ls.on('lost', (e: unknown) => s.emit('lost', e));
        s.ls.on('holder-killed', (e: unknown) => s.emit('holder-killed', e));
      },
      { file, N },
    );
    await R2.run(
      async (m, s, a) => {
        s.ls = await m.Lockspace.open({ name: 'lsr', path: a.dev });
        await s.ls.join({ hostId: 2, hostName: 'host-r2' });
        s.lock = await s.ls.openLock('diskr');
        s.w = s.ls.watch({ pollIntervalMs: 250, hostIds: [1] });
        s.w.on('change', (e: { to: string; host: { generation: number }; atMs: number }) =>
          s.emit('host', { to: e.to, generation: e.host.generation, atMs: e.atMs }),
        );
        s.w.start();
      },
      { dev },
    );
    await R2.waitEvent((e) => e.event === 'host' && e.data.to === 'live', 30_000);

    const freezeAtMs = Date.now();
    run('fsfreeze', ['-f', mnt]);
    frozen.add(mnt);
    await R1.run(async (_m, s) => s.vm.exited, undefined, 60_000);
    const killed = await R1.waitEvent((e) => e.event === 'holder-killed', 10_000);
    const lost = await R1.waitEvent((e) => e.event === 'lost', 10_000);
    const fail = await R2.waitEvent((e) => e.event === 'host' && e.data.to === 'fail', 60_000);
    const dead = await R2.waitEvent((e) => e.event === 'host' && e.data.to === 'dead', 150_000);
    const membershipWhileFailed = await R1.run(async (_m, s) => s.ls.membership());

    // Storage back: the daemon finishes giving the lockspace up, then R1 joins again.
    const thawAtMs = Date.now();
    run('fsfreeze', ['-u', mnt]);
    frozen.delete(mnt);
    const back = await R1.run(async (_m, s) => {
      const t0 = Date.now();
      for (;;) {
        const mem = await s.ls.membership();
        if (mem === 'not-joined') break;
        if (Date.now() - t0 > 60_000) throw new Error(`lockspace still ${mem} 60 s after the storage came back`);
        await new Promise((r) => setTimeout(r, 100));
      }
      const removedAtMs = Date.now();
      await s.ls.join({ hostId: 1, hostName: 'host-r1' });
      const joinMs = Date.now() - removedAtMs;
      s.vm2 = await s.start({ command: 'sleep', args: ['600'], locks: [s.lock], ownerName: 'vm-r' });
      return { removedAtMs, joinMs, status: await s.ls.status(), heldAgain: await s.vm2.inquire() };
    });
    const liveAgain = await R2.waitEvent((e) => e.event === 'host' && e.data.to === 'live' && e.atMs > thawAtMs, 30_000);
    const other = await R2.run(async (_m, s) => {
      s.vm = await s.start({ command: 'sleep', args: ['600'] });
      const refused = await s.lock.acquire(s.vm).then(
        () => 'acquired',
        (e: { code: string }) => e.code,
      );
      const info = await s.lock.inspect();
      await s.w.stop();
      return { refused, owners: info.owners.map((o: { hostId: number; generation: number }) => ({ hostId: o.hostId, generation: o.generation })) };
    });
    return {
      killed: killed.data,
      lost: lost.data,
      membershipWhileFailed,
      transitions: R2.events.filter((e) => e.event === 'host').map((e) => e.data),
      failAfterMs: fail.data.atMs - freezeAtMs,
      deadAfterMs: dead.data.atMs - freezeAtMs,
      removedAfterThawMs: back.removedAtMs - thawAtMs,
      joinMs: back.joinMs,
      liveAgainAfterThawMs: liveAgain.data.atMs - thawAtMs,
      status: back.status,
      heldAgain: back.heldAgain,
      owners: other.owners,
      otherHostRefused: other.refused,
    };
  } finally {
    if (frozen.has(mnt)) {
      run('fsfreeze', ['-u', mnt]);
      frozen.delete(mnt);
    }
    await Promise.all([R1?.stop(), R2?.stop()]);
    if (dev) detachLoop(dev);
    // Lazy: a daemon may still hold the lockspace file open while it gives the lockspace up.
    run('umount', ['-l', mnt]);
    mounts.delete(mnt);
  }
}
