// SHA-512 of backing image files: computed while bytes are written, and over
// bytes already on disk (the prefix of a partial file being resumed, a ready file verified
// again after a restart). Reads are bounded chunks, so memory does not grow with the file.
import { createHash, type Hash } from 'node:crypto';
import { open } from 'node:fs/promises';

import { MooringError, toMooringError } from '../errors.js';
import { describe } from '../util/validate.js';

/** Chunk read when hashing a file already on disk. */
export const HASH_READ_CHUNK_BYTES = 1024 * 1024;

/** A SHA-512 in hex: 128 lowercase hex digits. */
export const SHA512_HEX_PATTERN = /^[0-9a-f]{128}$/;

/** A new SHA-512 hash. */
export function newSha512(): Hash {
  return createHash('sha512');
}

/**
 * Checks an optional expected checksum: a SHA-512 in hex (either case; returned lowercase),
 * or undefined / '' for none.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function checkChecksum(what: string, value: unknown): string | undefined {
  if (value === undefined || value === '') return undefined;
  if (typeof value !== 'string' || !SHA512_HEX_PATTERN.test(value.toLowerCase())) {
    throw new MooringError('INVALID_ARGUMENT', `${what} must be a SHA-512 in hex (128 hex digits; got ${describe(value)})`);
  }
  return value.toLowerCase();
}

/**
 * Feeds the first `lengthBytes` of `path` into `hash` (the whole file when undefined) and
 * returns how many bytes it fed. A file shorter than `lengthBytes` is an IO_ERROR: the
 * caller's idea of what is on disk is wrong.
 *
 * @param signal - stops a long hash (CANCELLED)
 */
export async function hashFileInto(path: string, hash: Hash, lengthBytes?: number, signal?: AbortSignal): Promise<number> {
  let fh;
  try {
    fh = await open(path, 'r');
  } catch (err) {
    throw toMooringError(err, `opening ${path}`);
  }
  try {
    const buf = Buffer.allocUnsafe(HASH_READ_CHUNK_BYTES);
    let at = 0;
    for (;;) {
      if (signal?.aborted) throw new MooringError('CANCELLED', `hashing ${path} was cancelled`);
      const want = lengthBytes === undefined ? buf.length : Math.min(buf.length, lengthBytes - at);
      if (want === 0) break;
      const { bytesRead } = await fh.read(buf, 0, want, at);
      if (bytesRead === 0) {
        if (lengthBytes !== undefined) throw new MooringError('IO_ERROR', `${path} holds ${at} bytes, ${lengthBytes} expected`);
        break;
      }
      hash.update(buf.subarray(0, bytesRead));
      at += bytesRead;
    }
    return at;
  } catch (err) {
    throw toMooringError(err, `hashing ${path}`);
  } finally {
    await fh.close();
  }
}
