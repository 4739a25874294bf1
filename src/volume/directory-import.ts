/**
 * Opens a single-directory volume of the first releases (`DIR/volume.json` + `DIR/replicas/rN`)
 * as a volume of the embedded default, in place: its records go into the store, its replica
 * directories move (a rename each, no data copied) under this host's data engine, and
 * volume.json is kept as `volume.json.imported`. Each step can be repeated, so an import that
 * a crash interrupted finishes at the next open. The writer epoch counter starts at the
 * volume's `lastEpoch`, so no epoch its replicas promised is handed out again.
 *
 * @packageDocumentation
 */
import { rename } from 'node:fs/promises';
import { join } from 'node:path';

import { CLUSTER_SCHEMA_VERSION, KIND, emptyAttachmentRecord, newVolumeRecord, parseReplicaRecord, parseVolumeRecord, type ReplicaRecord, type VolumeEpochRecord } from '../cluster/cluster-records.js';
import { replicaName } from '../cluster/control-state.js';
import { DATA_ENGINE_REPLICAS_SUBDIR } from '../data-engine/local-data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import type { StateStore } from '../state/state-store.js';
import { ensureDirectory, pathExists } from '../util/files.js';
import { VolumeLock } from './volume-lock.js';
import { VOLUME_SPEC_FILE, readVolumeSpec, replicaDir } from './volume-spec.js';

/** What volume.json becomes once its volume is in the store. */
export const IMPORTED_SPEC_FILE = `${VOLUME_SPEC_FILE}.imported`;

/** What an import did. */
export interface DirectoryImport {
  /** The volume's name (from its volume.json). */
  volume: string;
  /** How many replica directories moved under this host's data engine. */
  replicas: number;
  /** Where its writer epoch counter starts (volume.json's `lastEpoch`). */
  lastEpoch: number;
}

/**
 * Imports the single-directory volume in `dir`, if there is one, as a volume whose replicas
 * are on `hostId`, whose data engine keeps them under `engineDir`. Null when `dir` holds none.
 *
 * @throws MooringError BUSY (a process serves it), ALREADY_EXISTS (the store has another volume of that name), UNSUPPORTED (remote replicas), CORRUPT_METADATA
 */
export async function importDirectoryVolume(dir: string, store: StateStore, hostId: string, engineDir: string): Promise<DirectoryImport | null> {
  if (!(await pathExists(join(dir, VOLUME_SPEC_FILE)))) return null;
  const lock = await VolumeLock.acquire(dir, { what: 'single-directory volume', hint: 'stop the mooring serve that serves it, then open it again' });
  try {
    const spec = await readVolumeSpec(dir);
    const remote = spec.replicas.find((r) => r.address !== undefined);
    if (remote) throw new MooringError('UNSUPPORTED', `replica ${remote.id} of ${spec.name} is remote (${remote.address}); only local replicas can be imported`);
    const existing = await store.get<unknown>(KIND.volume, spec.name);
    if (existing && parseVolumeRecord(existing.value, existing.key).uuid !== spec.uuid) {
      throw new MooringError('ALREADY_EXISTS', `the store has another volume named ${spec.name}; ${dir} holds one of that name too (uuid ${spec.uuid})`, { details: { volume: spec.name } });
    }
    const now = Date.now();
    // 1. The records (kept from an interrupted import: same uuid, same replica names).
    if (!existing) {
      const vol = newVolumeRecord({ name: spec.name, uuid: spec.uuid, sizeBytes: spec.sizeBytes, replicaCount: spec.replicas.length, createdMs: spec.createdMs, accessMode: 'rwo', backingImage: null });
      await store.put(KIND.volume, spec.name, vol, { expectedVersion: 0 });
      await store.put(KIND.attachment, spec.name, emptyAttachmentRecord(spec.name));
    }
    const lastEpoch = spec.lastEpoch ?? 0;
    if (!(await store.get(KIND.volumeEpoch, spec.name))) {
      const counter: VolumeEpochRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: spec.name, last: lastEpoch, updatedMs: now };
      await store.put(KIND.volumeEpoch, spec.name, counter, { expectedVersion: 0 });
    }
    const recorded = (await store.list<unknown>(KIND.replica)).map((d) => parseReplicaRecord(d.value, d.key)).filter((r) => r.volume === spec.name);
    const replicasDir = join(engineDir, DATA_ENGINE_REPLICAS_SUBDIR);
    await ensureDirectory(replicasDir);
    for (const r of spec.replicas) {
      let rec = recorded.find((x) => x.id === r.id);
      if (!rec) {
        rec = { schema: CLUSTER_SCHEMA_VERSION, volume: spec.name, id: r.id, hostId, name: replicaName(spec.name, r.id), mode: r.mode, failedSinceMs: r.mode === 'ERR' ? now : null, lastError: r.lastError ? `${r.lastError.code}: ${r.lastError.message}` : null } satisfies ReplicaRecord;
        await store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
      }
      // 2. The directory moves under the data engine (a rename: same filesystem, no copy).
      const from = replicaDir(dir, r);
      if (await pathExists(from)) await rename(from, join(replicasDir, rec.name)).catch((err: unknown) => Promise.reject(toMooringError(err, `moving replica ${r.id} of ${spec.name} into ${replicasDir}`)));
    }
    // 3. Done: volume.json is kept under another name, for whoever looks for it.
    await rename(join(dir, VOLUME_SPEC_FILE), join(dir, IMPORTED_SPEC_FILE));
    return { volume: spec.name, replicas: spec.replicas.length, lastEpoch };
  } finally {
    await lock.release();
  }
}
