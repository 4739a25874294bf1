// A small NBD READ whose bytes a replica in this process holds in the page cache is answered
// by the connection loop itself, without the hand-off to a worker (BlockDevice::TryRead,
// NbdConnection::TryReadInline; docs/architecture.md "How a write travels"). Anything else
// (bytes not cached, larger reads) goes to a worker as before, and the bytes are the same
// either way.
import { execFileSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

import type { NativeEngine, NativeNbdServer } from '../../src/native/binding.js';
import { NbdClient } from '../system/helpers/nbd-client.js';
import { addon, createReplicas, engineOptions, MiB, pattern, Scratch } from './helpers.js';

const SIZE = 8 * MiB;

// Drops the clean pages of every file under dir from the page cache.
function evict(dir: string): void {
  const files: string[] = [];
  const walk = (d: string): void => {
    for (const name of readdirSync(d)) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) walk(p);
      else files.push(p);
    }
  };
  walk(dir);
  const script = 'import os,sys\nfor p in sys.argv[1:]:\n fd=os.open(p,os.O_RDONLY)\n os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)\n os.close(fd)\n';
  execFileSync('python3', ['-c', script, ...files], { stdio: ['ignore', 'inherit', 'inherit'] });
}

describe('NBD reads answered on the connection loop', () => {
  let s: Scratch | undefined;
  let engine: NativeEngine | undefined;
  let nbd: NativeNbdServer | undefined;
  let client: NbdClient | undefined;
  afterEach(async () => {
    client?.destroy();
    await nbd?.close().catch(() => undefined);
    await engine?.close().catch(() => undefined);
    s?.cleanup();
    client = undefined;
    nbd = undefined;
    engine = undefined;
    s = undefined;
  });

  it('answers cached small reads itself, sends the rest to a worker, with the same bytes', async () => {
    s = new Scratch('mooring-nbd-inline-');
    const [replica] = await createReplicas(s.path('replicas'), 1, SIZE);
    engine = await addon().openEngine(engineOptions({ replicas: [replica!.path] }));
    const sock = s.path('nbd.sock');
    nbd = await engine.exportNbd({ unixPath: sock });
    const c = (client = await NbdClient.connect({ socketPath: sock }));
    expect(c.structured).toBe(true);
    const inline = (): number => nbd!.ioStats!().inlineReads;

    const N = 32;
    for (let i = 0; i < N; i++) await c.write(i * 4096, pattern(40 + i, 4096));
    await c.flush();
    const before = inline();
    for (let i = 0; i < N; i++) expect((await c.read(i * 4096, 4096)).equals(pattern(40 + i, 4096)), `block ${i}`).toBe(true);
    // A hole reads as zeros (one data chunk).
    expect((await c.read(4 * MiB, 64 * 1024)).equals(Buffer.alloc(64 * 1024))).toBe(true);
    expect(inline() - before).toBe(N + 1);

    // Larger than 64 KiB: a worker's.
    const big = await c.read(0, 128 * 1024);
    for (let i = 0; i < N; i++) expect(big.subarray(i * 4096, (i + 1) * 4096).equals(pattern(40 + i, 4096))).toBe(true);
    expect(inline() - before).toBe(N + 1);

    // Out of the page cache: a worker reads it (from disk), and then it is cached again.
    // (One block: the kernel's read-ahead may bring its neighbours back with it.)
    evict(replica!.path);
    const cold = inline();
    expect((await c.read(8 * 4096, 4096)).equals(pattern(48, 4096))).toBe(true);
    expect(inline()).toBe(cold);
    expect((await c.read(8 * 4096, 4096)).equals(pattern(48, 4096))).toBe(true);
    expect(inline()).toBe(cold + 1);
    expect(nbd.stats().requests).toBeGreaterThan(2 * N);
  });
});
