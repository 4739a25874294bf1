import { readFileSync } from 'node:fs';
import { describe, expect, it, vi } from 'vitest';

import {
  MooringError,
  MooringErrorCode,
  callNative,
  callNativeSync,
  codeFromErrno,
  isMooringError,
  toMooringError,
} from '../../src/errors.js';
import { nativeError } from './fakes/fake-addon.js';

describe('MooringErrorCode', () => {
  it('holds every native CodeName string except OK', () => {
    const header = readFileSync(new URL('../../native/src/util/status.h', import.meta.url), 'utf8');
    const names = [...header.matchAll(/return "([A-Z_]+)";/g)].map((m) => m[1]!).filter((n) => n !== 'OK');
    expect(names.length).toBeGreaterThan(10);
    for (const n of new Set(names)) expect(Object.values(MooringErrorCode)).toContain(n);
    expect(MooringErrorCode.NATIVE_LOAD_FAILED).toBe('NATIVE_LOAD_FAILED');
  });
});

describe('MooringError', () => {
  it('carries code, errno, cause and details', () => {
    const cause = new Error('low level');
    const e = new MooringError('IO_ERROR', 'it broke', { cause, errno: -5, details: { path: '/x' } });
    expect(e).toBeInstanceOf(Error);
    expect(e.name).toBe('MooringError');
    expect(e.code).toBe('IO_ERROR');
    expect(e.errno).toBe(5);
    expect(e.cause).toBe(cause);
    expect(e.details).toEqual({ path: '/x' });
    expect(isMooringError(e, 'IO_ERROR')).toBe(true);
    expect(isMooringError(e, 'CLOSED')).toBe(false);
  });
});

describe('MooringError identity', () => {
  // A second copy of the class, as when one process loads the package's ESM and CJS builds.
  async function otherCopy(): Promise<typeof import('../../src/errors.js')> {
    vi.resetModules();
    const other = await import('../../src/errors.js');
    expect(other.MooringError).not.toBe(MooringError);
    return other;
  }

  it('recognises the errors of another copy of the class, both ways', async () => {
    const other = await otherCopy();
    const theirs = new other.MooringError('NOT_FOUND', 'no such volume');
    const ours = new MooringError('BUSY', 'in use');
    expect(theirs instanceof MooringError).toBe(true);
    expect(ours instanceof other.MooringError).toBe(true);
    expect(isMooringError(theirs)).toBe(true);
    expect(isMooringError(theirs, 'NOT_FOUND')).toBe(true);
    expect(isMooringError(theirs, 'BUSY')).toBe(false);
    expect(other.isMooringError(ours, 'BUSY')).toBe(true);
    expect(toMooringError(theirs)).toBe(theirs);
  });

  it('accepts nothing else: plain errors, coded errors, look-alikes', async () => {
    const other = await otherCopy();
    const impostors: unknown[] = [
      new Error('plain'),
      Object.assign(new Error('coded'), { code: 'NOT_FOUND' }),
      { name: 'MooringError', code: 'NOT_FOUND', message: 'fake' },
      Object.create(MooringError.prototype) as unknown,
      null,
      undefined,
      'NOT_FOUND',
      MooringError,
    ];
    for (const v of impostors) {
      expect(v instanceof MooringError).toBe(false);
      expect(v instanceof other.MooringError).toBe(false);
      expect(isMooringError(v)).toBe(false);
      expect(other.isMooringError(v, 'NOT_FOUND')).toBe(false);
    }
  });

  it('keeps subclasses apart: a subclass tests its own prototype chain', () => {
    class SubError extends MooringError {}
    class OtherSubError extends MooringError {}
    const sub = new SubError('INVALID_ARGUMENT', 'bad flag');
    expect(sub instanceof SubError).toBe(true);
    expect(sub instanceof MooringError).toBe(true);
    expect(sub instanceof Error).toBe(true);
    expect(isMooringError(sub, 'INVALID_ARGUMENT')).toBe(true);
    expect(sub instanceof OtherSubError).toBe(false);
    expect(new MooringError('INVALID_ARGUMENT', 'x') instanceof SubError).toBe(false);
    expect(new Error('plain') instanceof SubError).toBe(false);
  });

  it('marks instances with the registered brand, out of sight of JSON and enumeration', () => {
    const e = new MooringError('IO_ERROR', 'it broke', { details: { path: '/x' } });
    const brand = Symbol.for('mooring.error');
    expect((e as unknown as Record<symbol, unknown>)[brand]).toBe(true);
    expect(Object.getOwnPropertyDescriptor(e, brand)).toMatchObject({ enumerable: false, writable: false });
    expect(Object.getOwnPropertySymbols({ ...e })).toEqual([]);
    expect(JSON.stringify(e)).not.toContain('mooring.error');
    // What a different package calls a MooringError, branded by hand, is taken at its word:
    // the brand is public by design (Symbol.for), like a duck type with a registered name.
    expect(Object.assign(new Error('x'), { [brand]: true }) instanceof MooringError).toBe(true);
  });
});

