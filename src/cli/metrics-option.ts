// `--metrics tcp:HOST:PORT` of `mooring serve` and `mooring data-engine`: a Prometheus
// endpoint (GET /metrics) over the command's registry, closed on shutdown (docs/metrics.md).
import type { Registry } from 'prom-client';

import { isMooringError, toMooringError } from '../errors.js';
import { parseMetricsAddress, serveMetrics, type MetricsServer } from '../metrics/metrics-server.js';
import { UsageError, type CliContext } from './common.js';
import { logOf } from './log.js';

/** parseArgs options of the flag. */
export const METRICS_OPTIONS = {
  metrics: { type: 'string' },
  'metrics-allow-remote': { type: 'boolean' },
} as const;

/** Help lines of the flag (aligned at `column`). */
export function metricsHelp(column: number): string {
  const pad = (s: string): string => `  ${s.padEnd(Math.max(column - 2, s.length + 2))}`;
  const more = ' '.repeat(column);
  return (
    `${pad('--metrics ADDRESS')}serve Prometheus metrics at http://HOST:PORT/metrics\n` +
    `${more}(ADDRESS tcp:HOST:PORT, port 0 = any; loopback only: plain HTTP)\n` +
    `${pad('--metrics-allow-remote')}allow a non-loopback --metrics address (no TLS, no auth)\n`
  );
}

/** The checked `--metrics` address, or null without the flag. @throws UsageError */
export function parseMetricsOption(command: string, values: { metrics?: string; 'metrics-allow-remote'?: boolean }): { host: string; port: number } | null {
  if (values.metrics === undefined) {
    if (values['metrics-allow-remote'] === true) throw new UsageError(command, '--metrics-allow-remote needs --metrics ADDRESS');
    return null;
  }
  try {
    return parseMetricsAddress(values.metrics, values['metrics-allow-remote'] === true);
  } catch (err) {
    if (isMooringError(err)) throw new UsageError(command, err.message);
    throw err;
  }
}

/** Starts the endpoint and logs where. @throws MooringError UNAVAILABLE */
export async function startMetricsServer(registry: Registry, address: { host: string; port: number }, ctx: CliContext): Promise<MetricsServer> {
  const server = await serveMetrics(registry, address);
  logOf(ctx).info({ metrics: server.address }, `metrics at http://${server.address.slice('tcp:'.length)}/metrics`);
  return server;
}

/** Closes the endpoint; a failure is only reported. */
export async function closeMetricsServer(server: MetricsServer | null, ctx: CliContext): Promise<void> {
  if (!server) return;
  await server.close().catch((err: unknown) => {
    const e = toMooringError(err);
    logOf(ctx).warn({ code: e.code }, `closing the metrics endpoint: ${e.message}`);
  });
}
