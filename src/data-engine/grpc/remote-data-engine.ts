import {
  ChannelCredentials,
  InterceptingCall,
  Metadata,
  credentials,
  loadPackageDefinition,
  type Client,
  type ClientReadableStream,
  type ClientWritableStream,
  type Interceptor,
  type ServiceError,
} from '@grpc/grpc-js';

import { MooringError, isMooringErrorCode } from '../../errors.js';
import { parseNbdAddress } from '../../nbd/nbd-address.js';
import { QUORUM_HOLD_MS_MAX } from '../../util/limits.js';
import { checkEpoch, checkIntIn, describe } from '../../util/validate.js';
import { checkLoopbackRule, checkTls, formatTcpAddress, type DataEngineTlsOptions } from '../addresses.js';
import { DATA_ENGINE_FEATURES } from '../data-engine.js';
import type {
  BackingImageDownloadOptions,
  BackingImageFileInfo,
  BackingImageFileRef,
  BackingImagePullOptions,
  BackingImageWriteOptions,
  DataEngine,
  DataEngineEvent,
  DataEngineInfo,
  EngineActivateOptions,
  EngineHandOver,
  EngineInfo,
  EngineReplicaRef,
  EngineSnapshotInfo,
  EngineStartOptions,
  HostedReplicaInfo,
  RebuildResult,
  ReplicaCreateOptions,
  SnapshotCopyResult,
  ReplicaRemoveOptions,
} from '../data-engine.js';
import {
  copyResultFromMsg,
  fileFromMsg,
  fileRefToMsg,
  replicaBackingImageToMsg,
  engineFromMsg,
  eventFromMsg,
  fromGrpcError,
  handOverFromMsg,
  handOverToMsg,
  hostedFromMsg,
  infoFromMsg,
  isUnimplementedMethod,
  rebuildResultFromMsg,
  refToMsg,
  snapshotFromMsg,
  type Msg,
} from './codec.js';
import type { HandOffEpochs, HandOffProcessResult } from '../process-handoff.js';
import { GRPC_LIMITS } from './data-engine-grpc-server.js';
import { checkClusterSecret, GRPC_AUTH_METADATA_KEY, grpcAuthToken } from '../cluster-secret.js';
import { dataEnginePackageDefinition } from './data-engine-proto.js';

/** Defaults of {@link RemoteDataEngineOptions}. */
export const REMOTE_DATA_ENGINE_DEFAULTS = {
  /** Deadline of an ordinary call. */
  timeoutMs: 30_000,
  /** Deadline of addReplica (a whole rebuild), stopEngine and deactivateEngine (a drain), exportSnapshot and copySnapshot (a whole copy). */
  longCallTimeoutMs: 6 * 3600_000,
  /** First delay before the watch stream reconnects; it doubles per failed attempt. */
  watchRetryFirstMs: 250,
  /** Largest delay before the watch stream reconnects. */
  watchRetryMaxMs: 5000,
  /**
   * How often the connection is checked with an HTTP/2 PING, with calls or without; a PING
   * not answered within as long again ends the connection (its calls fail UNAVAILABLE, the
   * watch stream reconnects on a new one). A peer that went silent (a partition, a host gone
   * without a FIN) is found in at most twice this, not after TCP gives up (minutes).
   */
  keepaliveMs: 10_000,
} as const;


/** Bounds of the deadlines in {@link RemoteDataEngineOptions}. */
const TIMEOUT_MS_MIN = 100;
const TIMEOUT_MS_MAX = 7 * 24 * 3600_000;
/** Listeners of {@link RemoteDataEngine.watch}. */
const WATCHERS_MAX = 1024;

/** Options of {@link RemoteDataEngine.connect}. */
export interface RemoteDataEngineOptions {
  /** `unix:PATH` or `tcp:HOST:PORT` of the data engine's gRPC server. */
  address: string;
  /** Mutual TLS (TCP): our client certificate, key, and the CA the server's certificate must chain to. */
  tls?: DataEngineTlsOptions;
  /** Allow plain TCP to a non-loopback host (default false). */
  allowInsecureRemote?: boolean;
  /**
   * The cluster secret (16 to 1024 bytes) of a data engine that requires it: every call
   * carries a token derived from it (docs/data-engine.md, "Authentication"). Without it
   * such a data engine answers every call UNAUTHENTICATED.
   */
  clusterSecret?: Uint8Array;
  /** Deadline per call (default 30 s). */
  timeoutMs?: number;
  /** Deadline of addReplica, stopEngine, exportSnapshot and copySnapshot (default 6 h). */
  longCallTimeoutMs?: number;
  /** HTTP/2 PING interval, and how long a PING may go unanswered before the connection is dropped (default 10 s; 100 ms to 1 h). */
  keepaliveMs?: number;
}

