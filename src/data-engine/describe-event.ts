// One line per data-engine event: the message of its log record (src/util/logger.ts).
import type { DataEngineEvent } from './data-engine.js';

/** What `e` says, in one line (without the `mooring: ` prefix). */
export function describeEvent(e: DataEngineEvent): string {
  switch (e.type) {
    case 'replica-error':
      return `volume ${e.volume}: replica ${e.replicaId} failed (errno ${e.errno}): ${e.message}`;
    case 'epoch-claimed':
      return `volume ${e.volume}: writer epoch ${e.epoch} claimed`;
    case 'salvaged':
      return `volume ${e.volume}: salvage start serves from replica ${e.replicaId} (last RW in ${e.lastRw ? `${e.lastRw.epoch}/${e.lastRw.generation}` : 'no recorded set'}; ${e.complete ? 'complete' : 'writes may be missing'}): ${e.message}`;
    case 'replica-set-changed':
      return `volume ${e.volume}: replica set ${e.epoch}/${e.generation} committed (RW: ${e.rwReplicaIds.join(', ') || 'none'})`;
    case 'rebuild-started':
      return `volume ${e.volume}: rebuilding replica ${e.replicaId} (${e.totalBytes} bytes to compare)`;
    case 'rebuild-progress':
      return `volume ${e.volume}: rebuild of ${e.replicaId}: ${e.scannedBytes}/${e.totalBytes} compared, ${e.sentBytes} sent`;
    case 'rebuild-completed':
      return `volume ${e.volume}: replica ${e.replicaId} rebuilt (${e.sentBytes} bytes sent)`;
    case 'rebuild-failed':
      return `volume ${e.volume}: rebuild of ${e.replicaId} failed (${e.code}): ${e.message}`;
    case 'repair-scheduled':
      return `volume ${e.volume}: replica ${e.replicaId} is ERR (${e.code}: ${e.message}); repair attempt ${e.attempt} in ${e.delayMs} ms`;
    case 'engine-stopped':
      return `volume ${e.volume}: engine stopped`;
    case 'engine-activated':
      return `volume ${e.volume}: engine activated (writer epoch ${e.epoch})`;
    case 'engine-deactivated':
      return `volume ${e.volume}: engine handed over at epoch ${e.epoch} (standby now)`;
    case 'snapshot-copy-progress':
      return `volume ${e.volume}: snapshot ${e.snapshot}: ${e.copiedBytes}/${e.totalBytes} bytes copied`;
    case 'backing-image-file':
      return `backing image ${e.name} (${e.uuid}): ${e.state} ${e.progress}%${e.message ? `: ${e.message}` : ''}`;
  }
}
