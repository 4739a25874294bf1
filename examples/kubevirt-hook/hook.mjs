#!/usr/bin/env node
// A KubeVirt hook sidecar pointing a VMI's disks at Mooring NBD exports. virt-launcher finds
// this gRPC server's unix socket in its hooks directory, asks Info what it serves, and calls
// OnDefineDomain with the domain XML and the VMI before it defines the domain; rewrite.mjs
// does the rewriting, this file is the gRPC shell around it. README.md has the whole story.
//
//   node hook.mjs --socket /var/run/kubevirt-hooks/mooring.sock [--socket-path-template T]
//                 [--reconnect-delay-s N] [--wait-for-socket-ms N] [--priority N]
import { lstatSync, unlinkSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { DEFAULT_RECONNECT_DELAY_S, DEFAULT_SOCKET_PATH_TEMPLATE, HookError, VOLUMES_ANNOTATION, checkOptions, planVolumes, rewriteDomain } from './rewrite.mjs';

const HOOK_NAME = 'mooring';
// Every Callbacks version KubeVirt knows; it picks the newest (pkg/hooks/manager.go).
const VERSIONS = ['v1alpha1', 'v1alpha2', 'v1alpha3'];
const PROTO_DIR = join(dirname(fileURLToPath(import.meta.url)), 'proto');
const PROTO_FILES = ['api_info.proto', ...VERSIONS.map((v) => `api_${v}.proto`)];
const SOCKET_POLL_MS = 100;
// KubeVirt gives OnDefineDomain one minute (pkg/hooks/manager.go): a wait must end before.
const WAIT_FOR_SOCKET_MS_MAX = 50_000;
const SHUTDOWN_GRACE_MS = 5_000;

const USAGE = `usage: node hook.mjs [options]
  --socket PATH                 where to listen (default /var/run/kubevirt-hooks/mooring.sock)
  --socket-path-template PATH   a volume's NBD socket, {volume} replaced (default ${DEFAULT_SOCKET_PATH_TEMPLATE})
  --reconnect-delay-s N         QEMU's NBD reconnect-delay, 0 for none (default ${DEFAULT_RECONNECT_DELAY_S})
  --wait-for-socket-ms N        wait up to N ms (at most ${WAIT_FOR_SOCKET_MS_MAX}) for every socket to exist (default 0: don't)
  --priority N                  the OnDefineDomain priority KubeVirt orders hooks by, higher first (default 0)`;

const log = (message) => process.stderr.write(`${new Date().toISOString()} mooring-hook: ${message}\n`);

function fail(message) {
  process.stderr.write(`mooring-hook: ${message}\n${USAGE}\n`);
  process.exit(2);
}

function integerArg(name, value, min, max) {
  const n = Number(value);
  if (!/^-?\d+$/.test(value) || n < min || n > max) fail(`--${name} must be an integer from ${min} to ${max} (got ${JSON.stringify(value)})`);
  return n;
}

function readOptions() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        socket: { type: 'string', default: '/var/run/kubevirt-hooks/mooring.sock' },
        'socket-path-template': { type: 'string', default: DEFAULT_SOCKET_PATH_TEMPLATE },
        'reconnect-delay-s': { type: 'string', default: String(DEFAULT_RECONNECT_DELAY_S) },
        'wait-for-socket-ms': { type: 'string', default: '0' },
        priority: { type: 'string', default: '0' },
        help: { type: 'boolean', default: false },
      },
    }));
  } catch (err) {
    fail(err.message);
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const opts = {
    socket: values.socket,
    waitForSocketMs: integerArg('wait-for-socket-ms', values['wait-for-socket-ms'], 0, WAIT_FOR_SOCKET_MS_MAX),
    priority: integerArg('priority', values.priority, -(2 ** 31), 2 ** 31 - 1),
  };
  try {
    return { ...opts, ...checkOptions({ socketPathTemplate: values['socket-path-template'], reconnectDelayS: integerArg('reconnect-delay-s', values['reconnect-delay-s'], 0, Number.MAX_SAFE_INTEGER) }) };
  } catch (err) {
    return fail(err.message);
  }
}

async function isSocket(path) {
  try {
    return (await stat(path)).isSocket();
  } catch {
    return false;
  }
}

// Mooring attaches the volume on this host before or while KubeVirt starts the VM; waiting
// here turns "QEMU could not connect" into a clear refusal naming the missing socket.
async function waitForSockets(disks, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (const d of disks) {
    while (!(await isSocket(d.socket))) {
      if (Date.now() >= deadline) throw new HookError('FAILED_PRECONDITION', `no NBD socket ${d.socket} for volume ${d.volume} (VMI disk ${d.disk}) after ${timeoutMs} ms: is the volume attached on this host?`);
      await sleep(SOCKET_POLL_MS);
    }
  }
}

