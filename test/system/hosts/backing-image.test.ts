// Backing images across three hosts on one machine (three `mooring data-engine` processes)
// and a local HTTP server that serves images made by qemu-img:
// - a qcow2 image is downloaded on host a; a 3-replica volume on it spans a, b and c (the file
//   is copied to b and c first); attached with NBD, the export reads exactly what
//   `qemu-img convert -O raw` makes of the source image;
// - a host killed (SIGKILL) while a copy is sent to it gets the copy completed once it is
//   back (resumed from its partial file), verified against the image's SHA-512;
// - deleting an image a volume uses is refused (BUSY);
// - once the volume is gone, copies nobody uses are deleted after the cleanup wait, keeping
//   minCopies ready copies.
// It needs the native backing-image reader and the data engine's file calls (issue 6's other
// branches); qemu-img and a built dist/cli.js.
import { createHash } from 'node:crypto';
import { createReadStream, statSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { BackingImage } from '../../../src/backing-image/backing-image.js';
import { BACKING_IMAGE_PART_FILE } from '../../../src/data-engine/backing-image-files.js';
import { useHostCluster } from '../helpers/host-cluster.js';
import { waitFor } from '../helpers/hosts.js';
import { qemuIo, requireTool, run } from '../helpers/tools.js';

const MiB = 1 << 20;
const CLEANUP_WAIT_MS = 2000;
/** Progress of the copy to b at which b is killed. */
const KILL_AT_PERCENT = 20;

/** Serves files of `dir` with Range support (a download may resume). */
function serveDir(dir: string): Promise<{ server: Server; url: (name: string) => string }> {
  const server = createServer((req, res) => {
    const name = (req.url ?? '/').slice(1);
    if (!/^[a-z0-9.-]+$/.test(name)) {
      res.writeHead(404).end();
      return;
    }
    let size: number;
    try {
      size = statSync(join(dir, name)).size;
    } catch {
      res.writeHead(404).end();
      return;
    }
    const m = /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
    const start = m ? Number(m[1]) : 0;
    res.writeHead(m ? 206 : 200, { 'content-length': size - start, ...(m ? { 'content-range': `bytes ${start}-${size - 1}/${size}` } : {}), 'accept-ranges': 'bytes' });
    createReadStream(join(dir, name), { start }).pipe(res);
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      resolve({ server, url: (n) => `http://127.0.0.1:${port}/${n}` });
    }),
  );
}

