/**
 * In-place upgrade of a data engine process (docs/upgrade.md): the old process (O) hands
 * its engines, with their NBD exports and the clients connected to them, to its successor
 * (N) on the same host and directory. QEMU keeps its connection: no reconnect, no request
 * sent again.
 *
 * O listens on a hand-off channel (AF_UNIX SEQPACKET, native/src/handoff/) and starts N,
 * which connects. Then, over the channel:
 *
 *   N → O  HELLO {version}
 *          O freezes every export, stops its engines (flushed, clean), sends GOAWAY to the
 *          engines elsewhere that read its replicas, closes its data engine (replica server,
 *          directory lock)
 *   O → N  MANIFEST {engines: [{volume, refs, ioTimeoutMs, quorumHoldMs, epoch, nbd}]}, then
 *          one NBD record per engine with `nbd`, in manifest order
 *          N opens the data engine, starts each engine at `epoch`, adopts its export frozen
 *   N → O  READY  (or REFUSED {reason})
 *   O → N  COMMIT                   N unfreezes: clients carry on
 *   O → N  RELEASED                 O's gRPC address is free; N serves gRPC there
 *
 * Before COMMIT, O keeps its own copy of every frozen export: if N refuses, dies or takes
 * too long, O sends ABORT, waits for N to be gone, opens its data engine again and serves
 * the same connections from engines at the spare epochs (`rollbackEpoch`, above anything N
 * may have claimed). Clients see a pause either way, never an error.
 *
 * @packageDocumentation
 */
import { rm } from 'node:fs/promises';

import { MooringError, callNative, toMooringError } from '../errors.js';
import type { NativeAddon, NativeHandOffChannel, NativeNbdHandOffRecord } from '../native/binding.js';
import type { NbdExport } from '../nbd/nbd-export.js';
import { sleep } from '../util/async.js';
import { processAlive } from '../util/processes.js';
import type { EngineReplicaRef } from './data-engine.js';
import type { HandedEngine, LocalDataEngine } from './local-data-engine.js';
import type { RecordedError } from '../upgrade/upgrade-records.js';

/** Version of the hand-off messages; a successor speaking another is refused before anything moves. */
export const HANDOFF_PROTOCOL_VERSION = 1;

/** Bounds of the hand-off. */
export const HANDOFF_LIMITS = {
  /** From starting the successor to its HELLO. */
  helloTimeoutMs: 30_000,
  /** How long every export may take to freeze (a client that does not read its replies holds it). */
  freezeTimeoutMs: 10_000,
  /** From the manifest sent to READY (the successor opens the data engine and every engine). */
  readyTimeoutMs: 60_000,
  /** From READY to COMMIT, and from COMMIT to RELEASED, on the successor's side. */
  commitTimeoutMs: 30_000,
  /** How long O waits for replica clients elsewhere to let go after GOAWAY. */
  goAwayTimeoutMs: 5_000,
  /** How long O waits for an aborted successor to exit before it kills it. */
  abortExitMs: 10_000,
} as const;

/** Epochs of one volume: the one the successor claims, and the spare one for a rollback. */
export interface HandOffEpochs {
  /** The successor's engine claims it. */
  epoch: number;
  /** This process's engine claims it if the hand-off is rolled back (above `epoch`). */
  rollbackEpoch: number;
}

interface ManifestEngine {
  volume: string;
  refs: EngineReplicaRef[];
  ioTimeoutMs: number;
  quorumHoldMs: number | null;
  epoch: number;
  nbd: boolean;
}

type Message =
  | { type: 'HELLO'; version: number; pid: number }
  | { type: 'MANIFEST'; engines: ManifestEngine[] }
  | { type: 'READY' }
  | { type: 'REFUSED'; reason: string }
  | { type: 'COMMIT' }
  | { type: 'ABORT'; reason: string }
  | { type: 'RELEASED' };

async function send(ch: NativeHandOffChannel, m: Message): Promise<void> {
  await callNative(() => ch.send(Buffer.from(JSON.stringify(m)), HANDOFF_LIMITS.commitTimeoutMs), `hand-off: sending ${m.type}`);
}

