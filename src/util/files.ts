// File helpers for the control plane's own metadata. All async (libuv threads), never
// blocking the event loop.
import { lstat, open, readdir, rename, stat, unlink } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { basename, dirname, join } from 'node:path';

import { MooringError, toMooringError } from '../errors.js';

/**
 * Writes `data` to `path` atomically and durably (invariant 4): a temporary file in the
 * same directory, fsync, rename over `path`, fsync the directory. A crash leaves either the
 * old or the new content, never a mix.
 */
export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  const dir = dirname(path);
  const tmp = join(dir, `.${basename(path)}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  try {
    const fh = await open(tmp, 'wx', 0o644);
    try {
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path);
    await syncDirectory(dir);
  } catch (err) {
    await unlink(tmp).catch(() => undefined);
    throw toMooringError(err, `writing ${path}`);
  }
}

/** fsyncs a directory, so a rename or unlink in it survives a crash. */
export async function syncDirectory(dir: string): Promise<void> {
  const dh = await open(dir, 'r');
  try {
    await dh.sync();
  } finally {
    await dh.close();
  }
}

/**
 * Reads a whole file of at most `maxBytes`, refusing larger ones with `tooLargeCode` before
 * reading them (a hostile file must not make us allocate without bound).
 */
export async function readFileLimited(
  path: string,
  maxBytes: number,
  tooLargeCode: 'CORRUPT_METADATA' | 'INVALID_ARGUMENT' = 'CORRUPT_METADATA',
): Promise<string> {
  let fh;
  try {
    fh = await open(path, 'r');
  } catch (err) {
    throw toMooringError(err, `opening ${path}`);
  }
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new MooringError(tooLargeCode, `${path} is not a regular file`);
    if (st.size > maxBytes) {
      throw new MooringError(tooLargeCode, `${path} is ${st.size} bytes, more than the ${maxBytes} allowed`);
    }
    const buf = Buffer.alloc(Math.min(st.size, maxBytes) + 1);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    if (bytesRead > maxBytes) {
      throw new MooringError(tooLargeCode, `${path} grew past the ${maxBytes} bytes allowed while being read`);
    }
    return buf.subarray(0, bytesRead).toString('utf8');
  } catch (err) {
    throw toMooringError(err, `reading ${path}`);
  } finally {
    await fh.close();
  }
}

/** 'missing', 'empty' (a directory with no entries) or 'non-empty'; throws if not a directory. */
export async function directoryState(dir: string): Promise<'missing' | 'empty' | 'non-empty'> {
  try {
    const st = await stat(dir);
    if (!st.isDirectory()) throw new MooringError('INVALID_ARGUMENT', `${dir} exists and is not a directory`);
  } catch (err) {
    if ((err as { code?: string }).code === 'ENOENT') return 'missing';
    throw toMooringError(err, `checking ${dir}`);
  }
  const entries = await readdir(dir).catch((err: unknown) => {
    throw toMooringError(err, `listing ${dir}`);
  });
  return entries.length === 0 ? 'empty' : 'non-empty';
}

/** Whether anything (file, directory, dangling symlink) exists at `path`. */
export async function pathExists(path: string): Promise<boolean> {
  try {
    await lstat(path);
    return true;
  } catch {
    return false;
  }
}
