#!/usr/bin/env node
/**
 * `mooring-lock-exec` (dist/lock-exec.js): registers this process with the local sanlock
 * daemon, then execs the VM command in place, so the VM process is the registered lease
 * holder and the library can acquire and release locks on its behalf (sanlock_acquire with
 * its pid). Started by {@link LockedProcess.start}; usable by hand for other launchers.
 *
 *   mooring-lock-exec [--control-fd N] [--restrict sigkill|sigterm] [--killpath PATH [--killpath-args ARGS]] -- COMMAND ARGS...
 *
 * Protocol on the control fd (a socket from the launcher; line-delimited JSON):
 *   helper -> launcher  {"type":"registered","pid":N}  after sanlock_register (+restrict, killpath)
 *   launcher -> helper  go | abort                      go: locks acquired, run the command
 *   helper -> launcher  {"type":"error","code":C,"message":M}  on any failure (then exit 127)
 * After "go" the helper execs COMMAND; the control fd is close-on-exec, so the launcher sees
 * EOF. Without --control-fd (run by hand), it registers and execs at once: the caller acquires locks by
 * pid after the start, which sanlock allows while the process runs.
 *
 * @packageDocumentation
 */
import { writeSync } from 'node:fs';
import { Socket } from 'node:net';

import { isMooringError, toMooringError } from '../errors.js';
import { loadAddon } from '../native/load.js';
import { SanlockClient } from './sanlock-client.js';

/** SANLK_RESTRICT_SIGKILL / SIGTERM. */
const RESTRICT_FLAGS = { sigkill: 0x2, sigterm: 0x4 } as const;
/** Exit status when the command was not run. */
const EXIT_NOT_RUN = 127;
/** Exit status of a usage error. */
const EXIT_USAGE = 2;

interface HelperArgs {
  controlFd?: number;
  restrict?: keyof typeof RESTRICT_FLAGS;
  killPath?: string;
  killPathArgs?: string;
  command: string;
  args: string[];
}

const USAGE = `usage: mooring-lock-exec [--control-fd N] [--restrict sigkill|sigterm] [--killpath PATH [--killpath-args ARGS]] -- COMMAND ARGS...

Registers with the local sanlock daemon (SANLOCK_RUN_DIR), then execs COMMAND in this
process, so that the locks acquired for this pid are the command's (docs/locks.md).
  --control-fd N        report on fd N and wait for "go" before the exec (LockedProcess)
  --restrict MODE       signals sanlock may not use: sigkill or sigterm
  --killpath PATH       program the daemon runs to stop the command (pid appended)
  --killpath-args ARGS  its arguments, one string
  -h, --help            show this help
Exit status: 2 for a usage error, 127 when COMMAND could not be run.
`;

/** A bad command line: exit 2 with the usage, as the other bins do. */
class UsageError extends Error {}

function parse(argv: string[]): HelperArgs | 'help' {
  const out: Partial<HelperArgs> = {};
  let i = 0;
  for (; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') {
      i++;
      break;
    }
    if (a === '-h' || a === '--help') return 'help';
    const v = argv[i + 1];
    if (a === '--control-fd' && v !== undefined && /^[0-9]{1,6}$/.test(v)) out.controlFd = Number(v);
    else if (a === '--restrict' && (v === 'sigkill' || v === 'sigterm')) out.restrict = v;
    else if (a === '--killpath' && v) out.killPath = v;
    else if (a === '--killpath-args' && v !== undefined) out.killPathArgs = v;
    else if (['--control-fd', '--restrict', '--killpath', '--killpath-args'].includes(a)) throw new UsageError(`${a} needs a valid value (got ${v === undefined ? 'none' : JSON.stringify(v)})`);
    else throw new UsageError(`unknown option ${JSON.stringify(a)}`);
    i++;
  }
  const command = argv[i];
  if (!command) throw new UsageError('no COMMAND after --');
  return { ...out, command, args: argv.slice(i + 1) } as HelperArgs;
}

async function main(): Promise<void> {
  let control: Socket | undefined;
  let controlFd = -1;
  const report = (m: object) => {
    // Synchronous: the process may exec or exit right after.
    if (control) writeSync(controlFd, `${JSON.stringify(m)}\n`);
  };
  let opts: HelperArgs | 'help';
  try {
    opts = parse(process.argv.slice(2));
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    writeSync(2, `mooring-lock-exec: ${err.message}\n${USAGE}`);
    process.exit(EXIT_USAGE);
  }
  if (opts === 'help') {
    writeSync(1, USAGE);
    process.exit(0);
  }
  try {
    if (opts.controlFd !== undefined) {
      controlFd = opts.controlFd;
      control = new Socket({ fd: controlFd, readable: true, writable: true });
    }
    const addon = loadAddon();
    const client = new SanlockClient(addon);
    const reg = await client.call('register', 'with the sanlock daemon', (s) => s.register());
    const fd = reg.fd!;
    if (opts.restrict) await client.call('restrict', `fd ${fd}`, (s) => s.restrict(fd, RESTRICT_FLAGS[opts.restrict!]));
    if (opts.killPath) await client.call('killpath', opts.killPath, (s) => s.killpath(fd, opts.killPath!, opts.killPathArgs ?? '', true));
    if (control) {
      report({ type: 'registered', pid: process.pid });
      const word = await readWord(control);
      if (word !== 'go') process.exit(EXIT_NOT_RUN);
      control.pause();
    }
    try {
      addon.sanlock.execvp(opts.command, opts.args, control ? [controlFd] : []);
    } catch (err) {
      const e = toMooringError(err);
      report({ type: 'error', code: e.code, message: e.message });
      writeSync(2, `mooring-lock-exec: ${e.code}: ${e.message}\n`);
      process.exit(EXIT_NOT_RUN);
    }
  } catch (err) {
    const e = toMooringError(err);
    report({ type: 'error', code: isMooringError(e) ? e.code : 'IO_ERROR', message: e.message });
    writeSync(2, `mooring-lock-exec: ${e.code}: ${e.message}\n`);
    process.exit(EXIT_NOT_RUN);
  }
}

function readWord(control: Socket): Promise<string> {
  return new Promise((resolve) => {
    let buf = '';
    control.setEncoding('utf8');
    control.on('data', (d: string) => {
      buf += d;
      const nl = buf.indexOf('\n');
      if (nl >= 0) resolve(buf.slice(0, nl).trim());
      if (buf.length > 1024) resolve('abort');
    });
    control.on('end', () => resolve('abort'));
    control.on('error', () => resolve('abort'));
  });
}

void main();
