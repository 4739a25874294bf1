// Network namespaces for the fault tests (docs/fault-tests.md): each simulated host gets
// its own namespace with one interface, plugged by a veth pair into a bridge that lives in
// a "switch" namespace of its own. The test process (the control plane) stays in the root
// namespace and never gets an address on this network: it reaches each host's gRPC server
// through a small forwarder that runs in a "ctl" namespace plugged into the same bridge
// (pathname unix sockets work across namespaces), so a partition can cut the control plane
// off from a host as well. NBD clients use the engines' unix sockets, which no partition
// touches.
//
// Partitions are nftables rules in the switch namespace's bridge (family bridge, forward
// hook) that drop IPv4/IPv6 frames between the ports of the two sides. ARP still passes, so
// neighbours stay resolved and nothing answers with an error: the peers see silence
// (timeouts, no resets, no ICMP). Heal removes the rules and traffic resumes (TCP
// retransmits). Link slowdowns (`slow`) are a tbf qdisc on the switch port.
//
// Every address is in TEST_SUBNET and exists only inside namespaces made here; nothing is
// routed to it from the root namespace. Namespaces are named `mft-<pid>-…` after the test
// process that made them: runs side by side (two worktrees on one machine) do not touch each
// other's, and a run killed halfway leaves nothing a later run does not sweep first
// (sweep() deletes the namespaces of processes that are gone).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { HostProcess } from './hosts.js';

/** Namespace name prefix ("mooring fault tests"). */
export const PREFIX = 'mft-';
/** This process's namespace prefix. */
export const OWN_PREFIX = `${PREFIX}${process.pid}-`;
/** The /24 every address of the lab is in (a private range, used only inside our namespaces). */
export const TEST_SUBNET = '10.251.77';
const SWITCH_NS = `${OWN_PREFIX}sw`;
const CTL = 'ctl';
const CTL_IP = `${TEST_SUBNET}.2`;
const TABLE = 'mft';
const CHAIN = 'cuts';
/** gRPC port of every host (each host has its own address). */
export const GRPC_PORT = 7600;
/** Replica server port of every host. */
export const REPLICA_PORT = 7700;

function sh(cmd: string, args: string[], input?: string): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', input, timeout: 20_000 });
  if (r.error) throw new Error(`${cmd} ${args.join(' ')}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: exit ${r.status}\n${r.stderr}${r.stdout}${input ? `\n--- input ---\n${input}` : ''}`);
  return r.stdout;
}

/** Fails loudly when a tool the lab needs is missing (no silent skips). */
export function requireNetTools(): void {
  for (const [tool, pkg] of [
    ['ip', 'iproute2'],
    ['nft', 'nftables'],
    ['tc', 'iproute2'],
  ] as const) {
    const r = spawnSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`required tool '${tool}' is not installed: run 'apt-get install -y ${pkg}' (or bash .ci/setup.sh)`);
  }
  if (process.getuid?.() !== 0) throw new Error('the fault tests create network namespaces: run them as root (CI does)');
}

/**
 * Deletes the namespaces of test processes that are gone (a killed run), and this
 * process's own, killing what still runs in them; returns their names. Namespaces of a run
 * still going (another worktree's) are left alone.
 */
export function sweep(): string[] {
  const names = sh('ip', ['netns', 'list'])
    .split('\n')
    .map((l) => l.split(' ')[0]!)
    .filter((n) => {
      const m = /^mft-(\d+)-/.exec(n);
      return m !== null && !alive(Number(m[1]));
    });
  for (const ns of names) deleteNs(ns);
  return names;
}

