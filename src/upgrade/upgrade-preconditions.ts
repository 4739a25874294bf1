/**
 * What must hold before a host's data engine is replaced, as a pure function of what the
 * control plane sees: every reason a session cannot start (or a host cannot go on) is
 * reported together, each with a code, the host and the volume concerned. The session
 * checks them for every host up front, and again for each host when its turn comes.
 *
 * Seed 004 refuses a volume whose only replica is on the node being upgraded, because its
 * engine must switch over to another node. With `restart`, an engine on the host restarts
 * with it, so a volume with its engine and its only replica there is fine. What is refused
 * is a volume attached elsewhere that would keep no majority of its replicas while the
 * host restarts (QUORUM_NEEDS_HOST): its engine could then neither serve nor drop the
 * missing replica (docs/single-writer.md, "Quorum"). A 2-replica volume attached on another
 * host is such a volume for either of its replicas' hosts.
 *
 * @packageDocumentation
 */
import type { ReplicaMode } from '../engine/engine.js';
import { UPGRADE_VOLUMES_PER_HOST_MAX, type UpgradeMethod, type UpgradeMethodChoice } from './upgrade-records.js';

/** Why a host cannot be upgraded now. */
export type UpgradeBlockCode =
  /** Nothing can start the new version there: no launcher was given to `Mooring.open`, and the host's data engine does not start its successor itself (or `dataEngine` has no `command` for it). */
  | 'NO_LAUNCHER'
  /** The host is not offered to this control plane. */
  | 'HOST_UNKNOWN'
  /** The host's data engine does not answer. */
  | 'HOST_UNREACHABLE'
  /** The host's data engine runs inside the VM manager (the embedded default): replacing it is restarting the VM manager. */
  | 'IN_PROCESS_DATA_ENGINE'
  /** A volume on the host is migrating. */
  | 'MIGRATION_IN_PROGRESS'
  /** A volume on the host has a replica being rebuilt. */
  | 'REBUILD_RUNNING'
  /** A volume on the host has a replica in ERR (or its engine cannot be asked). */
  | 'VOLUME_NOT_HEALTHY'
  /** A volume attached on another host would keep no majority of its replicas without this one (its only replica, or one of two). */
  | 'QUORUM_NEEDS_HOST'
  /** An operation (snapshot export, clone, rebuild) holds a volume's engine on the host. */
  | 'OPERATION_RUNNING'
  /** An NBD client is connected to an engine on the host and the host cannot hand over in place; `restart` would drop its connection. Ask for `restart` explicitly to accept that. */
  | 'CLIENTS_WOULD_RECONNECT'
  /** `in-place` was asked for, but the host's data engine cannot hand over in place (no `in-place-handoff` feature, or `dataEngine` has no `command`). */
  | 'IN_PLACE_UNAVAILABLE'
  /** More volumes on the host than one host's document can list. */
  | 'TOO_MANY_VOLUMES';

/** One reason, as reported in `details.reasons` of PRECONDITION_FAILED. */
export interface UpgradeBlock {
  /** Why. */
  code: UpgradeBlockCode;
  /** The host that cannot be upgraded. */
  host: string;
  /** The volume concerned, if one is. */
  volume?: string;
  /** What to do about it, for people. */
  message: string;
}

/** A volume as the check needs it. */
export interface VolumeLayout {
  name: string;
  /** Host of its engine, or null when detached. */
  engineHost: string | null;
  /** Whether that engine serves an NBD export (false: an operation attached it without one). */
  frontend: boolean;
  migrating: boolean;
  /** Its replicas with the modes its engine reports (`unknown` when detached or not asked). */
  replicas: { hostId: string; mode: ReplicaMode | 'unknown' }[];
  /** False when it is attached but its engine could not be asked. */
  engineAnswered: boolean;
}

/** Everything the check looks at. */
export interface UpgradeLayout {
  /** Hosts to upgrade. */
  hosts: string[];
  offered: ReadonlySet<string>;
  reachable: ReadonlySet<string>;
  inProcess: ReadonlySet<string>;
  /** Hosts where something can start the new version (the embedder's launcher, or the data engine itself). */
  launchable: ReadonlySet<string>;
  /** Hosts whose data engine can hand its engines to the new version in place. */
  inPlace: ReadonlySet<string>;
  method: UpgradeMethodChoice;
  volumes: VolumeLayout[];
}

