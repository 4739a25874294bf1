// Version skew (issue 14): a cluster mid-upgrade runs the previous release next to this
// one. The previous release is commit 3a1fa71, the last before the upgrade work: built from
// this repository's history, packed and installed into a scratch project (old-release.ts).
//
// old → new (the real upgrade): hosts a and b run the OLD `mooring data-engine`, c the NEW
// one; the NEW control plane opens over them. An old engine writes to old and new replica
// servers, a new engine to old ones (the replica protocol's CLIENT_FEATURES is sent only to
// servers that announce GOAWAY, so the old servers never see op 26). The old data engines
// answer Info without instanceId and features: `auto` picks `restart` for them (and refuses
// while a client is attached there), `in-place` is refused up front for them only. A session
// of c alone hands it over in place while the old engine on a reads c's replica: the new
// server closes that old client (it never announced GOAWAY), whose replica goes ERR and is
// rebuilt. Then a session with a launcher upgrades a and b by restart and c in place again;
// data and replicas come through.
//
// new → old: the OLD control plane (the old package's Mooring, in a child process of its
// own) drives NEW data engines and an old one: create, attach, write, read, snapshot, with a
// new engine over new and old replica servers and an old engine over new replica servers.
import { spawn, type ChildProcess } from 'node:child_process';
import { copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MooringError } from '../../src/errors.js';
import { Mooring } from '../../src/mooring.js';
import { packageVersion } from '../../src/native/load.js';
import { FileStateStore } from '../../src/state/file-state-store.js';
import type { DataEngineLauncher } from '../../src/upgrade/upgrade-session.js';
import { HostProcess, waitFor } from '../system/helpers/hosts.js';
import { killAllServers } from '../system/helpers/serve.js';
import { TempDir, qemuIo, repoRoot, requireBuilt } from '../system/helpers/tools.js';
import { cleanNpmEnv, oldRelease, type OldRelease } from './old-release.js';

/** The previous release: the last commit before the upgrade work. */
const OLD_COMMIT = '3a1fa71';
const MiB = 1 << 20;
const SIZE = 32 * MiB;
const version = packageVersion();
const newCli = join(repoRoot, 'dist', 'cli.js');

let old: OldRelease;
let buildMs = 0;

beforeAll(async () => {
  requireBuilt(['dist/cli.js', 'prebuilds/linux-x64/mooring.node']);
  const t = Date.now();
  old = await oldRelease(OLD_COMMIT);
  buildMs = Date.now() - t;
  console.log(`previous release ${old.commit.slice(0, 12)} (${old.version}) ${old.built ? 'built' : 'taken from the cache'} in ${buildMs} ms: ${old.packageDir}`);
}, 900_000);

// The previous release knows no cluster secret: the new hosts run without one too
// (--insecure), as a cluster mid-upgrade does (docs/data-engine.md, "Mixed releases").
function host(root: string, hostId: string, ip: string, replicaPort: number, cli?: string): HostProcess {
  return new HostProcess({ hostId, dir: join(root, `host-${hostId}`), ip, replicaPort, ...(cli ? { cli } : { insecure: true }) });
}

const clean = (out: string): string => {
  expect(out).not.toMatch(/Pattern verification failed|error/i);
  return out;
};

