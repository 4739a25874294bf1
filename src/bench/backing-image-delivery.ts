/**
 * Backing image delivery: two `mooring data-engine` processes on loopback. A file
 * of random bytes is uploaded into h0 (writeBackingImageFile), then copied to h1 twice:
 * relayed through this process (h0's readBackingImageFile stream fed into h1's
 * writeBackingImageFile, the fallback for data engines without the pull), then, after h1's
 * copy was deleted, pulled by h1 from h0 directly (pullBackingImageFile, the controller's
 * way: over the replica protocol, h0 announcing it); each checked against the SHA-512 on arrival. Throughput = file bytes / copy time,
 * against the disk's own sequential write rate (the rebuild step's fio job).
 */
import { createHash } from 'node:crypto';
import { createReadStream, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';

import type { BackingImageFileRef } from '../data-engine/data-engine.js';
import type { RemoteDataEngine } from '../data-engine/grpc/remote-data-engine.js';
import { diskSeqWriteMibPerSec } from './rebuild.js';
import { startBenchHost, type BenchHost } from './remote-hosts.js';
import type { TargetContext } from './targets.js';

/** Replica ports of the delivery hosts (distinct from the rebuild and remote-target ones). */
const DELIVERY_PORT_OFFSET = 50;
/** Largest file copied (the test area caps it too): a few hundred MiB is what an OS image is. */
const DELIVERY_FILE_BYTES_MAX = 512 * 1024 ** 2;
/** Random bytes are written in pieces of this size (random data: nothing compresses or is sparse). */
const FILL_CHUNK_BYTES = 16 * 1024 ** 2;

export interface BackingImageDeliveryResults {
  fileBytes: number;
  /** Upload into the first host (a stream from a local file through gRPC). */
  upload: { durationMs: number; mibPerSec: number };
  /**
   * Copy from h0 to h1, pulled by h1 from h0 directly (data engine to data engine), verified
   * on arrival; `via`: how the bytes travelled, as h1 logged it.
   */
  delivery: { durationMs: number; mibPerSec: number; via: 'replica protocol' | 'gRPC' | 'unknown' };
  /** The same copy relayed through this process (the fallback), verified on arrival. */
  relay?: { durationMs: number; mibPerSec: number };
  /** fio sequential write to a file on the same filesystem, fsync at the end. */
  diskSeqWriteMibPerSec: number;
}

/** Measures one upload and one copy; both hosts are stopped when it returns or throws. */
export async function measureBackingImageDelivery(ctx: TargetContext): Promise<BackingImageDeliveryResults> {
  const hosts: BenchHost[] = [];
  try {
    for (let i = 0; i < 2; i++) hosts.push(await startBenchHost(ctx, i, ctx.portBase + DELIVERY_PORT_OFFSET + i));
    const [h0, h1] = hosts as [BenchHost, BenchHost];
    const size = Math.min(DELIVERY_FILE_BYTES_MAX, ctx.areaBytes);
    const path = join(ctx.dir, 'image.raw');
    const hash = createHash('sha512');
    writeFileSync(path, Buffer.alloc(0));
    for (let at = 0; at < size; at += FILL_CHUNK_BYTES) {
      const chunk = randomBytes(Math.min(FILL_CHUNK_BYTES, size - at));
      hash.update(chunk);
      writeFileSync(path, chunk, { flag: 'a' });
    }
    const checksum = hash.digest('hex');
    const ref: BackingImageFileRef = { name: 'bench-image', uuid: '00000000-0000-4000-8000-000000000001' };

    let t0 = performance.now();
    await h0.engine.writeBackingImageFile(ref, { sizeBytes: size, offset: 0, expectedChecksum: checksum }, createReadStream(path));
    const uploadMs = performance.now() - t0;
    ctx.log(`  upload into h0: ${(size / 1024 ** 2).toFixed(0)} MiB in ${(uploadMs / 1000).toFixed(2)} s`);

    t0 = performance.now();
    await h1.engine.writeBackingImageFile(ref, { sizeBytes: size, offset: 0, expectedChecksum: checksum }, h0.engine.readBackingImageFile(ref));
    const relayMs = performance.now() - t0;
    const relayMibPerSec = size / 1024 ** 2 / (relayMs / 1000);
    ctx.log(`  copy h0 → h1 relayed: ${(size / 1024 ** 2).toFixed(0)} MiB in ${(relayMs / 1000).toFixed(2)} s = ${relayMibPerSec.toFixed(0)} MiB/s`);
    await h1.engine.deleteBackingImageFile(ref);

    const pull = h1.engine.pullBackingImageFile;
    if (!pull) throw new Error('the data engine client has no pullBackingImageFile');
    t0 = performance.now();
    await pull.call(h1.engine, ref, { sizeBytes: size, offset: 0, expectedChecksum: checksum, source: { address: (h0.engine as RemoteDataEngine).address, hostId: h0.hostId } });
    const deliveryMs = performance.now() - t0;
    const mibPerSec = size / 1024 ** 2 / (deliveryMs / 1000);
    const logged = h1.stderr.toString();
    const via = logged.includes(`${ref.name}-${ref.uuid} from ${h0.hostId} at byte 0 over the replica protocol`)
      ? 'replica protocol'
      : logged.includes(`${ref.name}-${ref.uuid} from ${h0.hostId} at byte 0 over gRPC`)
        ? 'gRPC'
        : 'unknown';
    ctx.log(`  copy h0 → h1 pulled directly over ${via}: ${(size / 1024 ** 2).toFixed(0)} MiB in ${(deliveryMs / 1000).toFixed(2)} s = ${mibPerSec.toFixed(0)} MiB/s`);

    const seq = await diskSeqWriteMibPerSec(ctx, size);
    ctx.log(`  disk sequential write: ${seq.toFixed(0)} MiB/s`);
    return {
      fileBytes: size,
      upload: { durationMs: uploadMs, mibPerSec: size / 1024 ** 2 / (uploadMs / 1000) },
      delivery: { durationMs: deliveryMs, mibPerSec, via },
      relay: { durationMs: relayMs, mibPerSec: relayMibPerSec },
      diskSeqWriteMibPerSec: seq,
    };
  } finally {
    for (const h of hosts.reverse()) await h.stop().catch(() => undefined);
  }
}
