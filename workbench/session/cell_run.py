"""One cell on its ranks: run it everywhere at once, relay output, stop the others when one fails.

:class:`CellRun` is what :meth:`Session.run <workbench.session.Session.run>` does for one cell. It
waits on ipyparallel's output messages and on the health watcher (a death wakes it), never polls
/proc. When a rank fails it climbs an escalation ladder over the ranks still running: abort the
process group where the failed ranks are, SIGINT, SIGTERM, SIGKILL, each after a delay.

>>> run = CellRun(rooms, targets, timeout=None, on_output=None)   # doctest: +SKIP
>>> run.run("x = rank")                                                   # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from workbench import faults
from workbench.cell_output import CellOutput
from workbench.cell_targets import cell_label
from workbench.errors import CellInterrupted, CellTimeout, RankError
from workbench.pool.rankmap import RankInfo
from workbench.remote.host_replies import HostCell
from workbench.session import hints
from workbench.session.cell_elastic import Children, ElasticWatch
from workbench.session.losses import death_text
from workbench.session.meshes import keys_for
from workbench.session.results import (
    CellResult,
    RankDied,
    RankResult,
    raised_in_collective,
    stop_report,
    where_in_cell,
)
from workbench.wire import Command

if TYPE_CHECKING:
    from workbench.session.rooms import Rooms

# Called with (rank, kind, payload): kind is "stdout"/"stderr" (text) or "display" (a display_data
# content dict); on ranks whose hosts have hubs, text comes merged per host instead: (hub, "lines",
# (stream, [workbench.lines.Line, ...])), the hub's own ranks' lines merged by position.
OutputCallback = Callable[[Any, str, Any], None]

# How the other ranks are stopped once one failed: (seconds after the failure, step). "abort" aborts the
# process group on every rank from its agent thread, so a rank blocked in a collective fails at once
# and keeps its Python state; the signals are for ranks that are not in a collective, and SIGTERM and
# SIGKILL only for those that ignored everything gentler.
AFTER_FAILURE = ((0.3, "abort"), (0.8, "sigint"), (3.0, "sigterm"), (5.0, "sigkill"))
# After a death the abort goes at once: the root cause is known, and the 0.3 s above (for the other
# ranks' own errors to come first) would only keep the others waiting.
AFTER_DEATH = ((0.0, "abort"), *AFTER_FAILURE[1:])
# After a timeout or a second Ctrl-C the ranks running Python are interrupted first.
AFTER_INTERRUPT = ((0.0, "sigint"), (0.3, "abort"), (3.0, "sigterm"), (5.0, "sigkill"))
# Ctrl-C while a Trainer runs on every rank asks it to stop at the next step boundary; the ladder above
# follows if the step has not ended after this long (or twice the last step's time, if that is longer).
STOP_GRACE_S = 3.0
SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
# What a rank raises when we stopped it on purpose: neither its own error nor an echo of another's.
INTERRUPTS = ("KeyboardInterrupt", "TrainingInterrupted")
# An error from inside a collective starts the escalation only if no rank died within this long: a
# peer's death makes the others' collectives fail at once, before the death itself is seen.
ECHO_WAIT_S = 0.5
# SIGTERM and SIGKILL wait up to this much longer for a rank whose beacon shows it reporting its error.
FINISHING_GRACE_S = 10.0
# After a fault, how long the ranks that finished may take to deliver the rest of their output.
OUTPUT_AFTER_FAULT_S = 1.0
# The wait loop wakes on output, on a death and at least this often (the dashboard's tick, the ladder).
TICK_S = 0.05
# The ranks' messages the wait loop acts on (output to hand on, an error to judge). Their busy and idle
# status and the echo of the code (3 of a trivial cell's 5 messages per rank) wake nothing: woken by
# each, the loop's pass over all N ranks ran ~3N times per cell; the cell's end wakes it once.
WAKING = frozenset({"stream", "error", "display_data", "update_display_data", "execute_result"})


def soft_stop(grace: float) -> tuple:
    """Ask for the step boundary, then the hard ladder after ``grace`` seconds."""
    return ((0.0, "stop"), *((grace + after, step) for after, step in AFTER_INTERRUPT))


class CellRun:
    """One cell on ``targets``: streams output, watches for failures, stops the rest when one fails.

    ``rooms``: the session's rooms (:class:`~workbench.session.rooms.Rooms`): the door it runs through, the
    group, health and beacons it watches, where the ranks work (for the errors that name it)."""

    def __init__(self, rooms: Rooms, targets: list[RankInfo], timeout: float | None,
                 on_output: OutputCallback | None, on_tick: Callable[[], None] | None = None,
                 spread: bool | None = None):
        self.rooms, self.targets, self.timeout = rooms, targets, timeout
        self.spread = spread  # lines that differ only in numbers merged (by the hubs; None: the default)
        self.group, self.health, self.beacons = rooms.group, rooms.health, rooms.beacons
        self.children = Children()  # (rank, its reply) of every rank running the cell
        # routes an elastic Trainer around a lost rank
        self.elastic = ElasticWatch(rooms, self.children, wake=self.wake)
        self.on_tick = on_tick  # called on the kernel's main thread at every wake-up (the dashboard)
        self.relay = OutputRelay(on_output)
        self.ladder: tuple = ()
        self.fault_at: float | None = None  # when the ladder in force began
        self.first_fault_at: float | None = None
        self.steps_done: set[str] = set()
        self.fault: faults.FaultEvent | None = None
        self.interrupts = 0  # Ctrl-C presses during this cell
        self.timed_out: str | None = None
        self.cut_short: set[int] = set()  # ranks still running when the escalation began
        self.signalled: dict[int, set[str]] = {}  # rank -> the signals it got ("sigint", "sigterm", ...)
        self.where: dict[int, str] = {}  # rank -> where its beacon said it was when the escalation began
        self._suspects: dict[int, float] = {}  # rank -> when its error from inside a collective was seen
        self._places: dict[int, tuple] = {}  # rank -> (where its beacon said it was, since when)
        self._raised_before_abort: set[int] = set()  # ranks whose error came before the abort was sent
        self._asked = 0  # interrupts asked for from another thread (RunHandle.stop), not yet taken
        self.replies = None  # what the door's start_cell returned: ipyparallel's AsyncResult, or a HostCell
        self._wake = threading.Event()

    def run(self, code: str) -> CellResult:
        t0, self.started = time.perf_counter(), time.time()
        label = cell_label([r.rank for r in self.targets], self._world())  # what the ranks can see
        ar = self.rooms.door.start_cell(self.targets, code, label=label, spread=self.spread)
        by_engine = {r.engine_id: r for r in self.targets}
        self.children[:] = [(by_engine[eid], child)
                            for eid, child in zip(ar._targets, ar._children, strict=True)]
        wake = self._wake
        self.replies = ar
        if isinstance(ar, HostCell):  # output and ends merged per host by the hosts' hubs
            self.relay = HostOutputRelay(self.relay.on_output, ar)
            ar.on_message(wake.set)
        else:
            self.relay.attach(self.children, CellOutput(log_dir=None, pool_id=self.health.pool_id))
            for _, child in self.children:
                child.iopub_callbacks.append(lambda msg: msg["header"]["msg_type"] in WAKING and wake.set())
        ar.add_done_callback(lambda f: wake.set())
        self.health.add_listener(wake.set)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            self._wait(wake, deadline)
        finally:
            self.health.remove_listener(wake.set)
            self.elastic.close()
        self._await_deaths(wake)
        dead = self.health.dead
        live = [c for r, c in self.children if r.engine_id not in self.elastic.dropped and r.rank not in dead]
        if all(c.done() for c in live):  # a dead rank's output never completes: not waited for
            # after a fault too, briefly: a rank that finished has its last output on the way (on a loaded
            # machine its lines came after the result was made, and its tab said "no output")
            futures.wait([c.output for c in live], timeout=OUTPUT_AFTER_FAULT_S if self.fault_at else 5)
        self.relay.forward(self.children, final=True)
        result = CellResult([self._rank_result(r, c) for r, c in self.children], time.perf_counter() - t0)
        deaths = any(isinstance(r.error, RankDied) for r in result.ranks)
        for r in result.ranks:
            r.outcome = "lost" if r.rank.engine_id in self.elastic.dropped else \
                self._outcome(r.rank.rank, r.error, r.stderr, deaths, r.origin)
            if r.outcome in ("stopped", "interrupted"):
                r.where = where_in_cell(r.error) or self.where.get(r.rank.rank)
        if self.fault is not None and self._no_fault(result) and not self.timed_out:
            self.health.forget(self.fault)  # every rank raised its own error: one error, no fault
            self.fault = None
        if self.fault is not None:
            self.fault.abort_s = round(time.monotonic() - self.first_fault_at, 3)
            result.fault = self.fault
        elif self.elastic.faults:  # routed around: the run went on
            result.fault = self.elastic.faults[-1]
        if self.interrupts:
            raise CellInterrupted(stop_report(result.ranks, self._group_broken()), result)
        if self.timed_out is not None:
            raise CellTimeout(f"{self.timed_out}\n{stop_report(result.ranks, self._group_broken())}", result)
        # the root causes; ranks that were only cut short are "stopped", not failures of their own
        failures = [f for f in result.failures() if f.outcome in ("error", "died", "killed")] \
            or result.failures()
        if failures:
            if self.fault is None and not self._no_fault(result):  # failed without anyone waiting
                first = failures[0]
                self.fault = result.fault = self.health.record(
                    "exception", first.rank, f"{first.error.ename}: {first.error.evalue}", None, 0.0)
            self._advise(result, failures)
            raise RankError([(f.rank, f.error) for f in failures], result)
        return result

    def _world(self) -> int:
        """How many ranks the groups of this cell's ranks have: the pool's, or their sub-meshes' together."""
        meshes = self.group.meshes
        keys = keys_for(meshes, [r.rank for r in self.targets])
        return sum(len(meshes[k]) for k in keys) if meshes else len(self.group.ranks)

    def _group_broken(self) -> bool:
        """Whether the group of this cell's ranks (their sub-meshes' groups in a split pool) is broken."""
        return bool(self.group.broken_in(keys_for(self.group.meshes, [r.rank for r in self.targets])))

    def _advise(self, result: CellResult, failures: list[RankResult]) -> None:
        """The lines that say what to do under the torch errors a pool user meets (:mod:`.hints`); a group
        that a rank lost is re-formed by the next cell, and the fault line promises that only then."""
        gone = [f.rank.rank for f in failures if hints.broke_the_group(str(f.error.evalue))]
        if gone:
            self.group.mark_destroyed(gone)
        result.group_broken = self._group_broken()
        world = self._world()
        subset = len(self.targets) < world
        for f in failures:
            line = hints.hint(f.error.ename, str(f.error.evalue), self.group.backend, world,
                              ranks=gone, subset=subset)
            if line is not None and line not in result.hints:
                result.hints.append(line)
        missing = self.rooms.folders.of([f.rank for f in failures if hints.file_not_found(f.error.ename,
                                                                                        str(f.error.evalue))])
        if missing:
            result.hints.append(hints.where_ranks_look(missing, os.getcwd()))

    def _await_deaths(self, wake: threading.Event, seconds: float = 3.0) -> None:
        """Ranks sent SIGTERM or SIGKILL may answer the cell before they exit: wait to see them go
        (or not), so that the report says "killed" only of the ranks that are gone."""
        doomed = {rank for rank, got in self.signalled.items() if got & {"sigterm", "sigkill"}}
        deadline = time.monotonic() + seconds
        while doomed - self.health.dead.keys() and time.monotonic() < deadline:
            wake.wait(TICK_S)
            wake.clear()

    def _wait(self, wake: threading.Event, deadline: float | None) -> None:
        while True:
            try:
                wake.wait(TICK_S)
                wake.clear()
                while self._asked:
                    self._asked -= 1
                    self._ctrl_c(time.monotonic())
                self.relay.forward(self.children)
                if self.on_tick is not None:
                    self.on_tick()
                if self.fault_at is None:
                    self.elastic.tick()
                if self._finished():
                    return
                now = time.monotonic()
                if self.fault_at is None:
                    self._detect(now)
                    if deadline is not None and now > deadline and self.fault_at is None:
                        self._hang(now)
                else:
                    self._escalate(now)
            except KeyboardInterrupt:
                self._ctrl_c(time.monotonic())

    def wake(self) -> None:
        """Wake the wait loop now (a request from another thread is waiting)."""
        self._wake.set()

    def interrupt(self) -> None:
        """Ctrl-C from another thread (a background cell's ``stop``): the same steps as a Ctrl-C here."""
        self._asked += 1
        self._wake.set()

    def _ctrl_c(self, now: float) -> None:
        """First Ctrl-C: the gentlest stop that fits; second: the hard ladder now; third: kill what runs."""
        self.interrupts += 1
        if self.interrupts == 1 and self.fault_at is None:
            grace = self._trainer_grace()
            ladder = soft_stop(grace) if grace is not None else AFTER_INTERRUPT
            self._start_fault(now, "interrupt", None, "Ctrl-C in the notebook", ladder)
        elif self.interrupts >= 2:
            self.ladder = ((0.0, "sigkill"),) if self.interrupts > 2 else AFTER_INTERRUPT
            self.fault_at, self.steps_done = now, set()
            self._escalate(now)

    def _trainer_grace(self) -> float | None:
        """Seconds to wait for a step boundary, when a Trainer runs on every running rank (else None)."""
        beats = self.beacons.latest
        running = [r for r, c in self.children if not c.done()]
        trainers = [(beats.get(r.rank) or {}).get("trainer") or {} for r in running]
        if not running or not all(t.get("running") for t in trainers):
            return None
        step_time = max(float(t.get("step_time") or 0.0) for t in trainers)
        return min(30.0, max(STOP_GRACE_S, 2 * step_time + 0.5))

    def _hosts_hold_all(self) -> bool:
        """Whether the cell's replies are one :class:`HostCell` holding every running rank (no engine joined
        during the cell): then what the wait loop asks of the ranks at each wake-up, it asks the HostCell,
        whose answer does not grow with the ranks."""
        replies = self.replies
        return isinstance(replies, HostCell) and len(self.children) == len(replies._children)

    def _finished(self) -> bool:
        dead, dropped = self.health.dead, self.elastic.dropped
        if not dead and not dropped and self._hosts_hold_all():
            done = self.replies.done()
        else:
            done = all(c.done() or r.engine_id in dropped or r.rank in dead for r, c in self.children)
        if done and isinstance(self.replies, HostCell) and not self.replies.settled():
            # every rank's end came (from its hub) a moment before its engine left the cell: wait for that
            # too (the next command finds it idle), unless a rank is gone (its reply never comes)
            return bool(dropped) or any(r.rank in dead for r, _ in self.children)
        return done

    def _detect(self, now: float) -> None:
        dead = self.health.dead
        # the engine that holds a dead rank's number now (a rank that left or failed to join keeps an old
        # number that a newer rank holds: it is not the one that died)
        holders = {r.engine_id for r in self.group.ranks if r.rank in dead} if dead else set()
        lost = [r for r, _ in self.children
                if r.engine_id in holders and r.engine_id not in self.elastic.dropped] if holders else []
        how = dead[lost[0].rank] if lost else ""
        if lost and self.elastic.undecided(lost):
            return  # the survivors' next beacons say whether their elastic run goes on (a tick or a few)
        if lost and self.elastic.lost(lost, "died" if how == "exited" else how):
            return  # an elastic run goes on without them
        if lost:  # a whole host gone (off this machine) is named as such: one fault
            text = death_text(lost, self.group.ranks, dead) if not self.group.local else \
                f"rank {lost[0].rank} {how}"
            self._start_fault(now, "died", lost[0], text, AFTER_DEATH)
            self.health.announce(r.rank for r in lost)  # one fault: never "died while idle" after it
            return
        for r, c in self._with_errors():
            err = c.output.metadata["error"]
            if err is None or faults.is_secondary(err.ename, str(err.evalue),
                                                  self._origin(r, c.output.metadata["completed"], err)):
                continue
            if raised_in_collective(err) and now - self._suspects.setdefault(r.rank, now) < ECHO_WAIT_S:
                continue  # maybe the echo of a peer's death that the watcher is about to report
            done = c.output.metadata["completed"]
            detect = time.time() - done.timestamp() if hasattr(done, "timestamp") else None
            self._start_fault(now, "exception", r, f"{err.ename}: {err.evalue}", AFTER_FAILURE, detect)
            return

    def _with_errors(self) -> list:
        """(rank, reply) of the ranks whose reply may hold an error, in the ranks' order: with hubs only those
        whose end said so (none: nothing to visit), else every rank."""
        if not self._hosts_hold_all():
            return self.children
        errored = self.replies.errored
        if not errored:
            return []
        ids = {id(c) for c in errored}
        return [(r, c) for r, c in self.children if id(c) in ids]

    def _hang(self, now: float) -> None:
        """The timeout passed: name the stalled ranks and the last collective all ranks completed."""
        running = [r for r, c in self.children if not c.done()]
        beats = self.beacons.latest
        stalled = [r for r in running if not (beats.get(r.rank) or {}).get("inflight")] or running
        done = [beats[r.rank]["done"] for r in self.targets if r.rank in beats]
        last = min(done) if done else None
        last_name = next((beats[r.rank]["done_name"] for r in self.targets
                          if r.rank in beats and beats[r.rank]["done"] == last), None)
        where = {r.rank: (beats.get(r.rank) or {}).get("where") for r in stalled}
        self.timed_out = (
            f"the cell ran past its timeout of {self.timeout:g} s. Stalled: "
            + "; ".join(f"{r.label()} at {where[r.rank] or 'an unknown line'}" for r in stalled)
            + (f". Last collective every rank completed: #{last} ({last_name})." if last else
               ". No collective had completed on every rank.")
        )
        self._start_fault(now, "hang", stalled[0], self.timed_out, AFTER_INTERRUPT)

    def _start_fault(self, now, kind, info, text, ladder, detect_s=None) -> None:
        self.fault_at = self.first_fault_at = now
        self.ladder = ladder
        dead = self.health.dead
        self.cut_short = {r.rank for r, c in self.children if not c.done() and r.rank not in dead}
        beats = self.beacons.latest
        self.where = {rank: (beats.get(rank) or {}).get("where") for rank in self.cut_short}
        self.fault = self.health.record(kind, info, text, detect_s, None)
        self._escalate(now)

    def _escalate(self, now: float) -> None:
        self._note_places(now)
        dead = self.health.dead
        for after, step in self.ladder:
            if step in self.steps_done or now - self.fault_at < after:
                continue
            running = [r for r, c in self.children if not c.done() and r.rank not in dead]
            if step in SIGNALS and now - self.fault_at < after + FINISHING_GRACE_S:
                # a rank whose error came (ipyparallel publishes it before the reply) has ended its
                # cell: a signal now could lose the reply on its way (seen at load ~10: SIGINT, then
                # SIGTERM for a rank that had only raised)
                ended = self._errored()
                running = [r for r in running if r.rank not in ended]
                if step != "sigint" or self._after_failure():  # a rank that was released and is only
                    running = [r for r in running if not self._finishing(r.rank)]  # writing its traceback,
                    # or (after another rank's error) one still moving, on its way to its own error, is not
                    # stuck: no KeyboardInterrupt in place of the error every rank raises
                if not running:
                    return
            self.steps_done.add(step)
            if not running:
                return
            if step != "stop":  # past the step boundary: some rank may be cut mid-step, so every rank's
                self.group.mark_broken([r.rank for r, _ in self.children])  # wrapper (DDP's reducer) must see
                # a new group before training on
            if step == "stop":  # a Trainer stops at its next step boundary, on every rank the same
                self.group.command(Command.STOP, running)
            elif step == "abort":  # every rank, blocked ones too: their agents release them, state kept
                self._raised_before_abort = self._errored()
                self.group.abort([r for r, _ in self.children if r.rank not in dead],
                                 beats=self.beacons.latest)
            else:
                for r in running:
                    self.signalled.setdefault(r.rank, set()).add(step)
                self.group.signal(running, SIGNALS[step])

    def _after_failure(self) -> bool:
        """Whether the ladder in force follows a rank's own error (not an interrupt, a timeout, a death)."""
        return self.fault is not None and self.fault.kind == "exception" and not self.interrupts

    def _no_fault(self, result: CellResult) -> bool:
        """Whether nothing went wrong beyond the errors the ranks raised themselves: no rank was cut short,
        died or was lost; such a cell failed, but it is no fault of the pool (none is recorded)."""
        return not result.ranks_with("stopped", "interrupted", "died", "killed", "lost") and \
            (self.fault is None or self.fault.kind == "exception")

    def _errored(self) -> set[int]:
        """The ranks whose error reached us (ipyparallel publishes it before the reply)."""
        return {r.rank for r, c in self.children if c.output.metadata["error"] is not None}

    def _finishing(self, rank: int) -> bool:
        """Whether ``rank`` may be finishing rather than stuck, so SIGTERM waits: its beacon shows it
        reporting how the cell ended (writing its traceback), or the line its main thread is on changed
        within the last second (it is moving), or its beacons are late (on a loaded machine: the main
        thread holds the GIL without a break, as when IPython parses a big file to show it). A rank
        spinning on one line, or blocked in a collective, still beacons on time from the same place."""
        beat = self.beacons.latest.get(rank) or {}
        late = self.beacons.silent_for(rank) > 1.0
        moved = time.monotonic() - self._places.get(rank, (None, 0.0))[1] < 1.0
        return late or bool(beat.get("reporting")) or moved

    def _note_places(self, now: float) -> None:
        """Keep, for every rank, where its beacon says it is and since when (see :meth:`_finishing`)."""
        beats = self.beacons.latest
        for r, _ in self.children:
            beat = beats.get(r.rank) or {}
            where = (beat.get("where"), beat.get("inflight"))
            if self._places.get(r.rank, (None,))[0] != where:
                self._places[r.rank] = (where, now)

    def _origin(self, info: RankInfo, completed, error=None) -> str | None:
        """Where the rank says its failure came from (its beacon; engine clocks on both sides)."""
        beats = self.beacons.latest
        origin = faults.origin_of(beats.get(info.rank), self.started, faults.seconds(completed))
        if origin == "aborted" and info.rank in self._raised_before_abort:
            return None  # its error reached us before the abort: the root cause, however late its reply
        if origin == "aborted" and error is not None and not raised_in_collective(error):
            return None  # the abort cuts collectives only: an error raised outside one is the rank's own
        return origin                 # (an echo by its text still: "aborted", "Connection closed", ...)

    def _rank_result(self, info: RankInfo, child) -> RankResult:
        md = child.output.metadata
        if info.engine_id in self.elastic.dropped:  # the run went on without it: not a failure of the cell
            return RankResult(rank=info, stdout=self.relay.text_of(info, child, "stdout"),
                              stderr=self.relay.text_of(info, child, "stderr"),
                              outputs=list(md["outputs"]), completed=md["completed"],
                              lost=self.elastic.how_lost(info.engine_id))
        error = md["error"]
        if error is None and child.done() and child.exception() is not None:
            error = child.exception()
        dead = self.health.dead
        killed = bool(self.signalled.get(info.rank, set()) & {"sigterm", "sigkill"})
        if info.rank in dead and (error is None or killed) or getattr(error, "ename", None) == "EngineError":
            # ipyparallel says "EngineError" when the controller lost the engine: it died, whether or
            # not our watcher saw it yet (a rank on another node takes a few seconds of silence)
            error = RankDied(info, dead.get(info.rank, "exited"))
        return RankResult(
            rank=info, stdout=self.relay.text_of(info, child, "stdout"),
            stderr=self.relay.text_of(info, child, "stderr"),
            result=(md["execute_result"] or {}).get("data"), outputs=list(md["outputs"]),
            error=error, completed=md["completed"],
            origin=self._origin(info, md["completed"], error) if error is not None else None,
        )

    def _outcome(self, rank: int, error, stderr: str, deaths: bool, origin: str | None = None) -> str:
        """How this rank ended (see :data:`workbench.session.results.OUTCOMES`); ``deaths``: a rank died."""
        signals = self.signalled.get(rank, set())
        if isinstance(error, RankDied):
            return "killed" if signals & {"sigterm", "sigkill"} else "died"
        stopped = error is not None and (error.ename in INTERRUPTS or deaths and raised_in_collective(error))
        echo = error is not None and faults.is_secondary(error.ename, str(error.evalue), origin)
        if error is not None and not stopped and not echo:
            return "error"  # its own failure, whenever it came
        # an echo, our interrupt; or no error at all, where the interrupt hit the engine's own code
        # (it then only prints "KeyboardInterrupt")
        if error is not None or ("sigint" in signals and "KeyboardInterrupt" in stderr):
            return "interrupted" if self.interrupts or self.timed_out else "stopped"
        return "ok"


