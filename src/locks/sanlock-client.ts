/**
 * SanlockClient: the idiomatic face of the native sanlock binding for the classes in this
 * folder. It checks that the library is loaded, turns sanlock's rv into MooringErrors and
 * adds the retries the daemon needs (get_hosts answers -EAGAIN for about a second after a
 * join).
 *
 * @packageDocumentation
 */
import { setTimeout as sleep } from 'node:timers/promises';

import { MooringError, callNative } from '../errors.js';
import type { NativeAddon, NativeSanlock, NativeSanlockRv } from '../native/binding.js';
import { loadAddon } from '../native/load.js';
import { sanlockError } from './sanlock-errors.js';

/** Retries of get_hosts while the daemon answers -EAGAIN (its first check after a join). */
export const GET_HOSTS_RETRY_MAX = 40;
/** Pause between those retries. */
export const GET_HOSTS_RETRY_DELAY_MS = 100;

const EAGAIN = -11;

/** Thin checked wrapper over {@link NativeSanlock}. @internal */
export class SanlockClient {
  readonly native: NativeSanlock;

  constructor(addon?: NativeAddon) {
    this.native = (addon ?? loadAddon()).sanlock;
  }

  /** Throws SANLOCK_UNAVAILABLE when libsanlock_client.so.1 cannot be loaded. */
  ensureLoaded(): void {
    const state = this.native.load();
    if (!state.loaded) {
      throw new MooringError('SANLOCK_UNAVAILABLE', state.error ?? `${state.library} cannot be loaded`, {
        details: { library: state.library, packages: ['libsanlock-client1', 'sanlock'] },
      });
    }
  }

  /**
   * Runs a daemon call and returns its result when rv >= 0.
   *
   * @param op - the call's name, for errors (`acquire`)
   * @param what - the object concerned, for errors
   * @param call - the native call
   * @param details - extra error details
   */
  async call<T extends NativeSanlockRv>(
    op: string,
    what: string,
    call: (s: NativeSanlock) => Promise<T>,
    details: Record<string, unknown> = {},
  ): Promise<T> {
    this.ensureLoaded();
    const result = await callNative(() => call(this.native), `${op} ${what}`);
    if (result.rv < 0) throw sanlockError(result.rv, op, what, details);
    return result;
  }

  /** Like {@link call} but returns rv (>= 0 or the failure) instead of throwing on rv < 0. */
  async rv<T extends NativeSanlockRv>(op: string, what: string, call: (s: NativeSanlock) => Promise<T>): Promise<T> {
    this.ensureLoaded();
    return callNative(() => call(this.native), `${op} ${what}`);
  }

  /** get_hosts, retrying the -EAGAIN the daemon gives before its first check after a join. */
  async getHosts(lockspace: string, hostId = 0) {
    for (let attempt = 0; ; attempt++) {
      const r = await this.rv('getHosts', `lockspace ${lockspace}`, (s) => s.getHosts(lockspace, hostId));
      if (r.rv === EAGAIN && attempt < GET_HOSTS_RETRY_MAX) {
        await sleep(GET_HOSTS_RETRY_DELAY_MS);
        continue;
      }
      if (r.rv < 0) throw sanlockError(r.rv, 'getHosts', `lockspace ${lockspace}`, { lockspace });
      return r.hosts;
    }
  }
}
