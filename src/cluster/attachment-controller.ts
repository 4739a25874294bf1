/**
 * The attachment controller: attachment tickets in the store, and the reconcile that brings
 * a volume's engines to what its tickets ask, one step per pass: a migration left midway
 * is recovered, the reconciler decides (src/attachment/), and one action follows (start,
 * stop, start or end a migration). Operations (snapshots, export, clone, rebuild) hold a
 * ticket of their own while they run ({@link AttachmentController.withTicket}).
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';

import { decideAttachment, sameSpec, type AttachmentDecision } from '../attachment/attachment-reconciler.js';
import {
  MIGRATING_ATTACHERS,
  checkParameters,
  checkTicketIdentity,
  frontendCompatible,
  type AttacherType,
  type AttachmentTicket,
  type Frontend,
} from '../attachment/attachment-ticket.js';
import { MooringError, toMooringError } from '../errors.js';
import { delay } from '../util/async.js';
import { checkIntIn, checkName, describe } from '../util/validate.js';
import { ATTACHMENT_TICKETS_MAX, CLUSTER_SCHEMA_VERSION, KIND, type AttachmentRecord } from './cluster-records.js';
import type { AttachOptions, DetachOptions, VolumeTicket, VolumeStatus, TicketOptions } from '../volume/volume.js';
import type { ControlState, Observed } from './control-state.js';
import type { EngineLifecycle } from './engine-lifecycle.js';
import type { MigrationController } from './migration-controller.js';
import { volumeStatus } from './volume-status.js';

/** How often a waiting ticket is reconciled again. */
const TICKET_POLL_MS = 100;
/** Passes of one reconcile before it stops to let others run (each pass takes one step). */
const CONVERGE_PASSES_MAX = 8;
/** Largest wait an attach may be given (a week). */
export const MS_SETTING_MAX = 7 * 24 * 3600 * 1000;

/** See the module comment. */
export class AttachmentController {
  // Volumes whose attach is taking them over from an unreachable host (for the event).
  readonly #takeovers = new Map<string, string>();

  constructor(
    private readonly state: ControlState,
    private readonly engines: EngineLifecycle,
    private readonly migrations: MigrationController,
  ) {}

  /**
   * Asks for the volume on a host with a ticket and waits until the ticket is satisfied
   * (see Volume.attach).
   *
   * @throws MooringError NOT_FOUND, BUSY, UNAVAILABLE, INVALID_ARGUMENT, NO_HEALTHY_REPLICA
   */
  async attach(name: string, options: AttachOptions): Promise<VolumeStatus> {
    this.state.checkLeader();
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `attach options must be an object (got ${describe(options)})`);
    const host = checkName('host id', options.host);
    this.state.hosts.engineOf(host);
    const attacher = options.attacher ?? 'api';
    if (attacher !== 'api' && attacher !== 'workload') throw new MooringError('INVALID_ARGUMENT', `attacher must be 'api' or 'workload' (got ${describe(attacher)})`);
    const parameters = checkParameters({ disableFrontend: options.disableFrontend === true ? 'true' : 'false', nbd: options.nbd ?? null, lastAttachedBy: options.lastAttachedBy ?? null });
    const id = checkTicketIdentity(options.ticketId ?? `${attacher}-${host}`, attacher).id;
    const timeoutMs = checkIntIn('timeoutMs', options.timeoutMs, 0, MS_SETTING_MAX, this.state.settings.ticketWaitMs);
    const created = await this.state.serial(name, async () => {
      const o = await this.state.observe(name);
      if (o.eng && o.eng.hostId !== host) {
        if (o.engState === 'unreachable' && !o.mig) {
          // Its host is gone, and so is the VM that used it there: its tickets go, and the
          // new engine's epoch fences the old one (an engine-taken-over event follows).
          const kept = o.att.tickets.filter((t) => !(t.hostId === o.eng!.hostId && MIGRATING_ATTACHERS.has(t.type)));
          await this.#putTickets(o, kept);
          this.#takeovers.set(name, o.eng.hostId);
          await this.state.store.delete(KIND.engine, name);
        } else if (o.vol.accessMode === 'rwo' || o.eng.frontendDisabled || parameters.disableFrontend === 'true' || (o.mig && o.mig.targetHost !== host)) {
          const why = o.mig ? `it is migrating from ${o.mig.sourceHost} to ${o.mig.targetHost}` : o.vol.accessMode === 'rwo' ? 'it is RWO' : 'it is attached without frontend (block migration needs one)';
          throw new MooringError('BUSY', `volume ${name} is attached on ${o.eng.hostId} and ${why}; detach it first`, { details: { attachedHost: o.eng.hostId } });
        }
      }
      const isNew = !o.att.tickets.some((t) => t.id === id);
      await this.#upsertTicket(o, { id, type: attacher, hostId: host, parameters, generation: 0 });
      await this.converge(name);
      return isNew;
    });
    try {
      await this.#waitSatisfied(name, id, timeoutMs);
    } catch (err) {
      // A ticket this call created and could not satisfy is withdrawn (a failed migration start, a timeout).
      if (created) await this.state.serial(name, async () => this.#removeTickets(name, (t) => t.id === id)).catch(() => undefined);
      throw err;
    }
    const st = await volumeStatus(this.state, name);
    const taken = this.#takeovers.get(name);
    if (taken !== undefined) {
      this.#takeovers.delete(name);
      this.state.events.cluster('engine-taken-over', { volume: name, fromHost: taken, toHost: host, epoch: st.epoch });
    }
    return st;
  }

