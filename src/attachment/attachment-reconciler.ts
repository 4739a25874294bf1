/**
 * The attach/detach reconciler (Longhorn's attach/detach controller, plus the rules of its
 * volume live migration design):
 * a pure function from a volume's tickets, its spec and what actually runs to the next spec
 * and every ticket's status. The cluster applies the spec (starts, stops, migrates engines)
 * and calls it again until nothing changes.
 *
 * Rules, in order:
 * 1. Nothing asks for the desired host any more: during a migration whose target is still
 *    asked for, that is a confirm (the target becomes the desired host); otherwise detach.
 * 2. Nothing asks for the migration target any more: roll the migration back.
 * 3. Detached (and nothing runs): attach to the best ticket's host — highest priority, then
 *    the shorter id, then the id — with that ticket's frontend. While something still runs,
 *    new tickets wait.
 * 4. A migratable volume attached with its frontend on, with a workload or api ticket for
 *    another host, migrates there (block only: a volume attached without frontend does not).
 *    An RWO volume's tickets for other hosts wait for a detach.
 * 5. Attached, not migrating, and no ticket for the host accepts the running frontend (say
 *    an operation attached it without export and a workload now needs one): detach, so the
 *    next pass attaches with the best ticket's frontend.
 * A ticket is satisfied when an engine serving it runs on its host: the attached engine
 * with a compatible frontend, or the migration target once its standby serves.
 *
 * @packageDocumentation
 */
import {
  MIGRATING_ATTACHERS,
  compareTickets,
  frontendCompatible,
  frontendOf,
  type AttachmentCondition,
  type AttachmentTicket,
  type AttachmentTicketStatus,
  type Frontend,
} from './attachment-ticket.js';

/** How a volume may be attached. */
export type AccessMode = 'rwo' | 'migratable';

/** What the attachment reconciler (`decideAttachment` in `mooring/internal`) needs to know about one volume. */
export interface AttachmentInput {
  /** The volume's access mode: only `migratable` volumes migrate. */
  accessMode: AccessMode;
  /** Spec: where the volume should be attached (null: detached). */
  desiredHost: string | null;
  /** Spec: where it is migrating to (null: not migrating). */
  migrationHost: string | null;
  /** Spec: the frontend the attached engine runs (or will run) with. */
  frontend: Frontend;
  /** Spec: the frontend of the migration target. */
  migrationFrontend: Frontend;
  /** Reality: the host whose engine is attached (the writer, or the source of a migration), or null. */
  attachedHost: string | null;
  /** Reality: the frontend that engine runs with. */
  attachedFrontend: Frontend | null;
  /** Reality: the migration target's engine runs on migrationHost. */
  migrationTargetReady: boolean;
  /** Every ticket of the volume. */
  tickets: AttachmentTicket[];
}

/** The next spec and the ticket statuses. */
export interface AttachmentDecision {
  /** Where the volume should be attached (null: detached). */
  desiredHost: string | null;
  /** Where it should migrate to (null: not migrating). */
  migrationHost: string | null;
  /** The frontend the attached engine should run with. */
  frontend: Frontend;
  /** The frontend of the migration target. */
  migrationFrontend: Frontend;
  /** The status of every ticket. */
  statuses: AttachmentTicketStatus[];
}

function sameFrontend(a: Frontend, b: Frontend): boolean {
  return a.disabled === b.disabled && a.nbd === b.nbd;
}

