// The guest lives beside the benchmark, which migrates it too; the tests cache its kernel
// and initramfs under node_modules/.cache/mooring-guest and fail loudly without QEMU.
import { join } from 'node:path';
import { guestImage as buildGuestImage, type GuestImage } from '../../../src/bench/guest.js';
import { repoRoot, requireTool } from './tools.js';

export { Guest, verifySeqBlocks, writerScript, type GuestImage, type GuestOptions } from '../../../src/bench/guest.js';

/** The guest's kernel and an initramfs running `script` (see src/bench/guest.ts). */
export function guestImage(script: string): Promise<GuestImage> {
  requireTool('qemu-system-x86_64');
  return buildGuestImage(script, join(repoRoot, 'node_modules', '.cache', 'mooring-guest'));
}
