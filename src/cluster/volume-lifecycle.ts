/**
 * Creating, deleting and cloning volumes: where their replicas go (one per host, the least
 * loaded reachable hosts unless named), the records that describe them, and a backing image's
 * file delivered to each replica's host before its replica is made over it.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';

import type { BackingImageController } from '../backing-image/backing-image-controller.js';
import type { ReplicaBackingImage } from '../data-engine/data-engine.js';
import { MooringError, toMooringError } from '../errors.js';
import { BLOCK_SIZE_BYTES } from '../util/limits.js';
import { checkName, checkReplicaCount, checkVolumeSize, describe } from '../util/validate.js';
import type { AttachmentController } from './attachment-controller.js';
import { KIND, emptyAttachmentRecord, newVolumeRecord, type ReplicaRecord } from './cluster-records.js';
import type { VolumeCloneOptions, VolumeCreateOptions } from '../volume/volume.js';
import type { ControlState } from './control-state.js';

/** Replicas of a new volume when the caller does not say (fewer when fewer hosts are offered). */
export const DEFAULT_REPLICA_COUNT = 3;

/** See the module comment. */
export class VolumeLifecycle {
  constructor(
    private readonly state: ControlState,
    private readonly attachment: AttachmentController,
    private readonly images: Pick<BackingImageController, 'waitReady' | 'acquire'>,
  ) {}

