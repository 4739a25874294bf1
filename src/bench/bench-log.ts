// How `mooring bench` logs (docs/logging.md): its lines become records of the run's logger,
// so --log-format, --log-level and --no-progress apply to it as to every other command.
import type { Logger } from '../util/logger.js';

/**
 * The `log(line)` the bench steps call. A step's line is sorted by what it says: warnings
 * (`warning: ...`) and failures (`...: FAILED: ...`) are `warn` records; the files written
 * and the run's start and interruption (`mooring bench: ...`, as `bench: ...`) are `info`
 * records; every other line tells how far the run got (the
 * target being prepared, each measurement) and is a progress record, `info` too, left out
 * with `progress` false (--no-progress). Leading blank lines and indentation are dropped.
 */
export function benchLogLine(log: Logger, progress: boolean): (line: string) => void {
  return (line) => {
    const text = line.trim();
    if (text === '') return;
    const warning = /^warning: ([\s\S]*)$/.exec(text);
    if (warning) log.warn(warning[1]!);
    else if (/: FAILED: /.test(text)) log.warn(text);
    else if (/^wrote /.test(text)) log.info(text);
    // The human format puts `mooring: ` in front already.
    else if (/^mooring bench: /.test(text)) log.info(text.slice('mooring '.length));
    else if (progress) log.info({ bench: 'progress' }, text);
  };
}
