// Lockspace, Lock and LockedProcess against real sanlock daemons: every simulated host is
// its own daemon (own run directory and host name) plus its own library process, all on
// this machine, sharing lockspace files as hosts share storage. io_timeout is 1 s.
//
// The three slow scenarios (a host crash seen from another host: about 70 s, because a host
// is dead only 8N + 60 s after its last renewal; a host that shut down cleanly, treated as
// dead 8N + 60 s after its release; and a storage failure on one host) run on their own
// hosts in the background while the other tests run, and are awaited by their own tests at
// the end.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { failureTimings } from '../../../src/locks/timing.js';
import { Mooring } from '../../../src/mooring.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { killAllDaemons, requireSanlock } from '../helpers/sanlock-daemon.js';
import { AgentError, SimHost, VM_SCRIPT, stopAllHosts } from '../helpers/sanlock-host.js';
import { qemuIo, repoRoot } from '../helpers/tools.js';

/** io_timeout of every lockspace here, seconds. */
const N = 1;
/**
 * How late a measured moment may come after its window's upper bound: the daemons renew and
 * the watchers poll on a shared 2-core machine, where a loaded scheduler delays both.
 */
const TIMING_SLACK_MS = 5_000;
const MIB = 1024 * 1024;

let dir: string;
let A: SimHost;
let B: SimHost;
let deadHost: Promise<DeadHostResult>;
let storageFailure: Promise<StorageFailureResult>;
let cleanShutdown: Promise<CleanShutdownResult>;

async function expectCode(p: Promise<unknown>, code: string): Promise<AgentError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err, `expected ${code}`).toBeInstanceOf(AgentError);
  expect((err as AgentError).code, (err as AgentError).message).toBe(code);
  return err as AgentError;
}

function disk(name: string, sizeBytes = MIB): string {
  const p = join(dir, name);
  writeFileSync(p, Buffer.alloc(sizeBytes));
  return p;
}

beforeAll(async () => {
  requireSanlock();
  dir = mkdtempSync(join(tmpdir(), 'mooring-locks-'));
  deadHost = runDeadHost(join(dir, 'dead'));
  deadHost.catch(() => undefined);
  storageFailure = runStorageFailure(join(dir, 'storage'));
  storageFailure.catch(() => undefined);
  cleanShutdown = runCleanShutdown(join(dir, 'clean'));
  cleanShutdown.catch(() => undefined);
  [A, B] = await Promise.all([SimHost.start('host-a'), SimHost.start('host-b')]);
});

