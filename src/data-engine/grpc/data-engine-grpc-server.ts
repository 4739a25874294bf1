import { connect } from 'node:net';
import { chmod, lstat, unlink } from 'node:fs/promises';

import { Metadata, status as GrpcStatus, Server, ServerCredentials, type ServerReadableStream, type ServerUnaryCall, type ServerWritableStream, type sendUnaryData, type UntypedServiceImplementation, type ServiceDefinition, type MethodDefinition } from '@grpc/grpc-js';

import { MooringError, toMooringError } from '../../errors.js';
import { parseNbdAddress } from '../../nbd/nbd-address.js';
import { checkIntIn, describe } from '../../util/validate.js';
import { checkLoopbackRule, checkTls, formatTcpAddress, type DataEngineTlsOptions } from '../addresses.js';
import { DATA_ENGINE_FEATURES, type DataEngine } from '../data-engine.js';
import type { HandOffEpochs, HandOffProcessResult } from '../process-handoff.js';
import { BACKING_IMAGE_FILE_LIMITS } from '../backing-image-files.js';
import {
  copyResultToMsg,
  fileRefFromMsg,
  fileToMsg,
  replicaBackingImageFromMsg,
  engineToMsg,
  eventToMsg,
  handOverFromMsg,
  handOverToMsg,
  labelsFromMsg,
  snapshotToMsg,
  hostedToMsg,
  infoToMsg,
  rebuildResultToMsg,
  refFromMsg,
  requestString,
  requestUint,
  toGrpcError,
  type Msg,
} from './codec.js';
import { DATA_ENGINE_SERVICE, dataEnginePackageDefinition } from './data-engine-proto.js';
import { checkClusterSecret, GRPC_AUTH_METADATA_KEY, grpcAuthToken, grpcAuthTokenMatches } from '../cluster-secret.js';

/** Limits of the gRPC server (and client). */
export const GRPC_LIMITS = {
  /** Largest message received or sent; larger requests are refused (RESOURCE_EXHAUSTED). */
  messageBytesMax: 4 * 1024 * 1024,
  /** Concurrent calls per connection. */
  concurrentStreamsMax: 128,
  /** Watch streams open at once. */
  watchStreamsMax: 64,
  /** Events queued for one slow watcher before its stream is ended (it reconnects). */
  watchQueuedEventsMax: 10_000,
  /** How long close() waits for calls in flight before cutting them. */
  shutdownGraceMs: 5000,
  /** Data bytes in one WriteBackingImageFile / ReadBackingImageFile message. */
  fileDataBytesMax: BACKING_IMAGE_FILE_LIMITS.readChunkBytes,
  /** HTTP/2 receive window of a client (the most a server may send ahead of what it read). */
  clientFlowControlWindowBytes: 8 * 1024 * 1024,
  /**
   * How often the server PINGs each client connection, and how long a PING may go
   * unanswered before it closes the connection: a client gone without a word (a partition,
   * a host powered off) stops holding its calls and its watch stream (one of
   * watchStreamsMax) after at most twice this, not when TCP gives up (minutes).
   */
  keepaliveMs: 10_000,
  /** Smallest `keepaliveMs` the server and RemoteDataEngine accept. */
  keepaliveMsMin: 100,
  /** Largest `keepaliveMs` the server and RemoteDataEngine accept. */
  keepaliveMsMax: 3600_000,
} as const;

/** Options of {@link DataEngineGrpcServer.start}. */
export interface DataEngineGrpcServerOptions {
  /** The data engine to serve. */
  engine: DataEngine;
  /** `unix:PATH` or `tcp:HOST:PORT` (port 0 = any free port). */
  listen: string;
  /** Mutual TLS (TCP): clients must present a certificate signed by `ca`. */
  tls?: DataEngineTlsOptions;
  /** Allow TCP beyond loopback without TLS (default false). */
  allowInsecureRemote?: boolean;
  /**
   * The cluster secret (16 to 1024 bytes): every call must carry the token derived from it
   * (RemoteDataEngine's `clusterSecret`), checked before any method runs; others are
   * answered UNAUTHENTICATED. Without it calls are not authenticated: only the unix
   * socket's mode (0600) or TLS keeps other processes out.
   */
  clusterSecret?: Uint8Array;
  /**
   * Serves ReplaceProcess: checks the successor's argv and arranges for this process to
   * stop and start it (`mooring data-engine --allow-successor-exec`). Without it the call is
   * UNSUPPORTED and `info().features` lacks `successor-exec`.
   */
  replaceProcess?: (argv: string[]) => Promise<void>;
  /**
   * Serves HandOffProcess: hands every engine, clients connected, to a successor started
   * from argv (src/data-engine/process-handoff.ts). Without it the call is UNSUPPORTED.
   */
  handOffProcess?: (argv: string[], epochs: Map<string, HandOffEpochs>) => Promise<HandOffProcessResult>;
  /**
   * HTTP/2 PING interval per client connection, and how long a PING may go unanswered
   * before the connection is closed (its calls cancelled, its watch stream freed). Default
   * 10 s ({@link GRPC_LIMITS}.keepaliveMs); 100 ms to 1 h.
   */
  keepaliveMs?: number;
}

