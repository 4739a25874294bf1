#!/usr/bin/env node
// Two data engines on one machine and a volume across them.
//
// Host "a" runs in this process (LocalDataEngine). Host "b" is served over gRPC on a unix
// socket and used through RemoteDataEngine, exactly as a `mooring data-engine` process
// would be (here in the same process, so the example needs nothing else running). Each
// host holds one replica; the engine of volume "disk0" runs on a, reaches b's replica
// through b's replica server, and is exported over NBD.
//
//   npm run build && node examples/data-engine/demo.mjs
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { DataEngineGrpcServer, LocalDataEngine, MooringError, RemoteDataEngine } from '../../dist/index.js';

const MiB = 1024 * 1024;
const log = (line = '') => process.stdout.write(`${line}\n`);
const root = await mkdtemp(join(tmpdir(), 'mooring-de-demo-'));
const cleanup = [];
let failed = false;
try {
  // 1. Host b: a data engine with a replica server on loopback, served over gRPC.
  const bLocal = await LocalDataEngine.start({ dir: join(root, 'b'), hostId: 'b' });
  cleanup.unshift(() => bLocal.close());
  const bServer = await DataEngineGrpcServer.start({ engine: bLocal, listen: `unix:${join(root, 'b.sock')}` });
  cleanup.unshift(() => bServer.close());
  const b = await RemoteDataEngine.connect({ address: bServer.address });
  cleanup.unshift(() => b.close());
  log(`host b: gRPC ${bServer.address}, replicas served at ${(await b.info()).replicaAddress}`);

  // 2. Host a: in this process; it will run the engine.
  const a = await LocalDataEngine.start({ dir: join(root, 'a'), hostId: 'a', repair: { firstRetryMs: 500 } });
  cleanup.unshift(() => a.close());
  a.watch((e) => log(`  event on a: ${JSON.stringify(e)}`));
  log(`host a: in process, replicas served at ${(await a.info()).replicaAddress}`);

  // 3. One replica per host, then the engine on a over both.
  await a.createReplica('disk0-r0', 64 * MiB);
  await b.createReplica('disk0-r1', 64 * MiB);
  const engine = await a.startEngine({
    volume: 'disk0',
    replicas: [
      { id: 'r0', hostId: 'a', name: 'disk0-r0', address: null },
      { id: 'r1', hostId: 'b', name: 'disk0-r1', address: (await b.info()).replicaAddress },
    ],
    nbd: `unix:${join(root, 'disk0.sock')}`,
    // Writer epochs are allocated by the caller (a Mooring does it in its store): the first
    // engine over these new replicas gets 1, and every later one a higher one.
    epoch: 1,
  });
  log(`engine disk0 on a: ${engine.sizeBytes / MiB} MiB, epoch ${engine.epoch}`);
  for (const r of engine.replicas) log(`  replica ${r.id} on host ${r.hostId} (${r.name}): ${r.mode}`);
  log(`  NBD: ${engine.nbd.uri}   (try: nbdinfo '${engine.nbd.uri}')`);
  log(`replicas on b: ${(await b.listReplicas()).map((r) => `${r.name} in use=${r.inUse}`).join(', ')}`);

  // 4. Stop the engine (drain, flush, replicas clean) and look again.
  await a.stopEngine('disk0');
  log(`after stop: ${(await a.listReplicas()).map((r) => `${r.name} clean=${r.clean}`).join(', ')}; ` + `${(await b.listReplicas()).map((r) => `${r.name} clean=${r.clean}`).join(', ')}`);
} catch (err) {
  failed = true;
  log(`failed: ${err instanceof MooringError ? `${err.code}: ` : ''}${err.message}`);
} finally {
  for (const step of cleanup) await step().catch(() => undefined);
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
