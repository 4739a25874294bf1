// The same VM as a libvirt domain: its disk a Mooring volume's NBD export over a unix socket
// (`<disk type='network'>`, `protocol='nbd'`), driven with virsh. libvirt's QEMU runs as the
// user in /etc/libvirt/qemu.conf (`libvirt-qemu` by default): it must be able to connect to
// the socket (write permission on it) and read the kernel and initrd; see README.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const xml = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/'/g, '&apos;').replace(/"/g, '&quot;');

/**
 * The domain XML of VM `name`: `socket` is the NBD export (from `volume.attach({ nbd })`),
 * `serialLog` a file for its console; `boot` a kernel and initrd for a direct boot, or null
 * to boot from the disk. `reconnectDelayS` (QEMU's reconnect-delay: the guest waits that long
 * for an export that is recreated, e.g. by a takeover on the same host) needs a libvirt newer
 * than Debian 12's 9.0, which rejects the element in validation and drops it when defining.
 */
export function domainXml({ name, socket, serialLog, boot = null, memMiB = 256, accel = 'kvm', reconnectDelayS = null }) {
  const os = boot
    ? `<kernel>${xml(boot.kernel)}</kernel>
    <initrd>${xml(boot.initrd)}</initrd>
    <cmdline>${xml(boot.append ?? 'console=ttyS0 quiet panic=-1')}</cmdline>`
    : `<boot dev='hd'/>`;
  return `<domain type='${accel === 'kvm' ? 'kvm' : 'qemu'}'>
  <name>${xml(name)}</name>
  <memory unit='MiB'>${memMiB}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    ${os}
  </os>
  <cpu mode='${accel === 'kvm' ? 'host-passthrough' : 'maximum'}'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='network' device='disk'>
      <!-- cache='none': no host page cache between the guest and Mooring (cache.direct=on) -->
      <driver name='qemu' type='raw' cache='none'/>
      <source protocol='nbd'>
        <host transport='unix' socket='${xml(socket)}'/>${reconnectDelayS === null ? '' : `\n        <reconnect delay='${Number(reconnectDelayS)}'/>`}
      </source>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='file'>
      <source path='${xml(serialLog)}'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
`;
}

/** `virsh -c URI ARGS` (default qemu:///system); rejects with virsh's own message. */
export async function virsh(args, uri = 'qemu:///system') {
  try {
    const { stdout } = await promisify(execFile)('virsh', ['-c', uri, ...args]);
    return stdout;
  } catch (err) {
    throw new Error(`virsh ${args.join(' ')}: ${(err.stderr || err.message).trim()}`);
  }
}
