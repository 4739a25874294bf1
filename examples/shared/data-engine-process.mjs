// Starts `mooring data-engine` for one host, as the examples run several hosts on one
// machine (in production each runs on its own, say as a systemd unit), and connects to it
// once it prints READY. Its log (stderr) is kept only to explain a failed start.
//
// The hosts of one example share a cluster secret (DIR/cluster.secret, 64 hex digits from
// generateClusterSecret(), mode 0600; in production, a file distributed to every host): it authenticates their gRPC calls
// and replica connections, so other local processes cannot use the replicas.
import { spawn } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import { generateClusterSecret, readClusterSecretFile, RemoteDataEngine } from '../../dist/index.js';

const cli = join(dirname(fileURLToPath(import.meta.url)), '../../dist/cli.js');

/** `DIR/ID/` is the host's directory and `DIR/ID.sock` its gRPC socket; its replica server listens on 127.0.0.1:PORT. */
export async function startDataEngineProcess(dir, id, port) {
  const home = join(dir, id);
  const secretFile = join(dir, 'cluster.secret');
  await writeFile(secretFile, generateClusterSecret(), { mode: 0o600, flag: 'wx' }).catch((err) => {
    if (err.code !== 'EEXIST') throw err; // made by the first host
  });
  const clusterSecret = await readClusterSecretFile(secretFile); // as the data engines read it
  const args = ['data-engine', '--dir', home, '--host-id', id, '--listen', `unix:${home}.sock`, '--replica-listen', `tcp:127.0.0.1:${port}`, '--cluster-secret-file', secretFile];
  const child = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stderr.setEncoding('utf8').on('data', (d) => (log = (log + d).slice(-4096)));
  let ready = false;
  for await (const line of createInterface({ input: child.stdout })) {
    if (line.startsWith('READY ')) {
      ready = true;
      break;
    }
  }
  if (!ready) {
    await new Promise((r) => (child.exitCode !== null || child.signalCode !== null ? r() : child.once('exit', r)));
    throw new Error(`data engine ${id} exited before READY (exit ${child.exitCode ?? child.signalCode}; is port ${port} free?)${log ? `:\n${log}` : ''}`);
  }
  const engine = await RemoteDataEngine.connect({ address: `unix:${home}.sock`, clusterSecret });
  return { child, engine };
}
