// GOAWAY through the real addon (docs/replica-protocol.md, "GOAWAY"), server side: the
// feature bit in HELLO, CLIENT_FEATURES, GOAWAY sent only to a client that announced it,
// requests that cross it answered until the client half-closes, other clients closed, and
// the drain bounded by the timeout.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { MiB, Scratch } from './helpers.js';
import { closeAll, type Host, Op, RawClient, startHosts } from './remote-helpers.js';

const SIZE = 8 * MiB;
const BLOCK = 4096;
const FEATURE_GROW = 1n;
const FEATURE_GOAWAY = 2n;
const CODE_GOAWAY = 0x100;
const CLIENT_FEATURES = 26;

describe('replica server GOAWAY', () => {
  let s: Scratch;
  let hosts: Host[] = [];
  beforeAll(() => {
    s = new Scratch('mooring-goaway-');
  });
  afterEach(async () => {
    await closeAll(hosts);
    hosts = [];
  });
  afterAll(() => s.cleanup());

  it('speaks the protocol: the bit in HELLO, CLIENT_FEATURES, GOAWAY only to a client that announced it, answers until the half-close', async () => {
    hosts = await startHosts(s, 1, SIZE);
    const h = hosts[0]!;
    const announced = await RawClient.connect(h.server.port);
    announced.send({ op: Op.HELLO, seq: 0, payload: Buffer.from('vol') });
    const hello = await announced.next();
    expect(hello?.code).toBe(0);
    expect(hello!.payload.readBigUInt64LE(8)).toBe(FEATURE_GROW | FEATURE_GOAWAY);
    // Unknown bits are ignored: the reply names the ones both know.
    announced.send({ op: CLIENT_FEATURES, seq: 0, length: FEATURE_GOAWAY | (1n << 40n) });
    const cf = await announced.next();
    expect([cf?.code, cf?.seq, cf?.value]).toEqual([0, 0n, FEATURE_GOAWAY]);
    announced.send({ op: CLIENT_FEATURES, seq: 7, length: FEATURE_GOAWAY });
    expect((await announced.reply(7))?.code, 'only once').toBe(16);

    const silent = await RawClient.open(h.server.port, 'vol'); // never announces it
    silent.send({ op: Op.PING, seq: 1 });
    expect((await silent.reply(1))?.code).toBe(0);

    const going = h.server.goAway(10_000);
    const ga = await announced.next();
    expect([ga?.seq, ga?.code, ga?.payload.length]).toEqual([0n, CODE_GOAWAY, 0]);
    // Requests that cross the GOAWAY are still answered, until the client half-closes.
    announced.send({ op: Op.PING, seq: 8 }, { op: Op.READ, seq: 9, offset: 0, length: BLOCK });
    expect((await announced.reply(8))?.code).toBe(0);
    const read = await announced.reply(9);
    expect([read?.code, read?.payload.length]).toEqual([0, BLOCK]);
    expect(announced.isOpen).toBe(true);
    announced.socket.end(); // half-close
    await announced.closed;
    await silent.closed; // closed without a GOAWAY
    expect(silent.replies.some((r) => r.code === CODE_GOAWAY)).toBe(false);
    expect(await going).toEqual({ goaway: 1, timedOut: 0, closed: 1 });
    expect(h.server.stats().connectionsOpen).toBe(0);
    expect(h.server.stats().protocolErrors, 'the second CLIENT_FEATURES only').toBe(1);
  });

  it('closes a GOAWAY connection whose client never half-closes once the timeout passes', async () => {
    hosts = await startHosts(s, 1, SIZE);
    const c = await RawClient.open(hosts[0]!.server.port, 'vol');
    c.send({ op: CLIENT_FEATURES, seq: 1, length: FEATURE_GOAWAY });
    expect((await c.reply(1))?.value).toBe(FEATURE_GOAWAY);
    const t0 = Date.now();
    expect(await hosts[0]!.server.goAway(300)).toEqual({ goaway: 0, timedOut: 1, closed: 0 });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
    await c.closed;
    expect(c.replies.some((r) => r.seq === 0n && r.code === CODE_GOAWAY)).toBe(true);
  });
});
