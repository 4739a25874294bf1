// `mooring data-engine` as a real process with the real addon: READY, a round trip through
// RemoteDataEngine (replicas, an engine exported over NBD, data written and read back with
// a real NBD client and nbdinfo), SIGTERM stopping it cleanly (engines drained, replicas
// clean), a restart that finds its replicas and data again, and a migration hand-over
// between two such processes checked with qemu-io.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { DataEngineReadyInfo } from '../../src/cli/data-engine.js';
import { RemoteDataEngine } from '../../src/data-engine/grpc/remote-data-engine.js';
import { MooringError } from '../../src/errors.js';
import { makeHosts, type HostProcess } from './helpers/hosts.js';
import { NbdClient } from './helpers/nbd-client.js';
import { MooringServer, cliPath, killAllServers } from './helpers/serve.js';
import { TempDir, qemuIo, requireTool, run } from './helpers/tools.js';

const MiB = 1024 * 1024;

async function startDataEngine(args: string[]): Promise<{ proc: MooringServer; ready: DataEngineReadyInfo }> {
  if (!existsSync(cliPath)) throw new Error(`${cliPath} is missing: run 'npm run build' first`);
  const child = spawn(process.execPath, [cliPath, 'data-engine', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const proc = new MooringServer(child, `mooring data-engine ${args.join(' ')}`);
  const line = await new Promise<string>((res, rej) => {
    const t = setTimeout(() => rej(new Error(`no READY line${proc.diagnostics()}`)), 30_000);
    const onData = (): void => {
      const m = /^READY (\{.*\})\s*$/m.exec(proc.stdout);
      if (m) {
        clearTimeout(t);
        child.stdout!.off('data', onData);
        res(m[1]!);
      }
    };
    child.stdout!.on('data', onData);
    void proc.exited.then(() => {
      clearTimeout(t);
      rej(new Error(`mooring data-engine exited before READY${proc.diagnostics()}`));
    });
  });
  return { proc, ready: JSON.parse(line) as DataEngineReadyInfo };
}

describe('mooring data-engine (real process)', () => {
  let tmp: TempDir;
  beforeAll(() => {
    requireTool('nbdinfo');
    tmp = new TempDir('mooring-de-');
  });
  afterEach(async () => {
    await killAllServers();
  });
  afterAll(() => {
    tmp.cleanup();
  });

  it('serves over gRPC, exports an engine over NBD, stops cleanly on SIGTERM and finds its data after a restart', async () => {
    const grpc = `unix:${tmp.join('de.sock')}`;
    // The replica server (native) is not part of this test: it serves local replicas only.
    const args = ['--dir', tmp.join('host-1'), '--host-id', 'host-1', '--listen', grpc, '--replica-listen', 'none'];
    const first = await startDataEngine(args);
    expect(first.ready).toMatchObject({ hostId: 'host-1', grpc, replicaAddress: null, tls: false });

    const de = await RemoteDataEngine.connect({ address: first.ready.grpc });
    expect(de.hostId).toBe('host-1');
    await de.createReplica('disk-r0', 16 * MiB);
    await de.createReplica('disk-r1', 16 * MiB);
    const replicas = [
      { id: 'r0', hostId: 'host-1', name: 'disk-r0', address: null },
      { id: 'r1', hostId: 'host-1', name: 'disk-r1', address: null },
    ];
    const nbd = tmp.join('disk.sock');
    const engine = await de.startEngine({ volume: 'disk', replicas, nbd: `unix:${nbd}`, epoch: 1 });
    expect(engine.replicas.map((r) => r.mode)).toEqual(['RW', 'RW']);
    expect(engine.nbd!.uri).toBe(`nbd+unix:///?socket=${nbd}`);

    const size = await run('nbdinfo', ['--size', engine.nbd!.uri]);
    expect(size.stdout.trim()).toBe(String(16 * MiB));
    const data = Buffer.alloc(256 * 1024);
    for (let i = 0; i < data.length; i++) data[i] = (i * 31 + 7) & 0xff;
    const client = await NbdClient.connect({ socketPath: nbd });
    await client.write(3 * MiB, data);
    await client.flush();
    await client.disconnect();
    await de.close();

    // SIGTERM with the engine still running: it is drained and flushed, replicas marked clean.
    expect(await first.proc.stop('SIGTERM'), first.proc.diagnostics()).toBe(0);
    expect(first.proc.stderr).toContain('volume disk: engine stopped');
    expect(existsSync(tmp.join('de.sock'))).toBe(false);

    const second = await startDataEngine(args);
    const again = await RemoteDataEngine.connect({ address: second.ready.grpc });
    const listed = await again.listReplicas();
    expect(listed.map((r) => [r.name, r.sizeBytes, r.clean, r.inUse])).toEqual([
      ['disk-r0', 16 * MiB, true, false],
      ['disk-r1', 16 * MiB, true, false],
    ]);
    expect(await again.listEngines()).toEqual([]);
    // The replicas promised epoch 1 before the restart: the same epoch is refused, a new one serves.
    expect(await again.startEngine({ volume: 'disk', replicas, nbd: `unix:${nbd}`, epoch: 1 }).then(() => 'resolved', (e: unknown) => (e as MooringError).code)).toBe('STALE_EPOCH');
    const restarted = await again.startEngine({ volume: 'disk', replicas, nbd: `unix:${nbd}`, epoch: 2 });
    expect(restarted.epoch).toBe(2);
    expect(engine.epoch).toBe(1);
    const reader = await NbdClient.connect({ socketPath: nbd });
    expect(Buffer.compare(await reader.read(3 * MiB, data.length), data)).toBe(0);
    await reader.disconnect();
    await again.close();
    expect(await second.proc.stop('SIGINT'), second.proc.diagnostics()).toBe(0);
  });

  it('hands a volume over between two data-engine processes: qemu-io gets EPERM from the standby, then reads and writes through it; the source holds, then drops', async () => {
    requireTool('qemu-io');
    const hosts: HostProcess[] = makeHosts(tmp.join('ho'), 2, 17410);
    try {
      for (const host of hosts) await host.start();
      const [a, b] = [hosts[0]!, hosts[1]!];
      await a.engine.createReplica('mig-r0', 16 * MiB);
      await b.engine.createReplica('mig-r1', 16 * MiB);
      const replicas = [
        { id: 'r0', hostId: a.hostId, name: 'mig-r0', address: a.ready!.replicaAddress },
        { id: 'r1', hostId: b.hostId, name: 'mig-r1', address: b.ready!.replicaAddress },
      ];
      // Epochs as a control plane allocates them: 1 for the source, 2 for the target's activation.
      const src = await a.engine.startEngine({ volume: 'mig', replicas, nbd: `unix:${tmp.join('mig-a.sock')}`, epoch: 1 });
      const dst = await b.engine.startEngine({ volume: 'mig', replicas, nbd: `unix:${tmp.join('mig-b.sock')}`, standby: true });
      expect([src.role, dst.role, dst.epoch]).toEqual(['active', 'standby', 0]);
      const qemuIoRaw = (uri: string, cmds: string[]) => run('qemu-io', ['-f', 'raw', uri, ...cmds.flatMap((c) => ['-c', c])], { allowFailure: true });

      await qemuIo(src.nbd!.uri, ['write -P 0x5a 1M 256k', 'write -P 0xa5 9M 4k', 'flush']);
      // The standby's export: connects, but every request is refused.
      for (const cmd of ['read 1M 4k', 'write -P 1 0 4k']) {
        const r = await qemuIoRaw(dst.nbd!.uri, [cmd]);
        expect(r.stdout + r.stderr, cmd).toMatch(/Operation not permitted/);
      }

      const hand = await a.engine.deactivateEngine('mig');
      expect(hand).toEqual({ epoch: 1, generation: 1, rwReplicaIds: ['r0', 'r1'] });
      const active = await b.engine.activateEngine('mig', hand, { epoch: 2 });
      expect([active.role, active.epoch]).toEqual(['active', 2]);

      await qemuIo(dst.nbd!.uri, ['read -P 0x5a 1M 256k', 'read -P 0xa5 9M 4k', 'read -P 0 2M 1M', 'write -P 0x33 12M 64k', 'flush']);
      // The source after the hand-over holds what it is sent (a rollback would serve it).
      const late = qemuIoRaw(src.nbd!.uri, ['write -P 0x77 12M 4k']);
      await qemuIo(dst.nbd!.uri, ['read -P 0x33 12M 64k']);

      // Coded errors from the process for wrong states and unknown volumes. (A used hand-over
      // is refused with STALE_EPOCH too, test/unit/data-engine/data-engine-handover.test.ts,
      // but only after its claim fenced the writer, so it is not tried on the live target here.)
      const codeOf = (p: Promise<unknown>) => p.then(() => 'resolved', (e: unknown) => (e instanceof MooringError ? e.code : String(e)));
      expect(await codeOf(a.engine.deactivateEngine('mig'))).toBe('INVALID_STATE');
      expect(await codeOf(b.engine.activateEngine('mig', hand, { epoch: 3 }))).toBe('INVALID_STATE');
      expect(await codeOf(a.engine.activateEngine('mig', hand, { epoch: 0 }))).toBe('INVALID_ARGUMENT');
      expect(await codeOf(a.engine.deactivateEngine('nothing'))).toBe('NOT_FOUND');
      expect(await codeOf(b.engine.activateEngine('nothing', hand, { epoch: 3 }))).toBe('NOT_FOUND');

      // Stopped (a confirm), the source drops the held write unanswered: not applied.
      await a.engine.stopEngine('mig');
      const dropped = await late;
      expect(dropped.code, dropped.stdout + dropped.stderr).not.toBe(0);
      expect(dropped.stdout + dropped.stderr).not.toMatch(/Operation not permitted|wrote/);
      await qemuIo(dst.nbd!.uri, ['read -P 0x33 12M 64k', 'read -P 0x5a 1M 256k']);
      await b.engine.stopEngine('mig');
      const listed = [...(await a.engine.listReplicas()), ...(await b.engine.listReplicas())];
      expect(listed.map((r) => [r.name, r.epoch, r.clean])).toEqual([
        ['mig-r0', 2, true],
        ['mig-r1', 2, true],
      ]);
    } finally {
      for (const host of hosts) await host.stop().catch(() => undefined);
    }
  });

  it('refuses a second data engine on the same directory (BUSY, exit 1)', async () => {
    const dir = tmp.join('host-2');
    const first = await startDataEngine(['--dir', dir, '--host-id', 'host-2', '--listen', `unix:${tmp.join('h2.sock')}`, '--replica-listen', 'none']);
    const second = await run(process.execPath, [cliPath, 'data-engine', '--dir', dir, '--host-id', 'host-2', '--listen', `unix:${tmp.join('h2b.sock')}`, '--replica-listen', 'none'], { allowFailure: true });
    expect(second.code).toBe(1);
    expect(second.stderr).toMatch(/^mooring: BUSY: /m);
    expect(await first.proc.stop(), first.proc.diagnostics()).toBe(0);
  });
});
