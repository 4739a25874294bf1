import { describe, expect, it } from 'vitest';

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
