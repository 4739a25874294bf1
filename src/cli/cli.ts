// Command dispatch of `mooring`, separate from main.ts so tests can run it in-process.
import { packageVersion } from '../native/load.js';
import { runBenchCommand } from './bench.js';
import { UsageError, reportError, type CliContext } from './common.js';
import { runCreate } from './create.js';
import { runDataEngine } from './data-engine.js';
import { runImage } from './image.js';
import { runInfo } from './info.js';
import { runRebuild } from './rebuild.js';
import { LOG_HELP, makeCliLogger, takeLogFlags } from './log.js';
import { runServe } from './serve.js';
import { runSnapshot } from './snapshot.js';

/** Help text of `mooring`. */
export const MAIN_HELP = `Usage: mooring <command> [options]

Replicated block volumes served over NBD.

Commands:
  serve      serve a volume (created first if new) over NBD until SIGINT/SIGTERM
  create     create a volume (detached)
  info       show volumes: size, replicas, epoch and snapshots (changes nothing)
  snapshot   create, list, delete, revert, export or clone snapshots
  rebuild    bring every replica back to RW and wait, with progress
  image      import a raw or qcow2 file as a backing image and a volume on it
  bench      benchmark Mooring against qemu-nbd and the raw disk (needs fio, qemu-nbd)
  data-engine  run this host's data engine (replicas, engines) as a process, served over gRPC

Run 'mooring <command> --help' for a command's options.
  --version  print the version
  --help     show this help

Every command also takes (docs/logging.md):
${LOG_HELP}

Errors print as 'mooring: CODE: message' (exit 1; usage errors exit 2).
`;

const COMMANDS: Record<string, (argv: string[], ctx: CliContext) => Promise<number>> = {
  serve: runServe,
  create: runCreate,
  info: runInfo,
  snapshot: runSnapshot,
  rebuild: runRebuild,
  image: runImage,
  bench: runBenchCommand,
  'data-engine': runDataEngine,
};

/** Runs the CLI with `argv` (without node and script); resolves to the exit status. */
export async function runCli(argv: string[], ctx: CliContext): Promise<number> {
  const [command, ...rest] = argv;
  try {
    if (command === undefined) {
      ctx.stderr(MAIN_HELP);
      return 2;
    }
    if (command === '--help' || command === '-h' || command === 'help') {
      ctx.stdout(MAIN_HELP);
      return 0;
    }
    if (command === '--version' || command === '-v' || command === 'version') {
      ctx.stdout(`${packageVersion()}\n`);
      return 0;
    }
    const run = COMMANDS[command];
    if (!run) throw new UsageError('', `unknown command ${JSON.stringify(command)} (expected ${Object.keys(COMMANDS).join(', ')})`);
    const { settings, rest: commandArgs } = takeLogFlags(command, rest);
    ctx.logSettings = settings;
    ctx.log = makeCliLogger(ctx, settings);
    return await run(commandArgs, ctx);
  } catch (err) {
    return reportError(ctx, err);
  }
}
