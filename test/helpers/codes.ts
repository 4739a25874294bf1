// The one way tests read the code a library call rejected with.
import { expect } from 'vitest';

import { MooringError } from '../../src/errors.js';

/** The MooringError code `p` rejects with, or 'resolved' if it resolves. Fails on any other error. */
export async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(MooringError);
    return (err as MooringError).code;
  }
  return 'resolved';
}
