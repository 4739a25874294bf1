/**
 * The public shape of {@link Mooring.open}'s options and of the events a {@link Mooring}
 * emits (src/mooring.ts holds the class).
 *
 * @packageDocumentation
 */
import type { LeaderLeaseOptions, LeaderStatus } from './cluster/leader-lease.js';
import type { HostEvictionProgress } from './cluster/eviction-controller.js';
import type { RepairPassEvent } from './cluster/repair-loop.js';
import type { DataEngine, DataEngineEvent } from './data-engine/data-engine.js';
import type { LocalDataEngineOptions } from './data-engine/local-data-engine.js';
import type { MooringError } from './errors.js';
import type { Mooring } from './mooring.js';
import type { StateStore } from './state/state-store.js';
import type { DataEngineLauncher } from './upgrade/upgrade-session.js';
import type { Logger } from './util/logger.js';

/** Options of {@link Mooring.open}. */
export interface MooringOptions {
  /**
   * Directory of the embedded default, created if missing: the control-plane store in
   * `DIR/state` (a FileStateStore) and this host's data engine in `DIR/host`, run in this
   * process. Without it, `store` is required and this process runs no data engine.
   */
  dir?: string;
  /**
   * This host's id ([A-Za-z0-9._-]{1,63}): where `attach()` without a host attaches. Default:
   * the id `DIR/host` was created with, else this machine's host name, else `local`.
   */
  hostId?: string;
  /** Where specs and status are kept (default: a FileStateStore in `DIR/state`). Shared by the VM managers of a cluster. */
  store?: StateStore;
  /** Options of this host's in-process data engine (default `{}`), or false to run none (with `dir`). */
  dataEngine?: Omit<LocalDataEngineOptions, 'dir' | 'hostId'> | false;
  /** Data engines of other hosts (e.g. RemoteDataEngine) offered for replicas and engines (more with {@link Mooring.addHost}). */
  hosts?: DataEngine[];
  /**
   * Least delay between two full passes of the repair loop (default 2000 ms); the delay
   * grows to `limits.PASS_DURATION_FACTOR` (19) times the time the event loop was busy during
   * the last pass when that is longer. Between passes, a volume is repaired on its own soon after its data engine
   * reports a replica change. 0 turns the loop and the event-driven repairs off
   * ({@link Mooring.repairOnce} still works).
   */
  repairIntervalMs?: number;
  /** ERR time after which a replica is replaced on another host (default 600,000 ms). */
  replicaReplacementWaitMs?: number;
  /** Default wait of an attach for its ticket (default 60,000 ms); also how long a volume waits for its backing image file on a host. */
  ticketWaitTimeoutMs?: number;
  /** How long a backing image file that no replica uses stays on its disk before it is deleted (default 3,600,000 ms; minCopies ready copies always stay). */
  backingImageCleanupWaitMs?: number;
  /**
   * I/O timeout towards remote replicas of every engine started (default: the data
   * engine's, 8000 ms; 100 to 600,000): how long a replica may not answer before the engine
   * counts it as lost.
   */
  engineIoTimeoutMs?: number;
  /**
   * How the new version of a host's data engine is started during an upgrade
   * ({@link Mooring.startUpgrade}); without it, upgrades are refused (NO_LAUNCHER).
   */
  dataEngineLauncher?: DataEngineLauncher;
  /**
   * Where Mooring logs (docs/logging.md): a pino logger, or anything with pino's level
   * methods and `child()`. Records carry `component` (`cluster`; `data-engine` for the
   * in-process data engine, unless `dataEngine.logger` is given) and the
   * fields of what they report (`volume`, `hostId`, `replicaId`, `code`, ...). Default: none,
   * nothing is logged; the events of this class and of volumes report the same facts.
   */
  logger?: Logger;
  /**
   * Several embedders (a VM manager on every host) share `store`: at most one leads at a
   * time and acts (the repair loop, control operations); the others serve reads and refuse
   * control operations with NOT_LEADER naming the leader. A deposed leader's writes are
   * refused by the store (fencing). `id` names this embedder (unique among them); `leaseMs`
   * (default 15 s) is how long a silent leader keeps leading (docs/leadership.md). Omitted:
   * this embedder is the only one.
   */
  leadership?: LeaderLeaseOptions;
}

/** A salvage start (`Volume.salvage`; docs/salvage.md). */
export interface VolumeSalvagedEvent {
  /** The volume. */
  volume: string;
  /** The host its engine was started on. */
  hostId: string;
  /** The engine's epoch. */
  epoch: number;
  /** The replicas it serves from (RW after the start). */
  sourceReplicas: string[];
  /** The replicas left out: their hosts did not answer; each is replaced by a new replica. */
  goneReplicas: string[];
  /**
   * True: every acknowledged write is on the source (the normal rules would have served from
   * it). False: writes acknowledged after the source's last RW replica set may be missing.
   * Null: the engine's report did not arrive in time.
   */
  complete: boolean | null;
  /** The engine's words on why it chose that source, or why data may be missing. */
  message: string;
}

/** A replica that stayed ERR was replaced by a new one on another host. */
export interface ReplicaReplacedEvent {
  /** The volume. */
  volume: string;
  /** The replica that stayed ERR (removed). */
  oldReplicaId: string;
  /** Its host. */
  oldHostId: string;
  /** The replica that took its place (rebuilt, RW). */
  newReplicaId: string;
  /** Its host. */
  newHostId: string;
  /** Bytes the rebuild wrote into it. */
  sentBytes: number;
}

/** Events of a {@link Mooring}: data-engine events of its volumes, plus its own decisions. */
export type MooringEvents = {
  /** An event from a data engine about one of the cluster's volumes. */
  'data-engine-event': (hostId: string, event: DataEngineEvent) => void;
  /** A replica was replaced on another host. */
  'replica-replaced': (event: ReplicaReplacedEvent) => void;
  /** A volume's engine was started on a host after its previous host became unreachable. */
  'engine-taken-over': (event: { volume: string; fromHost: string; toHost: string; epoch: number }) => void;
  /** An engine of a volume found on a host it is no longer attached to (left by a takeover) was stopped. */
  'stray-engine-stopped': (event: { volume: string; hostId: string }) => void;
  /** An eviction ({@link Mooring.evictHost}) has this much left to move after a pass of the control loop. */
  'host-eviction': (progress: HostEvictionProgress) => void;
  /** An evicted host holds no replica and no backing image file any more; it may be removed. */
  'host-evicted': (event: { hostId: string }) => void;
  /**
   * A host came back with another disk (another disk id in its data-engine.json): its
   * replicas were lost, and are replaced at once.
   */
  'disk-replaced': (event: { hostId: string; oldDiskId: string; newDiskId: string; lostReplicas: string[] }) => void;
  /** A volume was brought back from the replicas left (`Volume.salvage`, docs/salvage.md). */
  'volume-salvaged': (event: VolumeSalvagedEvent) => void;
  /** A full pass of the repair loop ended: how long it took, and when the next one starts. */
  'repair-pass': (event: RepairPassEvent) => void;
  /** This embedder became leader, or stopped leading (`leadership` option). */
  leadership: (status: LeaderStatus) => void;
  /** Something failed in the background (repair, recording status); the cluster keeps going. */
  warning: (error: MooringError) => void;
};

