#!/usr/bin/env node
// A volume served to QEMU over NBD with TLS (docs/nbd-frontend.md, "TLS").
//
// A data engine given TLS material serves its TCP exports over NBD STARTTLS only, to clients
// that present a certificate signed by its CA. This example makes a throw-away CA and
// certificates with the openssl command, starts a data engine with them, exports a volume on
// TCP, and reaches it as QEMU would (qemu-io with a tls-creds-x509 object) and as libnbd
// would (nbdinfo with an nbds:// URI); a client in the clear is refused.
//
//   npm run build && node examples/nbd-tls/demo.mjs     (needs openssl, qemu-utils, nbdinfo)
import { execFileSync } from 'node:child_process';
import { mkdtemp, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { LocalDataEngine } from '../../dist/index.js';

const MiB = 1024 * 1024;
const log = (line = '') => process.stdout.write(`${line}\n`);
const run = (cmd, args) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const root = await mkdtemp(join(tmpdir(), 'mooring-nbd-tls-'));
let de = null;
let failed = false;
try {
  // 1. A CA, a server certificate for 127.0.0.1 and a client certificate (EC P-256).
  const pki = join(root, 'pki');
  await mkdir(pki);
  const ossl = (...args) => execFileSync('openssl', args, { cwd: pki, stdio: 'pipe' });
  ossl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1', '-subj', '/CN=demo CA', '-keyout', 'ca.key', '-out', 'ca.crt');
  for (const [name, ext] of [
    ['server', 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n'],
    ['client', 'extendedKeyUsage=clientAuth\n'],
  ]) {
    ossl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.csr`);
    await writeFile(join(pki, `${name}.ext`), ext);
    ossl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '1', '-extfile', `${name}.ext`, '-out', `${name}.crt`);
  }
  const pem = (f) => readFile(join(pki, f), 'utf8');
  log('certificates: a CA, a server certificate for 127.0.0.1, a client certificate');

  // 2. The data engine with that material: its TCP exports require TLS.
  de = await LocalDataEngine.start({ dir: join(root, 'host'), hostId: 'a', tls: { cert: await pem('server.crt'), key: await pem('server.key'), ca: await pem('ca.crt') } });
  await de.createReplica('tls-r0', 64 * MiB);
  const engine = await de.startEngine({ volume: 'tls', replicas: [{ id: 'r0', hostId: 'a', name: 'tls-r0', address: null }], nbd: 'tcp:127.0.0.1:0', epoch: 1 });
  const uri = engine.nbd.uri;
  const port = Number(/:(\d+)\/$/.exec(uri)[1]);
  log(`exported at ${uri}`);

  // 3. The client's directory, as QEMU's tls-creds-x509 and libnbd read it.
  const creds = join(root, 'client');
  await mkdir(creds);
  await writeFile(join(creds, 'ca-cert.pem'), await pem('ca.crt'));
  await writeFile(join(creds, 'client-cert.pem'), await pem('client.crt'));
  await writeFile(join(creds, 'client-key.pem'), await pem('client.key'), { mode: 0o600 });

  const qemu = run('qemu-io', [
    '--object', `tls-creds-x509,id=tls0,endpoint=client,dir=${creds}`,
    '--image-opts', `driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=${port},tls-creds=tls0`,
    '-c', 'write -P 0x6d 0 1M', '-c', 'read -P 0x6d 0 1M',
  ]);
  log(`qemu-io over TLS: ${qemu.trim().split('\n').filter((l) => /^(wrote|read)/.test(l)).join('; ')}`);
  const size = run('nbdinfo', ['--size', `nbds://127.0.0.1:${port}/?tls-certificates=${creds}`]).trim();
  log(`nbdinfo over TLS: ${size} bytes`);
  try {
    run('nbdinfo', ['--size', `nbd://127.0.0.1:${port}/`]);
    log('a client in the clear was served: TLS is not enforced');
    failed = true;
  } catch (err) {
    log(`a client in the clear: refused (${String(err.stderr).trim().split('\n')[0]})`);
  }
} catch (err) {
  failed = true;
  log(`failed: ${err.stack ?? err}${err.stderr ? `\n${err.stderr}` : ''}`);
} finally {
  await de?.close().catch(() => undefined);
  await rm(root, { recursive: true, force: true });
}
process.exitCode = failed ? 1 : 0;
