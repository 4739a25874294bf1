/**
 * One copy of a backing image file from a ready disk to another (docs/backing-images.md,
 * "Delivery"): the target data engine pulls it from the source directly when it can
 * (`pullBackingImageFile`: data engine to data engine, the bytes never pass through this
 * process), else this process relays the source's read stream into the target's write.
 * A target of an earlier release answers the pull UNSUPPORTED (gRPC UNIMPLEMENTED) without
 * changing anything: it is remembered and relayed to from then on.
 */
import { MooringError } from '../errors.js';
import { isLoopbackHost } from '../data-engine/addresses.js';
import type { BackingImageFileInfo, BackingImageFileRef, BackingImageWriteOptions, DataEngine } from '../data-engine/data-engine.js';
import { parseNbdAddress } from '../nbd/nbd-address.js';

/** How a copy went. */
export type CopyPath = 'pull' | 'relay';

/** What the copies of one controller share. */
export interface CopyState {
  /** Data engine clients that answered the pull UNSUPPORTED (an earlier release). */
  pullUnsupported: WeakSet<DataEngine>;
  /** Bytes relayed through this process (0 while every copy is pulled directly). */
  relayedBytes: number;
}

export function newCopyState(): CopyState {
  return { pullUnsupported: new WeakSet(), relayedBytes: 0 };
}

/**
 * The address the target can reach the source's gRPC server at, or null (relay). The
 * controller knows a data engine's address only from its client (`RemoteDataEngine.address`);
 * a `unix:` or loopback TCP address is this machine's, so it is given only to a target that
 * is on this machine too (reached the same way).
 */
export function pullAddress(source: DataEngine, target: DataEngine): string | null {
  const src = addressOf(source);
  const dst = addressOf(target);
  if (src === null || dst === null) return null;
  return isLocal(src) && !isLocal(dst) ? null : src;
}

/** Copies `ref` from `source` (host `sourceHostId`, a ready file) to `target`, resuming at `options.offset`. */
export async function copyBackingImageFile(
  state: CopyState,
  source: { engine: DataEngine; hostId: string },
  target: DataEngine,
  ref: BackingImageFileRef,
  options: BackingImageWriteOptions,
): Promise<{ info: BackingImageFileInfo; path: CopyPath }> {
  const address = pullAddress(source.engine, target);
  if (address !== null && target.pullBackingImageFile && !state.pullUnsupported.has(target)) {
    try {
      return { info: await target.pullBackingImageFile(ref, { ...options, source: { address, hostId: source.hostId } }), path: 'pull' };
    } catch (err) {
      if (!isPullUnimplemented(err)) throw err;
      state.pullUnsupported.add(target);
    }
  }
  const data = source.engine.readBackingImageFile(ref, { offset: options.offset ?? 0 });
  return { info: await target.writeBackingImageFile(ref, options, counted(data, state)), path: 'relay' };
}

async function* counted(data: AsyncIterable<Uint8Array>, state: CopyState): AsyncGenerator<Uint8Array> {
  for await (const chunk of data) {
    state.relayedBytes += chunk.length;
    yield chunk;
  }
}

/** An UNSUPPORTED for the call itself (the target's release has none), not one its file raised. */
export function isPullUnimplemented(err: unknown): boolean {
  return err instanceof MooringError && err.code === 'UNSUPPORTED' && err.details?.unimplemented === 'PullBackingImageFile';
}

function addressOf(engine: DataEngine): string | null {
  const a = (engine as { address?: unknown }).address;
  if (typeof a !== 'string') return null;
  try {
    parseNbdAddress(a);
    return a;
  } catch {
    return null;
  }
}

function isLocal(address: string): boolean {
  const a = parseNbdAddress(address);
  return a.kind === 'unix' || isLoopbackHost(a.host);
}
