// The preconditions of an upgrade as a pure function: the seed's test plan (004, "Test
// Plan") row by row, every block code, and a property over random layouts: when nothing
// blocks, restarting any one of the hosts leaves every attached volume an RW replica its
// engine can still reach (or its engine restarts with the host).
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import { chooseMethod, upgradeBlocks, type UpgradeLayout, type VolumeLayout } from '../../../src/upgrade/upgrade-preconditions.js';

const HOSTS = ['h1', 'h2', 'h3'];

// `e@h1 r@h1,h2,h3`: engine on h1 (with its NBD export), RW replicas on h1, h2 and h3.
function vol(name: string, layout: string): VolumeLayout {
  const m = /^(?:e@(\w+) )?r@([\w,]+)$/.exec(layout);
  if (!m) throw new Error(`bad layout ${layout}`);
  const engineHost = m[1] ?? null;
  return {
    name,
    engineHost,
    frontend: engineHost !== null,
    migrating: false,
    engineAnswered: true,
    replicas: m[2]!.split(',').map((hostId) => ({ hostId, mode: engineHost ? 'RW' : 'unknown' })),
  };
}

function layout(hosts: string[], volumes: VolumeLayout[], over: Partial<UpgradeLayout> = {}): UpgradeLayout {
  return { hosts, offered: new Set(HOSTS), reachable: new Set(HOSTS), inProcess: new Set(), launchable: new Set(HOSTS), inPlace: new Set(), method: 'restart', volumes, ...over };
}

const codes = (l: UpgradeLayout) => upgradeBlocks(l).map((b) => `${b.code} ${b.host}${b.volume ? ` ${b.volume}` : ''}`);

describe('the seed\'s test plan (004), with method restart', () => {
  it('fail 1 — vol-1 has its single replica on the host its engine runs on: Mooring upgrades it (the engine restarts with its replica)', () => {
    const vols = [vol('vol-1', 'e@h1 r@h1'), vol('vol-2', 'e@h1 r@h1,h2,h3'), vol('vol-3', 'e@h1 r@h1,h2,h3')];
    expect(codes(layout(HOSTS, vols))).toEqual([]);
    // `auto` will not drop NBD clients: every attached volume on h1 is named.
    expect(codes(layout(HOSTS, vols, { method: 'auto' }))).toEqual(['CLIENTS_WOULD_RECONNECT h1 vol-1', 'CLIENTS_WOULD_RECONNECT h1 vol-2', 'CLIENTS_WOULD_RECONNECT h1 vol-3']);
  });

  it('fail 2 — vol-1 attached on h1 with its single replica on h2: refused for h2, up front (before h1 is touched)', () => {
    const vols = [vol('vol-1', 'e@h1 r@h2'), vol('vol-2', 'e@h1 r@h1,h2,h3'), vol('vol-3', 'e@h1 r@h1,h2,h3')];
    expect(codes(layout(HOSTS, vols))).toEqual(['QUORUM_NEEDS_HOST h2 vol-1']);
    // Upgrading h1 and h3 alone is fine.
    expect(codes(layout(['h1', 'h3'], vols))).toEqual([]);
  });

  it('succeed 1 — every volume e@h1 r@h1,h2,h3', () => {
    expect(codes(layout(HOSTS, ['a', 'b', 'c'].map((n) => vol(n, 'e@h1 r@h1,h2,h3'))))).toEqual([]);
  });

  it('succeed 2 — every volume e@h1 r@h2,h3: refused by Mooring for h2 and h3, where the seed succeeds', () => {
    // Two replicas: without either, one of two is left, not a majority, so the engine on h1
    // could neither serve nor drop the missing one until it is back (single-writer.md).
    // The seed's engine keeps writing to the one left, which a partition makes unsafe.
    const vols = ['a', 'b', 'c'].map((n) => vol(n, 'e@h1 r@h2,h3'));
    expect(codes(layout(HOSTS, vols))).toEqual(['h2', 'h3'].flatMap((h) => ['a', 'b', 'c'].map((n) => `QUORUM_NEEDS_HOST ${h} ${n}`)));
    // With a third replica (say on h1), they go through.
    expect(codes(layout(HOSTS, ['a', 'b', 'c'].map((n) => vol(n, 'e@h1 r@h1,h2,h3'))))).toEqual([]);
  });

  it('succeed 3 — one engine per host, replicas everywhere', () => {
    expect(codes(layout(HOSTS, [vol('a', 'e@h1 r@h1,h2,h3'), vol('b', 'e@h2 r@h1,h2,h3'), vol('c', 'e@h3 r@h1,h2,h3')]))).toEqual([]);
  });
});

