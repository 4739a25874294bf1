// A successor that fails on purpose, for test/system/upgrade/in-place.test.ts: started by a
// data engine's HandOffProcess as `node broken-successor.mjs MODE data-engine ARGS...
// --take-over SOCK`, it connects to the hand-off channel and then
//   bad-version   says HELLO with a version nobody speaks, and exits;
//   refuse        takes the manifest and the exports, answers REFUSED, and exits;
//   die           takes the manifest and the exports, then kills itself (SIGKILL).
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const addon = createRequire(join(root, 'package.json'))('node-gyp-build')(root);
const mode = process.argv[2];
const sock = process.argv[process.argv.indexOf('--take-over') + 1];
const ch = await addon.handOff.connect(sock, 10_000);
const send = (m) => ch.send(Buffer.from(JSON.stringify(m)), 10_000);

if (mode === 'bad-version') {
  await send({ type: 'HELLO', version: 99, pid: process.pid });
  await new Promise((r) => setTimeout(r, 200));
  process.exit(0);
}
await send({ type: 'HELLO', version: 1, pid: process.pid });
const manifest = JSON.parse((await ch.receive(30_000)).data.toString());
for (const e of manifest.engines) if (e.nbd) await ch.receive(30_000);
if (mode === 'refuse') {
  await send({ type: 'REFUSED', reason: 'broken on purpose' });
  await new Promise((r) => setTimeout(r, 200));
  process.exit(0);
}
process.kill(process.pid, 'SIGKILL');
