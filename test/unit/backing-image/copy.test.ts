// The controller's choice for one copy (src/backing-image/copy.ts): the target pulls from
// the source directly when it can reach it, else the controller relays; a target that
// answers the pull as unimplemented (an earlier release) is relayed to, once and from then
// on, and every other pull error is the copy's error (never silently relayed).
import { describe, expect, it } from 'vitest';

import { copyBackingImageFile, newCopyState, pullAddress } from '../../../src/backing-image/copy.js';
import type { BackingImageFileInfo, BackingImageFileRef, BackingImagePullOptions, BackingImageWriteOptions, DataEngine } from '../../../src/data-engine/data-engine.js';
import { MooringError } from '../../../src/errors.js';
import { chunks, collect, errorOf, rawImage, sha } from './helpers.js';

const ref: BackingImageFileRef = { name: 'img', uuid: '00000000-0000-4000-8000-00000000000a' };
const info = (state: 'ready' | 'failed' = 'ready'): BackingImageFileInfo => ({
  ...ref,
  state,
  progress: 100,
  message: '',
  sizeBytes: 0,
  receivedBytes: 0,
  checksum: '',
  format: 'raw',
  virtualSizeBytes: 0,
  usedBy: [],
});

/** The file calls of a data engine that a copy uses, recording what was asked. */
class FakeEngine {
  readonly reads: { offset: number | undefined }[] = [];
  readonly pulls: BackingImagePullOptions[] = [];
  readonly writes: { options: BackingImageWriteOptions; bytes: Buffer }[] = [];
  constructor(
    readonly address: string | undefined,
    readonly bytes: Buffer = Buffer.alloc(0),
    readonly pullResult: 'ok' | MooringError | 'absent' = 'ok',
  ) {
    if (pullResult === 'absent') (this as { pullBackingImageFile?: unknown }).pullBackingImageFile = undefined;
  }
  async *readBackingImageFile(_r: BackingImageFileRef, options?: { offset?: number }): AsyncGenerator<Uint8Array> {
    this.reads.push({ offset: options?.offset });
    yield* chunks(this.bytes.subarray(options?.offset ?? 0));
  }
  async writeBackingImageFile(_r: BackingImageFileRef, options: BackingImageWriteOptions, data: AsyncIterable<Uint8Array>): Promise<BackingImageFileInfo> {
    this.writes.push({ options, bytes: await collect(data) });
    return info();
  }
  async pullBackingImageFile(_r: BackingImageFileRef, options: BackingImagePullOptions): Promise<BackingImageFileInfo> {
    this.pulls.push(options);
    if (this.pullResult instanceof MooringError) throw this.pullResult;
    return info();
  }
  get engine(): DataEngine {
    return this as unknown as DataEngine;
  }
}

const unimplemented = (): MooringError =>
  new MooringError('UNSUPPORTED', 'data engine b cannot pull backing image files (an earlier release): relay instead', { details: { unimplemented: 'PullBackingImageFile' } });

describe('pullAddress', () => {
  it('gives the source address when the target can reach it, else null (relay)', () => {
    const e = (a?: string): DataEngine => new FakeEngine(a).engine;
    expect(pullAddress(e('tcp:10.0.0.1:7000'), e('tcp:10.0.0.2:7000'))).toBe('tcp:10.0.0.1:7000');
    expect(pullAddress(e('tcp:10.0.0.1:7000'), e('unix:/run/b.sock'))).toBe('tcp:10.0.0.1:7000');
    // This machine's addresses only to a target on this machine.
    expect(pullAddress(e('unix:/run/a.sock'), e('unix:/run/b.sock'))).toBe('unix:/run/a.sock');
    expect(pullAddress(e('tcp:127.0.0.1:7000'), e('unix:/run/b.sock'))).toBe('tcp:127.0.0.1:7000');
    expect(pullAddress(e('unix:/run/a.sock'), e('tcp:10.0.0.2:7000'))).toBeNull();
    expect(pullAddress(e('tcp:127.0.0.1:7000'), e('tcp:10.0.0.2:7000'))).toBeNull();
    // An in-process data engine has no address.
    expect(pullAddress(e(undefined), e('tcp:10.0.0.2:7000'))).toBeNull();
    expect(pullAddress(e('tcp:10.0.0.1:7000'), e(undefined))).toBeNull();
  });
});