// Marks a request that did not decode; the handler answers it with PROTOCOL_ERROR.
const BAD_REQUEST = Symbol('bad request');

/**
 * Serves any {@link DataEngine} over gRPC, on a unix socket (same host) or TCP (between
 * hosts, mutual TLS when given; loopback only without TLS unless allowed). Bad requests
 * (garbage, wrong types, oversized) get a gRPC error carrying a MooringError code; the
 * server keeps serving.
 */
export class DataEngineGrpcServer {
  /** Where it listens, with the bound port for TCP: `unix:PATH` or `tcp:HOST:PORT`. */
  readonly address: string;
  /** Whether clients must use mutual TLS. */
  readonly tls: boolean;
  readonly #server: Server;
  readonly #watchers = new Set<{ end: () => void }>();
  #engine!: DataEngine;

  /** Watch streams open now (at most {@link GRPC_LIMITS}.watchStreamsMax). */
  get watchStreams(): number {
    return this.#watchers.size;
  }
  readonly #unixPath: string | undefined;
  #closing: Promise<void> | undefined;

  private constructor(server: Server, address: string, tls: boolean, unixPath: string | undefined) {
    this.#server = server;
    this.address = address;
    this.tls = tls;
    this.#unixPath = unixPath;
  }

  /**
   * Binds and starts serving.
   *
   * @throws MooringError INVALID_ARGUMENT (address; non-loopback TCP without TLS), ADDRESS_IN_USE
   */
  static async start(options: DataEngineGrpcServerOptions): Promise<DataEngineGrpcServer> {
    if (typeof options !== 'object' || options === null || typeof options.engine !== 'object' || options.engine === null) {
      throw new MooringError('INVALID_ARGUMENT', `gRPC server options must be {engine, listen, tls?} (got ${describe(options)})`);
    }
    const tls = checkTls(options.tls);
    const secret = checkClusterSecret(options.clusterSecret);
    const keepaliveMs = checkIntIn('keepaliveMs', options.keepaliveMs, GRPC_LIMITS.keepaliveMsMin, GRPC_LIMITS.keepaliveMsMax, GRPC_LIMITS.keepaliveMs);
    const addr = parseNbdAddress(options.listen);
    let target: string;
    if (addr.kind === 'unix') {
      if (tls) throw new MooringError('INVALID_ARGUMENT', 'TLS is for TCP listeners; a unix socket is protected by its file permissions');
      await removeStaleSocket(addr.path);
      target = `unix://${addr.path}`;
    } else {
      checkLoopbackRule('gRPC listen address', addr.host, tls !== undefined, options.allowInsecureRemote === true);
      target = formatTcpAddress({ host: addr.host, port: addr.port }).slice('tcp:'.length);
    }
    const server = new Server({
      'grpc.max_receive_message_length': GRPC_LIMITS.messageBytesMax,
      'grpc.max_send_message_length': GRPC_LIMITS.messageBytesMax,
      'grpc.max_concurrent_streams': GRPC_LIMITS.concurrentStreamsMax,
      'grpc.keepalive_time_ms': keepaliveMs,
      'grpc.keepalive_timeout_ms': keepaliveMs,
    });
    const creds = tls
      ? ServerCredentials.createSsl(Buffer.from(tls.ca), [{ cert_chain: Buffer.from(tls.cert), private_key: Buffer.from(tls.key) }], true)
      : ServerCredentials.createInsecure();
    const port = await new Promise<number>((res, rej) => {
      server.bindAsync(target, creds, (err, p) => (err ? rej(err) : res(p)));
    }).catch((err: unknown) => {
      const message = (err as Error).message ?? String(err);
      throw new MooringError(/in use|EADDRINUSE/i.test(message) ? 'ADDRESS_IN_USE' : 'INVALID_ARGUMENT', `cannot listen on ${options.listen}: ${message}`, { cause: err });
    });
    if (addr.kind === 'unix') {
      // Only this user may connect (grpc-js creates the socket with the umask's mode).
      await chmod(addr.path, 0o600).catch((err: unknown) => {
        server.forceShutdown();
        throw toMooringError(err, `making ${addr.path} private`);
      });
    }
    const address = addr.kind === 'unix' ? `unix:${addr.path}` : formatTcpAddress({ host: addr.host, port });
    const self = new DataEngineGrpcServer(server, address, tls !== undefined, addr.kind === 'unix' ? addr.path : undefined);
    self.#engine = options.engine;
    // Calls go to whichever data engine serves now (setEngine).
    const current = new Proxy({} as DataEngine, {
      get: (_target, prop) => {
        const v = (self.#engine as unknown as Record<string | symbol, unknown>)[prop];
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(self.#engine) : v;
      },
    });
    const impl = self.#implementation(current, options);
    server.addService(guardedService(), secret ? authenticated(impl, grpcAuthToken(secret)) : impl);
    return self;
  }

  /**
   * Serves another data engine from now on: one this process opened again over the same
   * directory (a rolled-back in-place hand-off). Watch streams end, so their clients watch
   * the new one.
   */
  setEngine(engine: DataEngine): void {
    this.#engine = engine;
    for (const w of [...this.#watchers]) w.end();
  }

  /** Ends watch streams, waits (a bounded time) for calls in flight and stops listening. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      for (const w of [...this.#watchers]) w.end();
      await new Promise<void>((res) => {
        const timer = setTimeout(() => {
          this.#server.forceShutdown();
          res();
        }, GRPC_LIMITS.shutdownGraceMs);
        this.#server.tryShutdown(() => {
          clearTimeout(timer);
          res();
        });
      });
      if (this.#unixPath) await unlink(this.#unixPath).catch(() => undefined);
    })();
    return this.#closing;
  }

  #implementation(de: DataEngine, { replaceProcess, handOffProcess }: DataEngineGrpcServerOptions): UntypedServiceImplementation {
    const features = [
      ...(replaceProcess ? [DATA_ENGINE_FEATURES.successorExec] : []),
      ...(handOffProcess ? [DATA_ENGINE_FEATURES.inPlaceHandOff] : []),
      DATA_ENGINE_FEATURES.salvage,
      DATA_ENGINE_FEATURES.backingFileRead,
    ];
    const unary =
      (body: (req: Msg) => Promise<Msg>) =>
      (call: ServerUnaryCall<Msg, Msg>, callback: sendUnaryData<Msg>): void => {
        const req = call.request as Msg & { [BAD_REQUEST]?: string };
        if (req[BAD_REQUEST] !== undefined) {
          callback(toGrpcError(new MooringError('PROTOCOL_ERROR', `malformed request: ${req[BAD_REQUEST]}`)) as never);
          return;
        }
        // Anything thrown (validation included) becomes a coded gRPC error, never a crash.
        Promise.resolve()
          .then(() => body(req))
          .then(
            (reply) => callback(null, reply),
            (err: unknown) => callback(toGrpcError(err) as never),
          );
      };
    return {
      // An engine exported over TLS cannot be handed to a successor (TLS state cannot move):
      // while one runs, the data engine does not offer the in-place hand-off, and an upgrade
      // in `auto` restarts it instead.
      Info: unary(async () => {
        const tlsExports = (de as { servesTlsExports?: () => boolean }).servesTlsExports?.() === true;
        return infoToMsg({ ...(await de.info()), features: tlsExports ? features.filter((f) => f !== DATA_ENGINE_FEATURES.inPlaceHandOff) : features });
      }),
      CreateReplica: unary(async (r) => {
        const backingImage = replicaBackingImageFromMsg(r.backingImage);
        return hostedToMsg(await de.createReplica(requestString(r, 'name'), r.sizeBytes as number, backingImage ? { backingImage } : {}));
      }),
      DeleteReplica: unary(async (r) => {
        await de.deleteReplica(requestString(r, 'name'));
        return {};
      }),
      GrowReplica: unary(async (r) => hostedToMsg(await de.growReplica(requestString(r, 'name'), requestUint(r, 'sizeBytes')))),
      ListReplicas: unary(async () => ({ replicas: (await de.listReplicas()).map(hostedToMsg) })),
      StartEngine: unary(async (r) => {
        const nbd = requestString(r, 'nbd');
        const io = r.ioTimeoutMs;
        // 0 = none: refused by the data engine unless standby (a client that sends no
        // epoch, e.g. of an older release, must not have the engine pick one).
        const epoch = requestUint(r, 'epoch');
        const info = await de.startEngine({
          volume: requestString(r, 'volume'),
          replicas: (Array.isArray(r.replicas) ? r.replicas : []).map(refFromMsg),
          ...(nbd ? { nbd } : {}),
          ...(typeof io === 'number' && io !== 0 ? { ioTimeoutMs: io } : {}),
          ...(r.standby === true ? { standby: true } : {}),
          ...(r.salvage === true ? { salvage: true } : {}),
          ...(epoch !== 0 ? { epoch } : {}),
          ...(r.hasQuorumHoldMs === true ? { quorumHoldMs: requestUint(r, 'quorumHoldMs') } : {}),
        });
        return engineToMsg(info);
      }),
      StopEngine: unary(async (r) => {
        await de.stopEngine(requestString(r, 'volume'));
        return {};
      }),
      EngineInfo: unary(async (r) => engineToMsg(await de.engineInfo(requestString(r, 'volume')))),
      ListEngines: unary(async () => ({ engines: (await de.listEngines()).map(engineToMsg) })),
      AddReplica: unary(async (r) => {
        if (r.replica === null || typeof r.replica !== 'object') throw new MooringError('INVALID_ARGUMENT', 'replica is required');
        return rebuildResultToMsg(await de.addReplica(requestString(r, 'volume'), refFromMsg(r.replica)));
      }),
      RemoveReplica: unary(async (r) => {
        await de.removeReplica(requestString(r, 'volume'), requestString(r, 'replicaId'), { evenIfRw: r.evenIfRw === true });
        return {};
      }),
      ResizeEngine: unary(async (r) => engineToMsg(await de.resizeEngine(requestString(r, 'volume'), requestUint(r, 'sizeBytes')))),
      DeactivateEngine: unary(async (r) => handOverToMsg(await de.deactivateEngine(requestString(r, 'volume')))),
      ActivateEngine: unary(async (r) => {
        if (r.handOver === null || typeof r.handOver !== 'object') throw new MooringError('INVALID_ARGUMENT', 'handOver is required');
        return engineToMsg(await de.activateEngine(requestString(r, 'volume'), handOverFromMsg(r.handOver), { epoch: requestUint(r, 'epoch') }));
      }),
      Watch: (call: ServerWritableStream<Msg, Msg>) => this.#watch(de, call),
      CreateSnapshot: unary(async (r) =>
        snapshotToMsg(await de.createSnapshot(requestString(r, 'volume'), requestString(r, 'name'), { labels: labelsFromMsg(r.labels) })),
      ),
      ListSnapshots: unary(async (r) => ({ snapshots: (await de.listSnapshots(requestString(r, 'volume'))).map(snapshotToMsg) })),
      DeleteSnapshot: unary(async (r) => {
        await de.deleteSnapshot(requestString(r, 'volume'), requestString(r, 'name'));
        return {};
      }),
      RevertSnapshot: unary(async (r) => {
        await de.revertSnapshot(requestString(r, 'volume'), requestString(r, 'name'));
        return {};
      }),
      ReplaceProcess: unary(async (r) => {
        if (!replaceProcess) throw new MooringError('UNSUPPORTED', 'this data engine was not started with --allow-successor-exec');
        await replaceProcess(checkArgv((r as Msg).argv));
        return {};
      }),
      HandOffProcess: unary(async (r) => {
        if (!handOffProcess) throw new MooringError('UNSUPPORTED', 'this data engine was not started with --allow-successor-exec');
        const argv = checkArgv((r as Msg).argv);
        const raw = (r as Msg).epochs;
        if (!Array.isArray(raw) || raw.length > 100_000) throw new MooringError('INVALID_ARGUMENT', 'epochs must be a list');
        const epochs = new Map<string, HandOffEpochs>();
        for (const e of raw as Msg[]) {
          const volume = requestString(e, 'volume');
          const epoch = requestUint(e, 'epoch');
          const rollbackEpoch = requestUint(e, 'rollbackEpoch');
          if (epoch < 1 || rollbackEpoch <= epoch) throw new MooringError('INVALID_ARGUMENT', `epochs of ${volume}: need 1 <= epoch < rollbackEpoch`);
          epochs.set(volume, { epoch, rollbackEpoch });
        }
        const out = await handOffProcess(argv, epochs);
        return { committed: out.committed, errorCode: out.error?.code ?? '', errorMessage: out.error?.message ?? '', pauseMs: out.pauseMs, engines: out.engines };
      }),
      ExportSnapshot: unary(async (r) =>
        copyResultToMsg(await de.exportSnapshot(requestString(r, 'volume'), requestString(r, 'snapshot'), requestString(r, 'path'))),
      ),
      CopySnapshot: unary(async (r) =>
        copyResultToMsg(await de.copySnapshot(requestString(r, 'volume'), requestString(r, 'snapshot'), requestString(r, 'toVolume'))),
      ),
      ListBackingImageFiles: unary(async () => ({ files: (await de.listBackingImageFiles()).map(fileToMsg) })),
      GetBackingImageFile: unary(async (r) => {
        const f = await de.backingImageFile(fileRefFromMsg(r));
        return f ? { file: fileToMsg(f) } : {};
      }),
      DownloadBackingImageFile: unary(async (r) => {
        const expected = requestString(r, 'expectedChecksum');
        const start = r.startTimeoutMs;
        const info = await de.downloadBackingImageFile(fileRefFromMsg(requestRef(r)), {
          url: requestString(r, 'url'),
          ...(expected ? { expectedChecksum: expected } : {}),
          ...(typeof start === 'number' && start !== 0 ? { startTimeoutMs: start } : {}),
          ...(r.hasRetries === true ? { retries: r.retries as number } : {}),
        });
        return fileToMsg(info);
      }),
      WriteBackingImageFile: (call: ServerReadableStream<Msg, Msg>, callback: sendUnaryData<Msg>) => this.#writeFile(de, call, callback),
      ReadBackingImageFile: (call: ServerWritableStream<Msg, Msg>) => this.#readFile(de, call),
      // Left out for an engine without the call: grpc-js answers UNIMPLEMENTED, as a data
      // engine of an earlier release does, and the controller relays instead.
      ...(de.pullBackingImageFile ? { PullBackingImageFile: unary(async (r) => {
        const expected = requestString(r, 'expectedChecksum');
        const info = await de.pullBackingImageFile!(fileRefFromMsg(requestRef(r)), {
          sizeBytes: r.sizeBytes as number,
          offset: r.offset as number,
          ...(expected ? { expectedChecksum: expected } : {}),
          source: { address: requestString(r, 'sourceAddress'), hostId: requestString(r, 'sourceHostId') },
        });
        return fileToMsg(info);
      }) } : {}),
      ExportSnapshotToBackingImageFile: unary(async (r) => {
        const expected = requestString(r, 'expectedChecksum');
        const info = await de.exportSnapshotToBackingImageFile(requestString(r, 'volume'), requestString(r, 'snapshot'), fileRefFromMsg(requestRef(r)), expected ? { expectedChecksum: expected } : {});
        return fileToMsg(info);
      }),
      CancelBackingImageFile: unary(async (r) => {
        await de.cancelBackingImageFile(fileRefFromMsg(r));
        return {};
      }),
      DeleteBackingImageFile: unary(async (r) => {
        await de.deleteBackingImageFile(fileRefFromMsg(r));
        return {};
      }),
    };
  }

  // Client streaming: the first message names the file and its size, every message carries
  // at most fileDataBytesMax bytes. A client that goes away mid-stream leaves the partial
  // file for a resume.
  #writeFile(de: DataEngine, call: ServerReadableStream<Msg, Msg>, callback: sendUnaryData<Msg>): void {
    let answered = false;
    const answer = (err: unknown, reply?: Msg): void => {
      if (answered) return;
      answered = true;
      if (err) callback(toGrpcError(err) as never);
      else callback(null, reply);
    };
    call.on('cancelled', () => call.destroy(new MooringError('UNAVAILABLE', 'the client cancelled the upload')));
    const messages = call[Symbol.asyncIterator]() as AsyncIterator<Msg & { [BAD_REQUEST]?: string }>;
    const checked = (m: Msg & { [BAD_REQUEST]?: string }): Uint8Array => {
      if (m[BAD_REQUEST] !== undefined) throw new MooringError('PROTOCOL_ERROR', `malformed write message: ${m[BAD_REQUEST]}`);
      const data = m.data;
      if (!(data instanceof Uint8Array)) throw new MooringError('PROTOCOL_ERROR', 'write message without data bytes');
      if (data.length > GRPC_LIMITS.fileDataBytesMax) {
        throw new MooringError('INVALID_ARGUMENT', `a write message carries ${data.length} bytes, at most ${GRPC_LIMITS.fileDataBytesMax}`);
      }
      return data;
    };
    (async () => {
      const first = await messages.next();
      if (first.done) throw new MooringError('INVALID_ARGUMENT', 'an upload needs a first message with the ref and size');
      const head = first.value;
      const firstData = checked(head);
      const expected = requestString(head, 'expectedChecksum');
      async function* data(): AsyncGenerator<Uint8Array> {
        if (firstData.length > 0) yield firstData;
        for (;;) {
          const n = await messages.next();
          if (n.done) return;
          const d = checked(n.value);
          if (d.length > 0) yield d;
        }
      }
      const info = await de.writeBackingImageFile(
        fileRefFromMsg(requestRef(head)),
        { sizeBytes: head.sizeBytes as number, offset: head.offset as number, ...(expected ? { expectedChecksum: expected } : {}) },
        data(),
      );
      return fileToMsg(info);
    })().then(
      (reply) => answer(undefined, reply),
      (err: unknown) => answer(err),
    );
  }

  // Server streaming of a ready file; a client that goes away stops the read (freeing its
  // place among the file's readers).
  #readFile(de: DataEngine, call: ServerWritableStream<Msg, Msg>): void {
    const req = call.request as Msg & { [BAD_REQUEST]?: string };
    const fail = (err: unknown): void => void call.emit('error', toGrpcError(err));
    if (req[BAD_REQUEST] !== undefined) {
      fail(new MooringError('PROTOCOL_ERROR', `malformed request: ${req[BAD_REQUEST]}`));
      return;
    }
    let cancelled = false;
    let wake: (() => void) | undefined;
    call.on('cancelled', () => {
      cancelled = true;
      wake?.();
    });
    call.on('drain', () => wake?.());
    (async () => {
      const it = de.readBackingImageFile(fileRefFromMsg(requestRef(req)), { offset: req.offset as number })[Symbol.asyncIterator]();
      try {
        for (;;) {
          if (cancelled) return;
          const n = await it.next();
          if (n.done) break;
          if (!call.write({ data: n.value })) {
            // Bounded memory: wait for the client to take what was sent.
            await new Promise<void>((res) => {
              wake = res;
            });
            wake = undefined;
          }
        }
        call.end();
      } finally {
        await it.return?.();
      }
    })().catch((err: unknown) => {
      if (!cancelled) fail(err);
    });
  }

  #watch(de: DataEngine, call: ServerWritableStream<Msg, Msg>): void {
    const fail = (err: MooringError): void => {
      call.emit('error', toGrpcError(err));
    };
    if ((call.request as { [BAD_REQUEST]?: string })[BAD_REQUEST] !== undefined) {
      fail(new MooringError('PROTOCOL_ERROR', 'malformed watch request'));
      return;
    }
    if (this.#closing) {
      fail(new MooringError('CLOSED', 'the data engine server is shutting down'));
      return;
    }
    if (this.#watchers.size >= GRPC_LIMITS.watchStreamsMax) {
      fail(new MooringError('BUSY', `${GRPC_LIMITS.watchStreamsMax} watch streams are open already`));
      return;
    }
    let queued = 0;
    let unsubscribe: (() => void) | undefined;
    const entry = {
      end: () => {
        stop();
        call.end();
      },
    };
    const stop = (): void => {
      unsubscribe?.();
      unsubscribe = undefined;
      this.#watchers.delete(entry);
    };
    this.#watchers.add(entry);
    try {
      unsubscribe = de.watch((event) => {
        if (queued >= GRPC_LIMITS.watchQueuedEventsMax) {
          stop();
          fail(new MooringError('BUSY', `watcher fell ${queued} events behind; reconnect`));
          return;
        }
        if (!call.write(eventToMsg(event))) queued++;
      });
    } catch (err) {
      stop();
      fail(toMooringError(err));
      return;
    }
    call.on('drain', () => (queued = 0));
    call.on('cancelled', stop);
    call.on('close', stop);
    call.on('error', stop);
  }
}

// A request's `ref` message (proto3 leaves an unset message null).
function requestRef(m: Msg): Msg {
  if (typeof m.ref !== 'object' || m.ref === null) throw new MooringError('INVALID_ARGUMENT', 'ref {name, uuid} is required');
  return m.ref as Msg;
}

// The service with request decoding that never throws: a request that does not decode is
// handed to the handler marked, so it gets a coded error like any other bad input.
function guardedService(): ServiceDefinition {
  const def = dataEnginePackageDefinition()[DATA_ENGINE_SERVICE] as unknown as Record<string, MethodDefinition<Msg, Msg>>;
  const out: Record<string, MethodDefinition<Msg, Msg>> = {};
  for (const [name, m] of Object.entries(def)) {
    out[name] = {
      ...m,
      requestDeserialize: (buf: Buffer): Msg => {
        try {
          return m.requestDeserialize(buf);
        } catch (err) {
          return { [BAD_REQUEST]: (err as Error).message ?? 'undecodable' } as Msg;
        }
      },
    };
  }
  return out as ServiceDefinition;
}

// Every method behind a check of the cluster secret's token, before the method runs: a call
// without it, or with another, is answered UNAUTHENTICATED (and a streaming one ended).
function authenticated(impl: UntypedServiceImplementation, token: string): UntypedServiceImplementation {
  const out: UntypedServiceImplementation = {};
  for (const [name, handler] of Object.entries(impl)) {
    const h = handler as (call: { metadata: Metadata; emit: (e: string, v: unknown) => void }, callback?: sendUnaryData<Msg>) => void;
    out[name] = ((call: { metadata: Metadata; emit: (e: string, v: unknown) => void }, callback?: sendUnaryData<Msg>): void => {
      if (grpcAuthTokenMatches(token, call.metadata.get(GRPC_AUTH_METADATA_KEY)[0])) {
        h(call, callback);
        return;
      }
      const err = { ...toGrpcError(new MooringError('UNAUTHENTICATED', `${name}: this data engine requires the cluster secret (a missing or wrong ${GRPC_AUTH_METADATA_KEY} token)`)), code: GrpcStatus.UNAUTHENTICATED };
      if (callback) callback(err as never);
      else call.emit('error', err);
    }) as never;
  }
  return out;
}

// grpc-js cannot bind over a socket file left by a killed server (EADDRINUSE). Remove it,
// but only if it is a socket nobody listens on: a live server's socket is ADDRESS_IN_USE.
async function removeStaleSocket(path: string): Promise<void> {
  let st;
  try {
    st = await lstat(path);
  } catch {
    return;
  }
  if (!st.isSocket()) throw new MooringError('ADDRESS_IN_USE', `${path} exists and is not a socket`, { details: { path } });
  const live = await new Promise<boolean>((res) => {
    const s = connect(path);
    s.once('connect', () => {
      s.destroy();
      res(true);
    });
    s.once('error', () => res(false));
  });
  if (live) throw new MooringError('ADDRESS_IN_USE', `a server listens on ${path} already`, { details: { path } });
  await unlink(path).catch((err: unknown) => Promise.reject(toMooringError(err, `removing stale socket ${path}`)));
}

// A successor's command line as a request carries it.
function checkArgv(argv: unknown): string[] {
  if (!Array.isArray(argv) || argv.length === 0 || argv.length > 64 || argv.some((a) => typeof a !== 'string' || a === '' || a.length > 4096 || a.includes('\0'))) {
    throw new MooringError('INVALID_ARGUMENT', 'argv must be 1 to 64 non-empty strings');
  }
  return argv as string[];
}
