/**
 * Read-only inspection of a single-directory volume that no process serves: volume.json,
 * each replica's metadata and the snapshots, read under the volume's lock (so no engine
 * starts meanwhile) without claiming a writer epoch or changing any file. `mooring info`
 * uses it; a served volume is asked through its server's status socket instead
 * (src/cli/status-socket.ts).
 *
 * @packageDocumentation
 */
import type { ReplicaMode } from '../engine/engine.js';
import type { EngineSnapshotInfo } from '../data-engine/data-engine.js';
import { replicaSnapshots } from '../data-engine/snapshots.js';
import { callNative, toMooringError } from '../errors.js';
import type { NativeAddon } from '../native/binding.js';
import { VolumeLock } from './volume-lock.js';
import { readVolumeSpec, replicaDir, type ReplicaErrorRecord } from './volume-spec.js';

/** A replica as inspection finds it. */
export interface InspectedReplica {
  id: string;
  path: string;
  /** The mode last recorded in volume.json (the engine's authority when the volume opens). */
  mode: ReplicaMode;
  /** The highest writer epoch the replica promised. */
  epoch: number;
  /** Whether its last engine closed it cleanly. */
  clean: boolean;
  allocatedBytes: number;
  lastError?: ReplicaErrorRecord;
  /** Why its metadata could not be read, if it could not. */
  unreadable?: string;
}

/** A volume as inspection finds it (nothing changed on disk). */
export interface VolumeInspection {
  name: string;
  uuid: string;
  dir: string;
  sizeBytes: number;
  /** The last writer epoch handed to an engine of this volume (volume.json's counter). */
  lastEpoch: number;
  /** Every replica RW in volume.json and readable. */
  healthy: boolean;
  replicas: InspectedReplica[];
  snapshots: EngineSnapshotInfo[];
}

/**
 * Inspects the volume in `dir` without serving it.
 *
 * @throws MooringError BUSY (a process serves it: ask its status socket), NOT_FOUND, CORRUPT_METADATA
 */
export async function inspectVolume(dir: string, addon: NativeAddon): Promise<VolumeInspection> {
  const lock = await VolumeLock.acquire(dir);
  try {
    const spec = await readVolumeSpec(dir);
    const replicas: InspectedReplica[] = [];
    for (const r of spec.replicas) {
      const path = replicaDir(dir, r);
      const base = { id: r.id, path, mode: r.mode, ...(r.lastError ? { lastError: { ...r.lastError } } : {}) };
      try {
        const m = await callNative(() => addon.inspectReplica(path), `reading replica ${r.id}`);
        replicas.push({ ...base, epoch: m.epoch, clean: m.clean, allocatedBytes: m.allocatedBytes });
      } catch (err) {
        replicas.push({ ...base, epoch: 0, clean: false, allocatedBytes: 0, unreadable: toMooringError(err).message });
      }
    }
    return {
      name: spec.name,
      uuid: spec.uuid,
      dir,
      sizeBytes: spec.sizeBytes,
      lastEpoch: spec.lastEpoch ?? 0,
      healthy: replicas.every((r) => r.mode === 'RW' && r.unreadable === undefined),
      replicas,
      snapshots: await snapshotsOf(replicas, addon),
    };
  } finally {
    await lock.release();
  }
}

// Snapshots as the first RW replica holds them (every RW replica holds the same chain),
// read by opening it alone: no epoch is claimed, nothing is written. None without a
// readable RW replica: info still shows the replicas, which say what is wrong.
async function snapshotsOf(replicas: InspectedReplica[], addon: NativeAddon): Promise<EngineSnapshotInfo[]> {
  const source = replicas.find((r) => r.mode === 'RW' && r.unreadable === undefined);
  if (!source) return []; // nothing trustworthy to list them from; the replicas say why
  return replicaSnapshots(addon, source.path, source.id);
}
