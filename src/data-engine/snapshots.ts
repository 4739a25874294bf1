/**
 * Snapshots as a data engine lists them: the layers of an engine's chain without the head
 * and without deleted-but-kept layers. {@link LocalDataEngine} lists them so, and so does
 * read-only inspection of a single-directory volume (src/volume/directory-inspect.ts).
 *
 * @packageDocumentation
 */
import { toLayer, type LayerInfo } from '../engine/engine.js';
import { callNative } from '../errors.js';
import type { NativeAddon } from '../native/binding.js';
import type { EngineSnapshotInfo } from './data-engine.js';

/**
 * Snapshots as users see them: not the head, not removed layers; each with the name of the
 * nearest visible ancestor as parent.
 *
 * @internal
 */
export function visibleSnapshots(layers: LayerInfo[]): EngineSnapshotInfo[] {
  const byId = new Map(layers.map((l) => [l.id, l]));
  const visible = (l: LayerInfo): boolean => !l.head && !l.removed;
  return layers.filter(visible).map((l) => {
    let parent: string | null = null;
    let p = byId.get(l.parentId);
    // Bounded by the number of layers: a cycle in hostile metadata must not hang us.
    for (let hops = 0; p && hops < layers.length; hops++) {
      if (visible(p)) {
        parent = p.name;
        break;
      }
      p = byId.get(p.parentId);
    }
    return {
      name: l.name,
      id: l.id,
      parent,
      createdMs: l.createdMs,
      labels: { ...l.labels },
      sizeBytes: l.sizeBytes,
      allocatedBytes: l.allocatedBytes,
      userCreated: l.userCreated,
    };
  });
}

/**
 * The snapshots of the replica in directory `path` (replica `id`, for messages), read by
 * opening it alone: no epoch is claimed, nothing is written. Read-only inspection lists a
 * volume's snapshots so, from one RW replica (every RW replica holds the same chain).
 *
 * @internal
 */
export async function replicaSnapshots(addon: NativeAddon, path: string, id: string): Promise<EngineSnapshotInfo[]> {
  const replica = await callNative(() => addon.openReplica(path), `opening replica ${id}`);
  try {
    return visibleSnapshots((await callNative(() => replica.listLayers(), `listing the layers of ${id}`)).map(toLayer));
  } finally {
    await replica.close().catch(() => undefined);
  }
}
