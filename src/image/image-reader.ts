/**
 * Raw and qcow2 images read natively (native/src/image): the bottom, read-only layer a
 * volume can be created on (a backing image). The native reader treats every image as hostile;
 * rules, limits and what is refused: docs/image-reader.md.
 *
 * @packageDocumentation
 */
import type { Extent } from '../engine/engine.js';
import { MooringError, callNative } from '../errors.js';
import type { NativeAddon, NativeExtent, NativeImage, NativeImageFormat, NativeImageLayer } from '../native/binding.js';
import { loadAddon } from '../native/load.js';
import { checkRange, describe } from '../util/validate.js';

/** Image formats read natively. */
export type ImageFormat = NativeImageFormat;

/** One file of an opened image chain (the image first, then its backing images). */
export type ImageLayer = NativeImageLayer;

/** Options of {@link openImage}. */
export interface OpenImageOptions {
  /**
   * How to read the image: `'auto'` (default) recognises qcow2 by its magic and reads
   * anything else as raw, but refuses files that carry another format's magic (VMDK, VHD,
   * VHDX, VDI, QED, LUKS, Parallels) with UNSUPPORTED; `'raw'` reads any file as it is.
   * Backing files of a qcow2 image are read as its header says.
   */
  format?: ImageFormat | 'auto';
  /** The addon to use (tests inject a fake); defaults to the loaded native addon. */
  addon?: NativeAddon;
}

/** Largest single {@link ImageReader.read} (the native cap). */
export const IMAGE_READ_MAX_BYTES = 32 * 1024 * 1024;

const FORMATS: ReadonlySet<string> = new Set(['auto', 'raw', 'qcow2']);

/**
 * Opens an image file read-only, with its backing chain and external data file. Names
 * stored in a qcow2 image are resolved beneath the image's own directory and may not leave
 * it.
 *
 * @param path - the image file
 * @param options - format and addon
 * @throws MooringError NOT_FOUND (a file of the chain is missing), CORRUPT_METADATA (damaged
 *   or hostile metadata, a backing loop or a chain deeper than 16), UNSUPPORTED (encryption,
 *   unknown incompatible features, a foreign format, zstd without libzstd, names that leave
 *   the directory), INVALID_ARGUMENT
 */
export async function openImage(path: string, options: OpenImageOptions = {}): Promise<ImageReader> {
  if (typeof path !== 'string' || path.length === 0) {
    throw new MooringError('INVALID_ARGUMENT', `image path must be a non-empty string (got ${describe(path)})`);
  }
  const format = options.format ?? 'auto';
  if (typeof format !== 'string' || !FORMATS.has(format)) {
    throw new MooringError('INVALID_ARGUMENT', `image format must be 'auto', 'raw' or 'qcow2' (got ${describe(format)})`);
  }
  const addon = options.addon ?? loadAddon();
  const native = await callNative(() => addon.openImage(path, { format }));
  return new ImageReader(native);
}

/**
 * An opened image: its virtual size, format and chain, reads and the allocation map. Calls
 * may run concurrently; {@link ImageReader.close} waits for them.
 */
export class ImageReader {
  /** The image file as opened. */
  readonly path: string;
  /** The format it was read as. */
  readonly format: ImageFormat;
  /**
   * Virtual size in bytes, a multiple of 512, as QEMU reports it: a raw file's size
   * rounded up (the tail reads as zeros), a qcow2 header's size rounded down.
   */
  readonly sizeBytes: number;
  /** The chain, this image first. */
  readonly chain: readonly ImageLayer[];
  readonly #native: NativeImage;
  #closing: Promise<void> | undefined;

  /** @internal Use {@link openImage}. */
  constructor(native: NativeImage) {
    this.#native = native;
    this.path = native.path;
    this.format = native.format;
    this.sizeBytes = native.sizeBytes;
    this.chain = native.chain.map((l) => ({ ...l }));
  }

  /** Whether {@link ImageReader.close} was called. */
  get closed(): boolean {
    return this.#closing !== undefined;
  }

  /**
   * Reads `length` bytes (1..{@link IMAGE_READ_MAX_BYTES}) at `offset`, through the chain.
   *
   * @throws MooringError OUT_OF_RANGE, INVALID_ARGUMENT, CORRUPT_METADATA (a damaged table
   *   entry or compressed cluster met on the way), UNSUPPORTED, IO_ERROR, CLOSED
   */
  async read(offset: number, length: number): Promise<Buffer> {
    this.#checkOpen();
    checkRange(offset, length, this.sizeBytes, IMAGE_READ_MAX_BYTES);
    // Native messages name the image and the structure at fault: no context prefix needed.
    return callNative(() => this.#native.read(offset, length));
  }

  /**
   * The allocation map of `[offset, offset + length)`: extents in order from `offset`.
   * `zero && !hole` is a zero cluster recorded in some layer; `hole` means no layer holds
   * anything there (reads as zeros); neither is data. The answer may stop before the end
   * (at most 65,536 extents, or a scan limit): ask again from where it ends.
   *
   * @throws MooringError OUT_OF_RANGE, INVALID_ARGUMENT, CORRUPT_METADATA, IO_ERROR, CLOSED
   */
  async blockStatus(offset: number, length: number): Promise<Extent[]> {
    this.#checkOpen();
    checkRange(offset, length, this.sizeBytes, Number.MAX_SAFE_INTEGER);
    const native = await callNative(() => this.#native.blockStatus(offset, length));
    return toExtents(offset, native);
  }

  /** Waits for calls in flight and closes every file of the chain. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= callNative(() => this.#native.close());
    return this.#closing;
  }

  #checkOpen(): void {
    if (this.#closing !== undefined) throw new MooringError('CLOSED', `image ${this.path} is closed`);
  }
}

function toExtents(offset: number, native: NativeExtent[]): Extent[] {
  let at = offset;
  return native.map((e) => {
    const out = { offset: at, length: e.length, hole: (e.flags & 1) !== 0, zero: (e.flags & 2) !== 0 };
    at += e.length;
    return out;
  });
}
