#!/usr/bin/env node
// A standalone hypervisor on Mooring (vm-manager.mjs), run on one machine: three hosts, each
// a `mooring data-engine` process, a sanlock daemon and a host agent (hosts.mjs); one VM whose
// disk is a 3-replica volume over a backing image, guarded by a sanlock disk lock. The VM
// boots on host a, live-migrates to b (the lock moves with it), a second migration to c fails
// after the hand-over (its destination QEMU dies) and is rolled back with the guest running
// on, then host b dies (everything on it killed) and the VM starts again on c once sanlock
// says b is dead.
//
//   npm run build && node examples/standalone-hypervisor/demo.mjs --image disk.qcow2
//       a bootable image (any format qemu-img reads), booted from its disk; or
//   node examples/standalone-hypervisor/demo.mjs --kernel vmlinuz --initrd initrd.gz [--size 64M]
//       a kernel and initramfs booted directly, over a blank backing image
//   --accel kvm where /dev/kvm works (default tcg: slow, but runs anywhere)
//   --io-timeout N   the lockspace's io_timeout (default 1 s: recovery waits 8N + 60 s)
//   --sanlock-preload SHIM.so   LD_PRELOAD for the sanlock daemons in a container (README)
import { readFileSync, readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { FileStateStore, Mooring, MooringError } from '../../dist/index.js';
import { startHost } from './hosts.mjs';
import { VmManager } from './vm-manager.mjs';
import { createVmVolume, parseVmArgs } from './volume.mjs';

const log = (line = '') => process.stdout.write(`${line}\n`);
const args = parseVmArgs({ 'io-timeout': { type: 'string', default: '1' }, 'sanlock-preload': { type: 'string' } }, 'demo.mjs --image DISK | --kernel VMLINUZ --initrd INITRD [--size 64M] [--accel tcg|kvm] [--io-timeout 1] [--sanlock-preload SHIM.so]');

const root = await mkdtemp(join(tmpdir(), 'mooring-hypervisor-demo-'));
const t0 = Date.now();
const at = () => `+${((Date.now() - t0) / 1000).toFixed(0)}s`;
const hosts = new Map();
let store;
let mooring;
let vms;
let failed = false;

try {
  const lockspace = { lockspacePath: join(root, 'vms.lockspace'), ioTimeoutSeconds: Number(args['io-timeout']), preload: args['sanlock-preload'] };
  for (const [i, id] of ['a', 'b', 'c'].entries()) hosts.set(id, await startHost(root, id, i + 1, 17961 + i, lockspace));
  log(`hosts a, b, c: data engines up, joined lockspace vms (io_timeout ${lockspace.ioTimeoutSeconds} s)`);
  // What c's sanlock says about the others (live at the start, then b's failure).
  hosts.get('c').agent.onHost = (e) => ['fail', 'dead'].includes(e.state) && log(`${at()} c sees host ${e.hostId} ${e.state}`);
  store = await FileStateStore.open(join(root, 'state'));
  mooring = await Mooring.open({ store, hosts: [...hosts.values()].map((h) => h.engine) });

  const ist = await createVmVolume(mooring, 'vm1', { dir: root, image: args.image, size: args.size });
  log(`image base: ${ist.state}, ${ist.format}, ${ist.sizeBytes} bytes`);

  vms = new VmManager({ mooring, hosts, runDir: root, boot: args.image ? null : { kernel: args.kernel, initrd: args.initrd }, accel: args.accel });
  await vms.define('vm1');
  const vm = await vms.start('vm1', 'a');
  log(`vm1 booting on a, holding its disk lock (serial log ${vm.serialPath})`);
  await new Promise((r) => setTimeout(r, 3000));

  const moved = await vms.migrate('vm1', 'b');
  log(`vm1 migrated to b: downtime ${moved.downtimeMs} ms, its disk lock now held on b`);

  try {
    await vms.migrate('vm1', 'c', { beforeContinue: (agent, key) => agent.call('kill', { key }) });
    log('vm1 migrated to c (unexpected)');
  } catch (err) {
    const st = await mooring.volume('vm1').status();
    log(`migration to c failed (${err.message}): rolled back, vm1 runs on ${st.attachedHost}, writer ${st.writerHost}`);
  }

  // Host b dies: its data engine, sanlock daemon, agent and the VM's QEMU go at once.
  hosts.get('b').crash();
  log(`${at()} host b died; recovering vm1 on c (QEMU starts when b's lease is dead)`);
  await vms.recover('vm1', 'c');
  const st = await mooring.volume('vm1').status();
  log(`${at()} vm1 started again on ${st.attachedHost} (epoch ${st.epoch}, ${st.state})`);
  await new Promise((r) => setTimeout(r, 3000));
  await vms.stop('vm1');
  log('vm1 stopped');
  // What the guest's kernel said about its disk, in every QEMU it ran in.
  const serials = readdirSync(root).filter((d) => d.startsWith('vm1-qemu-')).map((d) => readFileSync(join(root, d, 'serial.log'), 'utf8'));
  const ioErrors = serials.flatMap((t) => t.split('\n')).filter((l) => /I\/O error/.test(l));
  log(`guest disk errors in ${serials.length} QEMU serial logs: ${ioErrors.length}${ioErrors.length ? `\n${ioErrors.join('\n')}` : ''}`);
} catch (err) {
  failed = true;
  log(`failed: ${err instanceof MooringError ? `${err.code}: ` : ''}${err.message}`);
} finally {
  await vms?.killAll();
  await mooring?.close();
  await store?.close();
  for (const h of hosts.values()) await h.close();
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
