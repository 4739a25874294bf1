// A small VM manager on Mooring: QEMU guests whose disks are Mooring volumes, driven over
// QMP on a unix socket, each started by its host's agent (host-agent.mjs) holding the VM's
// sanlock disk lock. It boots a VM on a host, live-migrates it to another host with the
// wiring of docs/migration.md (pause-before-switchover, the hand-over at pre-switchover with
// the disk lock moving with the volume's writer, rollback whenever QEMU does not complete),
// and restarts it on another host once its host is dead (the lock makes that wait until
// sanlock says the old host can no longer run it).
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

import { Qmp } from './qemu-qmp.mjs';

export class VmManager {
  /**
   * @param {object} o
   * @param {import('../../dist/index.js').Mooring} o.mooring
   * @param {Map<string, {agent: import('./hosts.mjs').HostAgent, sanlockHostId: number}>} o.hosts  host id -> its agent and lockspace host id
   * @param {string} o.runDir  sockets and QEMU state go here
   * @param {{kernel: string, initrd: string, append?: string} | null} o.boot  direct kernel boot, or null to boot from the disk
   * @param {number} [o.memMiB]
   * @param {'kvm' | 'tcg'} [o.accel]  tcg runs anywhere (slowly); kvm needs /dev/kvm
   */
  constructor({ mooring, hosts, runDir, boot, memMiB = 256, accel = 'kvm' }) {
    Object.assign(this, { mooring, hosts, runDir, boot, memMiB, accel });
    /** name -> { host, key, qmp, socket, serialPath } */
    this.vms = new Map();
    this.seq = 0;
  }

  #qemuArgs(socket, extra) {
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

  /** Starts a QEMU for `name` on `host` through its agent, holding `lock` (or nothing). */
  async #launch(key, host, socket, lock, extra = []) {
    const dir = join(this.runDir, key);
    mkdirSync(dir, { recursive: true });
    const serialPath = join(dir, 'serial.log');
    const qmpPath = join(dir, 'qmp.sock');
    const logPath = join(dir, 'qemu.log');
    const args = [...this.#qemuArgs(socket, extra), '-serial', `file:${serialPath}`, '-qmp', `unix:${qmpPath},server=on,wait=off`];
    const { exited } = await this.hosts.get(host).agent.startQemu(key, args, lock, logPath);
    const qmp = new Qmp(qmpPath, exited);
    try {
      await qmp.connect();
    } catch (err) {
      throw new Error(`${err.message}\n${readFileSync(logPath, 'utf8')}`);
    }
    return { host, key, qmp, socket, serialPath };
  }

  /** Creates the VM's disk lock (once per VM, before its first start). */
  async define(name) {
    await this.hosts.values().next().value.agent.call('createLock', { name });
  }

  /** Attaches the VM's volume on `host` for a workload and boots QEMU there holding the VM's lock. */
  async start(name, host) {
    const socket = this.#socket(name, host);
    await this.mooring.volume(name).attach({ host, attacher: 'workload', nbd: `unix:${socket}` });
    const vm = await this.#launch(`${name}-qemu-${++this.seq}`, host, socket, name);
    this.vms.set(name, vm);
    return vm;
  }

  /**
   * Live-migrates the VM to `target`. Resolves with QEMU's downtime once it runs there; on
   * any failure the migration is rolled back, the VM (and its lock) stay where they were,
   * and the error is thrown. `beforeContinue` (tests) runs after the hand-over, before
   * migrate-continue, with the destination's agent and QEMU key.
   */
  async migrate(name, target, { beforeContinue } = {}) {
    const vm = this.vms.get(name);
    const src = vm.qmp;
    const agent = this.hosts.get(target).agent;
    const socket = this.#socket(name, target);
    const key = `${name}-qemu-${++this.seq}`;
    const locks = { source: this.hosts.get(vm.host).agent.lockHolder(vm.key), target: agent.lockHolder(key), lockspaces: [] };
    const migration = await this.mooring.volume(name).migrate(target, { nbd: `unix:${socket}`, attacher: 'workload', locks });
    const migSocket = join(this.runDir, `${name}-mig-${++this.seq}.sock`);
    let dst = null;
    try {
      // Registered with the target's sanlock, holding nothing until the hand-over.
      dst = await this.#launch(key, target, socket, null, ['-incoming', `unix:${migSocket}`]);
      await src.execute('migrate-set-capabilities', { capabilities: [{ capability: 'events', state: true }, { capability: 'pause-before-switchover', state: true }] });
      const paused = src.migrationStatus(['pre-switchover', 'failed', 'cancelled']);
      await src.execute('migrate', { uri: `unix:${migSocket}` });
      if ((await paused) !== 'pre-switchover') throw new Error('QEMU gave up before the switch-over');
      // The source VM is stopped, drained and flushed: the volume's writer and the disk lock move now.
      await migration.handOver();
      await beforeContinue?.(agent, key);
      const ended = src.migrationStatus(['completed', 'failed', 'cancelled']);
      await src.execute('migrate-continue', { state: 'pre-switchover' });
      const status = await ended;
      if (status !== 'completed') throw new Error(`the migration ${status} after the hand-over`);
      const { downtime } = await src.execute('query-migrate');
      // Quit the source first (its held export answers its last flush), then confirm.
      await src.quit();
      await migration.confirm();
      this.vms.set(name, dst);
      return { downtimeMs: downtime };
    } catch (err) {
      // QEMU may have resumed the source by itself already: its I/O waits in the held
      // export until the rollback makes the source the writer again (and its lock is back).
      await src.execute('migrate_cancel').catch(() => undefined);
      await agent.call('kill', { key }).catch(() => undefined);
      dst?.qmp.close();
      await migration.rollback();
      const { status } = await src.execute('query-status');
      if (status !== 'running') await src.execute('cont');
      throw err;
    }
  }

  /**
   * The VM's host died: once `host`'s sanlock says the dead host is dead (its lease expired,
   * 8 × io_timeout + 60 s after its last renewal: its QEMU cannot be running any more, or its
   * watchdog reset it), attach the volume on `host`, which takes it over with a newer writer
   * epoch, and boot the VM there holding its lock.
   */
  async recover(name, host) {
    const vm = this.vms.get(name);
    vm.qmp.close();
    this.vms.delete(name);
    await this.hosts.get(host).agent.waitHost(this.hosts.get(vm.host).sanlockHostId, 'dead');
    return this.start(name, host);
  }

  async stop(name) {
    const vm = this.vms.get(name);
    if (!vm) return;
    await vm.qmp.quit();
    await this.mooring.volume(name).detach({ host: vm.host });
    this.vms.delete(name);
  }

  /** Kills every QEMU left (cleanup). */
  async killAll() {
    for (const vm of this.vms.values()) await this.hosts.get(vm.host)?.agent.call('kill', { key: vm.key }).catch(() => undefined);
  }
}
