// Another local process against a `mooring data-engine` that has a cluster secret
// (docs/data-engine.md, "Authentication"): its gRPC listens on loopback TCP and its replica
// server on loopback, both reachable by any process of this host. A second process
// (test/system/helpers/intruder.mjs) tries to create and delete a replica through gRPC and
// to open, claim and write a replica through the replica port:
// - without a secret, and with a wrong one: every gRPC call is UNAUTHENTICATED, the replica
//   server answers UNAUTHENTICATED and closes before HELLO; nothing changed on disk (the
//   victim replica still exists, epoch 0, its data zero);
// - with the right secret, the same script is served (so the refusals above are the
//   secret's doing, not a broken script).
// And the CLI refuses a TCP gRPC listener with neither TLS nor a secret unless --insecure.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { HostProcess } from './helpers/hosts.js';
import { loadAddon } from './helpers/replicas.js';
import { killAllServers, startCliProcess } from './helpers/serve.js';
import { TempDir } from './helpers/tools.js';

const GRPC_PORT = 18500;
const REPLICA_PORT = 18501;
const IP = '127.0.0.1';
const intruder = fileURLToPath(new URL('./helpers/intruder.mjs', import.meta.url));

interface IntruderReport {
  connect?: string;
  create?: string;
  deleteOwn?: string;
  auth?: string;
  serverProved?: boolean;
  authProof?: string;
  hello?: string;
  claim?: string;
  write?: string;
  closedAfter?: boolean;
}

async function runIntruder(replicaName: string, secret?: Buffer): Promise<IntruderReport> {
  const args = [intruder, `tcp:${IP}:${GRPC_PORT}`, IP, String(REPLICA_PORT), replicaName, ...(secret ? [secret.toString('hex')] : [])];
  const { stdout, stderr } = await promisify(execFile)(process.execPath, args, { timeout: 60_000 }).catch((err: { stdout?: string; stderr?: string; message: string }) => {
    throw new Error(`intruder failed: ${err.message}\nstdout: ${err.stdout}\nstderr: ${err.stderr}`);
  });
  try {
    return JSON.parse(stdout.trim()) as IntruderReport;
  } catch {
    throw new Error(`intruder printed no report\nstdout: ${stdout}\nstderr: ${stderr}`);
  }
}

describe('a data engine with a cluster secret against another local process', () => {
  let tmp: TempDir;
  let host: HostProcess;
  beforeAll(async () => {
    tmp = new TempDir('mooring-secret-');
    host = new HostProcess({ hostId: 'a', dir: tmp.join('a'), ip: IP, replicaPort: REPLICA_PORT, grpcListen: `tcp:${IP}:${GRPC_PORT}` });
    await host.start();
    await host.engine.createReplica('victim', 1 << 20);
    await host.engine.createReplica('spare', 1 << 20);
  }, 60_000);
  afterAll(async () => {
    await host?.stop().catch(() => undefined);
    await killAllServers();
    tmp?.cleanup();
  });

  it('refuses a process without the secret, or with a wrong one, on gRPC and on the replica port', async () => {
    for (const secret of [undefined, randomBytes(32)]) {
      const r = await runIntruder('victim', secret);
      const what = secret ? 'a wrong secret' : 'no secret';
      expect(r.connect, `${what}: ${JSON.stringify(r)}`).toBe('UNAUTHENTICATED');
      if (secret) {
        expect(r.auth).toBe('OK'); // the server proved the real secret: it does not check out with ours
        expect(r.serverProved).toBe(false);
        expect(r.authProof).toBe('code 18'); // UNAUTHENTICATED
        expect([r.hello, r.claim, r.write]).toEqual(['closed', 'closed', 'closed']);
      } else {
        expect([r.hello, r.claim, r.write]).toEqual(['code 18', 'closed', 'closed']);
      }
      expect(r.closedAfter).toBe(true);
    }
    // Nothing changed: no replica made, the victim still there.
    expect((await host.engine.listReplicas()).map((x) => x.name).sort()).toEqual(['spare', 'victim']);
  }, 120_000);

  it('serves the same process once it has the right secret', async () => {
    const r = await runIntruder('spare', host.clusterSecret);
    expect(r).toEqual({ connect: 'OK', create: 'OK', deleteOwn: 'OK', auth: 'OK', serverProved: true, authProof: 'OK', hello: 'OK', claim: 'OK', write: 'OK', closedAfter: true });
  }, 120_000);

  it('left the victim replica untouched (epoch 0, zeros) and counted nothing against it', async () => {
    await host.stop();
    const victim = await loadAddon().openReplica(join(host.opts.dir, 'replicas', 'victim'));
    try {
      expect(victim.epoch()).toBe(0);
      expect((await victim.read(0, 4096)).equals(Buffer.alloc(4096))).toBe(true);
    } finally {
      await victim.close();
    }
    const spare = await loadAddon().openReplica(join(host.opts.dir, 'replicas', 'spare'));
    try {
      expect(spare.epoch()).toBe(2 ** 40); // the served intruder's claim took effect: the check above could fail
    } finally {
      await spare.close();
    }
  }, 60_000);

  it('refuses a TCP gRPC listener with neither TLS nor a secret unless --insecure', async () => {
    const args = ['data-engine', '--dir', tmp.join('b'), '--host-id', 'b', '--listen', `tcp:${IP}:${GRPC_PORT + 2}`, '--replica-listen', `tcp:${IP}:${GRPC_PORT + 3}`];
    const refused = await startCliProcess(args, 'data-engine b (no secret)', 30_000).then(
      async (s) => {
        await s.stop('SIGTERM', 10_000);
        return 'started';
      },
      (err: Error) => err.message,
    );
    expect(refused).toContain('needs --cluster-secret-file');
    expect(refused).toContain('INVALID_ARGUMENT');
    const insecure = await startCliProcess([...args, '--insecure'], 'data-engine b (--insecure)', 30_000);
    try {
      expect(insecure.readyLine).toContain('"hostId":"b"');
    } finally {
      await insecure.stop('SIGTERM', 10_000);
    }
  }, 90_000);
});
