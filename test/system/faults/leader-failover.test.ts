// Issue 18, proven with real processes: three VM-manager processes (helpers/embedder-process.mjs),
// each embedding Mooring over one etcd with `leadership`, over the same three `mooring
// data-engine` processes. etcd and each embedder run in network namespaces of their own on
// one bridge (helpers/netns.ts), so a partition between an embedder and etcd is silence on
// the wire (nftables drops the frames), while the embedder still reaches the data engines
// (their gRPC unix sockets) and answers us (IPC). Ports 28500-28599. Lease 3 s. A volume's
// NBD clients write tracked data throughout each scenario (harness Workload, History); at its
// end the volume is read back and the history checker runs: no violation, and every
// acknowledged write survives (no data engine crashes here). Over the whole file, the
// embedders' reports of when they counted themselves leader (by their own clocks, read every
// 10 ms; the machine's monotonic clock) never overlap.
// Each scenario runs MOORING_FAULT_ROUNDS rounds (default 2), each with a seed of its own
// that picks hosts and the moment of the fault; MOORING_FAULT_SEED replays one round:
// (a) the leader is SIGKILLed mid-migration (standby up, or handed over); another embedder
//     leads after the lease and, from the store, confirms or rolls the migration back;
// (b) the leader is SIGKILLed while a replica is being rebuilt; the new leader ends with
//     the replica RW;
// (c) etcd is killed and started again on the same data: the volume is served throughout,
//     control operations fail coded meanwhile, then a leader acts again;
// (d) the leader is cut from etcd: it stops counting itself leader before another takes
//     over, and a control operation sent to it gets NOT_LEADER (or UNAVAILABLE);
// (e) the leader is SIGKILLed mid-upgrade-session (in place, at a random host and step); the
//     new leader takes the session over once its lease runs out and completes it: every
//     data engine replaced exactly once, the clients never disconnected;
// (f) the leader is SIGKILLed while a backing image is copied to a second disk (minCopies 2,
//     recorded); the new leader completes the copy (verified against the image's SHA-512),
//     and a volume on that copy reads back exactly the image;
// (g) the leader is SIGKILLed mid-attach (just sent, 0-400 ms later, or once the engine is up): the new
//     leader leaves at most one engine, where the store says, and the attach asked again
//     serves.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';

import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';

import type { BackingImageStatus } from '../../../src/backing-image/backing-image.js';
import { packageVersion } from '../../../src/native/load.js';
import type { UpgradeSessionStatus } from '../../../src/upgrade/upgrade-session.js';
import type { MigrationInfo, VolumeStatus } from '../../../src/volume/volume.js';
import { EtcdServer } from '../../../src/bench/etcd-server.js';
import { Embedder, EmbedderError, killAllEmbedders } from '../helpers/embedder.js';
import { History } from '../helpers/history.js';
import { makeHosts, type HostProcess } from '../helpers/hosts.js';
import { Rng } from '../helpers/pattern.js';
import { NetLab, sweep } from '../helpers/netns.js';
import { killAllServers } from '../helpers/serve.js';
import { TempDir, repoRoot, requireBuilt, requireTool, run } from '../helpers/tools.js';
import { VOLUME_BYTES, Workload, readBack, roundSeeds, until, type ClientParams, type RoundContext } from './harness.js';

/** etcd's ports, in its own namespace. */
const ETCD_PORT = 28500;
const REPLICA_PORT = 28520;
const IMAGE_PORT = 28530;
const ROUNDS = Number(process.env.MOORING_FAULT_ROUNDS ?? 2);
/** Per round: vitest's timeout of a scenario is this times the rounds. */
const ROUND_TIMEOUT_MS = 240_000;
/** The backing image of (f): random bytes, large enough that the copy is caught under way. */
const IMAGE_MIB = 384;
const LEASE_MS = 3000;
/** Takeover bound: the lease, plus a campaign round (lease / 5), plus slack for a loaded machine. */
const TAKEOVER_BOUND_MS = 2 * LEASE_MS + 10_000;
const IDS = ['vm1', 'vm2', 'vm3'];
const params: ClientParams = { depth: 4, flushEvery: 16, fuaChance: 0.05 };

