// A real guest live-migrated between hosts, through every order of QEMU events the embedder
// meets: QEMU (TCG) on a 3-replica volume of three `mooring data-engine` processes, its
// /init writing numbered 4 KiB blocks with O_DIRECT dd without pause, migrated as
// docs/migration.md wires it (destination on the target's standby export, `events` and
// `pause-before-switchover`, the hand-over at `pre-switchover`):
// - cancelled before the hand-over, then rolled back;
// - cancelled after the hand-over: QEMU resumes the source VM at `cancelled` by itself,
//   before the rollback runs, so the guest's writes reach the source after it handed over;
// - the destination QEMU killed after the hand-over: QEMU resumes the source once the
//   migration fails, before the rollback;
// - the destination QEMU killed before the hand-over;
// - the target host's data engine SIGKILLed after the hand-over, QEMU cancelling: the
//   source takes the volume back with a fresh engine on a recreated export, and QEMU's NBD
//   client (reconnect-delay) reconnects and sends again what the old export held;
// - the embedding process restarted after the hand-over, QEMU cancelling meanwhile: the new
//   one finds the migration in the store and rolls it back;
// - a replica host SIGKILLed while the guest writes, then back and rebuilt;
// - completed: the source QEMU quits, then the confirm; the guest writes on at the target;
// - the source host's data engine SIGKILLed after the hand-over: the migration completes,
//   the guest writes on at the target, the confirm goes through without the source.
// After each, from inside the guest: no kernel I/O error, no failed dd, and it writes on;
// at the end every block it wrote reads back from the volume, in order.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../../src/bench/nbd-client.js';
import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { Guest, guestImage, verifySeqBlocks, writerScript, type GuestImage } from '../helpers/guest.js';
import { makeHosts, type HostProcess } from '../helpers/hosts.js';
import { TempDir } from '../helpers/tools.js';

const SIZE = 128 << 20;
const VOLUME = 'vm';
// Lines in a serial log that mean the guest saw a failure (kernel block errors, dd, a hang).
const GUEST_ERRORS = /I\/O error|dd: |DDERR|GUEST_FAIL|blocked for more than|Call Trace|WRITER_DONE/;

