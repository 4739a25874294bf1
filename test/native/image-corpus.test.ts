// Replays the image fuzzer's corpus (native/fuzz/corpus) through the real addon, as the
// libFuzzer harness (native/fuzz/image-reader-fuzzer.cc) does: each file is split into the
// files of one directory, opened, mapped and read. Every outcome must be success or a
// MooringError with a known code, never a crash; the seeds, made by qemu-img, must open
// and read. (The fuzz campaign itself needs clang and runs outside CI: native/fuzz/fuzz.sh.)
import { readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { isMooringErrorCode } from '../../src/errors.js';
import { openImage } from '../../src/image/image-reader.js';
import { findPackageRoot } from '../../src/native/load.js';
import { Scratch } from './helpers.js';

// Keep in step with image-reader-fuzzer.cc.
const SEPARATOR = Buffer.from('\n--mooring-fuzz-file--\n');
const FILES = ['image', 'b1', 'b2', 'b3'];
const READ_BYTES = 64 * 1024;

const corpusDir = join(findPackageRoot(), 'native', 'fuzz', 'corpus');

/** Splits one corpus input into the files of its directory, as the harness does. */
function split(input: Buffer): Buffer[] {
  const parts: Buffer[] = [];
  let start = 0;
  for (let i = 0; i < FILES.length && start <= input.length; i++) {
    let end = input.length;
    if (i + 1 < FILES.length) {
      const hit = input.indexOf(SEPARATOR, start);
      if (hit >= 0) end = hit;
    }
    parts.push(input.subarray(start, end));
    start = end === input.length ? input.length + 1 : end + SEPARATOR.length;
  }
  return parts;
}

/** 'OK' or the error code of opening, mapping and reading one input. */
async function replay(dir: string, input: Buffer): Promise<string> {
  for (const f of FILES) rmSync(join(dir, f), { force: true });
  split(input).forEach((part, i) => writeFileSync(join(dir, FILES[i]!), part));
  let img;
  try {
    img = await openImage(join(dir, 'image'));
  } catch (err) {
    return String((err as { code?: unknown }).code);
  }
  try {
    if (img.sizeBytes === 0) return 'OK';
    let failure = 'OK';
    const starts = [0];
    try {
      const ext = await img.blockStatus(0, img.sizeBytes);
      for (const e of ext.slice(1, 6)) starts.push(e.offset);
    } catch (err) {
      failure = String((err as { code?: unknown }).code);
    }
    starts.push(Math.max(0, img.sizeBytes - READ_BYTES));
    for (const off of starts) {
      try {
        await img.read(off, Math.min(READ_BYTES, img.sizeBytes - off));
      } catch (err) {
        failure = String((err as { code?: unknown }).code);
      }
    }
    return failure;
  } finally {
    await img.close();
  }
}

describe('image fuzz corpus replay', () => {
  let scratch: Scratch;
  let dir: string;
  beforeAll(() => {
    scratch = new Scratch('mooring-image-corpus-');
    dir = scratch.dir('d');
  });
  afterAll(() => scratch.cleanup());

  const files = readdirSync(corpusDir).sort();

  it('the corpus is in the repository and holds the qemu-img seeds', () => {
    expect(files.filter((f) => f.startsWith('seed-')).length).toBeGreaterThanOrEqual(12);
    expect(files.length).toBeGreaterThan(50);
  });

  it('every corpus input ends in success or a coded error', async () => {
    const outcomes = new Map<string, number>();
    for (const f of files) {
      const code = await replay(dir, readFileSync(join(corpusDir, f)));
      if (code !== 'OK' && !isMooringErrorCode(code)) throw new Error(`${f}: uncoded failure ${code}`);
      if (f.startsWith('seed-') && code !== 'OK') throw new Error(`seed ${f} did not open and read: ${code}`);
      outcomes.set(code, (outcomes.get(code) ?? 0) + 1);
    }
    // The corpus exercises both sides: images that read, and hostile ones that are refused.
    expect(outcomes.get('OK') ?? 0).toBeGreaterThan(0);
    expect(outcomes.get('CORRUPT_METADATA') ?? 0).toBeGreaterThan(0);
  });
});
