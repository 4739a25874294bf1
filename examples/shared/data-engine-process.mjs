// Starts `mooring data-engine` for one host, as the examples run several hosts on one
// machine (in production each runs on its own, say as a systemd unit), and connects to it
// once it prints READY. Its log (stderr) is left out.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import { RemoteDataEngine } from '../../dist/index.js';

const cli = join(dirname(fileURLToPath(import.meta.url)), '../../dist/cli.js');

/** `DIR/ID/` is the host's directory and `DIR/ID.sock` its gRPC socket; its replica server listens on 127.0.0.1:PORT. */
export async function startDataEngineProcess(dir, id, port) {
  const home = join(dir, id);
  const child = spawn(process.execPath, [cli, 'data-engine', '--dir', home, '--host-id', id, '--listen', `unix:${home}.sock`, '--replica-listen', `tcp:127.0.0.1:${port}`], { stdio: ['ignore', 'pipe', 'ignore'] });
  for await (const line of createInterface({ input: child.stdout })) if (line.startsWith('READY ')) break;
  const engine = await RemoteDataEngine.connect({ address: `unix:${home}.sock` });
  return { child, engine };
}
