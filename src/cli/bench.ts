// `mooring bench`: delegates to src/bench (loaded only when asked for: it pulls in fio
// orchestration the other commands never need).
import type { CliContext } from './common.js';

/** Runs `mooring bench`; the bench module handles its own --help and signals. */
export async function runBenchCommand(argv: string[], _ctx: CliContext): Promise<number> {
  const { runBench } = await import('../bench/index.js');
  return runBench(argv);
}
