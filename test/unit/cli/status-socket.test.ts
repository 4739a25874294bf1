// The status socket of `mooring serve` against hostile clients: garbage gets a coded error,
// an overlong request line is dropped, a crowd of silent clients cannot lock out an honest
// one (the oldest silent connection makes room), and the server answers the next honest
// client through all of it.
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { queryStatus, serveStatus, type StatusServer } from '../../../src/cli/status-socket.js';

// Sends `data` and resolves with what came back before the server closed the connection.
function exchange(path: string, data: string | Buffer): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = connect(path);
    let got = '';
    sock.on('connect', () => sock.write(data));
    sock.on('data', (d: Buffer) => (got += d.toString()));
    sock.on('close', () => resolve(got));
    sock.on('error', reject);
  });
}

describe('status socket', () => {
  let dir: string;
  let server: StatusServer;
  let asked = 0;

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'mooring-ss-'));
    asked = 0;
    server = await serveStatus(join(dir, 'status.sock'), async () => ({ name: 'v', asked: ++asked }));
  });
  afterEach(async () => {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('answers status with the pid and the provider, owner-only, and nothing once closed', async () => {
    expect(await queryStatus(server.path)).toEqual({ pid: process.pid, status: { name: 'v', asked: 1 } });
    expect((await stat(server.path)).mode & 0o777).toBe(0o600);
    await server.close();
    expect(await queryStatus(server.path)).toBeNull();
    expect(await queryStatus(join(dir, 'never.sock'))).toBeNull();
  });

  it('gives garbage a coded error, drops overlong lines, and keeps answering', async () => {
    expect(JSON.parse(await exchange(server.path, 'DROP TABLE volumes\n'))).toEqual({ error: { code: 'PROTOCOL_ERROR', message: expect.stringMatching(/unknown request/) } });
    expect(await exchange(server.path, Buffer.alloc(4096, 0x41))).toBe('');
    expect(await exchange(server.path, 'status\nstatus\nstatus\n')).toMatch(/^\{"pid":\d+,"status":\{"name":"v","asked":1\}\}\n$/);
    expect(asked).toBe(1);
    const crowd = Array.from({ length: 20 }, () => connect(server.path).on('error', () => undefined));
    await Promise.all(crowd.map((c) => new Promise((r) => c.once('connect', r).once('close', r))));
    expect((await queryStatus(server.path))?.status).toMatchObject({ name: 'v' });
    for (const c of crowd) c.destroy();
  });

  it('reports a provider failure with its code', async () => {
    await server.close();
    server = await serveStatus(join(dir, 'status.sock'), async () => {
      throw Object.assign(new Error('engine closed'), { code: 'CLOSED' });
    });
    await expect(queryStatus(server.path)).rejects.toMatchObject({ code: 'CLOSED', message: expect.stringMatching(/engine closed/) });
  });
});
