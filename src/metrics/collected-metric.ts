/**
 * A metric whose series are computed at scrape time from one snapshot of counters that
 * already exist (the data path's, the store's), registered on a prom-client `Registry`.
 * Nothing is counted in JS per I/O; a series that is not in the snapshot (a deleted volume,
 * a stopped engine) is simply not emitted.
 *
 * @packageDocumentation
 */
import type { Metric, Registry } from 'prom-client';

/** One series: its labels and value; `suffix` for a histogram's `_bucket`, `_sum`, `_count`. */
export interface Sample {
  labels: Record<string, string | number>;
  value: number;
  suffix?: '_bucket' | '_sum' | '_count';
}

type MetricTypeName = 'counter' | 'gauge' | 'histogram';

/**
 * Takes a snapshot at most once per scrape: the registry asks every metric at once
 * (`Promise.all`), so they all share the read that the first one started.
 */
export class SnapshotOnce<T> {
  #pending: Promise<T> | null = null;
  readonly #read: () => Promise<T>;

  constructor(read: () => Promise<T>) {
    this.#read = read;
  }

  get(): Promise<T> {
    if (!this.#pending) {
      const p = (async () => this.#read())();
      this.#pending = p;
      const clear = (): void => {
        if (this.#pending === p) this.#pending = null;
      };
      p.then(clear, clear);
    }
    return this.#pending;
  }
}

/** A metric of a registry whose values `samples(snapshot)` computes at each scrape. */
export class CollectedMetric<T> {
  readonly name: string;
  readonly help: string;
  readonly type: MetricTypeName;
  readonly aggregator = 'sum' as const;
  readonly #snapshot: SnapshotOnce<T>;
  readonly #samples: (snapshot: T) => Sample[];

  constructor(name: string, help: string, type: MetricTypeName, snapshot: SnapshotOnce<T>, samples: (snapshot: T) => Sample[]) {
    this.name = name;
    this.help = help;
    this.type = type;
    this.#snapshot = snapshot;
    this.#samples = samples;
  }

  /** What prom-client's registry asks for. */
  async get(): Promise<{ name: string; help: string; type: MetricTypeName; aggregator: 'sum'; values: Array<{ labels: Record<string, string | number>; value: number; metricName?: string }> }> {
    const snap = await this.#snapshot.get();
    const values = this.#samples(snap).map((s) => ({
      labels: s.labels,
      value: s.value,
      ...(s.suffix ? { metricName: `${this.name}${s.suffix}` } : {}),
    }));
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  /** Nothing to reset: the values are the sources' own. */
  reset(): void {}
}

/** Registers metrics on a registry; `remove()` takes them off again. */
export class MetricSet {
  readonly #registry: Registry;
  readonly #names: string[] = [];

  constructor(registry: Registry) {
    this.#registry = registry;
  }

  add<T>(metric: CollectedMetric<T>): void {
    // prom-client types a registry's metrics as its own classes; it needs only what
    // CollectedMetric has (name, help, type, aggregator, get, reset).
    this.#registry.registerMetric(metric as unknown as Metric);
    this.#names.push(metric.name);
  }

  remove(): void {
    for (const n of this.#names.splice(0)) this.#registry.removeSingleMetric(n);
  }
}

/**
 * Prometheus histogram series from log2 buckets (`buckets[i]`: at most 2^i µs, not
 * cumulative; the last one the rest): cumulative `_bucket`s with `le` in seconds (from 8 µs), `+Inf`,
 * `_sum` in seconds, and `_count` equal to the `+Inf` bucket (taken from the buckets, so
 * they always agree).
 */
export function log2Histogram(labels: Record<string, string>, buckets: readonly number[], sumNs: number): Sample[] {
  const out: Sample[] = [];
  let cum = 0;
  for (let i = 0; i < buckets.length; i++) {
    cum += buckets[i] ?? 0;
    if (i === buckets.length - 1) break;
    // Bounds below 8 us are merged into 8 us (cumulative): no block request is that fast
    // end to end, and each bound is a series per volume and kind.
    if (i < LE_FIRST) continue;
    out.push({ labels: { ...labels, le: leSeconds(i) }, value: cum, suffix: '_bucket' });
  }
  out.push({ labels: { ...labels, le: '+Inf' }, value: cum, suffix: '_bucket' });
  out.push({ labels, value: sumNs / 1e9, suffix: '_sum' });
  out.push({ labels, value: cum, suffix: '_count' });
  return out;
}

/** The first bucket bound emitted: 2^3 us. */
const LE_FIRST = 3;

// 2^i microseconds in seconds, written exactly (1e-06, 2e-06, ..., 4.194304).
function leSeconds(i: number): string {
  return String((2 ** i) / 1e6);
}
