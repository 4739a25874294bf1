/**
 * The HTTP endpoint of `--metrics tcp:HOST:PORT` (`mooring serve`, `mooring data-engine`):
 * `GET /metrics` answers a registry's Prometheus text, anything else 404 (405 for another
 * method). Loopback only unless allowed: metrics name volumes and hosts, and there is no TLS.
 *
 * @packageDocumentation
 */
import { createServer, type Server } from 'node:http';

import type { Registry } from 'prom-client';

import { isLoopbackHost, parseTcpAddress, formatTcpAddress } from '../data-engine/addresses.js';
import { MooringError, toMooringError } from '../errors.js';

/** A running metrics endpoint. */
export interface MetricsServer {
  /** Where it listens, as `tcp:HOST:PORT` with the bound port. */
  readonly address: string;
  /** Stops listening and ends open connections. */
  close(): Promise<void>;
}

/**
 * Checks a `--metrics` address: `tcp:HOST:PORT` (port 0: ephemeral), HOST loopback unless
 * `allowRemote`.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function parseMetricsAddress(text: string, allowRemote: boolean): { host: string; port: number } {
  let a: { host: string; port: number };
  try {
    a = parseTcpAddress(text, '--metrics', true);
  } catch (err) {
    throw new MooringError('INVALID_ARGUMENT', `--metrics must be tcp:HOST:PORT, port 0..65535 (got ${JSON.stringify(text)})`, { cause: err });
  }
  if (!allowRemote && !isLoopbackHost(a.host)) {
    throw new MooringError('INVALID_ARGUMENT', `--metrics ${a.host} is not a loopback address: metrics are served without TLS; give --metrics-allow-remote to serve them beyond this host`);
  }
  return a;
}

/**
 * Serves `registry` at `GET /metrics` on `host:port`.
 *
 * @throws MooringError UNAVAILABLE (the address cannot be bound)
 */
export async function serveMetrics(registry: Registry, address: { host: string; port: number }): Promise<MetricsServer> {
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0];
    if (path !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: metrics are at /metrics\n');
      return;
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('GET only\n');
      return;
    }
    registry.metrics().then(
      (text) => {
        res.writeHead(200, { 'content-type': registry.contentType });
        res.end(req.method === 'HEAD' ? undefined : text);
      },
      (err: unknown) => {
        res.writeHead(500, { 'content-type': 'text/plain' }).end(`${toMooringError(err).message}\n`);
      },
    );
  });
  server.headersTimeout = 10_000;
  server.requestTimeout = 30_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err) => reject(new MooringError('UNAVAILABLE', `--metrics: cannot listen on ${formatTcpAddress(address)}: ${err.message}`, { cause: err })));
    server.listen(address.port, address.host, () => resolve());
  });
  const bound = server.address();
  const port = typeof bound === 'object' && bound ? bound.port : address.port;
  return {
    address: formatTcpAddress({ host: address.host, port }),
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
