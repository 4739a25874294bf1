#!/usr/bin/env node
// The control-plane store in etcd (docs/etcd.md): a VM manager opens Mooring over an
// EtcdStateStore, creates and attaches a volume while a watch on the store prints what
// changes, and closes; a second VM manager process (here: a second Mooring on a new
// connection, same host directory) finds the volume in etcd and attaches it again with a
// new writer epoch.
//
//   npm run build && node examples/etcd/demo.mjs [--endpoint http://127.0.0.1:2379]
// Needs an etcd 3.4+ at the endpoint (Debian: apt-get install etcd-server).
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { EtcdStateStore, Mooring } from '../../dist/index.js';

const MiB = 1024 * 1024;
const endpointArg = process.argv.indexOf('--endpoint');
const endpoint = endpointArg > 0 ? process.argv[endpointArg + 1] : 'http://127.0.0.1:2379';
const log = (line = '') => process.stdout.write(`${line}\n`);

const root = await mkdtemp(join(tmpdir(), 'mooring-etcd-demo-'));
// Every run under a prefix of its own, so runs do not see each other's volumes.
const prefix = `/mooring-demo-${process.pid}/`;
const open = [];
let failed = false;
try {
  // 1. A store over etcd (add `tls: { ca, cert, key }` and `auth: { username, password }`
  //    for a secured cluster), and a watch on the volume attachments it holds.
  const storeA = await EtcdStateStore.open({ endpoints: [endpoint], prefix, timeoutMs: 5000 });
  open.push(storeA);
  log(`store: etcd ${endpoint}, keys under ${prefix}`);
  const watch = await storeA.watch('volume', (change) => {
    log(`watch: ${change.type} volume${change.type === 'resync' ? 's' : `/${change.key}`}${change.type === 'put' ? ` (version ${change.version})` : ''}`);
  });

  // 2. The first VM manager: its host's data engine in `root`, its records in etcd.
  const first = await Mooring.open({ dir: root, hostId: 'h1', store: storeA, repairIntervalMs: 0 });
  open.push(first);
  const disk = await first.createVolume({ name: 'disk0', sizeBytes: 16 * MiB });
  const st = await disk.attach({ nbd: `unix:${join(root, 'disk0.sock')}` });
  log(`first manager: disk0 ${st.state} on ${st.attachedHost}, writer epoch ${st.epoch}`);
  await disk.detach();
  await watch.close();
  await first.close();
  log('first manager closed');

  // 3. Another manager on its own connection to etcd finds the volume and attaches it.
  const storeB = await EtcdStateStore.open({ endpoints: [endpoint], prefix });
  open.push(storeB);
  const second = await Mooring.open({ dir: root, hostId: 'h1', store: storeB, repairIntervalMs: 0 });
  open.push(second);
  log(`second manager sees: ${(await second.listVolumes()).map((v) => `${v.name} (${v.state})`).join(', ')}`);
  const again = await second.volume('disk0').attach({ nbd: `unix:${join(root, 'disk0-2.sock')}` });
  log(`second manager: disk0 ${again.state} on ${again.attachedHost}, writer epoch ${again.epoch}`);
  await second.volume('disk0').detach();
  await second.deleteVolume('disk0');
  log(`deleted; volumes left in etcd: ${(await storeB.list('volume')).length}`);
} catch (err) {
  failed = true;
  console.error(`demo failed: ${err.code ?? ''} ${err.message}`);
} finally {
  for (const o of open.reverse()) await o.close().catch(() => undefined);
  await rm(root, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
