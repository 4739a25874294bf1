// Shared pieces of the `mooring` commands: the context they run in (injectable, so unit
// tests call commands directly with a fake addon and captured output), argument parsing
// with coded usage errors, and error printing.
import { resolve } from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';

import { TLS_PEM_BYTES_MAX, type DataEngineTlsOptions } from '../data-engine/addresses.js';

import { MooringError, toMooringError } from '../errors.js';
import type { NativeAddon } from '../native/binding.js';
import { loadAddon } from '../native/load.js';
import { readFileLimited } from '../util/files.js';
import { formatBytes, parseSize } from '../util/size.js';
import type { Logger } from '../util/logger.js';
import { checkName, checkVolumeSize } from '../util/validate.js';
import { logOf, type LogSettings } from './log.js';

/** Where commands write and what they run against. Everything is optional but output. */
export interface CliContext {
  /** Machine-readable output (READY line, --json). */
  stdout: (text: string) => void;
  /** Where logs and errors are written (through {@link CliContext.log}), and help on a usage error. */
  stderr: (text: string) => void;
  /** The run's logger (runCli makes it from the logging flags; default: human lines on stderr). */
  log?: Logger;
  /** The logging flags of the run (default: human, info, progress on). */
  logSettings?: LogSettings;
  /** The native addon (default: this package's). */
  addon?: NativeAddon;
  /** Resolves relative paths (default: process.cwd()). */
  cwd?: string;
  /** Source of SIGINT/SIGTERM for `serve` (default: process). */
  signals?: SignalSource;
  /** Forced exit on a second signal (default: process.exit). */
  exit?: (code: number) => void;
}

/** The part of `process` that `serve` listens to for signals. */
export interface SignalSource {
  on(event: 'SIGINT' | 'SIGTERM', listener: (signal: NodeJS.Signals) => void): unknown;
  off(event: 'SIGINT' | 'SIGTERM', listener: (signal: NodeJS.Signals) => void): unknown;
}

/**
 * SIGINT/SIGTERM handling of a long-running command (serve, data-engine). Installed before
 * anything is printed, so a signal sent right after READY always takes the orderly path;
 * a second signal exits at once (status 1). Also keeps the event loop alive, which signal
 * listeners do not, until {@link StopSignals.dispose}.
 */
export interface StopSignals {
  /** The first signal, if one came already. */
  readonly pending: string | undefined;
  /** Resolves with the first signal (at once if it came already). */
  wait(): Promise<string>;
  /** Removes the listeners and the keep-alive timer. */
  dispose(): void;
}

/** See {@link StopSignals}; `what` completes "exiting without waiting for ..." on a second signal. */
export function installStopSignals(ctx: CliContext, what: string): StopSignals {
  const signals = ctx.signals;
  let stopRequested: ((signal: string) => void) | undefined;
  let pending: string | undefined;
  let count = 0;
  const onSignal = (signal: NodeJS.Signals): void => {
    count++;
    if (count > 1) {
      logOf(ctx).warn({ signal }, `${signal} again: exiting without waiting for ${what}`);
      (ctx.exit ?? ((code: number) => process.exit(code)))(1);
      return;
    }
    if (stopRequested) stopRequested(signal);
    else pending = signal;
  };
  signals?.on('SIGINT', onSignal);
  signals?.on('SIGTERM', onSignal);
  const keepAlive = setInterval(() => undefined, 1 << 30);
  return {
    get pending() {
      return pending;
    },
    wait: () =>
      new Promise<string>((res) => {
        if (pending) res(pending);
        else stopRequested = res;
      }),
    dispose: () => {
      clearInterval(keepAlive);
      signals?.off('SIGINT', onSignal);
      signals?.off('SIGTERM', onSignal);
    },
  };
}

/** The context of the real CLI process. */
export function processContext(): CliContext {
  return {
    stdout: (t) => void process.stdout.write(t),
    stderr: (t) => void process.stderr.write(t),
    signals: process,
    exit: (code) => process.exit(code),
  };
}

/** The addon commands use: the injected one, else this package's (loaded now, so a load failure comes first). */
export function addonOf(ctx: CliContext): NativeAddon {
  ctx.addon ??= loadAddon();
  return ctx.addon;
}

/** A mistake in how a command was called: printed with a hint, exit status 2. */
export class UsageError extends MooringError {
  /** The command whose --help to point at, e.g. "serve". */
  readonly command: string;

  constructor(command: string, message: string) {
    super('INVALID_ARGUMENT', message);
    this.name = 'UsageError';
    this.command = command;
  }
}

type Options = NonNullable<ParseArgsConfig['options']>;

/** Parses `argv` for `command`; unknown options, missing values and the like become UsageErrors. */
export function parseCommandArgs<O extends Options>(
  command: string,
  argv: string[],
  options: O,
  positionals: { min: number; max: number },
): { values: ReturnType<typeof parseArgs<{ options: O; allowPositionals: true; strict: true; args: string[] }>>['values']; positionals: string[] } {
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options, allowPositionals: true, strict: true });
  } catch (err) {
    // parseArgs messages are good ("Unknown option '--x'..."); keep them, minus its own hints,
    // except for a value that starts with a dash, which it calls ambiguous.
    const text = (err as Error).message;
    const dashValue = /^Option '(--[\w-]+)(?: <value>)?' argument is ambiguous/.exec(text);
    if (dashValue) throw new UsageError(command, `${dashValue[1]} needs a value; to give one starting with '-', write ${dashValue[1]}=VALUE`);
    throw new UsageError(command, text.split('. To specify a positional argument')[0] ?? text);
  }
  const pos = parsed.positionals;
  if (pos.length < positionals.min) throw new UsageError(command, `missing argument${positionals.min - pos.length > 1 ? 's' : ''}`);
  if (pos.length > positionals.max) throw new UsageError(command, `unexpected argument ${JSON.stringify(pos[positionals.max])}`);
  return { values: parsed.values as never, positionals: pos };
}

