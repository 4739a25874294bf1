// One VM manager embedding Mooring, for the leader-failover system test: a child process
// (child_process.fork, IPC) that imports the built package (dist/index.js), opens an
// EtcdStateStore and a Mooring with `leadership` over the data engines it is given, and runs
// the control operations the test sends. Each request {id, op, args} gets {id, ok, value} or
// {id, ok: false, error: {code, message, details}}; a change of leadership is sent as
// {event: 'leadership', status, atMono} with the machine's monotonic clock in ms (the same
// clock in every process, so the test can order events of different embedders), and so is
// every change of `isLeader` seen by polling it ({event: 'leading', isLeader, atMono}).
import { readFileSync } from 'node:fs';

const m = await import(process.env.MOORING_DIST_INDEX);
const cfg = JSON.parse(process.env.MOORING_EMBEDDER_CONFIG);

const mono = () => Number(process.hrtime.bigint() / 1000n) / 1000;

const store = await m.EtcdStateStore.open({ endpoints: [cfg.endpoint], prefix: cfg.prefix });
const engines = [];
for (const h of cfg.hosts) {
  engines.push(await m.RemoteDataEngine.connect({ address: h.address, timeoutMs: 10_000, clusterSecret: readFileSync(h.secretFile) }));
}
const cluster = await m.Mooring.open({
  store,
  hosts: engines,
  leadership: { id: cfg.id, leaseMs: cfg.leaseMs },
  repairIntervalMs: 300,
  engineIoTimeoutMs: 1000,
  ticketWaitTimeoutMs: 30_000,
  ...(cfg.replicaReplacementWaitMs !== undefined ? { replicaReplacementWaitMs: cfg.replicaReplacementWaitMs } : {}),
});
cluster.on('leadership', (status) => process.send({ event: 'leadership', status, atMono: mono() }));
// Whether this embedder counts itself leader, checked every 10 ms (it turns false by its own
// clock, with no event, when its heartbeats stop succeeding): each change is reported.
let leading = cluster.leadership.isLeader;
process.send({ event: 'leading', isLeader: leading, atMono: mono() });
setInterval(() => {
  const now = cluster.leadership.isLeader;
  if (now !== leading) process.send({ event: 'leading', isLeader: (leading = now), atMono: mono() });
}, 10).unref();
cluster.on('warning', (e) => process.stderr.write(`[${cfg.id}] warning ${e.code}: ${e.message}\n`));

const vol = (name) => cluster.volume(name);
async function migration(name) {
  const mg = await vol(name).migration();
  if (!mg) throw new m.MooringError('INVALID_STATE', `no migration of ${name} recorded`);
  return mg;
}
const ops = {
  status: async () => ({ leadership: cluster.leadership, atMono: mono() }),
  create: async (o) => (await cluster.createVolume(o)).name,
  attach: (name, o) => vol(name).attach(o),
  detach: (name, o) => vol(name).detach(o),
  volumeStatus: (name) => vol(name).status(),
  deleteVolume: (name) => cluster.deleteVolume(name),
  migrate: async (name, target, o) => (await vol(name).migrate(target, o)).info(),
  migration: async (name) => (await vol(name).migration())?.info() ?? null,
  handOver: async (name) => (await migration(name)).handOver(),
  confirm: async (name) => (await migration(name)).confirm(),
  rollback: async (name) => (await migration(name)).rollback(),
  startUpgrade: async (o) => (await cluster.startUpgrade(o)).status(),
  upgradeStatus: async () => (await (await cluster.upgradeSession())?.status()) ?? null,
  createBackingImage: async (o) => (await cluster.createBackingImage(o)).waitReady({ timeoutMs: 120_000 }),
  backingImageStatus: (name) => cluster.backingImage(name).status(),
  setMinCopies: (name, n) => cluster.backingImage(name).setMinCopies(n),
  deleteBackingImage: (name) => cluster.backingImage(name).delete(),
  // The VM manager offers a host again (it came back, perhaps under a new replica address).
  addHost: (i) => cluster.addHost(engines[i]),
  close: async () => {
    await cluster.close();
    await store.close();
    for (const e of engines) await e.close();
    setImmediate(() => process.exit(0));
    return null;
  },
};

process.on('message', async ({ id, op, args }) => {
  try {
    const f = ops[op];
    if (!f) throw new m.MooringError('INVALID_ARGUMENT', `unknown op ${op}`);
    process.send({ id, ok: true, value: (await f(...args)) ?? null });
  } catch (e) {
    process.send({ id, ok: false, error: { code: e?.code ?? null, message: String(e?.message ?? e), details: e?.details ?? null } });
  }
});
process.send({ event: 'ready', status: cluster.leadership, atMono: mono() });
