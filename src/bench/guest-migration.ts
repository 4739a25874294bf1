/**
 * Live migration of a real guest: QEMU (TCG, 256 MiB) with its virtio-blk disk on a
 * 3-replica volume of three `mooring data-engine` processes on loopback, its /init writing
 * numbered 4 KiB blocks with O_DIRECT dd throughout, migrated back and forth between h0 and
 * h1 as docs/migration.md wires it: destination QEMU on the target's standby export,
 * `pause-before-switchover`, `handOver()` on the MIGRATION event `pre-switchover`, then
 * `migrate-continue`; on `completed` the source QEMU quits and the migration is confirmed.
 *
 * - Downtime: what QEMU reports (`query-migrate` `downtime`, from the source VM stopping to
 *   the destination running), so it includes the hand-over.
 * - Hand-over: `HandOverResult.pauseMs`.
 * - Peer (the baseline of ../shared/research/qemu.md): the same guest migrated between two
 *   qemu-nbd servers over one raw file (O_DIRECT), no hand-over needed.
 * Both at `max-bandwidth` 1 GiB/s; the guest's RAM is the same size for both.
 */
import { join } from 'node:path';

import { Mooring } from '../mooring.js';
import { findPackageRoot } from '../native/load.js';
import { MemoryStateStore } from '../state/memory-state-store.js';
import { Guest, guestImage, writerScript, type GuestImage } from './guest.js';
import { spread, startQemuNbd, type Spread } from './migration.js';
import { BenchError, stopChild } from './processes.js';
import { startBenchHost, type BenchHost } from './remote-hosts.js';
import { createSparse, type TargetContext } from './targets.js';

/** Replica ports of the guest migration hosts (distinct from the other steps' ones). */
const GUEST_MIGRATION_PORT_OFFSET = 70;
const VOLUME_BYTES = 128 * 1024 * 1024;
/** Blocks the guest's writer writes before it stops (more than a run takes at ~180 dd/s). */
const WRITER_BLOCKS = VOLUME_BYTES / 4096;
const BANDWIDTH_BYTES_PER_S = 1024 * 1024 * 1024;
const STEP_TIMEOUT_MS = 120_000;

export interface GuestMigrationResults {
  rounds: number;
  /** QEMU's reported downtime of Mooring's migrations. */
  downtimeMs: Spread;
  /** Mooring's hand-over (inside the downtime). */
  handOverMs: Spread;
  /** QEMU's total migration time. */
  totalMs: Spread;
  /** How long the source QEMU took to quit after completion (before the confirm). */
  quitMs: Spread;
  peer: { name: string; rounds: number; downtimeMs: Spread; totalMs: Spread };
}

interface QemuMigration {
  status?: string;
  downtime?: number;
  'total-time'?: number;
}

