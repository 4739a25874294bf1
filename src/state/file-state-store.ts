import { open, readdir, unlink } from 'node:fs/promises';
import { isAbsolute, join, resolve } from 'node:path';

import { MooringError, toMooringError } from '../errors.js';
import { ensureDirectory, readFileLimited, writeFileAtomic } from '../util/files.js';
import { describe } from '../util/validate.js';
import { VolumeLock } from '../volume/volume-lock.js';
import {
  STATE_DOCUMENT_BYTES_MAX,
  STATE_KIND_PATTERN,
  checkCompareAndSet,
  checkGuard,
  checkGuardVersion,
  checkExpectedVersion,
  checkKey,
  checkKind,
  isKey,
  serialiseValue,
} from './state-keys.js';
import type { StateChange, StateGuard, StateListOptions, StateStore, StateWatch, StateWriteOptions, StoredObject } from './state-store.js';
import { StateWatchers } from './state-watchers.js';
import { SortedKeys } from './sorted-keys.js';

/** The lock file inside a state store directory. */
export const STATE_LOCK_FILE = 'state.lock';
/** `format` field of every document file. */
export const STATE_DOCUMENT_FORMAT = 'mooring-state';
/** Largest document file read: the value plus the envelope. */
const DOCUMENT_FILE_BYTES_MAX = STATE_DOCUMENT_BYTES_MAX + 4096;
/** Documents one `list` reads; a kind with more is refused rather than read without bound. */
export const STATE_LIST_COUNT_MAX = 100_000;
// Temporary files writeFileAtomic leaves behind when the process dies mid-write.
const TMP_FILE_PATTERN = /^\..+\.json\.tmp-\d+-[0-9a-f]{8}$/;

/** A document as the store last read or wrote it: its value as JSON text (each caller gets its own copy), or null: no such file. */
type CachedDocument = { version: number; text: string } | null;

/** What the store knows of one kind's directory. */
interface KindCache {
  /** Documents read or written so far. */
  docs: Map<string, CachedDocument>;
  /** Every key in the directory, once a list has read it (kept up to date by put and delete); null before. */
  keys: SortedKeys | null;
}

/** Options of {@link FileStateStore.open}. */
export interface FileStateStoreOptions {
  /** Directory of the store (created if missing). */
  dir: string;
}

async function fsyncDir(dir: string): Promise<void> {
  const dh = await open(dir, 'r');
  try {
    await dh.sync();
  } finally {
    await dh.close();
  }
}

/**
 * The default {@link StateStore}, one JSON file per document (`DIR/<kind>/<key>.json`),
 * written atomically (temporary file, fsync, rename, fsync of the directory), so a crash
 * leaves every document either at its old or at its new version.
 *
 * One process owns a store directory at a time (`DIR/state.lock`); a second opener gets
 * BUSY. Within the process, operations on one document run one after another, which makes
 * compare-and-set exact.
 *
 * Being the directory's only writer, the store keeps what it read and wrote in memory: a
 * document is read from its file once, a kind's directory listed once, and a write does not
 * read the file it replaces (issue 21: the control loop reads every record each pass, and
 * reading files made a pass over 200 volumes spend most of its time in open/read/close).
 * Files changed behind an open store's back are therefore not seen until it is reopened.
 */
export class FileStateStore implements StateStore {
  /** The store directory (absolute). */
  readonly dir: string;
  readonly #lock: VolumeLock;
  // Per-document queue: each operation on a document waits for the one before it.
  readonly #queues = new Map<string, Promise<unknown>>();
  readonly #knownKinds = new Set<string>();
  readonly #cache = new Map<string, KindCache>();
  readonly #watchers = new StateWatchers();
  #closing: Promise<void> | undefined;

  private constructor(dir: string, lock: VolumeLock) {
    this.dir = dir;
    this.#lock = lock;
  }