describe('in place', () => {
  it('auto upgrades hosts that hand over in place under their NBD clients, and restarts the others only where no client is connected', () => {
    const vols = [vol('a', 'e@h1 r@h1,h2,h3'), vol('b', 'e@h2 r@h1,h2,h3')];
    expect(codes(layout(HOSTS, vols, { method: 'auto', inPlace: new Set(['h1', 'h2']) }))).toEqual([]);
    expect(codes(layout(HOSTS, vols, { method: 'auto', inPlace: new Set(['h1']) }))).toEqual(['CLIENTS_WOULD_RECONNECT h2 b']);
    expect(chooseMethod('auto', true).method).toBe('in-place');
    expect(chooseMethod('auto', false).method).toBe('restart');
    expect(chooseMethod('restart', true).method).toBe('restart');
  });

  it('in-place asked for is refused where a host cannot, naming it', () => {
    expect(codes(layout(HOSTS, [], { method: 'in-place', inPlace: new Set(['h1', 'h3']) }))).toEqual(['IN_PLACE_UNAVAILABLE h2']);
  });

  it('a host that hands over in place needs no launcher', () => {
    expect(codes(layout(['h1'], [], { launchable: new Set(), inPlace: new Set(['h1']) }))).toEqual([]);
  });
});

describe('every block', () => {
  it('names the host: no launcher, unknown, unreachable, in-process', () => {
    const l = layout(['h1', 'h2', 'h3', 'hx'], [], { launchable: new Set(['h3']), reachable: new Set(['h1', 'h3']), inProcess: new Set(['h3']), offered: new Set(HOSTS) });
    expect(codes(l)).toEqual(['NO_LAUNCHER h1', 'HOST_UNREACHABLE h2', 'IN_PROCESS_DATA_ENGINE h3', 'HOST_UNKNOWN hx']);
  });

  it('names the volume: migrating, rebuilding, ERR, silent engine, operation', () => {
    const mig = { ...vol('mig', 'e@h2 r@h1,h2,h3'), migrating: true };
    const wo = vol('wo', 'e@h2 r@h1,h2,h3');
    wo.replicas[0]!.mode = 'WO';
    const err = vol('err', 'e@h2 r@h1,h2,h3');
    err.replicas[1]!.mode = 'ERR';
    err.replicas[2]!.mode = 'ERR';
    const silent = { ...vol('silent', 'e@h2 r@h1,h2,h3'), engineAnswered: false };
    const op = { ...vol('op', 'e@h1 r@h1'), frontend: false };
    expect(codes(layout(['h1'], [mig, wo, err, silent, op]))).toEqual([
      'MIGRATION_IN_PROGRESS h1 mig',
      'REBUILD_RUNNING h1 wo',
      'VOLUME_NOT_HEALTHY h1 err',
      // Its other replicas are ERR: without h1 none is left.
      'QUORUM_NEEDS_HOST h1 err',
      'VOLUME_NOT_HEALTHY h1 silent',
      'OPERATION_RUNNING h1 op',
    ]);
  });

  it('refuses either host of a 2-replica volume attached on a third, and allows 3 of 5 to stay', () => {
    expect(codes(layout(['h2'], [vol('two', 'e@h1 r@h2,h3')]))).toEqual(['QUORUM_NEEDS_HOST h2 two']);
    expect(codes(layout(['h2'], [vol('five', 'e@h1 r@h2,h3,h4,h5,h6')]))).toEqual([]);
  });

  it('leaves alone what the hosts do not hold, and detached volumes', () => {
    expect(codes(layout(['h3'], [vol('x', 'e@h1 r@h1,h2'), vol('detached', 'r@h3')]))).toEqual([]);
  });

  it('bounds what one host may list', () => {
    const many = Array.from({ length: 2001 }, (_, i) => vol(`v${i}`, 'r@h1'));
    expect(codes(layout(['h1'], many))).toEqual(['TOO_MANY_VOLUMES h1']);
  });
});

describe('property', () => {
  it('when nothing blocks, a restart of any one upgraded host leaves each attached volume a reachable RW replica or restarts its engine with it', () => {
    const host = fc.constantFrom(...HOSTS);
    const volume = fc.record({
      engineHost: fc.option(host, { nil: null }),
      replicas: fc.uniqueArray(fc.record({ hostId: host, mode: fc.constantFrom('RW' as const, 'WO' as const, 'ERR' as const) }), { minLength: 1, maxLength: 3, selector: (r) => r.hostId }),
      migrating: fc.boolean(),
    });
    fc.assert(
      fc.property(fc.array(volume, { maxLength: 6 }), fc.subarray(HOSTS, { minLength: 1 }), fc.constantFrom('auto' as const, 'restart' as const), (vols, hosts, method) => {
        const volumes: VolumeLayout[] = vols.map((v, i) => ({ name: `v${i}`, engineHost: v.engineHost, frontend: v.engineHost !== null, migrating: v.migrating, engineAnswered: true, replicas: v.replicas }));
        const blocks = upgradeBlocks(layout(hosts, volumes, { method }));
        if (blocks.length > 0) return;
        for (const h of hosts) {
          for (const v of volumes) {
            if (v.engineHost === null || v.engineHost === h || !v.replicas.some((r) => r.hostId === h)) continue;
            // Attached elsewhere with a replica on h: a majority of its replicas stays RW through h's restart.
            expect(v.replicas.filter((r) => r.mode === 'RW' && r.hostId !== h).length * 2).toBeGreaterThan(v.replicas.length);
          }
          // `auto` never restarts a host under an NBD client.
          if (method === 'auto') expect(volumes.some((v) => v.engineHost === h)).toBe(false);
        }
      }),
      { numRuns: 500 },
    );
  });
});
