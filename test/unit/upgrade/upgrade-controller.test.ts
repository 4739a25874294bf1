// The upgrade controller over the real controllers of src/cluster/, fake data engines and an
// in-memory store (test/unit/cluster/control-fixture.ts): every state of a session and of
// each host, the preconditions refusing before anything is recorded, pause, resume, cancel
// at each point, a launcher that fails or starts the wrong version, and a control plane
// that stops at every recorded step and is replaced by another one that finishes the job.
// The same thing with real `mooring data-engine` processes: test/system/upgrade/.
import { afterEach, describe, expect, it } from 'vitest';

import { KIND } from '../../../src/cluster/cluster-records.js';
import { ControlState } from '../../../src/cluster/control-state.js';
import { EngineLifecycle } from '../../../src/cluster/engine-lifecycle.js';
import { MigrationController } from '../../../src/cluster/migration-controller.js';
import { AttachmentController } from '../../../src/cluster/attachment-controller.js';
import { RepairController } from '../../../src/cluster/repair-controller.js';
import { VolumeOperations } from '../../../src/cluster/volume-operations.js';
import type { DataEngine } from '../../../src/data-engine/data-engine.js';
import { MooringError } from '../../../src/errors.js';
import { UpgradeController } from '../../../src/upgrade/upgrade-controller.js';
import type { DataEngineLauncher, NewDataEngine, UpgradeSession } from '../../../src/upgrade/upgrade-session.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';
import { SIZE, controlFixture } from '../cluster/control-fixture.js';

const NEW: NewDataEngine = { version: '0.2.0', command: ['/opt/mooring-0.2.0/bin/mooring'] };

const noImages = {
  acquire: () => Promise.reject(new MooringError('UNSUPPORTED', 'no backing images here')),
};

/** A launcher over fake hosts: a replace is a restart of the fake with the new version. */
class FakeLauncher implements DataEngineLauncher {
  readonly calls: string[] = [];
  fail: MooringError | null = null;
  version: string | null = null;
  before: ((hostId: string) => Promise<void>) | null = null;

  constructor(private readonly fakes: FakeDataEngine[]) {}

  async replace(hostId: string, dataEngine: NewDataEngine): Promise<DataEngine | void> {
    this.calls.push(hostId);
    await this.before?.(hostId);
    if (this.fail) throw this.fail;
    this.fakes.find((f) => f.hostId === hostId)!.restart(this.version ?? dataEngine.version);
  }
}

type Fixture = Awaited<ReturnType<typeof controlFixture>>;

// A control plane over the fixture's store and hosts: its own ControlState and controllers,
// as a restarted VM manager would build them.
function controlPlane(f: Fixture, launcher: DataEngineLauncher | null, beforeSnapshot?: (volume: string) => Promise<void>) {
  const state = new ControlState(f.store, f.state.hosts, f.state.settings, f.state.events);
  const engines = new EngineLifecycle(state);
  const migrations = new MigrationController(state, engines);
  const attachment = new AttachmentController(state, engines, migrations);
  const repair = new RepairController(state, noImages);
  const operations = new VolumeOperations(state, attachment, repair, engines);
  const upgrade = new UpgradeController({
    state,
    launcher,
    leaseMs: 300,
    inProcess: () => false,
    snapshot: async (v, s, l) => {
      await beforeSnapshot?.(v);
      await operations.createSnapshot(v, s, l);
    },
    converge: (v) => state.serial(v, () => attachment.converge(v)),
    repair: (v) =>
      state.serial(v, async () => {
        const eng = await state.engineRecord(v);
        if (eng) await repair.repair(eng);
      }),
    addHost: async () => undefined,
  });
  return { state, attachment, upgrade };
}

function record(session: UpgradeSession): string[] {
  const log: string[] = [];
  session.on('state-changed', (e) => log.push(`session ${e.state}`));
  session.on('host-state-changed', (e) => log.push(`${e.host} ${e.state}`));
  session.on('volume-snapshotted', (e) => log.push(`${e.host} snapshot ${e.volume}`));
  session.on('failed', (e) => log.push(`failed ${e.host} ${e.error.code}`));
  return log;
}

const planes: { state: ControlState }[] = [];
afterEach(() => {
  for (const p of planes.splice(0)) p.state.markClosed();
});

let seq = 0;
async function setup(beforeSnapshot?: (volume: string) => Promise<void>) {
  const f = await controlFixture();
  const l = new FakeLauncher(f.fakes);
  const cp = controlPlane(f, l, beforeSnapshot);
  planes.push(cp);
  // A volume with one replica on each of `hosts`.
  const volume = async (hosts: string[]): Promise<string> => {
    const name = `up${++seq}`;
    await f.volumes.create({ name, sizeBytes: SIZE, replicas: hosts.length, hosts });
    return name;
  };
  return { f, l, cp, volume };
}

