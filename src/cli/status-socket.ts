/**
 * The status socket of `mooring serve`: a unix socket in its --dir where the serving
 * process answers one question, "status", with one JSON line (the live volume's status and
 * snapshots). `mooring info` asks it while the directory is open in a server, whose store
 * lock keeps info from reading the directory itself. The socket is
 * owner-only (0600); every connection is bounded in time and bytes.
 *
 * @packageDocumentation
 */
import { chmod, rm } from 'node:fs/promises';
import { connect, createServer, type Server, type Socket } from 'node:net';

import { MooringError, MooringErrorCode, toMooringError } from '../errors.js';

/** File name of the status socket inside serve's --dir. */
export const STATUS_SOCKET_FILE = 'status.sock';
/** The one request. */
const REQUEST = 'status';
/** Longest request line read (anything longer is dropped). */
const REQUEST_BYTES_MAX = 64;
/** Longest reply read by a client (a status with many snapshots stays far below). */
const REPLY_BYTES_MAX = 4 * 1024 * 1024;
/** A connection that has not finished by then is dropped (both sides). */
const CONNECTION_TIMEOUT_MS = 5000;
/** Connections served at once; beyond it the oldest silent one is dropped. */
const CONNECTIONS_MAX = 8;
/** Longest unix socket path (sun_path, with its terminating NUL). */
const SOCKET_PATH_BYTES_MAX = 107;

/** What a status socket answers: who serves, and the status its provider gave. */
export interface StatusReply {
  pid: number;
  status: unknown;
}

/** A listening status socket. */
export interface StatusServer {
  readonly path: string;
  /** Stops answering and removes the socket file. Idempotent. */
  close(): Promise<void>;
}

/**
 * Listens on `path` and answers `status` with `provide()`. A stale socket file left by a
 * crashed server is replaced (the caller holds the directory's store lock, so no live server owns it).
 *
 * @throws MooringError INVALID_ARGUMENT (path too long for a unix socket), ADDRESS_IN_USE, IO_ERROR
 */
export async function serveStatus(path: string, provide: () => Promise<unknown>): Promise<StatusServer> {
  if (Buffer.byteLength(path) > SOCKET_PATH_BYTES_MAX) throw new MooringError('INVALID_ARGUMENT', `status socket path ${path} is longer than ${SOCKET_PATH_BYTES_MAX} bytes`);
  await rm(path, { force: true });
  // Connections in the order they came; `idle` ones have not sent a whole request yet.
  const open = new Set<Socket>();
  const idle = new Set<Socket>();
  const server: Server = createServer((sock) => {
    if (open.size >= CONNECTIONS_MAX) {
      // Full: the oldest connection still silent makes room, so clients that hold
      // connections open without asking cannot lock out the next honest one.
      const oldest = idle.values().next().value;
      if (oldest === undefined) {
        sock.destroy();
        return;
      }
      oldest.destroy();
      open.delete(oldest);
      idle.delete(oldest);
    }
    open.add(sock);
    idle.add(sock);
    sock.on('close', () => {
      open.delete(sock);
      idle.delete(sock);
    });
    sock.on('error', () => undefined);
    sock.setTimeout(CONNECTION_TIMEOUT_MS, () => sock.destroy());
    let line = '';
    let asked = false;
    const answer = (reply: object): void => {
      sock.end(`${JSON.stringify(reply)}\n`);
    };
    sock.on('data', (d: Buffer) => {
      if (asked) return; // one request per connection; the rest is ignored
      line += d.toString('latin1');
      const nl = line.indexOf('\n');
      if (nl < 0) {
        if (line.length > REQUEST_BYTES_MAX) sock.destroy();
        return;
      }
      const request = line.slice(0, nl);
      asked = true;
      idle.delete(sock);
      if (request !== REQUEST) {
        answer({ error: { code: 'PROTOCOL_ERROR', message: `unknown request (the only one is "${REQUEST}")` } });
        return;
      }
      provide().then(
        (status) => answer({ pid: process.pid, status }),
        (err: unknown) => {
          const e = toMooringError(err);
          answer({ error: { code: e.code, message: e.message } });
        },
      );
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err) => reject(toMooringError(err, `listening on ${path}`)));
    server.listen(path, () => resolve());
  });
  await chmod(path, 0o600).catch(() => undefined);
  let closing: Promise<void> | null = null;
  return {
    path,
    close: () =>
      (closing ??= (async () => {
        for (const s of open) s.destroy();
        await new Promise<void>((resolve) => server.close(() => resolve()));
        await rm(path, { force: true }).catch(() => undefined);
      })()),
  };
}

/**
 * Asks the status socket at `path`. Null when nothing listens there (no file, or a stale
 * one); the serving process's error as a MooringError when it could not tell.
 *
 * @throws MooringError UNAVAILABLE (no answer in time), PROTOCOL_ERROR (an answer that is not one), the server's code
 */
export async function queryStatus(path: string, timeoutMs = CONNECTION_TIMEOUT_MS): Promise<StatusReply | null> {
  const text = await new Promise<string | null>((resolve, reject) => {
    const sock = connect(path);
    let got = '';
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new MooringError('UNAVAILABLE', `${path} did not answer within ${timeoutMs} ms`));
    }, timeoutMs);
    sock.on('connect', () => sock.write(`${REQUEST}\n`));
    sock.on('data', (d: Buffer) => {
      got += d.toString('utf8');
      if (got.length > REPLY_BYTES_MAX) {
        sock.destroy();
        clearTimeout(timer);
        reject(new MooringError('PROTOCOL_ERROR', `${path} sent more than ${REPLY_BYTES_MAX} bytes`));
      }
    });
    sock.on('end', () => {
      clearTimeout(timer);
      resolve(got);
    });
    sock.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      if (err.code === 'ENOENT' || err.code === 'ECONNREFUSED') resolve(null);
      else reject(toMooringError(err, `asking ${path}`));
    });
  });
  if (text === null) return null;
  let reply: { pid?: unknown; status?: unknown; error?: { code?: unknown; message?: unknown } };
  try {
    reply = JSON.parse(text) as typeof reply;
  } catch {
    throw new MooringError('PROTOCOL_ERROR', `${path} answered something that is not JSON`);
  }
  if (reply.error) {
    const code = typeof reply.error.code === 'string' && reply.error.code in MooringErrorCode ? (reply.error.code as MooringErrorCode) : 'PROTOCOL_ERROR';
    throw new MooringError(code, `the serving process: ${String(reply.error.message)}`);
  }
  if (typeof reply.pid !== 'number' || typeof reply.status !== 'object' || reply.status === null) throw new MooringError('PROTOCOL_ERROR', `${path} answered without a status`);
  return { pid: reply.pid, status: reply.status };
}
