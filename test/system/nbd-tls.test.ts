// NBD over TLS from the command line (docs/nbd-frontend.md, "TLS"): `mooring data-engine`
// and `mooring serve` given --tls-cert/--tls-key/--tls-ca serve their TCP exports over TLS
// only, and may then listen beyond loopback. Checked with QEMU's client (qemu-io with a
// tls-creds-x509 object) and libnbd's (nbdinfo nbds://); a client in the clear is told TLS is
// required and gets nothing. While a TLS export runs, the data engine offers no in-place
// hand-off (TLS state cannot move to a successor).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { RemoteDataEngine } from '../../src/data-engine/grpc/remote-data-engine.js';
import { makePki, type TestPki } from '../native/remote-helpers.js';
import { killAllServers, startCliProcess, startServe } from './helpers/serve.js';
import { TempDir, run } from './helpers/tools.js';

const MiB = 1024 * 1024;

describe('NBD over TLS from the command line', () => {
  let tmp: TempDir;
  let pki: TestPki;
  let creds: string;
  let tlsArgs: string[];

  beforeAll(() => {
    tmp = new TempDir('mooring-nbdtls-');
    mkdirSync(tmp.join('pki'));
    pki = makePki(tmp.join('pki'));
    for (const [f, text] of [['cert.pem', pki.serverCert], ['key.pem', pki.serverKey], ['ca.pem', pki.ca]] as const) {
      writeFileSync(tmp.join(f), text, { mode: 0o600 });
    }
    tlsArgs = ['--tls-cert', tmp.join('cert.pem'), '--tls-key', tmp.join('key.pem'), '--tls-ca', tmp.join('ca.pem')];
    creds = tmp.join('client');
    mkdirSync(creds);
    writeFileSync(join(creds, 'ca-cert.pem'), pki.ca);
    writeFileSync(join(creds, 'client-cert.pem'), pki.clientCert);
    writeFileSync(join(creds, 'client-key.pem'), pki.clientKey, { mode: 0o600 });
  });
  afterEach(async () => {
    await killAllServers();
  });
  afterAll(() => {
    tmp.cleanup();
  });

  const qemuIo = (port: number, cmds: string[]): Promise<unknown> =>
    run('qemu-io', [
      '--object',
      `tls-creds-x509,id=tls0,endpoint=client,dir=${creds}`,
      '--image-opts',
      `driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=${port},tls-creds=tls0`,
      ...cmds.flatMap((c) => ['-c', c]),
    ]);

  async function refusedInTheClear(port: number): Promise<void> {
    const plain = await run('nbdinfo', ['--size', `nbd://127.0.0.1:${port}/`], { allowFailure: true });
    expect(plain.code, plain.stdout).not.toBe(0);
    expect(plain.stderr).toMatch(/requires TLS/);
  }

  it('data-engine --tls-*: an engine exported on a non-loopback TCP address requires TLS', async () => {
    const grpc = `unix:${tmp.join('de.sock')}`;
    const de = await startCliProcess(
      ['data-engine', '--dir', tmp.join('host-1'), '--host-id', 'host-1', '--listen', grpc, '--replica-listen', 'none', '--allow-successor-exec', tmp.path, ...tlsArgs],
      'mooring data-engine with TLS',
    );
    expect(JSON.parse(de.readyLine).tls).toBe(true);
    const client = await RemoteDataEngine.connect({ address: grpc });
    try {
      expect((await client.info()).features).toContain('in-place-handoff');
      await client.createReplica('tls-r0', 16 * MiB);
      const engine = await client.startEngine({
        volume: 'tls',
        replicas: [{ id: 'r0', hostId: 'host-1', name: 'tls-r0', address: null }],
        nbd: 'tcp:0.0.0.0:0',
        epoch: 1,
      });
      const port = Number(/:(\d+)\/$/.exec(engine.nbd!.uri)![1]);
      expect(engine.nbd!.uri).toBe(`nbds://0.0.0.0:${port}/`);
      await qemuIo(port, ['write -P 0x3c 0 2M', 'read -P 0x3c 0 2M']);
      const size = await run('nbdinfo', ['--size', `nbds://127.0.0.1:${port}/?tls-certificates=${creds}`]);
      expect(Number(size.stdout.trim())).toBe(16 * MiB);
      await refusedInTheClear(port);
      // A TLS export cannot move to a successor process: no in-place hand-off while it runs.
      expect((await client.info()).features).not.toContain('in-place-handoff');
      await client.stopEngine('tls');
      expect((await client.info()).features).toContain('in-place-handoff');
    } finally {
      await client.close();
    }
  });

  it('serve --tls-*: --nbd tcp:0.0.0.0 is allowed with TLS and serves QEMU over it', async () => {
    const s = await startServe({ dir: tmp.join('serve'), size: 32 * MiB, replicas: 1, nbd: 'tcp:0.0.0.0:0', extraArgs: tlsArgs });
    const port = Number(/:(\d+)$/.exec(s.ready.nbd)![1]);
    expect(s.ready.uri).toBe(`nbds://0.0.0.0:${port}/`);
    await qemuIo(port, ['write -P 0x5a 1M 1M', 'read -P 0x5a 1M 1M', 'read -P 0 0 1M']);
    await refusedInTheClear(port);
  });
});
