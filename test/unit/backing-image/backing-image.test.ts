// Backing images over fake data engines and an in-memory store: the first file from each
// source, state transitions and events, UUID separation of same-name images, copies (at most
// 3 sends per source, resume after an interrupted send, a host that is away shows unknown),
// minCopies, cleanup after the wait (never a file in use), delete refused while used, volumes
// that wait for their file and get the right reference, replacement that delivers first.
import { createHash } from 'node:crypto';

import { afterEach, describe, expect, it } from 'vitest';

import { BACKING_IMAGE_KIND } from '../../../src/backing-image/backing-image-records.js';
import type { BackingImageFileInfo, BackingImageFileRef, BackingImagePullOptions } from '../../../src/data-engine/data-engine.js';
import { MooringError } from '../../../src/errors.js';
import type { BackingImageFileStatus } from '../../../src/backing-image/backing-image.js';
import { Mooring, type MooringOptions } from '../../../src/mooring.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FAKE_READ_CHUNK_BYTES, FakeDataEngine } from '../fakes/fake-data-engine.js';

/** 16 chunks of the fake's reads. */
const IMAGE_BYTES = 16 * FAKE_READ_CHUNK_BYTES;
const VIRTUAL_BYTES = 10_000_001;

/** A file that starts like a qcow2 image (magic, virtual size at byte 24), as the fake reads it. */
function qcow2Like(seed: number, length = IMAGE_BYTES, virtualBytes = VIRTUAL_BYTES): Buffer {
  const b = Buffer.alloc(length);
  for (let i = 0; i < length; i++) b[i] = (i * 31 + seed) & 0xff;
  b.writeUInt32BE(0x514649fb, 0);
  b.writeBigUInt64BE(BigInt(virtualBytes), 24);
  return b;
}

function sha512(b: Buffer): string {
  return createHash('sha512').update(b).digest('hex');
}