  /**
   * Opens (creating if needed) the store in `dir`, locks it against other processes and
   * removes temporary files that a crash left behind.
   *
   * @throws MooringError INVALID_ARGUMENT, BUSY (another process has it open), IO_ERROR
   */
  static async open(options: FileStateStoreOptions | string): Promise<FileStateStore> {
    const raw = typeof options === 'string' ? options : (options as FileStateStoreOptions | null)?.dir;
    if (typeof raw !== 'string' || raw.length === 0 || raw.includes('\0')) {
      throw new MooringError('INVALID_ARGUMENT', `state store dir must be a path (got ${describe(raw)})`);
    }
    const dir = isAbsolute(raw) ? resolve(raw) : resolve(process.cwd(), raw);
    await ensureDirectory(dir);
    const lock = await VolumeLock.acquire(dir, {
      file: STATE_LOCK_FILE,
      what: 'state store',
      hint: 'only one process may use a state store directory; close the other one first',
    });
    try {
      const store = new FileStateStore(dir, lock);
      await store.#removeLeftovers();
      return store;
    } catch (err) {
      await lock.release();
      throw err;
    }
  }

  /** @inheritDoc StateStore.get */
  get<T>(kind: string, key: string): Promise<StoredObject<T> | null> {
    if (typeof key === 'string' && isKey(key)) {
      const known = this.#fromMemory<T>(kind, key);
      if (known !== undefined) return Promise.resolve(known);
    }
    return this.#run(kind, key, (file) => this.#read<T>(kind, key, file));
  }

