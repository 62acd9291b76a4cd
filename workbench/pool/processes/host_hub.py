"""A host's hub: one process on each host (on a local pool, one per group of forks that stands for a host)
between the host's engines and the pool's relay, so that what the kernel receives is per host, not per rank.

The engines of its host send the hub what they would send the relay (:mod:`workbench.engine.hub_link`), and it
sends the relay, signed with the pool's key:

- **beacons** as one table (:data:`~workbench.wire.HOST_BEACONS`): the latest beacon of each rank that said
  something new (a busy rank's, whole, at least every :data:`FULL_BEAT_S`), and the ranks heard, every
  :data:`BUSY_TABLE_S` while one is busy, else every :data:`IDLE_TABLE_S` (the kernel's silence clock of each
  rank moves with the table);
- **metrics** batched (:data:`~workbench.wire.HOST_METRICS`): the ranks' messages as they were, one batch
  :data:`METRICS_S` after a step or an event came, else (device samples only) :data:`DEVICE_METRICS_S` after
  the first;
- **cells** (:data:`~workbench.wire.HOST_CELL`): the host's ranks' lines merged by position
  (:class:`workbench.lines.Merger`: identical lines once, the number spread), their displays, and each rank's
  end (its outcome, traceback, value and its own text, bounded) — all the ends of a cell in one message when
  they come within :data:`DONE_HOLD_S` of each other (a trivial cell: one message per host), at once when a
  rank raised;
- **stacks** as they are (an answer to ``%dist stacks`` names its rank).

Commands come down the other way: the hub subscribes to the relay's commands and publishes each to its
engines, unchanged (each agent checks the signature). Since the hub runs on its host, a host cut off is still
one fault (its ranks all go silent at once) and fencing still holds (a fence reaches the host's engines
through it).

Run by the zygote (a local pool: :func:`serve` in a forked child) or as ``python -m
workbench.pool.processes.host_hub`` with its settings as JSON on stdin (a host reached over ssh).

>>> cells = HostCells("h0", done_hold=10)
>>> for rank in (0, 1):
...     cells.take({"cell": "c", "rank": rank, "kind": "start", "expect": [0, 1], "spread": False, "hold": 9})
...     cells.take({"cell": "c", "rank": rank, "kind": "out", "stream": "stdout", "text": "hi\\n"})
...     cells.take({"cell": "c", "rank": rank, "kind": "done", "status": "ok", "completed": 1.0})
>>> [msg] = cells.tick(now=0.0)
>>> msg["lines"]["stdout"], [d["rank"] for d in msg["done"]], msg["final"]
([[[0, 1], 'hi', []]], [0, 1], True)
"""

from __future__ import annotations

import json
import os
import sys
import time

from workbench import wire
from workbench.cell_output import CellOutput
from workbench.lines import STREAMS, Line, Merger

TICK_S = 0.05  # the hub's pace while a cell runs: merged lines go at most this late
BUSY_TABLE_S = 0.25  # a beacon table this often while a rank of the host is busy (an agent's own pace)
IDLE_TABLE_S = 1.0  # ...and this often between cells (the kernel's silence clock needs one a second)
METRICS_S = 0.1  # metrics batched this long (the publishers' own flush interval)...
# ...where the batch holds steps or events (a loss point for the widget); device samples alone (a rank's one
# a second) wait this long for the host's other ranks' samples: one message a second a host, not one a rank
DEVICE_METRICS_S = 1.0
FULL_BEAT_S = 1.0  # a busy rank's beacon that says nothing new goes whole at most this often (else: heard)
# The ends of a cell's ranks wait this long for the host's other ranks' ends (one message for all of them);
# an error goes at once. WORKBENCH_HUB_DONE_HOLD_S sets it (a test that counts messages holds longer).
DONE_HOLD_S = float(os.environ.get("WORKBENCH_HUB_DONE_HOLD_S", "0.25"))
STALE_CELL_S = 3600.0  # a cell none of whose ranks was heard for this long is forgotten


