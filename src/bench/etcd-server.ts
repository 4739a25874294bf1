// A real etcd server (Debian package etcd-server, installed by .ci/setup.sh) for the tests
// and the control-plane benchmark: one member on loopback (or an address the caller gives), a
// temporary data directory, the client and peer ports the caller gives. It can be stopped and
// started again on the same data, serve TLS, and have auth enabled.
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { loadEtcd3 } from '../state/etcd-connection.js';

/** Server TLS: PEM files (the CA also checks client certificates when clientCertAuth). */
export interface EtcdServerTls {
  caFile: string;
  certFile: string;
  keyFile: string;
  clientCertAuth: boolean;
}

/** Options of {@link EtcdServer.start}. */
export interface EtcdServerOptions {
  /** Serve clients over TLS. */
  tls?: EtcdServerTls;
  /** Where the temporary directory of its data goes (default: the OS temp dir). */
  parentDir?: string;
  /** The address it listens on, clients and peer (default 127.0.0.1). */
  host?: string;
  /** Starts the process (default child_process.spawn): the bench tracks its children with it; a test runs it in a network namespace with it. */
  spawn?: (command: string, args: readonly string[], options: SpawnOptions) => ChildProcess;
}

const LOG_KEEP_BYTES = 256 * 1024;

/** One etcd member. */
export class EtcdServer {
  readonly dataDir: string;
  readonly clientPort: number;
  readonly peerPort: number;
  readonly tls: EtcdServerTls | undefined;
  readonly host: string;
  readonly #spawn: NonNullable<EtcdServerOptions['spawn']>;
  #proc: ChildProcess | undefined;
  #log = '';
  #onExit: ((code: number | null, signal: NodeJS.Signals | null) => void) | undefined;

  private constructor(dataDir: string, clientPort: number, peerPort: number, options: EtcdServerOptions) {
    this.dataDir = dataDir;
    this.clientPort = clientPort;
    this.peerPort = peerPort;
    this.tls = options.tls;
    this.host = options.host ?? '127.0.0.1';
    this.#spawn = options.spawn ?? spawn;
  }

  /** Starts a new member on fresh data; its data directory is removed if it does not start. */
  static async start(clientPort: number, peerPort: number, options: EtcdServerOptions = {}): Promise<EtcdServer> {
    const dir = await mkdtemp(join(options.parentDir ?? tmpdir(), 'mooring-etcd-'));
    const s = new EtcdServer(join(dir, 'data'), clientPort, peerPort, options);
    try {
      await s.restart();
    } catch (err) {
      await s.destroy();
      throw err;
    }
    return s;
  }

  /** The client URL. */
  get endpoint(): string {
    return this.endpointOn(this.clientPort);
  }

  /** The client URL on another port. */
  endpointOn(port: number): string {
    return `${this.tls ? 'https' : 'http'}://${this.host}:${port}`;
  }

  /** What etcd wrote to stderr lately (for failure messages). */
  get log(): string {
    return this.#log;
  }

  /**
   * Starts the member (again, on the same data); resolves once it serves clients. On
   * `clientPort` instead of its own: clients of the usual endpoint cannot reach it.
   */
  async restart(clientPort = this.clientPort): Promise<void> {
    if (this.#proc) throw new Error('etcd is running already');
    const peer = `http://${this.host}:${this.peerPort}`;
    const args = [
      '--name', 'm1',
      '--data-dir', this.dataDir,
      '--listen-client-urls', this.endpointOn(clientPort),
      '--advertise-client-urls', this.endpointOn(clientPort),
      '--listen-peer-urls', peer,
      '--initial-advertise-peer-urls', peer,
      '--initial-cluster', `m1=${peer}`,
      '--initial-cluster-state', 'new',
    ];
    if (this.tls) {
      args.push('--cert-file', this.tls.certFile, '--key-file', this.tls.keyFile, '--trusted-ca-file', this.tls.caFile);
      if (this.tls.clientCertAuth) args.push('--client-cert-auth');
    }
    const proc = this.#spawn('etcd', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    this.#proc = proc;
    await new Promise<void>((resolve, reject) => {
      const onData = (b: Buffer): void => {
        this.#log = (this.#log + b.toString()).slice(-LOG_KEEP_BYTES);
        if (this.#log.includes('ready to serve client requests')) {
          this.#log = '';
          resolve();
        }
      };
      proc.stdout!.on('data', onData);
      proc.stderr!.on('data', onData);
      proc.once('error', (err) => {
        this.#proc = undefined;
        reject(new Error(`cannot start etcd (install the Debian package etcd-server): ${err.message}`));
      });
      this.#onExit = (code, signal) => {
        this.#proc = undefined;
        reject(new Error(`etcd exited (${code ?? signal}) before serving clients:\n${this.#log}`));
      };
      proc.once('exit', this.#onExit);
    });
    proc.stdout!.removeAllListeners('data');
    proc.stderr!.removeAllListeners('data');
    const keep = (b: Buffer): void => {
      this.#log = (this.#log + b.toString()).slice(-LOG_KEEP_BYTES);
    };
    proc.stdout!.on('data', keep);
    proc.stderr!.on('data', keep);
  }

  /** Stops the member (SIGKILL: as abrupt as a crash); the data stays. */
  async kill(): Promise<void> {
    const proc = this.#proc;
    if (!proc) return;
    this.#proc = undefined;
    if (this.#onExit) proc.off('exit', this.#onExit);
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGKILL');
    await exited;
  }

  /** Stops the member and removes its data. */
  async destroy(): Promise<void> {
    await this.kill();
    await rm(join(this.dataDir, '..'), { recursive: true, force: true });
  }

  /**
   * Enables auth: a root user, and `user` with read-write on keys under `prefix` only.
   * Needs a server without TLS client auth.
   */
  async enableAuth(rootPassword: string, user: string, password: string, prefix: string): Promise<void> {
    const { Etcd3 } = await loadEtcd3();
    const c = new Etcd3({ hosts: this.endpoint });
    try {
      await c.role('root').create();
      await c.user('root').create(rootPassword);
      await c.user('root').addRole('root');
      await c.role('app').create();
      await c.role('app').grant({ permission: 'Readwrite', range: c.range({ prefix }) });
      await c.user(user).create(password);
      await c.user(user).addRole('app');
      await c.auth.authEnable();
    } finally {
      c.close();
    }
  }
}
