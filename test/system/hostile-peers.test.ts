// Hostile peers on a data engine's replica port (docs/hardening.md): 100 connections that
// open the replica, send 4 MiB READs and never read the replies, and more whose WRITE
// payloads stop half-way. Two `mooring data-engine` processes; a 2-replica volume whose
// engine runs on host b reaches its replica on host a over that same port. Host a runs with
// a 64 MiB buffer budget. Proven:
// - a's anonymous RSS stays under baseline + budget + reserve + a fixed slack while they push;
// - the good engine keeps being served: qemu-io rounds go on verifying, a's replica stays RW;
// - once they leave, it comes back to within 10% of its baseline (memory handed back).
// Without the budget each such connection pinned up to 64 MiB (6.5 GiB for 100).
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { Mooring } from '../../src/mooring.js';
import type { FileStateStore } from '../../src/state/file-state-store.js';
import { encodeRequest, Op, RawClient, rawAuthenticate } from '../native/remote-helpers.js';
import { makeHosts, openCluster, stopCluster, waitFor, type HostProcess } from './helpers/hosts.js';
import { qemuIo, TempDir } from './helpers/tools.js';

const MiB = 1 << 20;
const SIZE = 64 * MiB;
const VOLUME = 'hostile';
const BUDGET = 64 * MiB;
// The server's reserve for connections with nothing in flight: two largest requests
// (16 MiB payload + 4 MiB reply each; src: ReplicaServerImpl).
const RESERVE = 2 * (16 + 4) * MiB;
// What 100 more connections cost besides their buffers (two threads each, a receive buffer,
// TLS-less transports) and allocator slack: fixed, not a multiple of what they ask for.
const SLACK = 96 * MiB;
const READERS = 100;
const STALLED_WRITERS = 20;
const READS_PER_CONNECTION = 32; // 4 MiB each: 128 MiB asked per connection, 12.5 GiB in all

/**
 * Connects to the replica server at ip:port and opens `name` (HELLO answered OK), proving
 * the cluster secret first: these peers are hostile but hold the secret (a compromised
 * host of the cluster), the worst case for what they can make the server hold.
 */
async function openReplica(ip: string, port: number, name: string, secret: Buffer | undefined): Promise<RawClient> {
  const c = await RawClient.connect(port, ip);
  if (secret) {
    const { reply } = await rawAuthenticate(c, secret);
    if (!reply || reply.code !== 0) throw new Error(`AUTH: ${reply ? `code ${reply.code} ${reply.payload.toString()}` : 'connection closed'}`);
  }
  c.send({ op: Op.HELLO, seq: 0, payload: Buffer.from(name) });
  const r = await c.next();
  if (!r || r.code !== 0) throw new Error(`HELLO ${name}: ${r ? `code ${r.code} ${r.payload.toString()}` : 'connection closed'}`);
  return c;
}

/** The mappings of `pid` holding the most resident memory, for failure messages. */
function largestMappings(pid: number, n = 8): string {
  const out: Array<{ name: string; rss: number }> = [];
  let name = '';
  for (const line of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (head) name = head[0]!;
    const rss = /^Rss:\s+(\d+) kB$/.exec(line);
    if (rss) out.push({ name, rss: Number(rss[1]) });
  }
  return out
    .sort((x, y) => y.rss - x.rss)
    .slice(0, n)
    .map((m) => `  ${m.rss} kB ${m.name}`)
    .join('\n');
}

