// Runs upgrade-driver.mjs (a VM manager in its own process) for the controller-crash tests:
// counts the host steps it prints over all drivers and SIGKILLs it at the given ones.
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

import { repoRoot } from '../helpers/tools.js';

export interface DriverRun {
  /** upgrade-driver.mjs's arguments. */
  args: string[];
  /** Step numbers (0-based, counted over every driver of the test) at which it is killed. */
  killAt: readonly number[];
  /** Steps seen so far, shared by the drivers of one test. */
  steps: { n: number };
  /** Every line the drivers printed. */
  log: string[];
  /** Every driver started (the test kills leftovers). */
  drivers: ChildProcess[];
  /** Messages over the IPC channel (a launcher asking the test to replace a host). */
  onMessage?: (child: ChildProcess, message: unknown) => void;
  /** Appended to the error when a driver dies on its own. */
  diagnostics?: () => string;
}

/**
 * Resolves with 'killed' at a kill step, or the session's final state the driver printed,
 * once the driver has exited: until then it may still hold the state store's lock.
 */
export function runDriver(o: DriverRun): Promise<'killed' | string> {
  const child = spawn(process.execPath, [join(repoRoot, 'test/system/upgrade/upgrade-driver.mjs'), ...o.args], {
    stdio: ['ignore', 'pipe', 'pipe', ...(o.onMessage ? (['ipc'] as const) : [])],
  });
  o.drivers.push(child);
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  if (o.onMessage) child.on('message', (m) => o.onMessage!(child, m));
  return new Promise((resolve, reject) => {
    let outcome: string | null = null;
    createInterface({ input: child.stdout! }).on('line', (line) => {
      o.log.push(line);
      if (line.startsWith('STEP ')) {
        if (o.killAt.includes(o.steps.n++) && outcome === null) {
          outcome = 'killed';
          child.kill('SIGKILL');
        }
      } else if (line.startsWith('DONE ')) {
        outcome = line.slice('DONE '.length);
      }
    });
    child.on('exit', (code, signal) => {
      if (outcome !== null) resolve(outcome);
      else reject(new Error(`driver exited (${code ?? signal}) before the session ended\n${o.log.join('\n')}\n${stderr}${o.diagnostics?.() ?? ''}`));
    });
  });
}