async function waitQmp(g: Guest): Promise<void> {
  const deadline = Date.now() + STEP_TIMEOUT_MS;
  for (;;) {
    try {
      await g.qmp('query-status');
      return;
    } catch (err) {
      if (!g.alive || Date.now() > deadline) throw new BenchError('BENCH_TARGET_FAILED', `QEMU did not answer QMP: ${String(err)}${g.diagnostics()}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

// Migrates `src` to a destination QEMU on `dstSocket` and returns it with QEMU's figures.
// `atPreSwitchover`, if given, runs when the source stops at pre-switchover (the hand-over).
async function migrateGuest(
  ctx: TargetContext,
  image: GuestImage,
  src: Guest,
  dstSocket: string,
  round: string,
  atPreSwitchover: (() => Promise<void>) | null,
): Promise<{ dst: Guest; downtimeMs: number; totalMs: number }> {
  const migSock = join(ctx.dir, `mig-${round}.sock`);
  const dst = Guest.start(image, { dir: join(ctx.dir, `guest-${round}`), nbdSocket: dstSocket, extraArgs: ['-incoming', `unix:${migSock}`] });
  try {
    await waitQmp(dst);
    await src.qmp('migrate-set-capabilities', {
      capabilities: [
        { capability: 'events', state: true },
        { capability: 'pause-before-switchover', state: atPreSwitchover !== null },
      ],
    });
    await src.qmp('migrate-set-parameters', { 'max-bandwidth': BANDWIDTH_BYTES_PER_S });
    const paused = atPreSwitchover ? src.nextEvent('MIGRATION', (d) => d.status === 'pre-switchover', STEP_TIMEOUT_MS) : null;
    const completed = src.nextEvent('MIGRATION', (d) => d.status === 'completed' || d.status === 'failed' || d.status === 'cancelled', STEP_TIMEOUT_MS);
    await src.qmp('migrate', { uri: `unix:${migSock}` });
    if (paused && atPreSwitchover) {
      await paused;
      await atPreSwitchover();
      await src.qmp('migrate-continue', { state: 'pre-switchover' });
    }
    const end = await completed;
    const info = (await src.qmp('query-migrate')) as QemuMigration;
    if (end.status !== 'completed' || info.downtime === undefined || info['total-time'] === undefined) {
      throw new BenchError('BENCH_TARGET_FAILED', `migration ${round} ended ${String(end.status)}: ${JSON.stringify(info)}${src.diagnostics()}`);
    }
    return { dst, downtimeMs: info.downtime, totalMs: info['total-time'] };
  } catch (err) {
    dst.kill();
    throw err;
  }
}

// Boots the guest on `socket` and waits until it writes.
async function bootWriting(ctx: TargetContext, image: GuestImage, socket: string, name: string): Promise<Guest> {
  const g = Guest.start(image, { dir: join(ctx.dir, `guest-${name}`), nbdSocket: socket });
  try {
    await g.waitForSerial(/^CNT \d+/m, STEP_TIMEOUT_MS);
    await waitQmp(g);
    return g;
  } catch (err) {
    g.kill();
    throw err;
  }
}

/** Migrates a real guest `rounds` times with Mooring, then between two qemu-nbd servers. Everything it started is stopped when it returns or throws. */
export async function measureGuestMigration(ctx: TargetContext, rounds: number): Promise<GuestMigrationResults> {
  const image = await guestImage(writerScript({ blocks: WRITER_BLOCKS, every: 50 }), join(findPackageRoot(), 'node_modules', '.cache', 'mooring-guest'));
  const guests: Guest[] = [];
  const hosts: BenchHost[] = [];
  let cluster: Mooring | null = null;
  const downtime: number[] = [];
  const handOver: number[] = [];
  const total: number[] = [];
  const quit: number[] = [];
  try {
    for (let i = 0; i < 3; i++) hosts.push(await startBenchHost(ctx, i, ctx.portBase + GUEST_MIGRATION_PORT_OFFSET + i));
    cluster = await Mooring.open({ store: new MemoryStateStore(), hosts: hosts.map((h) => h.engine), repairIntervalMs: 0 });
    await cluster.createVolume({ name: 'vm', sizeBytes: VOLUME_BYTES, replicas: 3, accessMode: 'migratable', hosts: ['h0', 'h1', 'h2'] });
    const vol = cluster.volume('vm');
    const sock = (h: string, i: number): string => join(ctx.dir, `vm-${h}-${i}.sock`);
    let here = 'h0';
    await vol.attach({ host: here, attacher: 'workload', nbd: `unix:${sock(here, 0)}` });
    let vm = await bootWriting(ctx, image, sock(here, 0), 'mooring');
    guests.push(vm);
    for (let i = 1; i <= rounds; i++) {
      if (ctx.abort.aborted) throw new BenchError('BENCH_INTERRUPTED', 'interrupted');
      const there = here === 'h0' ? 'h1' : 'h0';
      const m = await vol.migrate(there, { nbd: `unix:${sock(there, i)}`, attacher: 'workload' });
      let pauseMs = NaN;
      const r = await migrateGuest(ctx, image, vm, sock(there, i), `mooring-${i}`, async () => {
        pauseMs = (await m.handOver()).pauseMs;
      });
      guests.push(r.dst);
      const t0 = performance.now();
      await vm.quit();
      quit.push(performance.now() - t0);
      await m.confirm();
      downtime.push(r.downtimeMs);
      total.push(r.totalMs);
      handOver.push(pauseMs);
      ctx.log(`  guest migration ${i}: downtime ${r.downtimeMs} ms (hand-over ${pauseMs.toFixed(1)} ms), total ${r.totalMs} ms`);
      vm = r.dst;
      here = there;
    }
    await vm.quit();
    await vol.detach();
  } finally {
    for (const g of guests) g.kill();
    await cluster?.close().catch(() => undefined);
    for (const h of hosts) await h.stop().catch(() => undefined);
  }
  const peer = await measurePeer(ctx, image, rounds);
  return { rounds, downtimeMs: spread(downtime), handOverMs: spread(handOver), totalMs: spread(total), quitMs: spread(quit), peer };
}

async function measurePeer(ctx: TargetContext, image: GuestImage, rounds: number): Promise<GuestMigrationResults['peer']> {
  const file = join(ctx.dir, 'guest-peer.raw');
  createSparse(file, VOLUME_BYTES);
  const servers = [join(ctx.dir, 'peer-a.sock'), join(ctx.dir, 'peer-b.sock')];
  const children = [];
  const guests: Guest[] = [];
  const downtime: number[] = [];
  const total: number[] = [];
  try {
    for (const s of servers) children.push(await startQemuNbd(ctx, file, s, ['--cache=none', '--aio=native']));
    let vm = await bootWriting(ctx, image, servers[0]!, 'peer');
    guests.push(vm);
    for (let i = 1; i <= rounds; i++) {
      if (ctx.abort.aborted) throw new BenchError('BENCH_INTERRUPTED', 'interrupted');
      const r = await migrateGuest(ctx, image, vm, servers[i % 2]!, `peer-${i}`, null);
      guests.push(r.dst);
      await vm.quit();
      downtime.push(r.downtimeMs);
      total.push(r.totalMs);
      ctx.log(`  guest migration between qemu-nbd servers ${i}: downtime ${r.downtimeMs} ms, total ${r.totalMs} ms`);
      vm = r.dst;
    }
    await vm.quit();
  } finally {
    for (const g of guests) g.kill();
    for (const c of children) await stopChild(c, 5000);
  }
  return { name: 'the same guest migrated between two qemu-nbd servers over one raw file (O_DIRECT)', rounds, downtimeMs: spread(downtime), totalMs: spread(total) };
}