async function sha512File(path: string): Promise<string> {
  const h = createHash('sha512');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

const mono = (): number => Number(process.hrtime.bigint() / 1000n) / 1000;

describe('leader failover: 3 embedder processes, etcd, 3 data engines', () => {
  const tmp = new TempDir('mlf-');
  let etcd: EtcdServer;
  let lab: NetLab;
  let hosts: HostProcess[] = [];
  let http: Server | undefined;
  const imagePath = tmp.join('image.raw');
  let imageSha = '';
  let imageUrl = '';
  /** The embedder running under each id now. */
  const current = new Map<string, Embedder>();
  /** Every embedder process ever started (for the overlap check). */
  const all: Embedder[] = [];
  const seeds = roundSeeds(ROUNDS);
  /** The round running now: its seed and the choices it makes. */
  let seed = seeds[0]!;
  let rng = new Rng(seed);
  const log: string[] = [];
  const note = (s: string): void => {
    log.push(`${new Date().toISOString().slice(11, 23)} ${s}`);
  };
  const diagnostics = (): string => `\nseed ${seed} (replay: MOORING_FAULT_SEED=${seed})\n--- steps ---\n${log.join('\n')}${all.map((e) => e.diagnostics()).join('')}${hosts.map((h) => h.diagnostics()).join('')}\n--- etcd ---\n${etcd?.log.slice(-2000)}`;

  const start = async (id: string): Promise<Embedder> => {
    const { embedder, status } = await Embedder.start(
      {
        id,
        endpoint: etcd.endpoint,
        prefix: '/lf/',
        leaseMs: LEASE_MS,
        hosts: hosts.map((h) => ({ address: `unix:${h.grpcSocket}`, secretFile: h.clusterSecretFile! })),
      },
      { wrap: lab.wrap(id) },
    );
    current.set(id, embedder);
    all.push(embedder);
    note(`started ${id}: ${JSON.stringify(status)}`);
    return embedder;
  };

  /** Waits until exactly one running embedder leads at a term above `aboveTerm`. */
  const leader = async (aboveTerm = 0, timeoutMs = TAKEOVER_BOUND_MS): Promise<{ e: Embedder; term: number }> => {
    let found: { e: Embedder; term: number } | null = null;
    await until(
      `a leader above term ${aboveTerm}`,
      async () => {
        const live = [...current.values()].filter((e) => e.alive);
        const st = await Promise.all(live.map(async (e) => ({ e, s: (await e.leadership()).leadership })));
        const leading = st.filter((x) => x.s.isLeader && x.s.term > aboveTerm);
        found = leading.length === 1 ? { e: leading[0]!.e, term: leading[0]!.s.term } : null;
        return found !== null;
      },
      timeoutMs,
      diagnostics,
      100,
    );
    return found!;
  };

  /** Calls the current leader; a NOT_LEADER (leadership moving) is tried again on the next one. */
  const onLeader = async <T>(op: string, ...args: unknown[]): Promise<T> => {
    for (let attempt = 1; ; attempt++) {
      const { e } = await leader();
      try {
        return await e.call<T>(op, ...args);
      } catch (err) {
        if (!(err instanceof EmbedderError && err.code === 'NOT_LEADER') || attempt >= 5) throw err;
      }
    }
  };

  /** A volume attached on `host` (by `attach`, or by the leader) with two tracked clients writing. */
  const servedVolume = async (
    name: string,
    host: string,
    accessMode: 'rwo' | 'migratable',
    attach: (opts: Record<string, unknown>) => Promise<VolumeStatus> = (opts) => onLeader<VolumeStatus>('attach', name, opts),
  ): Promise<{ ctx: RoundContext; workload: Workload; history: History; epoch: number }> => {
    const history = new History(rng.int(1_000_000_000));
    const workload = new Workload(history, new Rng(rng.int(1_000_000_000)), { offset: 0, length: VOLUME_BYTES });
    workloads.push(workload);
    const uri = (h: string): string => `nbd+unix:///?socket=${tmp.join(`${name}-${h}.sock`)}`;
    const ctx = { history, workload, uri, volume: name } as unknown as RoundContext;
    await onLeader('create', { name, sizeBytes: VOLUME_BYTES, replicas: 3, hosts: hosts.map((h) => h.hostId), accessMode });
    const st = await attach({ host, nbd: `unix:${tmp.join(`${name}-${host}.sock`)}`, ...(accessMode === 'migratable' ? { attacher: 'workload' } : {}) });
    expect(st.state).toBe('healthy');
    for (let i = 1; i <= 2; i++) await workload.connect(`${host}${i}`, host, uri(host), params);
    await workload.waitAcks(50, { group: host, flush: true, timeoutMs: 30_000 });
    note(`${name} attached on ${host} at epoch ${st.epoch}, clients writing`);
    return { ctx, workload, history, epoch: st.epoch };
  };

  /** Stops the clients, reads back through `serving`, runs the checker (strict: no data engine crashed), detaches, deletes. */
  const finish = async (name: string, serving: string, ctx: RoundContext, workload: Workload, history: History): Promise<void> => {
    await workload.waitAcks(50, { group: serving, flush: true, timeoutMs: 30_000, detail: diagnostics });
    await workload.stop(undefined, 30_000);
    workload.destroy();
    await readBack(ctx, serving);
    const v = history.check();
    if (!v.ok) throw new Error(`history checker: ${v.summary}${diagnostics()}`);
    const strict = history.check({ ackedIsDurable: true });
    if (!strict.ok) throw new Error(`acknowledged writes lost (no data engine crashed): ${strict.summary}${diagnostics()}`);
    note(`${name}: checked ${JSON.stringify(v.stats)}`);
    await onLeader('detach', name, {});
    await onLeader('deleteVolume', name);
  };

  const host = (id: string): HostProcess => hosts.find((h) => h.hostId === id)!;
  const otherHost = (h: string): string => rng.pick(hosts.map((x) => x.hostId).filter((x) => x !== h));

  beforeAll(async () => {
    requireBuilt(['dist/index.js', 'dist/cli.js']);
    requireTool('qemu-img');
    console.log(`leader failover seeds ${seeds.join(', ')} (replay one: MOORING_FAULT_SEED=N)`);
    sweep();
    lab = await NetLab.create(['etcd', ...IDS], tmp.path);
    const [wrap, ...wrapArgs] = lab.wrap('etcd');
    etcd = await EtcdServer.start(ETCD_PORT, ETCD_PORT + 1, { host: lab.host('etcd').ip, parentDir: tmp.path, spawn: (cmd, args, o) => spawn(wrap!, [...wrapArgs, cmd, ...args], o) });
    hosts = makeHosts(join(tmp.path, 'hosts'), 3, REPLICA_PORT);
    for (const h of hosts) {
      h.opts.extraArgs = ['--allow-successor-exec', repoRoot]; // (e) replaces them in place
      await h.start();
    }
    // (f)'s image, served over http to the data engine that downloads it.
    await run('dd', ['if=/dev/urandom', `of=${imagePath}`, 'bs=1M', `count=${IMAGE_MIB}`, 'status=none']);
    imageSha = await sha512File(imagePath);
    http = createServer((_req, res) => {
      res.writeHead(200, { 'content-length': IMAGE_MIB << 20 });
      createReadStream(imagePath).pipe(res);
    });
    await new Promise<void>((resolve) => http!.listen(IMAGE_PORT, '127.0.0.1', resolve));
    imageUrl = `http://127.0.0.1:${(http.address() as AddressInfo).port}/image.raw`;
    for (const id of IDS) await start(id);
    const { e, term } = await leader();
    note(`${e.id} leads at term ${term}`);
  }, 120_000);

  afterAll(async () => {
    console.log(`leader failover steps (seeds ${seeds.join(', ')}):\n${log.join('\n')}`);
    lab?.heal();
    http?.close();
    for (const e of current.values()) await e.close().catch(() => undefined);
    await killAllEmbedders();
    for (const h of hosts) {
      h.thaw();
      await h.stop().catch(() => undefined);
    }
    await killAllServers();
    await etcd?.destroy();
    lab?.destroy();
    tmp.cleanup();
  }, 120_000);

  // After a round, even a failed one: its clients gone, etcd running and reachable, and
  // before the next, every embedder running (one killed runs again, as a restarted VM manager).
  const workloads: Workload[] = [];
  const afterRound = async (): Promise<void> => {
    for (const w of workloads.splice(0)) w.destroy();
    lab.heal();
    await etcd.restart().catch(() => undefined); // refused when it runs already
  };
  const beforeRound = async (): Promise<void> => {
    for (const [id, e] of current) if (!e.alive) await start(id);
  };
  afterEach(afterRound, 60_000);
  beforeEach(beforeRound, 60_000);

  /** Runs `body` once per round, each with its seed; a failure names the round's seed. */
  const rounds = async (letter: string, body: () => Promise<void>): Promise<void> => {
    for (const [i, s] of seeds.entries()) {
      seed = s;
      rng = new Rng(s);
      note(`(${letter}) round ${i + 1} of ${seeds.length}, seed ${s}`);
      if (i > 0) {
        await afterRound();
        await beforeRound();
      }
      try {
        await body();
      } catch (err) {
        throw new Error(`(${letter}) round ${i + 1}, seed ${s} (replay: MOORING_FAULT_SEED=${s}): ${(err as Error).message}`, { cause: err });
      }
    }
  };

  it('a follower refuses control operations with NOT_LEADER naming the leader', async () => {
    const { e: l, term } = await leader();
    const f = [...current.values()].find((x) => x !== l)!;
    const err = await f.call('create', { name: 'refused', sizeBytes: VOLUME_BYTES, replicas: 1 }).catch((x: unknown) => x);
    expect(err).toBeInstanceOf(EmbedderError);
    expect((err as EmbedderError).code).toBe('NOT_LEADER');
    expect((err as EmbedderError).details).toEqual({ leader: l.id, term });
  });

  it('(a) the leader SIGKILLed mid-migration: another leads after the lease and ends the migration from the store; no acknowledged write lost, one writer', () =>
    rounds('a', async () => {
      const x = rng.pick(hosts.map((h) => h.hostId));
      const y = otherHost(x);
      const when = rng.pick(['standby up', 'hand-over in flight', 'handed over'] as const);
      const end = rng.pick(['confirm', 'rollback'] as const);
      const name = `mig-${seed}`;
      const { ctx, workload, history, epoch } = await servedVolume(name, x, 'migratable');
      note(`(a) ${x} → ${y}, leader killed with the ${when}, then ${end}`);
      const info = await onLeader<MigrationInfo>('migrate', name, y, { nbd: `unix:${tmp.join(`${name}-${y}.sock`)}`, attacher: 'workload' });
      expect(info).toMatchObject({ sourceHost: x, targetHost: y });
      history.fence(y, 'standby');
      await workload.connect(`${y}1`, y, ctx.uri(y), params);
      await workload.waitAcks(30, { group: x, timeoutMs: 30_000 });
      const { e: old, term } = await leader();
      if (when === 'handed over') {
        history.unfence(y, 'hand-over');
        const ho = await old.call<{ epoch: number }>('handOver', name);
        history.fence(x, `handed over at epoch ${ho.epoch}`);
        expect(ho.epoch).toBeGreaterThan(epoch);
        await workload.waitAcks(30, { group: y, timeoutMs: 30_000 });
      } else if (when === 'hand-over in flight') {
        // Whether the hand-over happened is known only from the store, later.
        // The kill comes once the source engine drained (it stops being the active one), or
        // once the call returned if that was missed.
        history.unfence(y, 'hand-over in flight');
        let returned = false;
        void old.call('handOver', name).then(
          () => (returned = true),
          () => undefined,
        );
        await until('the hand-over to begin', async () => returned || (await host(x).engine.engineInfo(name)).role !== 'active', 15_000, diagnostics, 0);
        note(`(a) hand-over ${returned ? 'returned' : 'under way'} at the kill`);
      }
      await old.kill();
      const killedAt = mono();
      note(`(a) killed the leader ${old.id} (term ${term})`);
      // The volume is served meanwhile by its writer (a hand-over cut in the middle leaves
      // none until the new leader's first pass).
      if (when !== 'hand-over in flight') await workload.waitAcks(30, { group: when === 'handed over' ? y : x, timeoutMs: 30_000, detail: diagnostics });
      const { e: next, term: term2 } = await leader(term);
      const elected = next.events.find((ev) => ev.status.isLeader && ev.status.term === term2)!;
      note(`(a) ${next.id} leads at term ${term2}, ${(elected.atMono - killedAt).toFixed(0)} ms after the kill`);
      // Not before the dead leader's lease ran out (its last heartbeat came at most a round before the kill).
      expect(elected.atMono - killedAt).toBeGreaterThan(LEASE_MS / 2);

      // The new leader knows the migration from the store (an interrupted hand-over it finishes
      // or undoes in its first pass), and ends it.
      let found: MigrationInfo | null = null;
      await until('the migration to be target-ready or handed over', async () => {
        found = await next.call<MigrationInfo | null>('migration', name);
        return found?.phase === 'target-ready' || found?.phase === 'handed-over';
      }, 30_000, () => `${JSON.stringify(found)}${diagnostics()}`, 100);
      const phase = found!.phase;
      expect(found).toMatchObject({ sourceHost: x, targetHost: y });
      if (when !== 'hand-over in flight') expect(phase).toBe(when === 'handed over' ? 'handed-over' : 'target-ready');
      const handedOver = phase === 'handed-over';
      if (when === 'hand-over in flight') {
        if (handedOver) history.fence(x, 'the hand-over was finished');
        else history.fence(y, 'the hand-over was undone (or never began)');
      }
      note(`(a) ${next.id} found the migration ${phase}`);
      // After a hand-over cut in the middle, the new leader's pass makes one engine the writer
      // again; a source it restarted (it had drained for an unrecorded hand-over) has a new
      // export, so a client connects anew, as QEMU would reconnect.
      const writer = handedOver ? y : x;
      if (when === 'hand-over in flight') {
        await until(`the engine on ${writer} to be the writer`, async () => (await host(writer).engine.engineInfo(name)).role === 'active', 30_000, diagnostics, 50);
        await workload.connect(`${writer}-again`, writer, ctx.uri(writer), params);
      }
      await workload.waitAcks(30, { group: writer, timeoutMs: 30_000, detail: diagnostics });
      let serving: string;
      if (end === 'confirm') {
        if (!handedOver) history.unfence(y, 'hand-over by confirm');
        await next.call('confirm', name);
        history.fence(x, 'confirmed');
        serving = y;
      } else {
        if (handedOver) history.unfence(x, 'rollback');
        await next.call('rollback', name);
        history.fence(y, 'rolled back');
        serving = x;
      }
      const st = await next.call<VolumeStatus>('volumeStatus', name);
      expect(st).toMatchObject({ writerHost: serving, migration: null });
      // A writer that changed hands claimed a newer epoch; a standby withdrawn before any hand-over changed nothing.
      if (when === 'standby up' && end === 'rollback') expect(st.epoch).toBe(epoch);
      else if (when === 'hand-over in flight' && end === 'rollback') expect(st.epoch).toBeGreaterThanOrEqual(epoch);
      else expect(st.epoch).toBeGreaterThan(epoch);
      note(`(a) ${end} done by ${next.id}: writer ${serving} at epoch ${st.epoch}`);
      await until(`the engine of ${name} to run on ${serving} only`, async () => {
        for (const h of hosts) if (h.hostId !== serving && (await h.engine.listEngines()).some((en) => en.volume === name)) return false;
        return true;
      }, 30_000, diagnostics, 200);
      await finish(name, serving, ctx, workload, history);
    }),
    ROUND_TIMEOUT_MS * seeds.length,
  );

  it('(b) the leader SIGKILLed while a replica host is back and its replica not yet or being rebuilt: the new leader re-adds it and it ends RW', () =>
    rounds('b', async () => {
      const x = rng.pick(hosts.map((h) => h.hostId));
      const r = otherHost(x);
      const name = `rebuild-${seed}`;
      const { ctx, workload, history } = await servedVolume(name, x, 'rwo');
      const replicaOf = async (): Promise<{ mode: string; address: string | null } | undefined> => (await host(x).engine.engineInfo(name)).replicas.find((rep) => rep.hostId === r);
      // r's data engine stops; its replica misses writes.
      await host(r).stop();
      await until(`${x}'s engine to drop ${r}'s replica`, async () => (await replicaOf())?.mode === 'ERR', 15_000, diagnostics, 50);
      await workload.waitAcks(300, { group: x, flush: true, timeoutMs: 30_000 });
      // It comes back under a new replica address: only the cluster (the leader) can re-add it
      // there, once the VM manager offers the host again (addHost) or a new leader records
      // the hosts it was offered.
      host(r).opts.replicaPort += 10;
      await host(r).start();
      const address = host(r).ready!.replicaAddress;
      const { e: old, term } = await leader();
      const when = rng.pick(['not offered', 'offered', 'rebuild under way'] as const);
      if (when !== 'not offered') await old.call('addHost', hosts.indexOf(host(r)));
      if (when === 'rebuild under way') await until(`the re-add of ${r}'s replica at ${address}`, async () => (await replicaOf())?.address === address, 15_000, diagnostics, 10);
      await old.kill();
      const seen = await replicaOf();
      note(`(b) ${r} back at ${address}; killed the leader ${old.id} (term ${term}), host ${when}: ${JSON.stringify(seen)}`);
      await workload.waitAcks(100, { group: x, timeoutMs: 30_000 });
      const { e: next, term: term2 } = await leader(term);
      note(`(b) ${next.id} leads at term ${term2}`);
      await until(`${r}'s replica to be rebuilt at ${address}`, async () => {
        const rep = await replicaOf();
        return rep?.mode === 'RW' && rep.address === address;
      }, 60_000, async () => `${JSON.stringify(await replicaOf())}${diagnostics()}`, 100);
      // The new leader's records say so too.
      await until('the status to show every replica RW', async () => {
        const st = await next.call<VolumeStatus>('volumeStatus', name);
        return st.state === 'healthy' && st.replicas.every((rep) => rep.mode === 'RW');
      }, 30_000, diagnostics, 200);
      note(`(b) ${r}'s replica RW at ${address}`);
      await finish(name, x, ctx, workload, history);
    }),
    ROUND_TIMEOUT_MS * seeds.length,
  );

  it('(c) etcd killed and started again on its data: the volume is served throughout, control fails coded meanwhile, then a leader acts again', () =>
    rounds('c', async () => {
      const x = rng.pick(hosts.map((h) => h.hostId));
      const name = `etcd-${seed}`;
      const { ctx, workload, history } = await servedVolume(name, x, 'rwo');
      const { e: l, term } = await leader();
      await etcd.kill();
      note('(c) etcd killed');
      await workload.waitAcks(200, { group: x, flush: true, timeoutMs: 30_000 });
      const err = await l.call('create', { name: 'during-outage', sizeBytes: VOLUME_BYTES, replicas: 1 }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(EmbedderError);
      expect(['UNAVAILABLE', 'NOT_LEADER']).toContain((err as EmbedderError).code);
      note(`(c) a create during the outage: ${(err as EmbedderError).code}`);
      // Past the renew deadline nobody counts itself leader.
      await until('every embedder to stop leading', async () => (await Promise.all([...current.values()].map((e) => e.leadership()))).every((s) => !s.leadership.isLeader), 3 * LEASE_MS, diagnostics, 100);
      await workload.waitAcks(200, { group: x, flush: true, timeoutMs: 30_000 });
      await etcd.restart();
      note('(c) etcd started again');
      const { e: next, term: term2 } = await leader(term, TAKEOVER_BOUND_MS + 10_000);
      note(`(c) ${next.id} leads at term ${term2}`);
      expect(term2).toBeGreaterThan(term);
      const st = await next.call<VolumeStatus>('volumeStatus', name);
      expect(st).toMatchObject({ attachedHost: x, state: 'healthy' });
      await onLeader('create', { name: `after-${seed}`, sizeBytes: VOLUME_BYTES, replicas: 1 });
      await onLeader('deleteVolume', `after-${seed}`);
      // The create refused during the outage left nothing.
      expect(await onLeader<VolumeStatus>('volumeStatus', 'during-outage').catch((e: EmbedderError) => e.code)).toBe('NOT_FOUND');
      await finish(name, x, ctx, workload, history);
    }),
    ROUND_TIMEOUT_MS * seeds.length,
  );

  it('(d) the leader cut from etcd stops leading before another takes over, and refuses control', () =>
    rounds('d', async () => {
      const x = rng.pick(hosts.map((h) => h.hostId));
      const name = `cut-${seed}`;
      const { ctx, workload, history } = await servedVolume(name, x, 'rwo');
      const { e: old, term } = await leader();
      lab.cut([old.id], ['etcd']);
      const cutAt = mono();
      note(`(d) cut ${old.id} (term ${term}) from etcd`);
      try {
        const { e: next, term: term2 } = await leader(term);
        // The leadership events travel on each embedder's event stream: the status that named
        // the new leader may come before the event that says so.
        const stoppedEv = () => old.leading.filter((l) => !l.isLeader && l.atMono >= cutAt)[0];
        const electedEv = () => next.leading.filter((l) => l.isLeader && l.atMono >= cutAt)[0];
        await until('the leadership events of the cut and the election', async () => stoppedEv() !== undefined && electedEv() !== undefined, TAKEOVER_BOUND_MS, diagnostics, 50);
        const stopped = stoppedEv();
        const elected = electedEv();
        note(`(d) ${old.id} stopped leading ${stopped ? (stopped.atMono - cutAt).toFixed(0) : '?'} ms after the cut, ${next.id} leads at term ${term2} ${elected ? (elected.atMono - cutAt).toFixed(0) : '?'} ms after it`);
        expect(stopped).toBeDefined();
        expect(elected).toBeDefined();
        expect(stopped!.atMono).toBeLessThan(elected!.atMono);
        // Still cut off, the old leader refuses a control operation, coded.
        const err = await old.call('create', { name: 'by-deposed', sizeBytes: VOLUME_BYTES, replicas: 1 }).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(EmbedderError);
        expect(['NOT_LEADER', 'UNAVAILABLE']).toContain((err as EmbedderError).code);
        note(`(d) a create sent to ${old.id}: ${(err as EmbedderError).code}`);
        await workload.waitAcks(100, { group: x, flush: true, timeoutMs: 30_000 });
      } finally {
        lab.heal();
      }
      // Back on etcd it follows the new leader.
      await until(`${old.id} to follow`, async () => {
        const s = (await old.leadership()).leadership;
        return !s.isLeader && s.term > term && s.holder !== old.id;
      }, TAKEOVER_BOUND_MS, diagnostics, 100);
      expect(await onLeader<VolumeStatus>('volumeStatus', 'by-deposed').catch((e: EmbedderError) => e.code)).toBe('NOT_FOUND');
      await finish(name, x, ctx, workload, history);
    }),
    ROUND_TIMEOUT_MS * seeds.length,
  );

  it('(e) the leader SIGKILLed mid-upgrade-session: the new leader takes the session over and completes it; every data engine replaced once, no client cut', () =>
    rounds('e', async () => {
      const x = rng.pick(hosts.map((h) => h.hostId));
      const name = `upg-${seed}`;
      const { ctx, workload, history } = await servedVolume(name, x, 'rwo');
      const before = new Map(await Promise.all(hosts.map(async (h) => [h.hostId, (await h.engine.info()).instanceId] as const)));
      const { e: old, term } = await leader();
      // Killed once `done` hosts completed and the next is past pending (mid-step), or at the
      // end if that was missed.
      const done = rng.int(hosts.length);
      const started = await old.call<UpgradeSessionStatus>('startUpgrade', { dataEngine: { version: packageVersion(), command: [process.execPath, join(repoRoot, 'dist/cli.js')] }, method: 'in-place', stepTimeoutMs: 120_000 });
      let at: UpgradeSessionStatus = started;
      const steps = (st: UpgradeSessionStatus): string => Object.values(st.hosts).map((h) => `${h.hostId}:${h.state}`).join(' ');
      await until(`${done} host(s) upgraded and the next under way`, async () => {
        at = await old.call<UpgradeSessionStatus>('upgradeStatus');
        const states = Object.values(at.hosts).map((h) => h.state);
        const completed = states.filter((st) => st === 'completed').length;
        return at.state !== 'initializing' && at.state !== 'upgrading' ? true : completed >= done && states.some((st) => st !== 'pending' && st !== 'completed');
      }, 120_000, () => `${steps(at)}${diagnostics()}`, 0);
      await old.kill();
      note(`(e) killed the leader ${old.id} (term ${term}) with the session ${at.state}: ${steps(at)}`);
      const { e: next, term: term2 } = await leader(term);
      note(`(e) ${next.id} leads at term ${term2}`);
      // The dead leader's hold on the session runs out (15 s), then the new leader drives it.
      let end: UpgradeSessionStatus | null = null;
      await until('the session to complete', async () => {
        end = await onLeader<UpgradeSessionStatus>('upgradeStatus');
        return end.state !== 'initializing' && end.state !== 'upgrading';
      }, 180_000, () => `${end ? steps(end) : ''}${diagnostics()}`, 200);
      expect(end!.id).toBe(started.id);
      expect(end!.state, `${JSON.stringify(end)}${diagnostics()}`).toBe('completed');
      note(`(e) session completed by ${next.id}: ${steps(end!)}`);
      // Each host's data engine was replaced, and only once: what ran before the session is
      // what its record saw before its own hand-off.
      for (const h of hosts) {
        const rec = end!.hosts[h.hostId]!;
        expect(rec).toMatchObject({ state: 'completed', method: 'in-place', instanceBefore: before.get(h.hostId) });
        expect((await h.engine.info()).instanceId).not.toBe(before.get(h.hostId));
      }
      expect(workload.clients.map((c) => `${c.name}: ${c.closed ? 'closed' : 'open'}, ${c.errors} errors`)).toEqual(workload.clients.map((c) => `${c.name}: open, 0 errors`));
      await finish(name, x, ctx, workload, history);
    }),
    ROUND_TIMEOUT_MS * seeds.length,
  );

  it('(f) the leader SIGKILLed mid-delivery of a backing image: the new leader completes the copy from the store, verified, and a volume on it reads the image', () =>
    rounds('f', async () => {
      const a = rng.pick(hosts.map((h) => h.hostId));
      const image = `img-${seed}`;
      const name = `bi-${seed}`;
      const sock = tmp.join(`${name}.sock`);
      const { e: old, term } = await leader();
      const ready = await old.call<BackingImageStatus>('createBackingImage', { name: image, source: { type: 'download', url: imageUrl }, host: a, expectedChecksum: imageSha });
      expect(ready.files.map((f) => `${f.hostId}:${f.state}`)).toEqual([`${a}:ready`]);
      // Two copies asked for (recorded in the image's document): the leader's pass copies it to
      // another disk, and the leader is killed once that copy got this far.
      const killAt = 10 + rng.int(60);
      await old.call('setMinCopies', image, 2);
      let seen: BackingImageStatus | null = null;
      const copy = (st: BackingImageStatus | null) => st?.files.find((f) => f.hostId !== a);
      await until(`the copy to reach ${killAt}%`, async () => {
        seen = await old.call<BackingImageStatus>('backingImageStatus', image);
        const f = copy(seen);
        return f !== undefined && (f.state === 'ready' || (f.state === 'in-progress' && f.progress >= killAt));
      }, 60_000, () => `${JSON.stringify(seen)}${diagnostics()}`, 0);
      await old.kill();
      const b = copy(seen)!.hostId;
      note(`(f) killed the leader ${old.id} (term ${term}) with the copy from ${a} at ${JSON.stringify(copy(seen))}`);
      const { e: next, term: term2 } = await leader(term);
      note(`(f) ${next.id} leads at term ${term2}`);
      let st: BackingImageStatus | null = null;
      await until(`the copy on ${b} to be ready`, async () => {
        st = await onLeader<BackingImageStatus>('backingImageStatus', image);
        return st.files.some((f) => f.hostId === b && f.state === 'ready');
      }, 120_000, () => `${JSON.stringify(st)}${diagnostics()}`, 200);
      expect(st!.currentChecksum).toBe(imageSha);
      note(`(f) the copy on ${b} is ready: ${JSON.stringify(st!.files)}`);
      // A volume with its one replica on b needs no other copy; it reads exactly the image.
      await onLeader('create', { name, replicas: 1, hosts: [b], backingImage: image });
      expect((await onLeader<VolumeStatus>('attach', name, { host: b, nbd: `unix:${sock}` })).state).toBe('healthy');
      const cmp = await run('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', imagePath, `nbd+unix:///?socket=${sock}`], { allowFailure: true });
      expect(cmp.code, `${cmp.stdout}${cmp.stderr}${diagnostics()}`).toBe(0);
      await onLeader('detach', name, {});
      await onLeader('deleteVolume', name);
      await onLeader('deleteBackingImage', image);
    }),
    ROUND_TIMEOUT_MS * seeds.length,
  );

  it('(g) the leader SIGKILLed mid-attach: the new leader leaves one engine at most, where the store says, and the attach asked again serves', () =>
    rounds('g', async () => {
      const x = rng.pick(hosts.map((h) => h.hostId));
      const name = `att-${seed}`;
      // The kill comes at once, after a drawn delay (a fault's moment, not a wait), or once the engine is up.
      const when = rng.pick(['just sent', 'after a delay', 'engine up'] as const);
      const delayMs = rng.int(400);
      const enginesOf = async (): Promise<string[]> => (await Promise.all(hosts.map(async (h) => ((await h.engine.listEngines()).some((en) => en.volume === name) ? [h.hostId] : [])))).flat();
      const { ctx, workload, history } = await servedVolume(name, x, 'rwo', async (opts) => {
        const { e: old, term } = await leader();
        void old.call('attach', name, opts).catch(() => undefined);
        if (when === 'after a delay') await new Promise((r) => setTimeout(r, delayMs));
        if (when === 'engine up') await until(`the engine of ${name} on ${x}`, async () => (await enginesOf()).includes(x), 15_000, diagnostics, 0);
        await old.kill();
        note(`(g) killed the leader ${old.id} (term ${term}) with the attach on ${x} ${when === 'after a delay' ? `${delayMs} ms after it was sent` : when}: engines on ${(await enginesOf()).join(',') || 'none'}`);
        const { e: next, term: term2 } = await leader(term);
        // Whatever the store holds, the new leader makes the hosts agree with it: an engine
        // started for an attach it recorded, a stray one stopped.
        let seen = '';
        await until('one engine at most, where the store says', async () => {
          const st = await next.call<VolumeStatus>('volumeStatus', name);
          const on = await enginesOf();
          seen = `store: ${st.attachedHost ?? 'detached'}; engines on ${on.join(',') || 'none'}`;
          return st.attachedHost === null ? on.length === 0 : on.length === 1 && on[0] === st.attachedHost;
        }, 30_000, () => `${seen}${diagnostics()}`, 100);
        note(`(g) ${next.id} leads at term ${term2}; ${seen}`);
        return onLeader<VolumeStatus>('attach', name, opts);
      });
      await finish(name, x, ctx, workload, history);
    }),
    ROUND_TIMEOUT_MS * seeds.length,
  );

  it('never had two embedders counting themselves leader at once', () => {
    const spans: Array<{ id: string; from: number; to: number }> = [];
    for (const e of all) {
      let from: number | null = null;
      for (const l of e.leading) {
        if (l.isLeader && from === null) from = l.atMono;
        if (!l.isLeader && from !== null) {
          spans.push({ id: e.id, from, to: l.atMono });
          from = null;
        }
      }
      if (from !== null) spans.push({ id: e.id, from, to: e.killedAtMono ?? Infinity });
    }
    spans.sort((a, b) => a.from - b.from);
    console.log(`leadership spans: ${spans.map((s) => `${s.id} ${s.from.toFixed(0)}-${s.to === Infinity ? 'now' : s.to.toFixed(0)}`).join(', ')}`);
    expect(spans.length).toBeGreaterThanOrEqual(4);
    for (let i = 1; i < spans.length; i++) expect(spans[i]!.from, `${spans[i - 1]!.id} and ${spans[i]!.id} overlap${diagnostics()}`).toBeGreaterThanOrEqual(spans[i - 1]!.to);
  });
});
