// A real guest writing through a whole in-place upgrade session: QEMU (TCG) with its
// virtio-blk disk on a 3-replica volume's NBD export on host a, the guest's /init writing
// numbered 4 KiB blocks with O_DIRECT dd, one after the other, while `auto` replaces the
// data engine process of a, b and c in place. The guest's kernel sees no I/O error and no
// dd fails; it writes during the session and after it; QEMU's NBD client never reconnects
// (the export counts no new connection); and after QEMU stops, every block the guest wrote
// reads back from the volume with its own number, in order, with nothing after it.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { NbdClient } from '../../../src/bench/nbd-client.js';
import { Mooring } from '../../../src/mooring.js';
import { packageVersion } from '../../../src/native/load.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { Guest, guestImage, verifySeqBlocks, writerScript, type GuestImage } from '../helpers/guest.js';
import { makeHosts, waitFor, type HostProcess } from '../helpers/hosts.js';
import { killAllServers } from '../helpers/serve.js';
import { TempDir, repoRoot } from '../helpers/tools.js';

const SIZE = 128 << 20;
// Lines in the serial log that mean the guest saw a failure (kernel block errors, dd, a hang).
const GUEST_ERRORS = /I\/O error|dd: |DDERR|GUEST_FAIL|blocked for more than|Call Trace|WRITER_DONE/;

describe('upgrade session in place under a QEMU guest', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  let store: FileStateStore;
  let image: GuestImage;
  let vm: Guest | null = null;

  beforeAll(async () => {
    image = await guestImage(writerScript({ blocks: SIZE / 4096, every: 50 }));
    hosts = makeHosts(tmp.path, 3, 18200);
    for (const h of hosts) {
      h.opts.extraArgs = ['--allow-successor-exec', repoRoot];
      await h.start();
    }
    store = await FileStateStore.open(join(tmp.path, 'state'));
    cluster = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 500 });
  }, 300_000);

  afterAll(async () => {
    await vm?.quit().catch(() => vm?.kill());
    await cluster?.close();
    await store?.close();
    for (const h of hosts) await h.stop().catch(() => undefined);
    await killAllServers();
    tmp.cleanup();
  });

  it('the guest writes through the whole session: no I/O error, no reconnect, every block reads back', async () => {
    const sock = tmp.join('vm.sock');
    await cluster.createVolume({ name: 'vm', sizeBytes: SIZE, replicas: 3 });
    await cluster.volume('vm').attach({ host: 'a', nbd: `unix:${sock}` });
    const bootStart = Date.now();
    vm = Guest.start(image, { dir: tmp.join('guest'), nbdSocket: sock });
    const guest = vm;
    const why = () => guest.diagnostics() + hosts.map((h) => h.diagnostics()).join('');
    await guest.waitForSerial(/^GUEST_READY/m, 60_000);
    const bootMs = Date.now() - bootStart;
    const count = () => Math.max(0, ...[...guest.serial().matchAll(/^CNT (\d+)/gm)].map((m) => Number(m[1])));
    const waitCount = async (n: number, label: string) => {
      const deadline = Date.now() + 60_000;
      while (count() < n) {
        if (!guest.alive || Date.now() > deadline) throw new Error(`guest: ${label}: no CNT >= ${n} (at ${count()})${why()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    await waitCount(100, 'writing before the session');

    // QEMU's connection is the only one; none is added by the session.
    const stats = async () => (await cluster.volume('vm').engine())!.nbdStats!;
    expect(await waitFor(async () => (await stats()).connectionsOpen === 1, 10_000)).toBe(true);
    const connections = (await stats()).connectionsTotal;

    const dropped: string[] = [];
    cluster.on('data-engine-event', (host, e) => {
      if (e.type === 'replica-error' || e.type === 'rebuild-started') dropped.push(`${host}: ${e.type} ${e.volume}/${e.replicaId}`);
    });
    const sessionStart = Date.now();
    const countAtStart = count();
    const session = await cluster.startUpgrade({ dataEngine: { version: packageVersion(), command: [process.execPath, join(repoRoot, 'dist/cli.js')] }, stepTimeoutMs: 120_000 });
    const log: string[] = [];
    const handedOff: string[] = [];
    const countAtHandOff = new Map<string, number>();
    session.on('method-chosen', (e) => log.push(`${e.host} ${e.method}`));
    session.on('host-state-changed', (e) => log.push(`${e.host} ${e.state}`));
    session.on('handed-off', (e) => {
      countAtHandOff.set(e.host, count());
      handedOff.push(`${e.host} paused ${e.pauseMs.toFixed(1)} ms at block ${count()}`);
    });
    const done = await session.done().catch((err: unknown) => {
      throw new Error(`${String(err)}\n${log.join(', ')}${why()}`);
    });
    const sessionMs = Date.now() - sessionStart;
    const countAtEnd = count();
    expect(done.state).toBe('completed');
    expect(log.filter((l) => /in-place|restart/.test(l))).toEqual(['a in-place', 'b in-place', 'c in-place']);
    expect(handedOff).toHaveLength(3);

    // The guest goes on writing after the session, on the same connection.
    await waitCount(countAtEnd + 200, 'writing after the session');
    const after = await stats();
    expect({ total: after.connectionsTotal, open: after.connectionsOpen }, `QEMU reconnected${why()}`).toEqual({ total: connections, open: 1 });
    expect(await cluster.volume('vm').engine()).toMatchObject({ hostId: 'a', role: 'active' });

    // Stop the guest (in-flight writes drain), then read the volume back over a new connection.
    await guest.qmp('stop');
    const written = count();
    const serial = guest.serial();
    await guest.quit();
    expect(serial.split('\n').filter((l) => GUEST_ERRORS.test(l)), `guest errors${why()}`).toEqual([]);
    // Writes went on after host a (the export's) handed off, before the session ended.
    expect(countAtEnd, `no writes after a's hand-off in the session${why()}`).toBeGreaterThan(countAtHandOff.get('a')!);
    expect(dropped).toEqual([]);
    const st = await cluster.volume('vm').status();
    expect(st.state, JSON.stringify(st.replicas)).toBe('healthy');
    const client = await NbdClient.connect({ socketPath: sock });
    const blocks = await verifySeqBlocks((off, len) => client.read(off, len), SIZE);
    await client.disconnect();
    // Every block the guest reported written is there (up to 49 more may have completed after its last CNT line).
    expect(blocks).toBeGreaterThanOrEqual(written);
    expect(blocks).toBeLessThan(written + 50);
    // The guest's own clock: seconds between successive CNT lines (50 blocks) during the session.
    const marks = [...serial.matchAll(/^CNT (\d+) ([\d.]+)/gm)].map((m) => ({ n: Number(m[1]), t: Number(m[2]) }));
    const gaps = marks.slice(1).filter((m) => m.n > countAtStart && m.n <= countAtEnd).map((m) => m.t - marks.find((p) => p.n === m.n - 50)!.t);
    console.log(
      `guest through an in-place session: boot ${bootMs} ms; session ${sessionMs} ms; ` +
        `${countAtEnd - countAtStart} blocks written during it, ${written - countAtEnd} after, ${blocks} verified; ` +
        `50 blocks took ${Math.min(...gaps).toFixed(2)}-${Math.max(...gaps).toFixed(2)} s during the session; ${handedOff.join('; ')}`,
    );
  });
});
