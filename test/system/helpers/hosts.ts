// Several hosts on one machine: one `mooring data-engine` process per simulated host, each
// with its own directory, its own loopback address (127.0.0.X) for the replica protocol and
// its own gRPC unix socket. A host can be killed (SIGKILL), stopped and resumed
// (SIGSTOP/SIGCONT: a network partition as far as its peers can tell) and restarted on the
// same addresses with the same directory, as a rebooted host would be.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { processAlive } from '../../../src/util/processes.js';
import { processClusterSecret } from '../../../src/data-engine/cluster-secret.js';
import { RemoteDataEngine } from '../../../src/data-engine/grpc/remote-data-engine.js';
import { Mooring } from '../../../src/mooring.js';
import type { MooringOptions } from '../../../src/mooring-options.js';
import { FileStateStore } from '../../../src/state/file-state-store.js';
import { readReplica, type ReplicaContent } from './replicas.js';
import { killAllServers, startCliProcess, type MooringServer } from './serve.js';
import type { TempDir } from './tools.js';

export interface HostOptions {
  hostId: string;
  /** The host's data-engine directory. */
  dir: string;
  /** Loopback address of its replica server, e.g. 127.0.0.11. */
  ip: string;
  replicaPort: number;
  extraArgs?: string[];
  /** Runs the process inside this network namespace (`ip netns exec`); default: none. */
  netns?: string;
  /** Where its gRPC server listens (default unix:DIR/grpc.sock). */
  grpcListen?: string;
  /** Where the test's client reaches that server (default: the grpcListen address). */
  grpcConnect?: string;
  /** The cli.js the process runs (default: this repository's dist/cli.js). */
  cli?: string;
  /**
   * Run without a cluster secret (`--insecure`). By default a host gets this test process's
   * generated secret (processClusterSecret(), the one in-process data engines use) as
   * --cluster-secret-file, and the test's client connects with it. A host of another
   * release (`cli`) gets neither: it knows no authentication.
   */
  insecure?: boolean;
}

interface DataEngineReady {
  hostId: string;
  grpcAddress: string;
  replicaAddress: string | null;
}

/** One simulated host: a `mooring data-engine` process and a gRPC client to it. */
export class HostProcess {
  proc: MooringServer | null = null;
  client: RemoteDataEngine | null = null;
  ready: DataEngineReady | null = null;
  readonly grpcSocket: string;

  constructor(readonly opts: HostOptions) {
    mkdirSync(opts.dir, { recursive: true });
    this.grpcSocket = join(opts.dir, 'grpc.sock');
  }

  get hostId(): string {
    return this.opts.hostId;
  }

  get engine(): RemoteDataEngine {
    if (!this.client) throw new Error(`host ${this.hostId} is not running`);
    return this.client;
  }

  /** The secret this host's processes are given and its client connects with (undefined: none). */
  get clusterSecret(): Buffer | undefined {
    return this.opts.insecure || this.opts.cli ? undefined : processClusterSecret();
  }

  /** The file holding that secret once start() wrote it (undefined: none). */
  get clusterSecretFile(): string | undefined {
    return this.clusterSecret ? join(this.opts.dir, 'cluster-secret') : undefined;
  }

  /** Starts (or restarts) the process and connects a client. */
  async start(): Promise<void> {
    mkdirSync(this.opts.dir, { recursive: true }); // a wiped disk comes back empty
    const secret = this.clusterSecret;
    let auth: string[] = [];
    if (secret) {
      const file = this.clusterSecretFile!;
      writeFileSync(file, secret, { mode: 0o600 });
      auth = ['--cluster-secret-file', file];
    } else if (this.opts.insecure) {
      auth = ['--insecure'];
    }
    const args = [
      'data-engine',
      '--dir', this.opts.dir,
      '--host-id', this.opts.hostId,
      '--listen', this.opts.grpcListen ?? `unix:${this.grpcSocket}`,
      '--replica-listen', `tcp:${this.opts.ip}:${this.opts.replicaPort}`,
      ...auth,
      ...(this.opts.extraArgs ?? []),
    ];
    const wrap = this.opts.netns ? ['ip', 'netns', 'exec', this.opts.netns] : undefined;
    this.proc = await startCliProcess(args, `data-engine ${this.hostId}${this.opts.cli ? ` (${this.opts.cli})` : ''}`, 30_000, undefined, wrap, this.opts.cli);
    this.ready = JSON.parse(this.proc.readyLine) as DataEngineReady;
    await this.client?.close().catch(() => undefined);
    this.client = await RemoteDataEngine.connect({ address: this.opts.grpcConnect ?? this.opts.grpcListen ?? `unix:${this.grpcSocket}`, timeoutMs: 10_000, ...(secret ? { clusterSecret: secret } : {}) });
  }