  /**
   * Creates a volume: one empty replica on each of `replicas` distinct hosts, recorded in
   * the store. With a backing image, it waits for the image's first file, then for a copy on
   * each replica host, then creates the replicas over it. A failure removes what was made.
   *
   * @throws MooringError INVALID_ARGUMENT, ALREADY_EXISTS, UNAVAILABLE, NO_SPACE, NOT_FOUND (no such backing image)
   */
  async create(options: VolumeCreateOptions): Promise<void> {
    const state = this.state;
    state.checkLeader();
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `create options must be an object (got ${describe(options)})`);
    const name = checkName('volume name', options.name);
    const imageName = options.backingImage === undefined ? null : checkName('backing image name', options.backingImage);
    let sizeBytes: number;
    if (imageName !== null) {
      const img = await this.images.waitReady(imageName, undefined);
      const minBytes = Math.ceil(img.virtualSizeBytes / BLOCK_SIZE_BYTES) * BLOCK_SIZE_BYTES;
      sizeBytes = options.sizeBytes === undefined ? minBytes : checkVolumeSize(options.sizeBytes);
      if (sizeBytes < img.virtualSizeBytes) throw new MooringError('INVALID_ARGUMENT', `volume ${name} (${sizeBytes} bytes) is smaller than its backing image ${imageName} (${img.virtualSizeBytes} bytes)`, { details: { sizeBytes, virtualSizeBytes: img.virtualSizeBytes } });
    } else {
      sizeBytes = checkVolumeSize(options.sizeBytes);
    }
    // Default: three replicas, or one per host when fewer hosts are offered (the embedded default has one).
    const count = checkReplicaCount(options.replicas ?? Math.max(1, Math.min(DEFAULT_REPLICA_COUNT, state.hosts.ids.length)));
    const accessMode = options.accessMode ?? 'rwo';
    if (accessMode !== 'rwo' && accessMode !== 'migratable') throw new MooringError('INVALID_ARGUMENT', `accessMode must be 'rwo' or 'migratable' (got ${describe(accessMode)})`);
    if (await state.store.get(KIND.volume, name)) throw new MooringError('ALREADY_EXISTS', `volume ${name} exists already`);
    const hosts = options.hosts ?? (await state.pickHosts(count, new Set()));
    if (hosts.length !== count || new Set(hosts).size !== count) {
      throw new MooringError('INVALID_ARGUMENT', `volume ${name} needs ${count} distinct hosts (got ${hosts.join(', ') || 'none'})`);
    }
    for (const h of hosts) state.hosts.engineOf(h);
    const vol = newVolumeRecord({ name, uuid: randomUUID(), sizeBytes, replicaCount: count, createdMs: Date.now(), accessMode, backingImage: imageName });
    // Reserve the name first (compare-and-set), so two creators cannot both proceed.
    await state.store.put(KIND.volume, name, vol, { expectedVersion: 0 });
    await state.store.put(KIND.attachment, name, emptyAttachmentRecord(name));
    const made: ReplicaRecord[] = [];
    let lease: { backingImage: ReplicaBackingImage; release: () => void } | null = null;
    try {
      // The volume's record names the image already, so the image cannot be deleted meanwhile.
      if (imageName !== null) lease = await this.images.acquire(imageName, hosts);
      for (let i = 0; i < count; i++) {
        const rec = state.newReplicaRecord(name, `r${i}`, hosts[i]!);
        if (lease) await state.hosts.engineOf(rec.hostId).createReplica(rec.name, sizeBytes, { backingImage: lease.backingImage });
        else await state.hosts.engineOf(rec.hostId).createReplica(rec.name, sizeBytes);
        made.push(rec);
        await state.store.put(KIND.replica, rec.name, rec, { expectedVersion: 0 });
      }
      lease?.release();
    } catch (err) {
      lease?.release();
      for (const r of made) {
        await state.hosts.engineOf(r.hostId).deleteReplica(r.name).catch(() => undefined);
        await state.store.delete(KIND.replica, r.name).catch(() => undefined);
      }
      await state.store.delete(KIND.attachment, name).catch(() => undefined);
      await state.store.delete(KIND.volume, name).catch(() => undefined);
      throw toMooringError(err, `creating volume ${name}`);
    }
  }

  /**
   * Deletes a detached volume and its replicas (on hosts that can be reached; the records
   * of the others are kept so a later delete finishes the job). Caller holds the volume's turn.
   *
   * @throws MooringError NOT_FOUND, BUSY (attached), UNAVAILABLE (some replicas left)
   */
  async delete(name: string): Promise<void> {
    const state = this.state;
    await state.volume(name);
    if (await state.engineRecord(name)) throw new MooringError('BUSY', `volume ${name} is attached; detach it first`);
    const tickets = (await state.attachment(name)).rec.tickets;
    if (tickets.length > 0) throw new MooringError('BUSY', `volume ${name} has ${tickets.length} attachment ticket(s) (${tickets.map((t) => t.id).join(', ')}); detach it first`);
    let left = 0;
    for (const r of await state.replicas(name)) {
      try {
        await state.hosts.engineOf(r.hostId).deleteReplica(r.name);
      } catch (err) {
        const e = toMooringError(err);
        if (e.code !== 'NOT_FOUND') {
          left++;
          state.events.cluster('warning', toMooringError(err, `deleting replica ${r.name} of ${name} on ${r.hostId}`));
          continue;
        }
      }
      await state.store.delete(KIND.replica, r.name);
    }
    if (left > 0) throw new MooringError('UNAVAILABLE', `volume ${name}: ${left} replica(s) could not be deleted; delete again when their hosts are back`);
    await state.store.delete(KIND.attachment, name);
    await state.store.delete(KIND.volume, name);
  }

  /**
   * A new volume with the size and backing image of `from`, written from its snapshot
   * through the new volume's own engine: both attach themselves on one host (the source's
   * attached host, or its first reachable replica host; frontends off unless the source is
   * attached) and detach again. A failed copy deletes the new volume.
   *
   * @throws MooringError NOT_FOUND (volume or snapshot), ALREADY_EXISTS, UNAVAILABLE, INVALID_ARGUMENT
   */
  async clone(from: string, options: VolumeCloneOptions): Promise<{ name: string; copiedBytes: number }> {
    const { state, attachment } = this;
    state.checkLeader();
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `clone options must be an object (got ${describe(options)})`);
    const src = await state.volume(from);
    checkName('snapshot name', options.snapshot);
    const host = await attachment.operationHost(src.name, undefined);
    const { snapshot, ...create } = options;
    await this.create({ ...create, sizeBytes: src.sizeBytes, ...(src.backingImage ? { backingImage: src.backingImage } : {}) });
    const name = create.name;
    try {
      const copied = await attachment.withTicket(from, 'volume-clone', host, async () =>
        attachment.withTicket(name, 'volume-clone', host, async (writer) => state.hosts.engineOf(writer).copySnapshot(from, snapshot, name)),
      );
      return { name, copiedBytes: copied.copiedBytes };
    } catch (err) {
      await state.serial(name, () => this.delete(name)).catch((e: unknown) => state.events.cluster('warning', toMooringError(e, `removing the failed clone ${name}`)));
      throw toMooringError(err, `cloning ${from}@${snapshot} into ${name}`);
    }
  }
}
