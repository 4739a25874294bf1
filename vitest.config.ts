import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // System tests start real processes (qemu-io, fio, mooring serve): give them room, and
    // run files one at a time on these 2-core machines so timings stay sane.
    testTimeout: 120_000,
    hookTimeout: 120_000,
    fileParallelism: false,
    reporters: ['default', './test/summary-reporter.ts'],
  },
});