describe('copyBackingImageFile', () => {
  const bytes = rawImage(3 * 256 * 1024);
  const opts = { sizeBytes: bytes.length, offset: 256 * 1024, expectedChecksum: sha(bytes) };

  it('asks the target to pull from the source: no byte passes through this process', async () => {
    const state = newCopyState();
    const src = new FakeEngine('tcp:10.0.0.1:7000', bytes);
    const dst = new FakeEngine('tcp:10.0.0.2:7000');
    const out = await copyBackingImageFile(state, { engine: src.engine, hostId: 'a' }, dst.engine, ref, opts);
    expect(out.path).toBe('pull');
    expect(dst.pulls).toEqual([{ ...opts, source: { address: 'tcp:10.0.0.1:7000', hostId: 'a' } }]);
    expect(src.reads).toEqual([]);
    expect(dst.writes).toEqual([]);
    expect(state.relayedBytes).toBe(0);
  });

  it('relays to a target that answers the pull as unimplemented, and keeps relaying to it', async () => {
    const state = newCopyState();
    const src = new FakeEngine('tcp:10.0.0.1:7000', bytes);
    const dst = new FakeEngine('tcp:10.0.0.2:7000', Buffer.alloc(0), unimplemented());
    for (let i = 0; i < 2; i++) {
      const out = await copyBackingImageFile(state, { engine: src.engine, hostId: 'a' }, dst.engine, ref, opts);
      expect(out.path).toBe('relay');
    }
    // Asked once; the second copy went straight to the relay, resumed at the same offset.
    expect(dst.pulls).toHaveLength(1);
    expect(src.reads).toEqual([{ offset: opts.offset }, { offset: opts.offset }]);
    expect(dst.writes.map((w) => w.options)).toEqual([opts, opts]);
    expect(dst.writes[0]!.bytes.equals(bytes.subarray(opts.offset))).toBe(true);
    expect(state.relayedBytes).toBe(2 * (bytes.length - opts.offset));
    // Another target of the same controller still pulls.
    const other = new FakeEngine('tcp:10.0.0.3:7000');
    expect((await copyBackingImageFile(state, { engine: src.engine, hostId: 'a' }, other.engine, ref, opts)).path).toBe('pull');
  });

  it('relays when the target has no pull call or cannot reach the source', async () => {
    const state = newCopyState();
    const src = new FakeEngine('tcp:10.0.0.1:7000', bytes);
    const noPull = new FakeEngine('tcp:10.0.0.2:7000', Buffer.alloc(0), 'absent');
    expect((await copyBackingImageFile(state, { engine: src.engine, hostId: 'a' }, noPull.engine, ref, opts)).path).toBe('relay');
    const localSrc = new FakeEngine('unix:/run/a.sock', bytes);
    const remoteDst = new FakeEngine('tcp:10.0.0.2:7000');
    expect((await copyBackingImageFile(state, { engine: localSrc.engine, hostId: 'a' }, remoteDst.engine, ref, opts)).path).toBe('relay');
    expect(remoteDst.pulls).toEqual([]);
  });

  it('fails with the pull error otherwise: a refusal, a bad checksum or an UNSUPPORTED file is not relayed', async () => {
    for (const err of [
      new MooringError('UNAUTHENTICATED', 'source data engine a: the cluster secret does not match'),
      new MooringError('CHECKSUM_MISMATCH', 'SHA-512 differs'),
      new MooringError('UNSUPPORTED', 'a zstd image without libzstd'),
    ]) {
      const state = newCopyState();
      const src = new FakeEngine('tcp:10.0.0.1:7000', bytes);
      const dst = new FakeEngine('tcp:10.0.0.2:7000', Buffer.alloc(0), err);
      const e = await errorOf(copyBackingImageFile(state, { engine: src.engine, hostId: 'a' }, dst.engine, ref, opts));
      expect(e.code).toBe(err.code);
      expect(src.reads).toEqual([]);
      expect(dst.writes).toEqual([]);
      // Not remembered as unable to pull: the next copy asks again.
      await errorOf(copyBackingImageFile(state, { engine: src.engine, hostId: 'a' }, dst.engine, ref, opts));
      expect(dst.pulls).toHaveLength(2);
    }
  });
});
