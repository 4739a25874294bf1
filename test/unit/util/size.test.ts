import { describe, expect, it } from 'vitest';

import { formatBytes, parseSize } from '../../../src/util/size.js';

describe('parseSize', () => {
  it.each([
    ['4096', 4096],
    ['0', 0],
    ['64K', 64 * 1024],
    ['64k', 64 * 1024],
    ['64KiB', 64 * 1024],
    ['1M', 2 ** 20],
    ['10G', 10 * 2 ** 30],
    ['10gib', 10 * 2 ** 30],
    ['1T', 2 ** 40],
    ['2TiB', 2 ** 41],
    ['512B', 512],
    [' 8M ', 8 * 2 ** 20],
  ])('%s -> %d', (text, bytes) => {
    expect(parseSize(text)).toBe(bytes);
  });
  it.each(['', 'abc', '1.5G', '-1', '10GB', '10KB', '1X', 'G', '1 0M', '99999999999999999999T'])('refuses %j', (text) => {
    expect(() => parseSize(text)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
  });
});

describe('formatBytes', () => {
  it('formats binary units', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(4096)).toBe('4 KiB');
    expect(formatBytes(1.5 * 2 ** 30)).toBe('1.5 GiB');
    expect(formatBytes(2 ** 40)).toBe('1 TiB');
  });
});
