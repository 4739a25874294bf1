import type { Etcd3, IKeyValue, Watcher } from 'etcd3';

import { MooringError } from '../errors.js';
import { delay, sleep, withTimeout } from '../util/async.js';
import {
  ETCD_LIST_PAGE,
  etcdError,
  etcdSettings,
  isRetryable,
  loadEtcd3,
  newClient,
  prefixEnd,
  type Etcd3Module,
  type EtcdSettings,
  type EtcdStateStoreOptions,
} from './etcd-connection.js';
import { STATE_LIST_COUNT_MAX } from './file-state-store.js';
import { STATE_DOCUMENT_BYTES_MAX, checkCompareAndSet, checkExpectedVersion, checkGuard, checkGuardVersion, checkKey, checkKind, isKey, serialiseValue } from './state-keys.js';
import type { StateChange, StateGuard, StateListOptions, StateStore, StateWatch, StateWriteOptions, StoredObject } from './state-store.js';
import { checkWatchArguments, deliverChange } from './state-watchers.js';

type CallOptions = { deadline: number };

/**
 * A {@link StateStore} in etcd (v3 API), so that the VM managers of several hosts share
 * the control plane's state (docs/etcd.md).
 *
 * Each document is one etcd key, `PREFIX<kind>/<key>`, whose value is the document's JSON
 * text. Its version is etcd's per-key version (1 when created, +1 on every put, so the
 * same numbers as the file store); compare-and-set is an etcd transaction comparing it, so
 * writers on any host race correctly. A list reads every page at one revision (a
 * consistent snapshot). {@link EtcdStateStore.watch} follows etcd's watch stream.
 *
 * A call that finds no etcd member answering is retried until `timeoutMs`, then rejects
 * with UNAVAILABLE; once etcd answers again, calls succeed again.
 */
export class EtcdStateStore implements StateStore {
  /** The key prefix. */
  readonly prefix: string;
  readonly #mod: Etcd3Module;
  readonly #settings: EtcdSettings;
  readonly #client: Etcd3;
  readonly #watches = new Set<StateWatch>();
  #closing: Promise<void> | undefined;

  private constructor(mod: Etcd3Module, settings: EtcdSettings) {
    this.#mod = mod;
    this.#settings = settings;
    this.prefix = settings.prefix;
    this.#client = newClient(mod, settings);
  }

  /**
   * Connects to etcd and checks that it answers (and accepts the credentials).
   *
   * @throws MooringError INVALID_ARGUMENT (options), UNAVAILABLE (no member answered within
   *   `timeoutMs`), UNAUTHENTICATED (user or password refused), PERMISSION_DENIED
   */
  static async open(options: EtcdStateStoreOptions): Promise<EtcdStateStore> {
    const settings = etcdSettings(options);
    const store = new EtcdStateStore(await loadEtcd3(), settings);
    try {
      await store.#call(`reading ${settings.prefix}`, false, (o) => store.#client.kv.range({ key: Buffer.from(settings.prefix), keys_only: true, count_only: true }, o));
    } catch (err) {
      await store.close();
      throw err;
    }
    return store;
  }

  /** @inheritDoc StateStore.get */
  async get<T>(kind: string, key: string): Promise<StoredObject<T> | null> {
    const k = this.#key(kind, key);
    const res = await this.#call(`reading ${kind}/${key}`, false, (o) => this.#client.kv.range({ key: k }, o));
    const kv = res.kvs[0];
    return kv ? this.#document<T>(kind, key, kv) : null;
  }

