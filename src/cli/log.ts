// How the `mooring` commands log (docs/logging.md): one pino logger per run, writing to the
// context's stderr either one JSON object per line (--log-format json) or human lines
// (`mooring: ...`, the default). The same logger is handed to the library, so its records
// and the command's own come out alike. Flags shared by every command are taken out of
// argv here, before the command parses its own.
import { pino } from 'pino';

import type { Logger } from '../util/logger.js';
import { UsageError, type CliContext } from './common.js';

/** How a run logs (the global flags). */
export interface LogSettings {
  format: 'human' | 'json';
  level: LogLevel;
  /** Whether --log-level was given (short commands show the library's info records only then). */
  levelGiven: boolean;
  /** False with --no-progress. */
  progress: boolean;
  /** Least time between two progress lines of one task (--progress-interval-ms, default 1000). */
  progressIntervalMs: number;
}

export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Default least time between two progress lines. */
export const DEFAULT_PROGRESS_INTERVAL_MS = 1000;
const PROGRESS_INTERVAL_MS_MAX = 3_600_000;

export const DEFAULT_LOG_SETTINGS: LogSettings = {
  format: 'human',
  level: 'info',
  levelGiven: false,
  progress: true,
  progressIntervalMs: DEFAULT_PROGRESS_INTERVAL_MS,
};

/** Help lines of the flags every command takes. */
export const LOG_HELP = `  --log-format human|json   stderr as human lines (default) or one JSON object per line
  --log-level LEVEL         trace, debug, info (default), warn, error, fatal or silent
  --no-progress             no progress lines for long work (exports, clones, imports,
                            rebuilds, bench steps)
  --progress-interval-ms MS least time between two progress lines (default ${DEFAULT_PROGRESS_INTERVAL_MS})`;

const VALUED = ['--log-format', '--log-level', '--progress-interval-ms'] as const;

/**
 * Takes the logging flags out of a command's `argv` (anywhere before a `--`).
 *
 * @throws UsageError (a missing or unknown value)
 */
export function takeLogFlags(command: string, argv: string[]): { settings: LogSettings; rest: string[] } {
  const settings: LogSettings = { ...DEFAULT_LOG_SETTINGS };
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') {
      rest.push(...argv.slice(i));
      break;
    }
    if (a === '--no-progress') {
      settings.progress = false;
      continue;
    }
    const flag = VALUED.find((f) => a === f || a.startsWith(`${f}=`));
    if (flag === undefined) {
      rest.push(a);
      continue;
    }
    let value: string | undefined;
    if (a.length > flag.length) value = a.slice(flag.length + 1);
    else {
      value = argv[i + 1];
      if (value === undefined || value.startsWith('-')) throw new UsageError(command, `${flag} needs a value`);
      i++;
    }
    if (flag === '--log-format') {
      if (value !== 'human' && value !== 'json') throw new UsageError(command, `--log-format must be human or json (got ${JSON.stringify(value)})`);
      settings.format = value;
    } else if (flag === '--log-level') {
      if (!(LOG_LEVELS as readonly string[]).includes(value)) throw new UsageError(command, `--log-level must be one of ${LOG_LEVELS.join(', ')} (got ${JSON.stringify(value)})`);
      settings.level = value as LogLevel;
      settings.levelGiven = true;
    } else {
      if (!/^\d{1,7}$/.test(value) || Number(value) > PROGRESS_INTERVAL_MS_MAX) {
        throw new UsageError(command, `--progress-interval-ms must be an integer in 0..${PROGRESS_INTERVAL_MS_MAX} (got ${JSON.stringify(value)})`);
      }
      settings.progressIntervalMs = Number(value);
    }
  }
  return { settings, rest };
}

/** A record as pino writes it (the fields the human format reads). */
interface Record {
  level?: string;
  msg?: string;
  code?: string;
  hint?: string;
  stack?: string;
  [key: string]: unknown;
}

/** One record as the human line(s) of the default format. */
export function humanLine(r: Record): string {
  const msg = r.msg ?? '';
  let line: string;
  switch (r.level) {
    case 'warn':
      line = `mooring: warning: ${r.code ? `${r.code}: ` : ''}${msg}`;
      break;
    case 'error':
    case 'fatal':
      line = `mooring: ${r.code ?? (r.level === 'fatal' ? 'fatal' : 'error')}: ${msg}`;
      break;
    case 'debug':
    case 'trace':
      line = `mooring: ${r.level}: ${msg}`;
      break;
    default:
      line = `mooring: ${msg}`;
  }
  if (r.hint) line += `\n${r.hint}`;
  if (r.stack) line += `\n${r.stack}`;
  return `${line}\n`;
}

/** The pino logger of a run, writing to `ctx.stderr` as `settings` say. */
export function makeCliLogger(ctx: Pick<CliContext, 'stderr'>, settings: Pick<LogSettings, 'format' | 'level'>): Logger {
  const json = settings.format === 'json';
  const destination = {
    write(line: string): void {
      if (json) {
        ctx.stderr(line);
        return;
      }
      let r: Record;
      try {
        r = JSON.parse(line) as Record;
      } catch {
        ctx.stderr(line);
        return;
      }
      ctx.stderr(humanLine(r));
    },
  };
  return pino(
    {
      level: settings.level,
      base: { pid: process.pid },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    destination,
  );
}

/** The run's logger: the one runCli made, else (a command called directly) a default one. */
export function logOf(ctx: CliContext): Logger {
  ctx.log ??= makeCliLogger(ctx, ctx.logSettings ?? DEFAULT_LOG_SETTINGS);
  return ctx.log;
}

/** The run's log settings. */
export function logSettingsOf(ctx: CliContext): LogSettings {
  return ctx.logSettings ?? DEFAULT_LOG_SETTINGS;
}

/**
 * The logger handed to the library: the run's, but for commands that do one short thing
 * (create, info, snapshot) only its warnings and errors unless --log-level was given, so
 * their attach/detach and engine records do not drown what the command prints.
 */
export function libraryLoggerOf(ctx: CliContext, shortCommand: boolean): Logger {
  const log = logOf(ctx);
  const s = logSettingsOf(ctx);
  if (!shortCommand || s.levelGiven) return log;
  const child = (log as unknown as { child(b: object, o: { level: string }): Logger }).child({}, { level: levelAtLeast(s.level, 'warn') });
  return child;
}

function levelAtLeast(level: LogLevel, floor: LogLevel): LogLevel {
  return LOG_LEVELS.indexOf(level) >= LOG_LEVELS.indexOf(floor) ? level : floor;
}
