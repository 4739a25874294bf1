import { describe, expect, it } from 'vitest';

import { MooringError, MooringErrorCode } from '../../../src/errors.js';
import { SANLOCK_RV_NAMES, sanlockError, sanlockErrorCode, sanlockRvName } from '../../../src/locks/sanlock-errors.js';

describe('sanlock rv -> MooringError', () => {
  it('names sanlock_rv.h values and errnos', () => {
    expect(sanlockRvName(-243)).toBe('SANLK_ACQUIRE_IDLIVE');
    expect(sanlockRvName(-240)).toBe('SANLK_ACQUIRE_LVER');
    expect(sanlockRvName(-17)).toBe('-EEXIST');
    expect(sanlockRvName(-111)).toBe('-ECONNREFUSED');
    expect(sanlockRvName(0)).toBe('OK');
    expect(sanlockRvName(-299)).toBe('rv -299');
  });

  it('maps lease errors to lock codes', () => {
    expect(sanlockErrorCode(-240)).toBe('LOCK_VERSION_MISMATCH');
    for (const rv of [-243, -244, -245, -246, -247]) expect(sanlockErrorCode(rv)).toBe('LOCK_HELD');
    expect(sanlockErrorCode(-262)).toBe('HOST_ID_IN_USE');
    expect(sanlockErrorCode(-241)).toBe('LOCKSPACE_NOT_JOINED');
    expect(sanlockErrorCode(-202)).toBe('IO_ERROR');
    expect(sanlockErrorCode(-223)).toBe('CORRUPT_METADATA');
    expect(sanlockErrorCode(-111)).toBe('SANLOCK_DAEMON_UNAVAILABLE');
    expect(sanlockErrorCode(-17, 'acquire')).toBe('LOCK_HELD');
    expect(sanlockErrorCode(-17, 'addLockspace')).toBe('ALREADY_EXISTS');
    expect(sanlockErrorCode(-2, 'getHosts')).toBe('LOCKSPACE_NOT_JOINED');
    expect(sanlockErrorCode(-2, 'lookupRindex')).toBe('NOT_FOUND');
    expect(sanlockErrorCode(-11)).toBe('BUSY');
  });

  it('maps every named rv to a known code', () => {
    for (const rv of Object.keys(SANLOCK_RV_NAMES).map(Number))
      expect(Object.values(MooringErrorCode)).toContain(sanlockErrorCode(rv));
  });

  it('keeps sanlock’s name, rv and the call in the error', () => {
    const e = sanlockError(-240, 'acquire', 'lock disk1 in ls1', { lock: 'disk1' });
    expect(e).toBeInstanceOf(MooringError);
    expect(e.code).toBe('LOCK_VERSION_MISMATCH');
    expect(e.details).toEqual({ lock: 'disk1', sanlock: 'SANLK_ACQUIRE_LVER', rv: -240, op: 'acquire' });
    expect(e.message).toContain('SANLK_ACQUIRE_LVER');
    expect(e.message).toContain('lock disk1 in ls1');
    expect(e.errno).toBeUndefined();
    expect(sanlockError(-111, 'register', 'x').errno).toBe(111);
  });
});
