// The fault tests' network (test/system/helpers/netns.ts) does what they rely on:
// - a partition is silent: an open TCP connection across it gets no answer and no error,
//   a new connection neither connects nor is refused (timeouts, not resets);
// - a unix socket of a partitioned host still works (NBD clients keep reaching the engine);
// - the control plane's path to a host (the gRPC forwarder) is cut by isolate() too;
// - cuts are pairwise: cutting a from b leaves a and c talking;
// - heal restores traffic, and the connection that was cut carries what it queued;
// - slow() limits a host's link; destroy() and sweep() leave no namespace behind, and sweep()
//   leaves a run that is still going alone.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { waitFor } from '../helpers/hosts.js';
import { GRPC_PORT, NetLab, OWN_PREFIX, PREFIX, sweep } from '../helpers/netns.js';
import { TempDir } from '../helpers/tools.js';

const PORT = 7611;

// Echo server on TCP (the host's address) and on a unix socket, inside a namespace.
const SERVER = `
const net = require('node:net');
const [ip, port, grpcPort, path] = process.argv.slice(1);
const echo = (c) => { c.on('data', (d) => c.write(d)); c.on('error', () => {}); };
let n = 0;
const ready = () => { if (++n === 3) console.log('READY'); };
net.createServer(echo).listen(Number(port), ip, ready);
net.createServer(echo).listen(Number(grpcPort), ip, ready);
net.createServer(echo).listen(path, ready);
`;

// A client that keeps one connection: every stdin line is sent, every echo printed.
const CLIENT = `
const net = require('node:net');
const [ip, port] = process.argv.slice(1);
const s = net.connect({ host: ip, port: Number(port) }, () => console.log('CONNECTED'));
s.setEncoding('utf8');
s.on('data', (d) => { for (const l of d.split('\\n')) if (l) console.log('ECHO ' + l); });
s.on('error', (e) => console.log('ERROR ' + e.code));
s.on('close', () => console.log('CLOSED'));
process.stdin.setEncoding('utf8').on('data', (d) => s.write(d));
`;

// One connection attempt: prints connected, refused/unreachable (the error code) or timeout.
const CONNECT_ONCE = `
const net = require('node:net');
const [ip, port, ms] = process.argv.slice(1);
const s = net.connect({ host: ip, port: Number(port) });
const t = setTimeout(() => { console.log('timeout'); process.exit(0); }, Number(ms));
s.on('connect', () => { console.log('connected'); process.exit(0); });
s.on('error', (e) => { clearTimeout(t); console.log(e.code); process.exit(0); });
`;

