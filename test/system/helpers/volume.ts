// A volume under test: a temp directory, `mooring serve` on it (with one `mooring
// data-engine` process per other replica: replicas go one per host), clean stop/restart,
// whole volume reads through NBD, and the replica check on the way out.
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { expect } from 'vitest';
import { HostProcess } from './hosts.js';
import { NbdClient } from './nbd-client.js';
import { firstDifference } from './pattern.js';
import { assertReplicasIdentical } from './replicas.js';
import { MooringServer, startServe, type ServeOptions } from './serve.js';
import { TempDir } from './tools.js';

/** Reads `length` bytes from `offset` over one NBD connection, `depth` 1 MiB reads in flight. */
export async function readRange(client: NbdClient, offset: number, length: number, depth = 8): Promise<Buffer> {
  const out = Buffer.alloc(length);
  const piece = 1 << 20;
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < length) {
      const at = next;
      next += piece;
      const n = Math.min(piece, length - at);
      (await client.read(offset + at, n)).copy(out, at);
    }
  };
  await Promise.all(Array.from({ length: depth }, worker));
  return out;
}

/** The whole volume, read through a fresh NBD connection. */
export async function readWholeVolume(uri: string): Promise<Buffer> {
  const c = await NbdClient.connect(uri);
  try {
    return await readRange(c, 0, c.sizeBytes);
  } finally {
    await c.disconnect();
  }
}

/** Fails with the first differing offset (a plain toEqual on MiBs of bytes is unreadable). */
export function expectSameBytes(actual: Buffer, expected: Buffer, what: string): void {
  const at = firstDifference(actual, expected);
  if (at >= 0) {
    const show = (b: Buffer): string => b.subarray(at, at + 16).toString('hex');
    expect.fail(`${what}: first difference at byte ${at} (0x${at.toString(16)}): got ${show(actual)} expected ${show(expected)} (lengths ${actual.length}/${expected.length})`);
  }
}

/** Replica directories held by the data engine in `engineDir`. */
export function replicaDirsOf(engineDir: string): string[] {
  const root = join(engineDir, 'replicas');
  return readdirSync(root).sort().map((n) => join(root, n));
}

export class VolumeFixture {
  readonly tmp = new TempDir();
  /** Mooring's directory (serve's --dir); this host's data engine is DIR/host. */
  readonly dir: string;
  /** The other hosts: one data-engine process per replica beyond the first. */
  readonly peers: HostProcess[];
  server: MooringServer | null = null;
  private created = false;

  constructor(
    readonly sizeBytes: number,
    readonly replicas: number,
    readonly extra: Partial<ServeOptions> = {},
  ) {
    this.dir = this.tmp.join('vol');
    this.peers = Array.from({ length: replicas - 1 }, (_, i) => new HostProcess({ hostId: `peer${i + 1}`, dir: this.tmp.join(`peer${i + 1}`), ip: '127.0.0.1', replicaPort: 0 }));
  }

  /** Every replica directory of the volume: this host's, then each peer's. */
  replicaDirs(): string[] {
    return [join(this.dir, 'host'), ...this.peers.map((p) => p.opts.dir)].flatMap(replicaDirsOf);
  }

  get uri(): string {
    if (!this.server) throw new Error('volume is not being served');
    return this.server.uri;
  }

  /** Serves the volume (creating it the first time). */
  async start(): Promise<MooringServer> {
    if (this.server?.alive) throw new Error('already serving');
    for (const p of this.peers) if (!p.proc?.alive) await p.start();
    this.server = await startServe({
      dir: this.dir,
      hosts: this.peers.map((p) => `unix:${p.grpcSocket}`),
      ...(this.peers.length > 0 ? { clusterSecretFile: this.peers[0]!.clusterSecretFile } : {}),
      ...(this.created ? {} : { size: this.sizeBytes, replicas: this.replicas }),
      ...this.extra,
    });
    this.created = true;
    expect(this.server.ready.sizeBytes).toBe(this.sizeBytes);
    expect(this.server.ready.replicas).toBe(this.replicas);
    expect(this.server.ready.epoch).toBeGreaterThan(0);
    return this.server;
  }

  /** SIGTERM; the contract says drain, flush, close, exit 0. */
  async stop(): Promise<void> {
    const s = this.server;
    if (!s) return;
    this.server = null;
    const code = await s.stop('SIGTERM');
    if (code !== 0) expect.fail(`mooring serve exited ${code} (signal ${s.exitSignal}) on SIGTERM${s.diagnostics()}`);
    // The contract: exactly one line on stdout (READY), logs go to stderr.
    expect(s.stdout.trim().split('\n'), 'serve stdout').toHaveLength(1);
  }

  async restart(): Promise<MooringServer> {
    await this.stop();
    return await this.start();
  }

  /** SIGKILL the server (a crash). */
  async crash(): Promise<void> {
    const s = this.server;
    this.server = null;
    await s?.crash();
  }

  /**
   * Stops the server and the peers if running, then checks every replica holds the same
   * bytes (and equals `expected` when given). Leaves them stopped (start() starts them all).
   */
  async checkReplicas(expected?: Buffer): Promise<void> {
    await this.stop();
    for (const p of this.peers) await p.stop();
    const dirs = this.replicaDirs();
    expect(dirs, 'replica directories').toHaveLength(this.replicas);
    expect(await assertReplicasIdentical(dirs, this.sizeBytes, expected)).toBe(this.replicas);
  }

  diagnostics(): string {
    return (this.server?.diagnostics() ?? '') + this.peers.map((p) => (p.proc?.alive === false ? p.diagnostics() : '')).join('');
  }

  async cleanup(): Promise<void> {
    if (this.server) await this.server.crash();
    this.server = null;
    for (const p of this.peers) await p.crash().catch(() => undefined);
    for (const p of this.peers) await p.client?.close().catch(() => undefined);
    this.tmp.cleanup();
  }
}
