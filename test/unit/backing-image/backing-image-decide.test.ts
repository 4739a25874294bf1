// The pure backing image decision: examples of each rule, and properties over random disks
// (fast-check): never a deletion of a file in use, being prepared or copied; never fewer ready
// copies than minCopies (or than there were) after deletions; at most SENDS_PER_SOURCE_MAX
// sends per source; copies only from ready reachable disks into reachable not-ready ones,
// from the partial's receivedBytes; a first file prepared only when nothing could serve.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import { SENDS_PER_SOURCE_MAX, decideBackingImage, type BackingImageDecisionInput, type DiskObservation } from '../../../src/backing-image/backing-image-decide.js';

const NOW = 1_000_000;
const WAIT = 1000;

function disk(hostId: string, over: Partial<DiskObservation> = {}): DiskObservation {
  return { hostId, reachable: true, file: null, used: false, requested: false, lastRefAtMs: null, receiving: false, preparing: false, backingOff: false, ...over };
}

function input(disks: DiskObservation[], over: Partial<BackingImageDecisionInput> = {}): BackingImageDecisionInput {
  return { nowMs: NOW, cleanupWaitMs: WAIT, minCopies: 1, firstHost: 'a', firstFileKnown: true, sourceRetry: 'never', sourceAttempted: true, sendsBySource: {}, disks, ...over };
}

const READY = { state: 'ready' as const, receivedBytes: 100 };

