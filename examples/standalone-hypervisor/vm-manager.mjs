// A small VM manager on Mooring: QEMU guests whose disks are Mooring volumes, driven over
// QMP on a unix socket. It boots a VM on a host, live-migrates it to another host with the
// wiring of docs/migration.md (pause-before-switchover, the hand-over at pre-switchover,
// rollback whenever QEMU does not complete), and restarts it on another host once its host
// is dead. A real VM manager runs one QEMU per host through that host's agent; here every
// QEMU runs on this machine and "host" only says which data engine serves its disk.
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { createConnection } from 'node:net';
import { join } from 'node:path';

/** One QEMU process and its QMP connection (commands in order, events to listeners). */
export class Qemu {
  #sock = null;
  #buf = '';
  #waiters = [];
  #listeners = new Set();
  stderr = '';

  constructor(args, dir) {
    mkdirSync(dir, { recursive: true });
    this.qmpPath = join(dir, 'qmp.sock');
    this.child = spawn('qemu-system-x86_64', [...args, '-qmp', `unix:${this.qmpPath},server=on,wait=off`], { stdio: ['ignore', 'ignore', 'pipe'] });
    this.child.stderr.setEncoding('utf8').on('data', (d) => (this.stderr += d));
    this.exited = new Promise((r) => this.child.once('exit', r));
  }