describe('old data engines under the new control plane, then upgraded', () => {
  // Made in beforeAll: a run that filters these tests out leaves no directory behind.
  let tmp: TempDir;
  let hosts: HostProcess[] = [];
  let cluster: Mooring;
  let store: FileStateStore;
  const replaced: string[] = [];
  const byId = (id: string): HostProcess => hosts.find((h) => h.hostId === id)!;
  const diag = (): string => hosts.map((h) => h.diagnostics()).join('');
  const sock = (name: string): string => tmp.join(`${name}.sock`);
  const uri = (name: string): string => `nbd+unix:///?socket=${sock(name)}`;
  const newCommand = [process.execPath, newCli];

  // Restart: stop the host's process and start the new version's on the same directory and addresses.
  const launcher: DataEngineLauncher = {
    async replace(hostId, dataEngine) {
      if (JSON.stringify(dataEngine.command) !== JSON.stringify(newCommand)) throw new Error(`launcher got ${JSON.stringify(dataEngine)}`);
      replaced.push(hostId);
      const h = byId(hostId);
      await h.stop();
      h.opts.cli = dataEngine.command![1]!;
      await h.start();
      return h.engine;
    },
  };

  beforeAll(async () => {
    tmp = new TempDir('mooring-skew1-');
    hosts = [host(tmp.path, 'a', '127.0.0.11', 18101, old.cli), host(tmp.path, 'b', '127.0.0.12', 18102, old.cli), host(tmp.path, 'c', '127.0.0.13', 18103)];
    // c can hand over in place (this release, --allow-successor-exec).
    hosts[2]!.opts.extraArgs = ['--allow-successor-exec', repoRoot];
    for (const h of hosts) await h.start();
    store = await FileStateStore.open(tmp.join('state'));
    cluster = await Mooring.open({ store, hosts: hosts.map((h) => h.engine), repairIntervalMs: 500, dataEngineLauncher: launcher });
  });

  afterAll(async () => {
    await cluster?.close();
    await store?.close();
    for (const h of hosts) await h.stop().catch(() => undefined);
    await killAllServers();
    tmp?.cleanup();
  });

  it('the old hosts answer Info as the previous release did: no instanceId, no features', async () => {
    for (const id of ['a', 'b']) {
      const info = await byId(id).engine.info();
      expect(info, diag()).toMatchObject({ hostId: id, version: old.version, instanceId: '', features: [] });
    }
    const c = await byId('c').engine.info();
    expect(c.instanceId).not.toBe('');
    expect(c.features).toEqual(expect.arrayContaining(['successor-exec', 'in-place-handoff']));
  });

  it('an old engine writes to old and new replica servers; a new engine to old ones', async () => {
    // vm1: engine on a (old), replicas on a, b (old) and c (new).
    await cluster.createVolume({ name: 'vm1', sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] });
    await cluster.volume('vm1').attach({ host: 'a', nbd: `unix:${sock('vm1')}` });
    clean(await qemuIo(uri('vm1'), ['write -P 0x5a 0 4M', 'write -P 0xa5 20M 2M']));
    clean(await qemuIo(uri('vm1'), ['read -P 0x5a 0 4M', 'read -P 0xa5 20M 2M', 'read -P 0 8M 1M']));
    // vm2: engine on c (new), two of its three replicas on the old replica servers of a and b.
    await cluster.createVolume({ name: 'vm2', sizeBytes: SIZE, replicas: 3, hosts: ['a', 'b', 'c'] });
    await cluster.volume('vm2').attach({ host: 'c', nbd: `unix:${sock('vm2')}` });
    clean(await qemuIo(uri('vm2'), ['write -P 0x3c 1M 3M', 'write -P 0xc3 28M 1M']));
    clean(await qemuIo(uri('vm2'), ['read -P 0x3c 1M 3M', 'read -P 0xc3 28M 1M', 'read -P 0 0 1M']));
    for (const [name, at] of [['vm1', 'a'], ['vm2', 'c']] as const) {
      const st = await cluster.volume(name).status();
      expect(st, `${name}: ${JSON.stringify(st)}${diag()}`).toMatchObject({ state: 'healthy', attachedHost: at });
      expect(st.replicas.map((r) => `${r.hostId}:${r.mode}`).sort(), diag()).toEqual(['a:RW', 'b:RW', 'c:RW']);
    }
  });

  it('in-place is refused up front for the old hosts only; auto would restart them and so refuses under an attached client', async () => {
    const inPlace = (await cluster.startUpgrade({ dataEngine: { version, command: newCommand }, method: 'in-place' }).catch((e: unknown) => e)) as MooringError;
    expect(inPlace.code, String(inPlace)).toBe('PRECONDITION_FAILED');
    const reasons = inPlace.details!['reasons'] as { code: string; host: string }[];
    expect(reasons.map((r) => `${r.code} ${r.host}`).sort(), JSON.stringify(reasons)).toEqual(['IN_PLACE_UNAVAILABLE a', 'IN_PLACE_UNAVAILABLE b']);
    // auto: vm1 is attached on a, which can only restart; vm2's host c hands over in place.
    const auto = (await cluster.startUpgrade({ dataEngine: { version, command: newCommand } }).catch((e: unknown) => e)) as MooringError;
    expect(auto.code, String(auto)).toBe('PRECONDITION_FAILED');
    expect(auto.details!['reasons'], JSON.stringify(auto.details)).toEqual([expect.objectContaining({ code: 'CLIENTS_WOULD_RECONNECT', host: 'a', volume: 'vm1' })]);
    expect(replaced).toEqual([]);
    expect(await cluster.upgradeSession()).toBeNull();
  });

  it('c hands over in place while the old engine on a reads its replica (a client without GOAWAY)', async () => {
    // a is not in this session, so vm1's NBD export there does not stop it. The new replica
    // server of c closes the old engine's connection at once (it never announced GOAWAY):
    // the replica goes ERR and is rebuilt from a and b.
    const dropped: string[] = [];
    const onEvent = (hostId: string, e: { type: string; volume?: string }): void => {
      if (e.type === 'replica-error' || e.type === 'rebuild-started') dropped.push(`${hostId} ${e.type} ${e.volume}`);
    };
    cluster.on('data-engine-event', onEvent);
    const session = await cluster.startUpgrade({ hosts: ['c'], dataEngine: { version, command: newCommand }, stepTimeoutMs: 120_000 });
    const log: string[] = [];
    session.on('method-chosen', (e) => log.push(`${e.host} ${e.method}`));
    session.on('host-state-changed', (e) => log.push(`${e.host} ${e.state}`));
    session.on('failed', (e) => log.push(`failed ${e.host}: ${e.error.message}`));
    const done = await session.done().catch((err: unknown) => {
      throw new Error(`${String(err)}\nevents: ${log.join(', ')}${diag()}`);
    });
    expect(done.state).toBe('completed');
    expect(log[0]).toBe('c in-place');
    expect(done.hosts['c']).toMatchObject({ state: 'completed', method: 'in-place', versionAfter: version });
    expect(replaced).toEqual([]);
    cluster.off('data-engine-event', onEvent);
    // The old engine lost c's replica and rebuilt it; vm2's engine (moved in place with c)
    // lost none of its replicas on the old servers of a and b.
    expect(dropped, diag()).toEqual(expect.arrayContaining(['a replica-error vm1', 'a rebuild-started vm1']));
    expect(dropped.filter((d) => !d.endsWith(' vm1'))).toEqual([]);
    for (const name of ['vm1', 'vm2']) {
      const st = await cluster.volume(name).status();
      expect(st.replicas.map((r) => `${r.hostId}:${r.mode}`).sort(), `${name}: ${JSON.stringify(st)}${diag()}`).toEqual(['a:RW', 'b:RW', 'c:RW']);
    }
    clean(await qemuIo(uri('vm1'), ['read -P 0x5a 0 4M', 'read -P 0xa5 20M 2M', 'read -P 0 8M 1M']));
    clean(await qemuIo(uri('vm2'), ['read -P 0x3c 1M 3M', 'read -P 0xc3 28M 1M', 'read -P 0 0 1M']));
  });

  it('auto upgrades the old hosts by restart and the new one in place; data and replicas come through', async () => {
    await cluster.volume('vm1').detach();
    const session = await cluster.startUpgrade({ dataEngine: { version, command: newCommand }, stepTimeoutMs: 120_000 });
    const log: string[] = [];
    const chosen: string[] = [];
    session.on('method-chosen', (e) => chosen.push(`${e.host} ${e.method}`));
    session.on('host-state-changed', (e) => log.push(`${e.host} ${e.state}`));
    session.on('failed', (e) => log.push(`failed ${e.host}: ${e.error.message}`));
    const done = await session.done().catch((err: unknown) => {
      throw new Error(`${String(err)}\nevents: ${log.join(', ')}${diag()}`);
    });
    expect(done.state).toBe('completed');
    expect(chosen).toEqual(['a restart', 'b restart', 'c in-place']);
    expect(replaced).toEqual(['a', 'b']);
    for (const id of ['a', 'b']) {
      expect(done.hosts[id], JSON.stringify(done.hosts[id])).toMatchObject({ state: 'completed', method: 'restart', versionBefore: old.version, versionAfter: version, instanceBefore: '' });
      // The new process answers as this release does.
      const info = await byId(id).engine.info();
      expect(info.instanceId, diag()).not.toBe('');
    }
    expect(done.hosts['c']).toMatchObject({ state: 'completed', method: 'in-place' });

    await cluster.volume('vm1').attach({ host: 'a', nbd: `unix:${sock('vm1')}` });
    clean(await qemuIo(uri('vm1'), ['read -P 0x5a 0 4M', 'read -P 0xa5 20M 2M', 'read -P 0 8M 1M']));
    clean(await qemuIo(uri('vm2'), ['read -P 0x3c 1M 3M', 'read -P 0xc3 28M 1M', 'read -P 0 0 1M']));
    for (const name of ['vm1', 'vm2']) {
      expect(await waitFor(async () => (await cluster.volume(name).status()).replicas.filter((r) => r.mode === 'RW').length === 3, 60_000), `${name}: ${JSON.stringify(await cluster.volume(name).status())}${diag()}`).toBe(true);
      expect((await cluster.volume(name).status()).state).toBe('healthy');
    }
  });
});

