// The examples run as users would run them (node examples/.../demo.mjs after a build) and
// do what they say: exit 0 and print the states they walk through.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import { EtcdServer } from '../../src/bench/etcd-server.js';
import { guestImage, writerScript } from './helpers/guest.js';
import { ensureLibvirtd, validateDomainXml } from './helpers/libvirt.js';
import { buildShim } from './helpers/sanlock-daemon.js';
import { repoRoot, run } from './helpers/tools.js';

async function runExample(path: string, args: string[] = [], timeoutMs = 120_000): Promise<string> {
  const r = await run(process.execPath, [join(repoRoot, path), ...args], { timeoutMs, allowFailure: true });
  expect(r.code, `${path} failed\n${r.stdout}\n${r.stderr}`).toBe(0);
  return r.stdout;
}

describe('examples', () => {
  it('quickstart (npm run demo): a volume on the embedded defaults, written through NBD, found again after a restart', async () => {
    const out = await runExample('examples/quickstart/demo.mjs', ['--once']);
    expect(out).toMatch(/created volume disk0: 64 MiB, 1 replica\(s\), detached/);
    expect(out).toMatch(/attached on \S+: healthy, writer epoch 1/);
    expect(out).toMatch(/qemu-io: wrote 65536\/65536 bytes at offset 0; read 65536\/65536 bytes at offset 0/);
    expect(out).toMatch(/snapshot first, labels \{"made_by":"demo"\}/);
    // A new epoch after the restart: the engine was started again, over the same data.
    expect(out).toMatch(/after a restart: healthy on \S+, writer epoch 2/);
    expect(out).toMatch(/qemu-io after the restart: read 65536\/65536 bytes/);
    expect(out).toMatch(/closed \(engines drained and flushed\)/);
  });

  it('data-engine: a volume across an in-process and a gRPC-reached data engine', async () => {
    const out = await runExample('examples/data-engine/demo.mjs');
    expect(out).toMatch(/replica r1 on host b \(disk0-r1\): RW/);
    expect(out).toMatch(/after stop: disk0-r0 clean=true; disk0-r1 clean=true/);
  });

  it('metrics: an embedder mounts MooringMetrics\' registry; qemu-io\'s writes are counted; a deleted volume\'s series go', async () => {
    const out = await runExample('examples/metrics/demo.mjs', ['--port', '27153']);
    expect(out).toMatch(/metrics at http:\/\/127\.0\.0\.1:27153\/metrics/);
    expect(out).toMatch(/before: mooring_volume_state healthy=1, RW replicas=1, write requests=no series yet/);
    expect(out).toMatch(/after 16 writes of 64 KiB: write requests=16, bytes written=1048576, write latency count=16/);
    expect(out).toMatch(/after delete: series naming disk0: 0/);
  });

  it('nbd-tls: QEMU and nbdinfo reach a TLS export with client certificates, a client in the clear is refused', async () => {
    const out = await runExample('examples/nbd-tls/demo.mjs');
    expect(out).toMatch(/exported at nbds:\/\/127\.0\.0\.1:\d+\//);
    expect(out).toMatch(/qemu-io over TLS: wrote 1048576\/1048576 bytes at offset 0; read 1048576\/1048576 bytes at offset 0/);
    expect(out).toMatch(/nbdinfo over TLS: 67108864 bytes/);
    expect(out).toMatch(/a client in the clear: refused \(.*requires TLS/);
  });

  it('etcd: a Mooring over an EtcdStateStore, a watch of its volumes, a second Mooring on the same etcd attaching the volume again', async () => {
    const etcd = await EtcdServer.start(28222, 28223);
    try {
      const out = await runExample('examples/etcd/demo.mjs', ['--endpoint', etcd.endpoint]);
      expect(out).toMatch(/watch: put volume\/disk0 \(version 1\)/);
      expect(out).toMatch(/first manager: disk0 healthy on h1, writer epoch 1/);
      expect(out).toMatch(/second manager sees: disk0 \(detached\)/);
      expect(out).toMatch(/second manager: disk0 healthy on h1, writer epoch 2/);
      expect(out).toMatch(/deleted; volumes left in etcd: 0/);
    } finally {
      await etcd.destroy();
    }
  });

  it('cluster: degraded while a host is away, healthy again once it is back, salvaged once two hosts are lost', async () => {
    const out = await runExample('examples/cluster/demo.mjs');
    expect(out).toMatch(/attached: healthy, attached on a/);
    expect(out).toMatch(/host c down: degraded, .* r2@c=ERR/);
    expect(out).toMatch(/rebuild-completed: replica r2/);
    expect(out).toMatch(/host c back: healthy/);
    // b and c lost for good: salvaged from a's replica, the others replaced on d and e.
    expect(out).toMatch(/salvaged from r0 on a; left out r1, r2; complete: (true|false)/);
    expect(out).toMatch(/after the salvage: healthy, attached on a, .*r0@a=RW/);
    expect(out).toMatch(/detached and deleted/);
  });

  it('migration: a volume moves from a to b around a hand-over, a is refused afterwards', async () => {
    const out = await runExample('examples/migration/demo.mjs');
    expect(out).toMatch(/attached on a; the VM writes: wrote 1048576\/1048576 bytes/);
    expect(out).toMatch(/standby on b before the hand-over: refused: .*Operation not permitted/);
    expect(out).toMatch(/hook beforeHandOver[\s\S]*event migration-handed-over: epoch \d+[\s\S]*hook afterHandOver/);
    expect(out).toMatch(/b reads what a wrote: read 1048576\/1048576 bytes/);
    expect(out).toMatch(/a write sent to a after the hand-over, dropped at the confirm: refused: /);
    expect(out).not.toMatch(/dropped at the confirm: refused: .*Operation not permitted/);
    expect(out).toMatch(/b reads what a wrote, not the dropped write: read 4096\/4096 bytes/);
    expect(out).toMatch(/confirmed: attached on b, healthy/);
    expect(out).toMatch(/detached and deleted/);
  });

  it('backing-image: a volume over a downloaded image reads its bytes, writes land above it', async () => {
    const out = await runExample('examples/backing-image/demo.mjs');
    expect(out).toMatch(/image debian-base: ready, raw, 8388608 bytes/);
    expect(out).toMatch(/volume vm1-disk: 8388608 bytes over debian-base/);
    expect(out).toMatch(/files: a=ready b=ready/);
    expect(out).toMatch(/the image's bytes: read 1048576\/1048576 bytes/);
    expect(out).toMatch(/reads back: read 65536\/65536 bytes/);
    expect(out).toMatch(/the rest still from the image: read 983040\/983040 bytes/);
    expect(out).toMatch(/delete while used: BUSY/);
    expect(out).toMatch(/volume and image deleted/);
  });

  it('standalone hypervisor: a QEMU guest booted on a backing-image volume under its disk lock, live-migrated with it, a failed migration rolled back, restarted once its dead host\'s lease expired', async () => {
    // A guest whose /init writes numbered blocks to its disk throughout.
    const image = await guestImage(writerScript({ blocks: 16384 }));
    // Three real sanlock daemons, started by the demo (with the shim this container needs).
    const out = await runExample('examples/standalone-hypervisor/demo.mjs', ['--kernel', image.kernel, '--initrd', image.initrd, '--sanlock-preload', buildShim()], 300_000);
    expect(out).toMatch(/hosts a, b, c: data engines up, joined lockspace vms \(io_timeout 1 s\)/);
    expect(out).toMatch(/image base: ready, raw, 67108864 bytes/);
    expect(out).toMatch(/vm1 booting on a, holding its disk lock/);
    expect(out).toMatch(/vm1 migrated to b: downtime \d+ ms, its disk lock now held on b/);
    expect(out).toMatch(/migration to c failed \(the migration failed after the hand-over\): rolled back, vm1 runs on b, writer b/);
    // c restarts the VM only after it saw b dead in the lockspace (host id 2): the lock waited.
    const died = Number(/\+(\d+)s host b died/.exec(out)?.[1]);
    const dead = Number(/\+(\d+)s c sees host 2 dead/.exec(out)?.[1]);
    const started = Number(/\+(\d+)s vm1 started again on c \(epoch \d+, degraded\)/.exec(out)?.[1]);
    expect(out).toMatch(/c sees host 2 fail/);
    expect(dead - died, out).toBeGreaterThanOrEqual(60);
    expect(started, out).toBeGreaterThanOrEqual(dead);
    expect(out).toMatch(/vm1 stopped/);
    // Four QEMUs ran the guest (a, b, the failed destination c, and c after b died); none saw a disk error.
    expect(out).toMatch(/guest disk errors in 4 QEMU serial logs: 0\n/);
  }, 360_000);

  it('standalone hypervisor under libvirt: the VM as a libvirt domain reading its disk over NBD, started again on another host after its data engine died', async () => {
    await ensureLibvirtd();
    const image = await guestImage(writerScript({ blocks: 16384 }));
    // The XML the demo boots is valid for libvirt's own schema.
    const { domainXml } = (await import(join(repoRoot, 'examples/standalone-hypervisor/libvirt.mjs'))) as { domainXml: (o: object) => string };
    const dir = mkdtempSync(join(tmpdir(), 'mooring-libvirt-xml-'));
    try {
      await validateDomainXml(domainXml({ name: 'x', socket: '/run/x.sock', serialLog: join(dir, 's.log'), boot: { kernel: image.kernel, initrd: image.initrd }, accel: 'tcg' }), dir);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    const out = await runExample('examples/standalone-hypervisor/libvirt-demo.mjs', ['--kernel', image.kernel, '--initrd', image.initrd]);
    expect(out).toMatch(/vm1 booting on a as libvirt domain mooring-demo-vm1/);
    expect(out).toMatch(/domain state: running/);
    expect(out).toMatch(/vm1 booting on b as libvirt domain mooring-demo-vm1/);
    expect(out).toMatch(/host a died: vm1 runs on b \(epoch \d+, degraded\)/);
    expect(out).toMatch(/vm1 stopped/);
    expect(out).toMatch(/guest disk errors in 2 serial logs: 0\n/);
  }, 180_000);

  it('upgrade: three data-engine processes replaced one after another by an upgrade session', async () => {
    const out = await runExample('examples/upgrade/demo.mjs');
    expect(out).toMatch(/auto refused: PRECONDITION_FAILED: CLIENTS_WOULD_RECONNECT on a/);
    for (const h of ['a', 'b', 'c']) expect(out).toMatch(new RegExp(`launcher: replacing ${h}'s data engine`));
    expect(out).toMatch(/a: snapshot upgrade-[0-9a-f]{8} of disk0/);
    expect(out).toMatch(/c: completed\nsession completed/);
    // The engine came back on a at a new epoch, with every replica caught up.
    expect(out).toMatch(/volume healthy on a, writer epoch 2; r0@a=RW r1@b=RW r2@c=RW/);
  });
});
