#!/usr/bin/env node
// A volume across three hosts, kept by a Mooring.
//
// Three data engines run in this process (in production each host runs its own, in the
// VM manager's process or as `mooring data-engine`, reached over gRPC). Mooring places
// one replica per host, attaches the volume on host a (its engine reaches b's and c's
// replicas over the replica protocol) and keeps its decisions in a FileStateStore. Then
// host c goes away and comes back: the volume runs degraded meanwhile, and c's replica is
// rebuilt without being asked, sending only what changed. Last, hosts b and c are lost for
// good: a alone is no majority, so the volume is salvaged from a's replica
// (docs/salvage.md), and b's and c's replicas are replaced on two new hosts, d and e.
//
//   npm run build && node examples/cluster/demo.mjs
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { Mooring, FileStateStore, LocalDataEngine, MooringError } from '../../dist/index.js';

const MiB = 1024 * 1024;
const log = (line = '') => process.stdout.write(`${line}\n`);
const root = await mkdtemp(join(tmpdir(), 'mooring-cluster-demo-'));
const engines = {};
let store;
let mooring;
let failed = false;

const startHost = async (id, port) => {
  // Fixed loopback addresses and ports, so a restarted host is found where it was.
  engines[id] = await LocalDataEngine.start({ dir: join(root, id), hostId: id, replicaListen: `tcp:127.0.0.1:${port}`, repair: { firstRetryMs: 300 } });
  return engines[id];
};
const show = async (what) => {
  const st = await mooring.volume('disk0').status();
  log(`${what}: ${st.state}, attached on ${st.attachedHost ?? '-'}, epoch ${st.epoch}; ` + st.replicas.map((r) => `${r.id}@${r.hostId}=${r.mode}`).join(' '));
  return st;
};

try {
  const a = await startHost('a', 17901);
  const b = await startHost('b', 17902);
  const c = await startHost('c', 17903);
  a.watch((e) => e.type.startsWith('rebuild-c') && log(`  ${e.type}: replica ${e.replicaId}, ${e.sentBytes} bytes sent`));
  store = await FileStateStore.open(join(root, 'state'));
  mooring = await Mooring.open({ store, hosts: [a, b, c], repairIntervalMs: 500 });

  await mooring.createVolume({ name: 'disk0', sizeBytes: 64 * MiB, replicas: 3, hosts: ['a', 'b', 'c'] });
  const st = await mooring.volume('disk0').attach({ host: 'a', nbd: `unix:${join(root, 'disk0.sock')}` });
  log(`NBD for QEMU: ${st.nbd.uri}`);
  await show('attached');

  // Host c goes away (its data engine stops). The engine on a notices at the next write or
  // keepalive; the volume keeps serving from a and b.
  await c.close();
  await sleep(3000);
  await show('host c down');

  // Host c comes back with the same directory: a's data engine re-adds its replica.
  await mooring.addHost(await startHost('c', 17903));
  for (let i = 0; i < 60 && (await mooring.volume('disk0').status()).state !== 'healthy'; i++) await sleep(250);
  await show('host c back');

  // Hosts b and c are lost for good. Two new hosts join; the operator salvages the volume.
  await engines.b.close();
  await engines.c.close();
  await mooring.addHost(await startHost('d', 17904));
  await mooring.addHost(await startHost('e', 17905));
  const salvaged = await mooring.volume('disk0').salvage({ timeoutMs: 60_000 });
  log(`salvaged from ${salvaged.sourceReplicas.join(', ')} on ${salvaged.hostId}; left out ${salvaged.goneReplicas.join(', ')}; complete: ${salvaged.complete}`);
  await show('after the salvage');

  await mooring.volume('disk0').detach();
  await mooring.deleteVolume('disk0');
  log('detached and deleted');
} catch (err) {
  failed = true;
  log(`failed: ${err instanceof MooringError ? `${err.code}: ` : ''}${err.message}`);
} finally {
  await mooring?.close();
  await store?.close();
  for (const e of Object.values(engines)) await e.close().catch(() => undefined);
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