class OutputRelay:
    """Forwards each rank's new output exactly once. The text is taken from ipyparallel as it arrives (its
    copy emptied) into a bounded :class:`~workbench.cell_output.CellOutput`: a cell that prints without
    end shows each rank's first and last lines, and the log it names has all of them."""

    def __init__(self, on_output: OutputCallback | None):
        self.on_output = on_output
        self.sent: dict[tuple[int, str], int] = {}
        self.output: CellOutput | None = None
        self._displayed: set[int] = set()  # ranks that sent a display since the last forward
        self._scan_all = True

    def attach(self, children, output: CellOutput) -> None:
        """Take every stream message of ``children`` into ``output`` (in ipyparallel's IO thread, right
        after it appended the text to its metadata: that copy is emptied at once)."""
        self.output = output
        self._scan_all = True  # a display that came before the callbacks were in place: the next forward
        for info, child in children:
            child.iopub_callbacks.append(functools.partial(self._take, child.output.metadata, info.rank))

    def _take(self, md: dict, rank: int, msg: dict) -> None:
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            kind = msg["content"]["name"]
            text, md[kind] = md[kind] or "", ""
            self.output.feed(rank, kind, text)
        elif kind == "display_data":  # ipyparallel appended it to md["outputs"]: forward looks there
            self._displayed.add(rank)

    def text(self, rank: int, kind: str) -> str:
        """The rank's output of the cell as kept (bounded)."""
        return self.output.text(rank, kind) if self.output is not None else ""

    def text_of(self, info: RankInfo, child, kind: str) -> str:
        """The output of the rank ``info`` (whose reply is ``child``) as kept."""
        return self.text(info.rank, kind)

    def forward(self, children, final: bool = False) -> None:
        """Hand the new output to ``on_output``; ``final``: the cell ended (what is left, the tails)."""
        if self.output is None:
            return
        if final:  # text that came before our callback was in place and no message after it
            for info, child in children:
                if child.output.done():
                    md = child.output.metadata
                    for kind in ("stdout", "stderr"):
                        text, md[kind] = md[kind] or "", ""
                        self.output.feed(info.rank, kind, text)
        chunks = self.output.close() if final else self.output.drain()
        if self.on_output is None:
            return
        for rank, kind, text in chunks:
            self.on_output(rank, kind, text)
        shown, self._displayed = self._displayed, set()  # a tick looks only at ranks that displayed
        everyone, self._scan_all = final or self._scan_all, False
        for info, child in children:
            if not everyone and info.rank not in shown:
                continue
            md = child.output.metadata
            outputs = md["outputs"]
            done = self.sent.get((info.rank, "display"), 0)
            for content in outputs[done:]:
                self.on_output(info.rank, "display", content)
            self.sent[(info.rank, "display")] = len(outputs)


