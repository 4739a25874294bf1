// How a data-engine event becomes a log record (src/util/logger.ts, docs/logging.md): a
// salvage start that may have lost acknowledged writes is a warning, one that lost nothing
// is info; the record carries the event's fields and says what was chosen.
import { describe, expect, it } from 'vitest';

import type { DataEngineEvent } from '../../../src/data-engine/data-engine.js';
import { logDataEngineEvent, type Logger } from '../../../src/util/logger.js';

/** A logger that keeps each record as [level, fields, message]. */
function recorder(): { log: Logger; records: Array<[string, Record<string, unknown>, string]> } {
  const records: Array<[string, Record<string, unknown>, string]> = [];
  const at = (level: string) => (fields: unknown, msg?: string) => void records.push([level, fields as Record<string, unknown>, msg ?? '']);
  const log: Logger = { trace: at('trace'), debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error'), fatal: at('fatal'), child: () => log };
  return { log, records };
}

describe('data-engine event log records', () => {
  it('logs salvaged as a warning unless complete', () => {
    const { log, records } = recorder();
    const lost: DataEngineEvent = { type: 'salvaged', volume: 'v', replicaId: 'r2', lastRw: { epoch: 4, generation: 2 }, complete: false, message: 'writes may be missing' };
    logDataEngineEvent(log, 'h1', lost);
    logDataEngineEvent(log, 'h1', { ...lost, lastRw: null, complete: true, message: 'kept' });
    expect(records).toEqual([
      ['warn', { event: 'salvaged', hostId: 'h1', volume: 'v', replicaId: 'r2', lastRw: { epoch: 4, generation: 2 }, complete: false, message: 'writes may be missing' }, expect.stringMatching(/^host h1: volume v: salvage start serves from replica r2 \(last RW in 4\/2; writes may be missing\)/)],
      ['info', expect.objectContaining({ event: 'salvaged', complete: true }), expect.stringMatching(/last RW in no recorded set; complete/)],
    ]);
  });
});
