// The addon's readLeaseArea (native/src/sanlock/lease-area.cc): reads a span of a
// lockspace's storage with O_DIRECT and no daemon. What sanlock writes there is read back
// in test/system/locks/lockspace-lifecycle.test.ts; here, the bytes, the bounds and the errors.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { callNative } from '../../src/errors.js';
import { MiB, addon } from './helpers.js';

let dir: string;
let file: string;
const content = Buffer.alloc(3 * MiB);
for (let i = 0; i < content.length; i += 4) content.writeUInt32LE(i, i);

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'mooring-lease-area-'));
  file = join(dir, 'area.img');
  writeFileSync(file, content);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('sanlock.readLeaseArea', () => {
  const read = (path: string, offset: number, length: number) => callNative(() => addon().sanlock.readLeaseArea(path, offset, length));

  it('returns the bytes at a sector-aligned offset', async () => {
    const b = await read(file, MiB + 512, MiB);
    expect(b.length).toBe(MiB);
    expect(b.equals(content.subarray(MiB + 512, 2 * MiB + 512))).toBe(true);
  });

  it('returns fewer bytes where the storage ends', async () => {
    const b = await read(file, 2 * MiB + 1024, MiB);
    expect(b.equals(content.subarray(2 * MiB + 1024))).toBe(true);
    expect((await read(file, 4 * MiB, 512)).length).toBe(0);
  });

  it('refuses unaligned or oversized spans with INVALID_ARGUMENT', async () => {
    await expect(read(file, 100, 512)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(read(file, 0, 513)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(read(file, 0, 0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(read(file, 0, 4 * MiB + 512)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('says which file is missing (NOT_FOUND)', async () => {
    const err = await read(join(dir, 'none.img'), 0, 512).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'NOT_FOUND' });
    expect((err as Error).message).toContain('none.img');
  });
});
