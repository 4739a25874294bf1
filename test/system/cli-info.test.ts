// `mooring info` with the real addon and a real `mooring serve`: it never claims a writer
// epoch (offline it reads under the volume's lock; while served it asks the server's status
// socket), so the server keeps writing and the next open's epoch is the one after the
// server's. Before, info opened the volume: every run claimed an epoch, and a served volume
// answered BUSY.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import { cliPath, startServe } from './helpers/serve.js';
import { qemuIo, run, TempDir } from './helpers/tools.js';

interface Info {
  epoch: number;
  servedBy: { pid: number; nbd: string | null } | null;
  replicas: { id: string; mode: string; epoch: number }[];
  snapshots: { name: string }[];
}

describe('mooring info', () => {
  const tmp = new TempDir('mooring-info-');
  afterAll(() => tmp.cleanup());

  const info = async (dir: string): Promise<Info> => {
    const r = await run(process.execPath, [cliPath, 'info', '--dir', dir, '--json']);
    return JSON.parse(r.stdout) as Info;
  };
  const lastEpoch = (dir: string): number => (JSON.parse(readFileSync(join(dir, 'volume.json'), 'utf8')) as { lastEpoch: number }).lastEpoch;

  it('reports a served volume live through its server, and an idle one without claiming an epoch', async () => {
    const dir = tmp.join('vol');
    const server = await startServe({ dir, size: '16M', replicas: 2 });
    await qemuIo(server.uri, ['write -P 0x33 0 1M']);
    const live = await info(dir);
    expect(live, server.diagnostics()).toMatchObject({ epoch: server.ready.epoch, servedBy: { pid: server.pid, nbd: server.ready.nbd } });
    expect(live.replicas.map((r) => `${r.id}:${r.mode}`)).toEqual(['r0:RW', 'r1:RW']);
    // The server is still the writer after being asked.
    await qemuIo(server.uri, ['write -P 0x44 1M 64k', 'read -P 0x33 0 1M']);
    expect(await server.stop()).toBe(0);

    for (let i = 0; i < 3; i++) {
      const idle = await info(dir);
      expect(idle).toMatchObject({ epoch: server.ready.epoch, servedBy: null });
      expect(idle.replicas.map((r) => r.epoch)).toEqual([server.ready.epoch, server.ready.epoch]);
    }
    expect(lastEpoch(dir)).toBe(server.ready.epoch);
    const again = await startServe({ dir });
    expect(again.ready.epoch, 'info handed out epochs').toBe(server.ready.epoch + 1);
    await qemuIo(again.uri, ['read -P 0x33 0 1M', 'read -P 0x44 1M 64k']);
    expect(await again.stop()).toBe(0);
  });
});
