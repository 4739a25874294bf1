// Lockspace.delete's rules (and Lockspace.open's reading of the resource index) over a fake
// sanlock whose storage reads return areas built in sanlock's layout (fakes/lease-areas.ts).
// The real daemons and the real on-disk bytes are in test/system/locks/lockspace-lifecycle.test.ts.
import { mkdtempSync, readFileSync, rmSync, existsSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { Lockspace } from '../../../src/locks/lockspace.js';
import type { NativeAddon, NativeSanlock, NativeSanlockHost } from '../../../src/native/binding.js';
import { fakeSanlock } from '../fakes/fake-sanlock.js';
import { hostArea, rindexArea } from '../fakes/lease-areas.js';

const MIB = 1024 * 1024;

describe('Lockspace.delete', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'mooring-lsdel-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  // A fake whose host-lease reads return `reads[i]` on the i-th read (the last one after).
  function fake(opts: {
    offset?: number;
    reads: Buffer[];
    rindex: Buffer;
    joinedAs?: number;
    owners?: Record<string, number[]>;
    hosts?: NativeSanlockHost[];
  }): { addon: NativeAddon; hostReads: () => number } {
    const offset = opts.offset ?? 0;
    let n = 0;
    const sanlock: Partial<NativeSanlock> = {
      load: () => ({ loaded: true, library: 'libsanlock_client.so.1' }),
      readLockspace: async (ls) => ({ rv: 0, lockspace: { name: 'ls1', hostId: 1, path: ls.path, offset: ls.offset, flags: 0 }, ioTimeoutSeconds: 1 }),
      getLockspaces: async () => ({
        rv: 0,
        lockspaces: opts.joinedAs ? [{ name: 'ls1', hostId: opts.joinedAs, path: '', offset, flags: 0 }] : [],
      }),
      getHosts: async () => ({ rv: 0, hosts: opts.hosts ?? [] }),
      readLeaseArea: async (_path, at) => {
        if (at === offset + MIB) return opts.rindex;
        const b = opts.reads[Math.min(n, opts.reads.length - 1)];
        n++;
        return b;
      },
      readResource: async (res) => ({
        rv: 0,
        resource: { lockspace: 'ls1', name: res.name, lver: 1, flags: 0, disks: res.disks },
        owners: (opts.owners?.[res.name] ?? []).map((hostId) => ({ hostId, generation: 1, timestamp: 100, ioTimeout: 1, flags: 0 })),
      }),
    };
    return { addon: { sanlock: fakeSanlock(sanlock) } as unknown as NativeAddon, hostReads: () => n };
  }

  it('removes a file that holds only the lockspace when no host holds a lease', async () => {
    const path = join(dir, 'ls.img');
    writeFileSync(path, Buffer.alloc(4 * MIB));
    const f = fake({ reads: [hostArea([])], rindex: rindexArea(0, 1, []) });
    const ls = await Lockspace.open({ name: 'ls1', path, addon: f.addon });
    expect(ls.maxLocks).toBe(1);
    await ls.delete();
    expect(existsSync(path)).toBe(false);
  });

  it('zeroes the host leases, the index and the listed locks of a lockspace inside a larger file, and nothing else', async () => {
    const path = join(dir, 'lun.img');
    const offset = 2 * MIB;
    writeFileSync(path, Buffer.alloc(offset + 7 * MIB, 0xaa));
    // Host 4 held a lease and released it (timestamp 0): free.
    const f = fake({
      offset,
      reads: [hostArea([{ hostId: 4, generation: 2, timestamp: 0, hostName: 'h4' }])],
      rindex: rindexArea(offset, 4, [{ slot: 1, name: 'disk2' }]),
    });
    const ls = await Lockspace.open({ name: 'ls1', path, offset, addon: f.addon });
    await ls.delete();
    const after = readFileSync(path);
    const allAre = (from: number, len: number, v: number) => after.subarray(from, from + len).every((x) => x === v);
    expect(allAre(0, offset, 0xaa)).toBe(true); // before the lockspace
    expect(allAre(offset, 3 * MIB, 0)).toBe(true); // host leases + index
    expect(allAre(offset + 3 * MIB, MIB, 0xaa)).toBe(true); // slot 0: not listed
    expect(allAre(offset + 4 * MIB, MIB, 0)).toBe(true); // slot 1: disk2
    expect(allAre(offset + 5 * MIB, 2 * MIB, 0xaa)).toBe(true);
  });

  it('refuses at once while this host is a member, naming it and the live hosts and their locks', async () => {
    const path = join(dir, 'ls.img');
    writeFileSync(path, Buffer.alloc(5 * MIB));
    const f = fake({
      joinedAs: 1,
      reads: [
        hostArea([
          { hostId: 1, generation: 1, timestamp: 50, hostName: 'host-a' },
          { hostId: 2, generation: 4, timestamp: 60, hostName: 'host-b' },
          { hostId: 3, generation: 1, timestamp: 70, hostName: 'host-c' },
        ]),
      ],
      rindex: rindexArea(0, 2, [{ slot: 0, name: 'disk1' }, { slot: 1, name: 'disk2' }]),
      owners: { disk1: [2], disk2: [3] },
      // host 3 is dead as this host's daemon sees it: not listed, nor its lock.
      hosts: [
        { hostId: 1, generation: 1, timestamp: 50, ioTimeout: 1, flags: 3 },
        { hostId: 2, generation: 4, timestamp: 60, ioTimeout: 1, flags: 3 },
        { hostId: 3, generation: 1, timestamp: 70, ioTimeout: 1, flags: 5 },
      ],
    });
    const ls = await Lockspace.open({ name: 'ls1', path, addon: f.addon });
    const err = await ls.delete().catch((e: unknown) => e);
    expect(err).toMatchObject({
      code: 'BUSY',
      details: {
        lockspace: 'ls1',
        hosts: [
          { hostId: 1, hostName: 'host-a', generation: 1, state: 'joined-here' },
          { hostId: 2, hostName: 'host-b', generation: 4, state: 'live' },
        ],
        locks: [{ name: 'disk1', hostIds: [2] }],
      },
    });
    expect((err as Error).message).toMatch(/host 1 \(host-a\) joined-here.*leave\(\)|leave\(\).*host 1 \(host-a\) joined-here/);
    expect((err as Error).message).toContain('disk1 by host 2');
    expect(f.hostReads()).toBe(1);
    expect(existsSync(path)).toBe(true);
  });

  it('refuses once a held lease renews, listing the renewing host as live and a silent one as not yet dead', async () => {
    const path = join(dir, 'ls.img');
    writeFileSync(path, Buffer.alloc(5 * MIB));
    const before = [
      { hostId: 2, generation: 1, timestamp: 60, hostName: 'host-b' },
      { hostId: 5, generation: 1, timestamp: 10, hostName: 'host-e' },
    ];
    const f = fake({
      reads: [hostArea(before), hostArea([{ ...before[0], timestamp: 62 }, before[1]])],
      rindex: rindexArea(0, 2, [{ slot: 0, name: 'disk1' }]),
      owners: { disk1: [2] },
    });
    const ls = await Lockspace.open({ name: 'ls1', path, addon: f.addon });
    const err = await ls.delete().catch((e: unknown) => e);
    expect(err).toMatchObject({
      code: 'BUSY',
      details: {
        hosts: [
          { hostId: 2, hostName: 'host-b', state: 'live' },
          { hostId: 5, hostName: 'host-e', state: 'not-yet-dead' },
        ],
        locks: [{ name: 'disk1', hostIds: [2] }],
      },
    });
    expect(existsSync(path)).toBe(true);
  });

  it('goes ahead when a held lease is released while it waits', async () => {
    const path = join(dir, 'ls.img');
    writeFileSync(path, Buffer.alloc(5 * MIB));
    const f = fake({
      reads: [hostArea([{ hostId: 2, generation: 1, timestamp: 60, hostName: 'host-b' }]), hostArea([])],
      rindex: rindexArea(0, 2, []),
    });
    const ls = await Lockspace.open({ name: 'ls1', path, addon: f.addon });
    await ls.delete();
    expect(existsSync(path)).toBe(false);
  });

  it('refuses when a host joined between the wait and the wipe', async () => {
    const path = join(dir, 'ls.img');
    writeFileSync(path, Buffer.alloc(5 * MIB));
    const f = fake({
      reads: [hostArea([]), hostArea([{ hostId: 7, generation: 1, timestamp: 3, hostName: 'late' }])],
      rindex: rindexArea(0, 2, []),
    });
    const ls = await Lockspace.open({ name: 'ls1', path, addon: f.addon });
    await expect(ls.delete()).rejects.toMatchObject({ code: 'BUSY', details: { hosts: [{ hostId: 7, hostName: 'late', state: 'live' }] } });
    expect(existsSync(path)).toBe(true);
  });

  it('refuses to open a lockspace without a resource index (CORRUPT_METADATA)', async () => {
    const path = join(dir, 'ls.img');
    writeFileSync(path, Buffer.alloc(5 * MIB));
    const f = fake({ reads: [hostArea([])], rindex: Buffer.alloc(MIB) });
    await expect(Lockspace.open({ name: 'ls1', path, addon: f.addon })).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
  });
});
