// Backing image files served over the replica protocol (docs/replica-protocol.md, "Backing
// image files"; issue 16): a replica server given a backing-files root serves
// <root>/<key>/image read-only to a client whose HELLO carries the backing-file flag, with
// the same authentication as replicas. Through the real addon:
// - openReplica({..., backingFile: true}) reads the file back byte for byte (a size that is
//   not a multiple of 4 KiB, reads at its end), with the cluster secret;
// - writes and every replica call are refused and change nothing;
// - a file still being received (image.part only), a missing key, a key resolving outside the
//   root (a symlink) and a wrong secret are refused with their codes;
// - a raw client: the flag to a server without a backing-files root is PROTOCOL_ERROR (what an
//   older server answers), HELLO answers the size, a READ past the end is an error reply;
// - a source that stops answering mid-file (a proxy swallowing its replies) fails the read
//   UNAVAILABLE after the endpoint's I/O timeout (the pull's stall timeout), not a hang;
// - an engine refuses an endpoint that names a backing image file.
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { NativeRemoteBackingFile, NativeRemoteReplica, NativeReplicaServer } from '../../src/native/binding.js';
import { addon, codeOf, engineOptions, MiB, nextEpoch, pattern, Scratch } from './helpers.js';
import { CodeNum, FrameProxy, Op, RawClient, rawAuthenticate } from './remote-helpers.js';

const KEY = 'base-00000000-0000-4000-8000-0000000000f1';
const PART_KEY = 'part-00000000-0000-4000-8000-0000000000f2';
const EVIL_KEY = 'evil-00000000-0000-4000-8000-0000000000f3';
// Not a multiple of 4 KiB, and more than two of the client's largest reads.
const SIZE = 9 * MiB + 1234;
const BACKING_FILE_FLAG = 64;