async function receive(ch: NativeHandOffChannel, timeoutMs: number, what: string): Promise<Message | { type: 'record'; record: NativeNbdHandOffRecord }> {
  const item = await callNative(() => ch.receive(timeoutMs), `hand-off: waiting for ${what}`);
  if (item.type === 'nbd-server') return { type: 'record', record: item.record };
  let m: unknown;
  try {
    m = JSON.parse(item.data.toString('utf8'));
  } catch {
    throw new MooringError('PROTOCOL_ERROR', `hand-off: a message that is not JSON while waiting for ${what}`);
  }
  if (typeof m !== 'object' || m === null || typeof (m as { type?: unknown }).type !== 'string') throw new MooringError('PROTOCOL_ERROR', `hand-off: a message without a type while waiting for ${what}`);
  return m as Message;
}

function handOffApi(addon: NativeAddon): NonNullable<NativeAddon['handOff']> {
  if (!addon.handOff || !addon.adoptNbdServer) throw new MooringError('UNSUPPORTED', 'this addon cannot hand NBD exports over');
  return addon.handOff;
}

/** How a HandOffProcess call ended, as the caller (the upgrade controller) sees it. */
export interface HandOffProcessResult {
  /** True: the successor serves every engine. False: rolled back, every engine serves here at its rollback epoch (or nothing had moved). */
  committed: boolean;
  /** Why it was not committed: a MooringErrorCode and a message. */
  error: RecordedError | null;
  /** How long the exports were frozen (0 if nothing moved). */
  pauseMs: number;
  /** Engines handed over. */
  engines: number;
}

/** Where the frozen time of a committed hand-off went, in ms (for the log). */
export interface HandOffSteps {
  /** Freezing the exports, detaching them and stopping the engines (drain, flush). */
  detachMs: number;
  /** Replica clients elsewhere draining and letting go (GOAWAY). */
  goAwayMs: number;
  /** Closing this process's data engine. */
  closeMs: number;
  /** Sending the exports, and the successor opening its data engine and starting the engines (until READY). */
  successorMs: number;
}

/** What the old side needs. */
export interface HandOffOptions {
  addon: NativeAddon;
  /** The channel's socket path (created 0600; a stale file is replaced). */
  socketPath: string;
  /** The running data engine; closed once its engines are handed over. */
  de: LocalDataEngine;
  /** Epochs for every engine it runs, by volume. */
  epochs: ReadonlyMap<string, HandOffEpochs>;
  /** Starts the successor, which connects to `socketPath`: its pid, and how it ended once it has. */
  startSuccessor(socketPath: string): { pid: number; exited: Promise<number | string> };
  /** Opens this host's data engine again (a rollback). */
  reopen(): Promise<LocalDataEngine>;
}

/** How a hand-off ended on the old side. */
export type HandOffOutcome =
  /** The successor serves every engine; send RELEASED once the gRPC address is free, then exit. */
  | { committed: true; pauseMs: number; engines: number; steps: HandOffSteps; release(): Promise<void> }
  /** Nothing moved for good: `de` (a new data engine, or the same one if nothing had been touched) serves every engine again. */
  | { committed: false; reason: MooringError; de: LocalDataEngine };

/**
 * The old process's side (see the module comment).
 *
 * @throws MooringError UNSUPPORTED (no hand-off in this addon), INVALID_ARGUMENT (an engine without epochs), ADDRESS_IN_USE; a failure after the engines were detached is a rollback, not a throw
 */
