// Prometheus metrics (docs/metrics.md).
export { MooringMetrics, type MooringMetricsOptions } from './mooring-metrics.js';
export { DataEngineMetrics, type MetricsOptions } from './data-engine-metrics.js';
