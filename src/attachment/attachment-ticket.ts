/**
 * Attachment tickets (Longhorn's VolumeAttachment): every party that needs a volume
 * attached — the VM manager, a VM workload, or Mooring itself for an internal operation —
 * holds a ticket naming the host it needs. The attachment reconciler
 * (`decideAttachment`) turns the set of tickets into one decision: where the volume is
 * attached, whether it migrates, and which tickets are satisfied.
 *
 * @packageDocumentation
 */
import { MooringError } from '../errors.js';
import { NAME_PATTERN } from '../util/limits.js';

/**
 * Who asked. Longhorn's attacher types, with library words where a Kubernetes word does not
 * fit: `csi-attacher` → `workload` (a VM that uses the volume), `longhorn-api` → `api` (the
 * embedder's own call), `*-controller` → the operation's name. Longhorn's `share-manager`
 * (RWX volumes) and `volume-restore` (restore from a backup store) are not here: Mooring has
 * neither. `salvage` and `volume-eviction` are the seed's, for the salvage and eviction
 * flows (docs/migration.md says which types Mooring itself takes).
 */
export type AttacherType =
  | 'workload'
  | 'api'
  | 'snapshot'
  | 'backup'
  | 'volume-clone'
  | 'salvage'
  | 'volume-eviction'
  | 'volume-expansion'
  | 'backing-image-export'
  | 'volume-rebuild';

/**
 * Priority of each attacher type (higher wins when the volume is detached and tickets ask
 * for different hosts): restoring data > the user's own call > workloads > operations.
 */
export const ATTACHER_PRIORITY: Readonly<Record<AttacherType, number>> = Object.freeze({
  'volume-expansion': 2000,
  api: 1000,
  workload: 900,
  salvage: 900,
  snapshot: 800,
  backup: 800,
  'volume-clone': 800,
  'volume-eviction': 800,
  'backing-image-export': 800,
  'volume-rebuild': 800,
});

/** Attacher types whose tickets may move a migratable volume to another host (the others wait). */
export const MIGRATING_ATTACHERS: ReadonlySet<AttacherType> = new Set<AttacherType>(['workload', 'api']);

/** Every attacher type. */
export const ATTACHER_TYPES = Object.freeze(Object.keys(ATTACHER_PRIORITY) as AttacherType[]);

/** `disableFrontend` values: the ticket needs no export (`true`), needs one (`false`), or takes either (`any`). */
export type FrontendRequirement = 'true' | 'false' | 'any';

/** Parameters of a ticket. */
export interface AttachmentParameters {
  /** Whether the engine runs without an NBD export (default `false`: it needs one). */
  disableFrontend: FrontendRequirement;
  /** Who attached the volume before (informational; kept and reported). */
  lastAttachedBy: string | null;
  /** NBD address to export on (`unix:PATH` or `tcp:HOST:PORT`) when the frontend is on; null: none requested. */
  nbd: string | null;
}

/** One party's request that the volume be attached on a host. */
export interface AttachmentTicket {
  /** Unique within the volume ([A-Za-z0-9._-]{1,63}). */
  id: string;
  /** Who asks: decides the ticket's priority. */
  type: AttacherType;
  /** Host id the volume is wanted on. */
  hostId: string;
  /** The frontend wanted, the NBD address and who had it before. */
  parameters: AttachmentParameters;
  /** Increases each time the ticket's spec changes (set by the cluster). */
  generation: number;
  /**
   * Set on the tickets Mooring takes for its own operations (a snapshot, a backup, an
   * eviction): the control plane instance running the operation. The ticket lives as long as
   * the operation; one held by another instance (its process died, or lost the lead, midway)
   * is withdrawn by the next reconcile.
   */
  heldBy?: string;
}

/** Why a ticket is (not) satisfied. */
export type AttachmentConditionReason =
  | 'Attached'
  | 'MigrationTargetReady'
  | 'AttachedWithIncompatibleParameters'
  | 'WaitingForDetach'
  | 'Attaching'
  | 'MigrationPending';

/** A condition of a ticket's status (Kubernetes style). */
export interface AttachmentCondition {
  /** The only condition type. */
  type: 'Satisfied';
  /** Whether the ticket is satisfied. */
  status: boolean;
  /** Why (not). */
  reason: AttachmentConditionReason;
  /** The reason in words, for people. */
  message: string;
}