describe('decideBackingImage', () => {
  it('copies to requested disks from the ready one, resuming partial files', () => {
    const d = decideBackingImage(input([disk('a', { file: READY }), disk('b', { requested: true, file: { state: 'failed', receivedBytes: 40 } }), disk('c', { requested: true })]));
    expect(d.deliveries).toEqual([
      { source: 'a', target: 'b', offsetBytes: 40 },
      { source: 'a', target: 'c', offsetBytes: 0 },
    ]);
    expect(d.spec).toEqual(['a', 'b', 'c']);
    expect(d.state).toBe('ready');
  });

  it('stamps an unused file, deletes it after the wait, keeps the minCopies one', () => {
    const first = decideBackingImage(input([disk('a', { file: READY, used: true }), disk('b', { file: READY })]));
    expect(first.lastRefAtMs).toEqual({ a: null, b: NOW });
    expect(first.deletions).toEqual([]);
    const later = decideBackingImage(input([disk('a', { file: READY, used: true }), disk('b', { file: READY, lastRefAtMs: NOW - WAIT })]));
    expect(later.deletions).toEqual(['b']);
    const alone = decideBackingImage(input([disk('b', { file: READY, lastRefAtMs: NOW - WAIT })]));
    expect(alone.deletions).toEqual([]);
    expect(alone.lastRefAtMs).toEqual({ b: null });
  });

  it('never counts, copies into or from a mismatched file in use: minCopies goes to other disks', () => {
    const bad = { state: 'failed' as const, receivedBytes: 100 };
    const d = decideBackingImage(input([disk('a', { file: READY }), disk('b', { file: bad, used: true, mismatched: true }), disk('c')], { minCopies: 2 }));
    expect(d.spec).toEqual(['a', 'b', 'c']); // b stays (used); a and c are the two copies
    expect(d.deliveries).toEqual([{ source: 'a', target: 'c', offsetBytes: 0 }]);
    expect(d.deletions).toEqual([]);
  });

  it('moves an evicting disk\'s copy: kept as the source until enough are ready elsewhere, then deleted at once unless used', () => {
    // Only copy on the evicting disk: it stays, and is the source of the new copy.
    const first = decideBackingImage(input([disk('a', { file: READY, evicting: true }), disk('b'), disk('c')]));
    expect(first.spec).toEqual(['a', 'b']);
    expect(first.deliveries).toEqual([{ source: 'a', target: 'b', offsetBytes: 0 }]);
    expect(first.deletions).toEqual([]);
    // Copy ready elsewhere: the evicting one goes now, without the cleanup wait.
    const then = decideBackingImage(input([disk('a', { file: READY, evicting: true }), disk('b', { file: READY }), disk('c')]));
    expect(then.deletions).toEqual(['a']);
    expect(then.spec).toEqual(['b']);
    // A replica there still uses it: it stays, and is never a copy target.
    const used = decideBackingImage(input([disk('a', { file: READY, evicting: true, used: true }), disk('b', { file: READY })]));
    expect(used.deletions).toEqual([]);
    const noTarget = decideBackingImage(input([disk('a', { file: READY }), disk('b', { evicting: true })], { minCopies: 2 }));
    expect(noTarget.deliveries).toEqual([]);
  });

  it('adds disks for minCopies and waits for a source with a free send', () => {
    const d = decideBackingImage(input([disk('a', { file: READY }), disk('b'), disk('c'), disk('d')], { minCopies: 3, sendsBySource: { a: 2 } }));
    expect(d.spec).toEqual(['a', 'b', 'c']);
    expect(d.deliveries).toEqual([{ source: 'a', target: 'b', offsetBytes: 0 }]);
  });

  it('prepares the first file again only when every file failed and the source allows it now', () => {
    const failed = [disk('a', { file: { state: 'failed', receivedBytes: 0 } }), disk('b')];
    expect(decideBackingImage(input(failed, { firstFileKnown: false, sourceRetry: 'now' }))).toMatchObject({ prepareFirstOn: 'a', state: 'in-progress' });
    expect(decideBackingImage(input(failed, { firstFileKnown: false, sourceRetry: 'later' }))).toMatchObject({ prepareFirstOn: null, state: 'pending' });
    expect(decideBackingImage(input(failed, { firstFileKnown: false, sourceRetry: 'never' }))).toMatchObject({ prepareFirstOn: null, state: 'failed' });
    // A host that is away may hold a good copy: wait for it.
    const away = [disk('a', { file: { state: 'failed', receivedBytes: 0 } }), disk('b', { reachable: false, file: { state: 'unknown', receivedBytes: 100 } })];
    expect(decideBackingImage(input(away, { sourceRetry: 'now' }))).toMatchObject({ prepareFirstOn: null, state: 'in-progress' });
    // The first host is away: another reachable one prepares it.
    expect(decideBackingImage(input([disk('a', { reachable: false }), disk('b')], { firstFileKnown: false, sourceRetry: 'now' })).prepareFirstOn).toBe('b');
  });

  const states = ['pending', 'starting', 'in-progress', 'ready', 'failed', 'unknown'] as const;
  const arbDisk = (hostId: string): fc.Arbitrary<DiskObservation> =>
    fc.record({
      hostId: fc.constant(hostId),
      reachable: fc.boolean(),
      file: fc.option(fc.record({ state: fc.constantFrom(...states), receivedBytes: fc.nat(1000) }), { nil: null }),
      used: fc.boolean(),
      requested: fc.boolean(),
      lastRefAtMs: fc.option(fc.integer({ min: NOW - 3 * WAIT, max: NOW }), { nil: null }),
      receiving: fc.boolean(),
      preparing: fc.boolean(),
      backingOff: fc.boolean(),
      evicting: fc.boolean(),
    });
  const arbInput: fc.Arbitrary<BackingImageDecisionInput> = fc
    .integer({ min: 1, max: 8 })
    .chain((n) => fc.tuple(...Array.from({ length: n }, (_, i) => arbDisk('abcdefgh'[i]!))))
    .chain((disks) =>
      fc.record({
        nowMs: fc.constant(NOW),
        cleanupWaitMs: fc.constantFrom(0, WAIT),
        minCopies: fc.integer({ min: 1, max: 4 }),
        firstHost: fc.constantFrom(...disks.map((d) => d.hostId)),
        firstFileKnown: fc.boolean(),
        sourceRetry: fc.constantFrom('now' as const, 'later' as const, 'never' as const),
        sourceAttempted: fc.boolean(),
        sendsBySource: fc.dictionary(fc.constantFrom(...disks.map((d) => d.hostId)), fc.integer({ min: 0, max: SENDS_PER_SOURCE_MAX })),
        disks: fc.constant(disks),
      }),
    );

  it('never deletes a file in use, being prepared or copied, nor below minCopies ready copies', () => {
    fc.assert(
      fc.property(arbInput, (inp) => {
        const d = decideBackingImage(inp);
        const byId = new Map(inp.disks.map((x) => [x.hostId, x]));
        for (const h of d.deletions) {
          const x = byId.get(h)!;
          expect(x.used || x.requested || x.preparing || x.receiving).toBe(false);
          expect(x.reachable).toBe(true);
          expect(x.file).not.toBeNull();
          // An evicting disk's unused file goes at once; others after the wait.
          if (!x.evicting) expect(inp.nowMs - (d.lastRefAtMs[h] ?? Infinity)).toBeGreaterThanOrEqual(inp.cleanupWaitMs);
        }
        const readyBefore = inp.disks.filter((x) => x.reachable && x.file?.state === 'ready').length;
        const readyAfter = inp.disks.filter((x) => x.reachable && x.file?.state === 'ready' && !d.deletions.includes(x.hostId)).length;
        expect(readyAfter).toBeGreaterThanOrEqual(Math.min(readyBefore, inp.minCopies));
        // A file in use never gets a lastRefAtMs.
        for (const x of inp.disks) if (x.used && x.file) expect(d.lastRefAtMs[x.hostId]).toBeNull();
      }),
      { numRuns: 2000 },
    );
  });

  it('sends at most SENDS_PER_SOURCE_MAX per source, from ready reachable disks to reachable not-ready ones, resuming', () => {
    fc.assert(
      fc.property(arbInput, (inp) => {
        const d = decideBackingImage(inp);
        const byId = new Map(inp.disks.map((x) => [x.hostId, x]));
        const sends: Record<string, number> = { ...inp.sendsBySource };
        const targets = new Set<string>();
        if (!inp.firstFileKnown) expect(d.deliveries).toEqual([]);
        for (const dl of d.deliveries) {
          const s = byId.get(dl.source)!;
          const t = byId.get(dl.target)!;
          expect(s.reachable && s.file?.state === 'ready').toBe(true);
          expect(d.deletions).not.toContain(dl.source);
          expect(t.reachable).toBe(true);
          expect(t.file?.state).not.toBe('ready');
          expect(t.receiving || t.preparing || t.backingOff).toBe(false);
          expect(dl.offsetBytes).toBe(t.file?.receivedBytes ?? 0);
          expect(d.spec).toContain(dl.target);
          expect(targets.has(dl.target)).toBe(false);
          targets.add(dl.target);
          sends[dl.source] = (sends[dl.source] ?? 0) + 1;
        }
        for (const [src, n] of Object.entries(sends)) if (d.deliveries.some((x) => x.source === src)) expect(n).toBeLessThanOrEqual(SENDS_PER_SOURCE_MAX);
        // Every disk a replica uses or waits for is in the spec.
        for (const x of inp.disks) if (x.used || x.requested) expect(d.spec).toContain(x.hostId);
      }),
      { numRuns: 2000 },
    );
  });

  it('prepares a first file only when no file could serve and the source allows it now', () => {
    fc.assert(
      fc.property(arbInput, (inp) => {
        const d = decideBackingImage(inp);
        if (d.prepareFirstOn === null) return;
        expect(inp.sourceRetry).toBe('now');
        expect(inp.disks.every((x) => x.file === null || x.file.state === 'failed')).toBe(true);
        expect(inp.disks.some((x) => x.preparing || x.receiving)).toBe(false);
        expect(inp.disks.find((x) => x.hostId === d.prepareFirstOn)!.reachable).toBe(true);
        expect(d.state).toBe('in-progress');
      }),
      { numRuns: 2000 },
    );
  });
});