// Anonymous resident memory (RssAnon): what the process allocated. File-backed pages (the
// node binary's code paged in as more of it runs) are not memory it holds.
function rssBytes(pid: number): number {
  const m = /^RssAnon:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no RssAnon for pid ${pid}`);
  return Number(m[1]) * 1024;
}

describe('hostile peers on the replica port', () => {
  const tmp = new TempDir();
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  let store: FileStateStore;
  const nbd = `unix:${tmp.join('hostile.sock')}`;
  const uri = `nbd+unix:///?socket=${tmp.join('hostile.sock')}`;

  beforeAll(async () => {
    hosts = makeHosts(tmp.path, 2, 18400);
    hosts[0]!.opts.extraArgs = ['--replica-buffer-bytes', `${BUDGET / MiB}M`];
    for (const h of hosts) await h.start();
    ({ cluster, store } = await openCluster(tmp.path, hosts));
  });

  afterAll(() => stopCluster({ cluster, store, hosts, tmp }));

  it('keeps memory under its budget, serves the good engine, and gives the memory back', async () => {
    const a = hosts[0]!;
    await cluster.createVolume({ name: VOLUME, sizeBytes: SIZE, replicas: 2 });
    const st = await cluster.volume(VOLUME).attach({ host: 'b', nbd });
    expect(st.state, JSON.stringify(st)).toBe('healthy');
    const [replicaName] = readdirSync(join(a.opts.dir, 'replicas'));
    const port = a.opts.replicaPort;
    const diag = (): string => hosts.map((h) => h.diagnostics()).join('');

    // The good client's rounds: 1 MiB written and read back, somewhere in the first 8 MiB.
    let rounds = 0;
    const round = async (): Promise<void> => {
      const p = 0x20 + (rounds % 200);
      const out = await qemuIo(uri, [`write -P ${p} ${(rounds % 8) * MiB} 1M`, `read -P ${p} ${(rounds % 8) * MiB} 1M`], 30_000);
      expect(out, `round ${rounds}${diag()}`).not.toMatch(/Pattern verification failed|error/i);
      rounds++;
    };
    // Warm both sides up with them (threads, allocator arenas), then take the baseline.
    for (let i = 0; i < 40; i++) await round();
    const baseline = rssBytes(a.proc!.pid);

    const hostile: RawClient[] = [];
    for (let i = 0; i < READERS; i++) {
      const c = await openReplica(a.opts.ip, port, replicaName!, a.clusterSecret);
      c.socket.pause(); // never read a reply
      hostile.push(c);
      for (let k = 0; k < READS_PER_CONNECTION; k++) c.send({ op: Op.READ, seq: k + 1, offset: (k % 16) * 4 * MiB, length: 4 * MiB });
    }
    for (let i = 0; i < STALLED_WRITERS; i++) {
      const c = await openReplica(a.opts.ip, port, replicaName!, a.clusterSecret);
      c.socket.pause();
      hostile.push(c);
      // A 4 MiB WRITE whose payload stops after 1 MiB, and stays stopped.
      const full = encodeRequest({ op: Op.WRITE, seq: 1, offset: 32 * MiB, length: 4 * MiB, payload: Buffer.alloc(4 * MiB, 0xee) });
      c.sendRaw(full.subarray(0, 48 + MiB));
    }

    // While they push: the good client writes and verifies, and a's RSS is sampled.
    let peak = baseline;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        peak = Math.max(peak, rssBytes(a.proc!.pid));
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    const started = Date.now();
    const warm = rounds;
    while (Date.now() - started < 8000) await round();
    sampling = false;
    await sampler;
    const during = await cluster.volume(VOLUME).status();
    const bound = baseline + BUDGET + RESERVE + SLACK;
    console.log(
      `hostile peers: baseline ${(baseline / MiB).toFixed(0)} MiB, peak ${(peak / MiB).toFixed(0)} MiB (bound ${(bound / MiB).toFixed(0)}), ` +
        `${rounds - warm} good rounds in 8 s`,
    );
    expect(during.replicas.find((r) => r.hostId === 'a')?.mode, `${JSON.stringify(during)}${diag()}`).toBe('RW');
    expect(during.state).toBe('healthy');
    expect(rounds - warm).toBeGreaterThanOrEqual(5);
    expect(peak, `peak RSS ${peak} over ${bound}${diag()}`).toBeLessThanOrEqual(bound);

    // They leave: the memory goes back to the OS.
    for (const c of hostile) c.close();
    const back = await waitFor(async () => rssBytes(a.proc!.pid) <= baseline * 1.1, 30_000, 250);
    const after = rssBytes(a.proc!.pid);
    console.log(`hostile peers gone: RSS ${(after / MiB).toFixed(0)} MiB against a baseline of ${(baseline / MiB).toFixed(0)} MiB`);
    expect(back, `RSS ${after} did not come back within 10% of ${baseline}; largest mappings:\n${largestMappings(a.proc!.pid)}${diag()}`).toBe(true);
    // And the volume is still whole.
    const out = await qemuIo(uri, [`read -P ${0x20 + ((rounds - 1) % 200)} ${((rounds - 1) % 8) * MiB} 1M`]);
    expect(out).not.toMatch(/Pattern verification failed|error/i);
  });
});