afterAll(async () => {
  await Promise.allSettled([deadHost, storageFailure, cleanShutdown]);
  await stopAllHosts();
  await killAllDaemons();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('Lockspace and Lock over real sanlock daemons', () => {
  it('creates a lockspace of (maxLocks + 3) MiB, joins two hosts, refuses a host id in use, reports hosts, leaves', async () => {
    const path = join(dir, 'ls1.img');
    const created = await A.run(
      async (m, s, a) => {
        s.ls1 = await m.Lockspace.create({ name: 'ls1', path: a.path, maxLocks: 8, ioTimeoutSeconds: a.N });
        const again = await m.Lockspace.create({ name: 'ls1', path: a.path, maxLocks: 8 }).then(
          () => 'created twice',
          (e) => e.code,
        );
        const before = await s.ls1.membership();
        await s.ls1.join({ hostId: 1, hostName: 'host-a' });
        return { again, before, status: await s.ls1.status() };
      },
      { path, N },
    );
    expect(statSync(path).size).toBe((8 + 3) * MIB);
    expect(created.again).toBe('ALREADY_EXISTS');
    expect(created.before).toBe('not-joined');
    expect(created.status).toMatchObject({ name: 'ls1', maxLocks: 8, ioTimeoutSeconds: N, membership: 'joined', hostId: 1 });

    // Host B asks for host A's id: refused at once, not after sanlock's 8N + 60 s.
    await expectCode(
      B.run(
        async (m, s, a) => {
          s.ls1 = await m.Lockspace.open({ name: 'ls1', path: a.path });
          await s.ls1.join({ hostId: 1, hostName: 'host-b' });
        },
        { path },
      ),
      'HOST_ID_IN_USE',
    );
    await B.run(async (_m, s) => s.ls1.join({ hostId: 2, hostName: 'host-b' }));

    // Both hosts see each other live (a host is 'unknown' until a renewal of it is seen).
    const seen = await A.run(async (_m, s) => {
      for (let i = 0; i < 100; i++) {
        const hosts = await s.ls1.hosts();
        const live = hosts.filter((h: { state: string }) => h.state === 'live').map((h: { hostId: number }) => h.hostId);
        if (live.includes(1) && live.includes(2)) return hosts;
        await new Promise((r) => setTimeout(r, 200));
      }
      return s.ls1.hosts();
    });
    expect(seen.map((h: { hostId: number; state: string }) => [h.hostId, h.state])).toEqual([
      [1, 'live'],
      [2, 'live'],
    ]);

    // B leaves: A's watcher sees it turn free; B joins again for the tests below.
    await A.run(async (_m, s) => {
      s.w1 = s.ls1.watch({ pollIntervalMs: 200 });
      s.w1.on('change', (e: { hostId: number; to: string }) => s.emit('ls1-host', { hostId: e.hostId, to: e.to }));
      s.w1.start();
    });
    await A.waitEvent((e) => e.event === 'ls1-host' && e.data.hostId === 2 && e.data.to === 'live', 20_000);
    const left = await B.run(async (_m, s) => {
      await s.ls1.leave();
      return s.ls1.membership();
    });
    expect(left).toBe('not-joined');
    await A.waitEvent((e) => e.event === 'ls1-host' && e.data.hostId === 2 && e.data.to === 'free', 20_000);
    await B.run(async (_m, s) => s.ls1.join({ hostId: 2, hostName: 'host-b' }));
    await A.run(async (_m, s) => s.w1.stop());
  });

  it('an exclusive lock held by a VM on host A is refused to host B and to a second VM on A, and freed when the VM exits', async () => {
    const vmDisk = disk('vm1.img');
    const vm = ['pipe', 'pipe', 'inherit'] as ['pipe', 'pipe', 'inherit'];
    const held = await A.run(
      async (_m, s, a) => {
        s.disk1 = await s.ls1.createLock('disk1');
        s.vmA = await s.start({ command: process.execPath, args: [a.vmScript, a.vmDisk], locks: [s.disk1], ownerName: 'vm-a', stdio: a.vm });
        const wrote = await s.talk(s.vmA, 'write 0 65536 1');
        const pid = Number(await s.talk(s.vmA, 'pid'));
        const second = await s
          .start({ command: process.execPath, args: [a.vmScript, a.vmDisk], locks: [s.disk1], stdio: a.vm })
          .then(() => 'started', (e: { code: string }) => e.code);
        const deleted = await s.disk1.delete().then(() => 'deleted', (e: { code: string }) => e.code);
        return { wrote, pid, helperPid: s.vmA.pid, held: await s.vmA.inquire(), second, deleted };
      },
      { vmScript: VM_SCRIPT, vmDisk, vm },
    );
    expect(held.wrote).toBe('ok');
    // The VM is the helper process itself after exec: the registered pid holds the lease.
    expect(held.pid).toBe(held.helperPid);
    expect(held.held).toMatchObject([{ lockspace: 'ls1', name: 'disk1', version: 1, shared: false }]);
    expect(held.second).toBe('LOCK_HELD');
    expect(held.deleted).toBe('BUSY');

    const onB = await B.run(
      async (_m, s, a) => {
        s.disk1 = await s.ls1.openLock('disk1');
        const info = await s.disk1.inspect();
        const refused = await s
          .start({ command: process.execPath, args: [a.vmScript, a.vmDisk], locks: [s.disk1], stdio: a.vm })
          .then(() => 'started', (e: { code: string; details: unknown }) => e.code);
        return { info, refused };
      },
      { vmScript: VM_SCRIPT, vmDisk, vm },
    );
    expect(onB.refused).toBe('LOCK_HELD');
    expect(onB.info.owners.map((o: { hostId: number }) => o.hostId)).toEqual([1]);

    // A's VM exits: the daemon releases its lease; B's VM then gets it and sees A's data.
    const exit = await A.run(async (_m, s) => {
      s.vmA.kill('SIGTERM');
      return s.vmA.exited;
    });
    expect(exit.signal).toBe('SIGTERM');
    expect(exit.stoppedBySanlock).toBeUndefined();
    const after = await B.run(
      async (_m, s, a) => {
        let last = '';
        for (let i = 0; i < 50; i++) {
          try {
            s.vmB = await s.start({ command: process.execPath, args: [a.vmScript, a.vmDisk], locks: [s.disk1], stdio: a.vm });
            return { check: await s.talk(s.vmB, 'check 0 65536 1'), info: await s.disk1.inspect() };
          } catch (e) {
            last = (e as { code: string }).code;
            if (last !== 'BUSY' && last !== 'LOCK_HELD') throw e;
            await new Promise((r) => setTimeout(r, 200));
          }
        }
        return { check: last, info: null };
      },
      { vmScript: VM_SCRIPT, vmDisk, vm },
    );
    expect(after.check).toBe('ok');
    expect(after.info.owners.map((o: { hostId: number }) => o.hostId)).toEqual([2]);
    expect(after.info.version).toBe(2);
    await B.run(async (_m, s) => {
      s.vmB.kill('SIGKILL');
      await s.vmB.exited;
    });
  });

  it('shared locks are held by VMs on both hosts at once, and exclude an exclusive holder', async () => {
    const r = await A.run(async (_m, s) => {
      s.sh = await s.ls1.createLock('shared1');
      s.shA = await s.start({ command: 'sleep', args: ['300'], locks: [{ lock: s.sh, shared: true }] });
      return s.shA.inquire();
    });
    expect(r).toMatchObject([{ name: 'shared1', shared: true }]);
    const onB = await B.run(async (_m, s) => {
      s.sh = await s.ls1.openLock('shared1');
      s.shB = await s.start({ command: 'sleep', args: ['300'], locks: [{ lock: s.sh, shared: true }] });
      const exclusive = await s
        .start({ command: 'sleep', args: ['300'], locks: [s.sh] })
        .then(() => 'started', (e: { code: string }) => e.code);
      return { held: await s.shB.inquire(), exclusive };
    });
    expect(onB.held).toMatchObject([{ name: 'shared1', shared: true }]);
    expect(onB.exclusive).toBe('LOCK_HELD');
    await Promise.all([
      A.run(async (_m, s) => {
        s.shA.kill('SIGKILL');
        await s.shA.exited;
      }),
      B.run(async (_m, s) => {
        s.shB.kill('SIGKILL');
        await s.shB.exited;
      }),
    ]);
  });

  it('hands a lock over with a running VM from host A to host B (lease version checked), data checked on both sides, and back on rollback', async () => {
    const vmDisk = disk('vm2.img');
    const vm = ['pipe', 'pipe', 'inherit'] as ['pipe', 'pipe', 'inherit'];
    // Source VM on A holds the lock and writes.
    const src = await A.run(
      async (_m, s, a) => {
        s.disk2 = await s.ls1.createLock('disk2');
        s.src = await s.start({ command: process.execPath, args: [a.vmScript, a.vmDisk], locks: [s.disk2], ownerName: 'vm2', stdio: a.vm });
        return s.talk(s.src, 'write 0 131072 11');
      },
      { vmScript: VM_SCRIPT, vmDisk, vm },
    );
    expect(src).toBe('ok');
    // Target VM on B starts registered only, holding nothing (QEMU -incoming, paused).
    const tgt = await B.run(
      async (_m, s, a) => {
        s.tgt = await s.start({ command: process.execPath, args: [a.vmScript, a.vmDisk], ownerName: 'vm2', stdio: a.vm });
        return s.tgt.inquire();
      },
      { vmScript: VM_SCRIPT, vmDisk, vm },
    );
    expect(tgt).toEqual([]);
    // Switch-over: the source hands over (inquire + release), the target takes over with the version.
    const handover = await A.run(async (_m, s) => {
      const h = await s.src.handOver();
      return { h, after: await s.src.inquire() };
    });
    expect(handover.after).toEqual([]);
    expect(handover.h.leases).toMatchObject([{ lockspace: 'ls1', name: 'disk2', version: 1, shared: false }]);
    const taken = await B.run(
      async (_m, s, a) => {
        await s.tgt.takeOver(a.h, [s.ls1]);
        const held = await s.tgt.inquire();
        const check = await s.talk(s.tgt, 'check 0 131072 11');
        const wrote = await s.talk(s.tgt, 'write 131072 131072 22');
        return { held, check, wrote };
      },
      { h: handover.h },
    );
    expect(taken.held).toMatchObject([{ name: 'disk2', version: 2 }]);
    expect(taken.check).toBe('ok');
    expect(taken.wrote).toBe('ok');
    // The source sees the target's writes; it cannot take the lock back while B holds it.
    const back = await A.run(
      async (_m, s, a) => {
        const check = await s.talk(s.src, 'check 131072 131072 22');
        const retake = await s.src.takeOver(a.h, [s.ls1]).then(
          () => 'taken',
          (e: { code: string }) => e.code,
        );
        return { check, retake };
      },
      { h: handover.h },
    );
    expect(back.check).toBe('ok');
    expect(['LOCK_HELD', 'LOCK_VERSION_MISMATCH']).toContain(back.retake);

    // A migration B -> A that is rolled back: B hands over, nobody takes it, B takes it back.
    const rolled = await B.run(async (_m, s) => {
      const h = await s.tgt.handOver();
      await s.tgt.takeOver(h, [s.ls1]);
      return { h, held: await s.tgt.inquire() };
    });
    expect(rolled.h.leases).toMatchObject([{ name: 'disk2', version: 2 }]);
    expect(rolled.held).toMatchObject([{ name: 'disk2', version: 3 }]);
    await Promise.all([
      A.run(async (_m, s) => {
        s.src.kill('SIGKILL');
        await s.src.exited;
      }),
      B.run(async (_m, s) => {
        s.tgt.kill('SIGKILL');
        await s.tgt.exited;
      }),
    ]);
  });

  it('refuses a hand-over whose lease version changed: another VM took the lock in between', async () => {
    const handover = await A.run(async (_m, s) => {
      s.disk3 = await s.ls1.createLock('disk3');
      s.src3 = await s.start({ command: 'sleep', args: ['300'], locks: [s.disk3] });
      return s.src3.handOver();
    });
    expect(handover.leases).toMatchObject([{ name: 'disk3', version: 1 }]);
    const r = await B.run(
      async (_m, s, a) => {
        s.disk3 = await s.ls1.openLock('disk3');
        // An interloper on B acquires (version 2) and releases the lock.
        s.other = await s.start({ command: 'sleep', args: ['300'] });
        await s.disk3.acquire(s.other);
        await s.disk3.release(s.other);
        s.tgt3 = await s.start({ command: 'sleep', args: ['300'] });
        const refused = await s.tgt3.takeOver(a.h, [s.ls1]).then(
          () => 'taken',
          (e: { code: string; details: { sanlock: string } }) => `${e.code} ${e.details.sanlock}`,
        );
        return { refused, held: await s.tgt3.inquire(), info: await s.disk3.inspect() };
      },
      { h: handover },
    );
    expect(r.refused).toBe('LOCK_VERSION_MISMATCH SANLK_ACQUIRE_LVER');
    expect(r.held).toEqual([]);
    expect(r.info.version).toBe(2);
    // The source's rollback is refused the same way.
    const rollback = await A.run(
      async (_m, s, a) => s.src3.takeOver(a.h, [s.ls1]).then(() => 'taken', (e: { code: string }) => e.code),
      { h: handover },
    );
    expect(rollback).toBe('LOCK_VERSION_MISMATCH');
  });

  it('migrate() moves the volume and the disk lock together; a lock taken in between keeps the volume on the source', async () => {
    // Three data engines in this process stand for the hosts' data; the locks live in the
    // hosts' agents (their own daemons). The embedder's adapter hands the cluster each
    // side's LockedProcess calls.
    const work = mkdtempSync(join(tmpdir(), 'mooring-lockmig-'));
    const engines: LocalDataEngine[] = [];
    let cluster: Mooring | null = null;
    try {
      for (const [i, id] of ['a', 'b', 'c'].entries()) {
        engines.push(await LocalDataEngine.start({ dir: join(work, id), hostId: id, replicaListen: `tcp:127.0.0.1:${17951 + i}` }));
      }
      cluster = await Mooring.open({ store: new MemoryStateStore(), hosts: engines, repairIntervalMs: 0 });
      await cluster.createVolume({ name: 'vm4-disk', sizeBytes: 16 * MIB, replicas: 3, accessMode: 'migratable' });
      const vol = cluster.volume('vm4-disk');
      const sock = (h: string): string => join(work, `vm4-${h}.sock`);
      const uri = (h: string): string => `nbd+unix:///?socket=${sock(h)}`;
      await vol.attach({ host: 'a', attacher: 'workload', nbd: `unix:${sock('a')}` });
      await qemuIo(uri('a'), ['write -P 0x61 0 1M']);
      // The source VM on A holds the disk's lock; the target on B is registered only.
      await A.run(async (_m, s) => {
        s.disk4 = await s.ls1.createLock('disk4');
        s.src4 = await s.start({ command: 'sleep', args: ['300'], locks: [s.disk4], ownerName: 'vm4' });
      });
      await B.run(async (_m, s) => {
        s.tgt4 = await s.start({ command: 'sleep', args: ['300'], ownerName: 'vm4' });
      });
      const side = (host: SimHost, proc: string) => ({
        handOver: () => host.run(async (_m, s, a) => s[a.proc].handOver(), { proc }),
        takeOver: (h: unknown) => host.run(async (_m, s, a) => s[a.proc].takeOver(a.h, [s.ls1]), { proc, h }),
      });
      const m = await vol.migrate('b', { nbd: `unix:${sock('b')}`, attacher: 'workload', locks: { source: side(A, 'src4'), target: side(B, 'tgt4'), lockspaces: [] } });
      const ho = await m.handOver();
      expect(await A.run(async (_m, s) => s.src4.inquire())).toEqual([]);
      expect(await B.run(async (_m, s) => s.tgt4.inquire())).toMatchObject([{ name: 'disk4', version: 2 }]);
      await qemuIo(uri('b'), ['read -P 0x61 0 1M', 'write -P 0x62 1M 1M']);
      await m.confirm();
      expect((await vol.status()).attachedHost).toBe('b');

      // Back to A, but another VM takes and releases the lock between B's release and A's
      // acquire: A's acquire is refused (version), the lock and the volume stay with B.
      await A.run(async (_m, s) => {
        s.back4 = await s.start({ command: 'sleep', args: ['300'], ownerName: 'vm4' });
      });
      const interloped = {
        ...side(A, 'back4'),
        takeOver: async (h: unknown) => {
          await A.run(async (_m, s) => {
            s.other4 = await s.start({ command: 'sleep', args: ['300'] });
            await s.disk4.acquire(s.other4);
            await s.disk4.release(s.other4);
          });
          return A.run(async (_m, s, a) => s.back4.takeOver(a.h, [s.ls1]), { h });
        },
      };
      const failed: string[] = [];
      const warnings: string[] = [];
      vol.on('migration-failed', (e) => failed.push(`${e.step} ${e.error.code}`));
      cluster.on('warning', (e) => warnings.push(e.message));
      const back = await vol.migrate('a', { nbd: `unix:${sock('a')}`, attacher: 'workload', locks: { source: side(B, 'tgt4'), target: interloped, lockspaces: [] } });
      const refused = await back.handOver().then(() => 'handed over', (e: { code: string }) => e.code);
      expect(refused).toBe('LOCK_VERSION_MISMATCH');
      expect(failed).toEqual(['locks LOCK_VERSION_MISMATCH']);
      // Nobody holds the lock now: B's re-acquire is refused the same way (the interloper
      // moved the version), and the cluster says so. The volume's writer is still B.
      expect(await B.run(async (_m, s) => s.tgt4.inquire())).toEqual([]);
      expect(await A.run(async (_m, s) => s.back4.inquire())).toEqual([]);
      expect(warnings.join('\n')).toMatch(/re-acquiring the locks of vm4-disk on the source/);
      const st = await vol.status();
      expect(st.writerHost).toBe('b');
      expect(st.epoch).toBeGreaterThan(ho.epoch);
      await qemuIo(uri('b'), ['read -P 0x62 1M 1M', 'write -P 0x63 2M 1M']);
      await back.rollback();
      expect((await vol.status()).migration).toBeNull();
      await vol.detach();
    } finally {
      await cluster?.close();
      for (const e of engines) await e.close().catch(() => undefined);
      await Promise.allSettled([
        A.run(async (_m, s) => {
          for (const p of [s.src4, s.back4, s.other4]) p?.kill('SIGKILL');
        }),
        B.run(async (_m, s) => s.tgt4?.kill('SIGKILL')),
      ]);
      rmSync(work, { recursive: true, force: true });
    }
  });

  it('loads the addon where sanlock is absent; a lock call then fails with SANLOCK_UNAVAILABLE naming the package', () => {
    const lib = execFileSync('sh', ['-c', 'readlink -f $(ls /usr/lib/*/libsanlock_client.so.1 | head -1)'], { encoding: 'utf8' }).trim();
    const script = `
      const m = await import(${JSON.stringify(join(repoRoot, 'dist', 'index.js'))});
      const r = await m.Lockspace.create({ name: 'x', path: '/tmp/none.img', maxLocks: 1 }).then(() => ({}), (e) => ({ code: e.code, message: e.message }));
      console.log(JSON.stringify(r));`;
    // A private mount namespace where the library is an empty file: dlopen fails there only.
    const out = execFileSync('unshare', ['-m', 'sh', '-c', `mount --bind /dev/null ${lib} && exec "$0" --input-type=module -e "$1"`, process.execPath, script], {
      encoding: 'utf8',
    });
    const r = JSON.parse(out.trim().split('\n').pop()!) as { code: string; message: string };
    expect(r.code).toBe('SANLOCK_UNAVAILABLE');
    expect(r.message).toContain('libsanlock-client1');
  });

  it('storage failure on one host: sanlock kills the holder of a lock there and the library says so; its other lockspace and VM live on', async () => {
    const r = await storageFailure;
    expect(r.exit.signal).toBe('SIGTERM');
    expect(r.exit.stoppedBySanlock).toMatchObject({ reason: 'renewal-failed', lockspace: 'lsf', locks: ['diskf'] });
    expect(r.lost).toMatchObject({ lockspace: 'lsf', hostId: 1, reason: 'renewal-failed' });
    expect(r.killed).toMatchObject({ lockspace: 'lsf', locks: ['diskf'], ownerName: 'vm-f', reason: 'renewal-failed' });
    expect(r.otherVmAlive).toBe(true);
    expect(r.membership).toEqual({ lsf: 'leaving', lso: 'joined' });
    // The other host still sees host 1 live in the lockspace whose storage did not fail.
    expect(r.seenFromF).toBe('live');
    // T1: the daemon kills 8N after its last good renewal, which was at most 2N before the
    // freeze (sanlock counts whole seconds on its own clock: 1 s of slack below).
    const t1 = failureTimings(N).t1HoldersKilled;
    expect(r.killedAfterMs).toBeGreaterThan(t1.minSeconds * 1000 - 1000);
    expect(r.killedAfterMs).toBeLessThan(t1.maxSeconds * 1000 + TIMING_SLACK_MS);
    console.log(`storage failure: holder killed ${r.killedAfterMs} ms after the freeze (T1 window ${t1.minSeconds}-${t1.maxSeconds} s after the failure)`);
  });

  it('clean shutdown: the other host sees the released lease free at once and the host dead only 8N + 60 s later (T5)', async () => {
    const r = await cleanShutdown;
    const t5 = failureTimings(N).t5FreeTreatedDead;
    // Seen free within a poll or two of the release (the lease is written free at once).
    expect(r.freeAfterMs).toBeLessThan(2 * N * 1000 + TIMING_SLACK_MS);
    expect(r.deadAfterMs).toBeGreaterThan(t5.minSeconds * 1000);
    expect(r.deadAfterMs).toBeLessThan(t5.maxSeconds * 1000 + TIMING_SLACK_MS);
    expect(r.dead).toMatchObject({ from: 'free', to: 'dead' });
    expect(r.dead.releasedAtMs).toBe(r.freeAtMs);
    expect(r.transitions.filter((t) => t !== 'unknown')).toEqual(['live', 'free', 'dead']);
    console.log(`clean shutdown: free after ${r.freeAfterMs} ms, dead after ${r.deadAfterMs} ms (T5 ${t5.minSeconds}-${t5.maxSeconds} s)`);
  }, 240_000);

  it('host crash: the other host sees it fail, then dead (not before the documented bounds); its lock is granted only once it can be dead', async () => {
    const r = await deadHost;
    // fail is reported > 8N after the last renewal, which was at most 2N before the crash.
    expect(r.failAfterMs).toBeGreaterThanOrEqual(6 * N * 1000);
    expect(r.deadAfterMs).toBeGreaterThanOrEqual((6 * N + 60) * 1000);
    expect(r.deadAfterMs).toBeGreaterThan(r.failAfterMs);
    // And not after the windows' upper bounds (T3: 12N, T4: 11N + 60 s), give or take the slack.
    const { t3MarkedFailed: t3, t4Recoverable: t4 } = failureTimings(N);
    expect(r.failAfterMs).toBeLessThan(t3.maxSeconds * 1000 + TIMING_SLACK_MS);
    expect(r.deadAfterMs).toBeLessThan(t4.maxSeconds * 1000 + TIMING_SLACK_MS);
    // Asked for while C was failing, granted only once C could be dead: never before the
    // earliest moment C's lease can expire (6N + 60 s after the crash).
    expect(r.askedWhileFailingAfterMs).toBeLessThan(r.deadAfterMs);
    expect(r.acquiredAfterMs).toBeGreaterThanOrEqual((6 * N + 60) * 1000);
    expect(r.acquiredAfterDead.owners).toEqual([2]);
    // 'unknown' may come first: D had not yet seen a renewal of C when it started watching.
    expect(r.transitions.filter((t) => t !== 'unknown')).toEqual(['live', 'fail', 'dead']);
    console.log(
      `host crash: fail after ${r.failAfterMs} ms (T3 ${6 * N}-${12 * N} s), dead after ${r.deadAfterMs} ms (T4 ${6 * N + 60}-${11 * N + 60} s), lock taken over ${r.acquiredAfterMs} ms after the crash`,
    );
  });
});

interface CleanShutdownResult {
  freeAtMs: number;
  freeAfterMs: number;
  deadAfterMs: number;
  dead: { from: string; to: string; releasedAtMs: number };
  transitions: string[];
}

// Host G leaves lockspace lsc cleanly (its lease is released, as on a shutdown); host H's
// watcher, with the default margin, reports it free and then dead.
async function runCleanShutdown(work: string): Promise<CleanShutdownResult> {
  mkdirSync(work, { recursive: true });
  const [G, H] = await Promise.all([SimHost.start('host-g'), SimHost.start('host-h')]);
  const path = join(work, 'lsc.img');
  await G.run(
    async (m, s, a) => {
      s.ls = await m.Lockspace.create({ name: 'lsc', path: a.path, maxLocks: 1, ioTimeoutSeconds: a.N });
      await s.ls.join({ hostId: 1, hostName: 'host-g' });
    },
    { path, N },
  );
  await H.run(
    async (m, s, a) => {
      s.ls = await m.Lockspace.open({ name: 'lsc', path: a.path });
      await s.ls.join({ hostId: 2, hostName: 'host-h' });
      s.w = s.ls.watch({ pollIntervalMs: 250, hostIds: [1] });
      s.w.on('change', (e: { to: string; from: string; atMs: number; releasedAtMs?: number }) => s.emit('host', e));
      s.w.start();
    },
    { path },
  );
  await H.waitEvent((e) => e.event === 'host' && e.data.to === 'live', 30_000);
  const leftAtMs = Date.now();
  await G.run(async (_m, s) => s.ls.leave());
  const free = await H.waitEvent((e) => e.event === 'host' && e.data.to === 'free', 30_000);
  const dead = await H.waitEvent((e) => e.event === 'host' && e.data.to === 'dead', 150_000);
  await H.run(async (_m, s) => s.w.stop());
  const transitions = H.events.filter((e) => e.event === 'host').map((e) => e.data.to as string);
  await Promise.all([G.stop(), H.stop()]);
  return {
    freeAtMs: free.data.atMs,
    freeAfterMs: free.data.atMs - leftAtMs,
    deadAfterMs: dead.data.atMs - leftAtMs,
    dead: dead.data,
    transitions,
  };
}

interface DeadHostResult {
  failAfterMs: number;
  deadAfterMs: number;
  acquiredAfterMs: number;
  askedWhileFailingAfterMs: number;
  acquiredAfterDead: { owners: number[] };
  transitions: string[];
}

async function runDeadHost(work: string): Promise<DeadHostResult> {
  mkdirSync(work, { recursive: true });
  const [C, D] = await Promise.all([SimHost.start('host-c'), SimHost.start('host-d')]);
  const path = join(work, 'lsd.img');
  await C.run(
    async (m, s, a) => {
      s.ls = await m.Lockspace.create({ name: 'lsd', path: a.path, maxLocks: 2, ioTimeoutSeconds: a.N });
      await s.ls.join({ hostId: 1, hostName: 'host-c' });
      s.lock = await s.ls.createLock('diskd');
      s.vm = await s.start({ command: 'sleep', args: ['600'], locks: [s.lock], ownerName: 'vm-c' });
    },
    { path, N },
  );
  await D.run(
    async (m, s, a) => {
      s.ls = await m.Lockspace.open({ name: 'lsd', path: a.path });
      await s.ls.join({ hostId: 2, hostName: 'host-d' });
      s.lock = await s.ls.openLock('diskd');
      s.w = s.ls.watch({ pollIntervalMs: 250, hostIds: [1] });
      s.w.on('change', (e: { hostId: number; to: string; atMs: number }) => s.emit('host', { to: e.to, atMs: e.atMs }));
      s.w.start();
    },
    { path },
  );
  await D.waitEvent((e) => e.event === 'host' && e.data.to === 'live', 30_000);
  // The crash: host C's daemon and its VM die at once.
  const crashAtMs = Date.now();
  C.daemon.kill();
  await C.run(async (_m, s) => {
    s.vm.kill('SIGKILL');
    await s.vm.exited;
  });
  const fail = await D.waitEvent((e) => e.event === 'host' && e.data.to === 'fail', 60_000);
  // D starts a VM that needs C's lock while C is failing: sanlock makes the acquire wait
  // until C is dead (its last renewal + 8N + 60 s), then grants it.
  const acquired = await D.run(
    async (_m, s) => {
      const askedAtMs = Date.now();
      s.vm = await s.start({ command: 'sleep', args: ['600'], locks: [s.lock], ownerName: 'vm-c' });
      const info = await s.lock.inspect();
      return { askedAtMs, atMs: Date.now(), owners: info.owners.map((o: { hostId: number }) => o.hostId) };
    },
    undefined,
    150_000,
  );
  const dead = await D.waitEvent((e) => e.event === 'host' && e.data.to === 'dead', 30_000);
  await D.run(async (_m, s) => s.w.stop());
  const transitions = D.events.filter((e) => e.event === 'host').map((e) => e.data.to as string);
  await Promise.all([C.stop(), D.stop()]);
  return {
    failAfterMs: fail.data.atMs - crashAtMs,
    deadAfterMs: dead.data.atMs - crashAtMs,
    acquiredAfterMs: acquired.atMs - crashAtMs,
    askedWhileFailingAfterMs: acquired.askedAtMs - crashAtMs,
    acquiredAfterDead: { owners: acquired.owners },
    transitions,
  };
}

interface StorageFailureResult {
  exit: { signal: string | null; stoppedBySanlock?: unknown };
  lost: unknown;
  killed: unknown;
  otherVmAlive: boolean;
  membership: { lsf: string; lso: string };
  seenFromF: string;
  killedAfterMs: number;
}

// Host E's lockspace lsf lives on an ext4 filesystem that is then frozen (fsfreeze): its
// renewals block and fail, as when a host loses its path to one storage. Lockspace lso on
// other storage is unaffected; host F shares only lso.
async function runStorageFailure(work: string): Promise<StorageFailureResult> {
  mkdirSync(work, { recursive: true });
  const img = join(work, 'fs.img');
  const mnt = join(work, 'mnt');
  mkdirSync(mnt);
  writeFileSync(img, '');
  execFileSync('truncate', ['-s', '64M', img]);
  execFileSync('mkfs.ext4', ['-q', img]);
  execFileSync('mount', ['-o', 'loop', img, mnt]);
  let frozen = false;
  try {
    const [E, F] = await Promise.all([SimHost.start('host-e'), SimHost.start('host-f')]);
    const lsf = join(mnt, 'lsf.img');
    const lso = join(work, 'lso.img');
    await E.run(
      async (m, s, a) => {
        s.lsf = await m.Lockspace.create({ name: 'lsf', path: a.lsf, maxLocks: 2, ioTimeoutSeconds: a.N });
        s.lso = await m.Lockspace.create({ name: 'lso', path: a.lso, maxLocks: 2, ioTimeoutSeconds: a.N });
        await Promise.all([s.lsf.join({ hostId: 1, hostName: 'host-e' }), s.lso.join({ hostId: 1, hostName: 'host-e' })]);
        s.vmF = await s.start({ command: 'sleep', args: ['600'], locks: [await s.lsf.createLock('diskf')], ownerName: 'vm-f' });
        s.vmO = await s.start({ command: 'sleep', args: ['600'], locks: [await s.lso.createLock('disko')], ownerName: 'vm-o' });
        s.lsf.on('lost', (e: unknown) => s.emit('lost', e));
        s.lsf.on('holder-killed', (e: unknown) => s.emit('holder-killed', e));
      },
      { lsf, lso, N },
    );
    await F.run(
      async (m, s, a) => {
        s.lso = await m.Lockspace.open({ name: 'lso', path: a.lso });
        await s.lso.join({ hostId: 2, hostName: 'host-f' });
      },
      { lso },
    );
    const freezeAtMs = Date.now();
    execFileSync('fsfreeze', ['-f', mnt]);
    frozen = true;
    const exit = await E.run(async (_m, s) => s.vmF.exited, undefined, 120_000);
    const killedAtMs = Date.now();
    const lost = await E.waitEvent((e) => e.event === 'lost', 10_000);
    const killed = await E.waitEvent((e) => e.event === 'holder-killed', 10_000);
    const state = await E.run(async (_m, s) => ({
      otherVmAlive: s.vmO.exit === undefined && (await s.vmO.inquire()).length === 1,
      membership: { lsf: await s.lsf.membership(), lso: await s.lso.membership() },
    }));
    const seenFromF = await F.run(async (_m, s) => {
      const hosts = await s.lso.hosts();
      return hosts.find((h: { hostId: number }) => h.hostId === 1)?.state ?? 'missing';
    });
    execFileSync('fsfreeze', ['-u', mnt]);
    frozen = false;
    await Promise.all([E.stop(), F.stop()]);
    return { exit, lost: lost.data, killed: killed.data, ...state, seenFromF, killedAfterMs: killedAtMs - freezeAtMs };
  } finally {
    if (frozen) execFileSync('fsfreeze', ['-u', mnt]);
    // Lazy: a daemon may still hold the lockspace file open while it gives the lockspace up.
    execFileSync('umount', ['-l', mnt]);
  }
}
