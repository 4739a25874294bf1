// examples/kubevirt-hook/rewrite.mjs on its own: which <disk> elements become Mooring NBD
// disks, what of them is kept, and what is refused (the hook answers INVALID_ARGUMENT).
import { DOMParser, XMLSerializer, type Element } from '@xmldom/xmldom';
import { describe, expect, it } from 'vitest';

interface RewriteOptions {
  socketPathTemplate?: string;
  reconnectDelayS?: number;
}
interface RewriteModule {
  rewriteDomain(domainXml: string, vmiJson: string, opts?: RewriteOptions): string;
  planVolumes(vmiJson: string, opts?: RewriteOptions): { vmi: string; disks: Array<{ disk: string; volume: string; socket: string }> };
  checkOptions(opts?: RewriteOptions): Required<RewriteOptions>;
}
// A plain .mjs without type declarations: imported through a variable, typed here.
const REWRITE_MODULE = new URL('../../../examples/kubevirt-hook/rewrite.mjs', import.meta.url).href;
const { rewriteDomain, planVolumes, checkOptions } = (await import(REWRITE_MODULE)) as RewriteModule;

const QEMU_NS = 'http://libvirt.org/schemas/domain/qemu/1.0';

function domain(disks: string, extra = ''): string {
  return `<domain type="kvm" xmlns:qemu="${QEMU_NS}">
\t<name>default_vm1</name>
\t<devices>
${disks}
\t</devices>${extra}
</domain>`;
}

function vmi(annotation?: unknown, specDisks: unknown[] = []): string {
  const annotations = annotation === undefined ? {} : { 'mooring.io/volumes': typeof annotation === 'string' ? annotation : JSON.stringify(annotation) };
  return JSON.stringify({ metadata: { name: 'vm1', namespace: 'default', annotations }, spec: { domain: { devices: { disks: specDisks } } } });
}

const fileDisk = (name: string, dev: string, more = '') =>
  `\t\t<disk device="disk" type="file"><source file="/var/run/kubevirt-private/vmi-disks/${name}/disk.img"></source><target bus="virtio" dev="${dev}"></target>` +
  `<driver cache="writethrough" error_policy="stop" name="qemu" type="raw" io="native" discard="unmap"></driver>${more}<alias name="ua-${name}"></alias></disk>`;
const cdrom = `\t\t<disk device="cdrom" type="file"><source file="/var/run/kubevirt-private/vmi-disks/iso/disk.img"></source><target bus="sata" dev="sda" tray="closed"></target><driver name="qemu" type="raw"></driver><readonly></readonly><alias name="ua-iso"></alias></disk>`;

function parse(xml: string) {
  return new DOMParser().parseFromString(xml, 'text/xml');
}
function diskByAlias(xml: string, name: string): Element {
  const disks = Array.from(parse(xml).getElementsByTagName('disk'));
  const d = disks.find((el) => el.getElementsByTagName('alias')[0]?.getAttribute('name') === `ua-${name}`);
  if (!d) throw new Error(`no disk ua-${name} in\n${xml}`);
  return d;
}
const text = (el: Element) => new XMLSerializer().serializeToString(el);
const child = (el: Element, tag: string) => el.getElementsByTagName(tag)[0];