/** The previous release's control plane in a child process (skew-old-driver.mjs). */
class OldControlPlane {
  readonly child: ChildProcess;
  stderr = '';
  #stdout = '';
  #next = 1;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; what: string }>();
  readonly exited: Promise<void>;

  constructor(project: string) {
    const driver = join(project, 'skew-old-driver.mjs');
    copyFileSync(join(repoRoot, 'test', 'package', 'skew-old-driver.mjs'), driver);
    this.child = spawn(process.execPath, [driver], { cwd: project, env: cleanNpmEnv(), stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    this.child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      this.#stdout += d;
      for (let nl = this.#stdout.indexOf('\n'); nl >= 0; nl = this.#stdout.indexOf('\n')) {
        const line = this.#stdout.slice(0, nl);
        this.#stdout = this.#stdout.slice(nl + 1);
        const m = /^REPLY (.*)$/.exec(line);
        if (!m) continue;
        const r = JSON.parse(m[1]!) as { id: number; ok: boolean; value?: unknown; error?: { code: string | null; message: string; stack: string } };
        const p = this.#pending.get(r.id);
        this.#pending.delete(r.id);
        if (!p) continue;
        if (r.ok) p.resolve(r.value);
        else p.reject(Object.assign(new Error(`old control plane: ${p.what}: ${r.error!.code ?? ''} ${r.error!.message}\n${r.error!.stack}${this.diagnostics()}`), { code: r.error!.code }));
      }
    });
    this.exited = new Promise((resolve) =>
      this.child.on('exit', (code, signal) => {
        for (const p of this.#pending.values()) p.reject(new Error(`old control plane exited (code ${code}, signal ${signal}) during ${p.what}${this.diagnostics()}`));
        this.#pending.clear();
        resolve();
      }),
    );
  }

  diagnostics(): string {
    return `\n--- old control plane stderr ---\n${this.stderr.slice(-6000)}`;
  }

  call<T = unknown>(req: Record<string, unknown>): Promise<T> {
    const id = this.#next++;
    const what = `${String(req['op'])} ${String(req['name'] ?? '')} ${String(req['method'] ?? '')}`;
    return new Promise<T>((resolve, reject) => {
      this.#pending.set(id, { resolve: resolve as (v: unknown) => void, reject, what });
      this.child.stdin!.write(`${JSON.stringify({ id, ...req })}\n`);
    });
  }

  mooring<T = unknown>(method: string, ...args: unknown[]): Promise<T> {
    return this.call<T>({ op: 'mooring', method, args });
  }

  volume<T = unknown>(name: string, method: string, ...args: unknown[]): Promise<T> {
    return this.call<T>({ op: 'volume', name, method, args });
  }

  /** Closes its Mooring and waits for the process to exit (SIGKILL after 30 s). */
  async close(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.stdin!.end();
    const t = setTimeout(() => this.child.kill('SIGKILL'), 30_000);
    await this.exited;
    clearTimeout(t);
  }
}

interface OldVolumeStatus {
  state: string;
  attachedHost: string | null;
  replicas: { hostId: string; mode: string }[];
}

describe('the old control plane drives new data engines, and an old one', () => {
  // Made in beforeAll: a run that filters these tests out leaves no directory behind.
  let tmp: TempDir;
  let hosts: HostProcess[] = [];
  let cp: OldControlPlane;
  const byId = (id: string): HostProcess => hosts.find((h) => h.hostId === id)!;
  const diag = (): string => hosts.map((h) => h.diagnostics()).join('') + (cp ? cp.diagnostics() : '');
  const sock = (name: string): string => tmp.join(`${name}.sock`);
  const uri = (name: string): string => `nbd+unix:///?socket=${sock(name)}`;

  beforeAll(async () => {
    tmp = new TempDir('mooring-skew2-');
    // d and e run this release, f the previous one.
    hosts = [host(tmp.path, 'd', '127.0.0.21', 18111), host(tmp.path, 'e', '127.0.0.22', 18112), host(tmp.path, 'f', '127.0.0.23', 18113, old.cli)];
    for (const h of hosts) await h.start();
    cp = new OldControlPlane(old.project);
  });

  afterAll(async () => {
    await cp?.close();
    for (const h of hosts) await h.stop().catch(() => undefined);
    await killAllServers();
    tmp?.cleanup();
  });

  it('opens over them as the previous release', async () => {
    const opened = await cp.call<{ version: string; module: string; hasStartUpgrade: boolean; hosts: { hostId: string }[] }>({
      op: 'open',
      hosts: hosts.map((h) => `unix:${h.grpcSocket}`),
      stateDir: tmp.join('state'),
    });
    // The package loaded is the installed previous release, which had no upgrade sessions.
    expect(opened.module.startsWith(old.packageDir), opened.module).toBe(true);
    expect(opened.hasStartUpgrade).toBe(false);
    expect(opened.hosts.map((h) => h.hostId)).toEqual(['d', 'e', 'f']);
    // d and e are this release (an instanceId per process), f the previous one (none).
    expect((await byId('d').engine.info()).instanceId, diag()).not.toBe('');
    expect((await byId('f').engine.info()), diag()).toMatchObject({ instanceId: '', version: old.version });
  });

  // name, where its engine runs, where its replicas are
  it.each([
    ['both', 'd', ['d', 'e']], // new engine, new replica servers
    ['mixed', 'e', ['d', 'e', 'f']], // new engine, replica servers new (d) and old (f)
    ['oldeng', 'f', ['d', 'e', 'f']], // old engine, new replica servers (d, e)
  ] as const)('volume %s attached on %s: write, snapshot, write, read, snapshots listed', async (name, at, on) => {
    await cp.mooring('createVolume', { name, sizeBytes: SIZE, replicas: on.length, hosts: on });
    const st = await cp.volume<OldVolumeStatus>(name, 'attach', { host: at, nbd: `unix:${sock(name)}` });
    expect(st, diag()).toMatchObject({ state: 'healthy', attachedHost: at });
    clean(await qemuIo(uri(name), ['write -P 0x11 0 2M', 'write -P 0x22 16M 1M']));
    await cp.volume(name, 'createSnapshot', 's1');
    clean(await qemuIo(uri(name), ['write -P 0x33 0 1M']));
    clean(await qemuIo(uri(name), ['read -P 0x33 0 1M', 'read -P 0x11 1M 1M', 'read -P 0x22 16M 1M', 'read -P 0 8M 1M']));
    const snaps = await cp.volume<{ name: string }[]>(name, 'listSnapshots');
    expect(snaps.map((s) => s.name), diag()).toContain('s1');
    const after = await cp.volume<OldVolumeStatus>(name, 'status');
    expect(after, diag()).toMatchObject({ state: 'healthy', attachedHost: at });
    expect(after.replicas.map((r) => `${r.hostId}:${r.mode}`).sort(), diag()).toEqual(on.map((h) => `${h}:RW`));
    // Detached and attached again elsewhere: the data is on the replicas, not in the engine.
    await cp.volume(name, 'detach');
    const other = on.find((h) => h !== at)!;
    await cp.volume(name, 'attach', { host: other, nbd: `unix:${sock(name)}` });
    clean(await qemuIo(uri(name), ['read -P 0x33 0 1M', 'read -P 0x11 1M 1M', 'read -P 0x22 16M 1M']));
    await cp.volume(name, 'detach');
  });
});
