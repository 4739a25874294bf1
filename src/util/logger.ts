// The one way Mooring logs (docs/logging.md): a levelled, structured logger the embedder
// passes in. pino's loggers fit {@link Logger} as they are; other loggers need a few lines
// of adapter. Without one, the library logs nothing (a library must not write to its
// embedder's stderr on its own); the `mooring` command makes a pino logger of its own.
import type { DataEngineEvent } from '../data-engine/data-engine.js';
import { describeEvent } from '../data-engine/describe-event.js';
import { MooringError } from '../errors.js';
import { describe } from './validate.js';

/**
 * One level of a {@link Logger}: a record is structured fields and a message (pino's
 * calling convention, `log.info({ volume: 'v' }, 'volume v created')`), or a message alone.
 */
export interface LogFn {
  /** Logs `msg` with the structured `fields` (e.g. `volume`, `hostId`, `code`). */
  (fields: Record<string, unknown>, msg: string): void;
  /** Logs `msg` alone. */
  (msg: string): void;
}

/**
 * What Mooring needs of a logger: pino's six levels and `child()`. A pino logger is one as it
 * is (`Mooring.open({ dir, logger: pino() })`); any other logger fits behind a small
 * adapter. Mooring calls each level with fields first and the message second, and makes one
 * child per component (`{ component: 'cluster' }`, `{ component: 'data-engine' }`).
 */
export interface Logger {
  /** Finest detail (not used by Mooring today). */
  trace: LogFn;
  /** Frequent detail: progress of rebuilds and copies, every data-engine event of little weight. */
  debug: LogFn;
  /** What changed: volumes created and deleted, attaches, epochs claimed, rebuilds started and done. */
  info: LogFn;
  /** Something failed and Mooring carries on: a background repair that failed, a rebuild that failed, a host that did not answer. */
  warn: LogFn;
  /** A replica failed; in the CLI, the error a command exits with. */
  error: LogFn;
  /** The process cannot go on. */
  fatal: LogFn;
  /** A logger that adds `bindings` to every record it logs. */
  child(bindings: Record<string, unknown>): Logger;
}

const nothing = (): void => undefined;

/** A logger that drops every record: the default of the library. */
export const silentLogger: Logger = {
  trace: nothing,
  debug: nothing,
  info: nothing,
  warn: nothing,
  error: nothing,
  fatal: nothing,
  child: () => silentLogger,
};

const LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal'] as const;

/**
 * `value` as a logger option: undefined gives {@link silentLogger}.
 *
 * @throws MooringError INVALID_ARGUMENT (no level method or no child())
 */
export function checkLogger(option: string, value: unknown): Logger {
  if (value === undefined) return silentLogger;
  if (typeof value !== 'object' || value === null) throw new MooringError('INVALID_ARGUMENT', `${option} must be a logger such as pino's (got ${describe(value)})`);
  for (const m of [...LEVELS, 'child'] as const) {
    if (typeof (value as Record<string, unknown>)[m] !== 'function') {
      throw new MooringError('INVALID_ARGUMENT', `${option} must be a logger such as pino's: it has no ${m}() method`);
    }
  }
  return value as Logger;
}

/**
 * Calls `log` and never throws: a logger that fails (a closed destination, a throwing
 * adapter) must not break the operation it reports on.
 */
export function safeLog(log: Logger, level: (typeof LEVELS)[number], fields: Record<string, unknown>, msg: string): void {
  try {
    log[level](fields, msg);
  } catch {
    // Nothing sensible to do: logging about a failed logger would fail too.
  }
}

/** The level a data-engine event is logged at. */
export function dataEngineEventLevel(e: DataEngineEvent): 'debug' | 'info' | 'warn' | 'error' {
  switch (e.type) {
    case 'replica-error':
      return 'error';
    case 'rebuild-failed':
    case 'repair-scheduled':
      return 'warn';
    case 'salvaged':
      return e.complete ? 'info' : 'warn';
    case 'rebuild-progress':
    case 'snapshot-copy-progress':
      return 'debug';
    case 'backing-image-file':
      return e.state === 'failed' ? 'warn' : e.state === 'in-progress' ? 'debug' : 'info';
    default:
      return 'info';
  }
}

/**
 * Logs a data-engine event of `hostId`: message `host H: <what happened>`, fields `event`
 * (its type), `hostId` and the event's own (`volume`, `replicaId`, `code`, ...).
 */
export function logDataEngineEvent(log: Logger, hostId: string, e: DataEngineEvent): void {
  const { type, ...fields } = e;
  safeLog(log, dataEngineEventLevel(e), { event: type, hostId, ...fields }, `host ${hostId}: ${describeEvent(e)}`);
}