class _Cell:
    """One cell on this host's ranks."""

    def __init__(self, cell_id: str, expect: list[int], spread: bool, hold: float, now: float,
                 pool: str | None = None):
        self.id = cell_id
        self.expect = tuple(sorted(set(expect)))
        self.lines: dict[str, list[Line]] = {s: [] for s in STREAMS}
        self.merger = Merger({r: (r,) for r in self.expect}, lambda s, line: self.lines[s].append(line),
                             hold=hold, spread_numbers=spread)
        # each rank's text: its first lines shown, then only its last ones kept (the whole in a log beside
        # the pool's, which the notice names), as the kernel keeps a rank's output where there is no hub
        self.output = CellOutput(log_dir=None, pool_id=pool)
        self.displays: list[list] = []
        self.ended: set[int] = set()
        self.done: list[dict] = []
        self.first_done: float | None = None
        self.urgent = False  # a rank raised: what we have goes at once
        self.heard = now

    def out(self, rank: int, stream: str, text: str, now: float) -> None:
        self.output.feed(rank, stream, text)
        for r, kind, shown in self.output.drain():
            self._show(r, kind, shown, now)

    def _show(self, rank: int, stream: str, text: str, now: float) -> None:
        if rank in self.merger.units:
            self.merger.feed(rank, stream, text, now)
        else:  # a rank the cell's start did not name: its lines alone
            self.lines[stream].extend(Line.of(rank, line) for line in text.splitlines())

    def end(self, record: dict, now: float) -> None:
        rank = int(record["rank"])
        for stream in STREAMS:
            record[stream] = self.output.text(rank, stream)
        self.ended.add(rank)
        self.done.append(record)
        if self.first_done is None:
            self.first_done = now
        if record.get("status") != "ok":
            self.urgent = True

    @property
    def final(self) -> bool:
        return self.ended.issuperset(self.expect)

    def message(self, hub: str, now: float, done_hold: float) -> dict | None:
        """What to send now (None: nothing yet)."""
        final = self.final
        if final:  # what is left: the last lines of each rank whose output outgrew its head
            for rank, stream, text in self.output.close():
                self._show(rank, stream, text, now)
            self.merger.close()
        else:
            self.merger.poll(now)
        lines = any(self.lines.values())
        held_done = self.done and not (final or self.urgent or now - self.first_done >= done_hold)
        if not (lines or self.displays or (self.done and not held_done) or final):
            return None
        msg = {"cell": self.id, "hub": hub, "final": final,
               "lines": {s: [line.to_wire() for line in found] for s, found in self.lines.items() if found},
               "displays": self.displays, "done": [] if held_done else self.done}
        self.lines = {s: [] for s in STREAMS}
        self.displays = []
        if not held_done:
            self.done, self.first_done, self.urgent = [], None, False
        return msg


class HostCells:
    """The cells running on this host's ranks, from their ranks' records to the messages for the kernel."""

    def __init__(self, hub: str, done_hold: float = DONE_HOLD_S, pool: str | None = None):
        self.hub, self.pool = hub, pool
        self.done_hold = done_hold
        self.cells: dict[str, _Cell] = {}
        self.sent = 0  # messages made (for tests: one per host for a trivial cell)

    def take(self, record: dict, now: float | None = None) -> None:
        """One record of an engine (see :mod:`workbench.engine.host_cell`); never raises on a bad one."""
        now = time.monotonic() if now is None else now
        try:
            cell_id, rank, kind = str(record["cell"]), int(record["rank"]), record["kind"]
            cell = self.cells.get(cell_id)
            if kind == "start":
                self._moved_on(rank, cell_id)
                if cell is None:
                    cell = self.cells[cell_id] = _Cell(cell_id, [int(r) for r in record["expect"]],
                                                       bool(record.get("spread")), float(record["hold"]), now,
                                                       self.pool)
            if cell is None:
                return  # a record of a cell whose start we never saw (the hub was restarted): the kernel asks
            cell.heard = now
            if kind == "out":
                cell.out(rank, str(record["stream"]), str(record["text"]), now)
            elif kind == "display":
                cell.displays.append([rank, record["content"]])
            elif kind == "done":
                cell.end(record, now)
        except (KeyError, TypeError, ValueError):
            return

    def _moved_on(self, rank: int, cell_id: str) -> None:
        """``rank`` started a new cell: it is done with any older one (whose end the kernel no longer waits
        for: it stopped the cell, or the rank's end was lost)."""
        for other in list(self.cells.values()):
            if other.id != cell_id and rank in other.expect and rank not in other.ended:
                other.ended.add(rank)

    def tick(self, now: float | None = None, only_final: bool = False) -> list[dict]:
        """The messages due now (``only_final``: only cells whose every rank ended: sent at once)."""
        now = time.monotonic() if now is None else now
        out = []
        for cell_id, cell in list(self.cells.items()):
            if only_final and not cell.final:
                continue
            msg = cell.message(self.hub, now, self.done_hold)
            if msg is not None:
                out.append(msg)
            if cell.final or now - cell.heard > STALE_CELL_S:
                del self.cells[cell_id]
        self.sent += len(out)
        return out


