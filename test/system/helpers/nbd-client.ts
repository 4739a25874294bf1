// The NBD client the tests use lives beside the benchmark, which measures with it too.
export * from '../../../src/bench/nbd-client.js';
