"""Whether a process still holds its TCP port: a silent rank that is slow, not gone.

A rank's beacons come from a Python thread; a rank holding the interpreter (a long C call that keeps the
GIL: unpickling a big checkpoint, a compile) or starved of CPU falls silent while alive. Its gloo listener
is a socket the operating system answers for without the process running: a completed handshake says the
process is there, a refusal says its host is up and the process is gone, no answer says the host or the
link is. Gloo drops a connection that sends nothing (it reads a sequence number first, and ignores a read
that fails), so a knock does not disturb the group.

Pure socket code (no torch), on the kernel's side.
"""

from __future__ import annotations

import errno
import select
import socket
import struct
import time

ANSWERS, REFUSED, SILENT = "answers", "refused", "silent"
_UNSPECIFIED = {"0.0.0.0", "::", ""}


def knock(endpoints: dict, timeout: float = 1.0) -> dict:
    """For each key, how its ``[ip, port]`` endpoints answer a TCP connection within ``timeout`` s, all
    knocked at once: ``"answers"`` when any completes the handshake, ``"refused"`` when all refuse,
    ``"silent"`` otherwise. Keys with no usable endpoint (none known, or an unspecified address) are left
    out: nothing can be said of them.

    >>> server = socket.create_server(("127.0.0.1", 0))
    >>> knock({7: [["127.0.0.1", server.getsockname()[1]]]})
    {7: 'answers'}
    >>> server.close()
    """
    socks: dict[int, tuple[object, socket.socket]] = {}
    seen: dict[object, list[str]] = {}
    for key, eps in endpoints.items():
        for ip, port in eps or []:
            ip = str(ip).removeprefix("::ffff:")  # an IPv4 peer as a dual-stack socket names it
            if ip in _UNSPECIFIED:
                continue
            sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            # closed with a reset: no TIME_WAIT left behind for each knock
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            code = sock.connect_ex((ip, int(port)))
            seen.setdefault(key, [])
            if code in (0, errno.EINPROGRESS):
                socks[sock.fileno()] = (key, sock)
            else:
                seen[key].append(_verdict(code))
                sock.close()
    poller = select.poll()
    for fd in socks:
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + timeout
    try:
        while socks and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                key, sock = socks.pop(fd)
                poller.unregister(fd)
                seen[key].append(_verdict(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
                sock.close()
    finally:
        for key, sock in socks.values():  # no answer within the time
            seen[key].append(SILENT)
            sock.close()
    return {key: ANSWERS if ANSWERS in got else REFUSED if set(got) == {REFUSED} else SILENT
            for key, got in seen.items() if got}


def _verdict(code: int) -> str:
    if code == 0:
        return ANSWERS
    return REFUSED if code == errno.ECONNREFUSED else SILENT
