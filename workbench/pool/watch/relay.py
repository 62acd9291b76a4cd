"""The pool's relay: one side channel that every notebook attached to the pool subscribes to.

The ranks push their beacons and metrics to the relay's ``up`` socket once; the relay publishes
them on ``out`` to every subscriber (the kernel that started the pool, attached kernels, the Jupyter
server). Commands travel the same way the other direction: a session pushes a signed command up, and
the engines' agents, subscribed to the command topic, receive it. Every connection goes towards the
machine of the pool's owner, as ipyparallel's own do, and the relay lives in the owner's process (a
thread), so it lives exactly as long as the pool.

The relay checks every message's signature before it fans it out, so forged or garbage messages
stop here (counted in ``dropped``) and never fill the subscribers' queues; each receiver checks
again. Messages over the size limit never get in (``MAXMSGSIZE``), and its queues are bounded. It
starts reading only once a session subscribed, so the ranks' first records wait in its queue
instead of being published to nobody.

>>> relay = Relay("127.0.0.1", key)       # doctest: +SKIP
>>> relay.up, relay.out                   # doctest: +SKIP
('tcp://127.0.0.1:50123', 'tcp://127.0.0.1:50124')
>>> relay.close()                         # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading

import zmq

from workbench import wire

# Topics a session subscribes to: once one of them is asked for, the relay starts forwarding.
SESSION_TOPICS = (wire.BEACON, wire.METRICS)
# Messages held per queue. With MAX_BYTES per message this bounds what a flood can make us hold;
# an honest pool sends about 14 messages a second per rank (beacons and metrics batches).
HWM = 10_000


def tcp_url(address: str, port: int | None = None) -> str:
    """``tcp://address:port`` with IPv6 addresses in brackets (``port`` None: for bind_to_random_port).

    >>> tcp_url("::1", 5), tcp_url("127.0.0.1")
    ('tcp://[::1]:5', 'tcp://127.0.0.1')
    """
    host = f"[{address}]" if ":" in address else address
    return f"tcp://{host}" if port is None else f"tcp://{host}:{port}"


IPC_PATH_MAX = 107  # sun_path of a Linux unix socket, less its final NUL


class Relay:
    """Binds ``up`` (PULL) and ``out`` (XPUB) on ``address`` and forwards what ``key`` signed, on a thread.

    ``folder``: a private (0700) folder to bind unix sockets in instead (a local pool): a message is
    signed but not encrypted, and on TCP any user of the machine could subscribe to ``out`` and read
    every beacon, metric and command; a socket in the folder only the pool's user can open.
    """

    def __init__(self, address: str, key: str, folder: str | None = None):
        self._signer = wire.Signer(key)
        self._ctx = zmq.Context()
        self._folder = folder
        self._up = self._socket(zmq.PULL, address, "up")
        self._up.setsockopt(zmq.RCVHWM, HWM)
        self._out = self._socket(zmq.XPUB, address, "out")
        self._out.setsockopt(zmq.SNDHWM, HWM)
        self.up = self._up.getsockopt_string(zmq.LAST_ENDPOINT)
        self.out = self._out.getsockopt_string(zmq.LAST_ENDPOINT)
        self.forwarded = 0
        self.dropped = 0  # messages not signed with the pool's key
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-relay", daemon=True)
        self._thread.start()

    def _socket(self, kind: int, address: str, name: str):
        sock = self._ctx.socket(kind)
        wire.configure(sock)
        path = os.path.join(self._folder or "", f"relay-{name}")
        if self._folder and len(path.encode()) < IPC_PATH_MAX:
            sock.bind(f"ipc://{path}")
            return sock
        if self._folder:  # a unix socket's path has room for 107 bytes: the runtime folder is too deep
            logging.getLogger("workbench.pool").warning(
                "side channel on %s, not a unix socket: %s is too long a path", address, path)
        if ":" in address:
            sock.setsockopt(zmq.IPV6, 1)
        sock.bind_to_random_port(tcp_url(address))
        return sock

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._out, zmq.POLLIN)  # subscriptions come in here
        reading = False
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                if self._out in ready:
                    while self._out.poll(0):
                        sub = self._out.recv()
                        if not reading and sub[:1] == b"\x01" and sub[1:] in SESSION_TOPICS:
                            poller.register(self._up, zmq.POLLIN)
                            reading = True
                if self._up in ready:
                    for _ in range(1000):  # a burst, then look at subscriptions and the stop flag again
                        try:
                            frames = self._up.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        try:
                            self._signer.unpack(frames)
                        except wire.BadMessage:
                            self.dropped += 1
                            continue
                        self._out.send_multipart(frames)
                        self.forwarded += 1
        finally:
            self._up.close(0)
            self._out.close(0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._ctx.term()
