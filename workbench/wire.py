"""Signed side-channel messages between the ranks and every notebook attached to their pool.

Besides ipyparallel (the control plane, signed by ipyparallel itself) a pool has one side channel:
the ranks' beacons and metrics go up to the pool's relay, which fans them out to every session
that subscribes; commands (stop at a step boundary, abort the process group) go the other way.
Every message is three ZMQ frames ``[topic, body, signature]``, the signature an HMAC-SHA256 of
topic and body under the pool's own key. A receiver drops, and counts, any message that is not
signed with that key or is larger than :data:`MAX_BYTES`; it never raises on one.

Imports nothing beyond the standard library (the engines, the kernel and the server all use it).

>>> signer = Signer(new_key())
>>> frames = signer.pack(BEACON, b'{"rank": 0}')
>>> signer.unpack(frames)
(b'beacon', b'{"rank": 0}')
>>> Signer(new_key()).unpack(frames)
Traceback (most recent call last):
...
workbench.wire.BadMessage: bad signature
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets

# Topics: the relay's subscribers filter on them.
BEACON = b"beacon"
METRICS = b"metrics"
COMMAND = b"cmd"
STACKS = b"stacks"  # a rank's answer to a ``stacks`` command (workbench.engine.stacks)


class Command(enum.StrEnum):
    """What a command on the side channel asks a rank's agent to do: the one list the sender (the kernel's
    door, :mod:`workbench.remote.door`) and the receiver (:mod:`workbench.engine.agent`) share. A command's
    body is JSON: ``{"do": <one of these>, "ranks", "generation", "id", ...details}``.

    >>> Command("abort") is Command.ABORT, Command.STACKS == "stacks"
    (True, True)
    """

    STOP = "stop"  # a running Trainer stops at its next step boundary
    ABORT = "abort"  # abort the process group from the agent's thread (``peers``: where the group listens)
    REGROUP = "regroup"  # an elastic run's new group (``plan``; ``abort``: a rank was lost, abort first)
    FENCE = "fence"  # an engine declared lost (``engines``: [host, pid] each) ends itself
    STACKS = "stacks"  # every thread's stack, sent up under :data:`STACKS` (``request``, ``native``)
    INTERRUPT = "interrupt"  # SIGINT the main thread
    SIGNAL = "signal"  # this process gets signal ``sig`` (ranks the kernel cannot signal by pid)


# How long a rank's py-spy may take for its native frames (it reads libtorch's symbols: seconds on a
# loaded machine); the asking side waits this long on top of the Python stacks.
NATIVE_STACKS_TIMEOUT_S = 20.0
# No honest message comes near this (a beacon is ~300 bytes, a metrics batch at most MAX_ROWS rows):
# the sockets refuse anything larger before it is read into memory (zmq.MAXMSGSIZE), so a flood can
# hold at most a socket's high-water mark times this much.
MAX_BYTES = 64 << 10
MAX_ROWS = 256  # records per metrics message


class BadMessage(ValueError):
    """A side-channel message that is not ours: unsigned, forged, malformed or too large."""


def new_key() -> str:
    """A fresh pool key (hex): the pool's state file (0600) holds it, the ranks get it at join."""
    return secrets.token_hex(32)


class Signer:
    """Signs and checks side-channel messages with one pool's key."""

    def __init__(self, key: str):
        if not key:
            raise ValueError("a side channel needs the pool's key: none was given.")
        self._key = bytes.fromhex(key)

    def _mac(self, topic: bytes, body: bytes) -> bytes:
        return hmac.new(self._key, topic + b"\0" + body, hashlib.sha256).digest()

    def pack(self, topic: bytes, body: bytes) -> list[bytes]:
        """The frames to send for ``body`` under ``topic``."""
        return [topic, body, self._mac(topic, body)]

    def unpack(self, frames: list[bytes]) -> tuple[bytes, bytes]:
        """``(topic, body)`` of a message signed with this key; :class:`BadMessage` otherwise."""
        if len(frames) != 3:
            raise BadMessage(f"expected 3 frames, got {len(frames)}")
        topic, body, mac = frames
        if len(body) > MAX_BYTES:
            raise BadMessage(f"{len(body)} bytes is over the limit of {MAX_BYTES}")
        if not hmac.compare_digest(mac, self._mac(topic, body)):
            raise BadMessage("bad signature")
        return topic, body


def configure(sock) -> None:
    """The socket options every side-channel socket takes: no lingering, no huge messages."""
    import zmq

    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_BYTES + 4096)


def subscriber(ctx, url: str, *topics: bytes, hwm: int = 100_000):
    """A SUB socket on the relay's ``out`` for ``topics``."""
    import zmq

    sock = ctx.socket(zmq.SUB)
    configure(sock)
    sock.setsockopt(zmq.RCVHWM, hwm)
    for topic in topics:
        sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.connect(url)
    return sock


def pusher(ctx, url: str, hwm: int = 1000):
    """A PUSH socket to the relay's ``up``: sends never block once ``hwm`` messages wait (NOBLOCK)."""
    import zmq

    sock = ctx.socket(zmq.PUSH)
    configure(sock)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.connect(url)
    return sock
