import { describe, expect, it } from 'vitest';

import { SortedKeys } from '../../../src/state/sorted-keys.js';

describe('SortedKeys', () => {
  it('keeps keys in code-unit order, once each, and lists a prefix as its range', () => {
    const k = SortedKeys.of(['vol-b-r1', 'vol-a-r0', 'vol-a-r0', 'Vol', 'vol-a-r1']);
    expect(k.withPrefix('')).toEqual(['Vol', 'vol-a-r0', 'vol-a-r1', 'vol-b-r1']);
    k.add('vol-a-r2');
    k.add('vol-a-r2');
    k.delete('vol-b-r1');
    k.delete('missing');
    expect(k.size).toBe(4);
    expect(k.withPrefix('vol-a-')).toEqual(['vol-a-r0', 'vol-a-r1', 'vol-a-r2']);
    expect(k.withPrefix('vol-b-')).toEqual([]);
    expect(k.withPrefix('zzz')).toEqual([]);
    expect([k.has('Vol'), k.has('vol'), k.has('vol-a-r2')]).toEqual([true, false, true]);
    // A copy: changing it changes nothing.
    k.withPrefix('').push('x');
    expect(k.size).toBe(4);
  });
});