// Whether process `pid` runs (ours counts as gone: this process sweeps before it builds).
function alive(pid: number): boolean {
  if (pid === process.pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

// Kills what runs in a namespace of ours (data engines, the forwarder: ours, from this run
// or a killed one), then deletes it; its veth ends and the bridge go with it.
function deleteNs(ns: string): void {
  const pids = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' }).stdout.split('\n').filter((p) => /^\d+$/.test(p));
  for (const pid of pids) {
    try {
      process.kill(Number(pid), 'SIGKILL');
    } catch {
      // gone already
    }
  }
  const r = spawnSync('ip', ['netns', 'del', ns], { encoding: 'utf8' });
  if (r.status !== 0 && !/No such file/.test(r.stderr)) throw new Error(`ip netns del ${ns}: ${r.stderr}`);
}

// The forwarder: unix socket -> TCP inside the ctl namespace, one listener per host.
const FORWARDER = `
const net = require('node:net');
const fs = require('node:fs');
const routes = JSON.parse(process.argv[1]);
let left = routes.length;
for (const r of routes) {
  try { fs.unlinkSync(r.path); } catch {}
  const server = net.createServer((c) => {
    const u = net.connect({ host: r.host, port: r.port });
    const end = () => { c.destroy(); u.destroy(); };
    c.on('error', end); u.on('error', end); c.on('close', end); u.on('close', end);
    c.pipe(u); u.pipe(c);
  });
  server.on('error', (e) => { console.error('forwarder ' + r.path + ': ' + e.message); process.exit(1); });
  server.listen(r.path, () => { if (--left === 0) console.log('READY'); });
}
`;

export interface LabHost {
  id: string;
  ns: string;
  ip: string;
  /** Switch-side port of its veth pair. */
  port: string;
}

export class NetLab {
  readonly hosts: LabHost[];
  private forwarder: ChildProcess | null = null;
  private forwarderLog = '';
  private cuts: Array<[string, string]> = [];
  /** Namespaces this lab made (destroy() deletes these, and only these). */
  private made: string[] = [];
  private slowed = new Set<string>();
  private destroyed = false;

  private constructor(
    ids: string[],
    readonly dir: string,
  ) {
    this.hosts = ids.map((id, i) => ({ id, ns: `${OWN_PREFIX}h-${id}`, ip: `${TEST_SUBNET}.${10 + i}`, port: `p-${id}` }));
  }

  /**
   * Builds the lab: a switch namespace with a bridge, a ctl namespace and one namespace per
   * host id, each plugged into the bridge; the forwarder for gRPC. `dir` holds its sockets.
   */
  static async create(ids: string[], dir: string): Promise<NetLab> {
    requireNetTools();
    for (const id of ids) if (!/^[a-z0-9]{1,8}$/.test(id) || id === CTL) throw new Error(`bad lab host id ${id}`);
    const lab = new NetLab(ids, dir);
    try {
      lab.build();
      await lab.startForwarder();
    } catch (err) {
      lab.destroy();
      throw err;
    }
    return lab;
  }

  private addNs(ns: string): void {
    sh('ip', ['netns', 'add', ns]);
    this.made.push(ns);
  }

  private build(): void {
    this.addNs(SWITCH_NS);
    sh('ip', ['-n', SWITCH_NS, 'link', 'add', 'br0', 'type', 'bridge']);
    sh('ip', ['-n', SWITCH_NS, 'link', 'set', 'br0', 'up']);
    const plug = (ns: string, port: string, ip: string): void => {
      this.addNs(ns);
      // Both ends are made inside our namespaces: nothing appears in the root namespace.
      sh('ip', ['-n', SWITCH_NS, 'link', 'add', port, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
      sh('ip', ['-n', SWITCH_NS, 'link', 'set', port, 'master', 'br0']);
      sh('ip', ['-n', SWITCH_NS, 'link', 'set', port, 'up']);
      sh('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
      sh('ip', ['-n', ns, 'addr', 'add', `${ip}/24`, 'dev', 'eth0']);
      sh('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
    };
    plug(`${OWN_PREFIX}${CTL}`, `p-${CTL}`, CTL_IP);
    for (const h of this.hosts) plug(h.ns, h.port, h.ip);
    sh('ip', ['netns', 'exec', SWITCH_NS, 'nft', '-f', '-'], `table bridge ${TABLE} {\n  chain ${CHAIN} {\n    type filter hook forward priority 0; policy accept;\n  }\n}\n`);
  }

  private async startForwarder(): Promise<void> {
    const routes = this.hosts.map((h) => ({ path: this.grpcSocket(h.id), host: h.ip, port: GRPC_PORT }));
    const child = spawn('ip', ['netns', 'exec', `${OWN_PREFIX}${CTL}`, process.execPath, '-e', FORWARDER, JSON.stringify(routes)], { stdio: ['ignore', 'pipe', 'pipe'] });
    this.forwarder = child;
    child.stdout.setEncoding('utf8').on('data', (d: string) => (this.forwarderLog += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (this.forwarderLog += d));
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`gRPC forwarder not ready within 10 s: ${this.forwarderLog}`)), 10_000);
      const check = (): void => {
        if (this.forwarderLog.includes('READY')) {
          clearTimeout(t);
          resolve();
        }
      };
      child.stdout.on('data', check);
      child.on('exit', (code, sig) => {
        clearTimeout(t);
        reject(new Error(`gRPC forwarder exited (${code ?? sig}): ${this.forwarderLog}`));
      });
    });
    for (const h of this.hosts) if (!existsSync(this.grpcSocket(h.id))) throw new Error(`forwarder socket ${this.grpcSocket(h.id)} missing`);
  }

  host(id: string): LabHost {
    const h = this.hosts.find((x) => x.id === id);
    if (!h) throw new Error(`no lab host ${id}`);
    return h;
  }

  /** The command prefix that runs a program inside a host's namespace. */
  wrap(id: string): string[] {
    return ['ip', 'netns', 'exec', id === CTL ? `${OWN_PREFIX}${CTL}` : this.host(id).ns];
  }

  /** Where the test reaches a host's gRPC server (the forwarder's socket). */
  grpcSocket(id: string): string {
    return join(this.dir, `grpc-${id}.sock`);
  }

  /** Data-engine hosts on this lab (not started): replica server and gRPC on the host's address. */
  makeHosts(root: string): HostProcess[] {
    return this.hosts.map(
      (h) =>
        new HostProcess({
          hostId: h.id,
          dir: join(root, `host-${h.id}`),
          ip: h.ip,
          replicaPort: REPLICA_PORT,
          netns: h.ns,
          grpcListen: `tcp:${h.ip}:${GRPC_PORT}`,
          grpcConnect: `unix:${this.grpcSocket(h.id)}`,
          // Traffic between the namespaces is plain TCP on the lab's private network.
          extraArgs: ['--allow-insecure-remote'],
        }),
    );
  }

  /** Drops every IP frame between each member of `a` and each member of `b` (ids, or 'ctl'). Adds to earlier cuts. */
  cut(a: string[], b: string[]): void {
    for (const x of a) for (const y of b) if (x !== y) this.cuts.push([x, y]);
    this.applyCuts();
  }

  /** Cuts `id` off from every other host and from the control plane. */
  isolate(id: string): void {
    this.cut([id], [...this.hosts.map((h) => h.id), CTL]);
  }

  /** Removes every cut, or those touching one of `ids`. */
  heal(ids?: string[]): void {
    const before = this.cuts.length;
    this.cuts = ids === undefined ? [] : this.cuts.filter(([x, y]) => !ids.includes(x) && !ids.includes(y));
    if (ids === undefined || this.cuts.length !== before) this.applyCuts();
  }

  /** The current cuts, for messages. */
  describe(): string {
    const cuts = this.cuts.map(([x, y]) => `${x}|${y}`).join(' ') || 'none';
    return `cuts: ${cuts}; slowed: ${[...this.slowed].join(' ') || 'none'}`;
  }

  private portOf(id: string): string {
    return id === CTL ? `p-${CTL}` : this.host(id).port;
  }

  private applyCuts(): void {
    const rules = this.cuts.flatMap(([x, y]) => [
      `add rule bridge ${TABLE} ${CHAIN} iifname "${this.portOf(x)}" oifname "${this.portOf(y)}" ether type { ip, ip6 } drop`,
      `add rule bridge ${TABLE} ${CHAIN} iifname "${this.portOf(y)}" oifname "${this.portOf(x)}" ether type { ip, ip6 } drop`,
    ]);
    // One transaction: the chain is flushed and refilled atomically.
    sh('ip', ['netns', 'exec', SWITCH_NS, 'nft', '-f', '-'], [`flush chain bridge ${TABLE} ${CHAIN}`, ...rules, ''].join('\n'));
  }

  /** Limits what reaches `id` through its switch port to `rate` (tc tbf, e.g. '40mbit'); null removes the limit. */
  slow(id: string, rate: string | null): void {
    const port = this.portOf(id);
    if (rate === null) {
      if (this.slowed.delete(id)) sh('ip', ['netns', 'exec', SWITCH_NS, 'tc', 'qdisc', 'del', 'dev', port, 'root']);
      return;
    }
    sh('ip', ['netns', 'exec', SWITCH_NS, 'tc', 'qdisc', 'replace', 'dev', port, 'root', 'tbf', 'rate', rate, 'burst', '32kb', 'latency', '400ms']);
    this.slowed.add(id);
  }

  /** Output of the forwarder (for failure messages). */
  diagnostics(): string {
    return `\n--- net lab (${this.describe()}) forwarder ---\n${this.forwarderLog.slice(-2000)}`;
  }

  /**
   * Kills the forwarder and deletes the lab's namespaces (with their links and the bridge),
   * and whatever still runs in them. Idempotent.
   */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    if (this.forwarder && this.forwarder.exitCode === null && this.forwarder.signalCode === null) this.forwarder.kill('SIGKILL');
    for (const ns of this.made.splice(0)) deleteNs(ns);
  }
}
