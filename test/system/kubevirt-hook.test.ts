// examples/kubevirt-hook/hook.mjs driven as KubeVirt's virt-launcher drives it: a gRPC client
// on its unix socket calls Info and OnDefineDomain (every Callbacks version) with the
// example's domain XML and VMI, checks what comes back and what is refused, and boots the
// domain it returns under libvirt as a TCG guest reading and writing its disk through Mooring.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { DOMParser, XMLSerializer, type Document, type Element } from '@xmldom/xmldom';
import protobuf from 'protobufjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { guestImage } from './helpers/guest.js';
import { LibvirtDomain, validateDomainXml } from './helpers/libvirt.js';
import { NbdClient } from './helpers/nbd-client.js';
import { killAllServers, startServe } from './helpers/serve.js';
import { TempDir, repoRoot } from './helpers/tools.js';

const HOOK_DIR = join(repoRoot, 'examples', 'kubevirt-hook');
const PROTO_FILES = ['api_info.proto', 'api_v1alpha1.proto', 'api_v1alpha2.proto', 'api_v1alpha3.proto'];
const VERSIONS = ['v1alpha1', 'v1alpha2', 'v1alpha3'] as const;
const DOMAIN_XML = readFileSync(join(HOOK_DIR, 'domain.xml'), 'utf8');
const VMI_JSON = readFileSync(join(HOOK_DIR, 'vmi.json'), 'utf8');
const CALL_TIMEOUT_MS = 10_000;

/** hook.mjs as a child process; resolves once its socket exists. */
class Hook {
  stderr = '';
  readonly exited: Promise<number | null>;
  private constructor(
    readonly child: ChildProcess,
    readonly socket: string,
  ) {
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    // 'close', not 'exit': by then its stderr has been read to the end.
    this.exited = new Promise((r) => child.on('close', (code) => r(code)));
  }

