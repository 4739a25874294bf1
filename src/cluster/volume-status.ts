/**
 * A volume's status as the control plane reports it: its records, and what the engine that
 * writes reports about its replicas (bounded by the host probe timeout); and the handle of
 * that engine.
 *
 * @packageDocumentation
 */
import { MooringError } from '../errors.js';
import { Engine } from '../volume/engine.js';
import type { VolumeStatus } from '../volume/volume.js';
import type { EngineRecord, MigrationRecord, ReplicaRecord, VolumeRecord } from './cluster-records.js';
import type { EngineProbe } from './hosts.js';
import { migrationInfo, type ControlState } from './control-state.js';

/** What a status is made of when it is made for many volumes at once (Mooring.listVolumes): records read once, engines listed once per host. */
export interface StatusSources {
  vol: VolumeRecord;
  replicas: ReplicaRecord[];
  eng: EngineRecord | null;
  mig: MigrationRecord | null;
  probe: (hostId: string, volume: string) => Promise<EngineProbe>;
}

/**
 * The volume's state, replicas and export, as its engine reports them (or as last recorded).
 *
 * @throws MooringError NOT_FOUND
 */
export async function volumeStatus(state: ControlState, name: string, known?: StatusSources): Promise<VolumeStatus> {
  const vol = known ? known.vol : await state.volume(name);
  const replicas = known ? known.replicas : await state.replicas(name);
  const eng = known ? known.eng : await state.engineRecord(name);
  const mig = known ? known.mig : await state.migrationRecord(name);
  const writerHost = eng ? (mig?.targetActivated ? mig.targetHost : eng.hostId) : null;
  const base: VolumeStatus = {
    name,
    uuid: vol.uuid,
    sizeBytes: vol.sizeBytes,
    replicaCount: vol.replicaCount,
    accessMode: vol.accessMode,
    backingImage: vol.backingImage ?? null,
    state: 'detached',
    attachedHost: eng?.hostId ?? null,
    writerHost,
    frontend: eng ? { disabled: eng.frontendDisabled, nbd: eng.nbd } : null,
    migration: mig ? migrationInfo(mig) : null,
    epoch: eng?.epoch ?? 0,
    nbd: null,
    replicas: replicas.map((r) => ({ id: r.id, hostId: r.hostId, name: r.name, mode: r.mode })),
  };
  if (!eng || !writerHost) return base;
  const info = await (known ? known.probe(writerHost, name) : state.hosts.probe(writerHost, name));
  if (typeof info === 'string') return { ...base, state: 'unknown' };
  if (base.migration) base.migration.epoch = mig?.targetActivated ? info.epoch : 0;
  const rw = info.replicas.filter((r) => r.mode === 'RW').length;
  return {
    ...base,
    epoch: info.epoch,
    nbd: info.nbd,
    state: rw === 0 ? 'faulted' : rw >= vol.replicaCount && info.replicas.every((r) => r.mode === 'RW') ? 'healthy' : 'degraded',
    replicas: info.replicas.map((r) => ({ id: r.id, hostId: r.hostId, name: r.name, mode: r.mode, ...(r.rebuild ? { rebuild: { ...r.rebuild } } : {}) })),
  };
}

/**
 * The engine that writes the volume now (during a migration after hand-over: the target's),
 * as its data engine reports it; null when detached, or while its engine is being started
 * again.
 *
 * @throws MooringError NOT_FOUND, UNAVAILABLE (the engine's host does not answer)
 */
export async function volumeEngine(state: ControlState, name: string): Promise<Engine | null> {
  await state.volume(name);
  const eng = await state.engineRecord(name);
  if (!eng) return null;
  const mig = await state.migrationRecord(name);
  const writer = mig?.targetActivated ? mig.targetHost : eng.hostId;
  const found = await state.hosts.probe(writer, name);
  if (found === 'stopped') return null;
  if (found === 'unreachable') throw new MooringError('UNAVAILABLE', `the engine of ${name} on ${writer} does not answer`, { details: { hostId: writer } });
  return new Engine(writer, found);
}
