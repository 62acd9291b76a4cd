"""Kernel side: receive every rank's metrics and keep the complete history.

The :class:`Collector` subscribes to the pool's relay and reads it on its own thread, so
records arrive while a cell runs and between cells. Each record carries a sequence number per
(rank, stream): a duplicate is dropped, a gap is counted in ``stats["missing"]`` — nothing is
lost silently. Series are bounded (:class:`workbench.metrics.history.Series` downsamples long
runs). A rank whose records stop never makes the kernel raise; it shows as ``stalled`` or
``lost`` in :meth:`Collector.status`.

Runs: each rank numbers its own runs (1, 2, ...); the collector joins the ranks' run starts into
one run (id 1, 2, ...): a rank's run start joins the newest run if that rank is not in it yet
and it began within ``JOIN_WINDOW_S``, else it opens a new run.

Imports no torch.

>>> c = Collector(pool.channel)          # doctest: +SKIP
>>> c.history().dataframe()              # doctest: +SKIP
>>> c.close()                            # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench import faults
from workbench.metrics import records
from workbench.metrics.history import History, Series

log = logging.getLogger(__name__)

JOIN_WINDOW_S = 30.0


@dataclass
class Run:
    """One training run across ranks (kernel-side id, 1-based)."""

    id: int
    started: float  # engine wall clock of the first rank's run_start
    ranks: set = field(default_factory=set)
    ended: set = field(default_factory=set)
    failed: set = field(default_factory=set)
    details: dict = field(default_factory=dict)
    interrupted: set = field(default_factory=set)  # ranks whose run ended on Ctrl-C (or a stop)
    errors: dict = field(default_factory=dict)  # rank -> why it failed, in the order they came
    echoes: dict = field(default_factory=dict)  # rank -> an error caused by another rank (closed peer, abort)
    root: int | None = None  # the rank the kernel named first: the root cause

    @property
    def done(self) -> bool:
        return bool(self.ranks) and self.ranks <= (self.ended | self.failed)

    def add_error(self, rank: int, text: str) -> None:
        """A rank's run ended on ``text`` ("Type: message"); an echo of another rank's failure (a closed
        connection, an abort, a collective's timeout) is kept apart: it is never the root cause."""
        ename, _, evalue = text.partition(": ")
        (self.echoes if faults.is_secondary(ename, evalue) else self.errors).setdefault(rank, text)

    @property
    def state(self) -> str:
        """``training``, ``finished``, ``interrupted``, or ``failed`` (as soon as one rank failed).

        Ranks stopped by an interrupt raise echoes (an abort, a closed peer): with an interrupt and
        no error of its own, a run was interrupted.

        >>> run = Run(1, 0.0, ranks={0, 1}, ended={0, 1}, interrupted={1})
        >>> run.add_error(0, "DistBackendError: Connection closed by peer")
        >>> run.state
        'interrupted'
        """
        if self.errors or (self.echoes and not self.interrupted):
            return "failed"
        if not self.done:
            return "training"
        return "interrupted" if self.interrupted else "finished"

    @property
    def reason(self) -> str | None:
        """Why the run failed: the root cause's rank and error (else the first to come), or None.

        >>> Run(1, 0.0, errors={1: "ValueError: bad batch"}).reason
        'rank 1: ValueError: bad batch'
        """
        errors = self.errors or self.echoes
        if not errors:
            return None
        rank = self.root if self.root in errors else next(iter(errors))
        return f"rank {rank}: {errors[rank]}"


@dataclass
class RankState:
    """What the collector knows about one rank."""

    rank: int
    host: str = ""
    info: dict = field(default_factory=dict)
    pub: str = ""
    expected: dict = field(default_factory=dict)  # stream -> next sequence number
    local_runs: dict = field(default_factory=dict)  # the rank's own run number -> Run id
    last_seen: float = 0.0  # kernel monotonic clock
    last_step: float = 0.0
    step_time: float = 0.0
    run: int | None = None  # the Run id this rank is in and has not ended
    failed: str | None = None


class Collector:
    """Receives metric records from every rank's publisher, through the pool's relay.

    ``channel``: the pool's side channel (``{"out": url, "key": hex}``); messages not signed with
    its key are dropped and counted in ``stats["bad_messages"]``. Without a channel nothing is
    received (records come in through :meth:`ingest`). ``capacity``: points kept per series (per
    rank per run for steps, per rank for device samples) before the older half is downsampled.
    ``stall_after``: seconds without a step in a running run before a rank shows ``stalled``.
    ``lost_after``: seconds without any record (device samples come every second) before a rank
    shows ``lost``.
    """

    def __init__(self, channel: dict | None = None, *, capacity: int = 8192,
                 stall_after: float = 10.0, lost_after: float = 5.0):
        self.capacity = capacity
        self.stall_after = stall_after
        self.lost_after = lost_after
        self.channel = channel
        self.ranks: dict[int, RankState] = {}
        self.runs: list[Run] = []
        self._mesh_of: dict[int, str] = {}  # a split pool: rank -> its sub-mesh (runs never span two)
        self.steps: dict[tuple[int, int], Series] = {}  # (run id, rank) -> series
        self.devices: dict[int, Series] = {}
        self.events: list[dict] = []
        self.stats = {"messages": 0, "step": 0, "device": 0, "event": 0, "duplicates": 0, "missing": 0,
                      "bad_messages": 0}
        self.gaps: list[tuple] = []  # (rank, stream, first missing seq, next seq received)
        self.version = 0
        self._cv = threading.Condition(threading.RLock())
        self._listeners: list[Callable] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-collector", daemon=True)
        self._thread.start()

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Stop receiving and close the socket; the history stays readable."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(5)
        with self._cv:
            self._cv.notify_all()

    def set_ranks(self, ranks) -> None:
        """Tell the collector the pool's ranks (``RankInfo`` list): host and device before any record."""
        with self._cv:
            for r in ranks:
                st = self._rank(r.rank)
                st.host = st.host or r.host
                st.info.setdefault("device", r.device)
                st.last_seen = st.last_seen or time.monotonic()
            self.version += 1  # a view that shows hosts and devices shows these

    def set_meshes(self, meshes: dict[str, list[int]]) -> None:
        """Tell the collector the pool's sub-meshes (name -> ranks; ``{}``: not split): a run that starts on
        one joins no run of another, so two trainings side by side are two runs (docs/submeshes.md)."""
        with self._cv:
            self._mesh_of = {rank: name for name, ranks in meshes.items() for rank in ranks}

    def add_listener(self, fn: Callable[[Collector, list[dict]], None]) -> None:
        """Call ``fn(collector, events)`` on the receiver thread after each message (events may be [])."""
        with self._cv:
            self._listeners.append(fn)

    def remove_listener(self, fn) -> None:
        with self._cv:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def wait_for(self, predicate: Callable[[Collector], bool], timeout: float) -> bool:
        """Block until ``predicate(self)`` holds (checked after each message); False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: predicate(self) or self.closed, timeout) and predicate(self)

    # -- receiving -------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.channel is None:
            return
        import zmq

        from workbench import wire

        signer = wire.Signer(self.channel["key"])
        ctx = zmq.Context()
        sock = wire.subscriber(ctx, self.channel["out"], wire.METRICS, wire.HOST_METRICS)

        def take(frames: list[bytes]) -> None:
            try:
                topic, data = signer.unpack(frames)
            except wire.BadMessage as exc:
                with self._cv:
                    self.stats["bad_messages"] += 1
                log.debug("dropped a message that is not this pool's: %s", exc)
                return
            # a host's hub batches its ranks' messages, one a line (JSON holds no raw newline): taken as
            # one (one lock, one wake-up of the waiting views, the listeners once), not once a rank
            self.ingest_many(data.split(b"\n") if topic == wire.HOST_METRICS else [data])

        wire.receive(ctx, sock, self._closed, take)

    def ingest(self, data: bytes, now: float | None = None) -> list[dict]:
        """Take one wire message; returns its new events. Never raises on a bad message."""
        return self.ingest_many([data], now)

    def ingest_many(self, batch: list[bytes], now: float | None = None) -> list[dict]:
        """Take wire messages that came together (a host's batch); returns their new events, in order.
        Never raises on a bad message (it is counted, the others are taken)."""
        msgs = []
        for data in batch:
            try:
                msgs.append(records.decode(data))
            except Exception as exc:
                with self._cv:
                    self.stats["bad_messages"] += 1
                log.debug("dropped a message that is not a metrics message: %s", exc)
        if not msgs:
            return []
        now = time.monotonic() if now is None else now
        with self._cv:
            new_events = [event for msg in msgs for event in self._ingest(msg, now)]
            self.version += 1
            listeners = list(self._listeners)
            self._cv.notify_all()
        for fn in listeners:
            try:
                fn(self, new_events)
            except Exception:
                log.exception("a metrics listener failed")
        return new_events

    def _rank(self, rank: int) -> RankState:
        st = self.ranks.get(rank)
        if st is None:
            st = self.ranks[rank] = RankState(rank)
        return st

    def _fresh(self, st: RankState, stream: str, rows: list) -> list:
        """Rows whose sequence number is new, in order; duplicates dropped, gaps counted."""
        if not rows:
            return []
        out = []
        # a publisher's first record sets the count going (not a message without one): a session that
        # attached later missed the records before it, which is not a loss
        expected = st.expected.get(stream, int(rows[0][0]))
        for row in rows:
            seq = int(row[0])
            if seq < expected:
                self.stats["duplicates"] += 1
                continue
            if seq > expected:
                self.stats["missing"] += seq - expected
                self.gaps.append((st.rank, stream, expected, seq))
            expected = seq + 1
            out.append(row)
        st.expected[stream] = expected
        return out

    def _ingest(self, msg: dict, now: float) -> list[dict]:
        self.stats["messages"] += 1
        st = self._rank(msg["rank"])
        if msg["pub"] != st.pub:  # a new publisher (engine restarted or reconnected): fresh numbering
            st.pub = msg["pub"]
            st.expected = {}
            st.local_runs = {}
        st.host = msg["host"]
        if "info" in msg:
            st.info.update(msg["info"])
        st.last_seen = now
        new_events = []
        for seq, t, name, details in self._fresh(st, "event", msg["event"]):
            details = details if isinstance(details, dict) else {}
            run = None
            if name in ("run_start", "run_end") and "run" in details:
                run = self._run_for(st, int(details["run"]), t, start=name == "run_start")
                if name == "run_start":
                    st.run, st.failed, st.last_step = run.id, None, now
                    run.details.update({k: v for k, v in details.items() if k != "run"})
                else:
                    run.ended.add(st.rank)
                    if details.get("interrupted"):
                        run.interrupted.add(st.rank)
                    if details.get("error"):
                        run.add_error(st.rank, str(details["error"]))
                    if st.run == run.id:
                        st.run = None
            # an event inside a run (a regroup) belongs to the run the rank is in
            event = {"rank": st.rank, "host": st.host, "seq": seq, "t": t, "event": name,
                     "run": run.id if run else st.run, **{k: v for k, v in details.items() if k != "run"}}
            self.events.append(event)
            new_events.append(event)
            self.stats["event"] += 1
        for row in self._fresh(st, "step", msg["step"]):
            values = row[1:]
            run = self._run_for(st, int(values[1]), values[0], start=False)
            series = self.steps.get((run.id, st.rank))
            if series is None:
                series = self.steps[(run.id, st.rank)] = Series(records.STEP_FIELDS, self.capacity)
            series.append(row[0], values)
            st.last_step = now
            st.step_time = values[7] if values[7] == values[7] else st.step_time
            self.stats["step"] += 1
        for row in self._fresh(st, "device", msg["device"]):
            series = self.devices.get(st.rank)
            if series is None:
                series = self.devices[st.rank] = Series(records.DEVICE_FIELDS, self.capacity)
            series.append(row[0], row[1:])
            self.stats["device"] += 1
        return new_events

    def _run_for(self, st: RankState, local: int, t: float, *, start: bool) -> Run:
        """The Run that this rank's ``local`` run number belongs to (joining or opening one)."""
        run_id = st.local_runs.get(local)
        if run_id is not None:
            return self.runs[run_id - 1]
        mesh = self._mesh_of.get(st.rank)  # the latest run of this rank's sub-mesh (of all, not split)
        latest = next((r for r in reversed(self.runs)
                       if self._mesh_of.get(min(r.ranks, default=-1)) == mesh), None)
        if latest is not None and st.rank not in latest.ranks and abs(t - latest.started) < JOIN_WINDOW_S:
            run = latest
        else:
            run = Run(id=len(self.runs) + 1, started=t)
            self.runs.append(run)
        run.ranks.add(st.rank)
        st.local_runs[local] = run.id
        if not start:  # steps without their run_start (it was lost): the rank is running anyway
            st.run = run.id
        return run

    # -- what the kernel marks -------------------------------------------------------------
    def mark_failed(self, rank: int, reason: str = "failed", run: int | None = None) -> None:
        """A rank's cell raised: it shows ``failed`` and leaves its run, which fails with ``reason``.

        ``run``: the run the cell trained (also after its ``run_end``); default: the rank's current run.
        The first rank the kernel marks in a run is its root cause: call it with the root first.
        """
        with self._cv:
            st = self._rank(rank)
            st.failed = reason
            run = st.run if run is None else run
            if run is not None:
                r = self.runs[run - 1]
                r.failed.add(rank)
                r.add_error(rank, reason)  # what the rank itself said comes first
                r.root = rank if r.root is None else r.root
            if st.run is not None and st.run == run:
                st.run = None
            self.version += 1
            self._cv.notify_all()

    # -- reading -------------------------------------------------------------------------------
    def latest_run(self, ranks=None) -> Run | None:
        """The newest run (``ranks``: the newest with one of these ranks: a cell's, on its sub-mesh)."""
        with self._cv:
            if ranks is None:
                return self.runs[-1] if self.runs else None
            return next((r for r in reversed(self.runs) if r.ranks & set(ranks)), None)

    def count(self, stream: str = "step", run: int | None = None) -> int:
        """Records received (before downsampling) of a stream, optionally of one run's steps."""
        with self._cv:
            if run is None:
                return self.stats[stream]
            return sum(s.received for (rid, _), s in self.steps.items() if rid == run)

    def step_series(self, run: int) -> dict[int, Series]:
        """rank -> step Series of one run (live objects: read them under :meth:`lock`)."""
        with self._cv:
            return {rank: s for (rid, rank), s in sorted(self.steps.items()) if rid == run}

    def steps_since(self, run: int, seen: dict[int, int]) -> dict[int, tuple[dict | None, int]]:
        """rank -> (columns of the steps of ``run`` received after the first ``seen[rank]``, how many
        that rank's series has received), for the ranks that received some. Columns are None where some
        of those steps were downsampled since: read :meth:`step_series` again. What a live view reads
        every second, copying only new rows (a rank with none costs no copy).
        """
        with self._cv:
            return {rank: (s.since(seen.get(rank, 0)), s.received)
                    for (rid, rank), s in sorted(self.steps.items())
                    if rid == run and s.received != seen.get(rank, 0)}

    def lock(self):
        """The collector's lock, for reading live series consistently."""
        return self._cv

    def status(self, now: float | None = None) -> dict[int, str]:
        """rank -> ``running``, ``stalled``, ``failed``, ``lost`` or ``idle``.

        >>> Collector.__new__(Collector).status.__doc__ is not None
        True
        """
        now = time.monotonic() if now is None else now
        out = {}
        with self._cv:
            for rank, st in sorted(self.ranks.items()):
                if st.failed:
                    out[rank] = "failed"
                elif now - st.last_seen > self.lost_after:
                    out[rank] = "lost"
                elif st.run is not None:
                    quiet = now - st.last_step
                    out[rank] = "stalled" if quiet > max(self.stall_after, 5 * st.step_time) else "running"
                else:
                    out[rank] = "idle"
        return out

    def history(self, run: int | None = None) -> History:
        """Every record received (downsampled where a series ran long), as a :class:`History`.

        ``run``: one run's steps only (``None``: every run). Records carry ``rank``, ``host`` and
        the kernel-side ``run`` id.
        """
        with self._cv:
            steps = []
            for (rid, rank), s in sorted(self.steps.items()):
                if run is None or rid == run:
                    steps += s.records(run=rid, rank=rank, host=self.ranks[rank].host)
            devices = []
            for rank, s in sorted(self.devices.items()):
                devices += s.records(rank=rank, host=self.ranks[rank].host)
            events = [e for e in self.events if run is None or e.get("run") == run]
        return History(steps, devices, list(events))