/** What the cluster observed about a ticket. */
export interface AttachmentTicketStatus {
  /** The ticket's id. */
  id: string;
  /** Whether an engine that serves the ticket runs on its host. */
  satisfied: boolean;
  /** Why it is (not) satisfied. */
  conditions: AttachmentCondition[];
  /** The ticket generation this status describes. */
  generation: number;
}

/** The frontend an engine runs with. */
export interface Frontend {
  /** The engine runs without NBD export. */
  disabled: boolean;
  /** Export address when enabled (null: enabled but not exported; a cluster attach without `nbd`). */
  nbd: string | null;
}

/** Whether an engine running with `frontend` serves a ticket's parameters. */
export function frontendCompatible(p: AttachmentParameters, frontend: Frontend): boolean {
  if (p.disableFrontend === 'any') return true;
  if (p.disableFrontend === 'true') return frontend.disabled;
  return !frontend.disabled && (p.nbd === null || p.nbd === frontend.nbd);
}

/** The frontend a ticket asks for when it is the one that attaches the volume. */
export function frontendOf(p: AttachmentParameters): Frontend {
  return p.disableFrontend === 'true' ? { disabled: true, nbd: null } : { disabled: false, nbd: p.nbd };
}

// A ticket stored by an earlier release may carry a type this one no longer has
// (`share-manager`, `volume-restore`): it ranks with the operations, below workloads.
function priorityOf(type: string): number {
  return (ATTACHER_PRIORITY as Record<string, number | undefined>)[type] ?? ATTACHER_PRIORITY.snapshot;
}

/** Orders tickets best first: higher priority, then the shorter id, then the id. */
export function compareTickets(a: AttachmentTicket, b: AttachmentTicket): number {
  return priorityOf(b.type) - priorityOf(a.type) || a.id.length - b.id.length || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}

const NBD_PATTERN = /^(unix:\/.{0,4094}|tcp:[A-Za-z0-9.:[\]-]{1,255}:[0-9]{1,5})$/;

/**
 * Validates ticket parameters given by a caller (or read from a store), filling defaults.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function checkParameters(v: unknown): AttachmentParameters {
  const o = (v ?? {}) as Record<string, unknown>;
  if (typeof o !== 'object' || Array.isArray(o)) throw new MooringError('INVALID_ARGUMENT', 'ticket parameters must be an object');
  const d = o['disableFrontend'] ?? 'false';
  if (d !== 'true' && d !== 'false' && d !== 'any') throw new MooringError('INVALID_ARGUMENT', `disableFrontend must be 'true', 'false' or 'any' (got ${String(d)})`);
  const last = o['lastAttachedBy'] ?? null;
  if (last !== null && (typeof last !== 'string' || last.length > 253)) throw new MooringError('INVALID_ARGUMENT', 'lastAttachedBy must be a string of at most 253 characters or null');
  const nbd = o['nbd'] ?? null;
  if (nbd !== null && (typeof nbd !== 'string' || !NBD_PATTERN.test(nbd))) {
    throw new MooringError('INVALID_ARGUMENT', `nbd must be 'unix:/PATH' or 'tcp:HOST:PORT' (got ${JSON.stringify(nbd)?.slice(0, 80)})`);
  }
  if (d === 'true' && nbd !== null) throw new MooringError('INVALID_ARGUMENT', 'a ticket with disableFrontend true cannot ask for an nbd export');
  return { disableFrontend: d, lastAttachedBy: last, nbd };
}

/**
 * Validates a ticket id and type.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function checkTicketIdentity(id: unknown, type: unknown): { id: string; type: AttacherType } {
  if (typeof id !== 'string' || !NAME_PATTERN.test(id)) throw new MooringError('INVALID_ARGUMENT', `ticket id must match ${NAME_PATTERN} (got ${JSON.stringify(id)?.slice(0, 80)})`);
  if (typeof type !== 'string' || !(type in ATTACHER_PRIORITY)) {
    throw new MooringError('INVALID_ARGUMENT', `attacher type must be one of ${ATTACHER_TYPES.join(', ')} (got ${JSON.stringify(type)?.slice(0, 80)})`);
  }
  return { id, type: type as AttacherType };
}