/** The volumes with their engine or a replica on `host`. */
export function volumesOn(host: string, volumes: VolumeLayout[]): VolumeLayout[] {
  return volumes.filter((v) => v.engineHost === host || v.replicas.some((r) => r.hostId === host));
}

/** The method a host gets and why: `auto` takes in-place where the host can, else restart. */
export function chooseMethod(choice: UpgradeMethodChoice, inPlace: boolean): { method: UpgradeMethod; reason: string } {
  if (choice === 'restart') return { method: 'restart', reason: 'asked for: the host\'s engines restart with it and their NBD clients reconnect' };
  if (inPlace) return { method: 'in-place', reason: choice === 'in-place' ? 'asked for' : 'the host\'s data engine hands its engines over in place: NBD clients stay connected' };
  return { method: 'restart', reason: 'the host\'s data engine cannot hand over in place; no NBD client is connected to an engine there, so a restart disturbs none' };
}

/** Every reason the hosts cannot be upgraded now (empty: go). */
export function upgradeBlocks(l: UpgradeLayout): UpgradeBlock[] {
  const out: UpgradeBlock[] = [];
  const add = (code: UpgradeBlockCode, host: string, message: string, volume?: string): void => {
    out.push({ code, host, ...(volume !== undefined ? { volume } : {}), message });
  };
  for (const host of l.hosts) {
    if (!l.offered.has(host)) {
      add('HOST_UNKNOWN', host, `host ${host} is not a host of this cluster`);
      continue;
    }
    if (l.method === 'in-place' && l.reachable.has(host) && !l.inPlace.has(host)) {
      add('IN_PLACE_UNAVAILABLE', host, `host ${host}'s data engine cannot hand over in place: run it with --allow-successor-exec (a release with the in-place hand-off) and give dataEngine a command; an engine exported over TLS there cannot be handed over either`);
    }
    if (l.reachable.has(host) && !l.launchable.has(host) && !l.inPlace.has(host)) {
      add('NO_LAUNCHER', host, `nothing can start the new version on ${host}: give Mooring.open a dataEngineLauncher, or run its data engine with --allow-successor-exec and give dataEngine a command`);
    }
    if (l.inProcess.has(host)) add('IN_PROCESS_DATA_ENGINE', host, `host ${host}'s data engine runs inside this VM manager; upgrade it by restarting the VM manager with the new package`);
    if (!l.reachable.has(host)) add('HOST_UNREACHABLE', host, `host ${host}'s data engine does not answer`);
    const on = volumesOn(host, l.volumes);
    if (on.length > UPGRADE_VOLUMES_PER_HOST_MAX) add('TOO_MANY_VOLUMES', host, `host ${host} holds ${on.length} volumes; one session step lists at most ${UPGRADE_VOLUMES_PER_HOST_MAX}`);
    for (const v of on) {
      if (v.migrating) add('MIGRATION_IN_PROGRESS', host, `volume ${v.name} is migrating; confirm or roll it back first`, v.name);
      if (v.engineHost === null) continue;
      if (!v.engineAnswered) {
        add('VOLUME_NOT_HEALTHY', host, `the engine of volume ${v.name} on ${v.engineHost} does not answer`, v.name);
        continue;
      }
      if (v.replicas.some((r) => r.mode === 'WO')) add('REBUILD_RUNNING', host, `volume ${v.name} is rebuilding a replica; wait for it to finish`, v.name);
      if (v.replicas.some((r) => r.mode === 'ERR')) add('VOLUME_NOT_HEALTHY', host, `volume ${v.name} has a replica in ERR; let it be repaired first`, v.name);
      const left = v.replicas.filter((r) => r.mode === 'RW' && r.hostId !== host).length;
      if (v.engineHost !== host && left * 2 <= v.replicas.length) {
        add('QUORUM_NEEDS_HOST', host, `volume ${v.name} is attached on ${v.engineHost}; without ${host}, ${left} of its ${v.replicas.length} replicas are left, not a majority; add a replica on another host first`, v.name);
      }
      if (v.engineHost === host && !v.frontend) add('OPERATION_RUNNING', host, `an operation holds volume ${v.name} on ${host}; wait for it to end`, v.name);
      if (v.engineHost === host && v.frontend && l.method === 'auto' && !l.inPlace.has(host)) {
        add('CLIENTS_WOULD_RECONNECT', host, `volume ${v.name} is attached on ${host} with its NBD export; a restart drops its clients' connections (ask for method 'restart' if they reconnect)`, v.name);
      }
    }
  }
  return out;
}
