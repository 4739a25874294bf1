/**
 * The peers of the replicated path (issue 16), started as docs/benchmarks.md describes:
 * nbdkit's file plugin (the strongest single-copy NBD server), one qemu-nbd reached over TCP
 * (one remote copy) and QEMU's quorum driver over three qemu-nbd on TCP loopback, served by
 * qemu-storage-daemon on a unix socket (what QEMU offers for Mooring's job). The TCP ones run
 * with the TCP_NODELAY shim (nodelay-shim.ts).
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

import { buildNodelayShim } from './nodelay-shim.js';
import { createSparse, nbdUri, serveNbd, type RunningTarget, type TargetContext } from './targets.js';
import type { TargetId } from './target-ids.js';

/** Offsets from --port-base: the remote qemu-nbd, then the quorum's three children. */
const QEMU_TCP_PORT_OFFSET = 4;
const QUORUM_PORT_OFFSET = 5;
const LOOPBACK = '127.0.0.1';

/** `nbdkit -f --exit-with-parent -U SOCK file file=IMG` (its default 16 threads). */
export async function startNbdkit(id: TargetId, ctx: TargetContext): Promise<RunningTarget> {
  const image = join(ctx.dir, 'disk.raw');
  createSparse(image, ctx.areaBytes);
  const socket = join(ctx.dir, 'nbd.sock');
  return { id, ...(await serveNbd(id, 'nbdkit', ['-f', '--exit-with-parent', '-U', socket, 'file', `file=${image}`], { path: socket }, ctx)) };
}

/** `qemu-nbd -f raw -t -e 8 -b 127.0.0.1 -p PORT IMG` with LD_PRELOAD=shim: one copy over TCP. */
async function serveQemuNbdTcp(label: string, image: string, port: number, shim: string, ctx: TargetContext): Promise<Omit<RunningTarget, 'id'>> {
  createSparse(image, ctx.areaBytes);
  const args = ['-f', 'raw', '-t', '-e', '8', '-b', LOOPBACK, '-p', String(port), image];
  return serveNbd(label, 'qemu-nbd', args, { host: LOOPBACK, port }, ctx, { LD_PRELOAD: shim });
}

/** One remote copy: qemu-nbd over TCP loopback, fio connecting over TCP (both ends with the shim). */
export async function startQemuNbdTcp(id: TargetId, ctx: TargetContext): Promise<RunningTarget> {
  const shim = await buildNodelayShim(ctx);
  const port = ctx.portBase + QEMU_TCP_PORT_OFFSET;
  const served = await serveQemuNbdTcp(id, join(ctx.dir, 'disk.raw'), port, shim, ctx);
  return { id, ...served, endpoint: { kind: 'nbd', uri: nbdUri({ host: LOOPBACK, port }), preload: shim } };
}

/**
 * QEMU quorum: three qemu-nbd children on TCP loopback, each on its own image, and
 * qemu-storage-daemon with a quorum node over them (vote-threshold 2, reads from one child),
 * exported writable on a unix socket. Writes complete when all three children answer.
 */
export async function startQuorum(id: TargetId, ctx: TargetContext): Promise<RunningTarget> {
  const shim = await buildNodelayShim(ctx);
  const started: Array<Omit<RunningTarget, 'id'>> = [];
  const stopAll = async (graceMs?: number): Promise<void> => {
    for (const t of started.reverse()) await t.stop(graceMs);
  };
  try {
    const ports = [0, 1, 2].map((i) => ctx.portBase + QUORUM_PORT_OFFSET + i);
    const children: Array<Omit<RunningTarget, 'id'>> = [];
    for (const [i, port] of ports.entries()) {
      const dir = join(ctx.dir, `c${i}`);
      mkdirSync(dir);
      const child = await serveQemuNbdTcp(`${id} child c${i}`, join(dir, 'disk.raw'), port, shim, { ...ctx, dir });
      started.push(child);
      children.push(child);
    }
    const socket = join(ctx.dir, 'nbd.sock');
    const quorum = { driver: 'quorum', 'node-name': 'q', 'vote-threshold': 2, 'read-pattern': 'fifo', children: ['c0', 'c1', 'c2'] };
    const args = [
      ...ports.flatMap((port, i) => ['--blockdev', `driver=nbd,node-name=c${i},server.type=inet,server.host=${LOOPBACK},server.port=${port}`]),
      '--blockdev', JSON.stringify(quorum),
      '--nbd-server', `addr.type=unix,addr.path=${socket}`,
      '--export', 'type=nbd,id=e0,node-name=q,name=,writable=on',
    ];
    const qsd = await serveNbd(id, 'qemu-storage-daemon', args, { path: socket }, ctx, { LD_PRELOAD: shim });
    started.push(qsd);
    return {
      id,
      endpoint: qsd.endpoint,
      processes: [
        { name: 'qemu-storage-daemon', pid: qsd.processes[0]!.pid },
        ...children.map((c, i) => ({ name: `qemu-nbd c${i}`, pid: c.processes[0]!.pid })),
      ],
      stop: stopAll,
    };
  } catch (err) {
    await stopAll();
    throw err;
  }
}
