/**
 * The handle of a live upgrade of the data engines (seed 004's DataEngineUpgradeManager):
 * its status, pause, resume, cancel, a promise for its end, and typed events for every
 * step. The work itself is the upgrade controller's (src/upgrade/upgrade-controller.ts);
 * docs/upgrade.md has the states and what happens on each failure.
 *
 * @packageDocumentation
 */
import { EventEmitter } from 'node:events';
import type * as TE from 'typed-emitter';

import type { DataEngine } from '../data-engine/data-engine.js';
import { MooringError } from '../errors.js';
import type { UpgradeBlock } from './upgrade-preconditions.js';
import type { HostUpgradeState, HostUpgradeStatus, NewDataEngine, RecordedError, UpgradeMethod, UpgradeMethodChoice, UpgradeSessionInfo, UpgradeState } from './upgrade-records.js';

export type { UpgradeBlock, UpgradeBlockCode } from './upgrade-preconditions.js';
export type {
  HostUpgradeState,
  HostUpgradeStatus,
  NewDataEngine,
  RecordedError,
  UpgradeMethod,
  UpgradeMethodChoice,
  UpgradeSessionInfo,
  UpgradeSpec,
  UpgradeState,
  VolumeUpgradeStatus,
} from './upgrade-records.js';

type TypedEmitter<E extends TE.EventMap> = TE.default<E>;

/**
 * How a new data engine is started on a host: Mooring decides when, the launcher knows how
 * the host runs its processes (systemd, a container, a test's child process). Without one,
 * a host whose data engine runs with `--allow-successor-exec` starts the new version itself
 * (`dataEngine.command`; docs/upgrade.md).
 */
export interface DataEngineLauncher {
  /**
   * Replaces the data engine of `hostId` by one started from `dataEngine`, on the same
   * directory, host id and addresses: stop the running process (SIGTERM: its engines drain
   * and flush), start the new one, resolve once it is started. Mooring then waits until the
   * host answers with a new `instanceId`. May return a new handle for the host (say its
   * address changed); Mooring offers it in place of the old one. After a VM manager restart
   * it may be called again for a host it already replaced: it must then do nothing harmful.
   */
  replace(hostId: string, dataEngine: NewDataEngine, context: { engine: DataEngine }): Promise<DataEngine | void>;
}

/** Options of `Mooring.startUpgrade`. */
export interface UpgradeOptions {
  /** Hosts to upgrade, in this order (default: every offered host, in the order offered). */
  hosts?: string[];
  /** The new data engine: its version and how the launcher starts it. */
  dataEngine: NewDataEngine;
  /**
   * `auto` (default): `in-place` where the host's data engine can hand over (NBD clients
   * stay connected), else `restart` where no NBD client is connected to an engine there,
   * else PRECONDITION_FAILED. `in-place`: every host in place, or PRECONDITION_FAILED.
   * `restart`: every host restarts; its engines restart with it and their clients reconnect.
   */
  method?: UpgradeMethodChoice;
  /** How long one wait of a host's step may take: the new process answering, engines back, replicas RW again (default 600,000 ms). */
  stepTimeoutMs?: number;
}

/** A session as reported, with its hosts. */
export interface UpgradeSessionStatus extends UpgradeSessionInfo {
  /** Every host of the session, by id. */
  hosts: Record<string, HostUpgradeStatus>;
}

