import { defineConfig } from 'tsup';

export default defineConfig({
  entry: { index: 'src/index.ts', internal: 'src/internal.ts', cli: 'src/cli/main.ts', 'lock-exec': 'src/locks/exec-helper.ts' },
  format: ['esm', 'cjs'],
  dts: { entry: { index: 'src/index.ts', internal: 'src/internal.ts' } },
  shims: true,
  target: 'node20',
  platform: 'node',
  // No source maps: they tripled the package; stack traces point into dist/ (readable, unminified).
  sourcemap: false,
  clean: true,
  splitting: false,
});
