/**
 * Engine: the handle of the engine serving a volume, as {@link Volume.engine} found it — the
 * host it runs on, its writer epoch, its replicas with their modes and rebuild progress, its
 * NBD export and that export's counters. A handle is a reading taken at one moment; call
 * `volume.engine()` again for a fresh one.
 *
 * @packageDocumentation
 */
import type { EngineInfo, EngineNbdStats, RebuildProgress } from '../data-engine/data-engine.js';

/** A replica as the engine sees it. */
export interface EngineReplica {
  /** Its id in the volume (`r0`, `r1`, ...). */
  id: string;
  /** The host that holds it. */
  hostId: string;
  /** RW: written and read; WO: being rebuilt (written, never read); ERR: dropped until rebuilt. */
  mode: 'RW' | 'WO' | 'ERR';
  /** errno of the failure that made it ERR (positive), else 0. */
  lastErrno: number;
  /** Present while it is being rebuilt. */
  rebuild?: RebuildProgress;
}

/** The engine serving a volume, at the moment it was asked. */
export class Engine {
  /** The volume it serves. */
  readonly volume: string;
  /** The host whose data engine runs it. */
  readonly hostId: string;
  /** The writer epoch it holds (0 for a migration standby that never wrote). */
  readonly epoch: number;
  /** `active` serves I/O; `standby` is a migration target before hand-over (or a source after it). */
  readonly role: 'active' | 'standby';
  /** Size of the volume it serves, in bytes. */
  readonly sizeBytes: number;
  /** Its replicas, with their modes and rebuild progress. */
  readonly replicas: readonly EngineReplica[];
  /** Its NBD export, or null. */
  readonly nbd: {
    /** Where it listens: `unix:PATH` or `tcp:HOST:PORT`. */
    readonly address: string;
    /** The NBD URI for clients. */
    readonly uri: string;
  } | null;
  /** Counters of the NBD export since it started, or null (not exported, or a data engine too old to tell). */
  readonly nbdStats: Readonly<EngineNbdStats> | null;
  /** When the reading was taken (ms since the epoch). */
  readonly observedMs: number;

  /** @internal Made by {@link Volume.engine}. */
  constructor(hostId: string, info: EngineInfo, observedMs = Date.now()) {
    this.volume = info.volume;
    this.hostId = hostId;
    this.epoch = info.epoch;
    this.role = info.role;
    this.sizeBytes = info.sizeBytes;
    this.replicas = Object.freeze(
      info.replicas.map((r) => Object.freeze({ id: r.id, hostId: r.hostId, mode: r.mode, lastErrno: r.lastError === 0 ? 0 : -r.lastError, ...(r.rebuild ? { rebuild: { ...r.rebuild } } : {}) })),
    );
    this.nbd = info.nbd ? Object.freeze({ ...info.nbd }) : null;
    this.nbdStats = info.nbdStats ? Object.freeze({ ...info.nbdStats }) : null;
    this.observedMs = observedMs;
    Object.freeze(this);
  }

  /** Every replica RW. */
  get healthy(): boolean {
    return this.replicas.every((r) => r.mode === 'RW');
  }

  /** The replicas being rebuilt, with their progress. */
  get rebuilding(): EngineReplica[] {
    return this.replicas.filter((r) => r.mode === 'WO');
  }
}
