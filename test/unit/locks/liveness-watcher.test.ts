import { describe, expect, it, vi } from 'vitest';

import { MooringError } from '../../../src/errors.js';
import type { HostState, HostStatus } from '../../../src/locks/host-state.js';
import { LivenessWatcher, type HostEvent } from '../../../src/locks/liveness-watcher.js';
import { Lockspace } from '../../../src/locks/lockspace.js';
import { LockedProcess } from '../../../src/locks/locked-process.js';
import { FakeAddon } from '../fakes/fake-addon.js';

// A lockspace whose get_hosts answers come from a script.
function scripted(answers: Array<Array<[number, HostState]> | Error>) {
  let i = 0;
  let lostChecks = 0;
  return {
    name: 'ls',
    ioTimeoutSeconds: 1,
    get lostChecks() {
      return lostChecks;
    },
    async hosts(): Promise<HostStatus[]> {
      const a = answers[Math.min(i++, answers.length - 1)]!;
      if (a instanceof Error) throw a;
      return a.map(([hostId, state]) => ({ hostId, state, generation: 1, timestamp: 5, ioTimeoutSeconds: 1 }));
    },
    async checkLost() {
      lostChecks++;
      return 'renewal-failed';
    },
  };
}

describe('LivenessWatcher', () => {
  it('emits typed per-state events for a crash seen from another host', async () => {
    const ls = scripted([
      [[1, 'live'], [2, 'live']],
      [[1, 'live'], [2, 'live']],
      [[1, 'fail'], [2, 'live']],
      [[1, 'dead'], [2, 'live']],
    ]);
    const w = new LivenessWatcher({ lockspace: ls, hostIds: [1] });
    const seen: string[] = [];
    const dead: HostEvent[] = [];
    w.on('change', (e) => seen.push(`${e.from ?? '-'}>${e.to}`));
    w.on('dead', (e) => dead.push(e));
    for (let i = 0; i < 4; i++) await w.poll();
    expect(seen).toEqual(['->live', 'live>fail', 'fail>dead']);
    expect(dead).toHaveLength(1);
    expect(dead[0]).toMatchObject({ lockspace: 'ls', hostId: 1, from: 'fail', to: 'dead' });
    expect(w.state(1)).toBe('dead');
    expect(w.state(2)).toBeUndefined(); // filtered out
  });

  it('polls every 2 × io_timeout by default and refuses silly intervals', () => {
    expect(new LivenessWatcher({ lockspace: { ...scripted([[]]), ioTimeoutSeconds: 10 } }).pollIntervalMs).toBe(20_000);
    expect(() => new LivenessWatcher({ lockspace: scripted([[]]), pollIntervalMs: 5 })).toThrow(MooringError);
  });

  it('asks the lockspace whether it was lost when the daemon says it is not joined', async () => {
    const ls = scripted([new MooringError('LOCKSPACE_NOT_JOINED', 'gone')]);
    const w = new LivenessWatcher({ lockspace: ls });
    await expect(w.poll()).rejects.toMatchObject({ code: 'LOCKSPACE_NOT_JOINED' });
    expect(ls.lostChecks).toBe(1);
  });

  it('reports a released host dead 8N + 60 s after it was seen free (T5), unless it joins again', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      // Host 1 leaves cleanly and stays away (sanlock then forgets it); host 2 leaves and
      // comes back before the margin; host 3 was free when the watcher started.
      const ls = scripted([
        [[1, 'live'], [2, 'live'], [3, 'free']],
        [[1, 'free'], [2, 'free'], [3, 'free']],
        [[2, 'free'], [3, 'free']],
        [[2, 'live'], [3, 'free']],
        [[2, 'live'], [3, 'free']],
      ]);
      const w = new LivenessWatcher({ lockspace: ls }); // N = 1: 68 s
      const seen: string[] = [];
      const dead: HostEvent[] = [];
      w.on('change', (e) => seen.push(`${e.hostId}:${e.from ?? '-'}>${e.to}`));
      w.on('dead', (e) => dead.push(e));
      vi.setSystemTime(1_000_000);
      await w.poll();
      vi.setSystemTime(1_002_000);
      await w.poll(); // 1 and 2 released now
      expect(seen.slice(-2)).toEqual(['1:live>free', '2:live>free']);
      vi.setSystemTime(1_002_000 + 67_999);
      await w.poll();
      expect(dead).toEqual([]);
      expect(w.state(1)).toBe('free');
      vi.setSystemTime(1_002_000 + 68_000);
      await w.poll(); // 2 joined again meanwhile: only 1 is dead
      expect(dead).toHaveLength(1);
      expect(dead[0]).toMatchObject({ hostId: 1, from: 'free', to: 'dead', releasedAtMs: 1_002_000, atMs: 1_070_000, host: { hostId: 1, state: 'free' } });
      expect(w.state(1)).toBe('dead');
      expect(w.state(2)).toBe('live');
      vi.setSystemTime(1_500_000);
      await w.poll();
      expect(dead).toHaveLength(1); // once; never for host 3
      expect(seen).toEqual(['1:->live', '2:->live', '3:->free', '1:live>free', '2:live>free', '2:free>live', '1:free>dead']);
    } finally {
      vi.useRealTimers();
    }
  });

  it('keeps a released host free with freeIsDeadAfterSeconds null, and checks the option', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      const ls = scripted([[[1, 'live']], [[1, 'free']], [[1, 'free']]]);
      const w = new LivenessWatcher({ lockspace: ls, freeIsDeadAfterSeconds: null });
      const dead: HostEvent[] = [];
      w.on('dead', (e) => dead.push(e));
      await w.poll();
      await w.poll();
      vi.setSystemTime(Date.now() + 86_400_000);
      await w.poll();
      expect(dead).toEqual([]);
      expect(w.state(1)).toBe('free');
    } finally {
      vi.useRealTimers();
    }
    for (const bad of [-1, Number.NaN, 86_401, '5'])
      expect(() => new LivenessWatcher({ lockspace: scripted([[]]), freeIsDeadAfterSeconds: bad as number })).toThrow(/freeIsDeadAfterSeconds/);
    expect(new LivenessWatcher({ lockspace: scripted([[]]), freeIsDeadAfterSeconds: 0 })).toBeInstanceOf(LivenessWatcher);
  });

  it('keeps polling after errors when started, and stops', async () => {
    const ls = scripted([new MooringError('SANLOCK_DAEMON_UNAVAILABLE', 'down'), [[1, 'live']]]);
    const w = new LivenessWatcher({ lockspace: ls, pollIntervalMs: 100 });
    const errors: string[] = [];
    w.on('error', (e) => errors.push(e.code));
    const live = new Promise<HostEvent>((r) => w.once('live', r));
    w.start();
    expect((await live).hostId).toBe(1);
    await w.stop();
    expect(errors).toEqual(['SANLOCK_DAEMON_UNAVAILABLE']);
  });
});

