// The API reference (docs/api/) is generated from the TSDoc of the main entry, and this test
// keeps it honest: `npm run docs:api:check` fails on any TypeDoc warning (an undocumented
// public export or member, a {@link} that does not resolve, a public type that names an
// unexported one) and when the committed docs/api/ differs from what the sources generate.
import { describe, expect, it } from 'vitest';
import { repoRoot, run } from '../system/helpers/tools.js';

describe('API reference', () => {
  it('is generated without warnings and docs/api/ is up to date', async () => {
    const r = await run(process.execPath, ['test/docs/docs-api.mjs', '--check'], { cwd: repoRoot, timeoutMs: 300_000 });
    expect(r.stdout).toMatch(/docs\/api\/ is up to date/);
  });
});
