/**
 * The TCP_NODELAY shim for the TCP peers. QEMU 7.2's NBD server (qemu-nbd) and NBD client
 * (the nbd block driver of qemu-storage-daemon) leave Nagle's algorithm on: a small reply
 * written while an earlier one is unacknowledged waits for the ACK (up to the delayed-ACK
 * timer), which caps a quorum over loopback at a few hundred IOPS on 4k reads. That is a
 * setting, not the design, so the benchmark measures the peers with it off: this small
 * LD_PRELOAD library wraps connect(), accept() and accept4() and sets TCP_NODELAY on every
 * TCP socket they return. Nothing else changes. It is compiled with the system `cc` into the
 * target's scratch directory when a TCP peer starts; fio (libnbd) runs with it too when it
 * talks TCP, so both ends of every TCP connection of a peer send at once, as Mooring's do.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { BenchError } from './processes.js';
import type { TargetContext } from './targets.js';

/** The shim's C source, written next to the library it compiles to. */
export const NODELAY_SHIM_C = String.raw`#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

/* Sets TCP_NODELAY on fd if it is an IPv4/IPv6 socket; errno is left as the caller saw it. */
static void nodelay(int fd) {
  int saved = errno;
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int type = 0;
  socklen_t tlen = sizeof type;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0 && (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) &&
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_STREAM) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  errno = saved;
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
  static int (*real)(int, const struct sockaddr *, socklen_t);
  if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
  int r = real(fd, addr, len);
  if (r == 0 || errno == EINPROGRESS) nodelay(fd);
  return r;
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
  static int (*real)(int, struct sockaddr *, socklen_t *);
  if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
  int r = real(fd, addr, len);
  if (r >= 0) nodelay(r);
  return r;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  static int (*real)(int, struct sockaddr *, socklen_t *, int);
  if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
  int r = real(fd, addr, len, flags);
  if (r >= 0) nodelay(r);
  return r;
}
`;

/** Compiles the shim into `ctx.dir/nodelay.so` and returns its path. */
export async function buildNodelayShim(ctx: TargetContext): Promise<string> {
  const src = join(ctx.dir, 'nodelay.c');
  const lib = join(ctx.dir, 'nodelay.so');
  writeFileSync(src, NODELAY_SHIM_C);
  const r = await ctx.tracker.run('cc', ['-shared', '-fPIC', '-O2', '-Wall', '-o', lib, src, '-ldl'], ctx.abort, { timeoutMs: 120_000 });
  if (r.code !== 0) throw new BenchError('BENCH_TARGET_FAILED', `cannot compile the TCP_NODELAY shim (cc exited ${r.code}): ${r.stderr}`);
  return lib;
}
