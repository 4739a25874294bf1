#!/usr/bin/env node
// Live migration of a volume from host a to host b, the way a VM manager drives it around
// QEMU's migration (docs/migration.md). qemu-io stands in for the two QEMUs: one writes
// through a's export before the migration, the other reads through b's export after the
// hand-over.
//
// 1. A migratable 3-replica volume is attached on a for a VM (a `workload` ticket).
// 2. migrate('b') starts a standby engine on b over the same replicas; its export exists
//    (the destination QEMU connects) but serves nothing yet.
// 3. handOver() — at QEMU's `pre-switchover` — drains a, and b claims a new writer epoch.
// 4. confirm() — on `completed` — stops a's engine. (rollback() would go back to a.)
//
//   npm run build && node examples/migration/demo.mjs
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { Mooring, FileStateStore, LocalDataEngine, MooringError } from '../../dist/index.js';

const MiB = 1024 * 1024;
const log = (line = '') => process.stdout.write(`${line}\n`);
const qemuIo = async (socket, command) => {
  try {
    const { stdout } = await promisify(execFile)('qemu-io', ['-f', 'raw', `nbd+unix:///?socket=${socket}`, '-c', command]);
    return stdout.trim().split('\n')[0];
  } catch (err) {
    if (err.code === 'ENOENT') throw new Error('qemu-io is not installed (apt-get install qemu-utils)');
    return `refused: ${(err.stderr || err.stdout || err.message).trim().split('\n')[0]}`;
  }
};

const root = await mkdtemp(join(tmpdir(), 'mooring-migration-demo-'));
const engines = [];
let store;
let mooring;
let failed = false;

try {
  for (const [i, id] of ['a', 'b', 'c'].entries()) {
    engines.push(await LocalDataEngine.start({ dir: join(root, id), hostId: id, replicaListen: `tcp:127.0.0.1:${17911 + i}` }));
  }
  store = await FileStateStore.open(join(root, 'state'));
  mooring = await Mooring.open({ store, hosts: engines });
  await mooring.createVolume({ name: 'vm1-disk', sizeBytes: 64 * MiB, replicas: 3, accessMode: 'migratable' });
  const vol = mooring.volume('vm1-disk');
  for (const e of ['migration-started', 'migration-target-ready', 'migration-confirmed', 'migration-rolled-back']) {
    vol.on(e, (m) => log(`  event ${e}: ${m.sourceHost} -> ${m.targetHost}`));
  }
  vol.on('migration-handed-over', (m) => log(`  event migration-handed-over: epoch ${m.epoch}, pause ${m.pauseMs.toFixed(1)} ms (drain ${m.drainMs.toFixed(1)} ms)`));

  const sockA = join(root, 'vm1-a.sock');
  const sockB = join(root, 'vm1-b.sock');
  await vol.attach({ host: 'a', attacher: 'workload', nbd: `unix:${sockA}` });
  log(`attached on a; the VM writes: ${await qemuIo(sockA, 'write -P 0x42 0 1M')}`);

  const migration = await vol.migrate('b', {
    nbd: `unix:${sockB}`,
    attacher: 'workload',
    hooks: {
      beforeHandOver: () => log('  hook beforeHandOver: the source VM is paused at pre-switchover'),
      afterHandOver: () => log('  hook afterHandOver: migrate-continue'),
      afterConfirm: () => log('  hook afterConfirm: the source QEMU may exit'),
    },
  });
  log(`standby on b before the hand-over: ${await qemuIo(sockB, 'read 0 4k')}`);
  await migration.handOver();
  log(`b reads what a wrote: ${await qemuIo(sockB, 'read -P 0x42 0 1M')}`);
  // A write the source VM sends after the hand-over (QEMU resumes it by itself when the
  // migration is cancelled) is held, not refused: a rollback would serve it, the confirm
  // drops its connection unanswered.
  const late = qemuIo(sockA, 'write -P 0xee 0 4k');
  await migration.confirm();
  log(`a write sent to a after the hand-over, dropped at the confirm: ${await late}`);
  log(`b reads what a wrote, not the dropped write: ${await qemuIo(sockB, 'read -P 0x42 0 4k')}`);
  const st = await vol.status();
  log(`confirmed: attached on ${st.attachedHost}, ${st.state}, epoch ${st.epoch}`);

  await vol.detach();
  await mooring.deleteVolume('vm1-disk');
  log('detached and deleted');
} catch (err) {
  failed = true;
  log(`failed: ${err instanceof MooringError ? `${err.code}: ` : ''}${err.message}`);
} finally {
  await mooring?.close();
  await store?.close();
  for (const e of engines) await e.close().catch(() => undefined);
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
