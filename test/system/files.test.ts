// Files on disk: what Mooring creates is private to its user (directories 0700, files
// 0600, NBD sockets 0600, or 0660 for a chosen group), and hostile or impossible paths
// fail at once with a coded error: a FIFO, socket, device or symlink where metadata
// belongs, a directory under /proc, a read-only filesystem. Real addon, real CLI.
import { execFileSync } from 'node:child_process';
import { chownSync, lstatSync, mkdirSync, readdirSync, renameSync, rmSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

import { Mooring } from '../../src/index.js';
import { PRIVATE_DIR_MODE, PRIVATE_FILE_MODE } from '../../src/util/files.js';
import { cliPath, killAllServers, startCliProcess, startServe, type ReadyInfo } from './helpers/serve.js';
import { run, TempDir } from './helpers/tools.js';

const MiB = 1024 * 1024;

/** Every entry under `root` (itself included) with its type and permission bits. */
function modesUnder(root: string): { path: string; kind: 'dir' | 'file' | 'socket' | 'other'; mode: number }[] {
  const out: { path: string; kind: 'dir' | 'file' | 'socket' | 'other'; mode: number }[] = [];
  const walk = (p: string): void => {
    const st = lstatSync(p);
    const kind = st.isDirectory() ? 'dir' : st.isFile() ? 'file' : st.isSocket() ? 'socket' : 'other';
    out.push({ path: p, kind, mode: st.mode & 0o777 });
    if (st.isDirectory()) for (const e of readdirSync(p)) walk(join(p, e));
  };
  walk(root);
  return out;
}

function fmt(entries: { path: string; mode: number }[]): string {
  return entries.map((e) => `${e.mode.toString(8).padStart(4, '0')} ${e.path}`).join('\n');
}

describe('files Mooring creates are private to its user', () => {
  const temps: TempDir[] = [];
  afterEach(async () => {
    await killAllServers();
    for (const t of temps.splice(0)) t.cleanup();
  });

  it('makes directories 0700, files 0600 and the NBD socket 0600, whatever the umask', async () => {
    const t = new TempDir();
    temps.push(t);
    const dir = t.join('m');
    // A permissive umask: the modes must come from Mooring, not from the environment.
    const server = await startCliProcess(['serve', '--dir', dir, '--size', '64M', '--replicas', '1'], 'mooring serve (umask 000)', 30_000, undefined, ['sh', '-c', 'umask 000 && exec "$@"', 'sh']);
    server.ready = JSON.parse(server.readyLine) as ReadyInfo;
    const entries = modesUnder(dir);
    const sockets = entries.filter((e) => e.kind === 'socket');
    expect(sockets.map((e) => e.path)).toContain(server.ready.nbd.slice('unix:'.length));
    const wrong = entries.filter((e) =>
      e.kind === 'dir' ? e.mode !== PRIVATE_DIR_MODE : e.kind === 'file' || e.kind === 'socket' ? e.mode !== PRIVATE_FILE_MODE : true,
    );
    expect(wrong, `not private:\n${fmt(wrong)}\nall:\n${fmt(entries)}`).toEqual([]);
    // The walk saw the replica's layer and metadata, the store's documents and the locks.
    expect(entries.filter((e) => e.kind === 'file').length, fmt(entries)).toBeGreaterThan(5);
  });

  it('gives the NBD socket to --socket-group with mode 0660, and refuses an unknown group as a usage error', async () => {
    const t = new TempDir();
    temps.push(t);
    const gid = 4242;
    const server = await startServe({ dir: t.join('m'), size: 64 * MiB, replicas: 1, extraArgs: ['--socket-group', String(gid)] });
    const sock = lstatSync(server.ready.nbd.slice('unix:'.length));
    expect({ mode: sock.mode & 0o777, gid: sock.gid }).toEqual({ mode: 0o660, gid });

    const bad = await run('node', [cliPath, 'serve', '--dir', t.join('n'), '--size', '64M', '--socket-group', 'no-such-group-here'], { allowFailure: true });
    expect(bad.code, bad.stderr).toBe(2);
    expect(bad.stderr).toMatch(/--socket-group: no group "no-such-group-here"/);
  });
});

describe('hostile and impossible paths fail at once with a code', () => {
  const temps: TempDir[] = [];
  const mounts: string[] = [];
  afterEach(() => {
    for (const m of mounts.splice(0)) execFileSync('umount', ['-l', m]);
    for (const t of temps.splice(0)) t.cleanup();
  });

  async function makeVolume(dir: string): Promise<string> {
    const m = await Mooring.open({ dir });
    try {
      await m.createVolume({ name: 'v', sizeBytes: 16 * MiB, replicas: 1 });
    } finally {
      await m.close();
    }
    const replicas = join(dir, 'host', 'replicas');
    const [one] = readdirSync(replicas);
    return join(replicas, one!);
  }

  // Each case replaces replica.json with something that is not a regular file. Before the
  // fix a FIFO made the open hang for ever (open(2) waits for a writer).
  const replacements: { what: string; make: (path: string) => void }[] = [
    { what: 'a FIFO', make: (p) => execFileSync('mkfifo', [p]) },
    { what: 'a symlink to a valid copy', make: (p) => symlinkSync(`${p}.saved`, p) },
    { what: 'a directory', make: (p) => mkdirSync(p) },
    { what: 'a character device', make: (p) => execFileSync('mknod', [p, 'c', '1', '3']) },
  ];
  for (const r of replacements) {
    it(`refuses ${r.what} in place of replica.json with CORRUPT_METADATA, without blocking`, async () => {
      const t = new TempDir();
      temps.push(t);
      const dir = t.join('m');
      const replica = await makeVolume(dir);
      const meta = join(replica, 'replica.json');
      renameSync(meta, `${meta}.saved`);
      r.make(meta);
      const m = await Mooring.open({ dir });
      try {
        const v = m.volume('v');
        const err = await v.attach().then(
          () => null,
          (e: unknown) => e as { code?: string; message?: string },
        );
        // The volume cannot serve from its only replica: the attach fails with the replica's
        // own error, which names the file.
        expect(err?.code, `attach should fail; got ${JSON.stringify(err)}`).toBe('CORRUPT_METADATA');
        expect(err?.message).toContain(meta);
        expect((await v.status()).state).toBe('detached');
      } finally {
        await m.close();
      }
      rmSync(meta, { recursive: true });
      renameSync(`${meta}.saved`, meta);
      // With the file back, the volume opens again.
      const m2 = await Mooring.open({ dir });
      try {
        const st = await m2.volume('v').attach();
        expect(st.attachedHost, JSON.stringify(st)).not.toBeNull();
      } finally {
        await m2.close();
      }
    });
  }

  it('refuses a FIFO in place of the state store document without blocking', async () => {
    const t = new TempDir();
    temps.push(t);
    const dir = t.join('m');
    await makeVolume(dir);
    // The file store keeps one document per file: state/KIND/KEY.json.
    const doc = join(dir, 'state', 'volume', 'v.json');
    rmSync(doc);
    execFileSync('mkfifo', [doc]);
    const err = await Mooring.open({ dir })
      .then(async (m) => {
        try {
          await m.listVolumes();
          return null;
        } finally {
          await m.close();
        }
      })
      .catch((e: unknown) => e as { code?: string; message?: string });
    expect(err?.code, JSON.stringify(err)).toBe('CORRUPT_METADATA');
    expect(err?.message).toMatch(/FIFO/);
  });

  it('fails at once for a directory under /proc (it used to spin at full CPU for ever)', async () => {
    const r = await run('node', [cliPath, 'create', '--dir', '/proc/mooring-nope', '--size', '1G'], { allowFailure: true, timeoutMs: 30_000 });
    expect(r.timedOut, r.stderr).toBe(false);
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/mooring: INVALID_ARGUMENT: cannot create \/proc\/mooring-nope: \/proc takes no new directories/);
  });

  it('says READ_ONLY_FILESYSTEM on a read-only filesystem, and PERMISSION_DENIED where the user may not write', async () => {
    const t = new TempDir();
    temps.push(t);
    const ro = t.join('ro');
    mkdirSync(ro);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', ro]);
    mounts.push(ro);
    const r = await run('node', [cliPath, 'create', '--dir', join(ro, 'm'), '--size', '16M'], { allowFailure: true });
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/mooring: READ_ONLY_FILESYSTEM: /);

    // A directory the user may not write into: owned by nobody, and the CLI runs as root
    // without the capabilities that override file permissions (so it still reads this
    // checkout, wherever it is, as the owner of its files).
    const closed = t.join('closed');
    mkdirSync(closed, { mode: 0o755 });
    chownSync(closed, 65534, 65534);
    const noOverride = ['--bounding-set=-dac_override,-dac_read_search', '--inh-caps=-dac_override,-dac_read_search'];
    const denied = await run('setpriv', [...noOverride, process.execPath, cliPath, 'create', '--dir', join(closed, 'm'), '--size', '16M'], { allowFailure: true });
    expect(denied.code, denied.stderr).toBe(1);
    expect(denied.stderr).toMatch(/mooring: PERMISSION_DENIED: /);
  });
});
