// `mooring data-engine --allow-successor-exec PREFIX`: a data engine that may be asked (the
// ReplaceProcess call, an upgrade's default launcher: docs/upgrade.md) to stop and start a
// new version of itself in its place, on the same directory, host id and addresses. Only a
// program under PREFIX may be started: a gRPC caller must not be able to run anything else.
import { spawn } from 'node:child_process';
import { constants } from 'node:fs';
import { access, realpath } from 'node:fs/promises';
import { isAbsolute, sep } from 'node:path';

import { MooringError } from '../errors.js';

// Whether `path` (resolved) lies under `prefix` (resolved).
async function isUnder(path: string, prefix: string): Promise<boolean> {
  const [p, root] = await Promise.all([realpath(path), realpath(prefix)]);
  return p === root || p.startsWith(root.endsWith(sep) ? root : root + sep);
}

/**
 * Checks a successor's argv before this process stops for it: its program (or, when the
 * program is this node binary, its script) is an existing file under `prefix`, and the
 * program may be run.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export async function checkSuccessorArgv(argv: string[], prefix: string): Promise<void> {
  const program = argv[0]!;
  if (!isAbsolute(program)) throw new MooringError('INVALID_ARGUMENT', `the successor's program must be an absolute path (got ${JSON.stringify(program).slice(0, 200)})`);
  await access(program, constants.X_OK).catch(() => {
    throw new MooringError('INVALID_ARGUMENT', `the successor's program ${program} does not exist or may not be run`);
  });
  const viaNode = (await realpath(program)) === (await realpath(process.execPath));
  const checked = viaNode ? argv[1] : program;
  if (checked === undefined || !isAbsolute(checked)) throw new MooringError('INVALID_ARGUMENT', 'a successor run by node needs the absolute path of its script');
  const under = await isUnder(checked, prefix).catch(() => false);
  if (!under) throw new MooringError('INVALID_ARGUMENT', `the successor ${checked} is not under ${prefix} (--allow-successor-exec)`);
}

/**
 * Starts the successor, detached from this process (its own session), with this process's
 * standard output and error, so its READY line and logs go where this one's went.
 */
export function spawnSuccessor(argv: string[], dataEngineArgs: string[]): { pid: number; exited: Promise<number | string> } {
  const child = spawn(argv[0]!, [...argv.slice(1), 'data-engine', ...dataEngineArgs], { detached: true, stdio: ['ignore', 'inherit', 'inherit'] });
  child.unref();
  const exited = new Promise<number | string>((res) => {
    child.once('exit', (code, signal) => res(code ?? signal ?? 'exit'));
    child.once('error', (err) => res(err.message));
  });
  return { pid: child.pid ?? 0, exited };
}