  /** @inheritDoc StateStore.list */
  async list<T>(kind: string, options: StateListOptions = {}): Promise<Array<StoredObject<T>>> {
    this.#assertOpen();
    checkKind(kind);
    const prefix = typeof options?.prefix === 'string' ? options.prefix : '';
    const keys = (await this.#keysOf(kind)).withPrefix(prefix);
    if (keys.length > STATE_LIST_COUNT_MAX) {
      throw new MooringError('INVALID_STATE', `${join(this.dir, kind)} holds ${keys.length} documents, more than the ${STATE_LIST_COUNT_MAX} a list reads`);
    }
    const out: Array<StoredObject<T>> = [];
    for (const key of keys) {
      // Known documents are taken from memory without a turn of the event loop each.
      const known = this.#fromMemory<T>(kind, key);
      const doc = known !== undefined ? known : await this.get<T>(kind, key);
      // Deleted between readdir and get: it is simply no longer there.
      if (doc) out.push(doc);
    }
    return out;
  }

  /** @inheritDoc StateStore.put */
  put<T>(kind: string, key: string, value: T, options?: StateWriteOptions): Promise<StoredObject<T>> {
    return this.#guarded(options, kind, key, async (file) => {
      const expected = checkExpectedVersion(options);
      const text = serialiseValue(kind, key, value);
      const current = await this.#read<unknown>(kind, key, file);
      checkCompareAndSet(kind, key, expected, current?.version ?? 0);
      await this.#checkGuard(options);
      const version = (current?.version ?? 0) + 1;
      await this.#ensureKindDir(kind);
      const doc = `{"format":${JSON.stringify(STATE_DOCUMENT_FORMAT)},"kind":${JSON.stringify(kind)},"key":${JSON.stringify(key)},"version":${version},"value":${text}}\n`;
      try {
        await writeFileAtomic(file, doc);
      } catch (err) {
        // Whether the rename happened is not known: the file is read again next time.
        this.#forget(kind, key);
        throw err;
      }
      this.#remember(kind, key, { version, text });
      this.#watchers.put(kind, key, version, text);
      return { kind, key, version, value: JSON.parse(text) as T };
    });
  }

  /** @inheritDoc StateStore.delete */
  delete(kind: string, key: string, options?: StateWriteOptions): Promise<void> {
    return this.#guarded(options, kind, key, async (file) => {
      const expected = checkExpectedVersion(options);
      if (expected !== undefined) {
        const current = await this.#read<unknown>(kind, key, file);
        checkCompareAndSet(kind, key, expected, current?.version ?? 0);
      }
      await this.#checkGuard(options);
      try {
        await unlink(file);
      } catch (err) {
        if ((err as { code?: string }).code === 'ENOENT') {
          this.#remember(kind, key, null);
          return;
        }
        this.#forget(kind, key);
        throw toMooringError(err, `deleting ${file}`);
      }
      this.#remember(kind, key, null);
      await fsyncDir(join(this.dir, kind)).catch((err: unknown) => Promise.reject(toMooringError(err, `syncing ${join(this.dir, kind)}`)));
      this.#watchers.delete(kind, key);
    });
  }

  /**
   * Changes made through this store (the only writer of its directory: it holds the lock),
   * announced in process once each is durable.
   */
  async watch<T>(kind: string, listener: (change: StateChange<T>) => void, options?: StateListOptions): Promise<StateWatch> {
    this.#assertOpen();
    return this.#watchers.add(kind, listener, options);
  }

  /** Waits for operations in flight and releases the directory lock. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await Promise.allSettled([...this.#queues.values()]);
      this.#watchers.clear();
      await this.#lock.release();
    })();
    return this.#closing;
  }

  #assertOpen(): void {
    if (this.#closing) throw new MooringError('CLOSED', `state store ${this.dir} is closed`);
  }

  // #run, and with a guard also in the guard document's turn (taken first), so nothing in
  // this process (the only one with the directory) changes it before the write. A guard
  // document is never written with a guard on a document that names it as guard.
  #guarded<R>(options: StateWriteOptions | undefined, kind: string, key: string, body: (file: string) => Promise<R>): Promise<R> {
    let guard: StateGuard | undefined;
    try {
      guard = checkGuard(options);
    } catch (err) {
      return Promise.reject(err);
    }
    if (!guard || (guard.kind === kind && guard.key === key)) return this.#run(kind, key, body);
    return this.#run(guard.kind, guard.key, () => this.#run(kind, key, body));
  }

  async #checkGuard(options: StateWriteOptions | undefined): Promise<void> {
    const guard = checkGuard(options);
    if (guard) checkGuardVersion(guard, (await this.#read<unknown>(guard.kind, guard.key, join(this.dir, guard.kind, `${guard.key}.json`)))?.version ?? 0);
  }

  // Validates, then queues `body` behind earlier operations on the same document.
  #run<R>(kind: string, key: string, body: (file: string) => Promise<R>): Promise<R> {
    let file: string;
    try {
      this.#assertOpen();
      checkKind(kind);
      checkKey(key);
      file = join(this.dir, kind, `${key}.json`);
    } catch (err) {
      return Promise.reject(err);
    }
    const id = `${kind}/${key}`;
    const before = this.#queues.get(id) ?? Promise.resolve();
    const result = before.then(() => body(file));
    const tail = result.then(
      () => undefined,
      () => undefined,
    );
    this.#queues.set(id, tail);
    void tail.then(() => {
      if (this.#queues.get(id) === tail) this.#queues.delete(id);
    });
    return result;
  }

  async #read<T>(kind: string, key: string, file: string): Promise<StoredObject<T> | null> {
    const known = this.#known<T>(kind, key);
    if (known !== undefined) return known;
    let text: string;
    try {
      text = await readFileLimited(file, DOCUMENT_FILE_BYTES_MAX);
    } catch (err) {
      if (err instanceof MooringError && err.code === 'NOT_FOUND') {
        this.#remember(kind, key, null);
        return null;
      }
      throw err;
    }
    // A damaged document is not remembered: every read reports it.
    const doc = parseDocument<T>(file, kind, key, text);
    this.#remember(kind, key, { version: doc.version, text: JSON.stringify(doc.value) });
    return doc;
  }

  #kindCache(kind: string): KindCache {
    let c = this.#cache.get(kind);
    if (!c) this.#cache.set(kind, (c = { docs: new Map(), keys: null }));
    return c;
  }

  // Known, and no operation on it queued: the document from memory without a turn in its
  // queue (null: none); undefined when it must be read in turn.
  #fromMemory<T>(kind: string, key: string): StoredObject<T> | null | undefined {
    return this.#closing || this.#queues.has(`${kind}/${key}`) ? undefined : this.#known<T>(kind, key);
  }

  // The document as last read or written (null: none), or undefined: not known without reading.
  #known<T>(kind: string, key: string): StoredObject<T> | null | undefined {
    const c = this.#cache.get(kind);
    if (!c) return undefined;
    const d = c.docs.get(key);
    if (d === undefined) return c.keys && !c.keys.has(key) ? null : undefined;
    return d && { kind, key, version: d.version, value: JSON.parse(d.text) as T };
  }

  #remember(kind: string, key: string, doc: CachedDocument): void {
    const c = this.#kindCache(kind);
    c.docs.set(key, doc);
    if (doc) c.keys?.add(key);
    else c.keys?.delete(key);
  }

  // After a write whose outcome on disk is unknown: read the file again next time.
  #forget(kind: string, key: string): void {
    const c = this.#kindCache(kind);
    c.docs.delete(key);
    c.keys = null;
  }

  // The kind's keys: its directory read once, then kept up to date by put and delete.
  async #keysOf(kind: string): Promise<SortedKeys> {
    const known = this.#cache.get(kind)?.keys;
    if (known) return known;
    let names: string[];
    try {
      names = await readdir(join(this.dir, kind));
    } catch (err) {
      if ((err as { code?: string }).code !== 'ENOENT') throw toMooringError(err, `listing ${join(this.dir, kind)}`);
      names = [];
    }
    const keys = SortedKeys.of(names.filter((n) => n.endsWith('.json')).map((n) => n.slice(0, -'.json'.length)).filter(isKey));
    // Writes that ended while the directory was read are applied over what it showed.
    const c = this.#kindCache(kind);
    for (const [key, doc] of c.docs) {
      if (doc) keys.add(key);
      else keys.delete(key);
    }
    c.keys ??= keys;
    return c.keys;
  }

  async #ensureKindDir(kind: string): Promise<void> {
    if (this.#knownKinds.has(kind)) return;
    const dir = join(this.dir, kind);
    const made = await ensureDirectory(dir);
    // A new directory entry is durable only once its parent is synced.
    if (made.length > 0) await fsyncDir(this.dir).catch((err: unknown) => Promise.reject(toMooringError(err, `syncing ${this.dir}`)));
    this.#knownKinds.add(kind);
  }

  async #removeLeftovers(): Promise<void> {
    const kinds = (await readdir(this.dir, { withFileTypes: true })).filter((e) => e.isDirectory() && STATE_KIND_PATTERN.test(e.name));
    for (const k of kinds) {
      const dir = join(this.dir, k.name);
      for (const name of await readdir(dir)) {
        if (TMP_FILE_PATTERN.test(name)) await unlink(join(dir, name)).catch(() => undefined);
      }
    }
  }
}

/**
 * Parses and checks one document file; anything unexpected is CORRUPT_METADATA naming the file.
 *
 * @internal
 */
export function parseDocument<T>(file: string, kind: string, key: string, text: string): StoredObject<T> {
  const corrupt = (why: string, cause?: unknown): MooringError =>
    new MooringError('CORRUPT_METADATA', `state document ${file} is damaged: ${why}`, {
      ...(cause === undefined ? {} : { cause }),
      details: { file, kind, key },
    });
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw corrupt(`not valid JSON (${(err as Error).message})`, err);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) throw corrupt('not a JSON object');
  const d = doc as Record<string, unknown>;
  if (d.format !== STATE_DOCUMENT_FORMAT) throw corrupt(`format is ${describe(d.format)}, not ${STATE_DOCUMENT_FORMAT}`);
  if (d.kind !== kind || d.key !== key) throw corrupt(`it names ${describe(d.kind)}/${describe(d.key)}, not ${kind}/${key}`);
  if (typeof d.version !== 'number' || !Number.isSafeInteger(d.version) || d.version < 1) throw corrupt(`version ${describe(d.version)} is not a positive integer`);
  if (!('value' in d)) throw corrupt('no value');
  return { kind, key, version: d.version, value: d.value as T };
}
