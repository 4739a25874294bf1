// The parsers of a lockspace's on-disk areas (src/locks/lease-area.ts) over sectors built
// here in sanlock 3.x's layout. What real daemons write is parsed in
// test/system/locks/lockspace-lifecycle.test.ts (delete names hosts from their leases).
import { describe, expect, it } from 'vitest';

import { parseHostLeases, parseRindex } from '../../../src/locks/lease-area.js';
import { hostArea, rindexArea } from '../fakes/lease-areas.js';

const MIB = 1024 * 1024;

describe('lease-area parsers', () => {
  it('lists held host leases only, with id, generation, timestamp and host name', () => {
    const area = hostArea([
      { hostId: 1, generation: 3, timestamp: 0, hostName: 'gone' },
      { hostId: 2, generation: 5, timestamp: 1234, hostName: 'host-b' },
      { hostId: 2000, generation: 1, timestamp: 9, hostName: 'h2000' },
    ]);
    expect(parseHostLeases(area)).toEqual([
      { hostId: 2, generation: 5, timestamp: 1234, hostName: 'host-b' },
      { hostId: 2000, generation: 1, timestamp: 9, hostName: 'h2000' },
    ]);
  });

  it('finds no lease in a zeroed area, and ignores sectors without the magic', () => {
    expect(parseHostLeases(Buffer.alloc(MIB))).toEqual([]);
    const area = hostArea([{ hostId: 3, generation: 1, timestamp: 7, hostName: 'x' }], 0);
    expect(parseHostLeases(area)).toEqual([]);
  });

  it('reads the resource index header and its named entries', () => {
    const r = parseRindex(rindexArea(4 * MIB, 8, [{ slot: 0, name: 'disk1' }, { slot: 5, name: 'disk6' }]));
    expect(r).toEqual({
      lockspace: 'ls1',
      maxResources: 8,
      sectorBytes: 512,
      entries: [
        { name: 'disk1', offset: 7 * MIB },
        { name: 'disk6', offset: 12 * MIB },
      ],
    });
    expect(parseRindex(Buffer.alloc(MIB))).toBeUndefined();
  });
});