  /**
   * Withdraws tickets and detaches where none is left.
   *
   * @throws MooringError NOT_FOUND, UNAVAILABLE, INVALID_ARGUMENT
   */
  async detach(name: string, options: DetachOptions): Promise<void> {
    this.state.checkLeader();
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `detach options must be an object (got ${describe(options)})`);
    const host = options.host === undefined || options.host === '' ? null : checkName('host id', options.host);
    const ticketId = options.ticketId === undefined ? null : checkTicketIdentity(options.ticketId, 'api').id;
    await this.state.serial(name, async () => {
      await this.state.volume(name);
      await this.#removeTickets(name, (t) => (ticketId !== null ? t.id === ticketId : MIGRATING_ATTACHERS.has(t.type) && (host === null || t.hostId === host)));
    });
  }

  /** Every ticket of the volume with its status. */
  async tickets(name: string): Promise<VolumeTicket[]> {
    await this.state.volume(name);
    const att = (await this.state.attachment(name)).rec;
    return att.tickets.map((t) => ({ ...t, status: att.statuses.find((s) => s.id === t.id) ?? null }));
  }

  /** Creates or updates a ticket of any attacher type and reconciles (does not wait for it). */
  async setTicket(name: string, t: TicketOptions): Promise<VolumeTicket> {
    this.state.checkLeader();
    if (typeof t !== 'object' || t === null) throw new MooringError('INVALID_ARGUMENT', `a ticket must be an object (got ${describe(t)})`);
    const { id, type } = checkTicketIdentity(t.id, t.type);
    const host = checkName('host id', t.host);
    const parameters = checkParameters(t.parameters ?? {});
    await this.state.serial(name, async () => {
      const o = await this.state.observe(name);
      await this.#upsertTicket(o, { id, type, hostId: host, parameters, generation: 0 });
      await this.converge(name);
    });
    return (await this.tickets(name)).find((x) => x.id === id)!;
  }

  /** Deletes a ticket (no error if missing) and reconciles. */
  async deleteTicket(name: string, id: string): Promise<void> {
    this.state.checkLeader();
    checkTicketIdentity(id, 'api');
    await this.state.serial(name, () => this.#removeTickets(name, (t) => t.id === id));
  }

  /**
   * Runs `fn` while the volume holds an operation's own ticket: on the attached host (any
   * frontend), or on `host` where the volume attaches itself without frontend (with
   * `anyFrontend`, with whatever frontend the other tickets ask for). `prepare` runs first,
   * in the same turn as the ticket's creation. `fn` gets the host whose engine writes.
   */
  async withTicket<T>(name: string, type: AttacherType, host: string, fn: (writer: string) => Promise<T>, anyFrontend = false, prepare?: (o: Observed) => Promise<void>): Promise<T> {
    const id = `${type}-${randomUUID().slice(0, 8)}`;
    await this.state.serial(name, async () => {
      let o = await this.state.observe(name);
      if (prepare) {
        // In the same turn as the ticket: nothing acts on the volume in between.
        await prepare(o);
        o = await this.state.observe(name);
      }
      const here = o.eng !== null && o.eng.hostId === host;
      await this.#upsertTicket(o, { id, type, hostId: host, parameters: checkParameters({ disableFrontend: here || anyFrontend ? 'any' : 'true' }), generation: 0, heldBy: this.state.instanceId });
      await this.converge(name);
    });
    try {
      await this.#waitSatisfied(name, id, this.state.settings.ticketWaitMs);
      const mig = await this.state.migrationRecord(name);
      return await fn(mig?.targetActivated ? mig.targetHost : host);
    } finally {
      await this.state.serial(name, () => this.#removeTickets(name, (t) => t.id === id)).catch((err: unknown) =>
        this.state.events.cluster('warning', toMooringError(err, `withdrawing the ${type} ticket of ${name}`)),
      );
    }
  }

  /**
   * Where an operation runs: the attached host, else `preferred`, else the first reachable
   * replica host.
   *
   * @throws MooringError UNAVAILABLE, NOT_FOUND (preferred is not a host)
   */
  async operationHost(name: string, preferred: string | undefined): Promise<string> {
    const eng = await this.state.engineRecord(name);
    if (eng) return eng.hostId;
    if (preferred !== undefined) {
      this.state.hosts.engineOf(checkName('host id', preferred));
      return preferred;
    }
    const host = await this.state.reachableReplicaHost(name);
    if (host !== null) return host;
    throw new MooringError('UNAVAILABLE', `volume ${name}: no host holding one of its replicas can be reached`);
  }

  /**
   * Brings one volume's engines to what its tickets ask, one step per pass: migration
   * recovery, then the reconciler's decision (spec), then one action. Ends by recording the
   * ticket statuses. Caller holds the volume's turn.
   */
  async converge(name: string): Promise<void> {
    for (let pass = 0; pass < CONVERGE_PASSES_MAX; pass++) {
      const o = await this.state.observe(name);
      if (await this.#withdrawOrphans(o)) continue;
      if (o.mig && (await this.migrations.recover(o))) continue;
      // Ready only for the host the spec migrates to: a spec that moved on (the target's
      // ticket withdrawn, another host asking) must not see the old target's standby.
      const targetReady =
        o.mig !== null &&
        o.mig.targetHost === o.vol.migrationHost &&
        (o.mig.phase === 'target-ready' || o.mig.phase === 'handed-over') &&
        (await this.state.hosts.probe(o.mig.targetHost, name)) !== 'unreachable';
      const attachedFrontend: Frontend | null = o.eng ? { disabled: o.eng.frontendDisabled, nbd: o.eng.nbd } : null;
      const d = decideAttachment({
        accessMode: o.vol.accessMode,
        desiredHost: o.vol.desiredHost,
        migrationHost: o.vol.migrationHost,
        frontend: o.vol.frontend,
        migrationFrontend: o.vol.migrationFrontend,
        attachedHost: o.eng?.hostId ?? null,
        attachedFrontend,
        migrationTargetReady: targetReady,
        tickets: o.att.tickets,
      });
      if (!sameSpec(d, o.vol)) {
        o.vol = { ...o.vol, schema: CLUSTER_SCHEMA_VERSION, desiredHost: d.desiredHost, migrationHost: d.migrationHost, frontend: d.frontend, migrationFrontend: d.migrationFrontend };
        await this.state.putVolume(o.vol);
      }
      let acted: boolean;
      try {
        acted = await this.#act(o, d);
      } catch (err) {
        // The statuses still tell the truth about what runs (the step did not happen).
        await this.#putStatuses(o, d).catch(() => undefined);
        throw err;
      }
      if (acted) continue;
      await this.#putStatuses(o, d);
      return;
    }
  }

  /** Forgets pending takeover events. */
  close(): void {
    this.#takeovers.clear();
  }

  // One step towards the decision; true if something changed (another pass follows).
  async #act(o: Observed, d: AttachmentDecision): Promise<boolean> {
    const name = o.vol.name;
    if (o.mig) {
      if (d.migrationHost === o.mig.targetHost) return false; // the migration goes on; hand-over is the embedder's call
      // Otherwise it ends: a confirm when the target is now the desired host, else a rollback
      // (the next pass starts a migration to whichever host now asks, if one does).
      if (d.desiredHost === o.mig.targetHost) await this.migrations.confirm(name, true);
      else await this.migrations.rollback(name, false, 'the target ticket was withdrawn');
      return true;
    }
    if (d.migrationHost !== null && o.eng && o.engState === 'running') {
      await this.migrations.start(o, d);
      return true;
    }
    if (o.eng && (d.desiredHost !== o.eng.hostId || d.desiredHost === null)) {
      await this.engines.stop(o);
      return true;
    }
    if (d.desiredHost !== null && !o.eng) {
      // A salvage ticket makes it a salvage start (docs/salvage.md).
      const salvage = o.att.tickets.some((t) => t.type === 'salvage');
      await this.engines.start(name, d.desiredHost, d.frontend, salvage);
      return true;
    }
    return false;
  }

  // An operation's ticket whose control plane is not this one outlived its operation (that
  // process died or lost the lead midway): it goes, or it would keep the volume attached.
  async #withdrawOrphans(o: Observed): Promise<boolean> {
    const orphans = o.att.tickets.filter((t) => t.heldBy !== undefined && t.heldBy !== this.state.instanceId);
    if (orphans.length === 0) return false;
    await this.#putTickets(o, o.att.tickets.filter((t) => !orphans.includes(t)));
    for (const t of orphans) {
      this.state.events.cluster('warning', new MooringError('INVALID_STATE', `volume ${o.vol.name}: withdrew the ${t.type} ticket ${t.id}, left by control plane ${t.heldBy} (it stopped or lost the lead before its operation ended)`, { details: { volume: o.vol.name, ticketId: t.id, type: t.type, heldBy: t.heldBy } }));
    }
    return true;
  }

  // Removes matching tickets and reconciles. Caller holds the volume's turn.
  async #removeTickets(name: string, match: (t: AttachmentTicket) => boolean): Promise<void> {
    const o = await this.state.observe(name);
    const kept = o.att.tickets.filter((t) => !match(t));
    if (kept.length !== o.att.tickets.length) await this.#putTickets(o, kept);
    await this.converge(name);
  }

  async #upsertTicket(o: Observed, t: AttachmentTicket): Promise<void> {
    const old = o.att.tickets.find((x) => x.id === t.id);
    const same = old && old.type === t.type && old.hostId === t.hostId && JSON.stringify(old.parameters) === JSON.stringify(t.parameters);
    if (same) return;
    // Neither engine of a migration can change its frontend midway: a ticket for either host
    // that the engine there could not serve waits until the migration ends, or is refused
    // if it would replace the ticket the engine serves.
    if (o.mig && old && (t.hostId === o.mig.sourceHost || t.hostId === o.mig.targetHost)) {
      const fe = t.hostId === o.mig.targetHost ? o.vol.migrationFrontend : { disabled: o.eng?.frontendDisabled ?? false, nbd: o.eng?.nbd ?? null };
      if (!frontendCompatible(t.parameters, fe)) {
        throw new MooringError('BUSY', `volume ${o.vol.name} is migrating from ${o.mig.sourceHost} to ${o.mig.targetHost}; ticket ${t.id} cannot change the frontend of ${t.hostId} until the migration ends`);
      }
    }
    if (!old && o.att.tickets.length >= ATTACHMENT_TICKETS_MAX) throw new MooringError('OUT_OF_RANGE', `volume ${o.vol.name} has ${ATTACHMENT_TICKETS_MAX} tickets already`);
    const next = { ...t, generation: (old?.generation ?? 0) + 1 };
    await this.#putTickets(o, [...o.att.tickets.filter((x) => x.id !== t.id), next]);
  }

  async #putTickets(o: Observed, tickets: AttachmentTicket[]): Promise<void> {
    await this.#putAttachment(o, { ...o.att, schema: CLUSTER_SCHEMA_VERSION, tickets });
  }

  async #putStatuses(o: Observed, d: AttachmentDecision): Promise<void> {
    if (JSON.stringify(o.att.statuses) === JSON.stringify(d.statuses)) return;
    await this.#putAttachment(o, { ...o.att, schema: CLUSTER_SCHEMA_VERSION, statuses: d.statuses });
  }

  // Compare-and-set on the attachment record read by this pass.
  async #putAttachment(o: Observed, rec: AttachmentRecord): Promise<void> {
    const put = await this.state.store.put(KIND.attachment, o.vol.name, rec, { expectedVersion: o.attVersion });
    o.att = rec;
    o.attVersion = put.version;
  }

  async #waitSatisfied(name: string, id: string, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const att = await this.state.attachment(name);
      const t = att.rec.tickets.find((x) => x.id === id);
      if (!t) throw new MooringError('INVALID_STATE', `ticket ${id} of ${name} was withdrawn while waiting for it`);
      const st = att.rec.statuses.find((x) => x.id === id);
      if (st?.satisfied && st.generation === t.generation) return;
      if (Date.now() >= deadline) {
        const why = st?.conditions[0]?.message ?? 'not reconciled yet';
        throw new MooringError('BUSY', `ticket ${id} of ${name} not satisfied within ${timeoutMs} ms: ${why}`, { details: { reason: st?.conditions[0]?.reason ?? null } });
      }
      await delay(TICKET_POLL_MS);
      this.state.checkOpen();
      await this.state.serial(name, () => this.converge(name));
    }
  }
}
