/**
 * Parsers of a lockspace's on-disk areas as sanlock 3.x writes them (little-endian), for
 * the questions no daemon call answers on a host that has not joined: which host ids hold
 * a lease, and which locks the resource index lists (Lockspace.delete, Lockspace.open).
 * Pure functions over bytes read with `readLeaseArea`, so they are unit-tested on their own.
 *
 * Layout of a lockspace at `offset` (1 MiB alignment, 512-byte sectors): host `i`'s lease
 * in sector i - 1 of [offset, offset + 1 MiB); the resource index header in the first
 * sector of [offset + 1 MiB, + 1 MiB) and its 64-byte entries from the next sector; the
 * index's own lease in the MiB after that; lock `n`'s lease at offset + (3 + n) MiB.
 *
 * @packageDocumentation
 */

/** sanlock's magic of a host (delta) lease sector. */
export const DELTA_LEASE_MAGIC = 0x12212010;
/** sanlock's magic of a resource index header. */
export const RINDEX_MAGIC = 0x01042018;
/** Bytes of one resource index entry. */
export const RINDEX_ENTRY_BYTES = 64;

const NAME_BYTES = 48;

/** One host id's lease as it lies on storage. */
export interface HostLeaseRecord {
  /** The host id (its sector's index + 1). */
  hostId: number;
  /** The holder's generation: grows on every join. */
  generation: number;
  /** The holder's last renewal on its own clock, seconds; 0 when released (free). */
  timestamp: number;
  /** The holder's sanlock host name. */
  hostName: string;
}

/** The resource index header and the locks it lists. */
export interface RindexRecord {
  /** The lockspace named in the header. */
  lockspace: string;
  /** Entries it can hold (the lockspace's maxLocks). */
  maxResources: number;
  /** Sector size it was formatted with. */
  sectorBytes: number;
  /** Locks it lists, by entry order, with their lease offsets. */
  entries: Array<{ name: string; offset: number }>;
}

function name(buf: Buffer, at: number): string {
  const raw = buf.subarray(at, at + NAME_BYTES);
  const end = raw.indexOf(0);
  return raw.subarray(0, end < 0 ? NAME_BYTES : end).toString('latin1');
}

function u64(buf: Buffer, at: number): number {
  return Number(buf.readBigUInt64LE(at));
}

/**
 * The held host leases (timestamp not 0) in a lockspace's first MiB. Sectors without a
 * host lease's magic are skipped (a wiped or never-written area holds none).
 *
 * @param area - bytes read from the lockspace's offset
 * @param sectorBytes - the lockspace's sector size (512)
 */
export function parseHostLeases(area: Buffer, sectorBytes = 512): HostLeaseRecord[] {
  const out: HostLeaseRecord[] = [];
  for (let at = 0; at + 256 <= area.length; at += sectorBytes) {
    if (area.readUInt32LE(at) !== DELTA_LEASE_MAGIC) continue;
    const timestamp = u64(area, at + 152);
    if (timestamp === 0) continue;
    out.push({ hostId: at / sectorBytes + 1, generation: u64(area, at + 40), timestamp, hostName: name(area, at + 104) });
  }
  return out;
}

/**
 * The resource index at the start of `area` (the MiB after the host leases), or undefined
 * when it holds no index header.
 *
 * @param area - bytes read from the index's offset (header sector, then entries)
 */
export function parseRindex(area: Buffer): RindexRecord | undefined {
  if (area.length < 512 || area.readUInt32LE(0) !== RINDEX_MAGIC) return undefined;
  const sectorBytes = area.readUInt32LE(12);
  const maxResources = area.readUInt32LE(16);
  const lockspace = name(area, 32);
  const entries: RindexRecord['entries'] = [];
  for (let i = 0; i < maxResources; i++) {
    const at = sectorBytes + i * RINDEX_ENTRY_BYTES;
    if (at + RINDEX_ENTRY_BYTES > area.length) break;
    const entryName = name(area, at + 16);
    if (entryName !== '') entries.push({ name: entryName, offset: u64(area, at) });
  }
  return { lockspace, maxResources, sectorBytes, entries };
}