describe('toMooringError', () => {
  it('keeps a known native code and errno', () => {
    const e = toMooringError(nativeError('STALE_EPOCH', 'fenced', 116));
    expect(e.code).toBe('STALE_EPOCH');
    expect(e.errno).toBe(116);
  });
  it('maps Node errno codes and unknown codes', () => {
    expect(toMooringError(Object.assign(new Error('x'), { code: 'ENOENT', errno: -2 })).code).toBe('NOT_FOUND');
    expect(toMooringError(Object.assign(new Error('x'), { code: 'ENOSPC' })).code).toBe('NO_SPACE');
    expect(toMooringError(Object.assign(new Error('x'), { code: 'WHATEVER' })).code).toBe('IO_ERROR');
    expect(toMooringError('a string').code).toBe('IO_ERROR');
    expect(toMooringError(null).message).toBe('null');
  });
  it('passes MooringErrors through', () => {
    const e = new MooringError('BUSY', 'b');
    expect(toMooringError(e)).toBe(e);
  });
  it('maps errnos like status.h', () => {
    expect(codeFromErrno(-116)).toBe('STALE_EPOCH');
    expect(codeFromErrno(28)).toBe('NO_SPACE');
    expect(codeFromErrno(-5)).toBe('IO_ERROR');
    expect(codeFromErrno(-98)).toBe('ADDRESS_IN_USE');
  });
});

describe('callNative', () => {
  it('wraps a native rejection with the caller stack and the cause', async () => {
    const native = nativeError('NO_SPACE', 'replica r0 is full', 28);
    async function someCallerFunction(): Promise<void> {
      await callNative(() => Promise.reject(native), 'write');
    }
    const err = await someCallerFunction().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(MooringError);
    const me = err as MooringError;
    expect(me.code).toBe('NO_SPACE');
    expect(me.errno).toBe(28);
    expect(me.cause).toBe(native);
    expect(me.message).toBe('write: replica r0 is full');
    expect(me.stack).toContain('MooringError: write: replica r0 is full');
    expect(me.stack).toContain('someCallerFunction');
  });
  it('wraps synchronous throws too', async () => {
    await expect(
      callNative(() => {
        throw nativeError('INVALID_ARGUMENT', 'bad');
      }),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(() => callNativeSync(() => { throw nativeError('CLOSED', 'gone'); })).toThrow(MooringError);
  });
  it('leaves our own errors as they are', async () => {
    const own = new MooringError('OUT_OF_RANGE', 'past the end');
    await expect(callNative(() => Promise.reject(own))).rejects.toBe(own);
  });
});

describe('toMooringError refines IO errors that have a meaning of their own', () => {
  it('gives READ_ONLY_FILESYSTEM for EROFS and PERMISSION_DENIED for EACCES, from native statuses and Node errors alike', () => {
    // A native status keeps IO_ERROR (status.h has no such codes) and carries the errno.
    expect(toMooringError(nativeError('IO_ERROR', 'create /ro/x: Read-only file system', -30)).code).toBe('READ_ONLY_FILESYSTEM');
    expect(toMooringError(nativeError('IO_ERROR', 'open /x: Permission denied', -13)).code).toBe('PERMISSION_DENIED');
    expect(toMooringError(Object.assign(new Error('EROFS'), { code: 'EROFS', errno: -30 })).code).toBe('READ_ONLY_FILESYSTEM');
    expect(toMooringError(Object.assign(new Error('EACCES'), { code: 'EACCES', errno: -13 })).code).toBe('PERMISSION_DENIED');
    // Other errnos and other codes are left as they are.
    expect(toMooringError(nativeError('IO_ERROR', 'read: I/O error', -5)).code).toBe('IO_ERROR');
    expect(toMooringError(nativeError('CORRUPT_METADATA', 'bad', -30)).code).toBe('CORRUPT_METADATA');
    expect(codeFromErrno(30)).toBe('READ_ONLY_FILESYSTEM');
  });
});
