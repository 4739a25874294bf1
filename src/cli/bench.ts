// `mooring bench`: delegates to src/bench (loaded only when asked for: it pulls in fio
// orchestration the other commands never need).
import type { CliContext } from './common.js';
import { logOf, logSettingsOf } from './log.js';

/** Runs `mooring bench` (logging as the run's flags say); the bench module handles its own --help and signals. */
export async function runBenchCommand(argv: string[], ctx: CliContext): Promise<number> {
  const { runBench } = await import('../bench/index.js');
  return runBench(argv, { stdout: ctx.stdout, log: logOf(ctx), progress: logSettingsOf(ctx).progress });
}
