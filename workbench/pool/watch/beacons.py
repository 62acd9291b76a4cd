"""Kernel side of the beacons: the latest state of every rank, and who went silent.

Every session of a pool (the one that started it, attached ones) subscribes to the pool's relay and
keeps what the ranks last said. Beacons not signed with the pool's key are dropped and counted. A host with a
hub (:mod:`workbench.pool.processes.host_hub`) sends its ranks' beacons as one table: the beacons that said
something new, and which ranks were heard (their silence clocks start again).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import zmq

from workbench import wire

# A fenced engine that is heard again is told so at most this often (it stops itself at the first).
FENCE_EVERY_S = 0.5


class BeaconReceiver:
    """Subscribes to the beacons on the relay's ``out`` and keeps each rank's latest one.

    >>> rx = BeaconReceiver(channel)         # doctest: +SKIP
    >>> rx.latest[0]["inflight"]             # doctest: +SKIP
    'all_reduce'
    """

    def __init__(self, channel: dict, on_fenced: Callable[[str, int], None] = lambda host, pid: None):
        self._signer = wire.Signer(channel["key"])
        self._ctx = zmq.Context()
        self._sock = wire.subscriber(self._ctx, channel["out"], wire.BEACON, wire.HOST_BEACONS)
        self.tables = 0  # hosts' tables taken (each stands for many beacons)
        self.latest: dict[int, dict] = {}
        self.seen: dict[int, float] = {}  # kernel clock, so skew across nodes does not matter
        self.trainers: set[int] = set()  # ranks whose latest beacon shows a Trainer running (O(1) to ask)
        self.bad = 0  # messages dropped: forged, malformed or too large
        self._last: dict[int, tuple[str, int]] = {}  # rank -> (publisher, sequence) of its newest beacon
        self._generation: dict[int, int] = {}  # rank -> the newest process group a beacon of it came from
        # engines an elastic run declared lost, (host, pid) -> when last heard: their beacons are refused,
        # and each time one is heard (at most every FENCE_EVERY_S) ``on_fenced(host, pid)`` is called
        self.fenced: dict[tuple[str, int], float] = {}
        self.on_fenced = on_fenced
        self._fence_told: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-beacons", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        wire.receive(self._ctx, self._sock, self._stop, self.take)

    def take(self, frames: list[bytes]) -> bool:
        """Keep one beacon message (or a host's table of them) if it is signed and newer than the rank's
        last; never raises."""
        try:
            topic, body = self._signer.unpack(frames)
            found = json.loads(body)
            if topic == wire.HOST_BEACONS:
                return self._take_table(found)
        except (wire.BadMessage, ValueError, KeyError, TypeError, AttributeError):
            self.bad += 1
            return False
        return self._take_beat(found)

    def _take_table(self, table: dict) -> bool:
        self.tables += 1
        kept = [self._take_beat(beat) for beat in table["beats"]]
        now = time.monotonic()
        for rank, pub in table["heard"]:  # heard, saying nothing new: alive (the engine whose beats we keep)
            last = self._last.get(int(rank))
            if last is not None and last[0] == pub:
                self.seen[int(rank)] = now
        return any(kept)

    def _take_beat(self, beat: dict) -> bool:
        try:
            rank, pub, seq = int(beat["rank"]), str(beat["pub"]), int(beat["seq"])
            generation = int(beat.get("generation", 0))
        except (ValueError, KeyError, TypeError, AttributeError):
            self.bad += 1
            return False
        engine = (str(beat.get("host")), int(beat.get("pid", -1)))
        if engine in self.fenced:
            self._heard_fenced(engine)
            return False
        last = self._last.get(rank)
        if last is not None and last[0] == pub and seq <= last[1]:
            return False  # a replay or a reordering: older than what we have
        if generation < self._generation.get(rank, generation):
            return False  # an elastic regroup renumbered the ranks: this engine had that number before
        self._last[rank], self._generation[rank] = (pub, seq), generation
        self.latest[rank] = beat
        self.seen[rank] = time.monotonic()
        if (beat.get("trainer") or {}).get("running"):
            self.trainers.add(rank)
        else:
            self.trainers.discard(rank)
        return True

    def _heard_fenced(self, engine: tuple[str, int]) -> None:
        now = time.monotonic()
        self.fenced[engine] = now
        if now - self._fence_told.get(engine, -FENCE_EVERY_S) >= FENCE_EVERY_S:
            self._fence_told[engine] = now
            try:
                self.on_fenced(*engine)
            except Exception:  # the pool is stopping: the command has nowhere to go
                pass

    def fence(self, engines) -> None:
        """Refuse the beacons of ``engines`` (``[host, pid]`` each) from now on, and tell each one it is
        fenced whenever it is heard (its link came back: it stops itself)."""
        for host, pid in engines:
            self.fenced.setdefault((str(host), int(pid)), 0.0)

    def heard_since_fenced(self, host: str, pid: int) -> float | None:
        """Seconds since a fenced engine was last heard (None: never since it was fenced)."""
        last = self.fenced.get((host, pid))
        return None if not last else time.monotonic() - last

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


class NullBeacons:
    """The receiver of a pool without a side channel: no beacon ever comes, and no rank counts as silent
    (only its process's exit says it died). What :class:`BeaconReceiver` offers, with nothing in it.

    >>> nb = NullBeacons()
    >>> nb.latest, nb.trainers, nb.silent_for(0), nb.heard_since_fenced("h", 1)
    ({}, set(), 0.0, None)
    """

    def __init__(self):
        self.latest: dict[int, dict] = {}
        self.seen: dict[int, float] = {}
        self.trainers: set[int] = set()
        self.fenced: dict[tuple[str, int], float] = {}
        self.bad = 0

    def fence(self, engines) -> None:
        """Nothing is heard, so nothing is refused."""

    def heard_since_fenced(self, host: str, pid: int) -> float | None:
        return None

    def expect(self, ranks) -> None:
        """No beacon is on its way."""

    def silent_for(self, rank: int) -> float:
        return 0.0

    def close(self) -> None:
        """Nothing to close."""
