// The attach/detach reconciler's rules (seed 002 and seed 000), one case per rule, and a
// property check over generated inputs: it never asks for two writers, attaches only from
// detached, and never reports a ticket satisfied that reality does not satisfy.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

import { decideAttachment, type AttachmentInput } from '../../../src/attachment/attachment-reconciler.js';
import { ATTACHER_TYPES, frontendCompatible, type AttacherType, type AttachmentTicket, type Frontend } from '../../../src/attachment/attachment-ticket.js';

const OFF: Frontend = { disabled: true, nbd: null };
const ON: Frontend = { disabled: false, nbd: null };

function ticket(id: string, type: AttacherType, hostId: string, disableFrontend: 'true' | 'false' | 'any' = 'false', nbd: string | null = null): AttachmentTicket {
  return { id, type, hostId, parameters: { disableFrontend, lastAttachedBy: null, nbd }, generation: 1 };
}

function input(over: Partial<AttachmentInput>): AttachmentInput {
  return {
    accessMode: 'rwo',
    desiredHost: null,
    migrationHost: null,
    frontend: ON,
    migrationFrontend: ON,
    attachedHost: null,
    attachedFrontend: null,
    migrationTargetReady: false,
    tickets: [],
    ...over,
  };
}

describe('decideAttachment', () => {
  it('attaches a detached volume to the best ticket: priority, then the shorter id, then the id', () => {
    const d = decideAttachment(input({ tickets: [ticket('snap-1', 'snapshot', 'c', 'true'), ticket('vm-x', 'workload', 'b'), ticket('api-a', 'api', 'a')] }));
    expect(d.desiredHost).toBe('a');
    expect(decideAttachment(input({ tickets: [ticket('vm-long', 'workload', 'a'), ticket('vm-b', 'workload', 'b')] })).desiredHost).toBe('b');
    expect(decideAttachment(input({ tickets: [ticket('vm-b', 'workload', 'b'), ticket('vm-a', 'workload', 'a')] })).desiredHost).toBe('a');
    // Restoring data outranks the user's own call.
    expect(decideAttachment(input({ tickets: [ticket('api-a', 'api', 'a'), ticket('r', 'volume-expansion', 'c', 'true')] }))).toMatchObject({ desiredHost: 'c', frontend: OFF });
  });

  it('ranks a stored ticket of a type this release dropped (share-manager) with the operations', () => {
    const old = ticket('old', 'share-manager' as AttacherType, 'b', 'true');
    // Below a workload, with the operations (then by id: 'old' is shorter than 'snap1').
    expect(decideAttachment(input({ tickets: [old, ticket('w', 'workload', 'a')] }))).toMatchObject({ desiredHost: 'a' });
    expect(decideAttachment(input({ tickets: [ticket('snap1', 'snapshot', 'c', 'true'), old] }))).toMatchObject({ desiredHost: 'b' });
    expect(ATTACHER_TYPES).not.toContain('share-manager');
    expect(ATTACHER_TYPES).not.toContain('volume-restore');
  });

  it('attaches only from detached: while an engine still runs, new tickets wait', () => {
    const d = decideAttachment(input({ desiredHost: null, attachedHost: 'a', attachedFrontend: ON, tickets: [ticket('api-b', 'api', 'b')] }));
    expect(d.desiredHost).toBeNull();
    expect(d.statuses[0]).toMatchObject({ satisfied: false, conditions: [{ reason: 'WaitingForDetach' }] });
  });

  it('detaches when no ticket asks for the desired host, and keeps an RWO volume where it is for other hosts', () => {
    expect(decideAttachment(input({ desiredHost: 'a', attachedHost: 'a', attachedFrontend: ON, tickets: [] })).desiredHost).toBeNull();
    const d = decideAttachment(input({ desiredHost: 'a', attachedHost: 'a', attachedFrontend: ON, tickets: [ticket('api-a', 'api', 'a'), ticket('api-b', 'api', 'b')] }));
    expect(d).toMatchObject({ desiredHost: 'a', migrationHost: null });
    expect(d.statuses.find((s) => s.id === 'api-b')).toMatchObject({ satisfied: false });
    expect(d.statuses.find((s) => s.id === 'api-a')).toMatchObject({ satisfied: true, conditions: [{ reason: 'Attached' }] });
  });

  it('reports incompatible parameters, and re-attaches once no ticket accepts the running frontend', () => {
    const both = [ticket('snap-1', 'snapshot', 'a', 'true'), ticket('api-a', 'api', 'a', 'false', 'unix:/run/a.sock')];
    const d = decideAttachment(input({ desiredHost: 'a', attachedHost: 'a', attachedFrontend: OFF, frontend: OFF, tickets: both }));
    expect(d.desiredHost).toBe('a'); // the snapshot still uses it
    expect(d.statuses.find((s) => s.id === 'api-a')).toMatchObject({ satisfied: false, conditions: [{ reason: 'AttachedWithIncompatibleParameters' }] });
    const after = decideAttachment(input({ desiredHost: 'a', attachedHost: 'a', attachedFrontend: OFF, frontend: OFF, tickets: [both[1]!] }));
    expect(after.desiredHost).toBeNull();
    const again = decideAttachment(input({ tickets: [both[1]!] }));
    expect(again).toMatchObject({ desiredHost: 'a', frontend: { disabled: false, nbd: 'unix:/run/a.sock' } });
  });

  it('starts a migration for a migratable volume, confirms when the source ticket goes, rolls back when the target ticket goes', () => {
    const a = ticket('vm-a', 'workload', 'a');
    const b = ticket('vm-b', 'workload', 'b', 'false', 'unix:/run/b.sock');
    const attached = { accessMode: 'migratable' as const, desiredHost: 'a', attachedHost: 'a', attachedFrontend: ON };
    const start = decideAttachment(input({ ...attached, tickets: [a, b] }));
    expect(start).toMatchObject({ desiredHost: 'a', migrationHost: 'b', migrationFrontend: { disabled: false, nbd: 'unix:/run/b.sock' } });
    const ready = decideAttachment(input({ ...attached, migrationHost: 'b', migrationFrontend: start.migrationFrontend, migrationTargetReady: true, tickets: [a, b] }));
    expect(ready.statuses.map((s) => [s.id, s.satisfied])).toEqual([['vm-a', true], ['vm-b', true]]);
    const confirm = decideAttachment(input({ ...attached, migrationHost: 'b', migrationFrontend: start.migrationFrontend, migrationTargetReady: true, tickets: [b] }));
    expect(confirm).toMatchObject({ desiredHost: 'b', migrationHost: null, frontend: start.migrationFrontend });
    const rollback = decideAttachment(input({ ...attached, migrationHost: 'b', migrationTargetReady: true, tickets: [a] }));
    expect(rollback).toMatchObject({ desiredHost: 'a', migrationHost: null });
    // Operations and frontend-less attachments never migrate a volume.
    expect(decideAttachment(input({ ...attached, tickets: [a, ticket('snap', 'snapshot', 'b', 'true')] })).migrationHost).toBeNull();
    expect(decideAttachment(input({ ...attached, attachedFrontend: OFF, frontend: OFF, tickets: [ticket('x', 'volume-clone', 'a', 'true'), b] })).migrationHost).toBeNull();
  });

  it('holds its invariants over generated inputs', () => {
    const hosts = ['a', 'b', 'c'];
    const host = fc.constantFrom(...hosts);
    const frontend = fc.oneof(fc.constant(OFF), fc.constant(ON), fc.constant<Frontend>({ disabled: false, nbd: 'unix:/x' }));
    const tk = fc.record({
      id: fc.stringMatching(/^[a-z]{1,6}$/),
      type: fc.constantFrom(...ATTACHER_TYPES),
      hostId: host,
      disable: fc.constantFrom('true', 'false', 'any') as fc.Arbitrary<'true' | 'false' | 'any'>,
      nbd: fc.constantFrom(null, 'unix:/x', 'unix:/y'),
    });
    fc.assert(
      fc.property(
        fc.record({
          accessMode: fc.constantFrom('rwo', 'migratable') as fc.Arbitrary<'rwo' | 'migratable'>,
          desiredHost: fc.option(host, { nil: null }),
          migrationHost: fc.option(host, { nil: null }),
          attachedHost: fc.option(host, { nil: null }),
          attachedFrontend: frontend,
          frontend,
          migrationFrontend: frontend,
          migrationTargetReady: fc.boolean(),
          tickets: fc.uniqueArray(tk, { selector: (t) => t.id, maxLength: 6 }),
        }),
        (g) => {
          const tickets = g.tickets.map((t) => ticket(t.id, t.type, t.hostId, t.disable, t.disable === 'true' ? null : t.nbd));
          const inp = input({ ...g, attachedFrontend: g.attachedHost ? g.attachedFrontend : null, tickets });
          const d = decideAttachment(inp);
          // One writer: a migration target is never the desired host itself, and needs one.
          if (d.migrationHost !== null) {
            expect(d.desiredHost).not.toBeNull();
            expect(d.migrationHost).not.toBe(d.desiredHost);
          }
          // Attach only from detached: a new desired host while another engine runs is never chosen.
          if (inp.desiredHost === null && inp.attachedHost !== null && d.desiredHost !== null) expect(d.desiredHost).toBe(inp.migrationHost ?? inp.attachedHost);
          // A desired host is always asked for by some ticket.
          if (d.desiredHost !== null) expect(tickets.some((t) => t.hostId === d.desiredHost)).toBe(true);
          // Statuses are truthful: satisfied only where an engine that serves the ticket runs.
          for (const st of d.statuses) {
            const t = tickets.find((x) => x.id === st.id)!;
            expect(st.generation).toBe(t.generation);
            if (!st.satisfied) continue;
            const onAttached = t.hostId === inp.attachedHost && frontendCompatible(t.parameters, inp.attachedFrontend!);
            const onTarget = t.hostId === inp.migrationHost && inp.migrationTargetReady && d.migrationHost === inp.migrationHost;
            expect(onAttached || onTarget).toBe(true);
          }
          expect(d.statuses).toHaveLength(tickets.length);
        },
      ),
      { numRuns: 3000 },
    );
  });
});
