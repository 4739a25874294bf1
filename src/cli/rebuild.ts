// `mooring rebuild`: brings every replica of a volume back to RW (Volume.rebuild) and waits,
// printing the progress of each replica's rebuild on stderr.
import type { DataEngineEvent, RebuildProgress } from '../data-engine/data-engine.js';
import { formatBytes } from '../util/size.js';
import { UsageError, parseCommandArgs, printJson, type CliContext } from './common.js';
import { EMBEDDED_HELP, EMBEDDED_OPTIONS, closeEmbedded, openEmbedded, pickVolume, type Embedded } from './embedded.js';
import { logOf, logSettingsOf } from './log.js';
import { rebuildProgress } from './progress.js';

/** How long `mooring rebuild` waits for the volume to be healthy by default. */
const DEFAULT_REBUILD_TIMEOUT_MS = 3_600_000;
const REBUILD_TIMEOUT_MS_MAX = 7 * 24 * 3_600_000;
/**
 * How long to wait, once the volume is healthy, for the completion events of rebuilds seen
 * starting (an event may cross from its data engine after the status that says RW).
 */
const COMPLETION_EVENT_WAIT_MS = 5_000;

/** Help text of `mooring rebuild`. */
export const REBUILD_HELP = `Usage: mooring rebuild --dir DIR [--volume V] [--host ADDRESS ...] [--timeout-ms MS] [--json]

Bring every replica of a volume back to RW and wait until it is healthy: the volume
attaches itself without NBD export on one of its hosts, its engine rebuilds the replicas
that missed writes (or replaces lost ones), and it detaches again. Progress lines of each
rebuild go to stderr (--no-progress silences them). Refused with BUSY while mooring serve
has DIR open: serve rebuilds by itself and prints the same lines.

Options:
${EMBEDDED_HELP}
  --timeout-ms MS      give up (UNAVAILABLE) if the volume is not healthy after MS
                       (default ${DEFAULT_REBUILD_TIMEOUT_MS}, one hour)
  --json               machine-readable result
  -h, --help           show this help
`;

/** Runs `mooring rebuild`. */
export async function runRebuild(argv: string[], ctx: CliContext): Promise<number> {
  const { values } = parseCommandArgs(
    'rebuild',
    argv,
    { ...EMBEDDED_OPTIONS, 'timeout-ms': { type: 'string' }, json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } },
    { min: 0, max: 0 },
  );
  if (values.help) {
    ctx.stdout(REBUILD_HELP);
    return 0;
  }
  const timeoutText = values['timeout-ms'];
  if (timeoutText !== undefined && (!/^\d{1,9}$/.test(timeoutText) || Number(timeoutText) > REBUILD_TIMEOUT_MS_MAX)) {
    throw new UsageError('rebuild', `--timeout-ms must be an integer in 0..${REBUILD_TIMEOUT_MS_MAX} (got ${JSON.stringify(timeoutText)})`);
  }
  const timeoutMs = timeoutText === undefined ? DEFAULT_REBUILD_TIMEOUT_MS : Number(timeoutText);

  let embedded: Embedded | null = null;
  try {
    embedded = await openEmbedded('rebuild', values, ctx, { repairIntervalMs: 0 });
    const m = embedded.mooring;
    const volume = m.volume((await pickVolume('rebuild', m, embedded.dir, values.volume)).name);
    const settings = logSettingsOf(ctx);
    const progress = settings.progress ? rebuildProgress(logOf(ctx), settings.progressIntervalMs) : null;
    const rebuilt: Array<{ replicaId: string; engineHostId: string } & RebuildProgress> = [];
    // Rebuilds seen starting and not yet ended, and who waits for them to end.
    const running = new Set<string>();
    let allEnded: (() => void) | null = null;
    const onEvent = (hostId: string, e: DataEngineEvent): void => {
      if (e.type === 'backing-image-file' || e.volume !== volume.name) return;
      progress?.(hostId, e);
      if (e.type === 'rebuild-started') running.add(e.replicaId);
      if (e.type === 'rebuild-completed') {
        rebuilt.push({ replicaId: e.replicaId, engineHostId: hostId, scannedBytes: e.scannedBytes, sentBytes: e.sentBytes, totalBytes: e.totalBytes });
      }
      if (e.type === 'rebuild-completed' || e.type === 'rebuild-failed') {
        running.delete(e.replicaId);
        if (running.size === 0) allEnded?.();
      }
    };
    m.on('data-engine-event', onEvent);
    let status;
    try {
      status = await volume.rebuild({ timeoutMs });
      if (running.size > 0) {
        let timer: NodeJS.Timeout | undefined;
        await new Promise<void>((res) => {
          allEnded = res;
          timer = setTimeout(res, COMPLETION_EVENT_WAIT_MS);
        });
        clearTimeout(timer);
      }
    } finally {
      m.off('data-engine-event', onEvent);
    }
    // Where each rebuilt replica lives (the events name the host of the engine that rebuilt it).
    const replicaHost = new Map(status.replicas.map((x) => [x.id, x.hostId]));
    const done = rebuilt.map((r) => ({ ...r, hostId: replicaHost.get(r.replicaId) ?? null }));
    if (values.json) printJson(ctx, { volume: volume.name, state: status.state, replicaCount: status.replicaCount, rebuilt: done });
    else {
      const what = done.length === 0 ? 'nothing to rebuild' : `rebuilt ${done.map((r) => `${r.replicaId} on ${r.hostId ?? '?'} (${formatBytes(r.sentBytes)} sent)`).join(', ')}`;
      ctx.stdout(`volume ${volume.name} is ${status.state}, ${status.replicaCount} replica${status.replicaCount === 1 ? '' : 's'}: ${what}\n`);
    }
  } finally {
    await closeEmbedded(embedded, ctx);
  }
  return 0;
}
