// A `mooring data-engine` process's threads do not grow with the number of attached volumes,
// nor its file descriptors beyond a few per volume (issue 21; docs/architecture.md, "Threads"):
// the NBD connections are read by the connection loops once in transmission.
// volumes with a local replica, each started as an engine exported over NBD with a client
// connected, counted from /proc/<pid>/task and /proc/<pid>/fd at 25 and 50 volumes.
// Shape, not speed: nothing is timed.
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import type { DataEngineReadyInfo } from '../../src/cli/data-engine.js';
import { RemoteDataEngine } from '../../src/data-engine/grpc/remote-data-engine.js';
import { NbdClient } from './helpers/nbd-client.js';
import { MooringServer, cliPath, killAllServers } from './helpers/serve.js';
import { TempDir } from './helpers/tools.js';

const MiB = 1024 * 1024;
const STEPS = [25, 50];

function threadsOf(pid: number): Map<string, number> {
  const out = new Map<string, number>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const name = readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim();
      out.set(name, (out.get(name) ?? 0) + 1);
    } catch {
      // ended meanwhile
    }
  }
  return out;
}

const total = (m: Map<string, number>): number => [...m.values()].reduce((a, b) => a + b, 0);

describe('mooring data-engine: threads per attached volume', () => {
  let tmp: TempDir;
  beforeAll(() => {
    tmp = new TempDir('mooring-de-threads-');
  });
  afterEach(async () => {
    await killAllServers();
  });
  afterAll(() => tmp.cleanup());

  it('adds no thread per NBD connection, volume, engine or export', async () => {
    if (!existsSync(cliPath)) throw new Error(`${cliPath} is missing: run 'npm run build:ts' first`);
    const grpc = `unix:${tmp.join('de.sock')}`;
    const args = ['data-engine', '--dir', tmp.join('host'), '--host-id', 'host-1', '--listen', grpc, '--replica-listen', 'none'];
    const child = spawn(process.execPath, [cliPath, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    const proc = new MooringServer(child, `mooring ${args.join(' ')}`);
    const ready = await new Promise<DataEngineReadyInfo>((res, rej) => {
      const onData = (): void => {
        const m = /^READY (\{.*\})\s*$/m.exec(proc.stdout);
        if (!m) return;
        child.stdout!.off('data', onData);
        res(JSON.parse(m[1]!) as DataEngineReadyInfo);
      };
      child.stdout!.on('data', onData);
      void proc.exited.then(() => rej(new Error(`mooring data-engine exited before READY${proc.diagnostics()}`)));
    });
    const pid = child.pid!;
    const de = await RemoteDataEngine.connect({ address: ready.grpc });
    const clients: NbdClient[] = [];
    const counts: Array<{ n: number; threads: Map<string, number>; fds: number }> = [];
    try {
      for (const n of STEPS) {
        while (clients.length < n) {
          const i = clients.length;
          await de.createReplica(`v${i}-r0`, 4 * MiB);
          const sock = tmp.join(`v${i}.sock`);
          await de.startEngine({ volume: `v${i}`, replicas: [{ id: 'r0', hostId: 'host-1', name: `v${i}-r0`, address: null }], nbd: `unix:${sock}`, epoch: 1 });
          const c = await NbdClient.connect({ socketPath: sock });
          await c.write(0, Buffer.alloc(4096, i & 0xff));
          clients.push(c);
        }
        // Each handshake's thread ends once its client is in transmission.
        const until = Date.now() + 5000;
        while (threadsOf(pid).has('mr-nbd-hello')) {
          if (Date.now() > until) throw new Error('NBD handshake threads did not end');
          await new Promise((r) => setTimeout(r, 20));
        }
        counts.push({ n, threads: threadsOf(pid), fds: readdirSync(`/proc/${pid}/fd`).length });
      }
      for (const c of counts) {
        console.log(`data-engine: ${c.n} volumes: ${total(c.threads)} threads, ${c.fds} fds; ${JSON.stringify(Object.fromEntries(c.threads))}`);
      }
      const [a, b] = [counts[0]!, counts[1]!];
      const added = b.n - a.n;
      // Nothing per volume: the shared I/O pool and libuv's pool may start a few more, within
      // their bounds, whatever the number of volumes.
      expect(total(b.threads) - total(a.threads), JSON.stringify(Object.fromEntries(b.threads))).toBeLessThanOrEqual(8);
      expect(total(b.threads), 'issue 21: under 100 threads per data engine').toBeLessThan(100);
      expect(b.threads.get('mr-nbd-conn') ?? 0, 'no thread per NBD connection').toBe(0);
      expect(b.threads.get('mr-conn-loop') ?? 0).toBeLessThanOrEqual(2);
      expect(b.threads.get('mr-nbd-io') ?? 0).toBeLessThanOrEqual(64);
      expect(b.threads.get('mr-poller') ?? 0).toBe(1);
      // fds per volume: the replica's files, the export's listening socket and wake fd, the
      // connection's socket (its handshake's wake fd is closed once it is on a loop).
      expect((b.fds - a.fds) / added).toBeLessThanOrEqual(10);
    } finally {
      for (const c of clients) await c.disconnect().catch(() => undefined);
      await de.close();
    }
    expect(await proc.stop('SIGTERM'), proc.diagnostics()).toBe(0);
  });
});
