#!/usr/bin/env node
// The VM of demo.mjs as a libvirt domain (libvirt.mjs): three hosts as three `mooring
// data-engine` processes, the VM's disk a 3-replica volume over a backing image, exported
// over NBD on a unix socket that the domain's `<disk type='network'>` reads. The domain boots
// on host a; then host a dies (the domain and a's data engine), and the VM is started again,
// as a new domain, on host b, whose attach takes the volume over. Needs libvirtd with the QEMU driver
// (README: Debian's packages and qemu.conf).
//
//   npm run build && node examples/standalone-hypervisor/libvirt-demo.mjs --kernel vmlinuz --initrd initrd.gz
//   node examples/standalone-hypervisor/libvirt-demo.mjs --image disk.qcow2 [--accel kvm] [--uri qemu:///system]
import { readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { FileStateStore, Mooring, MooringError } from '../../dist/index.js';
import { startDataEngineProcess } from '../shared/data-engine-process.mjs';
import { domainXml, virsh } from './libvirt.mjs';
import { createVmVolume, parseVmArgs } from './volume.mjs';

const log = (line = '') => process.stdout.write(`${line}\n`);
const args = parseVmArgs({ uri: { type: 'string', default: 'qemu:///system' } }, 'libvirt-demo.mjs --image DISK | --kernel VMLINUZ --initrd INITRD [--size 64M] [--accel tcg|kvm] [--uri qemu:///system]');

const root = await mkdtemp(join(tmpdir(), 'mooring-libvirt-demo-'));
const hosts = new Map();
const serials = [];
let domain = null;
let store;
let mooring;
let failed = false;

/** Attaches vm1 on `host` and boots it there as the transient domain `mooring-demo-vm1`. */
async function boot(host) {
  const socket = join(root, `vm1-${host}.sock`);
  await mooring.volume('vm1').attach({ host, attacher: 'workload', nbd: `unix:${socket}` });
  const serialLog = join(root, `vm1-${host}-serial.log`);
  writeFileSync(serialLog, '');
  serials.push(serialLog);
  const file = join(root, `vm1-${host}.xml`);
  writeFileSync(file, domainXml({ name: 'mooring-demo-vm1', socket, serialLog, boot: args.image ? null : { kernel: args.kernel, initrd: args.initrd }, accel: args.accel }));
  await virsh(['create', file], args.uri);
  domain = 'mooring-demo-vm1';
  log(`vm1 booting on ${host} as libvirt domain ${domain} (${file})`);
}

try {
  for (const [i, id] of ['a', 'b', 'c'].entries()) hosts.set(id, await startDataEngineProcess(root, id, 17964 + i));
  store = await FileStateStore.open(join(root, 'state'));
  mooring = await Mooring.open({ store, hosts: [...hosts.values()].map((h) => h.engine) });
  const ist = await createVmVolume(mooring, 'vm1', { dir: root, image: args.image, size: args.size });
  log(`image base: ${ist.state}, ${ist.format}, ${ist.sizeBytes} bytes`);

  await boot('a');
  await new Promise((r) => setTimeout(r, 5000));
  log(`domain state: ${(await virsh(['domstate', domain], args.uri)).trim()}`);

  // Host a dies, its QEMU with it (domain first, so the guest never sees its disk go away),
  // and the VM is started again on b. A real manager would learn that a's QEMU is gone from
  // a fencing mechanism, e.g. sanlock as demo.mjs does.
  await virsh(['destroy', domain], args.uri);
  domain = null;
  hosts.get('a').child.kill('SIGKILL');
  await boot('b');
  const st = await mooring.volume('vm1').status();
  log(`host a died: vm1 runs on ${st.attachedHost} (epoch ${st.epoch}, ${st.state})`);
  await new Promise((r) => setTimeout(r, 5000));
  await virsh(['destroy', domain], args.uri);
  domain = null;
  await mooring.volume('vm1').detach();
  log('vm1 stopped');
  const ioErrors = serials.flatMap((f) => readFileSync(f, 'utf8').split('\n')).filter((l) => /I\/O error/.test(l));
  log(`guest disk errors in ${serials.length} serial logs: ${ioErrors.length}${ioErrors.length ? `\n${ioErrors.join('\n')}` : ''}`);
} catch (err) {
  failed = true;
  log(`failed: ${err instanceof MooringError ? `${err.code}: ` : ''}${err.message}`);
} finally {
  if (domain) await virsh(['destroy', domain], args.uri).catch(() => undefined);
  await mooring?.close();
  await store?.close();
  for (const { child, engine } of hosts.values()) {
    await engine.close().catch(() => undefined);
    child.kill('SIGTERM');
  }
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