type Callback = (err: ServiceError | null, reply?: Msg) => void;
type UnaryMethod = (req: Msg, md: Metadata, opts: { deadline: number }, cb: Callback) => void;

/**
 * A {@link DataEngine} in another process (`mooring data-engine`), reached over gRPC. Every
 * call has a deadline; failures come back as the MooringError code the data engine raised
 * (or UNAVAILABLE when it cannot be reached). `watch()` keeps one event stream open and
 * reconnects it with back-off while anyone listens.
 */
export class RemoteDataEngine implements DataEngine {
  /** Host id of the data engine (fetched once at connect). */
  readonly hostId: string;
  /** The address it was reached at. */
  readonly address: string;
  readonly #client: Client;
  readonly #timeoutMs: number;
  readonly #longTimeoutMs: number;
  readonly #listeners = new Set<(event: DataEngineEvent) => void>();
  #stream: ClientReadableStream<Msg> | undefined;
  #retryTimer: NodeJS.Timeout | undefined;
  #retryMs: number = REMOTE_DATA_ENGINE_DEFAULTS.watchRetryFirstMs;
  #closed = false;

  private constructor(client: Client, address: string, hostId: string, timeoutMs: number, longTimeoutMs: number) {
    this.#client = client;
    this.address = address;
    this.hostId = hostId;
    this.#timeoutMs = timeoutMs;
    this.#longTimeoutMs = longTimeoutMs;
  }

  /**
   * Connects and asks the data engine who it is.
   *
   * @throws MooringError INVALID_ARGUMENT, UNAVAILABLE (not reachable in time)
   */
  static async connect(options: RemoteDataEngineOptions): Promise<RemoteDataEngine> {
    if (typeof options !== 'object' || options === null) {
      throw new MooringError('INVALID_ARGUMENT', `connect options must be {address, tls?, timeoutMs?} (got ${describe(options)})`);
    }
    const tls = checkTls(options.tls);
    const secret = checkClusterSecret(options.clusterSecret);
    const timeoutMs = checkIntIn('timeoutMs', options.timeoutMs, TIMEOUT_MS_MIN, TIMEOUT_MS_MAX, REMOTE_DATA_ENGINE_DEFAULTS.timeoutMs);
    const longTimeoutMs = checkIntIn('longCallTimeoutMs', options.longCallTimeoutMs, TIMEOUT_MS_MIN, TIMEOUT_MS_MAX, REMOTE_DATA_ENGINE_DEFAULTS.longCallTimeoutMs);
    const keepaliveMs = checkIntIn('keepaliveMs', options.keepaliveMs, GRPC_LIMITS.keepaliveMsMin, GRPC_LIMITS.keepaliveMsMax, REMOTE_DATA_ENGINE_DEFAULTS.keepaliveMs);
    const addr = parseNbdAddress(options.address);
    let target: string;
    let creds: ChannelCredentials;
    if (addr.kind === 'unix') {
      target = `unix://${addr.path}`;
      creds = credentials.createInsecure();
    } else {
      checkLoopbackRule('data engine address', addr.host, tls !== undefined, options.allowInsecureRemote === true);
      target = formatTcpAddress({ host: addr.host, port: addr.port }).slice('tcp:'.length);
      creds = tls
        ? credentials.createSsl(Buffer.from(tls.ca), Buffer.from(tls.key), Buffer.from(tls.cert), {
            // Hosts are often reached by IP: the CA (a cluster's own) is what is checked, as
            // the replica protocol does.
            checkServerIdentity: () => undefined,
          })
        : credentials.createInsecure();
    }
    const Ctor = (loadPackageDefinition(dataEnginePackageDefinition()) as unknown as { mooring: { dataengine: { v1: { DataEngine: new (t: string, c: ChannelCredentials, o: object) => Client } } } }).mooring.dataengine.v1.DataEngine;
    const client = new Ctor(target, creds, {
      'grpc.max_receive_message_length': GRPC_LIMITS.messageBytesMax,
      'grpc.max_send_message_length': GRPC_LIMITS.messageBytesMax,
      // A connection of its own: grpc-js otherwise shares one per address across clients,
      // and a new client to a data engine that just restarted would inherit the old
      // client's reconnect back-off and fail at once ("No connection established").
      'grpc.use_local_subchannel_pool': 1,
      // A read stream (a backing image file) is not held up by 64 KiB window updates.
      'grpc-node.flow_control_window': GRPC_LIMITS.clientFlowControlWindowBytes,
      // A data engine that restarted (an upgrade, a crash) is found again within seconds.
      'grpc.initial_reconnect_backoff_ms': 250,
      'grpc.max_reconnect_backoff_ms': 5000,
      // A connection that went silent is dropped: without this a watch stream on it would
      // wait forever, since it sends nothing that could fail.
      'grpc.keepalive_time_ms': keepaliveMs,
      'grpc.keepalive_timeout_ms': keepaliveMs,
      'grpc.keepalive_permit_without_calls': 1,
      ...(secret ? { interceptors: [authInterceptor(grpcAuthToken(secret))] } : {}),
    });
    const address = addr.kind === 'unix' ? `unix:${addr.path}` : formatTcpAddress({ host: addr.host, port: addr.port });
    try {
      const info = infoFromMsg(await unaryCall(client, 'Info', {}, timeoutMs, `data engine at ${address}: info`));
      return new RemoteDataEngine(client, address, info.hostId, timeoutMs, longTimeoutMs);
    } catch (err) {
      client.close();
      throw err;
    }
  }

