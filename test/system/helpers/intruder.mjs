// Another local process trying to use a data engine (test/system/cluster-secret.test.ts):
// through its gRPC TCP port it creates and deletes a replica with this package's
// RemoteDataEngine; through its replica port it opens a replica, claims an epoch and writes,
// speaking the replica protocol itself. With SECRET_HEX it authenticates with that secret
// (right or wrong); without it, it does not try. Prints one JSON object: what each step got.
//
// node intruder.mjs GRPC_ADDRESS REPLICA_HOST REPLICA_PORT REPLICA_NAME [SECRET_HEX]
import { createHmac, randomBytes } from 'node:crypto';
import { createConnection } from 'node:net';

import { RemoteDataEngine } from '../../../dist/index.js';

const [grpcAddress, replicaHost, replicaPort, replicaName, secretHex] = process.argv.slice(2);
const secret = secretHex ? Buffer.from(secretHex, 'hex') : undefined;
const out = {};

const codeOf = (e) => (e && typeof e === 'object' && 'code' in e ? String(e.code) : String(e));

// gRPC: create, then delete (the victim's replica, and our own if we made one).
try {
  const de = await RemoteDataEngine.connect({ address: grpcAddress, timeoutMs: 5000, ...(secret ? { clusterSecret: secret } : {}) });
  out.connect = 'OK';
  out.create = await de.createReplica('intruder', 1 << 20).then(() => 'OK', codeOf);
  out.deleteOwn = await de.deleteReplica('intruder').then(() => 'OK', codeOf);
  await de.close();
} catch (e) {
  out.connect = codeOf(e);
}

// The replica protocol, frame by frame (docs/replica-protocol.md).
function request(op, seq, { epoch = 0n, offset = 0n, length = 0n, payload = Buffer.alloc(0) } = {}) {
  const h = Buffer.alloc(48);
  h.writeUInt32LE(0x3151524d, 0);
  h.writeUInt8(1, 4);
  h.writeUInt8(op, 5);
  h.writeBigUInt64LE(BigInt(seq), 8);
  h.writeBigUInt64LE(BigInt(epoch), 16);
  h.writeBigUInt64LE(BigInt(offset), 24);
  h.writeBigUInt64LE(BigInt(length), 32);
  h.writeUInt32LE(payload.length, 40);
  return Buffer.concat([h, payload]);
}

function proof(who, nc, ns) {
  const k = createHmac('sha256', secret).update('mooring replica protocol v1').digest();
  return createHmac('sha256', k).update(Buffer.concat([Buffer.from(`mooring replica auth v1 ${who}`), nc, ns])).digest();
}

const sock = createConnection({ host: replicaHost, port: Number(replicaPort) });
sock.on('error', () => undefined);
let buf = Buffer.alloc(0);
let closed = false;
const waiters = [];
const wake = () => waiters.splice(0).forEach((f) => f());
sock.on('data', (d) => {
  buf = Buffer.concat([buf, d]);
  wake();
});
sock.on('close', () => {
  closed = true;
  wake();
});
await new Promise((res, rej) => {
  sock.once('connect', res);
  sock.once('error', rej);
});
// The next reply {code, payload}, or 'closed'.
async function reply() {
  for (;;) {
    if (buf.length >= 40 && buf.length >= 40 + buf.readUInt32LE(20)) {
      const n = 40 + buf.readUInt32LE(20);
      const r = { code: buf.readUInt16LE(4), payload: buf.subarray(40, n) };
      buf = buf.subarray(n);
      return r;
    }
    if (closed) return 'closed';
    await new Promise((res) => waiters.push(res));
  }
}
const name = (r) => (r === 'closed' ? 'closed' : r.code === 0 ? 'OK' : `code ${r.code}`);

if (secret) {
  const nc = randomBytes(32);
  sock.write(request(27, 0, { payload: nc }));
  const r = await reply();
  out.auth = name(r);
  if (r !== 'closed' && r.code === 0) {
    out.serverProved = r.payload.subarray(32).equals(proof('server', nc, r.payload.subarray(0, 32)));
    sock.write(request(28, 0, { payload: proof('client', nc, r.payload.subarray(0, 32)) }));
    out.authProof = name(await reply());
  }
}
// HELLO, CLAIM_EPOCH and WRITE pipelined, as an intruder in a hurry would.
sock.write(
  Buffer.concat([
    request(1, 1, { payload: Buffer.from(replicaName) }),
    request(9, 2, { epoch: 1n << 40n }),
    request(4, 3, { epoch: 1n << 40n, offset: 0n, length: 4096n, payload: Buffer.alloc(4096, 0xee) }),
  ]),
);
out.hello = name(await reply());
out.claim = name(await reply());
out.write = name(await reply());
out.closedAfter = await (async () => {
  sock.end();
  for (let i = 0; i < 100 && !closed; i++) await new Promise((res) => setTimeout(res, 20));
  return closed;
})();
sock.destroy();
process.stdout.write(`${JSON.stringify(out)}\n`);
