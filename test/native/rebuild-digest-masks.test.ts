// Rebuild over the replica protocol, from a source behind a replica server: for a window
// the target holds nothing of, the engine asks the source for the masks of its blocks only
// (LAYER_DIGEST with the masks-only flag, announced by the server's kFeatureDigestMasks:
// the source reads and hashes nothing there). A source that does not announce the feature
// (an older release, played by a proxy that zeroes the HELLO reply's feature bits) is never
// sent the flag and answers full digests. Either way the rebuilt replica ends identical to
// the source, holes included.
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { addon, assertDirsIdentical, engineOptions, MiB, pattern, Scratch } from './helpers.js';
import { closeAll, endpoint, FrameProxy, type Host, Op, REP_HEADER, startHosts } from './remote-helpers.js';

const SIZE = 32 * MiB;
const FLAG_MASKS_ONLY = 32;

describe('rebuild digests: masks only where the target holds nothing', () => {
  let s: Scratch;
  let hosts: Host[] = [];
  const cleanups: Array<() => Promise<void>> = [];
  beforeAll(() => {
    s = new Scratch('mooring-rebuild-masks-');
  });
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
    await closeAll(hosts);
    hosts = [];
  });
  afterAll(() => s.cleanup());

  /** Rebuilds host 1's empty replica from host 0's, reached through a proxy; returns the LAYER_DIGEST requests the source saw, by flags. */
  async function rebuildThroughProxy(olderSource: boolean): Promise<{ masksOnly: number; full: number }> {
    hosts = await startHosts(s, 2, SIZE);
    const proxy = new FrameProxy(hosts[0]!.server.port);
    const seen = { masksOnly: 0, full: 0 };
    proxy.onRequest = (f) => {
      if (f.readUInt8(5) !== Op.LAYER_DIGEST) return;
      if (f.readUInt16LE(6) & FLAG_MASKS_ONLY) seen.masksOnly++;
      else seen.full++;
    };
    if (olderSource) {
      // The HELLO reply's feature bits (payload bytes 8..15) as a server before them sent them: zeros.
      proxy.rewriteReply = (frame, n) => {
        if (n === 0) frame.fill(0, REP_HEADER + 8, REP_HEADER + 16);
        return frame;
      };
    }
    await proxy.start();
    cleanups.push(() => proxy.close());
    const e = await addon().openEngine(engineOptions({ replicas: [endpoint(proxy.port)] }));
    cleanups.push(() => e.close());
    // Data in two runs with a hole between them and after them, across window boundaries.
    await e.write(0, pattern(31, 9 * MiB));
    await e.write(13 * MiB + 4096, pattern(32, 11 * MiB));
    const before = { ...seen };
    const result = await e.addReplica(endpoint(hosts[1]!.server.port), 'r1');
    expect(result.sentBytes).toBe(20 * MiB);
    expect(e.replicas().map((r) => r.mode)).toEqual(['RW', 'RW']);
    await e.close();
    cleanups.length = 0;
    await proxy.close();
    await closeAll(hosts);
    await assertDirsIdentical(hosts.map((h) => join(h.root, 'vol')));
    return { masksOnly: seen.masksOnly - before.masksOnly, full: seen.full - before.full };
  }

  it('asks a current source for masks only: no full digest of a window the empty target holds nothing of', async () => {
    const seen = await rebuildThroughProxy(false);
    expect(seen.masksOnly).toBeGreaterThan(0);
    expect(seen.full).toBe(0);
  });

  it('never sends the flag to a source that does not announce the feature (an older release): full digests, same result', async () => {
    const seen = await rebuildThroughProxy(true);
    expect(seen.masksOnly).toBe(0);
    expect(seen.full).toBeGreaterThan(0);
  });
});