describe('without sanlock installed', () => {
  it('Lockspace and LockedProcess fail with SANLOCK_UNAVAILABLE naming the package', async () => {
    const addon = new FakeAddon();
    const err = await Lockspace.create({ name: 'ls', path: '/tmp/x.img', maxLocks: 1, addon }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(MooringError);
    expect((err as MooringError).code).toBe('SANLOCK_UNAVAILABLE');
    expect((err as MooringError).message).toContain('libsanlock-client1');
    await expect(LockedProcess.start({ command: 'true', addon })).rejects.toMatchObject({ code: 'SANLOCK_UNAVAILABLE' });
  });

  it('validates names, host ids and sizes before touching storage', async () => {
    const addon = new FakeAddon();
    await expect(Lockspace.create({ name: 'bad:name', path: '/tmp/x', maxLocks: 1, addon })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Lockspace.create({ name: 'ok', path: 'relative', maxLocks: 1, addon })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Lockspace.create({ name: 'ok', path: '/tmp/x', maxLocks: 0, addon })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Lockspace.create({ name: 'ok', path: '/tmp/x', maxLocks: 1, ioTimeoutSeconds: 0, addon })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
    });
    await expect(Lockspace.create({ name: 'x'.repeat(49), path: '/tmp/x', maxLocks: 1, addon })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});
