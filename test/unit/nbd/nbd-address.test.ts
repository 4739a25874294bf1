import { describe, expect, it } from 'vitest';

import { checkExportName, formatNbdAddress, nbdUri, parseNbdAddress } from '../../../src/nbd/nbd-address.js';
import { toNativeNbdOptions } from '../../../src/nbd/nbd-export.js';

describe('parseNbdAddress', () => {
  it('parses unix sockets, resolving relative paths', () => {
    expect(parseNbdAddress('unix:/run/x.sock')).toEqual({ kind: 'unix', path: '/run/x.sock' });
    expect(parseNbdAddress('unix:x.sock', '/tmp/d')).toEqual({ kind: 'unix', path: '/tmp/d/x.sock' });
    expect(parseNbdAddress('unix:/a/../b.sock')).toEqual({ kind: 'unix', path: '/b.sock' });
  });
  it('parses tcp hosts and ports', () => {
    expect(parseNbdAddress('tcp:127.0.0.1:10809')).toEqual({ kind: 'tcp', host: '127.0.0.1', port: 10809 });
    expect(parseNbdAddress('tcp:localhost:0')).toEqual({ kind: 'tcp', host: 'localhost', port: 0 });
    expect(parseNbdAddress('tcp:[::1]:5000')).toEqual({ kind: 'tcp', host: '::1', port: 5000 });
  });
  it.each([
    'unix:',
    'unix:/tmp/dir/',
    `unix:/${'a'.repeat(200)}`,
    'unix:/tmp/a\0b',
    'tcp:',
    'tcp:127.0.0.1',
    'tcp::80',
    'tcp:127.0.0.1:',
    'tcp:127.0.0.1:65536',
    'tcp:127.0.0.1:-1',
    'tcp:127.0.0.1:8x',
    'tcp:bad host:80',
    'tcp:[::1:80',
    'tcp:[notip]:80',
    'tcp:::1:80',
    'http://x',
    '/tmp/sock',
    '',
  ])('refuses %j', (text) => {
    expect(() => parseNbdAddress(text)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
  });
  it('round-trips through formatNbdAddress', () => {
    for (const a of ['unix:/tmp/x.sock', 'tcp:127.0.0.1:1', 'tcp:[::1]:2', 'tcp:host.example:3']) {
      expect(formatNbdAddress(parseNbdAddress(a))).toBe(a);
    }
  });
});

describe('nbdUri', () => {
  it('builds the URIs clients use', () => {
    expect(nbdUri({ kind: 'unix', path: '/tmp/v/nbd.sock' })).toBe('nbd+unix:///?socket=/tmp/v/nbd.sock');
    expect(nbdUri({ kind: 'tcp', host: '127.0.0.1', port: 10809 })).toBe('nbd://127.0.0.1:10809/');
    expect(nbdUri({ kind: 'tcp', host: '::1', port: 10809 }, 'disk0')).toBe('nbd://[::1]:10809/disk0');
    expect(nbdUri({ kind: 'unix', path: '/tmp/a b/s' }, 'x')).toBe('nbd+unix:///x?socket=/tmp/a%20b/s');
  });
});

describe('export options', () => {
  it('checks export names', () => {
    expect(checkExportName('')).toBe('');
    expect(checkExportName('disk-0')).toBe('disk-0');
    expect(() => checkExportName('has space')).toThrow();
    expect(() => checkExportName('x'.repeat(256))).toThrow();
  });
  it('converts to native options and checks limits', () => {
    const { native, address } = toNativeNbdOptions({ nbd: 'tcp:127.0.0.1:0', exportName: 'a', ioThreads: 2 });
    expect(address).toEqual({ kind: 'tcp', host: '127.0.0.1', port: 0 });
    expect(native).toEqual({ tcpHost: '127.0.0.1', tcpPort: 0, exportName: 'a', ioThreads: 2 });
    expect(() => toNativeNbdOptions({ nbd: 'unix:/x', ioThreads: 0 })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    expect(() => toNativeNbdOptions({ nbd: 'unix:/x', maxRequestBytes: 2 ** 30 })).toThrow();
    expect(() => toNativeNbdOptions({})).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
  });
});