async function* chunks(b: Buffer, size = 8192): AsyncIterable<Uint8Array> {
  for (let at = 0; at < b.length; at += size) yield b.subarray(at, Math.min(b.length, at + size));
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function until(what: string, fn: () => Promise<boolean> | boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

let volSeq = 0;
/** Unique volume names: the fake shares epochs and snapshots per volume name across hosts and tests. */
function vname(): string {
  return `biv${++volSeq}-${process.pid}`;
}

describe('backing images', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const c of open.splice(0)) await c.close();
  });

  async function setup(n = 3, opts: Partial<MooringOptions> = {}, files: Record<string, Buffer> = {}) {
    const hosts = Array.from({ length: n }, (_, i) => new FakeDataEngine('abcdefgh'[i]!));
    for (const h of hosts) h.fetchUrl = (url) => {
      const b = files[url];
      if (!b) return (async function* () {
        yield* [];
        throw new Error(`404 ${url}`);
      })();
      return chunks(b);
    };
    const store = new MemoryStateStore();
    const cluster = await Mooring.open({ store, hosts, repairIntervalMs: 0, ticketWaitTimeoutMs: 5000, ...opts });
    open.push(cluster);
    return { hosts, store, cluster };
  }

  it('downloads the first file: pending → starting → in-progress → ready, with checksum, size and format', async () => {
    const img = qcow2Like(1);
    const { hosts, cluster, store } = await setup(3, {}, { 'http://x/img.qcow2': img });
    const bi = await cluster.createBackingImage({ name: 'img', source: { type: 'download', url: 'http://x/img.qcow2' }, host: 'b' });
    const states: string[] = [];
    bi.on('file-state', (f) => {
      if (f.hostId === 'b' && states.at(-1) !== f.state) states.push(f.state);
    });
    const ready: BackingImageFileStatus[] = [];
    bi.on('ready', (f) => ready.push(f));
    const st = await bi.waitReady({ timeoutMs: 5000 });
    expect(st).toMatchObject({ name: 'img', state: 'ready', currentChecksum: sha512(img), sizeBytes: img.length, virtualSizeBytes: VIRTUAL_BYTES, format: 'qcow2', firstHost: 'b', minCopies: 1, expectedChecksum: null });
    expect(st.uuid).toMatch(/^[0-9a-f-]{36}$/);
    // Its only copy is the one minCopies keeps: no lastRefAtMs.
    expect(st.files).toEqual([{ hostId: 'b', state: 'ready', progress: 100, message: '', lastRefAtMs: null }]);
    expect(states).toEqual(expect.arrayContaining(['starting', 'in-progress', 'ready']));
    expect(states.at(-1)).toBe('ready');
    expect(ready.map((f) => f.hostId)).toEqual(['b']);
    expect([...hosts[1]!.files.keys()]).toEqual([`img-${st.uuid}`]);
    expect(hosts[0]!.files.size + hosts[2]!.files.size).toBe(0);
    // The record is in the store under its own kind, and validated when read.
    const d = await store.get<Record<string, unknown>>(BACKING_IMAGE_KIND, 'img');
    expect(d?.value['uuid']).toBe(st.uuid);
    await store.put(BACKING_IMAGE_KIND, 'img', { ...d!.value, files: { b: { state: 'exploded' } } });
    await expect(bi.status()).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
    expect((await cluster.listBackingImages().catch((e: unknown) => e)) as { code: string }).toMatchObject({ code: 'CORRUPT_METADATA' });
  });

  it('retries a failed download of the first file, and fails for good on a checksum mismatch after the attempts', async () => {
    const img = qcow2Like(2);
    const files: Record<string, Buffer> = {};
    const { hosts, cluster } = await setup(2, {}, files);
    const bi = await cluster.createBackingImage({ name: 'retry', source: { type: 'download', url: 'http://x/late' }, host: 'a' });
    await until('the first attempt failed', async () => (await bi.status()).files.some((f) => f.state === 'failed'));
    files['http://x/late'] = img; // the server has it now
    const st = await bi.waitReady({ timeoutMs: 5000 });
    expect(st.currentChecksum).toBe(sha512(img));
    expect(hosts[0]!.calls.filter((c) => c.startsWith('downloadBackingImageFile retry')).length).toBeGreaterThanOrEqual(2);

    files['http://x/bad'] = img;
    const bad = await cluster.createBackingImage({ name: 'bad', source: { type: 'download', url: 'http://x/bad' }, expectedChecksum: 'A'.repeat(128), host: 'a' });
    const failed: unknown[] = [];
    bad.on('failed', (f) => failed.push(f));
    await expect(bad.waitReady({ timeoutMs: 20_000 })).rejects.toMatchObject({ code: 'CHECKSUM_MISMATCH' });
    expect((await bad.status()).state).toBe('failed');
    expect(hosts[0]!.calls.filter((c) => c.startsWith('downloadBackingImageFile bad')).length).toBe(5);
    expect(failed.length).toBeGreaterThanOrEqual(1);
  });

  it('uploads from a stream; refuses a short stream, non-bytes and a second upload', async () => {
    const img = qcow2Like(3);
    const { hosts, cluster } = await setup(2);
    const bi = await cluster.createBackingImage({ name: 'up', source: { type: 'upload', sizeBytes: img.length }, host: 'a', expectedChecksum: sha512(img) });
    expect((await bi.status()).state).toBe('pending');
    await expect(bi.upload(chunks(img.subarray(0, 5000)))).rejects.toMatchObject({ code: 'IO_ERROR' });
    expect((await bi.status()).files[0]).toMatchObject({ hostId: 'a', state: 'failed' });
    await expect(
      bi.upload(
        (async function* () {
          yield 'text' as unknown as Uint8Array;
        })(),
      ),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(bi.upload(42 as unknown as AsyncIterable<Uint8Array>)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    const st = await bi.upload(chunks(img));
    expect(st).toMatchObject({ state: 'ready', currentChecksum: sha512(img), format: 'qcow2' });
    await expect(bi.upload(chunks(img))).rejects.toMatchObject({ code: 'INVALID_STATE' });
    // The first host is away: the upload goes to another one.
    const other = await cluster.createBackingImage({ name: 'up2', source: { type: 'upload', sizeBytes: img.length }, host: 'a' });
    hosts[0]!.reachable = false;
    expect(await other.upload(chunks(img))).toMatchObject({ state: 'ready', firstHost: 'b' });
    hosts[0]!.reachable = true;
    const dl = await cluster.createBackingImage({ name: 'dl', source: { type: 'download', url: 'http://x/none' } });
    await expect(dl.upload(chunks(img))).rejects.toMatchObject({ code: 'INVALID_STATE' });
  });

  it('exports the first file from a volume snapshot under a backing-image-export ticket', async () => {
    const { hosts, cluster } = await setup(3);
    const v = vname();
    await cluster.createVolume({ name: v, sizeBytes: 64 * 4096, hosts: ['a', 'b', 'c'] });
    await cluster.volume(v).createSnapshot('s1');
    const bi = await cluster.createBackingImage({ name: 'snap', source: { type: 'volume-snapshot', volume: v, snapshot: 's1' } });
    const st = await bi.waitReady({ timeoutMs: 5000 });
    expect(st).toMatchObject({ state: 'ready', format: 'raw', sizeBytes: 8192, virtualSizeBytes: 8192 });
    expect(hosts.some((h) => h.calls.some((c) => c.startsWith(`exportSnapshotToBackingImageFile ${v} s1 snap`)))).toBe(true);
    // The operation's ticket is gone: the volume is detached again.
    expect((await cluster.volume(v).status()).state).toBe('detached');
    expect(await cluster.volume(v).tickets()).toEqual([]);
    await expect(cluster.createBackingImage({ name: 'snap2', source: { type: 'volume-snapshot', volume: 'nope', snapshot: 's1' } })).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it('refuses bad input with coded errors', async () => {
    const { cluster } = await setup(2);
    const bad = [
      { name: '../x', source: { type: 'download', url: 'http://x/' } },
      { name: 'x', source: { type: 'ftp', url: 'ftp://x/' } },
      { name: 'x', source: { type: 'download', url: 'file:///etc/passwd' } },
      { name: 'x', source: { type: 'download', url: 'http://x/' + 'a'.repeat(3000) } },
      { name: 'x', source: { type: 'upload' } },
      { name: 'x', source: { type: 'upload', sizeBytes: -1 } },
      { name: 'x', source: { type: 'volume-snapshot', volume: 'v', snapshot: '..' } },
      { name: 'x', source: { type: 'download', url: 'http://x/' }, expectedChecksum: 'abc' },
      { name: 'x', source: { type: 'download', url: 'http://x/' }, minCopies: 0 },
      { name: 'x', source: { type: 'download', url: 'http://x/' }, minCopies: 1.5 },
      { name: 'x', source: null },
    ];
    for (const o of bad) await expect(cluster.createBackingImage(o as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(cluster.createBackingImage(null as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(cluster.createBackingImage({ name: 'x', source: { type: 'download', url: 'http://x/' }, host: 'zz' })).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(cluster.backingImage('nope').status()).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(cluster.backingImage('nope').waitReady()).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(cluster.backingImage('nope').delete()).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(cluster.backingImage('x').cleanup('a' as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(() => cluster.backingImage('../x')).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    await expect(cluster.createVolume({ name: 'v', backingImage: 'nope' })).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(Mooring.open({ store: new MemoryStateStore(), backingImageCleanupWaitMs: -1 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Mooring.open({ store: new MemoryStateStore(), backingImageCleanupWaitMs: 'soon' as never })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await cluster.createBackingImage({ name: 'dup', source: { type: 'upload', sizeBytes: 10 } });
    await expect(cluster.createBackingImage({ name: 'dup', source: { type: 'upload', sizeBytes: 10 } })).rejects.toMatchObject({ code: 'ALREADY_EXISTS' });
  });

  it('creates a volume on an image: waits for the copies, then replicas with the right reference; size rules', async () => {
    const img = qcow2Like(4);
    const { hosts, cluster } = await setup(3, {}, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'base', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    // The volume is asked for before the image is ready: it waits for the first file and the copies.
    const v = vname();
    const st = await (await cluster.createVolume({ name: v, replicas: 3, hosts: ['a', 'b', 'c'], backingImage: 'base' })).status();
    const uuid = (await bi.status()).uuid;
    expect(st.sizeBytes).toBe(Math.ceil(VIRTUAL_BYTES / 4096) * 4096);
    expect(st.backingImage).toBe('base');
    for (const h of hosts) {
      expect(h.files.get(`base-${uuid}`)?.state).toBe('ready');
      const reps = [...h.replicas.values()];
      expect(reps).toHaveLength(1);
      expect(reps[0]!.backingImage).toEqual({ dir: `base-${uuid}`, format: 'qcow2', virtualSizeBytes: VIRTUAL_BYTES });
      // Each copy was checked against the image's checksum on arrival.
      expect(h.files.get(`base-${uuid}`)!.checksum).toBe(sha512(img));
    }
    const status = await bi.status();
    expect(status.usedBy).toEqual([v]);
    expect(status.disks).toEqual(['a', 'b', 'c']);
    await expect(cluster.createVolume({ name: vname(), sizeBytes: 4096 * 10, backingImage: 'base', replicas: 1 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    const big = await (await cluster.createVolume({ name: vname(), sizeBytes: 4096 * 4096, backingImage: 'base', replicas: 1 })).status();
    expect(big.sizeBytes).toBe(4096 * 4096);
    // Attach works like any volume.
    expect((await cluster.volume(v).attach({ host: 'a' })).state).toBe('healthy');
  });

  it('sends at most 3 copies at once from one ready file', async () => {
    const img = qcow2Like(5);
    const { hosts, cluster } = await setup(6, {}, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'fan', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    await bi.waitReady();
    // Slow reads, so copies overlap.
    for (const h of hosts) h.beforeReadChunk = () => sleep(2);
    await cluster.createVolume({ name: vname(), replicas: 5, hosts: ['b', 'c', 'd', 'e', 'f'], backingImage: 'fan' });
    const dir = `fan-${(await bi.status()).uuid}`;
    expect(hosts[0]!.maxReadsSeen.get(dir)).toBe(3);
    for (const h of hosts) expect(h.maxReadsSeen.get(dir) ?? 0).toBeLessThanOrEqual(3);
    for (const h of hosts.slice(1)) expect(h.files.get(dir)?.state).toBe('ready');
  });

  it('resumes an interrupted copy from the partial file once its host is back; the host shows unknown meanwhile', async () => {
    const img = qcow2Like(6);
    const { hosts, cluster } = await setup(2, { ticketWaitTimeoutMs: 10_000 }, { 'http://x/i': img });
    const [a, b] = hosts as [FakeDataEngine, FakeDataEngine];
    const bi = await cluster.createBackingImage({ name: 'res', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    await bi.waitReady();
    // The target goes away after 4 chunks of the copy arrived.
    let sent = 0;
    a.beforeReadChunk = async () => {
      if (++sent === 5) b.reachable = false;
    };
    const creating = cluster.createVolume({ name: vname(), replicas: 1, hosts: ['b'], backingImage: 'res' });
    await until('b is unknown', async () => (await bi.status()).files.find((f) => f.hostId === 'b')?.state === 'unknown');
    const dir = `res-${(await bi.status()).uuid}`;
    expect(b.files.get(dir)).toMatchObject({ state: 'failed', receivedBytes: 4 * FAKE_READ_CHUNK_BYTES });
    b.reachable = true;
    const st = await (await creating).status();
    expect(st.replicas).toHaveLength(1);
    expect(b.writes).toEqual([`${dir} offset=0`, `${dir} offset=${4 * FAKE_READ_CHUNK_BYTES}`]);
    expect(b.files.get(dir)).toMatchObject({ state: 'ready', checksum: sha512(img) });
  });

  it('keeps minCopies ready copies and cleans up unused ones after the wait, never one in use', async () => {
    const img = qcow2Like(7);
    const { hosts, cluster } = await setup(4, { backingImageCleanupWaitMs: 40 }, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'ha', source: { type: 'download', url: 'http://x/i' }, host: 'a', minCopies: 2 });
    await bi.waitReady();
    await until('two ready copies', async () => {
      await cluster.repairOnce();
      return (await bi.status()).files.filter((f) => f.state === 'ready').length === 2;
    });
    const dir = `ha-${(await bi.status()).uuid}`;
    // A volume on c and d: copies there, in use (a and b may be cleaned up already meanwhile).
    const v = vname();
    await cluster.createVolume({ name: v, replicas: 2, hosts: ['c', 'd'], backingImage: 'ha' });
    expect(hosts.slice(2).every((h) => h.files.get(dir)?.state === 'ready')).toBe(true);
    await sleep(60);
    await cluster.repairOnce();
    await sleep(60);
    await cluster.repairOnce();
    // c and d are in use and count as the two copies: a and b go.
    expect(hosts.map((h) => h.files.has(dir))).toEqual([false, false, true, true]);
    const st = await bi.status();
    expect(st.files.map((f) => `${f.hostId}:${f.state}:${f.lastRefAtMs === null ? 'used' : 'unused'}`)).toEqual(['c:ready:used', 'd:ready:used']);
    // The volume goes: its copies get lastRefAtMs, and two stay for minCopies however long it waits.
    await cluster.deleteVolume(v);
    for (let i = 0; i < 3; i++) {
      await sleep(50);
      await cluster.repairOnce();
    }
    expect(hosts.filter((h) => h.files.get(dir)?.state === 'ready')).toHaveLength(2);
  });

  it('deletes an unused copy after the wait but keeps the last ready one (minCopies 1)', async () => {
    const img = qcow2Like(8);
    const { hosts, cluster } = await setup(2, { backingImageCleanupWaitMs: 30 }, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'gc', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    await bi.waitReady();
    const v = vname();
    await cluster.createVolume({ name: v, replicas: 1, hosts: ['b'], backingImage: 'gc' });
    const dir = `gc-${(await bi.status()).uuid}`;
    await sleep(40);
    await cluster.repairOnce();
    await sleep(40);
    await cluster.repairOnce();
    // a is unused, but b (in use) is the one kept copy... and a is not needed for minCopies.
    expect(hosts.map((h) => h.files.has(dir))).toEqual([false, true]);
    await cluster.deleteVolume(v);
    await cluster.repairOnce();
    await sleep(40);
    await cluster.repairOnce();
    expect(hosts.map((h) => h.files.has(dir))).toEqual([false, true]);
    expect((await bi.status()).state).toBe('ready');
  });

  it('refuses to delete an image a volume uses; deletes its files everywhere once unused', async () => {
    const img = qcow2Like(9);
    const { hosts, cluster } = await setup(3, {}, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'del', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    const v = vname();
    await cluster.createVolume({ name: v, replicas: 2, hosts: ['b', 'c'], backingImage: 'del' });
    await expect(bi.delete()).rejects.toMatchObject({ code: 'BUSY', details: { usedBy: [v] } });
    // cleanup: never a copy in use; an unused one goes at once.
    await expect(bi.cleanup(['b'])).rejects.toMatchObject({ code: 'BUSY' });
    const after = await bi.cleanup(['a']);
    expect(after.files.map((f) => f.hostId)).toEqual(['b', 'c']);
    expect(hosts[0]!.files.size).toBe(0);
    await cluster.deleteVolume(v);
    await bi.delete();
    expect(hosts.every((h) => h.files.size === 0)).toBe(true);
    await expect(bi.status()).rejects.toMatchObject({ code: 'NOT_FOUND' });
    expect(await cluster.listBackingImages()).toEqual([]);
  });

  it('separates a new image from the old files of one with the same name (UUID), and deletes the leftovers', async () => {
    const oldImg = qcow2Like(10);
    const newImg = qcow2Like(11);
    const files: Record<string, Buffer> = { 'http://x/i': oldImg };
    const { hosts, cluster } = await setup(2, {}, files);
    const [a, b] = hosts as [FakeDataEngine, FakeDataEngine];
    const first = await cluster.createBackingImage({ name: 'same', source: { type: 'download', url: 'http://x/i' }, host: 'b', minCopies: 1 });
    const oldUuid = (await first.waitReady()).uuid;
    // b is away while the image is deleted: its file stays there.
    b.reachable = false;
    await first.delete();
    files['http://x/i'] = newImg;
    const second = await cluster.createBackingImage({ name: 'same', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    const st = await second.waitReady();
    expect(st.uuid).not.toBe(oldUuid);
    expect(st.currentChecksum).toBe(sha512(newImg));
    b.reachable = true;
    await cluster.repairOnce();
    // The old file (old UUID) is gone; a copy of the new one goes to b only when asked for.
    expect(b.files.has(`same-${oldUuid}`)).toBe(false);
    await cluster.createVolume({ name: vname(), replicas: 1, hosts: ['b'], backingImage: 'same' });
    expect([...b.files.keys()]).toEqual([`same-${st.uuid}`]);
    expect(b.files.get(`same-${st.uuid}`)!.checksum).toBe(sha512(newImg));
    expect(a.files.has(`same-${oldUuid}`)).toBe(false);
  });

  it('fails an image whose data engine cannot prepare the file at all (no failed file left behind)', async () => {
    const { hosts, cluster } = await setup(1);
    hosts[0]!.downloadBackingImageFile = () => Promise.reject(Object.assign(new Error('not here'), { code: 'UNSUPPORTED' }));
    const bi = await cluster.createBackingImage({ name: 'nofile', source: { type: 'download', url: 'http://x/i' } });
    await expect(bi.waitReady({ timeoutMs: 20_000 })).rejects.toMatchObject({ code: 'UNSUPPORTED' });
    expect((await bi.status()).state).toBe('failed');
  });

  it('keeps files whose image it cannot look up (a failing store), deletes them once sure', async () => {
    const { hosts, cluster, store } = await setup(1);
    hosts[0]!.putReadyFile({ name: 'orphan', uuid: '11111111-2222-4333-8444-555555555555' }, Buffer.alloc(4096, 1));
    const get = store.get.bind(store);
    store.get = (async (kind: string, key: string) => {
      if (kind === BACKING_IMAGE_KIND) throw new Error('store away');
      return get(kind, key);
    }) as typeof store.get;
    await cluster.repairOnce();
    expect(hosts[0]!.files.size).toBe(1);
    store.get = get as typeof store.get;
    await cluster.repairOnce();
    expect(hosts[0]!.files.size).toBe(0);
  });

  it('reads volume records written before backing images as having none; refuses a bad image name in one', async () => {
    const { cluster, store } = await setup(1);
    const v = vname();
    await cluster.createVolume({ name: v, sizeBytes: 64 * 4096, replicas: 1 });
    const d = await store.get<Record<string, unknown>>('volume', v);
    const { backingImage: _b, ...older } = d!.value;
    await store.put('volume', v, older);
    expect((await cluster.volume(v).status()).backingImage).toBeNull();
    await store.put('volume', v, { ...older, backingImage: '../etc' });
    await expect(cluster.volume(v).status()).rejects.toMatchObject({ code: 'CORRUPT_METADATA' });
  });

  it('cancels a download: CANCELLED, and no retry by itself', async () => {
    const { hosts, cluster } = await setup(1);
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    hosts[0]!.fetchUrl = () =>
      (async function* () {
        yield Buffer.alloc(4096);
        await gate;
        yield Buffer.alloc(4096);
      })();
    const bi = await cluster.createBackingImage({ name: 'cx', source: { type: 'download', url: 'http://x/slow' } });
    await until('in progress', () => [...hosts[0]!.files.values()].some((f) => f.state === 'in-progress'));
    await bi.cancel();
    release();
    await expect(bi.waitReady({ timeoutMs: 3000 })).rejects.toMatchObject({ code: 'CANCELLED' });
    expect(hosts[0]!.calls.filter((c) => c.startsWith('downloadBackingImageFile')).length).toBe(1);
  });

  it('replaces a replica of a volume on an image: the new host gets the file first', async () => {
    const img = qcow2Like(12);
    const { hosts, cluster } = await setup(3, { replicaReplacementWaitMs: 10 }, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'rep', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    const v = vname();
    await cluster.createVolume({ name: v, replicas: 3, hosts: ['a', 'b', 'c'], backingImage: 'rep' });
    await cluster.volume(v).attach({ host: 'a' });
    hosts[2]!.reachable = false;
    hosts[0]!.setMode(v, 'r2', 'ERR');
    await cluster.repairOnce();
    await sleep(20);
    const d = new FakeDataEngine('d');
    await cluster.addHost(d);
    const dir = `rep-${(await bi.status()).uuid}`;
    await cluster.repairOnce();
    const st = await cluster.volume(v).status();
    expect(st.replicas.map((r) => `${r.id}@${r.hostId}`)).toEqual(['r0@a', 'r1@b', 'r3@d']);
    expect(d.files.get(dir)?.state).toBe('ready');
    const created = d.calls.findIndex((c) => c.startsWith('createReplica'));
    const written = d.calls.findIndex((c) => c.startsWith('writeBackingImageFile'));
    expect(written).toBeGreaterThanOrEqual(0);
    expect(written).toBeLessThan(created);
    expect([...d.replicas.values()][0]!.backingImage?.dir).toBe(dir);
  });

  it('a replacement whose copy is slow does not hold the repair pass: a later pass creates the replica', async () => {
    const img = qcow2Like(17);
    const { hosts, cluster } = await setup(3, { replicaReplacementWaitMs: 10, ticketWaitTimeoutMs: 300 }, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'slow', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    await bi.waitReady();
    const v = vname();
    await cluster.createVolume({ name: v, replicas: 2, hosts: ['a', 'b'], backingImage: 'slow' });
    await cluster.volume(v).attach({ host: 'a' });
    hosts[1]!.reachable = false;
    hosts[0]!.setMode(v, 'r1', 'ERR');
    await cluster.repairOnce();
    await sleep(20);
    // Copies now take about 16 × 40 ms, longer than the 300 ms the pass waits.
    hosts[0]!.beforeReadChunk = () => sleep(40);
    const warnings: string[] = [];
    cluster.on('warning', (e) => warnings.push(e.code));
    await cluster.repairOnce();
    expect(warnings).toContain('UNAVAILABLE');
    expect((await cluster.volume(v).status()).replicas.map((r) => r.hostId)).toEqual(['a', 'b']);
    await until('the copy to c is ready', async () => hosts[2]!.files.get(`slow-${(await bi.status()).uuid}`)?.state === 'ready');
    await cluster.repairOnce();
    expect((await cluster.volume(v).status()).replicas.map((r) => `${r.id}@${r.hostId}`)).toEqual(['r0@a', 'r2@c']);
  });

  it('clones a volume on an image onto hosts that get the file first', async () => {
    const img = qcow2Like(13);
    const { hosts, cluster } = await setup(4, {}, { 'http://x/i': img });
    await cluster.createBackingImage({ name: 'cl', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    const v = vname();
    await cluster.createVolume({ name: v, replicas: 1, hosts: ['a'], backingImage: 'cl' });
    await cluster.volume(v).createSnapshot('s');
    const c = await (await cluster.volume(v).clone({ name: vname(), snapshot: 's', replicas: 1, hosts: ['d'] })).volume.status();
    expect(c.backingImage).toBe('cl');
    expect([...hosts[3]!.replicas.values()][0]!.backingImage?.dir).toMatch(/^cl-/);
  });

  it('is found again by a restarted VM manager (a new Mooring over the same store)', async () => {
    const img = qcow2Like(15);
    const { hosts, cluster, store } = await setup(2, {}, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'again', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    const before = await bi.waitReady();
    await cluster.close();
    const next = await Mooring.open({ store, hosts, repairIntervalMs: 0, ticketWaitTimeoutMs: 5000 });
    open.push(next);
    const st = await next.backingImage('again').status();
    expect(st).toMatchObject({ uuid: before.uuid, state: 'ready', currentChecksum: sha512(img) });
    expect((await next.listBackingImages()).map((x) => x.name)).toEqual(['again']);
    const v = await (await next.createVolume({ name: vname(), replicas: 1, hosts: ['b'], backingImage: 'again' })).status();
    expect(v.backingImage).toBe('again');
    // The image's record survives a repair pass of the new cluster, its files are not leftovers.
    await next.repairOnce();
    expect(hosts.every((h) => h.files.has(`again-${before.uuid}`))).toBe(true);
    await expect(cluster.createBackingImage({ name: 'x', source: { type: 'upload', sizeBytes: 1 } })).rejects.toMatchObject({ code: 'CLOSED' });
  });

  it('keeps minCopies from the periodic repair loop, and makes a new copy when cleanup takes one', async () => {
    const img = qcow2Like(16);
    const { hosts, cluster } = await setup(3, { repairIntervalMs: 20 }, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'loop', source: { type: 'download', url: 'http://x/i' }, host: 'a', minCopies: 2 });
    await bi.waitReady();
    const ready = async (): Promise<string[]> => (await bi.status()).files.filter((f) => f.state === 'ready').map((f) => f.hostId);
    await until('two copies by the loop alone', async () => (await ready()).length === 2);
    const [, second] = await ready();
    await bi.cleanup([second!]);
    await until('two copies again', async () => (await ready()).length === 2);
    expect(hosts.filter((h) => [...h.files.values()].some((f) => f.state === 'ready')).length).toBe(2);
  });

  it('an upload image waits in pending; waitReady times out with UNAVAILABLE', async () => {
    const { cluster } = await setup(1);
    const bi = await cluster.createBackingImage({ name: 'later', source: { type: 'upload', sizeBytes: 4096 } });
    await expect(bi.waitReady({ timeoutMs: 150 })).rejects.toMatchObject({ code: 'UNAVAILABLE', details: { state: 'pending' } });
    expect((await bi.status()).files).toEqual([{ hostId: 'a', state: 'pending', progress: 0, message: '', lastRefAtMs: null }]);
  });

  it('does not count a ready file whose SHA-512 is not the image\'s: deleted and delivered again when unused, reported failed while a replica uses it', async () => {
    const img = qcow2Like(21);
    const { hosts, cluster } = await setup(3, {}, { 'http://x/i': img });
    const warnings: Array<{ code: string; message: string }> = [];
    cluster.on('warning', (e) => warnings.push({ code: e.code, message: e.message }));
    const bi = await cluster.createBackingImage({ name: 'sum', source: { type: 'download', url: 'http://x/i' }, host: 'a', minCopies: 2 });
    await bi.waitReady();
    await until('two copies', async () => {
      await cluster.repairOnce();
      return (await bi.status()).files.filter((f) => f.state === 'ready').length === 2;
    });
    const st = await bi.status();
    const dir = `sum-${st.uuid}`;
    const second = st.files.find((f) => f.hostId !== 'a' && f.state === 'ready')!.hostId;
    const host = hosts.find((h) => h.hostId === second)!;
    // The disk came back holding another file under the image's name: its own record says ready.
    const other = qcow2Like(99);
    host.files.get(dir)!.chunks = [other];
    host.files.get(dir)!.checksum = sha512(other);
    await cluster.repairOnce();
    expect(warnings).toContainEqual({ code: 'CHECKSUM_MISMATCH', message: expect.stringMatching(new RegExp(`on ${second}: .*deleted`)) });
    // minCopies 2: a good copy is delivered again (there or elsewhere), and the bad file is gone.
    await until('two good copies again', async () => {
      await cluster.repairOnce();
      const good = hosts.filter((h) => h.files.get(dir)?.state === 'ready' && h.files.get(dir)!.checksum === st.currentChecksum);
      return good.length === 2;
    });
    expect(hosts.filter((h) => h.files.get(dir)?.checksum === sha512(other))).toEqual([]);

    // A mismatched file a replica uses stays (deleting it would pull the ground from under the
    // replica), reported failed and not counted; one warning, not one per pass.
    const v = vname();
    await cluster.createVolume({ name: v, replicas: 1, hosts: [second], backingImage: 'sum' });
    host.files.get(dir)!.checksum = sha512(other);
    warnings.length = 0;
    await cluster.repairOnce();
    await cluster.repairOnce();
    expect(warnings.filter((w) => w.code === 'CHECKSUM_MISMATCH')).toEqual([{ code: 'CHECKSUM_MISMATCH', message: expect.stringMatching(/left in place .* not counted as a copy/) }]);
    expect(host.files.has(dir)).toBe(true);
    expect((await bi.status()).files.find((f) => f.hostId === second)).toMatchObject({ state: 'failed', message: expect.stringMatching(/checksum mismatch/) });
    await until('two good copies besides it', async () => {
      await cluster.repairOnce();
      return hosts.filter((h) => h.files.get(dir)?.state === 'ready' && h.files.get(dir)!.checksum === st.currentChecksum).length === 2;
    });
    await cluster.deleteVolume(v);
  });

  it('takes a new minCopies and cleanup wait while running', async () => {
    const img = qcow2Like(22);
    const { hosts, cluster } = await setup(3, { backingImageCleanupWaitMs: 3_600_000 }, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'live', source: { type: 'download', url: 'http://x/i' }, host: 'a' });
    await bi.waitReady();
    const dir = `live-${(await bi.status()).uuid}`;
    const copies = (): number => hosts.filter((h) => h.files.get(dir)?.state === 'ready').length;
    expect((await bi.setMinCopies(3)).minCopies).toBe(3);
    await until('three copies', async () => {
      await cluster.repairOnce();
      return copies() === 3;
    });
    await bi.setMinCopies(1);
    // An hour's wait: nothing goes yet.
    await cluster.repairOnce();
    await sleep(30);
    await cluster.repairOnce();
    expect(copies()).toBe(3);
    cluster.setBackingImageCleanupWaitMs(10);
    await until('down to one copy', async () => {
      await cluster.repairOnce();
      return copies() === 1;
    });
    await expect(bi.setMinCopies(0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(() => cluster.setBackingImageCleanupWaitMs(-1)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
  });

  it('forgets the copy of a removed host and restores minCopies on the others; cleanup of a removed host only drops its record', async () => {
    const img = qcow2Like(23);
    const { hosts, cluster } = await setup(3, {}, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'gone', source: { type: 'download', url: 'http://x/i' }, host: 'a', minCopies: 2 });
    await bi.waitReady();
    await until('two copies', async () => {
      await cluster.repairOnce();
      return (await bi.status()).files.filter((f) => f.state === 'ready').length === 2;
    });
    const holders = (await bi.status()).files.filter((f) => f.state === 'ready').map((f) => f.hostId);
    const leaving = holders.find((h) => h !== 'a')!;
    cluster.removeHost(leaving);
    await cluster.repairOnce();
    // No `unknown` record left behind for it; a copy is made on the host that remains.
    expect((await bi.status()).files.map((f) => f.hostId)).not.toContain(leaving);
    await until('two copies on the remaining hosts', async () => {
      await cluster.repairOnce();
      const st = await bi.status();
      return st.files.filter((f) => f.state === 'ready').length === 2;
    });
    const dir = `gone-${(await bi.status()).uuid}`;
    expect(hosts.filter((h) => h.hostId !== leaving && h.files.get(dir)?.state === 'ready')).toHaveLength(2);

    // A record of a host removed while the controller had not looked yet: cleanup drops it.
    const other = (await bi.status()).files.find((f) => f.hostId !== 'a')!.hostId;
    cluster.removeHost(other);
    const st = await bi.cleanup([other]);
    expect(st.files.map((f) => f.hostId)).not.toContain(other);
  });

  it('reports a file on an unreachable host as unknown', async () => {
    const img = qcow2Like(14);
    const { hosts, cluster } = await setup(2, {}, { 'http://x/i': img });
    const bi = await cluster.createBackingImage({ name: 'unk', source: { type: 'download', url: 'http://x/i' }, host: 'a', minCopies: 2 });
    await bi.waitReady();
    await until('two copies', async () => {
      await cluster.repairOnce();
      return (await bi.status()).files.filter((f) => f.state === 'ready').length === 2;
    });
    hosts[1]!.reachable = false;
    await cluster.repairOnce();
    const st = await bi.status();
    expect(st.files.find((f) => f.hostId === 'b')).toMatchObject({ state: 'unknown' });
    expect(st.state).toBe('ready');
    hosts[1]!.reachable = true;
    await cluster.repairOnce();
    expect((await bi.status()).files.find((f) => f.hostId === 'b')).toMatchObject({ state: 'ready' });
  });
});

// The controller's copies through Mooring: targets that can pull are asked to (the bytes go
// source → target without this process relaying them); a target of an earlier release
// (UNIMPLEMENTED, reported UNSUPPORTED with details.unimplemented) gets a relayed copy.
describe('backing image copies pulled by the target', () => {
  const open: Mooring[] = [];
  afterEach(async () => {
    for (const c of open.splice(0)) await c.close();
  });

  /** A fake reached at a TCP address that pulls from a peer fake (or answers like an earlier release). */
  class PullingFake extends FakeDataEngine {
    readonly address: string;
    pulls: string[] = [];
    relayedWrites = 0;
    constructor(id: string, index: number, readonly peers: Map<string, FakeDataEngine>, readonly unimplemented = false) {
      super(id);
      this.address = `tcp:10.0.0.${index + 1}:7000`;
    }
    override async writeBackingImageFile(...args: Parameters<FakeDataEngine['writeBackingImageFile']>): ReturnType<FakeDataEngine['writeBackingImageFile']> {
      this.relayedWrites++;
      return super.writeBackingImageFile(...args);
    }
    async pullBackingImageFile(ref: BackingImageFileRef, options: BackingImagePullOptions): Promise<BackingImageFileInfo> {
      this.pulls.push(`${options.source.hostId}@${options.source.address} offset=${options.offset ?? 0}`);
      if (this.unimplemented) {
        throw new MooringError('UNSUPPORTED', `data engine ${this.hostId} cannot pull backing image files (an earlier release)`, { details: { unimplemented: 'PullBackingImageFile' } });
      }
      const src = this.peers.get(options.source.hostId)!;
      const { source: _s, ...write } = options;
      return super.writeBackingImageFile(ref, write, src.readBackingImageFile(ref, { offset: options.offset ?? 0 }));
    }
  }

  it('has b pull from a, and relays to c, which does not know the call', async () => {
    const img = qcow2Like(7);
    const peers = new Map<string, FakeDataEngine>();
    const hosts = ['a', 'b', 'c'].map((id, i) => new PullingFake(id, i, peers, id === 'c'));
    for (const h of hosts) {
      peers.set(h.hostId, h);
      h.fetchUrl = () => chunks(img);
    }
    const cluster = await Mooring.open({ store: new MemoryStateStore(), hosts, repairIntervalMs: 0, ticketWaitTimeoutMs: 5000 });
    open.push(cluster);
    const bi = await cluster.createBackingImage({ name: 'pulled', source: { type: 'download', url: 'http://x/i' }, host: 'a', minCopies: 3 });
    await until('three ready copies', async () => (await bi.status()).files.filter((f) => f.state === 'ready').length === 3);
    const [a, b, c] = hosts as [PullingFake, PullingFake, PullingFake];
    expect(b.pulls).toEqual(['a@tcp:10.0.0.1:7000 offset=0']);
    expect(b.relayedWrites).toBe(0);
    // c was asked once, then relayed to (from a, or from b once b was ready).
    expect(c.pulls).toHaveLength(1);
    expect(c.relayedWrites).toBe(1);
    expect(a.pulls).toEqual([]);
    for (const h of hosts) expect(h.files.get(`pulled-${(await bi.status()).uuid}`)?.checksum).toBe(sha512(img));
  });
});
