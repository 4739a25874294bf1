#!/usr/bin/env node
// Upgrading the data engines of a cluster, host by host, with an upgrade session.
//
// Three hosts, each a `mooring data-engine` process this demo starts (in production each
// runs on its own machine, say as a systemd unit). A 3-replica volume is attached on host
// a (three, so that the engine keeps a majority while any one host restarts). The session takes each host in turn: it snapshots the volumes there, has the
// launcher replace the process (here: stop the child, start it again; a real launcher
// would start the new version's binary), waits until the host answers as a new process,
// starts the host's engines again and waits until every replica is RW again.
//
//   npm run build && node examples/upgrade/demo.mjs
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { FileStateStore, Mooring, MooringError } from '../../dist/index.js';
import { startDataEngineProcess } from '../shared/data-engine-process.mjs';

const MiB = 1024 * 1024;
const cli = join(dirname(fileURLToPath(import.meta.url)), '../../dist/cli.js');
const log = (line = '') => process.stdout.write(`${line}\n`);
const root = await mkdtemp(join(tmpdir(), 'mooring-upgrade-demo-'));
const hosts = new Map(); // host id -> { child, engine }
let store;
let mooring;
let failed = false;

async function startHost(id, port) {
  const { child, engine } = await startDataEngineProcess(root, id, port);
  hosts.set(id, { child, engine, port });
  return engine;
}

async function stopHost(id) {
  const h = hosts.get(id);
  await h.engine.close();
  h.child.kill('SIGTERM'); // engines drain and flush, replicas are marked clean
  await once(h.child, 'exit');
}

// The embedder's launcher: how a host's data engine is replaced by the new version.
const launcher = {
  async replace(hostId, dataEngine) {
    log(`  launcher: replacing ${hostId}'s data engine with ${dataEngine.version} (${dataEngine.command.join(' ')})`);
    await stopHost(hostId);
    return startHost(hostId, hosts.get(hostId).port);
  },
};

try {
  const a = await startHost('a', 17911);
  const b = await startHost('b', 17912);
  const c = await startHost('c', 17913);
  const version = (await a.info()).version;
  store = await FileStateStore.open(join(root, 'state'));
  mooring = await Mooring.open({ store, hosts: [a, b, c], repairIntervalMs: 500, dataEngineLauncher: launcher });
  await mooring.createVolume({ name: 'disk0', sizeBytes: 64 * MiB, replicas: 3 });
  const vol = mooring.volume('disk0');
  const st = await vol.attach({ host: 'a', nbd: `unix:${join(root, 'disk0.sock')}` });
  log(`attached on ${st.attachedHost}, writer epoch ${st.epoch}`);

  // `auto` will not restart host a under the volume's NBD client: it says why.
  try {
    await mooring.startUpgrade({ dataEngine: { version, command: [process.execPath, cli] } });
  } catch (err) {
    log(`auto refused: ${err.code}: ${err.details.reasons.map((r) => `${r.code} on ${r.host}`).join(', ')}`);
  }

  const session = await mooring.startUpgrade({ dataEngine: { version, command: [process.execPath, cli] }, method: 'restart' });
  session.on('host-state-changed', (e) => log(`  ${e.host}: ${e.state}`));
  session.on('volume-snapshotted', (e) => log(`  ${e.host}: snapshot ${e.snapshot} of ${e.volume}`));
  const done = await session.done();
  log(`session ${done.state}: ` + Object.values(done.hosts).map((h) => `${h.hostId} ${h.versionBefore} -> ${h.versionAfter}`).join(', '));

  const after = await vol.status();
  log(`volume ${after.state} on ${after.attachedHost}, writer epoch ${after.epoch}; ` + after.replicas.map((r) => `${r.id}@${r.hostId}=${r.mode}`).join(' '));
  await vol.detach();
} catch (err) {
  failed = true;
  log(`failed: ${err instanceof MooringError ? `${err.code}: ` : ''}${err.message}`);
} finally {
  await mooring?.close();
  await store?.close();
  for (const id of hosts.keys()) await stopHost(id).catch(() => undefined);
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
