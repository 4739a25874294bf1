// Resize (grow) with three `mooring data-engine` processes as hosts and real NBD clients.
// A volume served by an engine on host a (one local and two remote replicas) is grown while
// clients are connected: a raw NBD connection and an interactive qemu-io keep the size they
// negotiated (the NBD protocol has no way to tell them), writes past it are refused to
// them, while nbdinfo and qemu-io on new connections see the new size at once and write and
// read past the old end. Then the volume is grown detached (attached without frontend under a
// volume-expansion ticket for it). Every replica ends with the same size and the same bytes.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';

import type { VolumeResizedEvent } from '../../../src/volume/volume.js';
import { useHostCluster } from '../helpers/host-cluster.js';
import { readReplicas } from '../helpers/hosts.js';
import { CMD, NbdClient } from '../helpers/nbd-client.js';
import { qemuIo, requireTool, run } from '../helpers/tools.js';

const MiB = 1 << 20;
const VOLUME = 'grow-vol';
const NBD_ENOSPC = 28;

/** qemu-io kept running with one NBD connection, fed commands on stdin, as a VM's disk would stay connected. */
class QemuIoSession {
  #out = '';
  #prompts = 0;
  private constructor(readonly child: ChildProcessWithoutNullStreams) {
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      this.#out += d;
      this.#prompts += d.split('qemu-io> ').length - 1;
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => (this.#out += d));
  }

  static async open(uri: string): Promise<QemuIoSession> {
    requireTool('qemu-io');
    const s = new QemuIoSession(spawn('qemu-io', ['-f', 'raw', uri], { stdio: ['pipe', 'pipe', 'pipe'] }));
    await s.#waitPrompts(1);
    return s;
  }

  /** Runs one command and returns what it printed. */
  async cmd(command: string): Promise<string> {
    const from = this.#out.length;
    const want = this.#prompts + 1;
    this.child.stdin.write(`${command}\n`);
    await this.#waitPrompts(want);
    return this.#out.slice(from);
  }

  close(): void {
    this.child.stdin.end('quit\n');
    setTimeout(() => this.child.kill('SIGKILL'), 2000).unref();
  }

  async #waitPrompts(n: number): Promise<void> {
    const deadline = Date.now() + 30_000;
    while (this.#prompts < n) {
      if (Date.now() > deadline || this.child.exitCode !== null) throw new Error(`qemu-io did not answer:\n${this.#out}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

describe('three data-engine hosts: resize while clients are connected', () => {
  const env = useHostCluster({ hosts: 3, basePort: 17730, cluster: { repairIntervalMs: 0 } });
  const closers: Array<() => void> = [];

  afterEach(() => {
    for (const c of closers.splice(0)) c();
  });

  const sock = (): string => env.tmp.join(`${VOLUME}.sock`);
  const uri = (): string => `nbd+unix:///?socket=${sock()}`;
  const diag = (): string => env.hosts.map((h) => h.diagnostics()).join('');
  const nbdinfoSize = async (): Promise<number> => Number((await run('nbdinfo', ['--size', uri()])).stdout.trim());

  async function assertReplicasEqual(sizeBytes: number): Promise<void> {
    const st = await env.cluster.volume(VOLUME).status();
    expect(st.state).toBe('detached');
    const list = st.replicas.map((r) => ({ host: env.hosts.find((h) => h.hostId === r.hostId)!, name: r.name }));
    // readReplicas checks each replica's own size against sizeBytes before it reads.
    const contents = await readReplicas(list, sizeBytes);
    expect(contents).toHaveLength(3);
    expect(new Set(contents.map((c) => c.digest)).size, 'replicas differ after the resize').toBe(1);
  }

  it('grows an attached volume live: connected clients keep their size, new connections see the new one; then grows it detached', async () => {
    await env.cluster.createVolume({ name: VOLUME, sizeBytes: 16 * MiB, replicas: 3 });
    const vol = env.cluster.volume(VOLUME);
    const resized: VolumeResizedEvent[] = [];
    vol.on('resized', (e) => resized.push(e));
    await vol.attach({ host: 'a', nbd: `unix:${sock()}` });
    await qemuIo(uri(), ['write -P 0x51 0 1M', 'write -P 0x52 15M 1M']);

    const raw = await NbdClient.connect({ socketPath: sock() });
    closers.push(() => raw.destroy());
    const qio = await QemuIoSession.open(uri());
    closers.push(() => qio.close());
    expect(await qio.cmd('length')).toContain('16 MiB');
    expect(await vol.resize(8 * MiB).catch((e: { code?: string }) => e.code)).toBe('INVALID_ARGUMENT');

    // Grown under load: the connected client keeps writing inside its size meanwhile.
    const writes = Array.from({ length: 16 }, (_, i) => raw.write(2 * MiB + i * 65536, Buffer.alloc(65536, 0x53)));
    expect(await vol.resize(32 * MiB)).toEqual({ volume: VOLUME, oldSizeBytes: 16 * MiB, newSizeBytes: 32 * MiB });
    await Promise.all(writes);
    expect(resized).toEqual([{ volume: VOLUME, oldSizeBytes: 16 * MiB, newSizeBytes: 32 * MiB }]);
    expect((await vol.status()).sizeBytes).toBe(32 * MiB);

    // New connections: the new size at once, and room past the old end.
    expect(await nbdinfoSize(), diag()).toBe(32 * MiB);
    await qemuIo(uri(), ['write -P 0x54 24M 1M', 'write -P 0x55 32767k 1k', 'read -P 0x54 24M 1M', 'read -P 0x55 32767k 1k', 'read -P 0 16M 8M', 'read -P 0x51 0 1M', 'read -P 0x53 2M 1M', 'read -P 0x52 15M 1M']);

    // Connections negotiated before keep their size: the server holds them to it, and QEMU's
    // block layer does not even send a request past it.
    expect(raw.sizeBytes).toBe(16 * MiB);
    expect((await raw.rawRequest(CMD.WRITE, 0, 16 * MiB, 4096, Buffer.alloc(4096, 0x56))).error).toBe(NBD_ENOSPC);
    expect(await qio.cmd('length')).toContain('16 MiB');
    expect(await qio.cmd('write -P 0x56 24M 4k')).toMatch(/write failed: Input\/output error/);
    expect(await qio.cmd('read -P 0x51 0 4k')).toMatch(/read 4096\/4096 bytes/);
    qio.close();
    raw.destroy();

    await vol.detach();
    await assertReplicasEqual(32 * MiB);

    // Detached: each replica grows through its own data engine; the next attach serves it.
    await vol.resize(48 * MiB);
    expect(resized.at(-1)).toEqual({ volume: VOLUME, oldSizeBytes: 32 * MiB, newSizeBytes: 48 * MiB });
    await assertReplicasEqual(48 * MiB);
    await vol.attach({ host: 'b', nbd: `unix:${sock()}` });
    expect(await nbdinfoSize(), diag()).toBe(48 * MiB);
    await qemuIo(uri(), ['read -P 0x54 24M 1M', 'read -P 0 32M 16M', 'write -P 0x57 47M 1M', 'read -P 0x57 47M 1M']);
    await vol.detach();
    await assertReplicasEqual(48 * MiB);
  });
});