class BeaconTable:
    """The latest beacon of each rank of the host, sent as one table (see the module's docstring).

    >>> t = BeaconTable("h0")
    >>> t.take({"rank": 0, "pub": "a", "seq": 1, "busy": False, "t": 1.0}, now=0.0)
    >>> t.take({"rank": 1, "pub": "b", "seq": 1, "busy": False, "t": 1.0}, now=0.0)
    >>> msg = t.table(now=1.0); [b["rank"] for b in msg["beats"]], msg["heard"]
    ([0, 1], [[0, 'a'], [1, 'b']])
    >>> t.take({"rank": 0, "pub": "a", "seq": 2, "busy": False, "t": 2.0}, now=1.1)
    >>> t.table(now=1.2) is None, t.table(now=2.0)["beats"]     # nothing new: only heard, once a second
    (True, [])
    """

    def __init__(self, hub: str):
        self.hub = hub
        self.latest: dict[int, dict] = {}
        self.sent: dict[int, dict] = {}  # what the last table said of each rank
        self.changed: set[int] = set()
        self.heard: set[int] = set()
        self.busy = False
        self.last = -1e9
        self.sent_at: dict[int, float] = {}  # when each rank's beacon last went whole

    def take(self, beat: dict, now: float) -> None:
        rank = int(beat["rank"])
        last = self.latest.get(rank)
        if last is not None and last.get("pub") == beat.get("pub") and int(beat["seq"]) <= int(last["seq"]):
            return
        self.latest[rank] = beat
        self.heard.add((rank, str(beat.get("pub"))))
        before = self.sent.get(rank)
        # a busy rank's beacon that says nothing new (its line, its collective, ... unchanged) goes as heard
        # only (the kernel's silence clock moves as with the whole), and whole once a FULL_BEAT_S: the kernel
        # parses a host's busy table, not each rank's copy of what it already has, four times a second
        if before is None or now - self.sent_at.get(rank, -1e9) >= FULL_BEAT_S and beat.get("busy") or \
                any(v != before.get(k) for k, v in beat.items() if k not in ("t", "seq")):
            self.changed.add(rank)
        self.busy = self.busy or bool(beat.get("busy"))

    def table(self, now: float) -> dict | None:
        """The table due now (None: not yet)."""
        since = now - self.last
        if not ((self.changed and since >= (BUSY_TABLE_S if self.busy else TICK_S)) or
                (self.busy and self.heard and since >= BUSY_TABLE_S) or
                (self.heard and since >= IDLE_TABLE_S)):
            return None
        beats = [self.latest[r] for r in sorted(self.changed)]
        msg = {"hub": self.hub, "beats": beats, "heard": [list(h) for h in sorted(self.heard)]}
        for beat in beats:
            self.sent[int(beat["rank"])] = beat
            self.sent_at[int(beat["rank"])] = now
        self.changed, self.heard, self.busy, self.last = set(), set(), False, now
        return msg


class MetricsBatch:
    """The host's ranks' metrics messages, sent as one batch: :data:`METRICS_S` after a step or an event came
    (a loss point for the live view), else :data:`DEVICE_METRICS_S` after the first device sample.

    >>> b = MetricsBatch()
    >>> b.take(b'{"pub":"a","rank":0,"host":"h","device":[[0,1.0]]}', now=0.0)
    >>> b.due(now=0.5), b.due(now=1.0)
    (False, True)
    >>> b.take(b'{"pub":"a","rank":0,"host":"h","step":[[0,1.0]]}', now=0.6)     # a step: sooner
    >>> b.due(now=0.69), b.due(now=0.7), len(b.parts(max_bytes=1_000)), b.bodies
    (False, True, 1, [])
    """

    def __init__(self):
        self.bodies: list[bytes] = []
        self.due_at = 0.0

    def take(self, body: bytes, now: float) -> None:
        if not self.bodies:
            self.due_at = now + DEVICE_METRICS_S
        if b'"step":' in body or b'"event":' in body:  # wire JSON has no spaces (records.encode)
            self.due_at = min(self.due_at, now + METRICS_S)
        self.bodies.append(body)

    def due(self, now: float) -> bool:
        return bool(self.bodies) and now >= self.due_at - 1e-9

    def parts(self, max_bytes: int) -> list[bytes]:
        """The batch as newline-joined messages of at most ``max_bytes`` each (a message larger alone);
        emptied."""
        out, batch, size = [], [], 0
        for body in self.bodies:  # newline-joined JSON messages (JSON has no raw newline)
            if batch and size + len(body) > max_bytes:
                out.append(b"\n".join(batch))
                batch, size = [], 0
            batch.append(body)
            size += len(body) + 1
        if batch:
            out.append(b"\n".join(batch))
        self.bodies = []
        return out