describe('a session over three hosts (method restart)', () => {
  it('walks every host through the seed\'s states in order, snapshots each volume once, restarts the host\'s engines at a new epoch', async () => {
    const { f, l, cp, volume } = await setup();
    const attached = await volume(['a', 'b', 'c']);
    const detached = await volume(['b', 'c']);
    await cp.attachment.attach(attached, { host: 'a', nbd: 'unix:/tmp/x.sock' });
    const epochBefore = (await f.fakes[0]!.engineInfo(attached)).epoch;
    // While a host's process is replaced, it is unschedulable: no third host can be picked.
    const seen: string[] = [];
    l.before = async (h) => {
      await expect(cp.state.pickHosts(3, new Set())).rejects.toMatchObject({ code: 'UNAVAILABLE' });
      seen.push(...(await cp.state.unschedulableHosts()));
      expect(seen).toContain(h);
    };
    const session = await cp.upgrade.start({ dataEngine: NEW, method: 'restart', stepTimeoutMs: 5000 });
    const log = record(session);
    const done = await session.done();

    expect(done.state).toBe('completed');
    expect(l.calls).toEqual(['a', 'b', 'c']);
    const steps = ['initializing', 'switching-over', 'upgrading-instance-manager', 'switching-back', 'rebuilding-replica', 'completed'];
    for (const h of ['a', 'b', 'c']) {
      expect(log.filter((x) => x.startsWith(`${h} `) && !x.includes('snapshot'))).toEqual(steps.map((s) => `${h} ${s}`));
      expect(done.hosts[h]).toMatchObject({ state: 'completed', method: 'restart', versionBefore: 'fake', versionAfter: '0.2.0', instanceBefore: 'fake-1' });
    }
    expect(log.indexOf('a completed')).toBeLessThan(log.indexOf('b initializing'));
    expect(log.at(-1)).toBe('session completed');
    // One snapshot per volume, taken before its first host was touched.
    const snap = `upgrade-${session.id.slice(0, 8)}`;
    const taken = f.fakes.flatMap((x) => x.calls).filter((c) => c.startsWith('createSnapshot'));
    expect(taken.sort()).toEqual([`createSnapshot ${attached} ${snap}`, `createSnapshot ${detached} ${snap}`]);
    expect(log.filter((x) => x.includes('snapshot'))).toEqual([`a snapshot ${attached}`, `b snapshot ${detached}`]);
    expect(done.hosts['a']!.volumes).toEqual({ [attached]: { role: 'engine', snapshot: snap, state: 'healthy' } });
    // The engine runs on a again, in the new process, at a newer epoch.
    expect(f.fakes[0]!.instanceId).toBe('fake-2');
    expect((await f.fakes[0]!.engineInfo(attached)).epoch).toBeGreaterThan(epochBefore);
    expect(await cp.state.unschedulableHosts()).toEqual(new Set());
  });

  it('refuses up front with every reason and records nothing; `auto` does not restart under an NBD client', async () => {
    const { f, l, cp, volume } = await setup();
    const v = await volume(['a', 'b']);
    await cp.attachment.attach(v, { host: 'a', nbd: 'unix:/tmp/y.sock' });
    f.fakes[2]!.reachable = false;
    const err = (await cp.upgrade.start({ dataEngine: NEW }).catch((e: unknown) => e)) as MooringError;
    expect(err).toMatchObject({ code: 'PRECONDITION_FAILED' });
    // b holds one of v's two replicas: without it, no majority is left for v's engine on a.
    expect((err.details!['reasons'] as { code: string; host: string }[]).map((r) => `${r.code} ${r.host}`)).toEqual(['CLIENTS_WOULD_RECONNECT a', 'QUORUM_NEEDS_HOST b', 'HOST_UNREACHABLE c']);
    expect(await f.store.list('upgrade-session')).toEqual([]);
    expect(await cp.upgrade.current()).toBeNull();
    expect(await f.fakes[0]!.listSnapshots(v)).toEqual([]);
    expect(l.calls).toEqual([]);
  });

  it('without a launcher, refuses hosts whose data engine does not start its successor (NO_LAUNCHER)', async () => {
    const f = await controlFixture();
    const cp = controlPlane(f, null);
    planes.push(cp);
    const err = (await cp.upgrade.start({ dataEngine: NEW, hosts: ['a', 'b'] }).catch((e: unknown) => e)) as MooringError;
    expect(err.code).toBe('PRECONDITION_FAILED');
    expect((err.details!['reasons'] as { code: string; host: string }[]).map((r) => `${r.code} ${r.host}`)).toEqual(['NO_LAUNCHER a', 'NO_LAUNCHER b']);
  });

  it('method in-place is taken, and refused up front (IN_PLACE_UNAVAILABLE) where a data engine does not announce in-place-handoff', async () => {
    // The fakes announce no features, as data engines before the in-place hand-off did.
    const { l, cp } = await setup();
    const err = (await cp.upgrade.start({ dataEngine: NEW, method: 'in-place', hosts: ['a', 'b'] }).catch((e: unknown) => e)) as MooringError;
    expect(err.code, String(err)).toBe('PRECONDITION_FAILED');
    expect((err.details!['reasons'] as { code: string; host: string }[]).map((r) => `${r.code} ${r.host}`)).toEqual(['IN_PLACE_UNAVAILABLE a', 'IN_PLACE_UNAVAILABLE b']);
    expect(l.calls).toEqual([]);
    expect(await cp.upgrade.current()).toBeNull();
  });

  it('rejects bad options with INVALID_ARGUMENT and a second session with BUSY', async () => {
    const { l, cp, volume } = await setup();
    for (const bad of [{}, { dataEngine: { version: '1' } }, { dataEngine: { version: '1', command: [], path: '/x' } }, { dataEngine: NEW, hosts: ['a', 'a'] }, { dataEngine: NEW, method: 'teleport' }, { dataEngine: NEW, hosts: ['../x'] }]) {
      await expect(cp.upgrade.start(bad as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    }
    let release!: () => void;
    l.before = () => new Promise((r) => (release = r));
    await volume(['a']);
    const first = await cp.upgrade.start({ dataEngine: NEW, hosts: ['a'] });
    await expect(cp.upgrade.start({ dataEngine: NEW, hosts: ['b'] })).rejects.toMatchObject({ code: 'BUSY', details: { session: first.id } });
    await waitFor(() => l.calls.length === 1);
    l.before = null;
    release();
    expect((await first.done()).state).toBe('completed');
    // Once it ended, the next may start.
    expect((await (await cp.upgrade.start({ dataEngine: NEW, hosts: ['b'] })).done()).hosts).toHaveProperty('b');
  });
});

describe('pause, resume, cancel', () => {
  it('pause stops after the step in progress; resume goes on', async () => {
    const { l, cp, volume } = await setup();
    await volume(['a', 'b']);
    const session = await cp.upgrade.start({ dataEngine: NEW, method: 'restart', hosts: ['a', 'b'] });
    const log = record(session);
    session.once('host-state-changed', () => void session.pause());
    await waitFor(async () => (await session.status()).paused && !log.includes('a upgrading-instance-manager'));
    // Nothing moves while paused.
    await new Promise((r) => setTimeout(r, 300));
    cp.upgrade.kick();
    expect(l.calls).toEqual([]);
    expect((await session.status()).state).toBe('upgrading');
    await session.resume();
    expect((await session.done()).state).toBe('completed');
    expect(l.calls).toEqual(['a', 'b']);
  });

  it('cancel before a host\'s process was replaced puts it back; the others are never touched', async () => {
    let session!: UpgradeSession;
    let onB!: string;
    const { f, l, cp, volume } = await setup(async (v) => {
      if (v === onB) await session.cancel();
    });
    await volume(['a']);
    onB = await volume(['b']);
    await volume(['c']);
    session = await cp.upgrade.start({ dataEngine: NEW, method: 'restart' });
    const done = await session.done();
    expect(done.state).toBe('cancelled');
    expect(l.calls).toEqual(['a']);
    expect(Object.fromEntries(Object.entries(done.hosts).map(([h, s]) => [h, s.state]))).toEqual({ a: 'completed', b: 'cancelled', c: 'cancelled' });
    // b's volume was snapshotted before the cancel was seen; its snapshot stays.
    expect(done.hosts['b']!.volumes[onB]).toMatchObject({ state: 'snapshotted' });
    expect(f.fakes[1]!.instanceId).toBe('fake-1');
    expect(await cp.state.unschedulableHosts()).toEqual(new Set());
    await expect(session.resume()).rejects.toMatchObject({ code: 'INVALID_STATE' });
  });

  it('cancel once a host\'s process was replaced lets that host finish', async () => {
    const { l, cp, volume } = await setup();
    await volume(['a', 'b']);
    l.before = async (h) => {
      if (h === 'a') await session.cancel();
    };
    const session = await cp.upgrade.start({ dataEngine: NEW, method: 'restart', hosts: ['a', 'b'] });
    const done = await session.done();
    expect(done.state).toBe('cancelled');
    expect(done.hosts['a']!.state).toBe('completed');
    expect(done.hosts['b']!.state).toBe('cancelled');
  });
});

describe('failures', () => {
  it('a launcher that fails ends the session in error with its code; the host is left schedulable', async () => {
    const { l, cp, volume } = await setup();
    await volume(['a']);
    l.fail = new MooringError('UNAVAILABLE', 'systemd says no');
    const session = await cp.upgrade.start({ dataEngine: NEW, hosts: ['a', 'b'] });
    const log = record(session);
    await expect(session.done()).rejects.toMatchObject({ code: 'UNAVAILABLE', message: expect.stringContaining('systemd says no') });
    const st = await session.status();
    expect(st).toMatchObject({ state: 'error', error: { code: 'UNAVAILABLE' }, upgradingHost: null });
    expect(st.hosts['a']).toMatchObject({ state: 'error', error: { code: 'UNAVAILABLE' } });
    expect(st.hosts['b']!.state).toBe('pending');
    expect(log).toContain('failed a UNAVAILABLE');
    expect(await cp.state.unschedulableHosts()).toEqual(new Set());
  });

  it('a new process that reports another version is an error, not a success', async () => {
    const { l, cp, volume } = await setup();
    await volume(['a']);
    l.version = '0.1.9';
    const session = await cp.upgrade.start({ dataEngine: NEW, hosts: ['a'] });
    await expect(session.done()).rejects.toMatchObject({ code: 'INVALID_STATE', message: expect.stringContaining('0.1.9') });
  });

  it('a host whose new process never answers times out with UNAVAILABLE', async () => {
    const { f, l, cp, volume } = await setup();
    await volume(['a']);
    l.before = async () => {
      f.fakes[0]!.reachable = false;
    };
    const session = await cp.upgrade.start({ dataEngine: NEW, hosts: ['a'], stepTimeoutMs: 300 });
    await expect(session.done()).rejects.toMatchObject({ code: 'UNAVAILABLE' });
  });
});

describe('a control plane that stops at any recorded step', () => {
  // The first control plane stops (as a VM manager killed there would) when the k-th step is
  // recorded; a second one over the same store and hosts takes the session over once the
  // first's lease has run out, and finishes it. The process of each host is replaced once.
  for (let k = 0; k < 12; k++) {
    it(`resumes after a stop at step ${k}`, async () => {
      const { f, l, cp, volume } = await setup();
      const v = await volume(['a', 'b', 'c']);
      await cp.attachment.attach(v, { host: 'a', nbd: 'unix:/tmp/z.sock' });
      const session = await cp.upgrade.start({ dataEngine: NEW, method: 'restart', hosts: ['a', 'b'] });
      let n = 0;
      const stopped = new Promise<void>((resolve) => {
        const onStep = () => {
          if (n++ === k) {
            cp.state.markClosed();
            session.off('host-state-changed', onStep);
            resolve();
          }
        };
        session.on('host-state-changed', onStep);
        session.on('state-changed', (e) => e.state === 'completed' && resolve());
      });
      await stopped;
      await cp.upgrade.close();
      const second = controlPlane(f, l);
      planes.push(second);
      const resumed = (await second.upgrade.current())!;
      expect(resumed.id).toBe(session.id);
      await waitFor(async () => {
        second.upgrade.kick();
        const s = await resumed.status();
        return s.state === 'completed';
      });
      expect(l.calls).toEqual(['a', 'b']);
      // One snapshot, whatever the stop: a second attempt found it taken (ALREADY_EXISTS).
      expect((await f.fakes[0]!.listSnapshots(v)).length).toBe(1);
      expect((await f.fakes[0]!.engineInfo(v)).role).toBe('active');
      expect(await f.store.get(KIND.engine, v)).toMatchObject({ value: { hostId: 'a' } });
    });
  }

  it('a second control plane does not drive a session whose lease is held', async () => {
    const { f, l, cp, volume } = await setup();
    await volume(['a']);
    let release!: () => void;
    l.before = () => new Promise((r) => (release = r));
    const session = await cp.upgrade.start({ dataEngine: NEW, hosts: ['a'] });
    await waitFor(() => l.calls.length === 1);
    const second = controlPlane(f, l);
    planes.push(second);
    for (let i = 0; i < 5; i++) {
      second.upgrade.kick();
      await new Promise((r) => setTimeout(r, 150));
    }
    expect(l.calls).toEqual(['a']);
    release();
    expect((await session.done()).state).toBe('completed');
  });
});

async function waitFor(cond: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms: ${cond.toString()}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
