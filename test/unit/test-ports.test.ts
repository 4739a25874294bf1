// Fixed ports in tests stay below Linux's ephemeral range (net.ipv4.ip_local_port_range,
// 32768-60999 by default): the kernel hands ports from that range to outgoing connections
// (every gRPC, NBD and etcd client in the suite), so a test that binds a fixed port there
// fails now and then with EADDRINUSE. It happened in CI: etcd on 48222 could not bind.
// This scans the test sources for a port-like number in that range.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..', '..');
const EPHEMERAL_LOW = 32768;
const EPHEMERAL_HIGH = 60999;
// Every five-digit number on a line that speaks of ports or of a loopback address.
const PORT_LINE = /port|127\.0\.0\./i;

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...sources(p));
    else if (/\.(ts|mjs)$/.test(name)) out.push(p);
  }
  return out;
}

export function ephemeralPorts(text: string): number[] {
  const found: number[] = [];
  for (const line of text.split('\n')) {
    if (!PORT_LINE.test(line)) continue;
    for (const m of line.matchAll(/\b\d{5}\b/g)) {
      const n = Number(m[0]);
      if (n >= EPHEMERAL_LOW && n <= EPHEMERAL_HIGH) found.push(n);
    }
  }
  return found;
}

describe('fixed test ports', () => {
  it('the scan finds a port in the ephemeral range (so it can fail)', () => {
    expect(ephemeralPorts("const etcd = await EtcdServer.start(48222, 48223); // ports")).toEqual([48222, 48223]);
    expect(ephemeralPorts("connect('127.0.0.1:47151')")).toEqual([47151]);
    expect(ephemeralPorts('const BASE_PORT = 27400;')).toEqual([]);
  });

  it('no test binds a fixed port in 32768-60999', () => {
    const offenders: string[] = [];
    for (const file of sources(join(ROOT, 'test'))) {
      if (file.endsWith('test-ports.test.ts')) continue;
      const ports = ephemeralPorts(readFileSync(file, 'utf8'));
      if (ports.length) offenders.push(`${relative(ROOT, file)}: ${ports.join(', ')}`);
    }
    expect(offenders, 'move these below 32768 (17000-29999 is what the suite uses)').toEqual([]);
  });
});
