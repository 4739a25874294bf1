// A real QEMU guest for the benchmark's guest migrations and the system tests: the Debian
// cloud kernel and a busybox initramfs, booted under TCG (KVM does not work on these
// machines: docs in the research notes), with its disk on an NBD socket. The kernel and
// busybox are fetched with `apt-get download` (not installed) and unpacked once into a cache
// keyed by kernel version; each /init (a shell script run after the guest's disk appears)
// gets its own initramfs.
//
//   const image = await guestImage(writerScript({ blocks: 32768 }), cacheDir);
//   const vm = await Guest.start(image, { dir, nbdSocket });
//   await vm.waitForSerial(/^GUEST_READY$/m, 30_000);
//   await vm.qmp('stop'); await vm.quit();
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createConnection, type Socket } from 'node:net';
import { join } from 'node:path';
// Loaded in this order by /init; a module built into the kernel is skipped.
const MODULES = ['virtio_ring', 'virtio', 'virtio_pci_modern_dev', 'virtio_pci_legacy_dev', 'virtio_pci', 'virtio_blk'];

export interface GuestImage {
  kernelVersion: string;
  kernel: string;
  initrd: string;
}

interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

function run(cmd: string, args: string[], opts: { cwd?: string; timeoutMs?: number } = {}): Promise<RunResult> {
  return new Promise((resolve) => {
    execFile(cmd, args, { cwd: opts.cwd, timeout: opts.timeoutMs ?? 60_000, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : 127) : 0;
      resolve({ code, stdout, stderr: stderr || (err && code === 127 ? err.message : '') });
    });
  });
}