  get alive() {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  async connect(timeoutMs = 30_000) {
    const deadline = Date.now() + timeoutMs;
    while (!this.#sock) {
      try {
        const sock = createConnection(this.qmpPath);
        await new Promise((resolve, reject) => sock.once('connect', resolve).once('error', reject));
        sock.setEncoding('utf8').on('data', (d) => this.#onData(d));
        const greeting = new Promise((r) => this.#waiters.push(r));
        this.#sock = sock;
        await greeting;
        await this.qmp('qmp_capabilities');
      } catch (err) {
        if (!this.alive) throw new Error(`QEMU exited: ${this.stderr.trim()}`);
        if (Date.now() > deadline) throw new Error(`QMP at ${this.qmpPath} did not answer: ${err.message}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  }

  #onData(d) {
    this.#buf += d;
    for (let nl = this.#buf.indexOf('\n'); nl >= 0; nl = this.#buf.indexOf('\n')) {
      const msg = JSON.parse(this.#buf.slice(0, nl));
      this.#buf = this.#buf.slice(nl + 1);
      if (msg.event) for (const l of this.#listeners) l(msg);
      else this.#waiters.shift()?.(msg);
    }
  }

  async qmp(execute, args) {
    const reply = new Promise((r) => this.#waiters.push(r));
    this.#sock.write(`${JSON.stringify({ execute, ...(args ? { arguments: args } : {}) })}\n`);
    const msg = await reply;
    if (msg.error) throw new Error(`QMP ${execute}: ${msg.error.desc}`);
    return msg.return;
  }

  /** The data of the next MIGRATION event whose status is one of `statuses`. */
  migrationStatus(statuses, timeoutMs = 120_000) {
    return new Promise((resolve, reject) => {
      const stop = () => {
        clearTimeout(timer);
        this.#listeners.delete(listener);
      };
      const listener = (e) => {
        if (e.event === 'MIGRATION' && statuses.includes(e.data.status)) {
          stop();
          resolve(e.data.status);
        }
      };
      const timer = setTimeout(() => {
        stop();
        reject(new Error(`no MIGRATION event in ${statuses.join('/')} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#listeners.add(listener);
    });
  }

  async quit() {
    if (this.alive) await this.qmp('quit').catch(() => undefined);
    await Promise.race([this.exited, new Promise((r) => setTimeout(r, 10_000))]);
    this.kill();
    this.#sock?.destroy();
  }

  kill() {
    if (this.alive) this.child.kill('SIGKILL');
  }
}

export class VmManager {
  /**
   * @param {object} o
   * @param {import('../../dist/index.js').Mooring} o.mooring
   * @param {string} o.runDir  sockets and QEMU state go here
   * @param {{kernel: string, initrd: string, append?: string} | null} o.boot  direct kernel boot, or null to boot from the disk
   * @param {number} [o.memMiB]
   * @param {'kvm' | 'tcg'} [o.accel]  tcg runs anywhere (slowly); kvm needs /dev/kvm
   */
  constructor({ mooring, runDir, boot, memMiB = 256, accel = 'kvm' }) {
    this.accel = accel;
    this.mooring = mooring;
    this.runDir = runDir;
    this.boot = boot;
    this.memMiB = memMiB;
    /** name -> { host, qemu, socket } */
    this.vms = new Map();
    this.seq = 0;
  }

  #qemuArgs(socket, extra = []) {
    const boot = this.boot ? ['-kernel', this.boot.kernel, '-initrd', this.boot.initrd, '-append', this.boot.append ?? 'console=ttyS0 quiet panic=-1'] : [];
    return [
      '-accel', this.accel, '-cpu', this.accel === 'kvm' ? 'host' : 'max', '-M', 'q35', '-m', String(this.memMiB), '-smp', '1', '-nodefaults', '-nographic', '-no-reboot', ...boot,
      // reconnect-delay: QEMU waits for a server that restarts (a takeover recreates the export).
      '-blockdev', `driver=nbd,server.type=unix,server.path=${socket},node-name=disk0,cache.direct=on,reconnect-delay=20`,
      '-device', 'virtio-blk-pci,drive=disk0,id=vblk0',
      ...extra,
    ];
  }

  #socket(name, host) {
    return join(this.runDir, `${name}-${host}-${++this.seq}.sock`);
  }

  #qemu(name, socket, extra) {
    const dir = join(this.runDir, `${name}-qemu-${++this.seq}`);
    mkdirSync(dir, { recursive: true });
    const serial = join(dir, 'serial.log');
    const q = new Qemu([...this.#qemuArgs(socket, extra), '-serial', `file:${serial}`], dir);
    q.serialPath = serial;
    return q;
  }

  /** Attaches the VM's volume on `host` for a workload and boots QEMU on its export. */
  async start(name, host) {
    const socket = this.#socket(name, host);
    await this.mooring.volume(name).attach({ host, attacher: 'workload', nbd: `unix:${socket}` });
    const qemu = this.#qemu(name, socket, []);
    await qemu.connect();
    this.vms.set(name, { host, qemu, socket });
    return qemu;
  }

  /**
   * Live-migrates the VM to `target`. Resolves with QEMU's downtime once it runs there; on
   * any failure the migration is rolled back, the VM runs on where it was, and the error
   * is thrown. `beforeContinue` (tests) runs after the hand-over, before migrate-continue.
   */
  async migrate(name, target, { beforeContinue } = {}) {
    const vm = this.vms.get(name);
    const socket = this.#socket(name, target);
    const migration = await this.mooring.volume(name).migrate(target, { nbd: `unix:${socket}`, attacher: 'workload' });
    const migSocket = join(this.runDir, `${name}-mig-${++this.seq}.sock`);
    const dst = this.#qemu(name, socket, ['-incoming', `unix:${migSocket}`]);
    try {
      await dst.connect();
      await vm.qemu.qmp('migrate-set-capabilities', { capabilities: [{ capability: 'events', state: true }, { capability: 'pause-before-switchover', state: true }] });
      const paused = vm.qemu.migrationStatus(['pre-switchover', 'failed', 'cancelled']);
      await vm.qemu.qmp('migrate', { uri: `unix:${migSocket}` });
      if ((await paused) !== 'pre-switchover') throw new Error('QEMU gave up before the switch-over');
      // The source VM is stopped, drained and flushed: the volume's writer moves now.
      await migration.handOver();
      await beforeContinue?.(dst);
      const ended = vm.qemu.migrationStatus(['completed', 'failed', 'cancelled']);
      await vm.qemu.qmp('migrate-continue', { state: 'pre-switchover' });
      const status = await ended;
      if (status !== 'completed') throw new Error(`the migration ${status} after the hand-over`);
      const { downtime } = await vm.qemu.qmp('query-migrate');
      // Quit the source first (its held export answers its last flush), then confirm.
      await vm.qemu.quit();
      await migration.confirm();
      this.vms.set(name, { host: target, qemu: dst, socket });
      return { downtimeMs: downtime };
    } catch (err) {
      // QEMU may have resumed the source by itself already: its I/O waits in the held
      // export until the rollback makes the source the writer again.
      await vm.qemu.qmp('migrate_cancel').catch(() => undefined);
      dst.kill();
      await migration.rollback();
      const { status } = await vm.qemu.qmp('query-status');
      if (status !== 'running') await vm.qemu.qmp('cont');
      throw err;
    }
  }

  /**
   * The VM's host is dead (its QEMU with it): attach its volume on `host`, which takes the
   * volume over with a newer writer epoch, and boot it there.
   */
  async recover(name, host) {
    const vm = this.vms.get(name);
    vm?.qemu.kill();
    this.vms.delete(name);
    return this.start(name, host);
  }

  async stop(name) {
    const vm = this.vms.get(name);
    if (!vm) return;
    await vm.qemu.quit();
    await this.mooring.volume(name).detach({ host: vm.host });
    this.vms.delete(name);
  }
}
