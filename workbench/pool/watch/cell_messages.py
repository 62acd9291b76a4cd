"""Kernel side of the hosts' cell messages: each host's hub sends, per cell, its ranks' lines merged, their
displays and their ends (:mod:`workbench.pool.processes.host_hub`); this receiver hands each message to
whoever listens for that cell.

One thread, one socket on the relay's ``out`` (topic :data:`~workbench.wire.HOST_CELL`); messages not signed
with the pool's key are dropped and counted. It also counts, per cell, the messages of each host (a trivial
cell: one per host; the tests hold that).

>>> rx = CellMessages(pool.channel)                               # doctest: +SKIP
>>> rx.listen("c1", print)                                        # doctest: +SKIP
{'cell': 'c1', 'hub': 'h0', 'final': True, 'lines': {}, 'displays': [], 'done': [...]}
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable

import zmq

from workbench import wire

log = logging.getLogger(__name__)
COUNTED = 256  # cells whose messages per host are kept counted (the newest)


class CellMessages:
    """Subscribes to the hosts' cell messages of the pool on ``channel`` and dispatches them by cell."""

    def __init__(self, channel: dict):
        self._signer = wire.Signer(channel["key"])
        self._ctx = zmq.Context()
        self._sock = wire.subscriber(self._ctx, channel["out"], wire.HOST_CELL)
        self._joiner = wire.Joiner()
        self._listeners: dict[str, Callable[[dict], None]] = {}
        self._lock = threading.Lock()
        self.bad = 0
        self.counts: collections.OrderedDict[str, collections.Counter] = collections.OrderedDict()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-cells", daemon=True)
        self._thread.start()

    def listen(self, cell_id: str, fn: Callable[[dict], None]) -> None:
        """Call ``fn(message)`` (from this receiver's thread) for each host's message of cell ``cell_id``."""
        with self._lock:
            self._listeners[cell_id] = fn

    def forget(self, cell_id: str) -> None:
        with self._lock:
            self._listeners.pop(cell_id, None)

    def _loop(self) -> None:
        wire.receive(self._ctx, self._sock, self._stop, self.take)

    def take(self, frames: list[bytes]) -> None:
        """One message (or one part of one); never raises."""
        try:
            _, body = self._signer.unpack(frames)
            whole = self._joiner.take(body)
            if whole is None:
                return
            msg = json.loads(whole)
            cell_id, hub = str(msg["cell"]), str(msg["hub"])
        except (wire.BadMessage, ValueError, KeyError, TypeError):
            self.bad += 1
            return
        with self._lock:
            counted = self.counts.setdefault(cell_id, collections.Counter())
            counted[hub] += 1
            while len(self.counts) > COUNTED:
                self.counts.popitem(last=False)
            fn = self._listeners.get(cell_id)
        if fn is not None:
            try:
                fn(msg)
            except Exception:  # a listener's bug must not stop the receiver
                log.exception("a cell's listener failed on a host's message")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