// Unpacks the cloud kernel apt offers now, its virtio modules and busybox into
// cacheRoot/<version>/ (once; a concurrent build loses the rename race harmlessly).
async function guestBase(cacheRoot: string): Promise<{ kernelVersion: string; dir: string }> {
  const apt = async (cmd: string, args: string[], cwd?: string) => {
    const r = await run(cmd, args, { timeoutMs: 300_000, ...(cwd !== undefined ? { cwd } : {}) });
    if (r.code !== 0) throw new Error(`guest image: '${cmd} ${args.join(' ')}' failed (exit ${r.code}); the guest needs the Debian packages linux-image-cloud-amd64's kernel and busybox-static from apt\n${r.stdout}\n${r.stderr}`);
    return r.stdout;
  };
  const deps = await apt('apt-cache', ['depends', 'linux-image-cloud-amd64']);
  const kernelVersion = /Depends: linux-image-(\S+-cloud-amd64)/.exec(deps)?.[1];
  if (!kernelVersion) throw new Error(`guest image: no versioned kernel in 'apt-cache depends linux-image-cloud-amd64':\n${deps}`);
  const dir = join(cacheRoot, kernelVersion);
  if (existsSync(join(dir, 'done'))) return { kernelVersion, dir };
  mkdirSync(cacheRoot, { recursive: true });
  const work = mkdtempSync(join(cacheRoot, 'build-'));
  try {
    chmodSync(work, 0o755); // apt's _apt user writes the downloads when it can
    await apt('apt-get', ['download', `linux-image-${kernelVersion}`, 'busybox-static'], work);
    for (const deb of readdirSync(work).filter((f) => f.endsWith('.deb'))) await apt('dpkg-deb', ['-x', deb, 'x'], work);
    const root = join(work, 'root');
    mkdirSync(join(root, 'bin'), { recursive: true });
    mkdirSync(join(root, 'mod'));
    cpSync(join(work, 'x/bin/busybox'), join(root, 'bin/busybox'));
    cpSync(join(work, `x/boot/vmlinuz-${kernelVersion}`), join(work, 'vmlinuz'));
    const modDir = join(work, 'x/lib/modules', kernelVersion);
    const builtin = readFileSync(join(modDir, 'modules.builtin'), 'utf8');
    const files = readdirSync(join(modDir, 'kernel'), { recursive: true }) as string[];
    for (const m of MODULES) {
      const f = files.find((p) => p.endsWith(`/${m}.ko`));
      if (f) cpSync(join(modDir, 'kernel', f), join(root, 'mod', `${m}.ko`));
      else if (!builtin.includes(`/${m}.ko`)) throw new Error(`guest image: kernel ${kernelVersion} has no module ${m} (plain .ko) and does not build it in`);
    }
    rmSync(join(work, 'x'), { recursive: true, force: true });
    for (const f of readdirSync(work).filter((f) => f.endsWith('.deb'))) rmSync(join(work, f));
    writeFileSync(join(work, 'done'), '');
    try {
      renameSync(work, dir);
    } catch {
      if (!existsSync(join(dir, 'done'))) throw new Error(`guest image: could not move ${work} to ${dir}`);
    }
    return { kernelVersion, dir };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/**
 * The kernel and an initramfs whose /init mounts /dev, /proc and /sys, loads the virtio
 * modules, waits for /dev/vda, lets every kernel message reach the console (`quiet` only
 * hides the boot), prints GUEST_READY on a line of its own (after the firmware's escape codes) and runs `script` (busybox sh), then idles.
 * The kernel, busybox and initramfs files are cached under `cacheRoot`.
 */
export async function guestImage(script: string, cacheRoot: string): Promise<GuestImage> {
  const { kernelVersion, dir } = await guestBase(cacheRoot);
  const init = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /dev /proc /sys; mount -t devtmpfs dev /dev; mount -t proc proc /proc; mount -t sysfs sys /sys
for m in ${MODULES.join(' ')}; do [ -e /mod/$m.ko ] && { insmod /mod/$m.ko || echo "GUEST_FAIL insmod $m"; }; done
while [ ! -b /dev/vda ]; do sleep 0.1; done
echo 7 > /proc/sys/kernel/printk
echo; echo GUEST_READY
${script}
while :; do sleep 3600; done
`;
  const initrd = join(dir, `initrd-${createHash('sha256').update(init).digest('hex').slice(0, 12)}.gz`);
  if (!existsSync(initrd)) {
    const stage = mkdtempSync(join(dir, 'stage-'));
    try {
      cpSync(join(dir, 'root'), stage, { recursive: true });
      writeFileSync(join(stage, 'init'), init, { mode: 0o755 });
      // The host has no cpio; busybox's makes the newc archive.
      const r = await run('sh', ['-c', `find . | ${join(dir, 'root/bin/busybox')} cpio -o -H newc 2>/dev/null | gzip -1 > ${initrd}.tmp && mv ${initrd}.tmp ${initrd}`], { cwd: stage });
      if (r.code !== 0) throw new Error(`guest image: building the initramfs failed (exit ${r.code})\n${r.stderr}`);
    } finally {
      rmSync(stage, { recursive: true, force: true });
    }
  }
  return { kernelVersion, kernel: join(dir, 'vmlinuz'), initrd };
}

/**
 * A /init workload: writes 4 KiB block i (O_DIRECT) with `MOORING-GUEST SEQ <i, 12 digits>`
 * then NULs, for i = 0, 1, 2... up to `blocks` (then idles); prints `CNT i <uptime s>` after
 * each `every` blocks written (blocks 0..i-1 acknowledged) and `DDERR i` when a write fails
 * (it is retried a second later). Check the disk with verifySeqBlocks.
 */
export function writerScript(opts: { blocks: number; every?: number }): string {
  const every = opts.every ?? 50;
  return `i=0
while [ $i -lt ${opts.blocks} ]; do
  if printf 'MOORING-GUEST SEQ %012d\\n' $i | dd of=/dev/vda bs=4096 seek=$i conv=sync,notrunc oflag=direct status=none; then
    i=$((i+1)); [ $((i % ${every})) -eq 0 ] && { read up idle < /proc/uptime; echo "CNT $i $up"; }
  else echo "DDERR $i"; sleep 1; fi
done
echo "WRITER_DONE $i"`;
}

/**
 * Checks a disk written by writerScript: blocks [0, n) hold their own sequence number and
 * blocks [n, end) are zero. Returns n, or throws naming the first bad block.
 */
export async function verifySeqBlocks(read: (offset: number, length: number) => Promise<Buffer>, sizeBytes: number): Promise<number> {
  const zero = Buffer.alloc(4096);
  let n = -1;
  for (let off = 0; off < sizeBytes; off += 1 << 20) {
    const chunk = await read(off, Math.min(1 << 20, sizeBytes - off));
    for (let at = 0; at < chunk.length; at += 4096) {
      const block = (off + at) / 4096;
      const got = chunk.subarray(at, at + 4096);
      const want = Buffer.alloc(4096);
      want.write(`MOORING-GUEST SEQ ${String(block).padStart(12, '0')}\n`);
      if (n < 0 && got.equals(want)) continue;
      if (n < 0) n = block;
      if (!got.equals(zero)) throw new Error(`block ${block} (first unwritten block ${n}): expected ${n === block ? 'its sequence number or zeros' : 'zeros'}, got ${JSON.stringify(got.subarray(0, 40).toString('latin1'))}`);
    }
  }
  return n < 0 ? sizeBytes / 4096 : n;
}

export interface GuestOptions {
  /** Where the serial log, QMP socket and QEMU's output go. */
  dir: string;
  /** The NBD server's unix socket: the guest's /dev/vda (virtio-blk). */
  nbdSocket: string;
  /** The NBD client's reconnect-delay in seconds (default 20: a missed backoff slot is no EIO). */
  reconnectDelayS?: number;
  memMiB?: number;
  /** More QEMU arguments, e.g. ['-incoming', 'defer']. */
  extraArgs?: string[];
}

/** A running QEMU (TCG) with its serial console in DIR/serial.log and QMP on DIR/qmp.sock. */
export class Guest {
  stderr = '';
  readonly serialPath: string;
  readonly qmpPath: string;
  readonly exited: Promise<void>;
  private qmpSocket: Socket | null = null;
  private qmpBuf = '';
  private qmpWaiters: Array<(msg: Record<string, unknown>) => void> = [];
  private readonly eventListeners = new Set<(event: { event: string; data?: Record<string, unknown> }) => void>();

  private constructor(
    readonly child: ChildProcess,
    readonly opts: GuestOptions,
  ) {
    this.serialPath = join(opts.dir, 'serial.log');
    this.qmpPath = join(opts.dir, 'qmp.sock');
    child.stdout!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    this.exited = new Promise((r) => child.on('exit', () => r()));
  }

  static start(image: GuestImage, opts: GuestOptions): Guest {
    mkdirSync(opts.dir, { recursive: true });
    const serial = join(opts.dir, 'serial.log');
    writeFileSync(serial, '');
    const args = [
      '-accel', 'tcg', '-cpu', 'max', '-M', 'q35', '-m', String(opts.memMiB ?? 256), '-smp', '1',
      '-nodefaults', '-nographic', '-no-reboot',
      '-kernel', image.kernel, '-initrd', image.initrd, '-append', 'console=ttyS0 quiet panic=-1',
      '-serial', `file:${serial}`, '-qmp', `unix:${join(opts.dir, 'qmp.sock')},server=on,wait=off`,
      '-blockdev', `driver=nbd,server.type=unix,server.path=${opts.nbdSocket},node-name=disk0,cache.direct=on,reconnect-delay=${opts.reconnectDelayS ?? 20}`,
      '-device', 'virtio-blk-pci,drive=disk0,id=vblk0',
      ...(opts.extraArgs ?? []),
    ];
    return new Guest(spawn('qemu-system-x86_64', args, { stdio: ['ignore', 'pipe', 'pipe'] }), opts);
  }

  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  serial(): string {
    return readFileSync(this.serialPath, 'utf8');
  }

  /** Polls the serial log until `re` matches (returns the match); throws with diagnostics on timeout or exit. */
  async waitForSerial(re: RegExp, timeoutMs: number): Promise<RegExpMatchArray> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const m = this.serial().match(re);
      if (m) return m;
      if (!this.alive || Date.now() > deadline) throw new Error(`guest: no ${re} in the serial log after ${timeoutMs} ms${this.diagnostics()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Runs a QMP command (connecting and negotiating on first use); returns its `return`, throws its `error`. */
  async qmp(execute: string, args?: Record<string, unknown>): Promise<unknown> {
    if (!this.qmpSocket) {
      const greeting = new Promise((r) => this.qmpWaiters.push(r));
      const sock = createConnection(this.qmpPath);
      sock.setEncoding('utf8').on('data', (d: string) => {
        this.qmpBuf += d;
        for (let nl = this.qmpBuf.indexOf('\n'); nl >= 0; nl = this.qmpBuf.indexOf('\n')) {
          const msg = JSON.parse(this.qmpBuf.slice(0, nl)) as Record<string, unknown>;
          this.qmpBuf = this.qmpBuf.slice(nl + 1);
          if (!('event' in msg)) this.qmpWaiters.shift()?.(msg);
          else for (const l of this.eventListeners) l(msg as { event: string; data?: Record<string, unknown> });
        }
      });
      await new Promise<void>((resolve, reject) => sock.once('connect', resolve).once('error', reject)).catch((err: unknown) => {
        this.qmpWaiters = [];
        throw err;
      });
      this.qmpSocket = sock;
      await greeting;
      await this.qmp('qmp_capabilities');
    }
    const reply = new Promise<Record<string, unknown>>((r) => this.qmpWaiters.push(r));
    this.qmpSocket.write(JSON.stringify({ execute, ...(args ? { arguments: args } : {}) }) + '\n');
    const msg = await reply;
    if ('error' in msg) throw new Error(`QMP ${execute}: ${JSON.stringify(msg.error)}`);
    return msg.return;
  }

  /**
   * Resolves with the data of the first QMP event named `name` for which `match` holds (QMP
   * must be connected already: events before the first command are lost), or rejects after
   * `timeoutMs` or when QEMU exits.
   */
  nextEvent(name: string, match: (data: Record<string, unknown>) => boolean, timeoutMs: number): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      const done = (fn: () => void): void => {
        clearTimeout(timer);
        this.eventListeners.delete(listener);
        fn();
      };
      const listener = (e: { event: string; data?: Record<string, unknown> }): void => {
        if (e.event === name && match(e.data ?? {})) done(() => resolve(e.data ?? {}));
      };
      const timer = setTimeout(() => done(() => reject(new Error(`QMP: no ${name} event within ${timeoutMs} ms${this.diagnostics()}`))), timeoutMs);
      this.eventListeners.add(listener);
      void this.exited.then(() => done(() => reject(new Error(`QMP: QEMU exited before the ${name} event${this.diagnostics()}`))));
    });
  }

  /** QMP `quit` and wait for the exit; SIGKILL if that fails or takes over 10 s. Safe to call twice. */
  async quit(): Promise<void> {
    if (this.alive) await Promise.race([this.qmp('quit').catch(() => undefined), new Promise((r) => setTimeout(r, 10_000))]);
    if (!(await Promise.race([this.exited.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 10_000))]))) this.kill();
    await this.exited;
    this.qmpSocket?.destroy();
  }

  kill(): void {
    if (this.alive) this.child.kill('SIGKILL');
  }

  /** For assertion messages: the serial log's tail and QEMU's output. */
  diagnostics(): string {
    const state = this.alive ? 'running' : `exited code=${this.child.exitCode} signal=${this.child.signalCode}`;
    return `\n--- guest serial log (tail) ---\n${this.serial().slice(-4000)}\n--- qemu (${state}) stderr ---\n${this.stderr.slice(-4000)}`;
  }
}
