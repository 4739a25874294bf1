#!/usr/bin/env node
// A standalone hypervisor on Mooring (vm-manager.mjs), run on one machine: three hosts as
// three `mooring data-engine` processes, one VM whose disk is a 3-replica volume over a
// backing image. The VM boots on host a, live-migrates to b, a second migration to c fails
// after the hand-over (its destination QEMU dies) and is rolled back with the guest running
// on, then host b dies (its data engine and the VM's QEMU are killed) and the VM is started
// again on c.
//
//   npm run build && node examples/standalone-hypervisor/demo.mjs --image disk.qcow2
//       a bootable image (any format qemu-img reads), booted from its disk; or
//   node examples/standalone-hypervisor/demo.mjs --kernel vmlinuz --initrd initrd.gz [--size 64M]
//       a kernel and initramfs booted directly, over a blank backing image
//   --accel kvm where /dev/kvm works (default tcg: slow, but runs anywhere)
import { execFile } from 'node:child_process';
import { createReadStream, readFileSync, readdirSync, statSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';

import { FileStateStore, Mooring, MooringError } from '../../dist/index.js';
import { startDataEngineProcess } from '../shared/data-engine-process.mjs';
import { VmManager } from './vm-manager.mjs';

const log = (line = '') => process.stdout.write(`${line}\n`);
const { values: args } = parseArgs({ options: { image: { type: 'string' }, kernel: { type: 'string' }, initrd: { type: 'string' }, size: { type: 'string', default: '64M' }, accel: { type: 'string', default: 'tcg' } } });
if (!args.image && !(args.kernel && args.initrd)) {
  process.stderr.write('usage: demo.mjs --image DISK | --kernel VMLINUZ --initrd INITRD [--size 64M] [--accel tcg|kvm]\n');
  process.exit(2);
}

const root = await mkdtemp(join(tmpdir(), 'mooring-hypervisor-demo-'));
const hosts = new Map(); // host id -> { child, engine }
let store;
let mooring;
let vms;
let failed = false;

async function startHost(id, port) {
  const h = await startDataEngineProcess(root, id, port);
  hosts.set(id, h);
  return h.engine;
}

try {
  const engines = [];
  for (const [i, id] of ['a', 'b', 'c'].entries()) engines.push(await startHost(id, 17961 + i));
  store = await FileStateStore.open(join(root, 'state'));
  mooring = await Mooring.open({ store, hosts: engines });

  // The backing image: the bootable disk given, or a blank raw one for a direct kernel boot.
  let file = args.image;
  if (!file) {
    file = join(root, 'blank.raw');
    await promisify(execFile)('qemu-img', ['create', '-f', 'raw', file, args.size]);
  }
  const img = await mooring.createBackingImage({ name: 'base', source: { type: 'upload', sizeBytes: statSync(file).size }, host: 'a' });
  await img.upload(createReadStream(file));
  const ist = await img.waitReady({ timeoutMs: 120_000 });
  log(`image base: ${ist.state}, ${ist.format}, ${ist.sizeBytes} bytes`);
  await mooring.createVolume({ name: 'vm1', replicas: 3, hosts: ['a', 'b', 'c'], accessMode: 'migratable', backingImage: 'base' });

  vms = new VmManager({ mooring, runDir: root, boot: args.image ? null : { kernel: args.kernel, initrd: args.initrd }, accel: args.accel });
  const vm = await vms.start('vm1', 'a');
  log(`vm1 booting on a (serial log ${vm.serialPath})`);
  await new Promise((r) => setTimeout(r, 3000));

  const moved = await vms.migrate('vm1', 'b');
  log(`vm1 migrated to b: downtime ${moved.downtimeMs} ms`);

  try {
    await vms.migrate('vm1', 'c', { beforeContinue: (dst) => dst.kill() });
    log('vm1 migrated to c (unexpected)');
  } catch (err) {
    const st = await mooring.volume('vm1').status();
    log(`migration to c failed (${err.message}): rolled back, vm1 runs on ${st.attachedHost}, writer ${st.writerHost}`);
  }

  // Host b dies: its data engine and the VM's QEMU go at once.
  hosts.get('b').child.kill('SIGKILL');
  await vms.recover('vm1', 'c');
  const st = await mooring.volume('vm1').status();
  log(`host b died: vm1 started again on ${st.attachedHost} (epoch ${st.epoch}, ${st.state})`);
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
  for (const vm of vms?.vms.values() ?? []) vm.qemu.kill();
  await mooring?.close();
  await store?.close();
  for (const { child, engine } of hosts.values()) {
    await engine.close().catch(() => undefined);
    child.kill('SIGTERM');
  }
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
