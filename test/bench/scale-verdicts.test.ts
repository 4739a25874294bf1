// The scale report's verdicts (issue 21's targets) from made-up curves: each target passes
// or misses on the figure it names, and a target whose sizes were not measured is left out.
import { describe, expect, it } from 'vitest';

import type { ScaleCurve } from '../../src/bench/scale/curve.js';
import type { ScaleResults } from '../../src/bench/scale/index.js';
import { scaleVerdicts } from '../../src/bench/scale/report.js';

function depthCurve(points: Array<[number, Record<string, number>]>): ScaleCurve {
  return { id: 'depth', title: 'depth', sizeLabel: 'depth', method: '', columns: [], points: points.map(([size, figures]) => ({ size, figures, wallSec: 1 })) };
}

function results(curves: ScaleCurve[]): ScaleResults {
  return { curves, failures: [], openFileLimit: '1024', settings: {} as ScaleResults['settings'] };
}

describe('scale verdicts', () => {
  it('judges snapshot create from depth 100 to 1,000 against 1.5× and reads at 1,000 against 0.9×', () => {
    const flat = scaleVerdicts(results([depthCurve([[100, { snapshotMs: 3.8, ratio: 1 }], [1000, { snapshotMs: 2.8, ratio: 0.98 }]])]));
    expect(flat).toContain('| depth 100 → 1,000: snapshot create within 1.5× (independent of depth) | ×0.74 (3.8 → 2.8 ms) | **pass** |');
    expect(flat).toContain('| depth 1,000: 4k random reads ≥ 0.9× a flat volume | 0.98× | **pass** |');
    const growing = scaleVerdicts(results([depthCurve([[100, { snapshotMs: 4.8, ratio: 1 }], [1000, { snapshotMs: 7.8, ratio: 0.8 }]])]));
    expect(growing).toContain('| depth 100 → 1,000: snapshot create within 1.5× (independent of depth) | ×1.63 (4.8 → 7.8 ms) | **miss** |');
    expect(growing).toContain('| depth 1,000: 4k random reads ≥ 0.9× a flat volume | 0.80× | **miss** |');
    // Only depth 100 measured (--scale-max 100): neither depth target is judged.
    expect(scaleVerdicts(results([depthCurve([[100, { snapshotMs: 3.8, ratio: 1 }]])]))).toEqual([]);
  });
});
