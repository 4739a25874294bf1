// The data engine's gRPC server with a cluster secret (docs/data-engine.md,
// "Authentication"): a client without the token, or with one from another secret, gets
// UNAUTHENTICATED on unary and streaming calls alike and nothing runs (no replica created
// or deleted); the right secret is served. A unix socket listener is made 0600. The
// secret file must be private and of the right size.
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client, Metadata, credentials, status, type ServiceError } from '@grpc/grpc-js';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { generateClusterSecret, grpcAuthToken, readClusterSecretFile } from '../../../src/data-engine/cluster-secret.js';
import { DataEngineGrpcServer } from '../../../src/data-engine/grpc/data-engine-grpc-server.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { LocalDataEngine } from '../../../src/data-engine/local-data-engine.js';
import { FakeAddon } from '../fakes/fake-addon.js';
import { codeOf } from '../../helpers/codes.js';
import { rawCall, SERVICE } from './grpc-raw.js';

describe('DataEngine gRPC with a cluster secret', () => {
  let root: string;
  let local: LocalDataEngine;
  let server: DataEngineGrpcServer | undefined;
  const clients: RemoteDataEngine[] = [];
  const secret = randomBytes(32);

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'mooring-grpc-auth-'));
    local = await LocalDataEngine.start({ dir: join(root, 'de'), hostId: 'h1', addon: new FakeAddon(), replicaListen: null });
  });
  afterEach(async () => {
    await Promise.allSettled(clients.splice(0).map((c) => c.close()));
    await server?.close();
    server = undefined;
    await local.close();
    await rm(root, { recursive: true, force: true });
  });

  it('serves the right secret, refuses none or a wrong one before any method runs', async () => {
    server = await DataEngineGrpcServer.start({ engine: local, listen: 'tcp:127.0.0.1:0', clusterSecret: secret });
    const address = server.address;
    expect(await codeOf(RemoteDataEngine.connect({ address, timeoutMs: 5000 }))).toBe('UNAUTHENTICATED');
    expect(await codeOf(RemoteDataEngine.connect({ address, timeoutMs: 5000, clusterSecret: randomBytes(32) }))).toBe('UNAUTHENTICATED');

    const good = await RemoteDataEngine.connect({ address, clusterSecret: secret });
    clients.push(good);
    await good.createReplica('r1', 1024 * 1024);

    // Raw calls: no token, a wrong token, the token of another secret. None may create or
    // delete anything; the answers carry UNAUTHENTICATED (status and MooringError code).
    const target = address.slice('tcp:'.length);
    const tokens = [undefined, 'x'.repeat(64), grpcAuthToken(randomBytes(32))];
    for (const token of tokens) {
      const md = new Metadata();
      if (token !== undefined) md.set('mooring-auth', token);
      for (const method of ['CreateReplica', 'DeleteReplica', 'ListReplicas']) {
        const r = await rawCall(target, method, Buffer.alloc(0), md);
        expect(Buffer.isBuffer(r)).toBe(false);
        expect((r as ServiceError).code).toBe(status.UNAUTHENTICATED);
        expect((r as ServiceError).metadata.get('mooring-code')[0]).toBe('UNAUTHENTICATED');
        expect((r as ServiceError).details).toContain('requires the cluster secret');
      }
    }
    expect((await local.listReplicas()).map((r) => r.name)).toEqual(['r1']);

    // A streaming call (Watch) is refused as well: its stream ends with the error.
    const watchErr = await new Promise<ServiceError>((res) => {
      const client = new Client(target, credentials.createInsecure());
      const stream = client.makeServerStreamRequest(`${SERVICE}/Watch`, (b: Buffer) => b, (b: Buffer) => b, Buffer.alloc(0), new Metadata(), {});
      stream.on('data', () => undefined);
      stream.on('error', (e: ServiceError) => {
        client.close();
        res(e);
      });
    });
    expect(watchErr.code).toBe(status.UNAUTHENTICATED);

    await good.deleteReplica('r1');
    expect(await local.listReplicas()).toEqual([]);
  });

  it('makes a unix socket listener private (0600) and checks the secret there too', async () => {
    const sock = join(root, 'grpc.sock');
    server = await DataEngineGrpcServer.start({ engine: local, listen: `unix:${sock}`, clusterSecret: secret });
    expect((await stat(sock)).mode & 0o777).toBe(0o600);
    expect(await codeOf(RemoteDataEngine.connect({ address: `unix:${sock}`, timeoutMs: 5000 }))).toBe('UNAUTHENTICATED');
    const good = await RemoteDataEngine.connect({ address: `unix:${sock}`, clusterSecret: secret });
    clients.push(good);
    expect((await good.info()).hostId).toBe('h1');
  });

  it('refuses secrets out of bounds and secret files others may read', async () => {
    expect(await codeOf(DataEngineGrpcServer.start({ engine: local, listen: 'tcp:127.0.0.1:0', clusterSecret: randomBytes(8) }))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(RemoteDataEngine.connect({ address: 'tcp:127.0.0.1:1', clusterSecret: 'text' as unknown as Uint8Array }))).toBe('INVALID_ARGUMENT');
    const file = join(root, 'secret');
    await writeFile(file, `${secret.toString('base64')}\n`, { mode: 0o600 });
    expect((await readClusterSecretFile(file)).toString()).toBe(secret.toString('base64')); // the newline is not part of it
    await chmod(file, 0o640);
    expect(await codeOf(readClusterSecretFile(file))).toBe('INVALID_ARGUMENT');
    await writeFile(join(root, 'short'), 'too short', { mode: 0o600 });
    expect(await codeOf(readClusterSecretFile(join(root, 'short')))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(readClusterSecretFile(join(root, 'missing')))).toBe('NOT_FOUND');
  });

  it('generates secrets that a secret file gives back byte for byte', async () => {
    // A binary secret ends in a white-space byte 1 time in 64 and the file reader drops it:
    // 2,000 draws would catch that with near certainty.
    const file = join(root, 'generated');
    for (let i = 0; i < 2000; i++) {
      const s = generateClusterSecret();
      await writeFile(file, s, { mode: 0o600 });
      expect((await readClusterSecretFile(file)).equals(s)).toBe(true);
    }
  });
});