export async function handOffToSuccessor(o: HandOffOptions): Promise<HandOffOutcome> {
  const api = handOffApi(o.addon);
  const volumes = (await o.de.listEngines()).map((e) => e.volume);
  const missing = volumes.filter((v) => !o.epochs.has(v));
  if (missing.length > 0) throw new MooringError('INVALID_ARGUMENT', `no epochs for the engines of ${missing.join(', ')}`);
  await rm(o.socketPath, { force: true });
  const listener = await callNative(() => api.listen(o.socketPath), 'hand-off: listening');
  let channel: NativeHandOffChannel | null = null;
  let successorPid = 0;
  try {
    const successor = o.startSuccessor(o.socketPath);
    successorPid = successor.pid;
    // A successor that exits before it connects fails the hand-off at once.
    const died = successor.exited.then((how) => {
      throw new MooringError('UNAVAILABLE', `the successor exited (${how}) before it connected`);
    });
    channel = await Promise.race([callNative(() => listener.accept(HANDOFF_LIMITS.helloTimeoutMs), 'hand-off: waiting for the successor to connect'), died]);
    died.catch(() => undefined);
    const hello = await receive(channel, HANDOFF_LIMITS.helloTimeoutMs, 'HELLO');
    if (hello.type !== 'HELLO' || hello.version !== HANDOFF_PROTOCOL_VERSION) {
      throw new MooringError('UNSUPPORTED', `the successor speaks hand-off ${hello.type === 'HELLO' ? `version ${hello.version}` : `"${hello.type}"`}, this process version ${HANDOFF_PROTOCOL_VERSION}`);
    }
  } catch (err) {
    listener.close();
    channel?.close();
    await stopProcess(successorPid);
    return { committed: false, reason: toMooringError(err, 'hand-off'), de: o.de };
  }
  listener.close();
  const ch = channel;
  await o.de.flushEnginesBeforeHandOff(HANDOFF_LIMITS.freezeTimeoutMs);
  // From here the engines move. The clients pause until COMMIT (or the rollback).
  const t0 = performance.now();
  let handed: HandedEngine[];
  try {
    handed = await o.de.detachEnginesForHandOff(HANDOFF_LIMITS.freezeTimeoutMs);
  } catch (err) {
    // Nothing was detached: the engines serve on here.
    await send(ch, { type: 'ABORT', reason: 'the exports could not be frozen' }).catch(() => undefined);
    ch.close();
    await stopProcess(successorPid);
    return { committed: false, reason: toMooringError(err, 'hand-off: freezing the exports'), de: o.de };
  }
  let reason: MooringError;
  try {
    // Engines elsewhere reading replicas here drain and reconnect (to the successor's
    // replica server, at the same address) instead of dropping them.
    const t1 = performance.now();
    await o.de.goAwayReplicaClients(HANDOFF_LIMITS.goAwayTimeoutMs);
    const t2 = performance.now();
    await o.de.close();
    const t3 = performance.now();
    const engines: ManifestEngine[] = handed.map((h) => ({ volume: h.volume, refs: h.refs, ioTimeoutMs: h.ioTimeoutMs, quorumHoldMs: h.quorumHoldMs ?? null, epoch: o.epochs.get(h.volume)!.epoch, nbd: h.nbd !== null }));
    await send(ch, { type: 'MANIFEST', engines });
    for (const h of handed) if (h.nbd) await callNative(() => ch.send(h.nbd!.record, HANDOFF_LIMITS.commitTimeoutMs), `hand-off: sending the export of ${h.volume}`);
    const reply = await receive(ch, HANDOFF_LIMITS.readyTimeoutMs, 'READY');
    if (reply.type === 'READY') {
      await send(ch, { type: 'COMMIT' });
      const t4 = performance.now();
      const pauseMs = t4 - t0;
      const steps = { detachMs: t1 - t0, goAwayMs: t2 - t1, closeMs: t3 - t2, successorMs: t4 - t3 };
      // Our copies of the sockets go; the successor's serve.
      for (const h of handed) if (h.nbd) await h.nbd.export.close().catch(() => undefined);
      return {
        committed: true,
        pauseMs,
        engines: handed.length,
        steps,
        release: async () => {
          await send(ch, { type: 'RELEASED' }).catch(() => undefined);
          ch.close();
        },
      };
    }
    reason = new MooringError('INVALID_STATE', reply.type === 'REFUSED' ? `the successor refused: ${reply.reason}` : `the successor answered ${reply.type} instead of READY`);
  } catch (err) {
    reason = toMooringError(err, 'hand-off');
  }
  // Rollback: the successor goes, this process serves the same connections again at the spare epochs.
  await send(ch, { type: 'ABORT', reason: reason.message }).catch(() => undefined);
  ch.close();
  await stopProcess(successorPid);
  for (const h of handed) h.nbd?.record.close();
  const de = await o.reopen();
  for (const h of handed) {
    const options = { volume: h.volume, replicas: h.refs, epoch: o.epochs.get(h.volume)!.rollbackEpoch, ioTimeoutMs: h.ioTimeoutMs, ...(h.quorumHoldMs !== undefined ? { quorumHoldMs: h.quorumHoldMs } : {}) };
    if (h.nbd) await de.startEngineOver(options, { resume: h.nbd.export });
    else await de.startEngine(options);
  }
  return { committed: false, reason, de };
}

