/**
 * Upgrades the control plane's records written by an earlier release, once, when a control
 * plane opens over the store. Idempotent.
 *
 * @packageDocumentation
 */
import { checkParameters, type AttachmentTicket } from '../attachment/attachment-ticket.js';
import { CLUSTER_SCHEMA_VERSION, KIND, NO_FRONTEND_CHOSEN, parseVolumeRecord, type AttachmentRecord, type VolumeRecord } from './cluster-records.js';
import type { ControlState } from './control-state.js';

/**
 * Schema 1 (before tickets): a volume with an engine record gets an `api` ticket for that
 * host (it was attached by the embedder's call), so it stays attached; every volume gets an
 * access mode (rwo) and an empty attachment record. Returns how many volumes it upgraded.
 */
export async function upgradeStore(state: ControlState): Promise<number> {
  const { store } = state;
  let upgraded = 0;
  for (const d of await store.list<unknown>(KIND.volume)) {
    const raw = d.value as { schema?: unknown };
    if (typeof raw === 'object' && raw !== null && typeof raw.schema === 'number' && raw.schema >= 2) continue;
    const vol = parseVolumeRecord(d.value, d.key);
    const eng = await state.engineRecord(vol.name);
    const tickets: AttachmentTicket[] = eng
      ? [{ id: `api-${eng.hostId}`, type: 'api', hostId: eng.hostId, parameters: checkParameters({ nbd: eng.nbd }), generation: 1 }]
      : [];
    if (!(await store.get(KIND.attachment, vol.name))) {
      const att: AttachmentRecord = { schema: CLUSTER_SCHEMA_VERSION, volume: vol.name, tickets, statuses: [] };
      await store.put(KIND.attachment, vol.name, att, { expectedVersion: 0 });
    }
    if (eng) await store.put(KIND.engine, vol.name, { ...eng, schema: CLUSTER_SCHEMA_VERSION, frontendDisabled: false });
    const next: VolumeRecord = { ...vol, schema: CLUSTER_SCHEMA_VERSION, accessMode: 'rwo', desiredHost: eng?.hostId ?? null, migrationHost: null, frontend: { disabled: false, nbd: eng?.nbd ?? null }, migrationFrontend: { ...NO_FRONTEND_CHOSEN } };
    await store.put(KIND.volume, vol.name, next, { expectedVersion: d.version });
    upgraded++;
  }
  return upgraded;
}
