/**
 * Read-only inspection of a volume of the embedded default (`Mooring.open({ dir })`) that no
 * process has open: its records in the store (`DIR/state`) and, for the replicas on this
 * host, their metadata and snapshots (`DIR/host/replicas`), read under both directories'
 * locks without claiming a writer epoch or changing anything. `mooring info` uses it; a
 * directory a process has open is asked through that process's status socket instead.
 *
 * @packageDocumentation
 */
import { join } from 'node:path';

import { KIND, byReplicaId, parseEngineRecord, parseReplicaRecord, parseVolumeEpochRecord, parseVolumeRecord } from '../cluster/cluster-records.js';
import { DATA_ENGINE_LOCK_FILE, DATA_ENGINE_REPLICAS_SUBDIR, readDataEngineHostId } from '../data-engine/local-data-engine.js';
import type { EngineSnapshotInfo } from '../data-engine/data-engine.js';
import { MooringError, callNative, toMooringError } from '../errors.js';
import { HOST_SUBDIR, STATE_SUBDIR } from '../mooring.js';
import type { NativeAddon } from '../native/binding.js';
import { FileStateStore } from '../state/file-state-store.js';
import { pathExists } from '../util/files.js';
import { replicaSnapshots } from '../data-engine/snapshots.js';
import { VolumeLock } from './volume-lock.js';

/** A replica as its record and (on this host) its files say. */
export interface StoredReplica {
  id: string;
  hostId: string;
  /** The mode last recorded in the store. */
  mode: string;
  /** Its directory, when it is on this host. */
  path: string | null;
  /** From its metadata (replicas on this host that could be read). */
  epoch?: number;
  clean?: boolean;
  allocatedBytes?: number;
  /** The last error recorded for it. */
  lastError?: string;
  /** Why its metadata could not be read, if it is on this host and could not. */
  unreadable?: string;
}

/** A volume as the store and this host's files say (nothing changed). */
export interface StoredVolume {
  name: string;
  uuid: string;
  sizeBytes: number;
  replicaCount: number;
  /** The last writer epoch handed out for it. */
  lastEpoch: number;
  /** The host its engine was recorded on (a process that stopped without detaching), or null. */
  engineHost: string | null;
  replicas: StoredReplica[];
  /** As the first RW replica on this host holds them (none when there is none). */
  snapshots: EngineSnapshotInfo[];
}

/** The embedded default in a directory, inspected. */
export interface StoredInspection {
  /** This host's id, or null when DIR/host holds no data engine yet. */
  hostId: string | null;
  volumes: StoredVolume[];
}

/**
 * Inspects the volumes of the embedded default in `dir` (only `name` when given).
 *
 * @throws MooringError BUSY (a process has DIR open: ask its status socket), NOT_FOUND, CORRUPT_METADATA
 */
export async function inspectStoredVolumes(dir: string, addon: NativeAddon, name?: string): Promise<StoredInspection> {
  // Opening a store creates it: a directory without one is reported, not changed.
  if (!(await pathExists(join(dir, STATE_SUBDIR)))) throw new MooringError('NOT_FOUND', `${dir} holds no Mooring store (${STATE_SUBDIR}/) and no volume.json`);
  const store = await FileStateStore.open(join(dir, STATE_SUBDIR));
  try {
    const hostDir = join(dir, HOST_SUBDIR);
    const hostId = await readDataEngineHostId(hostDir);
    const lock = hostId === null ? null : await VolumeLock.acquire(hostDir, { file: DATA_ENGINE_LOCK_FILE, what: 'data engine directory', hint: 'stop the process that runs it first' });
    try {
      const recs = (await store.list<unknown>(KIND.volume)).map((d) => parseVolumeRecord(d.value, d.key)).filter((v) => name === undefined || v.name === name);
      if (name !== undefined && recs.length === 0) throw new MooringError('NOT_FOUND', `${dir} holds no volume ${name}`, { details: { volume: name } });
      const replicas = (await store.list<unknown>(KIND.replica)).map((d) => parseReplicaRecord(d.value, d.key));
      const volumes: StoredVolume[] = [];
      for (const v of recs) {
        const counter = await store.get<unknown>(KIND.volumeEpoch, v.name);
        const engine = await store.get<unknown>(KIND.engine, v.name);
        const mine: StoredReplica[] = [];
        for (const r of replicas.filter((x) => x.volume === v.name).sort(byReplicaId)) {
          const path = r.hostId === hostId ? join(hostDir, DATA_ENGINE_REPLICAS_SUBDIR, r.name) : null;
          const base: StoredReplica = { id: r.id, hostId: r.hostId, mode: r.mode, path, ...(r.lastError ? { lastError: r.lastError } : {}) };
          if (path === null) {
            mine.push(base);
            continue;
          }
          try {
            const m = await callNative(() => addon.inspectReplica(path), `reading replica ${r.id}`);
            mine.push({ ...base, epoch: m.epoch, clean: m.clean, allocatedBytes: m.allocatedBytes });
          } catch (err) {
            mine.push({ ...base, unreadable: toMooringError(err).message });
          }
        }
        volumes.push({
          name: v.name,
          uuid: v.uuid,
          sizeBytes: v.sizeBytes,
          replicaCount: v.replicaCount,
          lastEpoch: counter ? parseVolumeEpochRecord(counter.value, counter.key).last : 0,
          engineHost: engine ? parseEngineRecord(engine.value, engine.key).hostId : null,
          replicas: mine,
          snapshots: await snapshotsOf(mine, addon),
        });
      }
      return { hostId, volumes };
    } finally {
      await lock?.release();
    }
  } finally {
    await store.close();
  }
}

// Snapshots as the first readable RW replica on this host holds them (every RW replica holds
// the same chain), read by opening it alone: no epoch is claimed, nothing is written.
async function snapshotsOf(replicas: StoredReplica[], addon: NativeAddon): Promise<EngineSnapshotInfo[]> {
  const source = replicas.find((r) => r.path !== null && r.mode === 'RW' && r.unreadable === undefined);
  return source ? replicaSnapshots(addon, source.path!, source.id) : [];
}