class HostOutputRelay:
    """The output of a cell whose hosts' hubs merged it (:class:`~workbench.remote.host_replies.HostCell`):
    each host's merged lines handed on as they come (``on_output(hub, "lines", (stream, lines))``), each
    rank's displays as :class:`OutputRelay` hands them on; a rank's own text (bounded by its hub) comes with
    its end, for its tab."""

    def __init__(self, on_output: OutputCallback | None, cell: HostCell):
        self.on_output, self.cell = on_output, cell

    def text_of(self, info: RankInfo, child, kind: str) -> str:
        return child.output.metadata.get(kind) or ""

    def forward(self, children, final: bool = False) -> None:
        lines, displays = self.cell.drain_lines(), self.cell.drain_displays()
        if self.on_output is None:
            return
        for hub, stream, found in lines:
            self.on_output(hub, "lines", (stream, found))
        for rank, content in displays:
            self.on_output(rank, "display", content)


class RunHandle:
    """A cell running in the background (:meth:`Session.submit`): a :class:`CellRun` on a thread.

    >>> h = s.submit("trainer.run(steps=5000)")     # doctest: +SKIP
    >>> h.stop()                                     # doctest: +SKIP
    """

    def __init__(self, cell: CellRun, code: str, run: Callable[[CellRun, str], CellResult]):
        self.cell = cell
        self.targets = cell.targets
        self._future: Future = Future()
        threading.Thread(target=self._run, args=(run, code), name="workbench-submit", daemon=True).start()

    def _run(self, run: Callable[[CellRun, str], CellResult], code: str) -> None:
        try:
            self._future.set_result(run(self.cell, code))
        except BaseException as exc:
            self._future.set_exception(exc)

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> CellResult:
        """The cell's result once it ends; raises what :meth:`Session.run` raises (e.g. RankError)."""
        return self._future.result(timeout)

    def interrupt(self, hard: bool = False) -> None:
        """Ctrl-C, without waiting: a running Trainer stops at its next step boundary; ``hard``: at once,
        like a second Ctrl-C."""
        if not self.done():
            self.cell.interrupt()
            if hard:
                self.cell.interrupt()

    def stop(self, timeout: float = 10.0, hard: bool = False) -> CellResult | None:
        """Stop the cell as Ctrl-C would (:meth:`interrupt`) and wait for the ranks; returns what they
        produced."""
        self.interrupt(hard)
        try:
            return self.wait(timeout)
        except (RankError, CellInterrupted, CellTimeout) as exc:
            return exc.result

    def add_done_callback(self, fn: Callable[[RunHandle], None]) -> None:
        self._future.add_done_callback(lambda _: fn(self))

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._future.exception() else "done")
        return f"<RunHandle ranks {[r.rank for r in self.targets]} {state}>"
