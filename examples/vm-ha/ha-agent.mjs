#!/usr/bin/env node
// Per-host HA agent over Mooring's sanlock locks (see README.md). Not production code: one
// VM per process and no persistence, to show the calls and the events in order.
import { parseArgs } from 'node:util';
// From a checkout; in a project of your own: from 'mooring'.
import { Lockspace, LockedProcess, isMooringError } from '../../dist/index.js';

const { values: o, positionals: command } = parseArgs({
  allowPositionals: true,
  options: {
    'host-id': { type: 'string' },
    'host-name': { type: 'string' },
    lockspace: { type: 'string' },
    name: { type: 'string', default: 'ha' },
    'io-timeout': { type: 'string', default: '10' },
    vm: { type: 'string' },
    standby: { type: 'string' },
    delete: { type: 'boolean', default: false },
  },
});
const hostId = Number(o['host-id']);
const path = o.lockspace;
const vmName = o.vm ?? o.standby;

// Retiring the storage: once every host left (their agents stopped), delete the lockspace.
if (o.delete && path) {
  const ls = await Lockspace.open({ name: o.name, path });
  try {
    await ls.delete(); // waits up to 8 x io_timeout + 60 s for a crashed host to be dead
    console.log(`deleted lockspace ${ls.name} from ${path}`);
  } catch (err) {
    if (!isMooringError(err, 'BUSY')) throw err;
    console.error(err.message); // the hosts still live and the locks they hold
    process.exit(1);
  }
  process.exit(0);
}
if (!hostId || !path || !vmName || command.length === 0) {
  console.error('usage: ha-agent.mjs --host-id N --host-name NAME --lockspace PATH (--vm NAME | --standby NAME) -- COMMAND...');
  console.error('       ha-agent.mjs --lockspace PATH --delete');
  process.exit(2);
}

// Once per storage (Virtink's initializer does this): whoever comes first creates it.
let ls;
try {
  ls = await Lockspace.create({ name: o.name, path, maxLocks: 100, ioTimeoutSeconds: Number(o['io-timeout']) });
} catch (err) {
  if (!isMooringError(err, 'ALREADY_EXISTS')) throw err;
  ls = await Lockspace.open({ name: o.name, path });
}
console.log(`joining ${ls.name} as host ${hostId} (io_timeout ${ls.ioTimeoutSeconds} s; a crashed host is dead after ${ls.timings().t4Recoverable.minSeconds}-${ls.timings().t4Recoverable.maxSeconds} s)`);
await ls.join({ hostId, hostName: o['host-name'] });

const lock = await ls.createLock(`${vmName}-disk0`).catch((err) => {
  if (isMooringError(err, 'ALREADY_EXISTS')) return ls.openLock(`${vmName}-disk0`);
  throw err;
});

let vm;
async function startVm() {
  // Waits while the previous owner is failing; LOCK_HELD if it is alive and holds it.
  vm = await LockedProcess.start({ command: command[0], args: command.slice(1), locks: [lock], ownerName: vmName });
  console.log(`${vmName} running as pid ${vm.pid} with lock ${lock.name}`);
  vm.on('exit', (e) => {
    if (e.stoppedBySanlock) console.log(`${vmName} stopped by sanlock: ${e.stoppedBySanlock.reason} in ${e.stoppedBySanlock.lockspace}`);
    else console.log(`${vmName} exited (code ${e.code}, signal ${e.signal})`);
  });
}

ls.on('lost', (e) => console.log(`this host lost lockspace ${e.lockspace}: ${e.reason}; do not schedule VMs with locks there`));
const watcher = ls.watch();
watcher.on('fail', (e) => console.log(`host ${e.hostId} failing in ${e.lockspace}: stop scheduling there (T3)`));
watcher.on('dead', async (e) => {
  console.log(`host ${e.hostId} dead in ${e.lockspace} (T4)`);
  if (o.standby && !vm) await startVm().catch((err) => console.error(`takeover failed: ${err.code}: ${err.message}`));
});
watcher.on('free', (e) => console.log(`host ${e.hostId} left ${e.lockspace}`));
watcher.start();

if (o.vm) await startVm();

process.on('SIGINT', async () => {
  await watcher.stop();
  vm?.kill();
  await vm?.exited;
  await ls.leave();
  process.exit(0);
});