class Hub:
    """The hub's sockets and loop (see the module's docstring). ``settings``: ``label``, ``up`` and ``out``
    (the endpoints it binds for its engines), ``relay`` (the pool's channel: ``up``, ``out``, ``key``),
    ``pool`` (its id, in the name of a cell's output log)."""

    def __init__(self, settings: dict):
        import zmq

        self.label = str(settings["label"])
        relay = settings["relay"]
        self.signer = wire.Signer(relay["key"])
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        wire.configure(self.inbox)
        self.inbox.setsockopt(zmq.RCVHWM, 100_000)
        self.inbox.bind(settings["up"])
        self.to_engines = self.ctx.socket(zmq.PUB)
        wire.configure(self.to_engines)
        self.to_engines.bind(settings["out"])
        self.to_relay = wire.pusher(self.ctx, relay["up"], hwm=10_000)
        self.commands = wire.subscriber(self.ctx, relay["out"], wire.COMMAND)
        self.cells = HostCells(self.label, pool=settings.get("pool"))
        self.beacons = BeaconTable(self.label)
        self.metrics = MetricsBatch()
        self.joiner = wire.Joiner()
        self.dropped = 0

    def serve(self, stop=lambda: False) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        poller.register(self.commands, zmq.POLLIN)
        while not stop():
            ready = dict(poller.poll(int(TICK_S * 1000) if self.cells.cells or self.metrics.bodies else
                                     int(IDLE_TABLE_S * 1000 / 4)))
            now = time.monotonic()
            if self.commands in ready:
                while self.commands.poll(0):
                    self.to_engines.send_multipart(self.commands.recv_multipart())
            if self.inbox in ready:
                for _ in range(10_000):
                    try:
                        frames = self.inbox.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.take(frames, now)
                for msg in self.cells.tick(now, only_final=True):  # a cell's last end: at once
                    self.send_up(wire.HOST_CELL, json.dumps(msg).encode())
            self.tick(now)

    def take(self, frames: list[bytes], now: float) -> None:
        try:
            topic, body = self.signer.unpack(frames)
            if topic == wire.STACKS:
                self.to_relay.send_multipart(frames)  # as it was: it names its rank
            elif topic == wire.METRICS:
                self.metrics.take(body, now)
            elif topic == wire.BEACON:
                self.beacons.take(json.loads(body), now)
            elif topic == wire.CELL_RECORD:
                whole = self.joiner.take(body)
                if whole is not None:
                    self.cells.take(json.loads(whole), now)
            else:
                self.dropped += 1
        except (wire.BadMessage, ValueError, KeyError, TypeError):
            self.dropped += 1

    def tick(self, now: float) -> None:
        for msg in self.cells.tick(now):
            self.send_up(wire.HOST_CELL, json.dumps(msg).encode())
        table = self.beacons.table(now)
        if table is not None:
            self.send_up(wire.HOST_BEACONS, json.dumps(table).encode())
        if self.metrics.due(now):
            for part in self.metrics.parts(wire.PART_BYTES):
                self.send_up(wire.HOST_METRICS, part)

    def send_up(self, topic: bytes, body: bytes) -> None:
        import zmq

        for part in wire.split(body):
            try:
                self.to_relay.send_multipart(self.signer.pack(topic, part), zmq.NOBLOCK)
            except zmq.Again:  # the relay is gone: the pool is stopping
                return

    def close(self) -> None:
        for sock in (self.inbox, self.to_engines, self.to_relay, self.commands):
            sock.close(0)
        self.ctx.term()


def serve(settings: dict) -> None:
    """Run a hub until the process ends (the pool's stop, or its zygote's end, ends it)."""
    hub = Hub(settings)
    try:
        hub.serve()
    finally:
        hub.close()


if __name__ == "__main__":
    serve(json.loads(sys.stdin.readline()))