// A unary handler that logs one line per call and answers a HookError with its status.
function unary(name, handle) {
  return (call, callback) => {
    const started = Date.now();
    handle(call.request).then(
      ({ reply, note }) => {
        log(`${name}: ${note} (${Date.now() - started} ms)`);
        callback(null, reply);
      },
      (err) => {
        const code = err instanceof HookError ? grpc.status[err.code] : grpc.status.INTERNAL;
        log(`${name}: ${grpc.status[code]}: ${err.message} (${Date.now() - started} ms)`);
        callback({ code, details: err.message });
      },
    );
  };
}

function callbacks(version, opts) {
  const onDefineDomain = unary(`OnDefineDomain ${version}`, async (req) => {
    const vmiJson = req.vmi.toString('utf8');
    const plan = planVolumes(vmiJson, opts);
    if (plan.disks.length === 0) return { reply: { domainXML: req.domainXML }, note: `${plan.vmi}: no ${VOLUMES_ANNOTATION} annotation, domain unchanged` };
    const domainXML = Buffer.from(rewriteDomain(req.domainXML.toString('utf8'), vmiJson, opts));
    if (opts.waitForSocketMs > 0) await waitForSockets(plan.disks, opts.waitForSocketMs);
    return { reply: { domainXML }, note: `${plan.vmi}: ${plan.disks.map((d) => `${d.disk} -> ${d.volume} on ${d.socket}`).join(', ')}` };
  });
  const handlers = { OnDefineDomain: onDefineDomain };
  if (version !== 'v1alpha1') {
    // Not subscribed in Info, so KubeVirt does not call it; served because the version has it.
    handlers.PreCloudInitIso = unary(`PreCloudInitIso ${version}`, async (req) => ({
      reply: { cloudInitNoCloudSource: req.cloudInitNoCloudSource, cloudInitData: req.cloudInitData },
      note: 'passed through',
    }));
  }
  if (version === 'v1alpha3') handlers.Shutdown = unary(`Shutdown ${version}`, async () => ({ reply: {}, note: 'nothing to do' }));
  return handlers;
}

// A socket left by a killed predecessor would make bind fail with EADDRINUSE.
function removeStaleSocket(path) {
  let st;
  try {
    st = lstatSync(path);
  } catch (err) {
    if (err.code === 'ENOENT') return;
    throw err;
  }
  if (!st.isSocket()) fail(`${path} exists and is not a socket: not removing it`);
  unlinkSync(path);
}

function main() {
  const opts = readOptions();
  const definition = protoLoader.loadSync(PROTO_FILES, { includeDirs: [PROTO_DIR], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
  const hooks = grpc.loadPackageDefinition(definition).kubevirt.hooks;
  const server = new grpc.Server();
  server.addService(hooks.info.Info.service, {
    Info: unary('Info', async () => ({
      reply: { name: HOOK_NAME, hookPoints: [{ name: 'OnDefineDomain', priority: opts.priority }], versions: VERSIONS },
      note: `${HOOK_NAME}, OnDefineDomain priority ${opts.priority}, ${VERSIONS.join(' ')}`,
    })),
  });
  for (const v of VERSIONS) server.addService(hooks[v].Callbacks.service, callbacks(v, opts));

  removeStaleSocket(opts.socket);
  server.bindAsync(`unix:${opts.socket}`, grpc.ServerCredentials.createInsecure(), (err) => {
    if (err) {
      log(`cannot listen on ${opts.socket}: ${err.message}`);
      process.exit(1);
    }
    log(`listening on ${opts.socket}: sockets ${opts.socketPathTemplate}, reconnect delay ${opts.reconnectDelayS} s, wait for sockets ${opts.waitForSocketMs} ms`);
  });

  let stopping = false;
  const stop = (signal) => {
    if (stopping) return;
    stopping = true;
    const exit = () => {
      try {
        unlinkSync(opts.socket);
      } catch {
        // Already gone.
      }
      log(`${signal}: stopped`);
      process.exit(0);
    };
    // Calls in flight finish (virt-launcher is waiting on them); a stuck one is cut off.
    const force = setTimeout(() => {
      server.forceShutdown();
      exit();
    }, SHUTDOWN_GRACE_MS);
    server.tryShutdown(() => {
      clearTimeout(force);
      exit();
    });
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}

main();
