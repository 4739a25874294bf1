// A NativeSanlock for unit tests that never reach the daemon: by default the library is
// "not installed"; tests override the methods they need.
import type { NativeSanlock } from '../../../src/native/binding.js';

const missing = 'libsanlock_client.so.1: cannot open shared object file; install libsanlock-client1 (library) and sanlock (daemon)';

function notLoaded(): never {
  throw Object.assign(new Error(missing), { code: 'UNSUPPORTED' });
}

export function fakeSanlock(overrides: Partial<NativeSanlock> = {}): NativeSanlock {
  const base = new Proxy({} as NativeSanlock, {
    get: (_t, prop) => {
      if (prop === 'load') return () => ({ loaded: false, library: 'libsanlock_client.so.1', error: missing });
      return notLoaded;
    },
  });
  return Object.assign(Object.create(base) as NativeSanlock, overrides);
}