/** What the new side needs. */
export interface TakeOverOptions {
  addon: NativeAddon;
  socketPath: string;
  /** Opens this host's data engine (once the old one closed it). */
  start(): Promise<LocalDataEngine>;
}

/**
 * The successor's side (see the module comment). Resolves once COMMIT and RELEASED arrived:
 * every engine serves, and the old process's gRPC address is free.
 *
 * @throws MooringError on ABORT or any failure, after closing what it opened (the old process keeps the clients)
 */
export async function takeOverFromPredecessor(o: TakeOverOptions): Promise<{ de: LocalDataEngine; engines: number; openMs: number; startMs: number }> {
  const api = handOffApi(o.addon);
  const ch = await callNative(() => api.connect(o.socketPath, HANDOFF_LIMITS.helloTimeoutMs), 'hand-off: connecting to the old process');
  let de: LocalDataEngine | null = null;
  const exports: NbdExport[] = [];
  let t1 = 0;
  let t2 = 0;
  try {
    await send(ch, { type: 'HELLO', version: HANDOFF_PROTOCOL_VERSION, pid: process.pid });
    const manifest = await receive(ch, HANDOFF_LIMITS.readyTimeoutMs, 'MANIFEST');
    if (manifest.type === 'ABORT') throw new MooringError('CANCELLED', `the old process aborted: ${manifest.reason}`);
    if (manifest.type !== 'MANIFEST' || !Array.isArray(manifest.engines)) throw new MooringError('PROTOCOL_ERROR', `hand-off: expected MANIFEST, got ${manifest.type}`);
    const records: NativeNbdHandOffRecord[] = [];
    for (const e of manifest.engines) {
      if (!e.nbd) continue;
      const r = await receive(ch, HANDOFF_LIMITS.readyTimeoutMs, `the export of ${e.volume}`);
      if (r.type !== 'record') throw new MooringError('PROTOCOL_ERROR', `hand-off: expected the export of ${e.volume}, got ${r.type}`);
      records.push(r.record);
    }
    const t0 = performance.now();
    try {
      de = await o.start();
      t1 = performance.now();
      let next = 0;
      for (const e of manifest.engines) {
        const options = { volume: e.volume, replicas: e.refs, epoch: e.epoch, ioTimeoutMs: e.ioTimeoutMs, ...(e.quorumHoldMs !== null ? { quorumHoldMs: e.quorumHoldMs } : {}) };
        if (e.nbd) exports.push(await de.startEngineOver(options, { record: records[next++]! }));
        else await de.startEngine(options);
      }
      t2 = performance.now();
    } catch (err) {
      for (const r of records) r.close();
      await send(ch, { type: 'REFUSED', reason: toMooringError(err).message.slice(0, 1000) }).catch(() => undefined);
      throw err;
    }
    await send(ch, { type: 'READY' });
    const commit = await receive(ch, HANDOFF_LIMITS.commitTimeoutMs, 'COMMIT');
    if (commit.type !== 'COMMIT') throw new MooringError('CANCELLED', commit.type === 'ABORT' ? `the old process aborted: ${commit.reason}` : `hand-off: expected COMMIT, got ${commit.type}`);
    for (const e of exports) await e.unfreeze();
    const released = await receive(ch, HANDOFF_LIMITS.commitTimeoutMs, 'RELEASED').catch(() => null);
    if (released !== null && released.type !== 'RELEASED') throw new MooringError('PROTOCOL_ERROR', `hand-off: expected RELEASED, got ${released.type}`);
    ch.close();
    return { de, engines: manifest.engines.length, openMs: t1 - t0, startMs: t2 - t1 };
  } catch (err) {
    ch.close();
    // Not committed: our copies of the sockets close without touching the connections
    // (adopted, never started), and the directory is the old process's again.
    await de?.close().catch(() => undefined);
    throw toMooringError(err, 'taking over from the old process');
  }
}

// Waits for a process to exit, killing it if it does not within the bound.
async function stopProcess(pid: number): Promise<void> {
  if (pid <= 0) return;
  const gone = (): boolean => !processAlive(pid);
  const deadline = Date.now() + HANDOFF_LIMITS.abortExitMs;
  while (!gone() && Date.now() < deadline) await sleep(50);
  if (!gone()) process.kill(pid, 'SIGKILL');
  // Bounded: a child that is not reaped yet still answers kill(pid, 0).
  for (let i = 0; i < 250 && !gone(); i++) await sleep(20);
}
