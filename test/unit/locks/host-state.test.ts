import { describe, expect, it } from 'vitest';

import { diffHosts, hostStateFromFlags, type HostState, type HostStatus } from '../../../src/locks/host-state.js';

const host = (hostId: number, state: HostState, generation = 1): HostStatus => ({
  hostId,
  state,
  generation,
  timestamp: state === 'free' ? 0 : 1000,
  ioTimeoutSeconds: 1,
});
const map = (...hosts: HostStatus[]) => new Map(hosts.map((h) => [h.hostId, h]));
const moves = (before: Map<number, HostStatus>, after: HostStatus[]) =>
  diffHosts('ls', before, after).map((c) => [c.hostId, c.from, c.to]);

describe('host states', () => {
  it('reads sanlock flags (state in the low 4 bits)', () => {
    expect(hostStateFromFlags(1)).toBe('unknown');
    expect(hostStateFromFlags(2)).toBe('free');
    expect(hostStateFromFlags(3)).toBe('live');
    expect(hostStateFromFlags(4)).toBe('fail');
    expect(hostStateFromFlags(5)).toBe('dead');
    expect(hostStateFromFlags(0x13)).toBe('live');
    expect(hostStateFromFlags(9)).toBe('unknown');
  });

  it('reports first sightings, then only changes', () => {
    expect(moves(map(), [host(2, 'live'), host(1, 'unknown')])).toEqual([
      [1, undefined, 'unknown'],
      [2, undefined, 'live'],
    ]);
    expect(moves(map(host(1, 'live'), host(2, 'live')), [host(1, 'live'), host(2, 'live')])).toEqual([]);
  });

  it('follows a crash: live -> fail -> dead, and a restart with a new generation', () => {
    let before = map(host(1, 'live'));
    expect(moves(before, [host(1, 'fail')])).toEqual([[1, 'live', 'fail']]);
    before = map(host(1, 'fail'));
    expect(moves(before, [host(1, 'dead')])).toEqual([[1, 'fail', 'dead']]);
    before = map(host(1, 'dead'));
    expect(moves(before, [host(1, 'live', 2)])).toEqual([[1, 'dead', 'live']]);
    // Restarted between two polls: still live, but a new generation is news.
    expect(moves(map(host(1, 'live', 2)), [host(1, 'live', 3)])).toEqual([[1, 'live', 'live']]);
  });

  it('reports a host that vanished from the answer as free, once', () => {
    expect(moves(map(host(1, 'live'), host(2, 'live')), [host(1, 'live')])).toEqual([[2, 'live', 'free']]);
    expect(moves(map(host(1, 'live'), host(2, 'free')), [host(1, 'live')])).toEqual([]);
  });

  it('keeps the lockspace name so one host can be dead in one lockspace and live in another', () => {
    const a = diffHosts('storage-a', map(host(3, 'fail')), [host(3, 'dead')]);
    const b = diffHosts('storage-b', map(host(3, 'live')), [host(3, 'live')]);
    expect(a).toMatchObject([{ lockspace: 'storage-a', hostId: 3, to: 'dead' }]);
    expect(b).toEqual([]);
  });
});
