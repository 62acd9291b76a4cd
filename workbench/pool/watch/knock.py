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
    out: nothing can be said of them. Blocks until every answer is in or ``timeout`` passed; a caller
    with a poll loop of its own uses :class:`Knock`.

    >>> server = socket.create_server(("127.0.0.1", 0))
    >>> knock({7: [["127.0.0.1", server.getsockname()[1]]]})
    {7: 'answers'}
    >>> server.close()
    """
    pending = Knock(endpoints, timeout)
    poller = select.poll()
    for fd in pending.fds():
        poller.register(fd, select.POLLOUT)
    while not pending.done():
        for fd, _ in poller.poll(max(pending.deadline - time.monotonic(), 0) * 1000):
            poller.unregister(fd)
            pending.answered(fd)
    return pending.result()


class Knock:
    """Knocks in flight, for a caller that polls their sockets itself (beside its other file descriptors):
    register :meth:`fds` for ``POLLOUT``, hand each one that is ready to :meth:`answered`, and once
    :meth:`done` read :meth:`result` (what :func:`knock` returns; unanswered sockets count as silent).

    >>> server = socket.create_server(("127.0.0.1", 0))
    >>> k = Knock({7: [["127.0.0.1", server.getsockname()[1]]]}, timeout=1.0)
    >>> sorted(k.keys)
    [7]
    >>> _ = select.select([], k.fds(), [], 1.0)   # the handshake completed
    >>> k.answered(k.fds()[0])
    >>> k.done(), k.result()
    (True, {7: 'answers'})
    >>> server.close()
    """

    def __init__(self, endpoints: dict, timeout: float = 1.0):
        self.deadline = time.monotonic() + timeout
        self._socks: dict[int, tuple[object, socket.socket]] = {}  # fd -> (key, its connecting socket)
        self._seen: dict[object, list[str]] = {}
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
                self._seen.setdefault(key, [])
                if code in (0, errno.EINPROGRESS):
                    self._socks[sock.fileno()] = (key, sock)
                else:
                    self._seen[key].append(_verdict(code))
                    sock.close()
        self.keys = set(self._seen)  # what is being knocked at (the keys result() will have)

    def fds(self) -> list[int]:
        """The sockets still waiting for their handshake."""
        return list(self._socks)

    def answered(self, fd: int) -> None:
        """``fd`` (one of :meth:`fds`) is ready: its handshake completed or failed."""
        if fd in self._socks:
            key, sock = self._socks.pop(fd)
            self._seen[key].append(_verdict(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
            sock.close()

    def done(self) -> bool:
        return not self._socks or time.monotonic() >= self.deadline

    def result(self) -> dict:
        """Every key's verdict; the sockets that did not answer are closed, as silent."""
        self.close()
        return {key: ANSWERS if ANSWERS in got else REFUSED if set(got) == {REFUSED} else SILENT
                for key, got in self._seen.items() if got}

    def close(self) -> None:
        for key, sock in self._socks.values():
            self._seen[key].append(SILENT)
            sock.close()
        self._socks = {}


def _verdict(code: int) -> str:
    if code == 0:
        return ANSWERS
    return REFUSED if code == errno.ECONNREFUSED else SILENT