  /** @inheritDoc StateStore.list */
  async list<T>(kind: string, options: StateListOptions = {}): Promise<Array<StoredObject<T>>> {
    const base = this.#kindPrefix(kind);
    const prefix = typeof options?.prefix === 'string' ? options.prefix : '';
    const end = prefixEnd(Buffer.from(base + prefix));
    let start = Buffer.from(base + prefix);
    let revision: string | undefined;
    const out: Array<StoredObject<T>> = [];
    for (;;) {
      const req = { key: start, range_end: end, limit: ETCD_LIST_PAGE, ...(revision === undefined ? {} : { revision }) };
      const res = await this.#call(`listing ${kind}`, false, (o) => this.#client.kv.range(req, o));
      if (revision === undefined && Number(res.count) > STATE_LIST_COUNT_MAX) {
        throw new MooringError('INVALID_STATE', `etcd holds ${res.count} documents under ${base}, more than the ${STATE_LIST_COUNT_MAX} a list reads`);
      }
      // Every page at the revision of the first: one consistent snapshot.
      revision ??= res.header.revision;
      for (const kv of res.kvs) {
        const key = kv.key.toString('utf8').slice(base.length);
        // Keys another program wrote under the prefix that are no document key are not ours.
        if (isKey(key)) out.push(this.#document<T>(kind, key, kv));
      }
      if (!res.more || res.kvs.length === 0) return out;
      start = Buffer.concat([res.kvs[res.kvs.length - 1]!.key, Buffer.from([0])]);
    }
  }

  /** @inheritDoc StateStore.put */
  async put<T>(kind: string, key: string, value: T, options?: StateWriteOptions): Promise<StoredObject<T>> {
    const k = this.#key(kind, key);
    const expected = checkExpectedVersion(options);
    const guard = checkGuard(options);
    const text = serialiseValue(kind, key, value);
    const put = { key: k, value: Buffer.from(text), prev_kv: true };
    const what = `writing ${kind}/${key}`;
    let prev: IKeyValue | undefined;
    if (expected === undefined && guard === undefined) {
      prev = (await this.#call(what, true, (o) => this.#client.kv.put(put, o))).prev_kv ?? undefined;
    } else {
      const res = await this.#transaction(what, k, expected, guard, { request_put: put });
      if (!res.succeeded) this.#conflict(kind, key, expected, guard, res);
      prev = res.responses[0]?.response_put?.prev_kv ?? undefined;
    }
    return { kind, key, version: prev ? Number(prev.version) + 1 : 1, value: JSON.parse(text) as T };
  }

  /** @inheritDoc StateStore.delete */
  async delete(kind: string, key: string, options?: StateWriteOptions): Promise<void> {
    const k = this.#key(kind, key);
    const expected = checkExpectedVersion(options);
    const guard = checkGuard(options);
    const what = `deleting ${kind}/${key}`;
    if (expected === undefined && guard === undefined) {
      await this.#call(what, true, (o) => this.#client.kv.deleteRange({ key: k }, o));
      return;
    }
    const res = await this.#transaction(what, k, expected, guard, { request_delete_range: { key: k } });
    if (!res.succeeded) this.#conflict(kind, key, expected, guard, res);
  }

  /**
   * Follows etcd's watch stream of the kind's keys (from the revision current when it
   * resolves). After the stream broke and etcd answers again, the client resumes from the
   * last revision it saw and the listener also gets a `resync`. If etcd ends the watch (its
   * revisions were compacted), it is started again from the current revision, after which
   * the listener gets a `resync`. A document whose value is not JSON gives a `resync` too
   * (the list that follows reports it).
   *
   * @throws MooringError UNAVAILABLE when etcd does not accept the watch within `timeoutMs`
   */
  async watch<T>(kind: string, listener: (change: StateChange<T>) => void, options?: StateListOptions): Promise<StateWatch> {
    this.#assertOpen();
    const base = this.#kindPrefix(kind);
    const prefix = checkWatchArguments(kind, listener, options);
    let closed = false;
    let current: Watcher | undefined;
    const send = (change: StateChange<T>): void => {
      if (!closed) deliverChange(listener, change);
    };
    const resync = (): void => send({ type: 'resync', kind });
    const keyOf = (kv: IKeyValue): string | null => {
      const key = kv.key.toString('utf8').slice(base.length);
      return isKey(key) ? key : null;
    };
    const start = async (): Promise<Watcher> => {
      const pending = this.#client.watch().prefix(base + prefix).create();
      let w: Watcher;
      try {
        w = await withTimeout(pending, this.#settings.timeoutMs, `watching ${kind} on etcd ${this.#settings.endpoints.join(',')}`);
      } catch (err) {
        void pending.then((late) => late.cancel()).catch(() => undefined);
        throw etcdError(this.#mod, err, `watching ${kind}`, this.#settings, false);
      }
      let lost = false;
      w.on('put', (kv) => {
        const key = keyOf(kv);
        if (key === null) return;
        let doc: StoredObject<T>;
        try {
          doc = this.#document<T>(kind, key, kv);
        } catch {
          resync();
          return;
        }
        send({ type: 'put', kind, key, version: doc.version, value: doc.value });
      });
      w.on('delete', (kv) => {
        const key = keyOf(kv);
        if (key !== null) send({ type: 'delete', kind, key });
      });
      w.on('disconnected', () => {
        lost = true;
      });
      w.on('connected', () => {
        if (!lost) return;
        lost = false;
        resync();
      });
      // etcd ended this watch (a compacted revision): start a new one, then resync.
      w.on('error', () => void restart());
      return w;
    };
    const restart = async (): Promise<void> => {
      while (!closed) {
        try {
          const w = await start();
          if (closed) {
            await w.cancel().catch(() => undefined);
            return;
          }
          current = w;
          resync();
          return;
        } catch {
          await sleep(1_000);
        }
      }
    };
    current = await start();
    const handle: StateWatch = {
      close: async () => {
        if (closed) return;
        closed = true;
        this.#watches.delete(handle);
        await current?.cancel().catch(() => undefined);
      },
    };
    this.#watches.add(handle);
    return handle;
  }

  /** Stops every watch and closes the connections; later calls reject with CLOSED. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await Promise.allSettled([...this.#watches].map((w) => w.close()));
      this.#client.close();
    })();
    return this.#closing;
  }

  #assertOpen(): void {
    if (this.#closing) throw new MooringError('CLOSED', `etcd state store ${this.prefix} is closed`);
  }

  #kindPrefix(kind: string): string {
    this.#assertOpen();
    return `${this.prefix}${checkKind(kind)}/`;
  }

  #key(kind: string, key: string): Buffer {
    const base = this.#kindPrefix(kind);
    return Buffer.from(base + checkKey(key));
  }

  #document<T>(kind: string, key: string, kv: IKeyValue): StoredObject<T> {
    const where = `etcd key ${kv.key.toString('utf8')}`;
    if (kv.value.length > STATE_DOCUMENT_BYTES_MAX) {
      throw new MooringError('CORRUPT_METADATA', `${where} holds ${kv.value.length} bytes, more than a document may (${STATE_DOCUMENT_BYTES_MAX})`, { details: { kind, key } });
    }
    let value: T;
    try {
      value = JSON.parse(kv.value.toString('utf8')) as T;
    } catch (err) {
      throw new MooringError('CORRUPT_METADATA', `${where} is not a JSON document: ${(err as Error).message}`, { cause: err, details: { kind, key } });
    }
    return { kind, key, version: Number(kv.version), value };
  }

  // A transaction: `op` if the key's version is `expected` (0: it does not exist; undefined:
  // any) and the guard's key is at the guard's version, else reads of both versions for the
  // CONFLICT message.
  #transaction(what: string, k: Buffer, expected: number | undefined, guard: StateGuard | undefined, op: object): ReturnType<Etcd3['kv']['txn']> {
    const compare: Array<{ key: Buffer; target: 'Version'; result: 'Equal'; version: number }> = [];
    const failure: object[] = [{ request_range: { key: k, keys_only: true } }];
    if (expected !== undefined) compare.push({ key: k, target: 'Version', result: 'Equal', version: expected });
    if (guard) {
      const gk = this.#key(guard.kind, guard.key);
      compare.push({ key: gk, target: 'Version', result: 'Equal', version: guard.version });
      failure.push({ request_range: { key: gk, keys_only: true } });
    }
    const txn = { compare, success: [op], failure };
    return this.#call(what, true, (o) => this.#client.kv.txn(txn, o));
  }

  #conflict(kind: string, key: string, expected: number | undefined, guard: StateGuard | undefined, res: Awaited<ReturnType<Etcd3['kv']['txn']>>): never {
    const version = (i: number): number => Number(res.responses[i]?.response_range?.kvs[0]?.version ?? 0);
    checkCompareAndSet(kind, key, expected, version(0));
    checkGuardVersion(guard, version(1));
    // etcd refused the comparison yet holds the expected versions: they changed in between.
    throw new MooringError('CONFLICT', `${kind}/${key} or its guard changed while being written (expected version ${String(expected)})`, {
      details: { kind, key, expectedVersion: expected ?? null },
    });
  }

  // One etcd call, sent again while no member answers, until timeoutMs has passed.
  async #call<R>(what: string, write: boolean, op: (options: CallOptions) => Promise<R>): Promise<R> {
    this.#assertOpen();
    const end = Date.now() + this.#settings.timeoutMs;
    let wait = 25;
    for (;;) {
      try {
        return await op({ deadline: end });
      } catch (err) {
        if (this.#closing) throw new MooringError('CLOSED', `etcd state store ${this.prefix} closed while ${what}`, { cause: err });
        if (!isRetryable(this.#mod, err) || Date.now() + wait >= end) throw etcdError(this.#mod, err, what, this.#settings, write);
        await delay(wait);
        wait = Math.min(wait * 2, 500);
      }
    }
  }
}
