// `mooring info` with the real addon, a real `mooring serve` and a second host (a `mooring
// data-engine` process): it never claims a writer epoch (offline it reads the store and this
// host's replica files under their locks; while served it asks the server's status
// socket), so the server keeps writing and the next serve's epoch is the one after the
// server's.
import { afterAll, afterEach, describe, expect, it } from 'vitest';

import { killAllServers, runCli } from './helpers/serve.js';
import { qemuIo, TempDir } from './helpers/tools.js';
import { VolumeFixture } from './helpers/volume.js';

interface Info {
  volume: string;
  epoch: number;
  state: string;
  servedBy: { pid: number; nbd: string | null } | null;
  replicas: { id: string; hostId: string; mode: string; epoch?: number; path?: string }[];
  snapshots: { name: string; labels: Record<string, string> }[];
}

describe('mooring info', () => {
  const tmp = new TempDir('mooring-info-');
  let vol: VolumeFixture | null = null;
  afterEach(async () => {
    await vol?.cleanup();
    vol = null;
    await killAllServers();
  });
  afterAll(() => tmp.cleanup());

  const info = async (dir: string): Promise<Info[]> => JSON.parse((await runCli(['info', '--dir', dir, '--json'])).stdout) as Info[];

  it('reports a served volume live through its server, and an idle one without claiming an epoch', async () => {
    vol = new VolumeFixture(16 * 1024 * 1024, 2);
    const server = await vol.start();
    await qemuIo(server.uri, ['write -P 0x33 0 1M']);
    const [live] = await info(vol.dir);
    expect(live, server.diagnostics()).toMatchObject({ volume: 'vol', state: 'healthy', epoch: server.ready.epoch, servedBy: { pid: server.pid, nbd: server.ready.nbd } });
    expect(live!.replicas.map((r) => `${r.hostId}:${r.mode}`).sort()).toEqual([`${server.ready.hostId}:RW`, 'peer1:RW'].sort());
    // The server is still the writer after being asked.
    await qemuIo(server.uri, ['write -P 0x44 1M 64k', 'read -P 0x33 0 1M']);
    await vol.stop();

    for (let i = 0; i < 3; i++) {
      const [idle] = await info(vol.dir);
      expect(idle).toMatchObject({ epoch: server.ready.epoch, state: 'detached', servedBy: null });
      // This host's replica is read from its files; the peer's shows what the store recorded.
      const mine = idle!.replicas.find((r) => r.hostId === server.ready.hostId)!;
      expect(mine).toMatchObject({ mode: 'RW', epoch: server.ready.epoch });
      expect(mine.path).toContain(`${vol.dir}/host/replicas/`);
      expect(idle!.replicas.find((r) => r.hostId === 'peer1')).toMatchObject({ mode: 'RW' });
    }
    const again = await vol.start();
    expect(again.ready.epoch, 'info handed out epochs').toBe(server.ready.epoch + 1);
    await qemuIo(again.uri, ['read -P 0x33 0 1M', 'read -P 0x44 1M 64k']);
    await vol.checkReplicas();
  });

  it('shows snapshots made by mooring snapshot, and names the volume it is asked about', async () => {
    const dir = tmp.join('two');
    expect((await runCli(['create', '--dir', dir, '--volume', 'a', '--size', '4M'])).stdout).toMatch(/^created volume a in .*: 4 MiB, 1 replica \(/);
    await runCli(['create', '--dir', dir, '--volume', 'b', '--size', '8M']);
    await runCli(['snapshot', 'create', '--dir', dir, '--volume', 'b', 'first', '--label', 'why=test']);
    const all = await info(dir);
    expect(all.map((v) => v.volume).sort()).toEqual(['a', 'b']);
    const [b] = JSON.parse((await runCli(['info', '--dir', dir, '--volume', 'b', '--json'])).stdout) as Info[];
    expect(b!.snapshots).toMatchObject([{ name: 'first', labels: { why: 'test' } }]);
    const missing = await runCli(['info', '--dir', dir, '--volume', 'c'], { allowFailure: true });
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^mooring: NOT_FOUND: .* holds no volume c/m);
    // Two volumes and no --volume: a usage error that says which.
    const which = await runCli(['snapshot', 'list', '--dir', dir], { allowFailure: true });
    expect(which.code).toBe(2);
    expect(which.stderr).toMatch(/holds 2 volumes \(a, b\): name one with --volume/);
  });
});
