#!/usr/bin/env node
// Mooring quickstart, on the embedded defaults: one directory holds the control-plane store
// and this host's data engine, both in this process. A volume is created, attached on this
// host with an NBD socket, written through that socket (by qemu-io, when it is installed),
// snapshotted, and found again, still attached, after the VM manager restarts.
//
//   npm run build && npm run demo            serve until Ctrl-C
//   npm run demo -- --once   (or CI=1)       print everything, then close and exit
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { pino } from 'pino';

import { Mooring, MooringError } from '../../dist/index.js';

const once = process.argv.includes('--once') || Boolean(process.env.CI);
const MiB = 1024 * 1024;
const log = (line = '') => process.stdout.write(`${line}\n`);
// QEMU's own NBD client, if installed (Debian: qemu-utils).
const qemuIo = (uri, ...commands) => {
  const r = spawnSync('qemu-io', ['-f', 'raw', ...commands.flatMap((c) => ['-c', c]), uri], { encoding: 'utf8' });
  if (r.error) return null;
  if (r.status !== 0) throw new Error(`qemu-io failed: ${r.stderr}`);
  return r.stdout.trim().split('\n').filter((l) => /^(wrote|read) /.test(l)).join('; ');
};

// Mooring logs nothing unless given a logger (docs/logging.md): here pino, JSON on stderr,
// warnings and worse (LOG_LEVEL=info or debug shows what the library does).
const logger = pino({ level: process.env.LOG_LEVEL ?? 'warn' }, pino.destination(2));
const root = await mkdtemp(join(tmpdir(), 'mooring-demo-'));
const socket = join(root, 'disk0.sock');
let mooring;
let failed = false;
try {
  // 1. Open the embedded default: the store in root/state, this host's data engine in root/host.
  mooring = await Mooring.open({ dir: root, logger });
  log(`opened Mooring in ${root}: this host is ${mooring.hostId}`);

  // 2. Create a volume: one replica per host, so one here (more hosts: Mooring.addHost).
  const disk = await mooring.createVolume({ name: 'disk0', sizeBytes: 64 * MiB });
  disk.on('migration-started', (m) => log(`migration to ${m.targetHost} started`));
  let st = await disk.status();
  log(`created volume ${st.name}: ${st.sizeBytes / MiB} MiB, ${st.replicaCount} replica(s), ${st.state}`);

  // 3. Attach it on this host with an NBD socket: its engine runs in this process.
  st = await disk.attach({ nbd: `unix:${socket}` });
  log(`attached on ${st.attachedHost}: ${st.state}, writer epoch ${st.epoch}`);
  log(`  NBD: ${st.nbd.uri}`);

  // 4. Write and read through the socket, as QEMU would.
  const wrote = qemuIo(st.nbd.uri, 'write -P 0xab 0 64k', 'read -P 0xab 0 64k');
  log(wrote === null ? '(qemu-io is not installed: skipping the write through NBD)' : `qemu-io: ${wrote}`);

  // 5. A snapshot (O(1): no data copied).
  await disk.createSnapshot('first', { labels: { made_by: 'demo' } });
  for (const s of await disk.listSnapshots()) log(`snapshot ${s.name}, labels ${JSON.stringify(s.labels)}`);

  // 6. The VM manager restarts: everything is found again from root, and attach() (same
  //    ticket, same socket) waits until the engine serves again.
  await mooring.close();
  mooring = await Mooring.open({ dir: root, logger });
  st = await mooring.volume('disk0').attach({ nbd: `unix:${socket}` });
  log(`after a restart: ${st.state} on ${st.attachedHost}, writer epoch ${st.epoch}`);
  const again = qemuIo(st.nbd.uri, 'read -P 0xab 0 64k');
  if (again !== null) log(`qemu-io after the restart: ${again}`);

  log();
  log('connect a client, e.g.:');
  log(`  nbdinfo '${st.nbd.uri}'`);
  log(`  qemu-img info '${st.nbd.uri}'`);
  log(`  (qemu: -blockdev driver=nbd,server.type=unix,server.path=${socket},node-name=disk0)`);
  if (once) {
    log('--once: closing now (run without --once to keep serving until Ctrl-C)');
  } else {
    log('serving until Ctrl-C ...');
    await new Promise((resolve) => {
      const keepAlive = setInterval(() => undefined, 1 << 30);
      const stop = (signal) => {
        log(`\n${signal}: draining and closing`);
        clearInterval(keepAlive);
        resolve();
      };
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
    });
  }
} catch (err) {
  failed = true;
  if (err instanceof MooringError) {
    process.stderr.write(`demo failed: ${err.code}: ${err.message}\n`);
    if (err.code === 'NATIVE_LOAD_FAILED') process.stderr.write('(run `npm run build` first)\n');
  } else {
    process.stderr.write(`demo failed: ${err?.stack ?? err}\n`);
  }
} finally {
  try {
    if (mooring) {
      await mooring.close();
      log('closed (engines drained and flushed)');
    }
  } catch (err) {
    failed = true;
    process.stderr.write(`closing failed: ${err?.code ?? ''} ${err?.message ?? err}\n`);
  }
  await rm(root, { recursive: true, force: true });
  log(`removed ${root}`);
}
process.exitCode = failed ? 1 : 0;
