// libvirt for system tests: Debian's libvirtd with the QEMU driver, started once per machine
// and left running (as a service would be), and transient domains (`virsh create`) that the
// tests boot from an XML document and destroy. QEMU runs under libvirt as root without
// dynamic ownership (.ci/setup.sh writes that into /etc/libvirt/qemu.conf), so it can open
// the tests' NBD sockets, kernel and serial log where they are. Missing pieces fail loudly.
import { execFile, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export const LIBVIRT_URI = 'qemu:///system';
const DAEMON_READY_TIMEOUT_MS = 30_000;
const PACKAGES = 'libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libxml2-utils';

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function run(cmd: string, args: string[], timeoutMs = 60_000): Promise<Run> {
  return new Promise((resolve) => {
    execFile(cmd, args, { timeout: timeoutMs, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : 127) : 0;
      resolve({ code, stdout, stderr: stderr || (err && code === 127 ? err.message : '') });
    });
  });
}

/** Throws naming the Debian packages when libvirt's daemon, client or XML validator is missing. */
export function requireLibvirt(): void {
  const missing = ['libvirtd', 'virtlogd', 'virsh', 'virt-xml-validate', 'xmllint'].filter((t) => spawnSync('sh', ['-c', `command -v ${t}`]).status !== 0);
  if (missing.length > 0) throw new Error(`libvirt is not installed (missing ${missing.join(', ')}): run 'apt-get install -y --no-install-recommends ${PACKAGES}' (or bash .ci/setup.sh)`);
}

/** `virsh -c qemu:///system ARGS`; throws with virsh's stderr on failure. */
export async function virsh(...args: string[]): Promise<string> {
  const r = await run('virsh', ['-c', LIBVIRT_URI, ...args]);
  if (r.code !== 0) throw new Error(`virsh ${args.join(' ')} failed (exit ${r.code}): ${r.stderr.trim() || r.stdout.trim()}`);
  return r.stdout;
}

let ready: Promise<void> | null = null;

/** Starts virtlogd and libvirtd unless libvirtd already answers; resolves once it does. */
export function ensureLibvirtd(): Promise<void> {
  ready ??= (async () => {
    requireLibvirt();
    const answers = async () => (await run('virsh', ['-c', LIBVIRT_URI, 'version'], 10_000)).code === 0;
    if (await answers()) return;
    mkdirSync('/var/log/libvirt/qemu', { recursive: true });
    // -d: both daemonize, like the services they are. A start that fails because another test
    // process started the daemon first (its pid file is taken) is fine: what counts is that
    // libvirtd answers in the end.
    const failures: string[] = [];
    for (const daemon of ['virtlogd', 'libvirtd']) {
      const r = await run(daemon, ['-d'], 30_000);
      if (r.code !== 0) failures.push(`${daemon} -d: exit ${r.code}: ${r.stderr.trim()}`);
    }
    const deadline = Date.now() + DAEMON_READY_TIMEOUT_MS;
    while (!(await answers())) {
      if (Date.now() > deadline) {
        const last = await run('virsh', ['-c', LIBVIRT_URI, 'version'], 10_000);
        throw new Error(`libvirtd did not answer on ${LIBVIRT_URI} within ${DAEMON_READY_TIMEOUT_MS} ms: ${last.stderr.trim()}${failures.length ? `\n${failures.join('\n')}` : ''}`);
      }
      await sleep(200);
    }
  })();
  ready.catch(() => (ready = null));
  return ready;
}

/** Checks `xml` against libvirt's own domain schema (virt-xml-validate). */
export async function validateDomainXml(xml: string, dir: string): Promise<void> {
  requireLibvirt();
  const file = join(dir, `validate-${Date.now()}.xml`);
  writeFileSync(file, xml);
  const r = await run('virt-xml-validate', [file, 'domain']);
  if (r.code !== 0) throw new Error(`virt-xml-validate rejects the domain XML (exit ${r.code}):\n${r.stderr}${r.stdout}\n${xml}`);
}

/** A transient domain: `virsh create` from XML, gone after destroy (or when QEMU exits). */
export class LibvirtDomain {
  private constructor(
    readonly name: string,
    readonly serialPath: string,
  ) {}

  /**
   * Boots `xml` (its name must be unique to the test; a leftover domain of that name from an
   * earlier run is destroyed first). `serialPath` is where the XML sends the serial console.
   */
  static async create(xml: string, opts: { dir: string; serialPath: string }): Promise<LibvirtDomain> {
    await ensureLibvirtd();
    const name = /<name>([^<]+)<\/name>/.exec(xml)?.[1];
    if (!name) throw new Error('domain XML has no <name>');
    if ((await run('virsh', ['-c', LIBVIRT_URI, 'domstate', name], 10_000)).code === 0) await virsh('destroy', name).catch(() => undefined);
    mkdirSync(opts.dir, { recursive: true });
    writeFileSync(opts.serialPath, '');
    const file = join(opts.dir, `${name}.xml`);
    writeFileSync(file, xml);
    const d = new LibvirtDomain(name, opts.serialPath);
    try {
      await virsh('create', file);
    } catch (err) {
      throw new Error(`${(err as Error).message}\n--- QEMU log ---\n${d.qemuLog()}`);
    }
    return d;
  }

  serial(): string {
    return existsSync(this.serialPath) ? readFileSync(this.serialPath, 'utf8') : '';
  }

  /** libvirt's log of this domain's QEMU (its command line and stderr). */
  qemuLog(): string {
    const f = `/var/log/libvirt/qemu/${this.name}.log`;
    return existsSync(f) ? readFileSync(f, 'utf8').slice(-8192) : `(no ${f})`;
  }

  async state(): Promise<string> {
    const r = await run('virsh', ['-c', LIBVIRT_URI, 'domstate', this.name], 10_000);
    return r.code === 0 ? r.stdout.trim() : 'gone';
  }

  /** Waits until the serial console matches `re`; throws with the console and QEMU's log. */
  async waitForSerial(re: RegExp, timeoutMs: number): Promise<RegExpExecArray> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const m = re.exec(this.serial());
      if (m) return m;
      const state = await this.state();
      if (Date.now() > deadline || state !== 'running')
        throw new Error(`domain ${this.name} (${state}): no ${re} on its serial console within ${timeoutMs} ms\n--- serial ---\n${this.serial().slice(-4096)}\n--- QEMU log ---\n${this.qemuLog()}`);
      await sleep(100);
    }
  }

  /** Powers the domain off at once (a transient domain is then gone). */
  async destroy(): Promise<void> {
    if ((await this.state()) !== 'gone') await virsh('destroy', this.name);
  }
}