// A bulk send of `bytes` to an echo server, timed (in milliseconds, printed).
const BULK = `
const net = require('node:net');
const [ip, port, bytes] = process.argv.slice(1);
const t0 = Date.now();
let got = 0;
const s = net.connect({ host: ip, port: Number(port) }, () => s.write(Buffer.alloc(Number(bytes), 1)));
s.on('data', (d) => { got += d.length; if (got >= Number(bytes)) { console.log(Date.now() - t0); process.exit(0); } });
s.on('error', (e) => { console.log('ERROR ' + e.code); process.exit(1); });
`;

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('fault-test network namespaces', () => {
  let tmp: TempDir;
  let lab: NetLab;
  const children: ChildProcess[] = [];

  const inNs = (host: string, script: string, args: string[]): ChildProcess => {
    const c = spawn(lab.wrap(host)[0]!, [...lab.wrap(host).slice(1), process.execPath, '-e', script, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    children.push(c);
    return c;
  };
  const output = (c: ChildProcess): { text: () => string } => {
    let out = '';
    c.stdout!.setEncoding('utf8').on('data', (d: string) => (out += d));
    c.stderr!.setEncoding('utf8').on('data', (d: string) => (out += d));
    return { text: () => out };
  };
  const connectOnce = (from: string, ip: string, port: number, ms: number): string => {
    const r = spawnSync(lab.wrap(from)[0]!, [...lab.wrap(from).slice(1), process.execPath, '-e', CONNECT_ONCE, ip, String(port), String(ms)], { encoding: 'utf8', timeout: ms + 10_000 });
    if (r.status !== 0) throw new Error(`connect probe failed: ${r.stderr}`);
    return r.stdout.trim();
  };
  const unixEcho = async (path: string, msg: string, ms: number): Promise<string> =>
    await new Promise((resolve) => {
      const s = net.connect({ path });
      let got = '';
      const t = setTimeout(() => {
        s.destroy();
        resolve(`timeout (${got})`);
      }, ms);
      s.on('connect', () => s.write(msg));
      s.setEncoding('utf8').on('data', (d: string) => {
        got += d;
        if (got === msg) {
          clearTimeout(t);
          s.destroy();
          resolve(got);
        }
      });
      s.on('error', (e) => {
        clearTimeout(t);
        resolve(`error ${(e as NodeJS.ErrnoException).code}`);
      });
    });

  beforeAll(async () => {
    sweep();
    tmp = new TempDir();
    lab = await NetLab.create(['a', 'b', 'c'], tmp.path);
  });

  afterEach(() => {
    for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    lab.heal();
    lab.slow('a', null);
  });

  afterAll(() => {
    lab?.destroy();
    tmp?.cleanup();
  });

  it('a partition is silent both ways, spares unix sockets and the cut is healed', async () => {
    const a = lab.host('a');
    const sockPath = join(tmp.path, 'a-echo.sock');
    const server = inNs('a', SERVER, [a.ip, String(PORT), String(GRPC_PORT), sockPath]);
    const sOut = output(server);
    expect(await waitFor(async () => sOut.text().includes('READY'), 10_000, 20), sOut.text()).toBe(true);

    const client = inNs('b', CLIENT, [a.ip, String(PORT)]);
    const cOut = output(client);
    client.stdin!.write('one\n');
    expect(await waitFor(async () => cOut.text().includes('ECHO one'), 10_000, 20), cOut.text()).toBe(true);
    expect(await unixEcho(lab.grpcSocket('a'), 'via-forwarder', 5000)).toBe('via-forwarder');

    lab.isolate('a');
    client.stdin!.write('two\n');
    // Nothing comes back, and nothing fails: the peer just goes quiet.
    expect(connectOnce('b', a.ip, PORT, 1500)).toBe('timeout');
    expect(connectOnce('c', a.ip, PORT, 500)).toBe('timeout');
    expect(connectOnce('a', lab.host('b').ip, PORT, 500)).toBe('timeout');
    expect(cOut.text()).not.toMatch(/ECHO two|ERROR|CLOSED/);
    // The control plane's path to a (the forwarder in the ctl namespace) is cut too ...
    expect(await unixEcho(lab.grpcSocket('a'), 'cut', 1000)).toMatch(/^timeout/);
    // ... while a's own unix socket (an NBD client on a's host) still works.
    expect(await unixEcho(sockPath, 'local', 5000)).toBe('local');
    expect(lab.describe()).toMatch(/a\|b/);

    lab.heal();
    // TCP retransmits what was queued; new connections work again.
    expect(await waitFor(async () => cOut.text().includes('ECHO two'), 20_000, 50), cOut.text()).toBe(true);
    expect(cOut.text()).not.toMatch(/ERROR|CLOSED/);
    expect(connectOnce('b', a.ip, PORT, 5000)).toBe('connected');
    expect(await unixEcho(lab.grpcSocket('a'), 'healed', 5000)).toBe('healed');
  });

  it('cuts are pairwise: a|b leaves a and c, and b and c, talking', async () => {
    const a = lab.host('a');
    const server = inNs('a', SERVER, [a.ip, String(PORT), String(GRPC_PORT), join(tmp.path, 'a2.sock')]);
    const sOut = output(server);
    expect(await waitFor(async () => sOut.text().includes('READY'), 10_000, 20), sOut.text()).toBe(true);
    lab.cut(['a'], ['b']);
    expect(connectOnce('b', a.ip, PORT, 1000)).toBe('timeout');
    expect(connectOnce('c', a.ip, PORT, 5000)).toBe('connected');
    expect(await unixEcho(lab.grpcSocket('a'), 'ctl', 5000)).toBe('ctl');
  });

  it('slow() limits the rate into a host', async () => {
    const a = lab.host('a');
    const server = inNs('a', SERVER, [a.ip, String(PORT), String(GRPC_PORT), join(tmp.path, 'a3.sock')]);
    const sOut = output(server);
    expect(await waitFor(async () => sOut.text().includes('READY'), 10_000, 20), sOut.text()).toBe(true);
    const bulk = (): number => {
      const r = spawnSync(lab.wrap('b')[0]!, [...lab.wrap('b').slice(1), process.execPath, '-e', BULK, a.ip, String(PORT), String(512 * 1024)], { encoding: 'utf8', timeout: 30_000 });
      if (r.status !== 0) throw new Error(`bulk send failed: ${r.stdout}${r.stderr}`);
      return Number(r.stdout.trim());
    };
    const fast = bulk();
    lab.slow('a', '4mbit');
    const slow = bulk();
    // 512 KiB at 4 Mbit/s is about 1 s.
    expect(slow, `fast ${fast} ms, slow ${slow} ms`).toBeGreaterThan(700);
    expect(fast).toBeLessThan(slow / 3);
  });

  it('destroy() removes every namespace; sweep() removes leftovers of a killed run', async () => {
    const other = await NetLab.create(['x'], tmp.path).catch((e: unknown) => e);
    // Only one lab at a time: the second one's names clash with the first's.
    expect(other).toBeInstanceOf(Error);
    // A killed run's namespace (its process is gone), and one of a run still going (a
    // live process that is not this one: our parent).
    let dead = 4_000_000;
    while (dead > 3_000_000 && pidAlive(dead)) dead--;
    const leftover = `${PREFIX}${dead}-h-leftover`;
    const live = `${PREFIX}${process.ppid}-h-live`;
    spawnSync('ip', ['netns', 'add', leftover]);
    spawnSync('ip', ['netns', 'add', live]);
    const swept = sweep();
    spawnSync('ip', ['netns', 'del', live]);
    expect(swept).toContain(leftover);
    expect(swept).toContain(`${OWN_PREFIX}sw`);
    expect(swept).not.toContain(live);
    const left = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout;
    expect(left).not.toContain(OWN_PREFIX);
    expect(left).not.toContain(leftover);
    // The lab is gone; make a fresh one for the hooks.
    lab = await NetLab.create(['a', 'b', 'c'], tmp.path);
  });
});
