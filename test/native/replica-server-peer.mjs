// A replica server in its own node process, as on another host (test/native/replica-goaway.test.ts).
// In the test's own process, engine calls held by a replica that is reconnecting occupy
// libuv's worker threads, which the server's own close() and a successor's start also need.
// It loads the addon from the package root as the library does (node-gyp-build) and obeys
// JSON commands, one per stdin line: {id, op, ...}; each answer is one stdout line
// {id, ok, result} or {id, ok: false, error}. Ops: start {root, port, tls}, goAway {timeoutMs},
// stats, close. stderr is the test's to show.
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(dirname(fileURLToPath(import.meta.url))));
const addon = createRequire(join(root, 'package.json'))('node-gyp-build')(root);

let server = null;

const ops = {
  async start({ root: dir, port, tls }) {
    server = await addon.startReplicaServer({ root: dir, port, tls });
    return { port: server.port };
  },
  goAway: ({ timeoutMs }) => server.goAway(timeoutMs),
  stats: async () => server.stats(),
  async close() {
    await server.close();
    return server.stats();
  },
};

createInterface({ input: process.stdin }).on('line', (line) => {
  const cmd = JSON.parse(line);
  Promise.resolve()
    .then(() => ops[cmd.op](cmd))
    .then(
      (result) => process.stdout.write(JSON.stringify({ id: cmd.id, ok: true, result }) + '\n'),
      (e) => process.stdout.write(JSON.stringify({ id: cmd.id, ok: false, error: { code: e.code, message: e.message } }) + '\n'),
    );
});
