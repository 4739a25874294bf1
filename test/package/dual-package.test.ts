// One process, both builds: a program whose dependencies `import` and `require` the package
// gets two copies of it (dist/index.js and dist/index.cjs), each with its own MooringError
// class. An error from one copy must still be a MooringError to the other.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot, requireBuilt, run, TempDir } from '../system/helpers/tools.js';

const tmp = new TempDir('mooring-dual-');

// Runs in a child node: errors from real failing calls of each copy's public API, judged by
// the other copy. Prints one RESULT line of facts for the test to check.
const SCRIPT = `
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [esmPath, cjsPath, dir] = process.argv.slice(1);
const esm = await import(pathToFileURL(esmPath).href);
const cjs = createRequire(import.meta.url)(cjsPath);

async function failure(call) {
  try {
    await call();
  } catch (err) {
    return err;
  }
  throw new Error('the call did not fail');
}
// ESM: a volume that does not exist. CJS: a host id that is not a name.
const m = await esm.Mooring.open({ store: new esm.MemoryStateStore() });
const fromEsm = await failure(() => m.volume('missing').status());
await m.close();
const fromCjs = await failure(() => cjs.Mooring.open({ dir: join(dir, 'm'), hostId: '../x' }));
const seenBy = (err, m, code) => ({
  code: err.code,
  instanceOf: err instanceof m.MooringError,
  isMooringError: m.isMooringError(err),
  withCode: m.isMooringError(err, code),
});
const impostors = [new Error('plain'), Object.assign(new Error('coded'), { code: 'NOT_FOUND' }), { name: 'MooringError', code: 'NOT_FOUND', message: 'fake' }];
const accepted = [];
for (const [i, v] of impostors.entries()) {
  for (const [name, m] of [['esm', esm], ['cjs', cjs]]) {
    if (v instanceof m.MooringError || m.isMooringError(v) || m.isMooringError(v, 'NOT_FOUND')) accepted.push(name + ':' + i);
  }
}
console.log('RESULT ' + JSON.stringify({
  twoClasses: esm.MooringError !== cjs.MooringError,
  esmErrorSeenByCjs: seenBy(fromEsm, cjs, 'NOT_FOUND'),
  cjsErrorSeenByEsm: seenBy(fromCjs, esm, 'INVALID_ARGUMENT'),
  subclassCheckStaysOrdinary: !(fromEsm instanceof class extends cjs.MooringError {}),
  accepted,
}));
`;

describe('ESM and CJS builds in one process', () => {
  beforeAll(() => {
    requireBuilt(['dist/index.js', 'dist/index.cjs', 'prebuilds/linux-x64/mooring.node']);
  });
  afterAll(() => tmp.cleanup());

  it('share one MooringError identity', async () => {
    const r = await run(
      process.execPath,
      ['--input-type=module', '-e', SCRIPT, join(repoRoot, 'dist', 'index.js'), join(repoRoot, 'dist', 'index.cjs'), tmp.path],
      { timeoutMs: 60_000 },
    );
    const line = /^RESULT (.*)$/m.exec(r.stdout);
    expect(line, r.stdout + r.stderr).not.toBeNull();
    expect(JSON.parse(line![1]!)).toEqual({
      twoClasses: true,
      esmErrorSeenByCjs: { code: 'NOT_FOUND', instanceOf: true, isMooringError: true, withCode: true },
      cjsErrorSeenByEsm: { code: 'INVALID_ARGUMENT', instanceOf: true, isMooringError: true, withCode: true },
      subclassCheckStaysOrdinary: true,
      accepted: [],
    });
  });
});
