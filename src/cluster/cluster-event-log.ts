/**
 * The control plane's own decisions as log records: what a {@link Mooring} emits as events
 * (replacements, takeovers, evictions, replaced disks, salvages, warnings), at a level that says how
 * much an operator should care.
 *
 * @packageDocumentation
 */
import type { MooringError } from '../errors.js';
import type { MooringEvents, ReplicaReplacedEvent, VolumeSalvagedEvent } from '../mooring.js';
import { safeLog, type Logger } from '../util/logger.js';
import type { HostEvictionProgress } from './eviction-controller.js';

/** Logs one cluster event (events without a record here are not logged). */
export function logClusterEvent(log: Logger, event: keyof MooringEvents, arg: unknown): void {
  switch (event) {
    case 'warning': {
      const e = arg as MooringError;
      safeLog(log, 'warn', { code: e.code }, e.message);
      break;
    }
    case 'replica-replaced': {
      const e = arg as ReplicaReplacedEvent;
      safeLog(log, 'info', { event, ...e }, `volume ${e.volume}: replica ${e.oldReplicaId} on ${e.oldHostId} replaced by ${e.newReplicaId} on ${e.newHostId} (${e.sentBytes} bytes sent)`);
      break;
    }
    case 'engine-taken-over': {
      const e = arg as { volume: string; fromHost: string; toHost: string; epoch: number };
      safeLog(log, 'warn', { event, ...e }, `volume ${e.volume}: engine taken over on ${e.toHost} from unreachable host ${e.fromHost} (writer epoch ${e.epoch})`);
      break;
    }
    case 'stray-engine-stopped': {
      const e = arg as { volume: string; hostId: string };
      safeLog(log, 'info', { event, ...e }, `volume ${e.volume}: stray engine on ${e.hostId} stopped`);
      break;
    }
    case 'host-eviction': {
      const e = arg as HostEvictionProgress;
      safeLog(log, 'debug', { event, ...e }, `host ${e.hostId} evicting: ${e.replicasLeft} replica(s) and ${e.imageFilesLeft} image file(s) left`);
      break;
    }
    case 'host-evicted': {
      const e = arg as { hostId: string };
      safeLog(log, 'info', { event, ...e }, `host ${e.hostId} evicted: it holds no replica and no image file`);
      break;
    }
    case 'disk-replaced': {
      const e = arg as { hostId: string; oldDiskId: string; newDiskId: string; lostReplicas: string[] };
      safeLog(log, 'warn', { event, ...e }, `host ${e.hostId} came back with another disk (${e.newDiskId}, was ${e.oldDiskId}): ${e.lostReplicas.length} replica(s) lost, replaced now`);
      break;
    }
    case 'volume-salvaged': {
      const e = arg as VolumeSalvagedEvent;
      const lost = e.complete === true ? 'nothing acknowledged is missing' : 'acknowledged writes may be missing';
      safeLog(log, e.complete === true ? 'info' : 'warn', { event, ...e }, `volume ${e.volume} salvaged on ${e.hostId} from ${e.sourceReplicas.join(', ')} (left out: ${e.goneReplicas.join(', ') || 'none'}): ${lost}; ${e.message}`);
      break;
    }
    default:
      break;
  }
}