  /** @inheritDoc DataEngine.info */
  async info(): Promise<DataEngineInfo> {
    return infoFromMsg(await this.#call('Info', {}));
  }

  /** @inheritDoc DataEngine.createReplica */
  async createReplica(name: string, sizeBytes: number, options: ReplicaCreateOptions = {}): Promise<HostedReplicaInfo> {
    if (typeof sizeBytes !== 'number' || !Number.isSafeInteger(sizeBytes) || sizeBytes < 0) {
      throw new MooringError('INVALID_ARGUMENT', `sizeBytes must be a non-negative integer (got ${describe(sizeBytes)})`);
    }
    const b = (options ?? {}).backingImage as Partial<ReplicaCreateOptions['backingImage']> | undefined;
    if (b !== undefined && (typeof b !== 'object' || b === null || typeof b.dir !== 'string' || typeof b.format !== 'string' || !isCount(b.virtualSizeBytes))) {
      throw new MooringError('INVALID_ARGUMENT', `backingImage must be {dir, format, virtualSizeBytes} (got ${describe(b)})`);
    }
    const req: Msg = { name, sizeBytes, ...(b ? { backingImage: replicaBackingImageToMsg(b as NonNullable<ReplicaCreateOptions['backingImage']>) } : {}) };
    return hostedFromMsg(await this.#call('CreateReplica', req));
  }

  /** @inheritDoc DataEngine.deleteReplica */
  async deleteReplica(name: string): Promise<void> {
    await this.#call('DeleteReplica', { name });
  }

  /** @inheritDoc DataEngine.growReplica */
  async growReplica(name: string, sizeBytes: number): Promise<HostedReplicaInfo> {
    // Shape only (what protobuf would encode wrongly); the data engine checks the value.
    if (!isCount(sizeBytes)) throw new MooringError('INVALID_ARGUMENT', `sizeBytes must be a non-negative integer (got ${describe(sizeBytes)})`);
    return hostedFromMsg(await this.#call('GrowReplica', { name, sizeBytes }, this.#longTimeoutMs));
  }

  /** @inheritDoc DataEngine.listReplicas */
  async listReplicas(): Promise<HostedReplicaInfo[]> {
    const reply = await this.#call('ListReplicas', {});
    return (Array.isArray(reply.replicas) ? (reply.replicas as Msg[]) : []).map(hostedFromMsg);
  }

  /** @inheritDoc DataEngine.startEngine */
  async startEngine(options: EngineStartOptions): Promise<EngineInfo> {
    if (typeof options !== 'object' || options === null || !Array.isArray(options.replicas)) {
      throw new MooringError('INVALID_ARGUMENT', `engine start options must be {volume, replicas, epoch, nbd?, ioTimeoutMs?, standby?, salvage?, quorumHoldMs?} (got ${describe(options)})`);
    }
    if (options.standby !== undefined && typeof options.standby !== 'boolean') {
      throw new MooringError('INVALID_ARGUMENT', `standby must be a boolean (got ${describe(options.standby)})`);
    }
    if (options.salvage !== undefined && typeof options.salvage !== 'boolean') {
      throw new MooringError('INVALID_ARGUMENT', `salvage must be a boolean (got ${describe(options.salvage)})`);
    }
    // Shape only (what protobuf would encode wrongly: a negative or inexact uint64, an
    // overflowing uint32); the data engine checks the rest (an epoch is required unless standby).
    if (options.epoch !== undefined) checkEpoch('epoch', options.epoch);
    if (options.quorumHoldMs !== undefined) checkIntIn('quorumHoldMs', options.quorumHoldMs, 0, QUORUM_HOLD_MS_MAX, 0);
    const req: Msg = {
      volume: options.volume,
      replicas: options.replicas.map((r) => refToMsg(checkRefShape(r))),
      nbd: options.nbd ?? '',
      ioTimeoutMs: options.ioTimeoutMs ?? 0,
      standby: options.standby === true,
      epoch: options.epoch ?? 0,
      quorumHoldMs: options.quorumHoldMs ?? 0,
      hasQuorumHoldMs: options.quorumHoldMs !== undefined,
      salvage: options.salvage === true,
    };
    // An older data engine drops the unknown field and would start normally: ask first
    // (every time: another process, maybe of another release, may answer at this address now).
    if (options.salvage === true) {
      const info = await this.info();
      if (!info.features.includes(DATA_ENGINE_FEATURES.salvage)) {
        throw new MooringError('UNSUPPORTED', `the data engine at ${this.address} (${info.version}) does not announce salvage: upgrade it first (docs/salvage.md)`, {
          details: { hostId: info.hostId, version: info.version },
        });
      }
    }
    return engineFromMsg(await this.#call('StartEngine', req, this.#longTimeoutMs));
  }

  /** @inheritDoc DataEngine.stopEngine */
  async stopEngine(volume: string): Promise<void> {
    await this.#call('StopEngine', { volume }, this.#longTimeoutMs);
  }

  /** @inheritDoc DataEngine.engineInfo */
  async engineInfo(volume: string): Promise<EngineInfo> {
    return engineFromMsg(await this.#call('EngineInfo', { volume }));
  }

  /** @inheritDoc DataEngine.listEngines */
  async listEngines(): Promise<EngineInfo[]> {
    const reply = await this.#call('ListEngines', {});
    return (Array.isArray(reply.engines) ? (reply.engines as Msg[]) : []).map(engineFromMsg);
  }

  /** @inheritDoc DataEngine.addReplica */
  async addReplica(volume: string, replica: EngineReplicaRef): Promise<RebuildResult> {
    return rebuildResultFromMsg(await this.#call('AddReplica', { volume, replica: refToMsg(checkRefShape(replica)) }, this.#longTimeoutMs));
  }

  /** @inheritDoc DataEngine.removeReplica */
  async removeReplica(volume: string, replicaId: string, options: ReplicaRemoveOptions = {}): Promise<void> {
    await this.#call('RemoveReplica', { volume, replicaId, evenIfRw: options?.evenIfRw === true });
  }

  /** @inheritDoc DataEngine.resizeEngine */
  async resizeEngine(volume: string, sizeBytes: number): Promise<EngineInfo> {
    if (!isCount(sizeBytes)) throw new MooringError('INVALID_ARGUMENT', `sizeBytes must be a non-negative integer (got ${describe(sizeBytes)})`);
    // Long: the engine waits for the requests in flight, and each replica commits its size.
    return engineFromMsg(await this.#call('ResizeEngine', { volume, sizeBytes }, this.#longTimeoutMs));
  }

  /** @inheritDoc DataEngine.deactivateEngine */
  async deactivateEngine(volume: string): Promise<EngineHandOver> {
    return handOverFromMsg(await this.#call('DeactivateEngine', { volume }, this.#longTimeoutMs));
  }

  /** @inheritDoc DataEngine.activateEngine */
  async activateEngine(volume: string, handOver: EngineHandOver, options: EngineActivateOptions): Promise<EngineInfo> {
    const h = handOver as Partial<EngineHandOver> | null;
    const count = (v: unknown): boolean => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
    // Shape only (what protobuf could not encode); the data engine validates the values.
    if (typeof h !== 'object' || h === null || !count(h.epoch) || !count(h.generation) || !Array.isArray(h.rwReplicaIds) || !h.rwReplicaIds.every((x) => typeof x === 'string')) {
      throw new MooringError('INVALID_ARGUMENT', `handOver must be {epoch, generation, rwReplicaIds} (got ${describe(handOver)})`);
    }
    if (typeof options !== 'object' || options === null) throw new MooringError('INVALID_ARGUMENT', `activate options must be {epoch} (got ${describe(options)})`);
    const epoch = checkEpoch('epoch', options.epoch);
    return engineFromMsg(await this.#call('ActivateEngine', { volume, handOver: handOverToMsg(h as EngineHandOver), epoch }));
  }

  /** @inheritDoc DataEngine.createSnapshot */
  async createSnapshot(volume: string, name: string, options: { labels?: Record<string, string> } = {}): Promise<EngineSnapshotInfo> {
    const labels = options?.labels ?? {};
    if (typeof labels !== 'object' || labels === null || Object.values(labels).some((v) => typeof v !== 'string')) {
      throw new MooringError('INVALID_ARGUMENT', `labels must be an object of string values (got ${describe(labels)})`);
    }
    return snapshotFromMsg(await this.#call('CreateSnapshot', { volume, name, labels }));
  }

  /** @inheritDoc DataEngine.listSnapshots */
  async listSnapshots(volume: string): Promise<EngineSnapshotInfo[]> {
    const reply = await this.#call('ListSnapshots', { volume });
    return (Array.isArray(reply.snapshots) ? (reply.snapshots as Msg[]) : []).map(snapshotFromMsg);
  }

  /** @inheritDoc DataEngine.deleteSnapshot */
  async deleteSnapshot(volume: string, name: string): Promise<void> {
    await this.#call('DeleteSnapshot', { volume, name });
  }

  /**
   * Asks the data engine's process to stop (drain, flush) and start `argv` + its own
   * `data-engine` arguments in its place: the default launcher of an upgrade
   * (docs/upgrade.md). Resolves once the process accepted; it then stops by itself.
   *
   * @throws MooringError UNSUPPORTED (not started with --allow-successor-exec), INVALID_ARGUMENT (argv refused), UNAVAILABLE
   */
  async replaceProcess(argv: string[]): Promise<void> {
    await this.#call('ReplaceProcess', { argv });
  }

  /**
   * Asks the data engine's process to hand every engine, with its NBD clients connected, to
   * a successor started from `argv` (an in-place upgrade, docs/upgrade.md). `epochs` gives
   * each engine's epoch in the successor and the one it takes back here if the hand-off is
   * rolled back. Resolves when it committed or rolled back (never an error to the clients).
   *
   * @throws MooringError UNSUPPORTED (no `in-place-handoff` feature), INVALID_ARGUMENT, UNAVAILABLE
   */
  async handOffProcess(argv: string[], epochs: Map<string, HandOffEpochs>): Promise<HandOffProcessResult> {
    const reply = await this.#call('HandOffProcess', { argv, epochs: [...epochs].map(([volume, e]) => ({ volume, epoch: e.epoch, rollbackEpoch: e.rollbackEpoch })) }, this.#longTimeoutMs);
    const code = reply.errorCode;
    return {
      committed: reply.committed === true,
      error: code === '' || code === undefined ? null : { code: isMooringErrorCode(code) ? code : 'IO_ERROR', message: typeof reply.errorMessage === 'string' ? reply.errorMessage : '' },
      pauseMs: typeof reply.pauseMs === 'number' ? reply.pauseMs : 0,
      engines: typeof reply.engines === 'number' ? reply.engines : 0,
    };
  }

  /** @inheritDoc DataEngine.revertSnapshot */
  async revertSnapshot(volume: string, name: string): Promise<void> {
    await this.#call('RevertSnapshot', { volume, name });
  }

  /** @inheritDoc DataEngine.exportSnapshot */
  async exportSnapshot(volume: string, snapshot: string, path: string): Promise<SnapshotCopyResult> {
    return copyResultFromMsg(await this.#call('ExportSnapshot', { volume, snapshot, path }, this.#longTimeoutMs));
  }

  /** @inheritDoc DataEngine.copySnapshot */
  async copySnapshot(volume: string, snapshot: string, toVolume: string): Promise<SnapshotCopyResult> {
    return copyResultFromMsg(await this.#call('CopySnapshot', { volume, snapshot, toVolume }, this.#longTimeoutMs));
  }

  // --- backing image files ------------------------------------------------------

  /** @inheritDoc DataEngine.listBackingImageFiles */
  async listBackingImageFiles(): Promise<BackingImageFileInfo[]> {
    const reply = await this.#call('ListBackingImageFiles', {});
    return (Array.isArray(reply.files) ? (reply.files as Msg[]) : []).map(fileFromMsg);
  }

  /** @inheritDoc DataEngine.backingImageFile */
  async backingImageFile(ref: BackingImageFileRef): Promise<BackingImageFileInfo | null> {
    const reply = await this.#call('GetBackingImageFile', fileRefToMsg(checkFileRefShape(ref)));
    return typeof reply.file === 'object' && reply.file !== null ? fileFromMsg(reply.file as Msg) : null;
  }

  /** @inheritDoc DataEngine.downloadBackingImageFile */
  async downloadBackingImageFile(ref: BackingImageFileRef, options: BackingImageDownloadOptions): Promise<BackingImageFileInfo> {
    const o = checkObject('download options', options);
    if (typeof o.url !== 'string') throw new MooringError('INVALID_ARGUMENT', `url must be a string (got ${describe(o.url)})`);
    optionalString('expectedChecksum', o.expectedChecksum);
    if (o.startTimeoutMs !== undefined && !isCount(o.startTimeoutMs, 2 ** 32 - 1)) throw new MooringError('INVALID_ARGUMENT', `startTimeoutMs must be a non-negative integer (got ${describe(o.startTimeoutMs)})`);
    if (o.retries !== undefined && !isCount(o.retries, 2 ** 32 - 1)) throw new MooringError('INVALID_ARGUMENT', `retries must be a non-negative integer (got ${describe(o.retries)})`);
    const req: Msg = {
      ref: fileRefToMsg(checkFileRefShape(ref)),
      url: o.url,
      expectedChecksum: o.expectedChecksum ?? '',
      startTimeoutMs: o.startTimeoutMs ?? 0,
      retries: o.retries ?? 0,
      hasRetries: o.retries !== undefined,
    };
    return fileFromMsg(await this.#call('DownloadBackingImageFile', req, this.#longTimeoutMs));
  }

  /**
   * @inheritDoc DataEngine.writeBackingImageFile
   *
   * The bytes travel in messages of at most 1 MiB, as fast as the data engine takes them
   * (flow control). If `data` throws, the call is cancelled (the data engine keeps the
   * partial file) and this rejects with that error.
   */
  async writeBackingImageFile(ref: BackingImageFileRef, options: BackingImageWriteOptions, data: AsyncIterable<Uint8Array>): Promise<BackingImageFileInfo> {
    if (this.#closed) throw new MooringError('CLOSED', `connection to data engine ${this.hostId} is closed`);
    const o = checkObject('write options', options);
    if (!isCount(o.sizeBytes)) throw new MooringError('INVALID_ARGUMENT', `sizeBytes must be a non-negative integer (got ${describe(o.sizeBytes)})`);
    if (o.offset !== undefined && !isCount(o.offset)) throw new MooringError('INVALID_ARGUMENT', `offset must be a non-negative integer (got ${describe(o.offset)})`);
    optionalString('expectedChecksum', o.expectedChecksum);
    if (data === null || typeof data !== 'object' || typeof (data as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] !== 'function') {
      throw new MooringError('INVALID_ARGUMENT', 'data must be an async iterable of Uint8Array chunks');
    }
    const what = `data engine ${this.hostId}: WriteBackingImageFile`;
    let call!: ClientWritableStream<Msg>;
    const reply = new Promise<Msg>((res, rej) => {
      const fn = (this.#client as unknown as Record<string, (md: Metadata, opts: { deadline: number }, cb: Callback) => ClientWritableStream<Msg>>).WriteBackingImageFile!;
      call = fn.call(this.#client, new Metadata(), { deadline: Date.now() + this.#longTimeoutMs }, (err, r) => (err ? rej(fromGrpcError(err, what)) : res(r ?? {})));
    });
    reply.catch(() => undefined);
    // The outcome arrives through the callback; a write racing the server's early answer must
    // not surface as an unhandled stream error.
    call.on('error', () => undefined);
    let finished = false;
    reply.then(
      () => (finished = true),
      () => (finished = true),
    );
    const send = async (m: Msg): Promise<void> => {
      if (!call.write(m)) {
        await new Promise<void>((res) => {
          const done = (): void => {
            call.off('drain', done);
            res();
          };
          call.on('drain', done);
          // The server may answer (e.g. reuse, BUSY) without reading further.
          void reply.then(done, done);
        });
      }
    };
    try {
      const head: Msg = { ref: fileRefToMsg(checkFileRefShape(ref)), sizeBytes: o.sizeBytes, offset: o.offset ?? 0, expectedChecksum: o.expectedChecksum ?? '', data: Buffer.alloc(0) };
      await send(head);
      for await (const chunk of data) {
        if (finished) break;
        if (!(chunk instanceof Uint8Array)) throw new MooringError('INVALID_ARGUMENT', `data chunks must be Uint8Array (got ${describe(chunk)})`);
        const max = GRPC_LIMITS.fileDataBytesMax;
        for (let off = 0; off < chunk.length && !finished; off += max) await send({ data: chunk.subarray(off, Math.min(chunk.length, off + max)) });
      }
      call.end();
    } catch (err) {
      call.cancel();
      await reply.catch(() => undefined);
      throw err;
    }
    return fileFromMsg(await reply);
  }

  /** @inheritDoc DataEngine.readBackingImageFile */
  async *readBackingImageFile(ref: BackingImageFileRef, options: { offset?: number; stallTimeoutMs?: number } = {}): AsyncGenerator<Uint8Array> {
    if (this.#closed) throw new MooringError('CLOSED', `connection to data engine ${this.hostId} is closed`);
    const o = checkObject('read options', options);
    if (o.offset !== undefined && !isCount(o.offset)) throw new MooringError('INVALID_ARGUMENT', `offset must be a non-negative integer (got ${describe(o.offset)})`);
    const stallMs = o.stallTimeoutMs === undefined ? undefined : checkIntIn('stallTimeoutMs', o.stallTimeoutMs, TIMEOUT_MS_MIN, TIMEOUT_MS_MAX, 0);
    const fn = (this.#client as unknown as Record<string, (req: Msg, md: Metadata, opts: { deadline: number }) => ClientReadableStream<Msg>>).ReadBackingImageFile!;
    const call = fn.call(this.#client, { ref: fileRefToMsg(checkFileRefShape(ref)), offset: o.offset ?? 0 }, new Metadata(), { deadline: Date.now() + this.#longTimeoutMs });
    let ended = false;
    // With stallTimeoutMs: the time the source takes for each next message, not the time the
    // consumer spends between asking (its writes may be slow; the stream then waits on it).
    let stalled = false;
    let timer: NodeJS.Timeout | undefined;
    const arm = (): void => {
      if (stallMs === undefined) return;
      timer = setTimeout(() => {
        stalled = true;
        call.cancel();
      }, stallMs);
    };
    try {
      arm();
      for await (const m of call as AsyncIterable<Msg>) {
        clearTimeout(timer);
        if (m.data instanceof Uint8Array) yield m.data;
        arm();
      }
      ended = true;
    } catch (err) {
      ended = true;
      if (stalled) throw new MooringError('UNAVAILABLE', `data engine ${this.hostId}: ReadBackingImageFile sent nothing for ${stallMs} ms`, { cause: err });
      throw fromGrpcError(err, `data engine ${this.hostId}: ReadBackingImageFile`);
    } finally {
      clearTimeout(timer);
      if (!ended) {
        // The consumer stopped early: tell the data engine, so it frees the read.
        call.on('error', () => undefined);
        call.cancel();
      }
    }
  }

  /**
   * @inheritDoc DataEngine.pullBackingImageFile
   *
   * A data engine of a release without the call answers UNIMPLEMENTED: this rejects with
   * UNSUPPORTED, and nothing changed on its disk.
   */
  async pullBackingImageFile(ref: BackingImageFileRef, options: BackingImagePullOptions): Promise<BackingImageFileInfo> {
    const o = checkObject('pull options', options);
    if (!isCount(o.sizeBytes)) throw new MooringError('INVALID_ARGUMENT', `sizeBytes must be a non-negative integer (got ${describe(o.sizeBytes)})`);
    if (o.offset !== undefined && !isCount(o.offset)) throw new MooringError('INVALID_ARGUMENT', `offset must be a non-negative integer (got ${describe(o.offset)})`);
    optionalString('expectedChecksum', o.expectedChecksum);
    const src = checkObject('source', o.source);
    if (typeof src.address !== 'string' || typeof src.hostId !== 'string') throw new MooringError('INVALID_ARGUMENT', `source must be {address, hostId} strings (got ${describe(src)})`);
    const req: Msg = {
      ref: fileRefToMsg(checkFileRefShape(ref)),
      sizeBytes: o.sizeBytes,
      offset: o.offset ?? 0,
      expectedChecksum: o.expectedChecksum ?? '',
      sourceAddress: src.address,
      sourceHostId: src.hostId,
    };
    const reply = await this.#call('PullBackingImageFile', req, this.#longTimeoutMs).catch((err: unknown) => {
      if (!isUnimplementedMethod(err)) throw err;
      throw new MooringError('UNSUPPORTED', `data engine ${this.hostId} cannot pull backing image files (an earlier release): relay instead`, {
        cause: err,
        details: { unimplemented: 'PullBackingImageFile' },
      });
    });
    return fileFromMsg(reply);
  }

  /** @inheritDoc DataEngine.exportSnapshotToBackingImageFile */
  async exportSnapshotToBackingImageFile(volume: string, snapshot: string, ref: BackingImageFileRef, options: { expectedChecksum?: string } = {}): Promise<BackingImageFileInfo> {
    const o = checkObject('options', options);
    optionalString('expectedChecksum', o.expectedChecksum);
    const req: Msg = { volume, snapshot, ref: fileRefToMsg(checkFileRefShape(ref)), expectedChecksum: o.expectedChecksum ?? '' };
    return fileFromMsg(await this.#call('ExportSnapshotToBackingImageFile', req, this.#longTimeoutMs));
  }

  /** @inheritDoc DataEngine.cancelBackingImageFile */
  async cancelBackingImageFile(ref: BackingImageFileRef): Promise<void> {
    await this.#call('CancelBackingImageFile', fileRefToMsg(checkFileRefShape(ref)));
  }

  /** @inheritDoc DataEngine.deleteBackingImageFile */
  async deleteBackingImageFile(ref: BackingImageFileRef): Promise<void> {
    await this.#call('DeleteBackingImageFile', fileRefToMsg(checkFileRefShape(ref)), this.#longTimeoutMs);
  }

  /**
   * Subscribes to the data engine's events. One stream serves all listeners; when it
   * breaks (the data engine restarted, the network failed) it is reopened with back-off.
   * Events raised while it was broken are not replayed: read engineInfo() after a gap.
   */
  watch(listener: (event: DataEngineEvent) => void): () => void {
    if (typeof listener !== 'function') throw new MooringError('INVALID_ARGUMENT', 'watch needs a function');
    if (this.#closed) throw new MooringError('CLOSED', `connection to data engine ${this.hostId} is closed`);
    if (this.#listeners.size >= WATCHERS_MAX) throw new MooringError('BUSY', `${WATCHERS_MAX} watchers are registered already`);
    const entry = (e: DataEngineEvent): void => listener(e);
    this.#listeners.add(entry);
    if (!this.#stream && !this.#retryTimer) this.#openStream();
    return () => {
      this.#listeners.delete(entry);
      if (this.#listeners.size === 0) this.#stopStream();
    };
  }

  /** Closes the connection; the data engine and its engines keep running. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#listeners.clear();
    this.#stopStream();
    this.#client.close();
  }

  #call(method: string, req: Msg, timeoutMs = this.#timeoutMs): Promise<Msg> {
    if (this.#closed) return Promise.reject(new MooringError('CLOSED', `connection to data engine ${this.hostId} is closed`));
    return unaryCall(this.#client, method, req, timeoutMs, `data engine ${this.hostId}: ${method}`);
  }

  #openStream(): void {
    if (this.#closed || this.#listeners.size === 0) return;
    const stream = (this.#client as unknown as { Watch: (req: Msg) => ClientReadableStream<Msg> }).Watch({});
    this.#stream = stream;
    stream.on('data', (m: Msg) => {
      // Data flowing means the stream is healthy again.
      this.#retryMs = REMOTE_DATA_ENGINE_DEFAULTS.watchRetryFirstMs;
      const event = eventFromMsg(m);
      if (!event) return;
      for (const l of [...this.#listeners]) {
        try {
          l(event);
        } catch (err) {
          process.nextTick(() => {
            throw err;
          });
        }
      }
    });
    stream.on('metadata', () => {
      this.#retryMs = REMOTE_DATA_ENGINE_DEFAULTS.watchRetryFirstMs;
    });
    const broken = (): void => {
      if (this.#stream !== stream) return;
      this.#stream = undefined;
      if (this.#closed || this.#listeners.size === 0) return;
      const delay = this.#retryMs;
      this.#retryMs = Math.min(this.#retryMs * 2, REMOTE_DATA_ENGINE_DEFAULTS.watchRetryMaxMs);
      this.#retryTimer = setTimeout(() => {
        this.#retryTimer = undefined;
        this.#openStream();
      }, delay);
    };
    stream.on('error', broken);
    stream.on('end', broken);
  }

  #stopStream(): void {
    if (this.#retryTimer) clearTimeout(this.#retryTimer);
    this.#retryTimer = undefined;
    const s = this.#stream;
    this.#stream = undefined;
    if (s) {
      s.on('error', () => undefined);
      s.cancel();
    }
  }
}

function unaryCall(client: Client, method: string, req: Msg, timeoutMs: number, what: string): Promise<Msg> {
  const fn = (client as unknown as Record<string, UnaryMethod>)[method]!;
  return new Promise((res, rej) => {
    fn.call(client, req, new Metadata(), { deadline: Date.now() + timeoutMs }, (err, reply) => {
      if (err) rej(fromGrpcError(err, what));
      else res(reply ?? {});
    });
  });
}

// Shape only (types that protobuf could not encode); the data engine validates the rest.
function checkRefShape(r: unknown): EngineReplicaRef {
  if (typeof r !== 'object' || r === null) throw new MooringError('INVALID_ARGUMENT', `a replica ref must be {id, hostId, name, address} (got ${describe(r)})`);
  const x = r as Record<string, unknown>;
  for (const k of ['id', 'hostId', 'name'] as const) {
    if (typeof x[k] !== 'string') throw new MooringError('INVALID_ARGUMENT', `replica ${k} must be a string (got ${describe(x[k])})`);
  }
  if (x.address !== null && x.address !== undefined && typeof x.address !== 'string') {
    throw new MooringError('INVALID_ARGUMENT', `replica address must be tcp:HOST:PORT or null (got ${describe(x.address)})`);
  }
  return r as EngineReplicaRef;
}

// Shape only: what protobuf could not encode. The data engine validates names and uuids.
function checkFileRefShape(r: unknown): BackingImageFileRef {
  if (typeof r !== 'object' || r === null || typeof (r as BackingImageFileRef).name !== 'string' || typeof (r as BackingImageFileRef).uuid !== 'string') {
    throw new MooringError('INVALID_ARGUMENT', `a backing image file ref must be {name, uuid} strings (got ${describe(r)})`);
  }
  return r as BackingImageFileRef;
}

function checkObject<T>(what: string, v: T): T {
  if (typeof v !== 'object' || v === null) throw new MooringError('INVALID_ARGUMENT', `${what} must be an object (got ${describe(v)})`);
  return v;
}

function optionalString(what: string, v: unknown): void {
  if (v !== undefined && typeof v !== 'string') throw new MooringError('INVALID_ARGUMENT', `${what} must be a string (got ${describe(v)})`);
}

function isCount(v: unknown, max = Number.MAX_SAFE_INTEGER): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 && v <= max;
}

// Adds the cluster secret's token to every call's metadata (unary and streaming alike).
function authInterceptor(token: string): Interceptor {
  return (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set(GRPC_AUTH_METADATA_KEY, token);
        next(metadata, listener);
      },
    });
}