/** Decides the next spec and the ticket statuses; see the module comment. Pure. */
export function decideAttachment(input: AttachmentInput): AttachmentDecision {
  const tickets = [...input.tickets].sort(compareTickets);
  const asked = (host: string | null): AttachmentTicket[] => (host === null ? [] : tickets.filter((t) => t.hostId === host));
  let { desiredHost, migrationHost, frontend, migrationFrontend } = input;

  // 1 and 2: confirm, roll back, or detach.
  if (desiredHost !== null && asked(desiredHost).length === 0) {
    if (migrationHost !== null && asked(migrationHost).length > 0) {
      desiredHost = migrationHost;
      frontend = migrationFrontend;
    } else {
      desiredHost = null;
    }
    migrationHost = null;
  }
  if (migrationHost !== null && asked(migrationHost).length === 0) migrationHost = null;
  // A migration needs an attached source on another host.
  if (desiredHost === null || migrationHost === desiredHost) migrationHost = null;

  // 3: attach when fully detached.
  if (desiredHost === null && input.attachedHost === null && tickets.length > 0) {
    const best = tickets[0]!;
    desiredHost = best.hostId;
    frontend = frontendOf(best.parameters);
  }

  // 4: start a migration.
  const attachedHere = desiredHost !== null && input.attachedHost === desiredHost;
  if (attachedHere && migrationHost === null && input.accessMode === 'migratable' && input.attachedFrontend && !input.attachedFrontend.disabled) {
    const mover = tickets.find((t) => t.hostId !== desiredHost && MIGRATING_ATTACHERS.has(t.type) && t.parameters.disableFrontend !== 'true');
    if (mover) {
      migrationHost = mover.hostId;
      migrationFrontend = frontendOf(mover.parameters);
    }
  }

  // 5: re-attach for a frontend no current ticket accepts.
  if (attachedHere && migrationHost === null && input.attachedFrontend) {
    const here = asked(desiredHost);
    if (!here.some((t) => frontendCompatible(t.parameters, input.attachedFrontend!))) desiredHost = null;
  }
  if (desiredHost === null) migrationHost = null;

  const statuses = tickets.map((t) => statusOf(t, input, { desiredHost, migrationHost, frontend, migrationFrontend }));
  statuses.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return { desiredHost, migrationHost, frontend, migrationFrontend, statuses };
}

function statusOf(t: AttachmentTicket, input: AttachmentInput, next: Omit<AttachmentDecision, 'statuses'>): AttachmentTicketStatus {
  const cond = (status: boolean, reason: AttachmentCondition['reason'], message: string): AttachmentTicketStatus => ({
    id: t.id,
    satisfied: status,
    conditions: [{ type: 'Satisfied', status, reason, message }],
    generation: t.generation,
  });
  if (input.attachedHost !== null && t.hostId === input.attachedHost && input.attachedFrontend) {
    if (frontendCompatible(t.parameters, input.attachedFrontend)) return cond(true, 'Attached', `attached on ${t.hostId}`);
    return cond(false, 'AttachedWithIncompatibleParameters', `attached on ${t.hostId} with the frontend ${input.attachedFrontend.disabled ? 'disabled' : 'enabled'}${input.attachedFrontend.nbd ? ` at ${input.attachedFrontend.nbd}` : ''}, which this ticket does not accept`);
  }
  if (input.migrationHost !== null && t.hostId === input.migrationHost && next.migrationHost === input.migrationHost) {
    if (input.migrationTargetReady && frontendCompatible(t.parameters, input.migrationFrontend)) {
      return cond(true, 'MigrationTargetReady', `migration target on ${t.hostId} serves (standby until hand-over)`);
    }
    return cond(false, 'MigrationPending', `migration to ${t.hostId} is starting`);
  }
  if (input.attachedHost !== null) return cond(false, 'WaitingForDetach', `attached on ${input.attachedHost}; waiting for it to detach`);
  return cond(false, 'Attaching', `attaching on ${next.desiredHost ?? t.hostId}`);
}

/** Whether two decisions leave the same spec. */
export function sameSpec(a: Omit<AttachmentDecision, 'statuses'>, b: Omit<AttachmentDecision, 'statuses'>): boolean {
  return a.desiredHost === b.desiredHost && a.migrationHost === b.migrationHost && sameFrontend(a.frontend, b.frontend) && sameFrontend(a.migrationFrontend, b.migrationFrontend);
}
