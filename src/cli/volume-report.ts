// What `mooring info` shows of a volume, from whichever source has it: the process serving
// it (its status socket gives liveReport), the store and replica files of a directory no
// process has open, or a volume directory of an earlier release not imported yet.
import type { EngineSnapshotInfo } from '../data-engine/data-engine.js';
import type { Mooring } from '../mooring.js';
import type { VolumeInspection } from '../volume/directory-inspect.js';
import type { StoredInspection } from '../volume/volume-inspect.js';
import type { Volume } from '../volume/volume.js';

/** One replica line. Fields a source cannot know are left out. */
export interface ReplicaLine {
  id: string;
  hostId: string | null;
  mode: string;
  /** The highest writer epoch it promised (from its metadata). */
  epoch?: number;
  allocatedBytes?: number;
  /** Its directory, when it is on this host. */
  path?: string;
  lastError?: string;
  unreadable?: string;
  /** Bytes compared of those to compare, while it is rebuilt. */
  rebuild?: { scannedBytes: number; totalBytes: number };
}

/** What info prints. */
export interface InfoReport {
  volume: string;
  uuid: string;
  dir: string;
  /** This host's id (null: the directory has no data engine yet). */
  hostId: string | null;
  sizeBytes: number;
  replicaCount: number;
  /** Served: healthy, degraded or faulted; else detached, or why it is still recorded as attached. */
  state: string;
  /** The serving engine's writer epoch, else the last one handed out. */
  epoch: number;
  replicas: ReplicaLine[];
  snapshots: EngineSnapshotInfo[];
  /** The serving process, or null when the volume is not served. */
  servedBy: { pid: number; nbd: string | null } | null;
}

/** The served volume `v`, as the process serving it reports it (pid filled in by the socket reply). */
export async function liveReport(m: Mooring, v: Volume, dir: string): Promise<InfoReport> {
  const st = await v.status();
  const engine = await v.engine();
  const snapshots = await v.listSnapshots();
  return {
    volume: st.name,
    uuid: st.uuid,
    dir,
    hostId: m.hostId,
    sizeBytes: st.sizeBytes,
    replicaCount: st.replicaCount,
    state: st.state,
    epoch: st.epoch,
    replicas: st.replicas.map((r) => {
      const errno = engine?.replicas.find((e) => e.id === r.id)?.lastErrno ?? 0;
      return {
        id: r.id,
        hostId: r.hostId,
        mode: r.mode,
        ...(errno !== 0 ? { lastError: `errno ${errno}` } : {}),
        ...(r.rebuild ? { rebuild: { scannedBytes: r.rebuild.scannedBytes, totalBytes: r.rebuild.totalBytes } } : {}),
      };
    }),
    snapshots,
    servedBy: { pid: process.pid, nbd: st.nbd?.address ?? null },
  };
}

/** The volumes of a directory no process has open, as inspection found them. */
export function storedReports(dir: string, found: StoredInspection): InfoReport[] {
  return found.volumes.map((v) => ({
    volume: v.name,
    uuid: v.uuid,
    dir,
    hostId: found.hostId,
    sizeBytes: v.sizeBytes,
    replicaCount: v.replicaCount,
    state: v.engineHost === null ? 'detached' : `attached on ${v.engineHost} when its last process stopped; the next serve attaches it again`,
    epoch: v.lastEpoch,
    replicas: v.replicas.map((r) => ({
      id: r.id,
      hostId: r.hostId,
      mode: r.mode,
      ...(r.epoch !== undefined ? { epoch: r.epoch } : {}),
      ...(r.allocatedBytes !== undefined ? { allocatedBytes: r.allocatedBytes } : {}),
      ...(r.path !== null ? { path: r.path } : {}),
      ...(r.lastError ? { lastError: r.lastError } : {}),
      ...(r.unreadable ? { unreadable: r.unreadable } : {}),
    })),
    snapshots: v.snapshots,
    servedBy: null,
  }));
}

/** A volume directory of an earlier release that no process has opened since (not imported). */
export function legacyReport(v: VolumeInspection): InfoReport {
  return {
    volume: v.name,
    uuid: v.uuid,
    dir: v.dir,
    hostId: null,
    sizeBytes: v.sizeBytes,
    replicaCount: v.replicas.length,
    state: 'a volume directory of an earlier release; the next serve imports it',
    epoch: v.lastEpoch,
    replicas: v.replicas.map((r) => ({
      id: r.id,
      hostId: null,
      mode: r.mode,
      epoch: r.epoch,
      allocatedBytes: r.allocatedBytes,
      path: r.path,
      ...(r.lastError ? { lastError: `${r.lastError.code}: ${r.lastError.message}` } : {}),
      ...(r.unreadable ? { unreadable: r.unreadable } : {}),
    })),
    snapshots: v.snapshots,
    servedBy: null,
  };
}
