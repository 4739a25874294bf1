// A full disk on replica hosts, with three `mooring data-engine` processes whose
// directories are size-limited filesystems (tmpfs mounts; root is required, as in CI):
// host c's is the smallest. Writing fills c first: its replica goes ERR and the volume
// keeps serving from a and b with no client-visible error; only when a and b are full too
// does the client get ENOSPC; what was acknowledged reads back.
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { Mooring } from '../../../src/mooring.js';
import type { FileStateStore } from '../../../src/state/file-state-store.js';
import { HostProcess, openCluster } from '../helpers/hosts.js';
import { NbdClient, NbdReplyError } from '../helpers/nbd-client.js';
import { killAllServers } from '../helpers/serve.js';
import { TempDir } from '../helpers/tools.js';

const MiB = 1 << 20;
const SIZE = 96 * MiB;
const VOLUME = 'full';
const ENOSPC = 28;
// Filesystem sizes per host: replica metadata and layer files need a little room besides data.
const FS_MIB = { a: 72, b: 72, c: 24 } as const;

describe('full disks on replica hosts', () => {
  const tmp = new TempDir();
  const mounts: string[] = [];
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  let store: FileStateStore;

  beforeAll(async () => {
    if (process.getuid?.() !== 0) throw new Error('this test mounts tmpfs filesystems and must run as root (CI does)');
    let i = 0;
    for (const [id, mib] of Object.entries(FS_MIB)) {
      const dir = tmp.join(`host-${id}`);
      mkdirSync(dir, { recursive: true });
      execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${mib}m`, 'tmpfs', dir]);
      mounts.push(dir);
      hosts.push(new HostProcess({ hostId: id, dir, ip: `127.0.0.${21 + i}`, replicaPort: 17360 + i }));
      i++;
    }
    for (const h of hosts) await h.start();
    ({ cluster, store } = await openCluster(join(tmp.path, 'mgr'), hosts));
  });

  afterAll(async () => {
    await cluster?.close();
    await store?.close();
    for (const h of hosts) await h.stop().catch(() => undefined);
    await killAllServers();
    for (const m of mounts) execFileSync('umount', ['-l', m]);
    tmp.cleanup();
  });

  it('drops the full replica, keeps serving, and reports ENOSPC only when every replica is full', async () => {
    await cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] });
    const sock = tmp.join('full.sock');
    await cluster.volume(VOLUME).attach({ host: 'a', nbd: `unix:${sock}` });
    const client = await NbdClient.connect(`nbd+unix:///?socket=${sock}`);
    const chunk = (i: number): Buffer => Buffer.alloc(MiB, (i % 250) + 1);

    // Fill MiB by MiB. c (24 MiB) fills first; a and b (72 MiB) later.
    let written = 0;
    let cDroppedAt = -1;
    let enospcAt = -1;
    for (let i = 0; i < SIZE / MiB; i++) {
      try {
        await client.write(i * MiB, chunk(i));
        written = i + 1;
      } catch (err) {
        expect(err, String(err)).toBeInstanceOf(NbdReplyError);
        expect((err as NbdReplyError).errno, String(err)).toBe(ENOSPC);
        enospcAt = i;
        break;
      }
      if (cDroppedAt < 0) {
        const st = await cluster.volume(VOLUME).status();
        if (st.replicas.find((r) => r.hostId === 'c')?.mode === 'ERR') cDroppedAt = i;
      }
    }
    const st = await cluster.volume(VOLUME).status();
    console.log(`full disk: c dropped after ${cDroppedAt + 1} MiB, ENOSPC at ${enospcAt} MiB, ${written} MiB acknowledged; ${JSON.stringify(st.replicas)}`);
    expect(cDroppedAt, 'replica on c never went ERR').toBeGreaterThanOrEqual(0);
    expect(cDroppedAt).toBeLessThan(FS_MIB.c);
    // The client wrote well past c's capacity without an error...
    expect(written).toBeGreaterThan(FS_MIB.c + 8);
    // ...and got ENOSPC only once a and b were full too.
    expect(enospcAt, 'the client never saw ENOSPC').toBeGreaterThan(0);
    expect(enospcAt).toBeLessThanOrEqual(FS_MIB.a);
    expect(st.replicas.find((r) => r.hostId === 'c')?.mode).toBe('ERR');

    // Everything acknowledged reads back.
    for (let i = 0; i < written; i++) {
      const got = await client.read(i * MiB, MiB);
      expect(got.equals(chunk(i)), `MiB ${i} lost`).toBe(true);
    }
    await client.disconnect();
    // With every disk full the engine cannot mark its replicas clean: detach still detaches
    // and reports that as a warning.
    const warnings: string[] = [];
    cluster.on('warning', (e) => warnings.push(`${e.code}: ${e.message}`));
    await cluster.volume(VOLUME).detach();
    expect((await cluster.volume(VOLUME).status()).state).toBe('detached');
    console.log(`detach warnings: ${JSON.stringify(warnings)}`);
  });
});
