"""Kernel side of the beacons: the latest state of every rank, and who went silent."""

from __future__ import annotations

import json
import threading
import time

import zmq


class BeaconReceiver:
    """Binds a PULL socket on ``address`` and keeps each rank's latest beacon.

    >>> rx = BeaconReceiver("127.0.0.1")    # doctest: +SKIP
    >>> rx.url                              # doctest: +SKIP
    'tcp://127.0.0.1:51234'
    """

    def __init__(self, address: str = "127.0.0.1"):
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port(f"tcp://{address}")
        self.url = f"tcp://{address}:{port}"
        self.latest: dict[int, dict] = {}
        self.seen: dict[int, float] = {}  # kernel clock, so skew across nodes does not matter
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-beacons", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                beat = json.loads(self._sock.recv())
                self.latest[beat["rank"]] = beat
                self.seen[beat["rank"]] = time.monotonic()
        self._sock.close()

    def expect(self, ranks) -> None:
        """Start each rank's silence clock now (a group was just formed: beacons are on their way)."""
        now = time.monotonic()
        for rank in ranks:
            self.seen[rank] = now

    def silent_for(self, rank: int) -> float:
        """Seconds since the last beacon of ``rank`` (infinite if none came)."""
        seen = self.seen.get(rank)
        return float("inf") if seen is None else time.monotonic() - seen

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
