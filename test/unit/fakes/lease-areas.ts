// Lockspace storage areas in sanlock 3.x's on-disk layout (little-endian), built for unit
// tests: host (delta) leases in the first MiB, the resource index header and entries in the next.
import { DELTA_LEASE_MAGIC, RINDEX_MAGIC } from '../../../src/locks/lease-area.js';

const MIB = 1024 * 1024;

/** One host lease to write. */
export interface Lease {
  hostId: number;
  generation: number;
  timestamp: number;
  hostName: string;
}

export function hostArea(leases: Lease[], valid = 2000): Buffer {
  const b = Buffer.alloc(MIB);
  for (let i = 0; i < valid; i++) b.writeUInt32LE(DELTA_LEASE_MAGIC, i * 512);
  for (const l of leases) {
    const at = (l.hostId - 1) * 512;
    b.writeBigUInt64LE(BigInt(l.hostId), at + 32);
    b.writeBigUInt64LE(BigInt(l.generation), at + 40);
    b.write('ls1', at + 56, 'latin1');
    b.write(l.hostName, at + 104, 'latin1');
    b.writeBigUInt64LE(BigInt(l.timestamp), at + 152);
  }
  return b;
}

export function rindexArea(base: number, maxResources: number, locks: Array<{ slot: number; name: string }>): Buffer {
  const b = Buffer.alloc(MIB);
  b.writeUInt32LE(RINDEX_MAGIC, 0);
  b.writeUInt32LE(512, 12);
  b.writeUInt32LE(maxResources, 16);
  b.writeBigUInt64LE(BigInt(base + MIB), 24);
  b.write('ls1', 32, 'latin1');
  for (const l of locks) {
    const at = 512 + l.slot * 64;
    b.writeBigUInt64LE(BigInt(base + (3 + l.slot) * MIB), at);
    b.write(l.name, at + 16, 'latin1');
  }
  return b;
}
