"""The launcher <-> zygote messages: one JSON line each, the stdio fds with the request."""

from __future__ import annotations

import array
import json
import os
import socket
import struct

MAX_MSG = 1 << 20


def send(sock: socket.socket, msg: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode() + b"\n"
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(data)


def recv(sock: socket.socket, buf: bytearray, fds: list[int] | None = None) -> dict | None:
    """The next message (None: the peer closed); received fds are appended to ``fds``."""
    while b"\n" not in buf:
        if len(buf) > MAX_MSG:
            raise ValueError("message too long")
        size = struct.calcsize("i") * 8
        data, anc, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(size))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[:len(payload) - len(payload) % got.itemsize])
                if fds is None:
                    for fd in got:
                        os.close(fd)
                else:
                    fds.extend(got)
        if not data:
            return None
        buf.extend(data)
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]
