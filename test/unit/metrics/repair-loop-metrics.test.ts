// MooringMetrics reports the repair loop (issue 21): the last full pass's duration, the delay
// it chose for the next one, and event-driven repairs, read from Mooring.repairLoop. Over
// fake data engines; values are checked against what the loop reports, never against a time.
import { afterEach, describe, expect, it, vi } from 'vitest';

import { MooringMetrics } from '../../../src/metrics/mooring-metrics.js';
import { Mooring } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';
import { parsePromText } from '../../helpers/prom-text.js';

const WAIT = { timeout: 10_000 };

describe('MooringMetrics of the repair loop', () => {
  let m: Mooring | null = null;
  afterEach(async () => {
    await m?.close();
    m = null;
  });

  it('reports no pass before the first, then the pass duration, next delay and event repairs', async () => {
    const a = new FakeDataEngine('a');
    m = await Mooring.open({ store: new MemoryStateStore(), hosts: [a], repairIntervalMs: 3_600_000 });
    const metrics = new MooringMetrics(m, { dataPath: false });
    try {
      await vi.waitFor(() => expect(m!.repairLoop.passes).toBe(1), WAIT);
      await m.createVolume({ name: 'v', sizeBytes: 64 * 4096, replicas: 1 });
      await m.volume('v').attach({ host: 'a' });
      a.emit({ type: 'replica-error', volume: 'v', replicaId: 'r0', errno: 5, message: 'EIO' });
      await vi.waitFor(() => expect(m!.repairLoop).toMatchObject({ eventRepairs: 1, pendingEventRepairs: 0 }), WAIT);
      const st = m.repairLoop;
      const p = parsePromText(await metrics.registry.metrics());
      expect(p.value('mooring_repair_passes_total')).toBe(1);
      expect(p.value('mooring_repair_pass_duration_seconds')).toBe(st.lastPassDurationMs! / 1000);
      expect(p.value('mooring_repair_pass_busy_seconds')).toBe(st.lastPassBusyMs! / 1000);
      expect(p.value('mooring_repair_pass_next_delay_seconds')).toBe(3600);
      expect(p.value('mooring_event_repairs_total')).toBe(1);
      expect(p.value('mooring_event_repairs_pending')).toBe(0);
      expect(p.value('mooring_event_repairs_dropped_total')).toBe(0);
    } finally {
      metrics.close();
    }
  });

  it('has no pass series while the loop is off', async () => {
    m = await Mooring.open({ store: new MemoryStateStore(), hosts: [new FakeDataEngine('a')], repairIntervalMs: 0 });
    const metrics = new MooringMetrics(m, { dataPath: false });
    const p = parsePromText(await metrics.registry.metrics());
    metrics.close();
    expect(p.find('mooring_repair_pass_duration_seconds')).toEqual([]);
    expect(p.find('mooring_repair_pass_next_delay_seconds')).toEqual([]);
    expect(p.value('mooring_repair_passes_total')).toBe(0);
  });
});
