// A data engine's replica server holds as many connections as a host serving replicas of
// many volumes needs (issue 21): each replica served to an engine on another host is one
// connection, and the native default of 256 stopped a 3-host cluster at about 385
// three-replica volumes per host (NO_QUORUM in the scale benchmark). 400 clients complete
// their HELLO and stay served, and the process has no more threads for them: the replica
// server's connections are read by a fixed set of connection loops (docs/architecture.md,
// "Threads"). Nothing is timed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { DATA_ENGINE_DEFAULTS, LocalDataEngine } from '../../src/data-engine/local-data-engine.js';
import { threadTotal, threadsByName, waitFor } from '../native/helpers.js';
import { Op, RawClient, rawAuthenticate } from '../native/remote-helpers.js';
import { TempDir } from './helpers/tools.js';

const CONNECTIONS = 400;
const SECRET = Buffer.from('connections-test-secret-0123456789');

// A client past AUTH and HELLO, as an engine's replica connection is.
async function served(port: number, name: string): Promise<RawClient> {
  const c = await RawClient.connect(port);
  const auth = await rawAuthenticate(c, SECRET);
  if (auth.reply?.code !== 0) throw new Error(`AUTH: ${auth.reply ? `code ${auth.reply.code} ${auth.reply.payload.toString()}` : 'connection closed'}`);
  c.send({ op: Op.HELLO, seq: 0, payload: Buffer.from(name) });
  const r = await c.next();
  if (r?.code !== 0) throw new Error(`HELLO ${name}: ${r ? `code ${r.code} ${r.payload.toString()}` : 'connection closed'}`);
  return c;
}

describe('data engine replica server connections', () => {
  let tmp: TempDir;
  let de: LocalDataEngine;
  beforeAll(async () => {
    tmp = new TempDir('mooring-de-conns-');
    de = await LocalDataEngine.start({ dir: tmp.path, hostId: 'h', replicaListen: 'tcp:127.0.0.1:0', clusterSecret: SECRET });
  });
  afterAll(async () => {
    await de?.close();
    tmp?.cleanup();
  });

  it(`serves ${CONNECTIONS} connections past HELLO at once (more than the native default of 256)`, async () => {
    expect(DATA_ENGINE_DEFAULTS.replicaServerConnectionsMax).toBeGreaterThanOrEqual(CONNECTIONS);
    const port = Number((await de.info()).replicaAddress!.split(':').at(-1));
    const names = Array.from({ length: 8 }, (_, i) => `vol-${i}`);
    for (const n of names) await de.createReplica(n, 4 * 1024 * 1024);
    const clients: RawClient[] = [];
    const before = threadsByName();
    try {
      for (let i = 0; i < CONNECTIONS; i++) clients.push(await served(port, names[i % names.length]!));
      expect(clients.filter((c) => c.isOpen)).toHaveLength(CONNECTIONS);
      // Every connection is still read: each answers a PING.
      for (const [i, c] of clients.entries()) c.send({ op: Op.PING, seq: i + 1 });
      for (const [i, c] of clients.entries()) {
        const r = await c.next();
        expect(r && { code: r.code, seq: r.seq }).toEqual({ code: 0, seq: BigInt(i + 1) });
      }
      // A connection's handshake thread ends once HELLO is answered; then the threads are
      // those of before, plus the connection loops (2 by default) and what the runtime and
      // the I/O pool start on demand, within their bounds: none per connection.
      await waitFor('handshake threads to end', () => !threadsByName().has('mr-rs-hello'), 10_000);
      const after = threadsByName();
      const grew = threadTotal(after) - threadTotal(before);
      expect(grew, JSON.stringify(Object.fromEntries(after))).toBeLessThanOrEqual(2 + 8);
      expect(after.get('mr-conn-loop') ?? 0).toBeLessThanOrEqual(2);
    } finally {
      for (const c of clients) c.close();
    }
  }, 120_000);
});
