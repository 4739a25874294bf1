// A VM manager for test/system/upgrade/controller-crash.test.ts, run as its own process so
// the test can SIGKILL it: it opens a Mooring over the state store and the hosts' gRPC
// sockets, starts (or, when one is recorded, goes on with) an upgrade session, and prints
// one line per host step. Its launcher asks the test (the parent, which owns the host
// processes) over the IPC channel to replace a host, then connects to it again.
// With --in-place (controller-crash-in-place.test.ts) it needs no launcher: the data
// engines start their successors, and the session hands each host over in place.
//   argv: [--in-place] STATE_DIR VERSION HOST_ID=GRPC_ADDRESS...
import { fileURLToPath } from 'node:url';

import { FileStateStore, Mooring, RemoteDataEngine } from '../../../dist/index.js';

const args = process.argv.slice(2);
const inPlace = args[0] === '--in-place';
if (inPlace) args.shift();
const [stateDir, version, ...hostArgs] = args;
const addresses = new Map(hostArgs.map((a) => a.split('=')));
let seq = 0;
const pending = new Map();
process.on('message', (m) => pending.get(m.id)?.(m));

const launcher = {
  async replace(hostId) {
    const id = ++seq;
    const reply = new Promise((resolve) => pending.set(id, resolve));
    process.send({ id, replace: hostId });
    const m = await reply;
    if (m.error) throw new Error(m.error);
    return RemoteDataEngine.connect({ address: addresses.get(hostId) });
  },
};

const hosts = [];
for (const address of addresses.values()) hosts.push(await RemoteDataEngine.connect({ address }));
const store = await FileStateStore.open(stateDir);
const mooring = await Mooring.open({ store, hosts, repairIntervalMs: 300, ...(inPlace ? {} : { dataEngineLauncher: launcher }) });
mooring.on('warning', (e) => process.stderr.write(`warning: ${e.code}: ${e.message}\n`));
let session = await mooring.upgradeSession();
if (!session || ['completed', 'error', 'cancelled'].includes((await session.status()).state)) {
  session = inPlace
    ? await mooring.startUpgrade({ dataEngine: { version, command: [process.execPath, fileURLToPath(new URL('../../../dist/cli.js', import.meta.url))] }, method: 'in-place', stepTimeoutMs: 120_000 })
    : await mooring.startUpgrade({ dataEngine: { version, command: ['mooring'] }, method: 'restart', stepTimeoutMs: 120_000 });
}
process.stdout.write(`SESSION ${session.id}\n`);
session.on('host-state-changed', (e) => process.stdout.write(`STEP ${e.host} ${e.state}\n`));
const done = await session.done();
process.stdout.write(`DONE ${done.state}\n`);
await mooring.close();
await store.close();
for (const h of hosts) await h.close();
// Let go of the test's IPC channel, so this process exits (the test waits for the exit:
// until then the state store's lock is ours).
if (process.connected) process.disconnect();