async function sha512File(path: string): Promise<string> {
  const h = createHash('sha512');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

describe('backing images across three data-engine hosts', () => {
  const env = useHostCluster({ hosts: 3, basePort: 17410, scope: 'all', cluster: { repairIntervalMs: 0, ticketWaitTimeoutMs: 120_000, backingImageCleanupWaitMs: CLEANUP_WAIT_MS } });
  let http: { server: Server; url: (name: string) => string };
  let base: BackingImage;
  const nbd = (): string => `unix:${env.tmp.join('vm.sock')}`;
  const uri = (): string => `nbd+unix:///?socket=${env.tmp.join('vm.sock')}`;
  const diag = (): string => env.hosts.map((h) => h.diagnostics()).join('');

  beforeAll(async () => {
    requireTool('qemu-img');
    requireTool('qemu-io');
    // A qcow2 image with data in a few places, and a larger raw one for the copy that is cut.
    await run('qemu-img', ['create', '-q', '-f', 'qcow2', env.tmp.join('base.qcow2'), '64M']);
    await run('qemu-io', ['-f', 'qcow2', '-c', 'write -P 0x3c 0 4M', '-c', 'write -P 0x7e 20M 1M', '-c', 'write -P 0x11 63M 512k', env.tmp.join('base.qcow2')]);
    await run('dd', ['if=/dev/urandom', `of=${env.tmp.join('big.raw')}`, 'bs=1M', 'count=256', 'status=none']);
    http = await serveDir(env.tmp.path);
  });

  afterAll(() => {
    http?.server.close();
  });

  it('downloads a qcow2 image on host a', async () => {
    base = await env.cluster.createBackingImage({ name: 'base', source: { type: 'download', url: http.url('base.qcow2') }, host: 'a', expectedChecksum: await sha512File(env.tmp.join('base.qcow2')) });
    const st = await base.waitReady({ timeoutMs: 60_000 });
    expect(st, diag()).toMatchObject({ state: 'ready', format: 'qcow2', virtualSizeBytes: 64 * MiB, sizeBytes: statSync(env.tmp.join('base.qcow2')).size });
    expect(st.files.map((f) => `${f.hostId}:${f.state}`)).toEqual(['a:ready']);
  });

  it('serves a 3-replica volume on it whose export reads as the image converted to raw', async () => {
    const vol = await (await env.cluster.createVolume({ name: 'vm-disk', replicas: 3, hosts: ['a', 'b', 'c'], backingImage: 'base' })).status();
    expect(vol.sizeBytes).toBe(64 * MiB);
    expect(vol.backingImage).toBe('base');
    const st = await base.status();
    expect(st.files.map((f) => `${f.hostId}:${f.state}`)).toEqual(['a:ready', 'b:ready', 'c:ready']);
    expect((await env.cluster.volume('vm-disk').attach({ host: 'a', nbd: nbd() })).state, diag()).toBe('healthy');
    await run('qemu-img', ['convert', '-f', 'qcow2', '-O', 'raw', env.tmp.join('base.qcow2'), env.tmp.join('expected.raw')]);
    await run('qemu-img', ['convert', '-f', 'raw', '-O', 'raw', uri(), env.tmp.join('export.raw')]);
    const cmp = await run('cmp', [env.tmp.join('expected.raw'), env.tmp.join('export.raw')], { allowFailure: true });
    expect(cmp.code, cmp.stdout + cmp.stderr).toBe(0);
    // Writes land above the image; the image's own bytes read through where nothing was written.
    await qemuIo(uri(), ['write -P 0xee 1M 64k']);
    const out = await qemuIo(uri(), ['read -P 0xee 1M 64k', 'read -P 0x3c 2M 1M', 'read -P 0x7e 20M 1M']);
    expect(out).not.toMatch(/Pattern verification failed|error/i);
  });

  it('refuses to delete an image a volume uses', async () => {
    await expect(base.delete()).rejects.toMatchObject({ code: 'BUSY' });
  });

  it('completes a copy to a host killed mid-delivery once it restarts', async () => {
    const big = await env.cluster.createBackingImage({ name: 'big', source: { type: 'download', url: http.url('big.raw') }, host: 'a' });
    const st = await big.waitReady({ timeoutMs: 120_000 });
    const b = env.hosts[1]!;
    let killed = false;
    // Killed once a good part is on b, so a copy that started over could not hide behind
    // a few bytes.
    big.on('file-state', (f) => {
      if (!killed && f.hostId === 'b' && f.state === 'in-progress' && f.progress >= KILL_AT_PERCENT) {
        killed = true;
        void b.crash();
      }
    });
    const creating = env.cluster.createVolume({ name: 'big-disk', replicas: 1, hosts: ['b'], backingImage: 'big' });
    expect(await waitFor(async () => killed, 60_000, 20), 'the copy to b never got far').toBe(true);
    await new Promise((r) => setTimeout(r, 1000));
    expect((await big.status()).files.find((f) => f.hostId === 'b')?.state).toMatch(/unknown|failed|in-progress/);
    // What b kept through SIGKILL, read from its disk while it is down.
    const part = join(b.opts.dir, 'backing-images', `big-${st.uuid}`, BACKING_IMAGE_PART_FILE);
    const keptBytes = statSync(part).size;
    expect(keptBytes).toBeGreaterThan(0);
    await b.start();
    // Every report of the copy after the restart starts from what was kept: it resumed.
    const after: number[] = [];
    const unwatch = b.engine.watch((e) => {
      if (e.type === 'backing-image-file' && e.name === 'big' && (e.state === 'starting' || e.state === 'in-progress')) after.push(e.receivedBytes);
    });
    await env.cluster.addHost(b.engine);
    const vol = await (await creating).status();
    unwatch();
    expect(after.length, 'no progress of the resumed copy was seen').toBeGreaterThan(0);
    expect(Math.min(...after), `resumed from ${keptBytes} bytes kept`).toBeGreaterThanOrEqual(keptBytes);
    expect(vol.replicas.map((r) => r.hostId)).toEqual(['b']);
    const file = await b.engine.backingImageFile({ name: 'big', uuid: st.uuid });
    expect(file, diag()).toMatchObject({ state: 'ready', checksum: await sha512File(env.tmp.join('big.raw')) });
  });

  it('deletes copies nobody uses after the cleanup wait, keeping minCopies', async () => {
    await env.cluster.deleteVolume('big-disk');
    const uuid = (await env.cluster.backingImage('big').status()).uuid;
    const gone = await waitFor(
      async () => {
        await env.cluster.repairOnce();
        return (await env.hosts[1]!.engine.backingImageFile({ name: 'big', uuid })) === null;
      },
      CLEANUP_WAIT_MS * 5,
      500,
    );
    expect(gone, diag()).toBe(true);
    // The ready copy on a stays: it is the one minCopies keeps.
    expect((await env.hosts[0]!.engine.backingImageFile({ name: 'big', uuid }))?.state).toBe('ready');
    await env.cluster.backingImage('big').delete();
    expect(await env.hosts[0]!.engine.backingImageFile({ name: 'big', uuid })).toBeNull();
  });
});
