// The upgrade documents are read from a store that may be shared and damaged: anything
// malformed is CORRUPT_METADATA naming the kind, key and field, never a crash or a wrong value.
import { describe, expect, it } from 'vitest';

import { parseHostUpgradeRecord, parseUpgradeSessionRecord } from '../../../src/upgrade/upgrade-records.js';

const ID = '0b7c3a52-56a2-4d4e-9f0e-6f4e2a1b9c11';
const session = {
  schema: 1,
  id: ID,
  spec: { hosts: ['a', 'b'], dataEngine: { version: '0.2.0', command: ['/opt/m/bin/mooring'] }, method: 'auto', stepTimeoutMs: 1000 },
  state: 'upgrading',
  paused: false,
  cancelRequested: false,
  upgradingHost: 'a',
  error: null,
  ownerId: ID,
  leaseUntilMs: 5,
  createdMs: 1,
  updatedMs: 2,
};
const host = {
  schema: 1,
  session: ID,
  hostId: 'a',
  state: 'initializing',
  method: 'restart',
  methodReason: 'x',
  instanceBefore: 'i',
  versionBefore: '0.1.0',
  versionAfter: null,
  volumes: { v1: { role: 'engine', snapshot: null, state: 'listed' } },
  error: { code: 'UNAVAILABLE', message: 'gone' },
  startedMs: 1,
  doneMs: null,
};

describe('upgrade records', () => {
  it('reads well-formed documents back as they were written', () => {
    expect(parseUpgradeSessionRecord(structuredClone(session), 'current')).toEqual(session);
    expect(parseHostUpgradeRecord(structuredClone(host), 'a')).toEqual(host);
  });

  const bad: [string, (s: typeof session, h: typeof host) => void, 'session' | 'host'][] = [
    ['a newer schema', (s) => (s.schema = 2), 'session'],
    ['an unknown state', (s) => (s.state = 'teleporting'), 'session'],
    ['a host listed twice', (s) => (s.spec.hosts = ['a', 'a']), 'session'],
    ['a bad host id', (s) => (s.spec.hosts = ['../etc']), 'session'],
    ['two ways to start the data engine', (s) => Object.assign(s.spec.dataEngine, { path: '/opt/x' }), 'session'],
    ['none', (s) => (s.spec.dataEngine = { version: '1' } as never), 'session'],
    ['an argv with a NUL', (s) => (s.spec.dataEngine.command = ['a\0b']), 'session'],
    ['a non-integer lease', (s) => (s.leaseUntilMs = 1.5), 'session'],
    ['an unknown error code', (_s, h) => (h.error = { code: 'EVIL', message: '' } as never), 'host'],
    ['a key that is not its host', (_s, h) => (h.hostId = 'b'), 'host'],
    ['a volume entry with a bad role', (_s, h) => (h.volumes.v1.role = 'boss' as never), 'host'],
    ['a bad volume name', (_s, h) => (h.volumes = { '..': h.volumes.v1 } as never), 'host'],
    ['volumes as a list', (_s, h) => (h.volumes = [] as never), 'host'],
    ['a string for a number', (_s, h) => (h.startedMs = '1' as never), 'host'],
  ];
  for (const [what, damage, kind] of bad) {
    it(`refuses ${what} with CORRUPT_METADATA`, () => {
      const s = structuredClone(session);
      const h = structuredClone(host);
      damage(s, h);
      const read = kind === 'session' ? () => parseUpgradeSessionRecord(s, 'current') : () => parseHostUpgradeRecord(h, 'a');
      expect(read).toThrow(expect.objectContaining({ code: 'CORRUPT_METADATA', details: { kind: kind === 'session' ? 'upgrade-session' : 'host-upgrade', key: kind === 'session' ? 'current' : 'a' } }));
    });
  }

  it('refuses what is not an object at all', () => {
    for (const v of [null, 7, 'x', [], undefined]) expect(() => parseUpgradeSessionRecord(v, 'current')).toThrow(expect.objectContaining({ code: 'CORRUPT_METADATA' }));
  });
});