describe('backing image files over the replica protocol', () => {
  let s: Scratch;
  let server: NativeReplicaServer;
  let bare: NativeReplicaServer;
  const secret = randomBytes(32);
  const data = pattern(16, SIZE);
  const file = (extra: Partial<NativeRemoteBackingFile> = {}): NativeRemoteBackingFile => ({
    host: '127.0.0.1',
    port: server.port,
    name: KEY,
    backingFile: true,
    clusterSecret: secret,
    ...extra,
  });

  beforeAll(async () => {
    s = new Scratch('mooring-backing-file-read-');
    const files = s.dir('backing-images');
    mkdirSync(join(files, KEY));
    writeFileSync(join(files, KEY, 'image'), data);
    mkdirSync(join(files, PART_KEY));
    writeFileSync(join(files, PART_KEY, 'image.part'), pattern(17, MiB));
    // A key whose directory is a symlink to a file outside the root.
    mkdirSync(s.dir('outside', 'd'), { recursive: true });
    writeFileSync(join(s.path('outside', 'd'), 'image'), 'secret bytes outside the root');
    symlinkSync(s.path('outside', 'd'), join(files, EVIL_KEY));
    server = await addon().startReplicaServer({ root: s.dir('replicas'), backingFilesRoot: files, clusterSecret: secret });
    bare = await addon().startReplicaServer({ root: s.dir('replicas-bare') });
  });
  afterAll(async () => {
    await Promise.allSettled([server.close(), bare.close()]);
    s.cleanup();
  });

  it('reads a ready file back byte for byte, its size from the HELLO, reads at its end included', async () => {
    const f = await addon().openReplica(file());
    try {
      expect(f.sizeBytes).toBe(SIZE);
      const parts: Buffer[] = [];
      for (let at = 0; at < SIZE; at += 4 * MiB) parts.push(await f.read(at, Math.min(4 * MiB, SIZE - at)));
      expect(createHash('sha256').update(Buffer.concat(parts)).digest('hex')).toBe(createHash('sha256').update(data).digest('hex'));
      // Unaligned reads, the last byte included; a read past the end is refused before it is sent.
      expect((await f.read(SIZE - 7, 7)).equals(data.subarray(SIZE - 7))).toBe(true);
      expect((await f.read(12345, 100)).equals(data.subarray(12345, 12445))).toBe(true);
      expect(await codeOf(f.read(SIZE - 1, 2))).toBe('OUT_OF_RANGE');
      // Writes are refused, and the file is unchanged.
      const write = await f.write(0, 0, Buffer.alloc(4096, 1)).then(
        () => null,
        (e: unknown) => e as { code: string; message: string },
      );
      expect(write?.code).toBe('IO_ERROR');
      expect(write?.message).toMatch(/Read-only file system/);
      expect(await codeOf(f.claimEpoch(nextEpoch()))).toBe('UNSUPPORTED');
      expect(await codeOf(f.listLayers())).toBe('UNSUPPORTED');
    } finally {
      await f.close();
    }
    expect(readFileSync(join(s.path('backing-images'), KEY, 'image')).equals(data)).toBe(true);
  });

  it('refuses a file still being received, a missing key, a key outside the root, a bad key and a wrong secret', async () => {
    expect(await codeOf(addon().openReplica(file({ name: PART_KEY })))).toBe('NOT_FOUND');
    expect(await codeOf(addon().openReplica(file({ name: 'none-00000000-0000-4000-8000-000000000000' })))).toBe('NOT_FOUND');
    expect(await codeOf(addon().openReplica(file({ name: EVIL_KEY })))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().openReplica(file({ name: '../replicas' })))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().openReplica(file({ name: 'x'.repeat(256) })))).toBe('INVALID_ARGUMENT');
    expect(await codeOf(addon().openReplica(file({ clusterSecret: randomBytes(32) })))).toBe('UNAUTHENTICATED');
    // A server without a backing-files root does not know the flag.
    expect(await codeOf(addon().openReplica(file({ port: bare.port, clusterSecret: undefined })))).toBe('PROTOCOL_ERROR');
  });

  it('speaks the wire as documented: HELLO with the flag answers the size; READ past the end and WRITE are error replies', async () => {
    const c = await RawClient.connect(server.port);
    try {
      expect((await rawAuthenticate(c, secret)).reply?.code).toBe(CodeNum.OK);
      c.send({ op: Op.HELLO, seq: 0, flags: BACKING_FILE_FLAG, payload: Buffer.from(KEY) });
      const hello = await c.next();
      expect(hello?.code).toBe(CodeNum.OK);
      expect(hello?.value).toBe(BigInt(SIZE));
      expect(hello!.payload.readBigUInt64LE(8) & 16n, 'the backing-files feature bit').toBe(16n);
      c.send({ op: Op.READ, seq: 1, offset: SIZE - 100, length: 100 });
      const r1 = await c.reply(1);
      expect(r1?.code).toBe(CodeNum.OK);
      expect(r1!.payload.equals(data.subarray(SIZE - 100))).toBe(true);
      c.send({ op: Op.READ, seq: 2, offset: SIZE - 100, length: 101 });
      expect((await c.reply(2))?.code).not.toBe(CodeNum.OK);
      c.send({ op: Op.WRITE, seq: 3, epoch: 1, offset: 0, length: 4096, payload: Buffer.alloc(4096, 7) });
      expect((await c.reply(3))?.code).not.toBe(CodeNum.OK);
      c.send({ op: Op.PING, seq: 4 });
      expect((await c.reply(4))?.code, 'the connection still serves').toBe(CodeNum.OK);
    } finally {
      c.close();
    }
    expect(readFileSync(join(s.path('backing-images'), KEY, 'image')).equals(data)).toBe(true);
    const raw = await RawClient.connect(bare.port);
    try {
      raw.send({ op: Op.HELLO, seq: 0, flags: BACKING_FILE_FLAG, payload: Buffer.from(KEY) });
      expect((await raw.next())?.code).toBe(CodeNum.PROTOCOL_ERROR);
    } finally {
      raw.close();
    }
  });

  it('a source that stops answering mid-file fails the read UNAVAILABLE after the I/O timeout', async () => {
    const proxy = new FrameProxy(server.port);
    await proxy.start();
    const f = await addon().openReplica(file({ port: proxy.port, ioTimeoutMs: 500 }));
    try {
      expect((await f.read(0, 4 * MiB)).equals(data.subarray(0, 4 * MiB))).toBe(true);
      proxy.mode = 'blackhole';
      const started = Date.now();
      const err = await f.read(4 * MiB, 4 * MiB).then(
        () => null,
        (e: unknown) => e as { code: string; message: string },
      );
      expect(err?.code, err?.message).toBe('UNAVAILABLE');
      expect(Date.now() - started, 'not before the timeout').toBeGreaterThanOrEqual(450);
    } finally {
      await f.close();
      await proxy.close();
    }
  });

  it('an engine refuses an endpoint that names a backing image file', async () => {
    const endpoint = file() as unknown as NativeRemoteReplica;
    const err = await addon()
      .openEngine(engineOptions({ replicas: [endpoint] }))
      .then(
        () => null,
        (e: unknown) => e as { code: string; message: string },
      );
    expect(err?.code).toBe('INVALID_ARGUMENT');
    expect(err?.message).toContain('backingFile must be absent');
  });
});