/** `--dir` is required by every volume command. */
export function requireDir(command: string, dir: string | undefined): string {
  if (dir === undefined || dir === '') throw new UsageError(command, '--dir DIR is required');
  return dir;
}

/** A name option (`--volume`, `--host-id`) as checkName checks names, a usage error when it is none. */
export function parseNameOption(command: string, option: string, value: string): string {
  try {
    return checkName(option, value);
  } catch (err) {
    throw new UsageError(command, toMooringError(err).message);
  }
}

/** Parses a --size value and checks it as the library checks a volume size; a usage error when it is no valid size. */
export function parseSizeOption(command: string, text: string): number {
  try {
    return checkVolumeSize(parseSize(text));
  } catch (err) {
    throw new UsageError(command, `--size: ${(err as Error).message}`);
  }
}

// /etc/group of a large host stays far below this.
const GROUP_FILE_BYTES_MAX = 8 << 20;

/**
 * Parses --socket-group: a numeric gid or a group name looked up in /etc/group (Node has
 * no getgrnam). A usage error when it is neither.
 */
export async function parseGroupOption(command: string, text: string): Promise<number> {
  if (/^\d{1,10}$/.test(text) && Number(text) <= 0xfffffffe) return Number(text);
  if (!/^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$/.test(text)) {
    throw new UsageError(command, `--socket-group must be a group name or a numeric gid (got ${JSON.stringify(text)})`);
  }
  const groups = await readFileLimited('/etc/group', GROUP_FILE_BYTES_MAX, 'INVALID_ARGUMENT', { followSymlinks: true }).catch(() => '');
  for (const line of groups.split('\n')) {
    const [name, , gid] = line.split(':');
    if (name === text && gid !== undefined && /^\d+$/.test(gid)) return Number(gid);
  }
  throw new UsageError(command, `--socket-group: no group ${JSON.stringify(text)} in /etc/group (give its numeric gid instead)`);
}

/** Parses a byte-count option (`--replica-buffer-bytes 256M`) within [min, max]; a usage error otherwise. */
export function parseBytesOption(command: string, option: string, text: string, min: number, max: number): number {
  let n: number;
  try {
    n = parseSize(text);
  } catch (err) {
    throw new UsageError(command, `${option}: ${(err as Error).message}`);
  }
  if (n < min || n > max) throw new UsageError(command, `${option} must be within ${formatBytes(min)}..${formatBytes(max)} (got ${JSON.stringify(text)})`);
  return n;
}

/** Parses --replicas: an integer 1..16. */
/** The TLS options of `data-engine` and `serve`. */
export const TLS_OPTIONS = {
  'tls-cert': { type: 'string' },
  'tls-key': { type: 'string' },
  'tls-ca': { type: 'string' },
} as const;

/**
 * Reads --tls-cert/--tls-key/--tls-ca (all three or none; PEM files, relative to cwd).
 *
 * @throws UsageError (not all three), MooringError INVALID_ARGUMENT / NOT_FOUND (a file)
 */
export async function readTlsOptions(
  command: string,
  values: { 'tls-cert'?: string | undefined; 'tls-key'?: string | undefined; 'tls-ca'?: string | undefined },
  cwd: string,
): Promise<DataEngineTlsOptions | undefined> {
  const files = [values['tls-cert'], values['tls-key'], values['tls-ca']];
  if (files.every((f) => f === undefined)) return undefined;
  if (files.some((f) => f === undefined)) throw new UsageError(command, '--tls-cert, --tls-key and --tls-ca go together');
  const [cert, key, ca] = await Promise.all(files.map((f) => readFileLimited(resolve(cwd, f!), TLS_PEM_BYTES_MAX, 'INVALID_ARGUMENT', { followSymlinks: true })));
  return { cert: cert!, key: key!, ca: ca! };
}

export function parseReplicasOption(command: string, text: string): number {
  if (!/^\d{1,2}$/.test(text) || Number(text) < 1 || Number(text) > 16) {
    throw new UsageError(command, `--replicas must be an integer in 1..16 (got ${JSON.stringify(text)})`);
  }
  return Number(text);
}

/**
 * Logs `err` (level error, field `code`; human format: `mooring: CODE: message`) and returns the exit status:
 * 2 for usage errors, 1 for the rest. MOORING_DEBUG=1 adds the stack.
 */
export function reportError(ctx: CliContext, err: unknown): number {
  const log = logOf(ctx);
  if (err instanceof UsageError) {
    const hint = err.command ? `mooring ${err.command} --help` : 'mooring --help';
    log.error({ code: err.code, hint: `Try '${hint}'.` }, err.message);
    return 2;
  }
  const e = toMooringError(err);
  log.error({ code: e.code, ...(process.env.MOORING_DEBUG ? { stack: e.stack ?? '' } : {}) }, e.message);
  return 1;
}

/** JSON for --json output, one document per call. */
export function printJson(ctx: CliContext, value: unknown): void {
  ctx.stdout(`${JSON.stringify(value, null, 2)}\n`);
}

/** Formats ms since the epoch as an ISO date. */
export function isoTime(ms: number): string {
  return Number.isFinite(ms) ? new Date(ms).toISOString() : String(ms);
}