describe('live migration of a QEMU guest between hosts', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  const store = new MemoryStateStore();
  const open = (): Promise<Mooring> => Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 500 });
  let image: GuestImage;
  // The QEMU that runs the guest now, and the host whose engine serves it.
  let vm: Guest;
  let here = 'a';
  let run = 0;
  const others: Guest[] = [];
  const sock = (host: string, n: number): string => tmp.join(`${host}-${n}.sock`);

  const why = (...guests: Guest[]): string => guests.map((g) => g.diagnostics()).join('') + hosts.map((h) => h.diagnostics()).join('');
  const count = (g: Guest): number => Math.max(0, ...[...g.serial().matchAll(/^CNT (\d+)/gm)].map((m) => Number(m[1])));
  async function until(what: string, check: () => Promise<boolean> | boolean, timeoutMs: number, ...guests: Guest[]): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${why(...guests)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  // The guest writes on: `blocks` more than now, and nothing in its log says it failed.
  async function writesOn(g: Guest, blocks: number, label: string): Promise<void> {
    const from = count(g);
    await until(`${label}: the guest to write ${blocks} more blocks (from ${from})`, () => count(g) >= from + blocks, 120_000, g);
    expect(g.serial().split('\n').filter((l) => GUEST_ERRORS.test(l)), `${label}: guest errors${why(g)}`).toEqual([]);
  }
  const migrationStatus = async (g: Guest): Promise<string> => ((await g.qmp('query-migrate')) as { status?: string }).status ?? 'none';
  const runState = async (g: Guest): Promise<string> => ((await g.qmp('query-status')) as { status: string }).status;

  // QEMU resumes the source VM by itself: at `cancelled`, or when the switch-over fails
  // because the destination died.
  async function sourceResumes(how: 'cancel' | 'destination-dies', dst: Guest): Promise<void> {
    if (how === 'cancel') await vm.qmp('migrate_cancel');
    else {
      dst.kill();
      await dst.exited;
      await vm.qmp('migrate-continue', { state: 'pre-switchover' }).catch(() => undefined);
    }
    const want = how === 'cancel' ? 'cancelled' : 'failed';
    await until(`the source migration to be ${want} and the guest to run again`, async () => (await migrationStatus(vm)) === want && (await runState(vm)) === 'running', 60_000, vm);
  }
  const expectWriterHere = async (): Promise<void> => expect((await cluster.volume(VOLUME).status()).writerHost).toBe(here);

  // Starts the migration of the guest to `target` and brings it to `pre-switchover` (the
  // source VM stopped, drained and flushed). Returns the destination QEMU and the migration.
  async function toPreSwitchover(target: string) {
    run++;
    const m = await cluster.volume(VOLUME).migrate(target, { nbd: `unix:${sock(target, run)}`, attacher: 'workload' });
    const migSock = tmp.join(`mig-${run}.sock`);
    const dst = Guest.start(image, { dir: tmp.join(`guest-${run}`), nbdSocket: sock(target, run), extraArgs: ['-incoming', `unix:${migSock}`] });
    others.push(dst);
    await until('the destination QEMU to listen for the migration', async () => (await migrationStatus(dst).catch(() => 'not yet')) !== 'not yet', 60_000, dst);
    await vm.qmp('migrate-set-capabilities', {
      capabilities: [
        { capability: 'events', state: true },
        { capability: 'pause-before-switchover', state: true },
      ],
    });
    await vm.qmp('migrate', { uri: `unix:${migSock}` });
    await until('the source to reach pre-switchover', async () => (await migrationStatus(vm)) === 'pre-switchover', 120_000, vm, dst);
    return { dst, m };
  }

  beforeAll(async () => {
    image = await guestImage(writerScript({ blocks: SIZE / 4096, every: 25 }));
    hosts = makeHosts(tmp.path, 3, 18300);
    for (const h of hosts) await h.start();
    cluster = await open();
    await cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3, accessMode: 'migratable' });
    await cluster.volume(VOLUME).attach({ host: 'a', attacher: 'workload', nbd: `unix:${sock('a', 0)}` });
    vm = Guest.start(image, { dir: tmp.join('guest-0'), nbdSocket: sock('a', 0) });
    await vm.waitForSerial(/^GUEST_READY/m, 60_000);
    await writesOn(vm, 50, 'after boot');
  }, 300_000);

  afterAll(async () => {
    for (const g of [vm, ...others]) await g?.quit().catch(() => g.kill());
    await cluster?.close();
    for (const h of hosts) await h.stop().catch(() => undefined);
    tmp.cleanup();
  });

  // Orders of QEMU events around the hand-over that end in a rollback.
  const ROLLBACKS = [
    { title: 'cancelled before the hand-over: the source runs on, the rollback removes the standby', target: 'b', handOver: false, how: 'cancel' },
    { title: 'cancelled after the hand-over: QEMU resumes the source by itself, its writes wait for the rollback and then land', target: 'b', handOver: true, how: 'cancel' },
    { title: 'the destination QEMU dies after the hand-over: the source resumes when the migration fails, its writes wait for the rollback', target: 'c', handOver: true, how: 'destination-dies' },
    { title: 'the destination QEMU dies before the hand-over: the source resumes as the writer, the rollback removes the standby', target: 'c', handOver: false, how: 'destination-dies' },
  ] as const;
  for (const r of ROLLBACKS) {
    it(r.title, async () => {
      const { dst, m } = await toPreSwitchover(r.target);
      if (r.handOver) await m.handOver();
      // With the hand-over done, the resumed guest's writes reach a source that handed over.
      await sourceResumes(r.how, dst);
      const atResume = count(vm);
      await m.rollback();
      await dst.quit();
      await writesOn(vm, 50, r.title);
      expect(count(vm)).toBeGreaterThan(atResume);
      await expectWriterHere();
    }, 300_000);
  }

  it('the target host dies after the hand-over while QEMU cancels: the source takes over again, QEMU reconnects', async () => {
    const b = hosts.find((h) => h.hostId === 'b')!;
    const { dst, m } = await toPreSwitchover('b');
    await m.handOver();
    await b.crash();
    await sourceResumes('cancel', dst);
    await m.rollback();
    await dst.quit();
    await writesOn(vm, 50, 'target host killed after the hand-over');
    await b.start();
    await cluster.addHost(b.engine);
    await until('the volume to be healthy again', async () => (await cluster.volume(VOLUME).status()).state === 'healthy', 120_000, vm);
    await expectWriterHere();
  }, 300_000);

  it('the embedding process restarts after the hand-over while QEMU cancels: the new one rolls back from the store', async () => {
    const { dst } = await toPreSwitchover('b');
    await (await cluster.volume(VOLUME).migration())!.handOver();
    await cluster.close();
    await sourceResumes('cancel', dst);
    cluster = await open();
    const m = await cluster.volume(VOLUME).migration();
    expect(await m?.info()).toMatchObject({ sourceHost: here, targetHost: 'b', phase: 'handed-over' });
    await m!.rollback();
    await dst.quit();
    await writesOn(vm, 50, 'rolled back by a restarted embedder');
    await expectWriterHere();
  }, 300_000);

  it('a replica host dies while the guest writes: no I/O error; back, its replica is rebuilt', async () => {
    const c = hosts.find((h) => h.hostId === 'c')!;
    await c.crash();
    await writesOn(vm, 100, 'replica host c killed');
    await c.start();
    await cluster.addHost(c.engine);
    await until('the volume to be healthy again', async () => (await cluster.volume(VOLUME).status()).state === 'healthy', 120_000, vm);
    await writesOn(vm, 50, 'after c was rebuilt');
  }, 300_000);

  it('completes: the source QEMU quits at once, the confirm follows, the guest writes on at the target', async () => {
    const { dst, m } = await toPreSwitchover('b');
    await m.handOver();
    await vm.qmp('migrate-continue', { state: 'pre-switchover' });
    await until('the migration to complete', async () => (await migrationStatus(vm)) === 'completed', 60_000, vm, dst);
    const quitStart = Date.now();
    await vm.qmp('quit').catch(() => undefined);
    await vm.exited;
    const quitMs = Date.now() - quitStart;
    // Well under the NBD client's reconnect-delay (20 s), which it would wait out had its
    // export been closed under it first.
    expect(quitMs, `the source QEMU took ${quitMs} ms to quit${why(vm)}`).toBeLessThan(10_000);
    expect(vm.serial().split('\n').filter((l) => GUEST_ERRORS.test(l)), `source guest errors${why(vm)}`).toEqual([]);
    await m.confirm();
    others.splice(others.indexOf(dst), 1);
    vm = dst;
    here = 'b';
    await writesOn(vm, 50, 'at the target after the confirm');
    expect(await cluster.volume(VOLUME).status()).toMatchObject({ attachedHost: 'b', writerHost: 'b', migration: null });
    console.log(`migrated guest: the source QEMU quit in ${quitMs} ms after completion`);
  }, 300_000);

  it('the source host dies after the hand-over: the migration completes and the guest writes on at the target', async () => {
    const source = hosts.find((h) => h.hostId === here)!;
    const { dst, m } = await toPreSwitchover('a');
    await m.handOver();
    await source.crash();
    await vm.qmp('migrate-continue', { state: 'pre-switchover' });
    await until('the migration to complete', async () => (await migrationStatus(vm)) === 'completed', 60_000, vm, dst);
    // The source VM went with its host (its QEMU here would wait out reconnect-delay).
    vm.kill();
    await m.confirm();
    vm = dst;
    others.splice(others.indexOf(dst), 1);
    here = 'a';
    await writesOn(vm, 50, 'at the target after the source host died');
    await source.start();
    await cluster.addHost(source.engine);
    await until('the volume to be healthy again', async () => (await cluster.volume(VOLUME).status()).state === 'healthy', 120_000, vm);
    expect(await cluster.volume(VOLUME).status()).toMatchObject({ attachedHost: 'a', writerHost: 'a', migration: null });
    await writesOn(vm, 50, 'after the source host came back');
  }, 300_000);

  it('every block the guest wrote reads back in order', async () => {
    await vm.qmp('stop');
    const written = count(vm);
    await vm.quit();
    const client = await NbdClient.connect({ socketPath: sock(here, run) });
    const blocks = await verifySeqBlocks((off, len) => client.read(off, len), SIZE);
    await client.disconnect();
    expect(blocks).toBeGreaterThanOrEqual(written);
    expect(blocks).toBeLessThan(written + 25);
  }, 120_000);
});
