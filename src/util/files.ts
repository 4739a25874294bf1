// File helpers for the control plane's own metadata. All async (libuv threads), never
// blocking the event loop.
import { constants as fsConstants } from 'node:fs';
import { lstat, mkdir, open, readdir, rename, stat, unlink } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { basename, dirname, join, resolve } from 'node:path';

import { MooringError, toMooringError } from '../errors.js';

/**
 * The mode of every file the control plane and the data path create: VM disks and their
 * metadata are for the service's own user only (QEMU reaches a volume through its NBD
 * socket, never through these files).
 */
export const PRIVATE_FILE_MODE = 0o600;
/** The mode of every directory Mooring creates (see {@link PRIVATE_FILE_MODE}). */
export const PRIVATE_DIR_MODE = 0o700;

// How metadata files are opened: a symlink planted in their place is refused (ELOOP), and a
// FIFO or device does not block the open (a FIFO with no writer would hold a libuv thread,
// and the process, for ever); the fstat that follows refuses anything but a regular file.
const METADATA_OPEN_FLAGS = fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK | fsConstants.O_NOCTTY;

/**
 * Writes `data` to `path` atomically and durably (invariant 4): a temporary file in the
 * same directory, fsync, rename over `path`, fsync the directory. A crash leaves either the
 * old or the new content, never a mix.
 */
export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  const dir = dirname(path);
  const tmp = join(dir, `.${basename(path)}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  try {
    const fh = await open(tmp, 'wx', PRIVATE_FILE_MODE);
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
 * reading them (a hostile file must not make us allocate without bound). Anything but a
 * regular file is refused at once with `tooLargeCode`, and so is a symbolic link unless
 * `options.followSymlinks` (files the user names, such as certificates mounted as links).
 */
export async function readFileLimited(
  path: string,
  maxBytes: number,
  tooLargeCode: 'CORRUPT_METADATA' | 'INVALID_ARGUMENT' = 'CORRUPT_METADATA',
  options: { followSymlinks?: boolean } = {},
): Promise<string> {
  let fh;
  try {
    fh = await open(path, options.followSymlinks ? METADATA_OPEN_FLAGS & ~fsConstants.O_NOFOLLOW : METADATA_OPEN_FLAGS);
  } catch (err) {
    if ((err as { code?: string }).code === 'ELOOP') {
      throw new MooringError(tooLargeCode, `${path} is a symbolic link; Mooring does not follow links to metadata`, { cause: err });
    }
    throw toMooringError(err, `opening ${path}`);
  }
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new MooringError(tooLargeCode, `${path} is not a regular file (${fileKind(st)})`);
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

/** What a non-regular file is, for messages. */
function fileKind(st: import('node:fs').Stats): string {
  if (st.isDirectory()) return 'a directory';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isSocket()) return 'a socket';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device';
  return 'not a regular file';
}

/**
 * Creates `dir` and its missing parents with `mode` (default {@link PRIVATE_DIR_MODE}), one
 * level at a time, and returns the directories it created (outermost first; empty when
 * `dir` existed). Node's `mkdir({ recursive: true })` is not used: where a filesystem
 * refuses new entries with ENOENT (procfs, sysfs) it retries for ever at full CPU.
 *
 * @throws MooringError INVALID_ARGUMENT (a component is not a directory, or its filesystem
 *   takes no new entries), READ_ONLY_FILESYSTEM, PERMISSION_DENIED, NO_SPACE, IO_ERROR
 */
export async function ensureDirectory(dir: string, mode: number = PRIVATE_DIR_MODE): Promise<string[]> {
  const missing: string[] = [];
  for (let cur = resolve(dir); ; ) {
    const st = await stat(cur).catch((err: unknown) => {
      if ((err as { code?: string }).code === 'ENOENT') return null;
      throw toMooringError(err, `checking ${cur}`);
    });
    if (st) {
      if (!st.isDirectory()) throw new MooringError('INVALID_ARGUMENT', `${cur} exists and is not a directory`);
      break;
    }
    missing.unshift(cur);
    const parent = dirname(cur);
    if (parent === cur) break;
    cur = parent;
  }
  const made: string[] = [];
  for (const d of missing) {
    try {
      await mkdir(d, { mode });
      made.push(d);
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === 'EEXIST' && (await stat(d).catch(() => null))?.isDirectory()) continue; // created meanwhile
      if (code === 'ENOENT') {
        // Its parent exists (it was just checked or made): the parent's filesystem takes no
        // new directories.
        throw new MooringError('INVALID_ARGUMENT', `cannot create ${d}: ${dirname(d)} takes no new directories`, { cause: err, errno: osErrno(err) });
      }
      throw toMooringError(err, `creating ${d}`);
    }
  }
  return made;
}

function osErrno(err: unknown): number | undefined {
  const n = (err as { errno?: unknown }).errno;
  return typeof n === 'number' ? n : undefined;
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
