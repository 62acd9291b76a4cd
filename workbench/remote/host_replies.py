"""A cell sent once to every rank whose replies come merged per host: what the kernel holds while it runs.

:meth:`Door.start_cell <workbench.remote.door.Door.start_cell>` sends a cell to ranks whose hosts have hubs as
one broadcast call (ipyparallel's ``BroadcastView``, coalescing: one request from the kernel, one reply for
all ranks) of :func:`workbench.remote.run_cell`; each host's hub then sends its ranks' merged lines, displays
and ends (:mod:`workbench.pool.processes.host_hub`). A :class:`HostCell` takes those messages and offers what
the cell's wait loop (:class:`~workbench.session.cell_run.CellRun`) reads of ipyparallel's own
``AsyncResult``: the engines it went to (``_targets``) and a reply per rank (``_children``,
:class:`HostReply`) whose ``output.metadata`` holds the rank's error, value, displays, text and end time, set
once its end came. The hosts' merged lines wait in :attr:`HostCell.lines` for the wait loop to hand on.

>>> from workbench.pool.rankmap import RankInfo
>>> a, b = RankInfo(0, 0, 0, "vm", 10, "cpu", 5, hub="h0"), RankInfo(1, 1, 0, "vm", 11, "cpu", 6, hub="h0")
>>> cell = HostCell("c1", [a, b])
>>> cell.take({"cell": "c1", "hub": "h0", "final": True, "lines": {"stdout": [[[0, 1], "hi", []]]},
...            "displays": [], "done": [{"rank": 0, "status": "ok", "completed": 2.0, "stdout": "hi\\n"},
...                                     {"rank": 1, "status": "error", "ename": "ValueError", "evalue": "x",
...                                      "traceback": ["ValueError: x"], "completed": 2.5}]})
>>> cell.done(), cell._children[0].output.metadata["stdout"], cell._children[1].output.metadata["error"].ename
(True, 'hi\\n', 'ValueError')
>>> [(hub, stream, [line.text() for line in lines]) for hub, stream, lines in cell.drain_lines()]
[('h0', 'stdout', ['hi'])]
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime

from ipyparallel.error import RemoteError

from workbench.lines import Line
from workbench.pool.rankmap import RankInfo


class HostReply:
    """One rank's part of a :class:`HostCell`, read as ipyparallel's reply of one engine is read."""

    def __init__(self, engine_id: int):
        self.engine_id = engine_id
        self.output: Future = Future()  # set once the rank's end came; its ``metadata`` as ipyparallel's
        self.output.metadata = {"error": None, "completed": None, "started": None, "outputs": [],
                                "execute_result": None, "stdout": "", "stderr": ""}
        self.iopub_callbacks: list[Callable[[dict], None]] = []  # ipyparallel's; nothing comes per rank here

    def done(self) -> bool:
        return self.output.done()

    def exception(self):
        return None

    def end(self, record: dict) -> None:
        """The rank's end (a hub's ``done`` record)."""
        md = self.output.metadata
        md["started"] = _when(record.get("started"))
        md["completed"] = _when(record.get("completed"))
        md["stdout"], md["stderr"] = record.get("stdout", ""), record.get("stderr", "")
        if record.get("result"):
            md["execute_result"] = {"data": record["result"]}
        if record.get("status") != "ok":
            md["error"] = RemoteError(record.get("ename", "Error"), record.get("evalue", ""),
                                      "\n".join(record.get("traceback") or []),
                                      {"engine_id": self.engine_id, "method": "execute"})
        if not self.output.done():
            self.output.set_result(None)


def _when(seconds) -> datetime | None:
    """An engine's time as ipyparallel reports it (an aware datetime)."""
    return datetime.fromtimestamp(seconds).astimezone() if seconds else None


class HostCell:
    """A cell on ``targets`` whose output and ends come from their hosts' hubs (see the module's text)."""

    def __init__(self, cell_id: str, targets: list[RankInfo]):
        self.id = cell_id
        self.targets = list(targets)
        self._targets = [t.engine_id for t in targets]
        self._children = [HostReply(t.engine_id) for t in targets]
        self._by_rank = {t.rank: child for t, child in zip(targets, self._children, strict=True)}
        # the ranks whose end has not come, and the ranks whose end was an error, in the order they came:
        # the wait loop asks these at every wake-up, never each rank's reply (what it does per tick does not
        # grow with the ranks)
        self._waiting = set(self._by_rank)
        self.errored: list[HostReply] = []
        self.ar = None  # the broadcast call itself (attach): its reply says every rank has left the cell
        self.lines: list[tuple[str, str, list[Line]]] = []  # (hub, stream, merged lines) not yet handed on
        self.displays: list[tuple[int, dict]] = []  # (rank, display) not yet handed on
        self._lock = threading.Lock()
        self._wakers: list[Callable[[], None]] = []
        self._when_done: list[Callable] = []

    def take(self, msg: dict) -> None:
        """A host's message for this cell (from the receiver's thread)."""
        with self._lock:
            for stream, found in (msg.get("lines") or {}).items():
                self.lines.append((msg["hub"], stream, [Line.from_wire(line) for line in found]))
            for rank, content in msg.get("displays") or []:
                child = self._by_rank.get(int(rank))
                if child is not None:
                    child.output.metadata["outputs"].append(content)
                    self.displays.append((int(rank), content))
            for record in msg.get("done") or []:
                rank = int(record["rank"])
                child = self._by_rank.get(rank)
                if child is not None:
                    first = not child.done()
                    child.end(record)
                    self._waiting.discard(rank)
                    if first and child.output.metadata["error"] is not None:
                        self.errored.append(child)
            wakers = list(self._wakers)
            finished = self.done() and self._when_done
            callbacks, self._when_done = (self._when_done, []) if finished else ([], self._when_done)
        for wake in wakers:
            wake()
        for fn in callbacks:
            fn(self)

    def attach(self, ar) -> None:
        """The broadcast call that runs the cell (ipyparallel's ``AsyncResult``): once every rank replied to
        it, each rank's main thread has left the cell (a rank's end comes a moment before: the wait loop is
        woken again then)."""
        self.ar = ar
        ar.add_done_callback(lambda _: [wake() for wake in list(self._wakers)])

    def settled(self) -> bool:
        """Every rank replied to the broadcast call: its engine is idle again."""
        return self.ar is None or self.ar.done()

    def done(self) -> bool:
        return not self._waiting

    def waiting(self) -> set[int]:
        """The ranks whose end has not come yet."""
        return self._waiting

    def on_message(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` whenever a host's message came (the wait loop's wake-up)."""
        self._wakers.append(fn)

    def add_done_callback(self, fn: Callable) -> None:
        """``fn(self)`` once every rank's end came (at once if they have)."""
        with self._lock:
            if not self.done():
                self._when_done.append(fn)
                return
        fn(self)

    def drain_lines(self) -> list[tuple[str, str, list[Line]]]:
        with self._lock:
            lines, self.lines = self.lines, []
        return lines

    def drain_displays(self) -> list[tuple[int, dict]]:
        with self._lock:
            displays, self.displays = self.displays, []
        return displays