  /** SIGKILL: the host crashes. The client stays, and fails with UNAVAILABLE until restart. */
  async crash(): Promise<void> {
    await this.proc?.crash();
  }

  /** SIGSTOP: the host stops answering (as in a partition) but keeps its state. */
  freeze(): void {
    this.proc?.child.kill('SIGSTOP');
  }

  /** SIGCONT after freeze(). */
  thaw(): void {
    this.proc?.child.kill('SIGCONT');
  }

  /**
   * SIGTERM: a clean stop (engines drain and flush). A successor that took the directory
   * over (an upgrade started it, detached: not our child) is stopped the same way.
   */
  async stop(): Promise<void> {
    await this.client?.close().catch(() => undefined);
    this.client = null;
    if (this.proc?.alive) await this.proc.stop('SIGTERM', 30_000);
    await stopDirectoryOwner(this.opts.dir);
  }

  diagnostics(): string {
    return this.proc ? this.proc.diagnostics() : `\n(host ${this.hostId} never started)`;
  }
}

/** The pid in a data-engine directory's lock file (the process that owns it), or null. */
export function directoryOwner(dir: string): number | null {
  try {
    return (JSON.parse(readFileSync(join(dir, 'data-engine.lock'), 'utf8')) as { pid: number }).pid;
  } catch {
    return null;
  }
}

/** Whether a process with this pid exists. */
export const alive = processAlive;

// SIGTERM to the process owning the directory, if it still runs; SIGKILL after 30 s.
async function stopDirectoryOwner(dir: string): Promise<void> {
  const pid = directoryOwner(dir);
  if (pid === null || pid === process.pid || !alive(pid)) return;
  process.kill(pid, 'SIGTERM');
  const deadline = Date.now() + 30_000;
  while (alive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  if (alive(pid)) process.kill(pid, 'SIGKILL');
}

/** N hosts a, b, c... on 127.0.0.11.. with replica ports basePort + i. */
export function makeHosts(root: string, n: number, basePort: number, options: { insecure?: boolean } = {}): HostProcess[] {
  const ids = 'abcdefgh';
  return Array.from(
    { length: n },
    (_, i) => new HostProcess({ hostId: ids[i]!, dir: join(root, `host-${ids[i]}`), ip: `127.0.0.${11 + i}`, replicaPort: basePort + i, ...(options.insecure ? { insecure: true } : {}) }),
  );
}

/** The Mooring options a test's cluster may set (repairIntervalMs defaults to 500). */
export type ClusterOptions = Pick<MooringOptions, 'repairIntervalMs' | 'replicaReplacementWaitMs' | 'engineIoTimeoutMs' | 'ticketWaitTimeoutMs' | 'backingImageCleanupWaitMs'>;

/** A cluster over the hosts' gRPC clients with a file state store under `root`. */
export async function openCluster(root: string, hosts: HostProcess[], options: ClusterOptions = {}): Promise<{ cluster: Mooring; store: FileStateStore }> {
  const store = await FileStateStore.open(join(root, 'state'));
  const cluster = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), ...options, repairIntervalMs: options.repairIntervalMs ?? 500 });
  return { cluster, store };
}

/** Replica directory of a replica held by a host. */
export function replicaPath(host: HostProcess, name: string): string {
  return join(host.opts.dir, 'replicas', name);
}

/** Reads every listed replica (the volume must be detached and the hosts stopped or not using them). */
export async function readReplicas(list: Array<{ host: HostProcess; name: string }>, sizeBytes: number): Promise<ReplicaContent[]> {
  const out: ReplicaContent[] = [];
  for (const r of list) out.push(await readReplica(replicaPath(r.host, r.name), sizeBytes, `${r.host.hostId}/${r.name}`));
  return out;
}

/** Polls `check` until it returns true or the time runs out; returns whether it did. */
export async function waitFor(check: () => Promise<boolean>, timeoutMs: number, intervalMs = 200): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check().catch(() => false)) return true;
    if (Date.now() >= deadline) return false;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/**
 * Tears a test's cluster down (afterAll): the Mooring, its store, every host's process (a
 * frozen one thawed first, so that it can stop) and anything else the test started, then
 * its scratch directory. Any part may be missing.
 */
export async function stopCluster(parts: { cluster?: Mooring | undefined; store?: FileStateStore | undefined; hosts: HostProcess[]; tmp: TempDir }): Promise<void> {
  await parts.cluster?.close();
  await parts.store?.close();
  for (const h of parts.hosts) {
    h.thaw();
    await h.stop().catch(() => undefined);
  }
  await killAllServers();
  parts.tmp.cleanup();
}
