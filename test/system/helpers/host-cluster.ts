// A cluster of host processes for a test file: N `mooring data-engine` hosts (makeHosts)
// started in a scratch directory, a Mooring over them (openCluster), and all of it torn
// down after (stopCluster): per test by default, or once for the file's tests.
import { afterAll, afterEach, beforeAll, beforeEach } from 'vitest';

import type { Mooring } from '../../../src/mooring.js';
import type { FileStateStore } from '../../../src/state/file-state-store.js';
import { makeHosts, openCluster, stopCluster, type ClusterOptions, type HostProcess } from './hosts.js';
import { TempDir } from './tools.js';

export interface HostClusterOptions {
  /** How many hosts (a, b, c...). */
  hosts: number;
  /** Replica port of host a; with scope 'each' every test's cluster takes the next ten. */
  basePort: number;
  /** 'each' (default): a fresh cluster for every test; 'all': one for the file's tests. */
  scope?: 'each' | 'all';
  /** The Mooring's options (openCluster's defaults otherwise). */
  cluster?: ClusterOptions;
}

/** The current test's cluster: valid inside its tests (and hooks registered after it). */
export class HostCluster {
  #tmp: TempDir | undefined;
  #cluster: Mooring | undefined;
  #store: FileStateStore | undefined;
  hosts: HostProcess[] = [];

  constructor(private readonly options: HostClusterOptions) {}

  get tmp(): TempDir {
    return this.#current(this.#tmp);
  }

  get cluster(): Mooring {
    return this.#current(this.#cluster);
  }

  get store(): FileStateStore {
    return this.#current(this.#store);
  }

  /** Closes the Mooring and its store, and opens new ones over the same state: a restarted embedding process. */
  async reopen(): Promise<void> {
    await this.cluster.close();
    await this.store.close();
    ({ cluster: this.#cluster, store: this.#store } = await openCluster(this.tmp.path, this.hosts, this.options.cluster));
  }

  /** @internal (useHostCluster) */
  async start(tmp: TempDir, basePort: number): Promise<void> {
    this.#tmp = tmp;
    this.hosts = makeHosts(tmp.path, this.options.hosts, basePort);
    for (const h of this.hosts) await h.start();
    ({ cluster: this.#cluster, store: this.#store } = await openCluster(tmp.path, this.hosts, this.options.cluster));
  }

  /** @internal (useHostCluster) */
  async stop(): Promise<void> {
    if (!this.#tmp) return;
    await stopCluster({ cluster: this.#cluster, store: this.#store, hosts: this.hosts, tmp: this.#tmp });
    this.#cluster = this.#store = this.#tmp = undefined;
  }

  #current<T>(v: T | undefined): T {
    if (v === undefined) throw new Error('the host cluster is used outside a test');
    return v;
  }
}

/** Registers the hooks that start and stop a host cluster, and returns it. */
export function useHostCluster(options: HostClusterOptions): HostCluster {
  const env = new HostCluster(options);
  if (options.scope === 'all') {
    beforeAll(() => env.start(new TempDir(), options.basePort));
    afterAll(() => env.stop());
  } else {
    let port = options.basePort;
    beforeEach(async () => {
      const base = port;
      port += 10;
      await env.start(new TempDir(), base);
    });
    afterEach(() => env.stop());
  }
  return env;
}
