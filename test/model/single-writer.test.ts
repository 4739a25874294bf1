// Checks the single-writer protocol (docs/single-writer.md) with the SPIN model checker:
// the model must hold in every configuration below, searched exhaustively (within its
// bounds: replicas, engines, writes, failed calls), and each deliberately broken variant
// must be caught, so that a model too weak to see a broken fence fails this test.
// Needs `spin` and `gcc` (.ci/setup.sh installs them); it fails, not skips, without them.
import { describe, test } from 'vitest';
import { availableParallelism } from 'node:os';
import { describeRun, limiter, runSpin, type SpinResult } from './run-spin.js';

/** Per tool call; the largest configuration takes about 10 s on a CI core. */
const TOOL_TIMEOUT_MS = 90_000;
/** pan runs at once: one per core, at most two (each may take about 1 GB). */
const limit = limiter(Math.max(1, Math.min(2, availableParallelism())));

function check(defines: string[]): Promise<SpinResult> {
  return limit(() => runSpin({ defines, timeoutMs: TOOL_TIMEOUT_MS }));
}

interface Holds {
  name: string;
  defines: string[];
}

const holds: Holds[] = [
  {
    name: '3 replicas, 3 engines, 1 write each, 2 failed calls (each engine fans out in its own fixed order)',
    defines: ['NR=3', 'NE=3', 'WPE=1', 'FAULTS=2', 'FIXED_ORDER'],
  },
  {
    name: '2 replicas, 3 engines, 1 write each, 2 failed calls, any order',
    defines: ['NR=2', 'NE=3', 'WPE=1', 'FAULTS=2'],
  },
  {
    name: '3 replicas, 2 engines, 2 writes each, 2 failed calls, any order',
    defines: ['NR=3', 'NE=2', 'WPE=2', 'FAULTS=2'],
  },
  {
    name: 'hand-over: 3 replicas, 3 engines, 1 write each, 1 failed call',
    defines: ['NR=3', 'NE=3', 'WPE=1', 'FAULTS=1', 'FIXED_ORDER', 'HANDOVER'],
  },
  {
    name: 'hand-over: 3 replicas, 2 engines, 2 writes each, 3 failed calls',
    defines: ['NR=3', 'NE=2', 'WPE=2', 'FAULTS=3', 'FIXED_ORDER', 'HANDOVER'],
  },
  {
    name: 'membership changes: 3 members and a spare, 2 engines, 2 writes each, 1 failed call',
    defines: ['NR=4', 'NE=2', 'WPE=2', 'FAULTS=1', 'FIXED_ORDER', 'MEMBERSHIP'],
  },
  {
    name: 'membership changes: 2 members and a spare, 2 engines, 1 write each, 2 failed calls',
    defines: ['NR=3', 'NE=2', 'WPE=1', 'FAULTS=2', 'FIXED_ORDER', 'MEMBERSHIP'],
  },
  {
    // The change docs/single-writer.md proposes: a member that missed Start's claim
    // takes the set (and promises its epoch) instead of refusing it with STALE_EPOCH.
    name: 'SetReplicaSet adopts a higher epoch: 3 replicas, 2 engines, 2 writes each, 2 failed calls',
    defines: ['NR=3', 'NE=2', 'WPE=2', 'FAULTS=2', 'SETRS_ADOPTS'],
  },
  // Salvage (docs/salvage.md): the second engine salvages once the replicas in GONE are gone.
  {
    name: 'salvage: 3 replicas, r0 gone, 2 engines, 2 writes each, 2 failed calls',
    defines: ['NR=3', 'NE=2', 'WPE=2', 'FAULTS=2', 'SALVAGE', 'GONE=1'],
  },
  {
    name: 'salvage: 3 replicas, r0 and r1 gone, 2 engines, 2 writes each, 2 failed calls',
    defines: ['NR=3', 'NE=2', 'WPE=2', 'FAULTS=2', 'SALVAGE', 'GONE=3'],
  },
  {
    name: 'salvage: 4 replicas, r0 and r3 gone, 2 engines, 2 writes each, 2 failed calls',
    defines: ['NR=4', 'NE=2', 'WPE=2', 'FAULTS=2', 'FIXED_ORDER', 'SALVAGE', 'GONE=9'],
  },
];

interface Broken {
  name: string;
  defines: string[];
  /** The failed assertion must match this. */
  assertion: RegExp;
}

// Any of the three invariants: 1 (a newer serving engine lacks an acknowledged write),
// 2 (an acknowledged write missing, or acknowledged on an empty rw), 3 (RW replicas differ).
// Salvage's own (4) names `guar`: its source lacks a write a survivor was guaranteed to hold.
const INVARIANT = /srvRw|acked|cRw!=0|data\[ref\]/;

