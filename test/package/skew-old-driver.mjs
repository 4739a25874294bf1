// The previous release's control plane, driven by the version-skew test (skew.test.ts).
// The test copies this file into the scratch project where the previous release's tarball
// is installed, so `import 'mooring'` here loads the OLD package (and its own addon), in a
// process of its own. Requests come one JSON object a line on stdin:
//   {id, op: 'open', hosts: [gRPC addresses], stateDir}
//   {id, op: 'mooring', method, args}          → mooring[method](...args)
//   {id, op: 'volume', name, method, args}     → mooring.volume(name)[method](...args)
//   {id, op: 'close'}
// and each gets one line `REPLY {id, ok, value}` or `REPLY {id, ok: false, error: {code, message, stack}}`.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { FileStateStore, Mooring, RemoteDataEngine } from 'mooring';

const require = createRequire(import.meta.url);
let mooring = null;
let store = null;
let engines = [];

// Handles (Volume, Engine) are not data: the test gets null for them.
const plain = (v) => (v !== null && typeof v === 'object' && v.constructor && v.constructor !== Object && !Array.isArray(v) ? null : v === undefined ? null : v);

const ops = {
  async open({ hosts, stateDir }) {
    engines = [];
    for (const address of hosts) engines.push(await RemoteDataEngine.connect({ address, timeoutMs: 10_000 }));
    store = await FileStateStore.open(stateDir);
    mooring = await Mooring.open({ store, hosts: engines, repairIntervalMs: 500 });
    const pkgJson = require.resolve('mooring/package.json');
    return {
      version: JSON.parse(readFileSync(pkgJson, 'utf8')).version,
      module: fileURLToPath(import.meta.resolve('mooring')),
      hasStartUpgrade: typeof Mooring.prototype.startUpgrade === 'function',
      hosts: await Promise.all(engines.map((e) => e.info())),
    };
  },
  async mooring({ method, args }) {
    return plain(await mooring[method](...(args ?? [])));
  },
  async volume({ name, method, args }) {
    return plain(await mooring.volume(name)[method](...(args ?? [])));
  },
  async close() {
    await mooring?.close();
    await store?.close();
    for (const e of engines) await e.close();
    mooring = null;
    return null;
  },
};

const reply = (r) => process.stdout.write(`REPLY ${JSON.stringify(r)}\n`);
const rl = createInterface({ input: process.stdin });
rl.on('line', (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch (err) {
    process.stderr.write(`driver: bad request line ${JSON.stringify(line)}: ${err}\n`);
    return;
  }
  const op = ops[req.op];
  if (!op) return reply({ id: req.id, ok: false, error: { code: 'DRIVER', message: `unknown op ${req.op}` } });
  op(req).then(
    (value) => reply({ id: req.id, ok: true, value }),
    (err) => reply({ id: req.id, ok: false, error: { code: err?.code ?? null, message: String(err?.message ?? err), stack: String(err?.stack ?? '') } }),
  );
});
rl.on('close', async () => {
  await ops.close().catch((err) => process.stderr.write(`driver: close: ${err?.stack ?? err}\n`));
  process.exit(0);
});
