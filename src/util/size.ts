// Sizes as people write them (CLI): bytes, or binary multiples with a suffix.
import { MooringError } from '../errors.js';
import { describe } from './validate.js';

const SUFFIX_SHIFT: Record<string, number> = {
  '': 0,
  b: 0,
  k: 10,
  kib: 10,
  m: 20,
  mib: 20,
  g: 30,
  gib: 30,
  t: 40,
  tib: 40,
  p: 50,
  pib: 50,
};

/**
 * Parses `"4096"`, `"64M"`, `"10GiB"`, `"1T"`: a whole number with an optional binary
 * suffix (K/M/G/T/P or KiB/MiB/GiB/TiB/PiB, any case; B for bytes). Decimal suffixes such as
 * "KB" or "GB" are refused rather than guessed.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function parseSize(text: string): number {
  const m = /^\s*(\d{1,20})\s*([A-Za-z]{0,3})\s*$/.exec(text);
  const shift = m ? SUFFIX_SHIFT[m[2]!.toLowerCase()] : undefined;
  if (!m || shift === undefined) {
    throw new MooringError(
      'INVALID_ARGUMENT',
      `invalid size ${describe(text)}: use bytes or a whole number with K, M, G, T (or KiB, MiB, GiB, TiB; binary multiples)`,
    );
  }
  const value = Number(m[1]) * 2 ** shift;
  if (!Number.isSafeInteger(value)) {
    throw new MooringError('INVALID_ARGUMENT', `size ${describe(text)} is too large (max ${Number.MAX_SAFE_INTEGER} bytes)`);
  }
  return value;
}

/** Formats a byte count for people: "64 MiB", "1.5 GiB", "4096 B". */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let v = bytes;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  const text = Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 1).replace(/\.?0+$/, '');
  return `${text} ${units[i]}`;
}
