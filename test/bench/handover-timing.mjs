// Hand-over timing (not a test, no assertions): how long deactivate (drain + flush of the
// source) and activate (epoch claim on the target) take, over ROUNDS hand-overs that ping-pong
// a volume between two engines. Run after `npm run build`:
//   node test/bench/handover-timing.mjs [rounds]
// Scenarios: engines in this process over three local replica directories; engines as on two
// hosts (each opens its "own" replica directly and the other's through a replica server
// over loopback TCP); and the DataEngine calls (LocalDataEngine, and RemoteDataEngine over
// gRPC on a unix socket) between two data engines, one replica each.
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';

import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

import { DataEngineGrpcServer, LocalDataEngine, RemoteDataEngine } from '../../dist/index.js';
import { LocalEngine as Engine } from '../../dist/internal.js';

// The addon as the library loads it (build/Release first, then prebuilds/).
const loadAddon = () => createRequire(import.meta.url)('node-gyp-build')(fileURLToPath(new URL('../..', import.meta.url)));

const ROUNDS = Number(process.argv[2] ?? 50);
// Epochs are allocated by whoever starts engines (docs/single-writer.md); this script is
// the only one here, so a counter above the clock in microseconds will do.
let lastEpoch = 0;
const nextEpoch = () => (lastEpoch = Math.max(lastEpoch + 1, Date.now() * 1000));
const MiB = 1024 * 1024;
const root = mkdtempSync(join(tmpdir(), 'mooring-handover-timing-'));

function stats(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  return `median ${q(0.5).toFixed(2)}  p90 ${q(0.9).toFixed(2)}  p99 ${q(0.99).toFixed(2)}  max ${s[s.length - 1].toFixed(2)} ms`;
}

async function pingPong(name, a, b, dirty) {
  const deact = [], act = [], total = [];
  let [src, dst] = [a, b];
  for (let i = 0; i < ROUNDS; i++) {
    if (dirty) await dirty(src, i);
    const t0 = performance.now();
    const h = await src.deactivate();
    const t1 = performance.now();
    await dst.activate(h, { epoch: nextEpoch() });
    const t2 = performance.now();
    deact.push(t1 - t0); act.push(t2 - t1); total.push(t2 - t0);
    [src, dst] = [dst, src];
  }
  console.log(`${name} (${ROUNDS} hand-overs)`);
  console.log(`  deactivate (drain, flush)      ${stats(deact)}`);
  console.log(`  activate (claim)               ${stats(act)}`);
  console.log(`  source flushed -> target serves ${stats(total)}`);
}

// 1 MiB of fresh data in 4 writes before each hand-over, so the flush has work to do.
const dirty = async (engine, i) => {
  for (let k = 0; k < 4; k++) await engine.write(((i * 4 + k) % 60) * MiB, randomBytes(256 * 1024));
};

try {
  const addon = loadAddon();
  // 1. Three local replicas, two engines in one process.
  {
    const dirs = [0, 1, 2].map((i) => join(root, 'local', `r${i}`));
    mkdirSync(join(root, 'local'));
    for (const d of dirs) await addon.createReplica(d, 64 * MiB);
    const specs = dirs.map((path, i) => ({ id: `r${i}`, path }));
    const a = await Engine.open({ epoch: nextEpoch(), replicas: specs });
    const b = await Engine.open({ epoch: nextEpoch(), replicas: specs, standby: true });
    await pingPong('engines, 3 local replicas', a, b, dirty);
    await a.close(); await b.close();
  }
  // 2. Two "hosts": each engine opens one replica directly and the other over TCP.
  {
    const hostDirs = [0, 1].map((i) => join(root, `host${i}`));
    for (const h of hostDirs) {
      mkdirSync(h);
      await addon.createReplica(join(h, 'vol'), 64 * MiB);
    }
    const servers = await Promise.all(hostDirs.map((r) => addon.startReplicaServer({ root: r })));
    const remote = (i) => ({ id: `r${i}`, remote: { host: '127.0.0.1', port: servers[i].port, name: 'vol' } });
    const local = (i) => ({ id: `r${i}`, path: join(hostDirs[i], 'vol') });
    const a = await Engine.open({ epoch: nextEpoch(), replicas: [local(0), remote(1)] });
    const b = await Engine.open({ epoch: nextEpoch(), replicas: [remote(0), local(1)], standby: true });
    await pingPong('engines as on two hosts (1 local + 1 remote replica each)', a, b, dirty);
    await a.close(); await b.close();
    for (const s of servers) await s.close();
  }
  // 3. DataEngine calls, two data engines, one replica each (no writes between rounds).
  for (const grpc of [false, true]) {
    const des = [], closers = [];
    for (const hostId of ['h1', 'h2']) {
      const local = await LocalDataEngine.start({ dir: join(root, `de-${grpc}-${hostId}`), hostId });
      closers.push(() => local.close());
      let de = local;
      if (grpc) {
        const server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${join(root, `${hostId}-${grpc}.sock`)}` });
        de = await RemoteDataEngine.connect({ address: server.address });
        closers.push(() => server.close(), () => de.close());
      }
      await de.createReplica('vol-r', 64 * MiB);
      des.push({ de, address: (await local.info()).replicaAddress });
    }
    const replicas = des.map((d, i) => ({ id: `r${i}`, hostId: `h${i + 1}`, name: 'vol-r', address: d.address }));
    await des[0].de.startEngine({ volume: 'vol', replicas, epoch: nextEpoch() });
    await des[1].de.startEngine({ volume: 'vol', replicas, standby: true });
    const wrap = (de) => ({ deactivate: () => de.deactivateEngine('vol'), activate: (h, o) => de.activateEngine('vol', h, o) });
    await pingPong(`DataEngine calls, ${grpc ? 'RemoteDataEngine over gRPC (unix socket)' : 'LocalDataEngine'}`, wrap(des[0].de), wrap(des[1].de));
    for (const d of des) await d.de.stopEngine('vol');
    for (const c of closers.reverse()) await c();
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
