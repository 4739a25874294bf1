/**
 * NBD listen addresses (`unix:PATH`, `tcp:HOST:PORT`) and the URIs clients use
 * (`nbd+unix:///?socket=PATH`, `nbd://HOST:PORT/`, the NBD URI standard that nbdinfo,
 * qemu and fio accept).
 */
import { isAbsolute, resolve } from 'node:path';
import { isIP } from 'node:net';

import { MooringError } from '../errors.js';
import { EXPORT_NAME_LENGTH_MAX, UNIX_SOCKET_PATH_BYTES_MAX } from '../util/limits.js';
import { describe } from '../util/validate.js';

/** Where an NBD export listens. */
export type NbdAddress =
  | {
      /** A unix domain socket (the default; only local clients). */
      kind: 'unix';
      /** Absolute path of the socket file. */
      path: string;
    }
  | {
      /** TCP. */
      kind: 'tcp';
      /** Host or IP to bind (IPv6 without brackets). Use 127.0.0.1 unless remote clients must reach it. */
      host: string;
      /** Port; 0 asks for an ephemeral port (see {@link NbdExport.address} for the bound one). */
      port: number;
    };

// A DNS name: labels of letters, digits and '-', dot separated.
const HOSTNAME_PATTERN = /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

function bad(text: unknown, why: string): MooringError {
  return new MooringError(
    'INVALID_ARGUMENT',
    `invalid NBD address ${describe(text)}: ${why} (expected unix:PATH or tcp:HOST:PORT)`,
    { details: { address: text } },
  );
}

/**
 * Parses `unix:PATH` (relative paths resolve against `cwd`) or `tcp:HOST:PORT` (IPv6 as
 * `tcp:[::1]:PORT`; PORT 0 = ephemeral).
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function parseNbdAddress(text: string, cwd: string = process.cwd()): NbdAddress {
  if (typeof text !== 'string') throw bad(text, 'not a string');
  if (text.startsWith('unix:')) {
    const raw = text.slice('unix:'.length);
    if (raw.length === 0) throw bad(text, 'empty socket path');
    if (raw.includes('\0')) throw bad(text, 'NUL in socket path');
    const path = isAbsolute(raw) ? resolve(raw) : resolve(cwd, raw);
    if (raw.endsWith('/') || Buffer.byteLength(path) > UNIX_SOCKET_PATH_BYTES_MAX) {
      throw bad(text, `socket path must name a file and be at most ${UNIX_SOCKET_PATH_BYTES_MAX} bytes once absolute (${path})`);
    }
    return { kind: 'unix', path };
  }
  if (text.startsWith('tcp:')) {
    const rest = text.slice('tcp:'.length);
    let host: string;
    let portText: string;
    if (rest.startsWith('[')) {
      const close = rest.indexOf(']');
      if (close < 0 || rest[close + 1] !== ':') throw bad(text, 'IPv6 hosts are written [ADDR]:PORT');
      host = rest.slice(1, close);
      portText = rest.slice(close + 2);
      if (isIP(host) !== 6) throw bad(text, `${describe(host)} is not an IPv6 address`);
    } else {
      const colon = rest.lastIndexOf(':');
      if (colon <= 0) throw bad(text, 'missing host or port');
      host = rest.slice(0, colon);
      portText = rest.slice(colon + 1);
      if (isIP(host) !== 4 && !HOSTNAME_PATTERN.test(host)) throw bad(text, `${describe(host)} is not a host name or IPv4 address`);
    }
    if (!/^\d{1,5}$/.test(portText) || Number(portText) > 65535) throw bad(text, 'port must be 0..65535');
    return { kind: 'tcp', host, port: Number(portText) };
  }
  throw bad(text, 'unknown scheme');
}

/** The `unix:PATH` / `tcp:HOST:PORT` form of an address (inverse of {@link parseNbdAddress}). */
export function formatNbdAddress(address: NbdAddress): string {
  if (address.kind === 'unix') return `unix:${address.path}`;
  return `tcp:${isIP(address.host) === 6 ? `[${address.host}]` : address.host}:${address.port}`;
}

/**
 * Checks an NBD export name: at most 255 printable ASCII characters ('' is the default
 * export that clients get when they name none).
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function checkExportName(name: unknown): string {
  if (typeof name !== 'string' || name.length > EXPORT_NAME_LENGTH_MAX || !/^[\x21-\x7e]*$/.test(name)) {
    throw new MooringError(
      'INVALID_ARGUMENT',
      `export name must be at most ${EXPORT_NAME_LENGTH_MAX} printable ASCII characters without spaces (got ${describe(name)})`,
    );
  }
  return name;
}

// RFC 3986 path segment encoding, keeping '/' out of the name's meaning.
function encodeName(name: string): string {
  return encodeURIComponent(name);
}

/**
 * The NBD URI a client uses to reach `address` (and `exportName`, default ''):
 * `nbd+unix:///NAME?socket=PATH` or `nbd://HOST:PORT/NAME`.
 */
export function nbdUri(address: NbdAddress, exportName = '', tls = false): string {
  const s = tls ? 's' : '';
  const name = encodeName(exportName);
  if (address.kind === 'unix') {
    // The socket path is a query parameter; keep '/' readable, escape the rest.
    const socket = address.path
      .split('/')
      .map((seg) => encodeURIComponent(seg))
      .join('/');
    return `nbd${s}+unix:///${name}?socket=${socket}`;
  }
  const host = isIP(address.host) === 6 ? `[${address.host}]` : address.host;
  return `nbd${s}://${host}:${address.port}/${name}`;
}