  static async start(socket: string, args: string[] = []): Promise<Hook> {
    const child = spawn(process.execPath, [join(HOOK_DIR, 'hook.mjs'), '--socket', socket, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    const hook = new Hook(child, socket);
    // The log line comes once bindAsync has bound (a stale file at the path says nothing).
    for (const deadline = Date.now() + 10_000; !/listening on /.test(hook.stderr); await sleep(20)) {
      if (Date.now() > deadline || child.exitCode !== null) throw new Error(`hook did not start listening on ${socket}\n${hook.stderr}`);
    }
    return hook;
  }

  client<C extends grpc.Client>(service: string): C {
    const def = protoLoader.loadSync(PROTO_FILES, { includeDirs: [join(HOOK_DIR, 'proto')], keepCase: true, defaults: true });
    const ctor = service.split('.').reduce<unknown>((o, k) => (o as Record<string, unknown>)[k], grpc.loadPackageDefinition(def)) as typeof grpc.Client;
    return new ctor(`unix:${this.socket}`, grpc.credentials.createInsecure()) as C;
  }
}

type Reply = Record<string, unknown>;
function call(client: grpc.Client, method: string, request: object): Promise<Reply> {
  const fn = (client as unknown as Record<string, (req: object, opts: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res: Reply) => void) => void>)[method]!;
  return new Promise((resolve, reject) => fn.call(client, request, { deadline: Date.now() + CALL_TIMEOUT_MS }, (err, res) => (err ? reject(err) : resolve(res))));
}

const parse = (xml: string): Document => new DOMParser().parseFromString(xml, 'text/xml');
const serialize = (node: Document | Element): string => new XMLSerializer().serializeToString(node);
function diskByAlias(doc: Document, alias: string): Element {
  const d = Array.from(doc.getElementsByTagName('disk')).find((el) => el.getElementsByTagName('alias')[0]?.getAttribute('name') === alias);
  if (!d) throw new Error(`no <disk> with alias ${alias}`);
  return d;
}
function withoutDisk(xml: string, alias: string): string {
  const doc = parse(xml);
  const d = diskByAlias(doc, alias);
  d.parentNode!.removeChild(d);
  return serialize(doc);
}
function vmiWith(annotation: string | undefined): string {
  const vmi = JSON.parse(VMI_JSON) as { metadata: { annotations: Record<string, string> } };
  if (annotation === undefined) delete vmi.metadata.annotations['mooring.io/volumes'];
  else vmi.metadata.annotations['mooring.io/volumes'] = annotation;
  return JSON.stringify(vmi);
}
const onDefineDomain = (client: grpc.Client, domainXML: string | Buffer, vmi: string) =>
  call(client, 'OnDefineDomain', { domainXML: Buffer.from(domainXML), vmi: Buffer.from(vmi) }).then((r) => (r.domainXML as Buffer).toString('utf8'));

describe('examples/kubevirt-hook: the KubeVirt hook sidecar', () => {
  const tmp = new TempDir('mooring-kvh-');
  const nbdSocket = tmp.join('nbd', 'vm1-root.sock');
  let hook: Hook;
  let callbacks: Record<(typeof VERSIONS)[number], grpc.Client>;

  beforeAll(async () => {
    mkdirSync(tmp.join('nbd'));
    hook = await Hook.start(tmp.join('hook.sock'), ['--socket-path-template', tmp.join('nbd', '{volume}.sock'), '--wait-for-socket-ms', '5000', '--priority', '7']);
    callbacks = Object.fromEntries(VERSIONS.map((v) => [v, hook.client(`kubevirt.hooks.${v}.Callbacks`)])) as typeof callbacks;
  });
  afterAll(async () => {
    for (const c of Object.values(callbacks ?? {})) c.close();
    hook?.child.kill('SIGKILL');
    await killAllServers();
    tmp.cleanup();
  });

  it('the .proto files carry the message fields, numbers and methods of KubeVirt pkg/hooks', () => {
    const root = new protobuf.Root().loadSync(PROTO_FILES.map((f) => join(HOOK_DIR, 'proto', f)), { keepCase: true });
    const fields = (type: string) => Object.fromEntries(Object.values(root.lookupType(type).fields).map((f) => [f.name, `${f.id} ${f.repeated ? 'repeated ' : ''}${f.type}`]));
    expect(fields('kubevirt.hooks.info.InfoResult')).toEqual({ name: '1 string', hookPoints: '3 repeated HookPoint', versions: '4 repeated string' });
    expect(fields('kubevirt.hooks.info.HookPoint')).toEqual({ name: '1 string', priority: '2 int32' });
    for (const v of VERSIONS) {
      const p = `kubevirt.hooks.${v}`;
      expect(fields(`${p}.OnDefineDomainParams`)).toEqual({ domainXML: '1 bytes', vmi: '2 bytes' });
      expect(fields(`${p}.OnDefineDomainResult`)).toEqual({ domainXML: '1 bytes' });
      expect(Object.keys(root.lookupService(`${p}.Callbacks`).methods)).toEqual(['OnDefineDomain', 'PreCloudInitIso', 'Shutdown'].slice(0, VERSIONS.indexOf(v) + 1));
      if (v === 'v1alpha1') continue;
      expect(fields(`${p}.PreCloudInitIsoParams`)).toEqual({ cloudInitNoCloudSource: '1 bytes', vmi: '2 bytes', cloudInitData: '3 bytes' });
      expect(fields(`${p}.PreCloudInitIsoResult`)).toEqual({ cloudInitNoCloudSource: '1 bytes', cloudInitData: '3 bytes' });
    }
  });

  it('Info: name mooring, the OnDefineDomain hook point at its priority, three Callbacks versions', async () => {
    const info = await call(hook.client('kubevirt.hooks.info.Info'), 'Info', {});
    expect(info).toEqual({ name: 'mooring', hookPoints: [{ name: 'OnDefineDomain', priority: 7 }], versions: ['v1alpha1', 'v1alpha2', 'v1alpha3'] });
  });

  it('OnDefineDomain, every version: rootdisk becomes an NBD disk on the templated socket (waiting for it to appear), the rest of the domain is unchanged', async () => {
    // The first call waits for the socket, which appears (a stand-in listener) after 300 ms.
    const first = onDefineDomain(callbacks.v1alpha1, DOMAIN_XML, VMI_JSON);
    await sleep(300);
    const standIn: Server = createServer();
    await new Promise<void>((r) => standIn.listen(nbdSocket, r));
    try {
      const replies = [await first, ...(await Promise.all(VERSIONS.slice(1).map((v) => onDefineDomain(callbacks[v], DOMAIN_XML, VMI_JSON))))];
      for (const xml of replies) {
        expect(xml).toBe(replies[0]);
        expect(withoutDisk(xml, 'ua-rootdisk')).toBe(withoutDisk(DOMAIN_XML, 'ua-rootdisk'));
      }
      const disk = diskByAlias(parse(replies[0]!), 'ua-rootdisk');
      expect(serialize(disk).replace(/>\s+</g, '><')).toBe(
        '<disk device="disk" type="network" model="virtio-non-transitional">' +
          `<source protocol="nbd"><host transport="unix" socket="${nbdSocket}"/><reconnect delay="20"/></source><shareable/>` +
          '<target bus="virtio" dev="vda"/><driver cache="none" error_policy="stop" name="qemu" type="raw" discard="unmap"/><alias name="ua-rootdisk"/></disk>',
      );
      // What libvirt 9.0 (Debian 12) accepts, but for <reconnect delay>, which its schema predates.
      await validateDomainXml(replies[0]!.replace(/<reconnect [^>]*\/>/, ''), tmp.path);
    } finally {
      await new Promise((r) => standIn.close(r));
    }
  });

  it('OnDefineDomain without the annotation returns the domain byte for byte', async () => {
    expect(await onDefineDomain(callbacks.v1alpha3, DOMAIN_XML, vmiWith(undefined))).toBe(DOMAIN_XML);
  });

  it.each([
    ['an annotation that is not JSON', DOMAIN_XML, vmiWith('rootdisk=vm1-root'), /annotation mooring\.io\/volumes of VMI default\/vm1 is not JSON/],
    ['a volume name Mooring refuses', DOMAIN_XML, vmiWith('{"rootdisk":"vm1/root"}'), /volume name for disk rootdisk must match \[A-Za-z0-9\._-\]\{1,63\}/],
    ['a disk the domain does not have', DOMAIN_XML, vmiWith('{"datadisk":"vm1-data"}'), /the domain has no <disk> with <alias name="ua-datadisk"\/>/],
    ['garbage bytes for the domain XML', Buffer.from([0x00, 0xff, 0x13, 0x3c, 0x3c, 0x8a]), VMI_JSON, /the domain XML does not parse/],
    ['garbage for the VMI', DOMAIN_XML, '\u0000garbage', /the VMI is not JSON/],
  ])('OnDefineDomain refuses %s with INVALID_ARGUMENT, and the hook keeps serving', async (_what, domainXML, vmi, message) => {
    const err = (await onDefineDomain(callbacks.v1alpha3, domainXML, vmi).then(
      () => null,
      (e: unknown) => e,
    )) as grpc.ServiceError | null;
    expect(err?.code, String(err)).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err!.details).toMatch(message);
    expect((await call(hook.client('kubevirt.hooks.info.Info'), 'Info', {})).name).toBe('mooring');
  });

  it('PreCloudInitIso passes its input through; Shutdown answers empty; one log line per call', async () => {
    const input = { cloudInitNoCloudSource: Buffer.from('{"userData":"x"}'), vmi: Buffer.from(VMI_JSON), cloudInitData: Buffer.from('{"dataSource":"NoCloud"}') };
    expect(await call(callbacks.v1alpha2, 'PreCloudInitIso', input)).toEqual({ cloudInitNoCloudSource: input.cloudInitNoCloudSource, cloudInitData: input.cloudInitData });
    expect(await call(callbacks.v1alpha3, 'Shutdown', {})).toEqual({});
    // The hook logs before it answers, but its stderr pipe may reach us after the gRPC reply
    // (CI, under load: the last line was not read yet): wait for the lines, then check them.
    const lines = [
      /OnDefineDomain v1alpha1: default\/vm1: rootdisk -> vm1-root on \S+vm1-root\.sock/,
      /OnDefineDomain v1alpha3: INVALID_ARGUMENT: the domain XML does not parse/,
      /PreCloudInitIso v1alpha2: passed through/,
      /Shutdown v1alpha3: nothing to do/,
    ];
    for (const deadline = Date.now() + 10_000; !lines.every((l) => l.test(hook.stderr)) && Date.now() < deadline; ) await sleep(20);
    for (const l of lines) expect(hook.stderr).toMatch(l);
  });

  it('defaults and lifecycle: a stale socket is replaced, the default template is /var/run/mooring/nbd/{volume}.sock, a missing socket is FAILED_PRECONDITION, SIGTERM exits 0 and removes the socket', async () => {
    const socket = tmp.join('hook2.sock');
    // A socket file left by a process that died without closing it.
    spawnSync(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(socket)}, () => process.kill(process.pid, 'SIGKILL'))`]);
    expect(existsSync(socket)).toBe(true);
    const hook2 = await Hook.start(socket, ['--wait-for-socket-ms', '300']);
    try {
      const err = (await onDefineDomain(hook2.client('kubevirt.hooks.v1alpha3.Callbacks'), DOMAIN_XML, VMI_JSON).then(
        () => null,
        (e: unknown) => e,
      )) as grpc.ServiceError | null;
      expect(err?.code, String(err)).toBe(grpc.status.FAILED_PRECONDITION);
      expect(err!.details).toBe('no NBD socket /var/run/mooring/nbd/vm1-root.sock for volume vm1-root (VMI disk rootdisk) after 300 ms: is the volume attached on this host?');
      hook2.child.kill('SIGTERM');
      expect(await hook2.exited).toBe(0);
      expect(existsSync(socket)).toBe(false);
      expect(hook2.stderr).toMatch(/SIGTERM: stopped/);
    } finally {
      hook2.child.kill('SIGKILL');
    }
  });

  // ---- The boot: the domain the hook returns, under libvirt, reading its disk from Mooring. ----
  it('boots the returned domain under libvirt (TCG): the guest reads what Mooring holds and its write lands in the volume', async () => {
    const marker = 'MOORING-KUBEVIRT-HOOK-DISK';
    const image = await guestImage(`echo "ROOT: $(head -c ${marker.length} /dev/vda)"
printf 'WRITTEN-BY-THE-GUEST' | dd of=/dev/vda bs=4096 seek=1 conv=sync,notrunc oflag=direct status=none && echo GUEST_WROTE`);
    const server = await startServe({ dir: tmp.join('mooring'), size: '64M', nbd: `unix:${nbdSocket}`, extraArgs: ['--volume', 'vm1-root'] });
    const before = await NbdClient.connect(`unix:${nbdSocket}`);
    await before.write(0, Buffer.from(marker));
    await before.flush();
    await before.disconnect();

    const returned = await onDefineDomain(callbacks.v1alpha3, DOMAIN_XML, VMI_JSON);
    const vm = await LibvirtDomain.create(forThisMachine(returned, image, tmp.join('serial.log')), { dir: tmp.join('libvirt'), serialPath: tmp.join('serial.log') });
    try {
      await vm.waitForSerial(new RegExp(`ROOT: ${marker}`), 120_000);
      await vm.waitForSerial(/GUEST_WROTE/, 30_000);
      // libvirt handed QEMU the hook's disk: an NBD blockdev on the volume's socket.
      expect(vm.qemuLog()).toMatch(new RegExp(`"driver":"nbd","server":\\{"type":"unix","path":"${nbdSocket}"\\}`));
    } finally {
      await vm.destroy();
    }
    const after = await NbdClient.connect(`unix:${nbdSocket}`);
    expect((await after.read(4096, 20)).toString()).toBe('WRITTEN-BY-THE-GUEST');
    await after.disconnect();
    expect(await server.stop()).toBe(0);
  }, 240_000);
});

// The returned domain with what only exists inside a virt-launcher pod swapped for this
// machine's: TCG, the test kernel, a serial log file, no tap device or VNC socket. The disk
// stays exactly as the hook wrote it.
function forThisMachine(xml: string, image: { kernel: string; initrd: string }, serialPath: string): string {
  const doc = parse(xml);
  const root = doc.documentElement!;
  const one = (parent: Element, tag: string) => parent.getElementsByTagName(tag)[0]!;
  root.setAttribute('type', 'qemu');
  one(root, 'name').textContent = `mooring-kvh-${process.pid}`;
  root.removeChild(one(root, 'uuid'));
  one(root, 'kernel').textContent = image.kernel;
  one(root, 'initrd').textContent = image.initrd;
  one(root, 'cmdline').textContent = 'console=ttyS0 quiet panic=-1';
  // host-model needs KVM; TCG's fullest CPU is 'maximum'.
  one(root, 'cpu').setAttribute('mode', 'maximum');
  const devices = one(root, 'devices');
  for (const tag of ['interface', 'graphics', 'console']) devices.removeChild(one(devices, tag));
  const serial = one(devices, 'serial');
  while (serial.firstChild) serial.removeChild(serial.firstChild);
  serial.setAttribute('type', 'file');
  const source = doc.createElement('source');
  source.setAttribute('path', serialPath);
  serial.appendChild(source);
  return serialize(doc);
}