describe('rewriteDomain', () => {
  it('turns each named disk into an NBD disk on its own socket, keeping target, alias, boot order, serial, address and driver options', () => {
    const xml = domain(
      [
        fileDisk('rootdisk', 'vda', '<boot order="1"></boot><serial>ROOT-1</serial><address type="pci" domain="0x0000" bus="0x07" slot="0x00" function="0x0"></address>'),
        // a containerDisk placeholder: qcow2 over a backing file
        `\t\t<disk device="disk" type="file"><source file="/var/run/kubevirt-ephemeral-disks/disk-data/data/disk.qcow2"></source><target bus="virtio" dev="vdb"></target><driver error_policy="stop" name="qemu" type="qcow2" iothread="2" queues="2" discard="unmap"></driver><alias name="ua-data"></alias><backingStore type="file"><format type="qcow2"></format><source file="/var/run/kubevirt/container-disks/disk_0.img"></source></backingStore></disk>`,
        fileDisk('cloudinit', 'vdc'),
        cdrom,
      ].join('\n'),
    );
    const out = rewriteDomain(xml, vmi({ rootdisk: 'vm1-root', data: 'vm1-data' }), { socketPathTemplate: '/run/m/{volume}.sock' });

    const root = diskByAlias(out, 'rootdisk');
    expect(root.getAttribute('type')).toBe('network');
    expect(root.getAttribute('device')).toBe('disk');
    expect(text(child(root, 'source')!)).toBe('<source protocol="nbd"><host transport="unix" socket="/run/m/vm1-root.sock"/><reconnect delay="20"/></source>');
    // raw (the export's bytes), cache none unless the VMI asked, no io= (file backends only)
    expect(text(child(root, 'driver')!)).toBe('<driver cache="none" error_policy="stop" name="qemu" type="raw" discard="unmap"/>');
    expect(child(root, 'shareable')).toBeDefined();
    expect(text(child(root, 'target')!)).toBe('<target bus="virtio" dev="vda"/>');
    expect(child(root, 'boot')!.getAttribute('order')).toBe('1');
    expect(child(root, 'serial')!.textContent).toBe('ROOT-1');
    expect(child(root, 'address')!.getAttribute('bus')).toBe('0x07');

    const data = diskByAlias(out, 'data');
    expect(child(data, 'host')!.getAttribute('socket')).toBe('/run/m/vm1-data.sock');
    expect(text(child(data, 'driver')!)).toBe('<driver error_policy="stop" name="qemu" type="raw" iothread="2" queues="2" discard="unmap" cache="none"/>');
    expect(data.getElementsByTagName('backingStore')).toHaveLength(0);
    expect(data.getElementsByTagName('source')).toHaveLength(1);

    // Disks the annotation does not name, the cdrom among them, are untouched.
    for (const name of ['cloudinit', 'iso']) expect(text(diskByAlias(out, name))).toBe(text(diskByAlias(xml, name)));
  });

  it('keeps a cache mode the VMI disk asks for, omits <reconnect> at delay 0, leaves an existing <shareable/> alone', () => {
    const xml = domain(fileDisk('rootdisk', 'vda', '<shareable></shareable>'));
    const out = rewriteDomain(xml, vmi({ rootdisk: 'vm1-root' }, [{ name: 'rootdisk', disk: { bus: 'virtio' }, cache: 'writethrough' }]), { reconnectDelayS: 0 });
    const root = diskByAlias(out, 'rootdisk');
    expect(child(root, 'driver')!.getAttribute('cache')).toBe('writethrough');
    expect(text(child(root, 'source')!)).toBe('<source protocol="nbd"><host transport="unix" socket="/var/run/mooring/nbd/vm1-root.sock"/></source>');
    expect(root.getElementsByTagName('shareable')).toHaveLength(1);
  });

  it('rewrites a disk that is already a network disk, and rewriting its own output changes nothing', () => {
    const xml = domain(
      `\t\t<disk device="disk" type="network"><driver name="qemu" type="raw"></driver><source protocol="nbd" name="old"><host name="10.0.0.9" port="10809"></host></source><target bus="virtio" dev="vda"></target><alias name="ua-rootdisk"></alias></disk>`,
    );
    const once = rewriteDomain(xml, vmi({ rootdisk: 'vm1-root' }));
    expect(text(child(diskByAlias(once, 'rootdisk'), 'source')!)).toBe('<source protocol="nbd"><host transport="unix" socket="/var/run/mooring/nbd/vm1-root.sock"/><reconnect delay="20"/></source>');
    expect(rewriteDomain(once, vmi({ rootdisk: 'vm1-root' }))).toBe(once);
  });

  it('keeps XML namespaces, <qemu:commandline> and <metadata> as they were', () => {
    const extra = `
\t<qemu:commandline><qemu:arg value="-fw_cfg"></qemu:arg><qemu:arg value="name=opt/x,string=1"></qemu:arg></qemu:commandline>
\t<metadata><kubevirt xmlns="http://kubevirt.io"><uid>u-1</uid></kubevirt><app:note xmlns:app="urn:example:app">keep me</app:note></metadata>`;
    const xml = domain(fileDisk('rootdisk', 'vda'), extra);
    const out = rewriteDomain(xml, vmi({ rootdisk: 'vm1-root' }));
    const before = parse(xml).documentElement!;
    const after = parse(out).documentElement!;
    expect(after.getAttribute('xmlns:qemu')).toBe(QEMU_NS);
    expect(after.getElementsByTagNameNS(QEMU_NS, 'arg')).toHaveLength(2);
    expect(text(after.getElementsByTagName('qemu:commandline')[0]!)).toBe(text(before.getElementsByTagName('qemu:commandline')[0]!));
    expect(text(after.getElementsByTagName('metadata')[0]!)).toBe(text(before.getElementsByTagName('metadata')[0]!));
    expect(after.getElementsByTagNameNS('http://kubevirt.io', 'uid')[0]!.textContent).toBe('u-1');
  });

  it('returns the domain XML itself when the VMI has no annotation (not even parsed)', () => {
    expect(rewriteDomain('<domain><devices/></domain>  ', vmi())).toBe('<domain><devices/></domain>  ');
    expect(rewriteDomain('not xml at all', vmi())).toBe('not xml at all');
  });

  const refusals: Array<[string, string, string, RegExp]> = [
    ['the VMI is not JSON', domain(fileDisk('rootdisk', 'vda')), '{"metadata":', /the VMI is not JSON/],
    ['the VMI is an array', domain(fileDisk('rootdisk', 'vda')), '[]', /not a JSON object/],
    ['the annotation is not JSON', domain(fileDisk('rootdisk', 'vda')), vmi('{rootdisk: vm1-root}'), /mooring\.io\/volumes of VMI default\/vm1 is not JSON/],
    ['the annotation is a list', domain(fileDisk('rootdisk', 'vda')), vmi(['vm1-root']), /must be a JSON object mapping a VMI disk name/],
    ['a volume name with a slash', domain(fileDisk('rootdisk', 'vda')), vmi({ rootdisk: '../etc/passwd' }), /volume name for disk rootdisk must match .* \(got "\.\.\/etc\/passwd"\)/],
    ['a volume name of ".."', domain(fileDisk('rootdisk', 'vda')), vmi({ rootdisk: '..' }), /must match/],
    ['a volume name too long', domain(fileDisk('rootdisk', 'vda')), vmi({ rootdisk: 'v'.repeat(64) }), /must match/],
    ['a volume name that is a number', domain(fileDisk('rootdisk', 'vda')), vmi({ rootdisk: 7 }), /\(got 7\)/],
    ['two disks on one volume', domain(`${fileDisk('a', 'vda')}\n${fileDisk('b', 'vdb')}`), vmi({ a: 'v1', b: 'v1' }), /disks a and b both name volume v1/],
    ['a disk the domain does not have', domain(fileDisk('rootdisk', 'vda')), vmi({ datadisk: 'vm1-data' }), /no <disk> with <alias name="ua-datadisk"\/> for disk datadisk/],
    ['a cdrom', domain(cdrom), vmi({ iso: 'vm1-iso' }), /disk iso is a cdrom; only a device="disk"/],
    ['garbage for the domain', '\u0000\u00ff<<<garbage', vmi({ rootdisk: 'vm1-root' }), /the domain XML does not parse/],
    ['a document that is not a domain', '<network><name>x</name></network>', vmi({ rootdisk: 'vm1-root' }), /root element is <network>, not <domain>/],
  ];
  it.each(refusals)('refuses with INVALID_ARGUMENT: %s', (_what, xml, vmiJson, message) => {
    expect(() => rewriteDomain(xml, vmiJson)).toThrow(expect.objectContaining({ name: 'HookError', code: 'INVALID_ARGUMENT', message: expect.stringMatching(message) }));
  });

  it('refuses a socket path longer than a unix socket can have', () => {
    const opts = { socketPathTemplate: `/${'d'.repeat(100)}/{volume}.sock` };
    expect(() => rewriteDomain(domain(fileDisk('rootdisk', 'vda')), vmi({ rootdisk: 'vm1-root' }), opts)).toThrow(/longer than 107 bytes/);
  });
});

describe('planVolumes and checkOptions', () => {
  it('names the VMI and, per disk, its volume and socket', () => {
    expect(planVolumes(vmi({ rootdisk: 'vm1-root' }))).toEqual({
      vmi: 'default/vm1',
      disks: [{ disk: 'rootdisk', volume: 'vm1-root', socket: '/var/run/mooring/nbd/vm1-root.sock', cache: undefined }],
    });
    expect(planVolumes(vmi())).toEqual({ vmi: 'default/vm1', disks: [] });
  });

  it('refuses a template that is relative or has no {volume}, and a delay out of range', () => {
    expect(checkOptions()).toEqual({ socketPathTemplate: '/var/run/mooring/nbd/{volume}.sock', reconnectDelayS: 20 });
    expect(() => checkOptions({ socketPathTemplate: 'nbd/{volume}.sock' })).toThrow(/absolute path containing \{volume\}/);
    expect(() => checkOptions({ socketPathTemplate: '/run/nbd.sock' })).toThrow(/containing \{volume\}/);
    expect(() => checkOptions({ reconnectDelayS: -1 })).toThrow(/from 0 to 3600/);
    expect(() => checkOptions({ reconnectDelayS: 1.5 })).toThrow(/from 0 to 3600/);
  });
});
