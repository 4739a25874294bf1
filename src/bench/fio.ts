/**
 * Running fio and reading its JSON output.
 */
import { BenchError, type ProcessTracker } from './processes.js';
import type { Endpoint } from './targets.js';
import type { Workload } from './workloads.js';

/** The figures the report uses from one fio run (group-reported: all jobs summed). */
export interface FioFigures {
  iops: number;
  mibPerSec: number;
  /** Completion-latency percentiles, microseconds. */
  clatP50Us: number;
  clatP99Us: number;
  clatMeanUs: number;
  /** Bytes transferred in the measured window. */
  ioBytes: number;
}

/** fio's own wall-clock limit is the job runtime; this catches a hung server. */
const FIO_SLACK_SEC = 60;

function endpointArgs(endpoint: Endpoint): string[] {
  if (endpoint.kind === 'nbd') return ['--ioengine=nbd', `--uri=${endpoint.uri}`];
  return ['--ioengine=io_uring', `--filename=${endpoint.path}`, `--direct=${endpoint.direct ? 1 : 0}`];
}

/** A fio invocation: the endpoint plus job options, always with JSON output. */
export interface FioJob {
  name: string;
  endpoint: Endpoint;
  /** Job options without the leading '--' (e.g. 'rw=randread'). */
  options: string[];
  /** Upper bound on the run, seconds, before the slack. */
  expectedSec: number;
}

export function workloadJob(w: Workload, endpoint: Endpoint, areaBytes: number, runtimeSec: number, rampSec: number): FioJob {
  const options = [
    `rw=${w.rw}`,
    `bs=${w.blockBytes}`,
    `iodepth=${w.iodepth}`,
    `numjobs=${w.numjobs}`,
    `size=${areaBytes}`,
    'time_based=1',
    `runtime=${runtimeSec}`,
    'group_reporting=1',
  ];
  if (rampSec > 0) options.push(`ramp_time=${rampSec}`);
  if (w.rw === 'randread' || w.rw === 'randwrite') {
    // No random map: fio's bookkeeping would otherwise cost client CPU the servers compete for.
    options.push('norandommap=1', 'randrepeat=0');
  }
  return { name: w.id, endpoint, options, expectedSec: runtimeSec + rampSec };
}

/** Writes the whole area once (1 MiB sequential) so later reads hit data, not holes. */
export function prewriteJob(endpoint: Endpoint, areaBytes: number): FioJob {
  return {
    name: 'prewrite',
    endpoint,
    options: ['rw=write', 'bs=1M', 'iodepth=8', 'numjobs=1', `size=${areaBytes}`],
    expectedSec: 600,
  };
}

/** 10,000 scattered 4 KiB writes over `sizeBytes` (the RSS measurement). */
export function scatteredWritesJob(endpoint: Endpoint, sizeBytes: number, count: number): FioJob {
  return {
    name: 'scattered-writes',
    endpoint,
    options: [
      'rw=randwrite',
      'bs=4k',
      'iodepth=16',
      'numjobs=1',
      `size=${sizeBytes}`,
      `number_ios=${count}`,
      'norandommap=1',
      'randrepeat=0',
    ],
    expectedSec: 300,
  };
}

interface FioDirStats {
  io_bytes: number;
  bw_bytes: number;
  iops: number;
  clat_ns?: { mean?: number; percentile?: Record<string, number> };
}

interface FioJson {
  jobs?: Array<{ jobname?: string; error?: number; read?: FioDirStats; write?: FioDirStats }>;
}

/** Parses fio JSON output; the nbd engine prints a line before it, so start at the first '{'. */
export function parseFioJson(stdout: string, direction: 'read' | 'write'): FioFigures {
  const start = stdout.indexOf('{');
  const end = stdout.lastIndexOf('}');
  if (start < 0 || end < start) throw new BenchError('BENCH_FIO_FAILED', `fio printed no JSON: ${stdout.slice(0, 500)}`);
  let json: FioJson;
  try {
    json = JSON.parse(stdout.slice(start, end + 1)) as FioJson;
  } catch (err) {
    throw new BenchError('BENCH_FIO_FAILED', `fio printed malformed JSON: ${String(err)}`);
  }
  const job = json.jobs?.[0];
  const stats = job?.[direction];
  if (!job || !stats) throw new BenchError('BENCH_FIO_FAILED', 'fio JSON has no job results');
  if (job.error) throw new BenchError('BENCH_FIO_FAILED', `fio job ${job.jobname ?? ''} failed with error ${job.error}`);
  const pct = stats.clat_ns?.percentile ?? {};
  return {
    iops: stats.iops,
    mibPerSec: stats.bw_bytes / (1024 * 1024),
    clatP50Us: (pct['50.000000'] ?? NaN) / 1000,
    clatP99Us: (pct['99.000000'] ?? NaN) / 1000,
    clatMeanUs: (stats.clat_ns?.mean ?? NaN) / 1000,
    ioBytes: stats.io_bytes,
  };
}

/** Runs one fio job to completion and returns its figures. */
export async function runFio(job: FioJob, direction: 'read' | 'write', tracker: ProcessTracker, abort: AbortSignal): Promise<FioFigures> {
  const args = [
    `--name=${job.name}`,
    '--output-format=json',
    ...endpointArgs(job.endpoint),
    ...job.options.map((o) => `--${o}`),
  ];
  const timeoutSec = job.expectedSec + FIO_SLACK_SEC;
  const preload = job.endpoint.kind === 'nbd' ? job.endpoint.preload : undefined;
  const env = preload === undefined ? {} : { env: { ...process.env, LD_PRELOAD: preload } };
  const r = await tracker.run('fio', args, abort, { timeoutMs: timeoutSec * 1000, ...env });
  if (r.timedOut) {
    throw new BenchError('BENCH_FIO_FAILED', `fio ${job.name} did not finish within ${timeoutSec} s (hung server?)`);
  }
  if (r.code !== 0) {
    throw new BenchError('BENCH_FIO_FAILED', `fio ${job.name} exited with code ${r.code}: ${r.stderr.trim() || r.stdout.slice(0, 2000)}`);
  }
  return parseFioJson(r.stdout, direction);
}
