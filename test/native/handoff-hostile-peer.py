#!/usr/bin/env python3
"""A hostile hand-off peer (test/native/nbd-handoff.test.ts): connects to a hand-off socket
and sends one malformed record, fds attached, then waits for the receiver to hang up.

usage: handoff-hostile-peer.py SOCKET VARIANT

The framing mirrors native/src/handoff/handoff-channel.cc (MessageHeader, host byte order)
and the NBD record native/src/nbd/nbd-handoff-record.cc; each variant breaks one rule.
"""
import os
import socket
import struct
import sys

MAGIC = 0x4D484F46
NBD_MAGIC = 0x4E424448
KIND_NBD = 1
KIND_MESSAGE = 2


def header(kind, seq, record_bytes, record_fds, chunk_bytes, chunk_fds, magic=MAGIC, version=1):
    return struct.pack('=IHHIIIIII', magic, version, kind, seq, record_bytes, record_fds, chunk_bytes, chunk_fds, 0)


def pipes(n):
    fds = []
    for _ in range(n // 2 + 1):
        fds.extend(os.pipe())
    return fds[:n]


def s(b):
    return struct.pack('<I', len(b)) + b


def nbd_record(connections):
    b = struct.pack('<II', NBD_MAGIC, 1)
    b += s(b'/tmp/hostile.sock') + struct.pack('<I', 0) + s(b'') + s(b'') + bytes([0]) + struct.pack('<I', 32 << 20)
    b += bytes([0]) + struct.pack('<QQQQQQQQ', 0, 0, connections + 1, connections, 0, 0, 0, 0) + struct.pack('<I', connections)
    for i in range(connections):
        flags = 0x1 | 0x4 | 0x8 | 0x400 | 0x100 | 0x20 | 0x40 | 0x800 | 0x80
        b += struct.pack('<QQIH', i + 1, 16 << 20, 32 << 20, flags) + bytes([0, 1, 1]) + struct.pack('<I', 1) + s(b'')
    return b


def send(sock, data, fds=()):
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack('%di' % len(fds), *fds))] if fds else [])


def main():
    path, variant = sys.argv[1], sys.argv[2]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    if variant == 'bad-magic':
        send(sock, header(KIND_MESSAGE, 0, 0, 0, 0, 0, magic=0xDEADBEEF))
    elif variant == 'oversized':
        body = b'x' * 16
        send(sock, header(KIND_MESSAGE, 0, 2 << 20, 0, len(body), 0) + body)
    elif variant == 'too-many-fds':
        send(sock, header(KIND_NBD, 0, 0, 5000, 0, 2), pipes(2))
    elif variant == 'fd-count':
        send(sock, header(KIND_NBD, 0, 0, 3, 0, 3), pipes(2))
    elif variant == 'message-with-fds':
        body = b'READY'
        send(sock, header(KIND_MESSAGE, 0, len(body), 2, len(body), 2) + body, pipes(2))
    elif variant == 'garbage-record':
        body = os.urandom(200)
        send(sock, header(KIND_NBD, 0, len(body), 3, len(body), 3) + body, pipes(3))
    elif variant == 'record-fd-count':
        body = nbd_record(1)
        a, b = socket.socketpair()
        send(sock, header(KIND_NBD, 0, len(body), 1, len(body), 1) + body, [a.fileno()])
    elif variant == 'record-not-socket':
        body = nbd_record(0)
        send(sock, header(KIND_NBD, 0, len(body), 1, len(body), 1) + body, pipes(1))
    elif variant == 'truncated':
        body = b'y' * 50
        send(sock, header(KIND_MESSAGE, 0, 100, 0, len(body), 0) + body)
        sock.close()
        return
    elif variant == 'many-fds':
        # Announced correctly: a receiver short of fds gets MSG_CTRUNC.
        body = b'z'
        send(sock, header(KIND_MESSAGE, 0, 1, 200, 1, 200) + body, pipes(200))
    else:
        sys.exit('unknown variant ' + variant)
    sock.settimeout(20)
    try:
        sock.recv(1)  # until the receiver hangs up
    except OSError:
        pass


main()