const broken: Broken[] = [
  {
    name: 'a claim or commit done on one replica (BROKEN_NO_MAJORITY), 2 replicas',
    defines: ['NR=2', 'NE=3', 'WPE=1', 'FAULTS=2', 'FIXED_ORDER', 'BROKEN_NO_MAJORITY'],
    assertion: INVARIANT,
  },
  {
    name: 'a claim or commit done on one replica (BROKEN_NO_MAJORITY), 3 replicas',
    defines: ['NR=3', 'NE=3', 'WPE=1', 'FAULTS=3', 'FIXED_ORDER', 'BROKEN_NO_MAJORITY'],
    assertion: INVARIANT,
  },
  {
    name: 'an engine raises its own epoch when fenced (BROKEN_SELF_EPOCH)',
    defines: ['NR=3', 'NE=3', 'WPE=1', 'FAULTS=1', 'FIXED_ORDER', 'BROKEN_SELF_EPOCH'],
    assertion: INVARIANT,
  },
  {
    name: 'Start reads from a claimed replica outside C*.rw (BROKEN_ANY_SOURCE)',
    defines: ['NR=3', 'NE=3', 'WPE=1', 'FAULTS=1', 'FIXED_ORDER', 'BROKEN_ANY_SOURCE'],
    assertion: INVARIANT,
  },
  {
    name: 'a rebuilt replica joins rw without the copy (BROKEN_REBUILD_NO_COPY)',
    defines: ['NR=4', 'NE=2', 'WPE=1', 'FAULTS=1', 'FIXED_ORDER', 'MEMBERSHIP', 'BROKEN_REBUILD_NO_COPY'],
    assertion: INVARIANT,
  },
  {
    name: 'the last RW replica dropped after a failure (GAP_EMPTY_RW)',
    defines: ['NR=2', 'NE=3', 'WPE=1', 'FAULTS=2', 'FIXED_ORDER', 'GAP_EMPTY_RW'],
    assertion: /cRw!=0/,
  },
  {
    name: 'Activate with no RW replica of the hand-over claimed (GAP_ACTIVATE_EMPTY_RW)',
    defines: ['NR=3', 'NE=2', 'WPE=2', 'FAULTS=3', 'FIXED_ORDER', 'HANDOVER', 'GAP_ACTIVATE_EMPTY_RW'],
    assertion: /cRw!=0/,
  },
  {
    name: 'salvage from any claimed replica, not the newest last RW set (BROKEN_SALVAGE_ANY)',
    defines: ['NR=3', 'NE=2', 'WPE=2', 'FAULTS=2', 'SALVAGE', 'GONE=1', 'BROKEN_SALVAGE_ANY'],
    assertion: /guar/,
  },
  {
    name: 'a salvage that may lose writes without every survivor claimed (BROKEN_SALVAGE_PARTIAL)',
    defines: ['NR=3', 'NE=2', 'WPE=2', 'FAULTS=2', 'SALVAGE', 'GONE=1', 'BROKEN_SALVAGE_PARTIAL'],
    assertion: /guar/,
  },
];

describe.concurrent('single-writer protocol, SPIN model (test/model/single-writer.pml)', () => {
  for (const c of holds) {
    test(`holds: ${c.name}`, async ({ expect }) => {
      const r = await check(c.defines);
      console.log(describeRun(r));
      if (r.errors > 0) console.log(`counterexample:\n  ${r.counterexample.join('\n  ')}`);
      expect(r.errors, r.panOutput).toBe(0);
      expect(r.complete, `the search did not complete:\n${r.panOutput}`).toBe(true);
      expect(r.statesStored).toBeGreaterThan(1000);
    });
  }

  for (const c of broken) {
    test(`catches: ${c.name}`, async ({ expect }) => {
      const r = await check(c.defines);
      console.log(describeRun(r));
      console.log(`violated: ${r.assertion}\ncounterexample:\n  ${r.counterexample.join('\n  ')}`);
      expect(r.errors, `spin found no violation:\n${r.panOutput}`).toBeGreaterThan(0);
      expect(r.assertion).toMatch(c.assertion);
      expect(r.counterexample.length).toBeGreaterThan(0);
    });
  }

  // What the protocol does not promise: an engine may acknowledge after a newer engine
  // began to serve, when its write reached the replicas before the newer engine claimed
  // them and the last reply came late. The newer engine holds that write (invariant 1).
  test('a late acknowledgement is possible, and harmless (STRICT_ACK_ORDER)', async ({ expect }) => {
    const r = await check(['NR=3', 'NE=3', 'WPE=1', 'FAULTS=1', 'FIXED_ORDER', 'STRICT_ACK_ORDER']);
    console.log(describeRun(r));
    console.log(`violated: ${r.assertion}\ncounterexample:\n  ${r.counterexample.join('\n  ')}`);
    expect(r.errors, r.panOutput).toBeGreaterThan(0);
    expect(r.assertion).toMatch(/maxServing/);
  });
});
