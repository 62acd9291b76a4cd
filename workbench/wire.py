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
# A host's hub (workbench.pool.processes.host_hub) stands between its engines and the relay: the engines send
# it what they would send the relay, and it sends the relay one message per host for many of theirs. No topic
# below begins with one above (a subscription is a prefix).
CELL_RECORD = b"cellrec"  # engine -> its hub only: a cell's start, output, display or end on one rank
HOST_BEACONS = b"hostbeat"  # hub -> relay: the latest beacons of the host's ranks, one table
HOST_METRICS = b"hostmetrics"  # hub -> relay: the host's ranks' metrics messages, batched
HOST_CELL = b"hostcell"  # hub -> relay: a cell's output (merged over the host's ranks) and its ranks' ends
# How an engine finds its host's hub (the launcher sets these where the host has one): its label, and the
# hub's two sockets, which take the relay's place for the engine (``up``: what the engine sends; ``out``:
# the commands it receives).
HUB_ENV, HUB_UP_ENV, HUB_OUT_ENV = "WORKBENCH_HUB", "WORKBENCH_HUB_UP", "WORKBENCH_HUB_OUT"
# WORKBENCH_FANOUT in the kernel's environment: "1", requests once per host and replies merged per host (hubs,
# broadcast requests); "0", every request once a rank and every reply per rank, as before issue 42 (the way
# back, and the bench's "before"). Unset: FANOUT_DEFAULT.
FANOUT_ENV = "WORKBENCH_FANOUT"
FANOUT_DEFAULT = "0"


def fanout(env=None) -> bool:
    """Whether requests fan out per host and replies come merged (see :data:`FANOUT_ENV`).

    >>> fanout({"WORKBENCH_FANOUT": "1"}), fanout({"WORKBENCH_FANOUT": "0"})
    (True, False)
    >>> fanout({}) == (FANOUT_DEFAULT == "1")
    True
    """
    import os

    return (os.environ if env is None else env).get(FANOUT_ENV, FANOUT_DEFAULT) != "0"


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
    CHECKPOINT = "checkpoint"  # a running Trainer's Checkpoint callback saves at its next step (``reason``)


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


def receive(ctx, sock, stopped, take) -> None:
    """A receiver's loop: each message of ``sock`` to ``take(frames)`` until ``stopped.is_set()`` (checked
    every 0.1 s); then ``sock`` and ``ctx`` are closed."""
    import zmq

    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    try:
        while not stopped.is_set():
            if poller.poll(100):
                while sock.poll(0):
                    take(sock.recv_multipart())
    finally:
        sock.close(0)
        ctx.term()


PART = b"\x01"  # a body that begins so is one part of a body too large for one message (JSON never does)
PART_BYTES = MAX_BYTES - 1024  # a part's share of the body: with its header, a message stays under the limit


def split(body: bytes, limit: int = PART_BYTES) -> list[bytes]:
    """``body`` as the bodies of the messages that carry it: itself when it fits, else parts that
    :class:`Joiner` puts together again (a display of a large figure, a long traceback).

    >>> split(b'{"a": 1}')
    [b'{"a": 1}']
    >>> parts = split(b"x" * 10, limit=4); len(parts), parts[0][:1] == PART
    (3, True)
    >>> j = Joiner(); [j.take(p) for p in parts][-1]
    b'xxxxxxxxxx'
    """
    if len(body) <= limit:
        return [body]
    name = secrets.token_hex(6)
    chunks = [body[i:i + limit] for i in range(0, len(body), limit)]
    return [PART + f"{name} {i} {len(chunks)}\n".encode() + chunk for i, chunk in enumerate(chunks)]


class Joiner:
    """Puts the parts of :func:`split` together again: :meth:`take` returns each whole body once (a body that
    was not split at once). Bodies left incomplete (a sender that died between its parts) are forgotten, the
    oldest first, beyond ``keep`` of them."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self._parts: dict[str, dict[int, bytes]] = {}

    def take(self, body: bytes) -> bytes | None:
        if not body.startswith(PART):
            return body
        try:
            head, chunk = body[1:].split(b"\n", 1)
            name, index, count = head.decode().split()
            index, count = int(index), int(count)
        except ValueError:
            raise BadMessage("a malformed part") from None
        got = self._parts.setdefault(name, {})
        got[index] = chunk
        while len(self._parts) > self.keep:
            self._parts.pop(next(iter(self._parts)))
        if len(got) < count:
            return None
        self._parts.pop(name, None)
        return b"".join(got[i] for i in range(count))