/** Events of an {@link UpgradeSession}. */
export type UpgradeSessionEvents = {
  /** The session's state changed. */
  'state-changed': (e: { state: UpgradeState; previous: UpgradeState }) => void;
  /** A host's state changed (its next step began, or it ended). */
  'host-state-changed': (e: { host: string; state: HostUpgradeState; previous: HostUpgradeState }) => void;
  /** The method a host is upgraded with, and why. */
  'method-chosen': (e: { host: string; method: UpgradeMethod; reason: string }) => void;
  /** A volume on the host was snapshotted before the host was touched. */
  'volume-snapshotted': (e: { host: string; volume: string; snapshot: string }) => void;
  /** Progress of a host's step: `done` of `total` volumes (or 0 of 1, 1 of 1 for the process itself). */
  progress: (e: { host: string; step: HostUpgradeState; done: number; total: number }) => void;
  /** A host's data engine handed its engines, NBD clients connected, to the new version (in place): how many, and how long their exports were frozen. */
  'handed-off': (e: { host: string; engines: number; pauseMs: number }) => void;
  /** The session stopped on an error (its state is `error`; the host concerned, if any). */
  failed: (e: { host: string | null; error: MooringError }) => void;
};

/** What the handle asks of the controller. */
export interface UpgradeSessionOps {
  status(id: string): Promise<UpgradeSessionStatus>;
  setFlags(id: string, flags: { paused?: boolean; cancelRequested?: boolean }): Promise<void>;
}

/** How often {@link UpgradeSession.done} looks at the store. */
const DONE_POLL_MS = 200;

/** A recorded error as a MooringError. */
export function errorOfRecord(e: RecordedError): MooringError {
  return new MooringError(e.code, e.message);
}

/**
 * A live upgrade of the data engines, host by host (see the module comment). One per
 * cluster at a time; it is kept in the store, so a VM manager that restarts finds it again
 * with `Mooring.upgradeSession()` and its control loop goes on with it.
 */
export class UpgradeSession extends (EventEmitter as new () => TypedEmitter<UpgradeSessionEvents>) {
  /** @internal */
  constructor(
    /** The session's id (a UUID). */
    readonly id: string,
    private readonly ops: UpgradeSessionOps,
  ) {
    super();
  }

  /**
   * The session with every host's status.
   *
   * @throws MooringError NOT_FOUND (another session replaced it), CLOSED
   */
  status(): Promise<UpgradeSessionStatus> {
    return this.ops.status(this.id);
  }

  /**
   * Pauses: the step in progress finishes, then nothing moves until {@link resume}.
   *
   * @throws MooringError INVALID_STATE (the session has ended), NOT_FOUND, CLOSED
   */
  pause(): Promise<void> {
    return this.ops.setFlags(this.id, { paused: true });
  }

  /** Resumes a paused session. @throws MooringError INVALID_STATE (ended), NOT_FOUND, CLOSED */
  resume(): Promise<void> {
    return this.ops.setFlags(this.id, { paused: false });
  }

  /**
   * Cancels: hosts not started are left alone, a host whose data engine was not replaced yet
   * is put back (schedulable again; its snapshots stay), a host already replaced finishes
   * first. The session ends `cancelled`.
   *
   * @throws MooringError INVALID_STATE (ended), NOT_FOUND, CLOSED
   */
  cancel(): Promise<void> {
    return this.ops.setFlags(this.id, { cancelRequested: true });
  }

  /**
   * Resolves with the final status once the session is `completed` or `cancelled`.
   *
   * @throws MooringError the session's error once it is `error`; NOT_FOUND, CLOSED
   */
  async done(): Promise<UpgradeSessionStatus> {
    for (;;) {
      const s = await this.status();
      if (s.state === 'completed' || s.state === 'cancelled') return s;
      if (s.state === 'error') throw errorOfRecord(s.error ?? { code: 'IO_ERROR', message: 'the upgrade failed' });
      await new Promise((r) => setTimeout(r, DONE_POLL_MS));
    }
  }
}

/** The reasons of a PRECONDITION_FAILED error, as one message. */
export function blocksMessage(blocks: UpgradeBlock[]): string {
  const shown = blocks.slice(0, 5).map((b) => `${b.code}: ${b.message}`);
  return `the upgrade cannot start: ${shown.join('; ')}${blocks.length > 5 ? `; and ${blocks.length - 5} more (details.reasons)` : ''}`;
}
