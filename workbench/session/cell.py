"""One cell on its ranks: run it everywhere at once, relay output, stop the others when one fails.

:class:`CellRun` is what :meth:`Session.run <workbench.session.Session.run>` does for one cell. It
waits on ipyparallel's output messages and on the health watcher (a death wakes it), never polls
/proc. When a rank fails it climbs an escalation ladder over the ranks still running: abort the
process group where the failed ranks are, SIGINT, SIGTERM, SIGKILL, each after a delay.

>>> run = CellRun(group, health, targets, timeout=None, on_output=None)   # doctest: +SKIP
>>> run.run("x = rank")                                                   # doctest: +SKIP
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from workbench import faults
from workbench.errors import CellTimeout, RankError
from workbench.pool.rankmap import RankInfo
from workbench.session.group import ProcessGroup
from workbench.session.health import Health
from workbench.session.results import CellResult, RankDied, RankResult

# Called with (rank, kind, payload): kind is "stdout"/"stderr" (text) or "display" (a display_data
# content dict).
OutputCallback = Callable[[int, str, Any], None]

# How the other ranks are stopped once one failed: (seconds after the failure, step). "abort" aborts the
# process group on every rank from its agent thread, so a rank blocked in a collective fails at once
# and keeps its Python state; the signals are for ranks that are not in a collective.
AFTER_FAILURE = ((0.3, "abort"), (0.8, "sigint"), (3.0, "sigterm"), (5.0, "sigkill"))
# After a timeout or Ctrl-C the ranks running Python are interrupted first.
AFTER_INTERRUPT = ((0.0, "sigint"), (0.3, "abort"), (3.0, "sigterm"), (5.0, "sigkill"))
SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
# The wait loop wakes on output, on a death and at least this often (the dashboard's tick, the ladder).
TICK_S = 0.05


class CellRun:
    """One cell on ``targets``: streams output, watches for failures, stops the rest when one fails."""

    def __init__(self, group: ProcessGroup, health: Health, targets: list[RankInfo], timeout: float | None,
                 on_output: OutputCallback | None, on_tick: Callable[[], None] | None = None):
        self.group, self.health, self.targets, self.timeout = group, health, targets, timeout
        self.on_tick = on_tick  # called on the kernel's main thread at every wake-up (the dashboard)
        self.relay = OutputRelay(on_output)
        self.ladder: tuple = ()
        self.fault_at: float | None = None
        self.steps_done: set[str] = set()
        self.fault: faults.FaultEvent | None = None
        self.interrupted = False
        self.timed_out: str | None = None

    def run(self, code: str) -> CellResult:
        t0 = time.perf_counter()
        ar = self.group.view(self.targets).execute(code, silent=False, block=False)
        by_engine = {r.engine_id: r for r in self.targets}
        self.children = [(by_engine[eid], child)
                         for eid, child in zip(ar._targets, ar._children, strict=True)]
        wake = threading.Event()
        for _, child in self.children:
            child.iopub_callbacks.append(lambda msg: wake.set())
        ar.add_done_callback(lambda f: wake.set())
        self.health.add_listener(wake.set)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            self._wait(wake, deadline)
        finally:
            self.health.remove_listener(wake.set)
        if all(c.done() for _, c in self.children):  # a dead rank's output never completes
            ar.wait_for_output(0 if self.fault_at else 5)
        self.relay.forward(self.children)
        result = CellResult([self._rank_result(r, c) for r, c in self.children], time.perf_counter() - t0)
        if self.fault is not None:
            self.fault.abort_s = round(time.monotonic() - self.fault_at, 3)
            result.fault = self.fault
        if self.interrupted:
            raise KeyboardInterrupt
        if self.timed_out is not None:
            raise CellTimeout(self.timed_out)
        failures = result.failures()
        if failures:
            if self.fault is None:  # failed without anyone waiting: nothing to stop
                first = failures[0]
                self.fault = result.fault = self.health.record(
                    "exception", first.rank, f"{first.error.ename}: {first.error.evalue}", None, 0.0)
            raise RankError([(f.rank, f.error) for f in failures], result)
        return result

    def _wait(self, wake: threading.Event, deadline: float | None) -> None:
        while True:
            try:
                wake.wait(TICK_S)
                wake.clear()
                self.relay.forward(self.children)
                if self.on_tick is not None:
                    self.on_tick()
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
                if self.interrupted:
                    raise
                self.interrupted = True
                self._start_fault(time.monotonic(), "interrupt", None, "Ctrl-C in the notebook",
                                  AFTER_INTERRUPT)

    def _finished(self) -> bool:
        dead = self.health.dead
        return all(c.done() or r.rank in dead for r, c in self.children)

    def _detect(self, now: float) -> None:
        dead = self.health.dead
        for r, _ in self.children:
            if r.rank in dead:
                self._start_fault(now, "died", r, f"rank {r.rank} {dead[r.rank]}", AFTER_FAILURE)
                return
        for r, c in self.children:
            err = c.output.metadata["error"]
            if err is not None and not faults.is_secondary(err.ename, str(err.evalue)):
                done = c.output.metadata["completed"]
                detect = time.time() - done.timestamp() if hasattr(done, "timestamp") else None
                self._start_fault(now, "exception", r, f"{err.ename}: {err.evalue}", AFTER_FAILURE, detect)
                return

    def _hang(self, now: float) -> None:
        """The timeout passed: name the stalled ranks and the last collective all ranks completed."""
        running = [r for r, c in self.children if not c.done()]
        beats = self.health.beacons.latest if self.health.beacons else {}
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
            + " The ranks were interrupted; the next cell re-forms the process group."
        )
        self._start_fault(now, "hang", stalled[0], self.timed_out, AFTER_INTERRUPT)

    def _start_fault(self, now, kind, info, text, ladder, detect_s=None) -> None:
        self.fault_at, self.ladder = now, ladder
        self.fault = self.health.record(kind, info, text, detect_s, None)
        self._escalate(now)

    def _escalate(self, now: float) -> None:
        dead = self.health.dead
        for after, step in self.ladder:
            if step in self.steps_done or now - self.fault_at < after:
                continue
            self.steps_done.add(step)
            running = [r for r, c in self.children if not c.done() and r.rank not in dead]
            if not running:
                return
            if step == "abort":  # every rank, blocked ones too: their agents release them, state kept
                self.group.abort([r for r, _ in self.children if r.rank not in dead])
            else:
                self.group.signal(running, SIGNALS[step])

    def _rank_result(self, info: RankInfo, child) -> RankResult:
        md = child.output.metadata
        error = md["error"]
        if error is None and child.done() and child.exception() is not None:
            error = child.exception()
        dead = self.health.dead
        if info.rank in dead and (error is None or error.ename == "EngineError"):
            error = RankDied(info, dead[info.rank])
        return RankResult(
            rank=info, stdout=md["stdout"] or "", stderr=md["stderr"] or "",
            result=(md["execute_result"] or {}).get("data"), outputs=list(md["outputs"]),
            error=error, completed=md["completed"],
        )


class OutputRelay:
    """Forwards each rank's new output exactly once, from the full text ipyparallel accumulates."""

    def __init__(self, on_output: OutputCallback | None):
        self.on_output = on_output
        self.sent: dict[tuple[int, str], int] = {}

    def forward(self, children) -> None:
        if self.on_output is None:
            return
        for info, child in children:
            md = child.output.metadata
            for kind in ("stdout", "stderr"):
                text = md[kind] or ""
                done = self.sent.get((info.rank, kind), 0)
                if len(text) > done:
                    self.sent[(info.rank, kind)] = len(text)
                    self.on_output(info.rank, kind, text[done:])
            outputs = md["outputs"]
            done = self.sent.get((info.rank, "display"), 0)
            for content in outputs[done:]:
                self.on_output(info.rank, "display", content)
            self.sent[(info.rank, "display")] = len(outputs)


class RunHandle:
    """A cell running in the background (:meth:`Session.submit`): ``run()`` on a thread.

    ``interrupt()`` is what :meth:`stop` calls to interrupt the ranks still running.
    """

    def __init__(self, run: Callable[[], CellResult], interrupt: Callable[[], None], targets: list[RankInfo]):
        self.targets = targets
        self._interrupt = interrupt
        self._future: Future = Future()
        threading.Thread(target=self._run, args=(run,), name="workbench-submit", daemon=True).start()

    def _run(self, run: Callable[[], CellResult]) -> None:
        try:
            self._future.set_result(run())
        except BaseException as exc:
            self._future.set_exception(exc)

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> CellResult:
        """The cell's result once it ends; raises what :meth:`Session.run` raises (e.g. RankError)."""
        return self._future.result(timeout)

    def stop(self, timeout: float = 10.0) -> CellResult | None:
        """Interrupt the ranks still running the cell and wait for them; returns what they produced."""
        if not self.done():
            self._interrupt()
        try:
            return self.wait(timeout)
        except RankError as exc:
            return exc.result

    def add_done_callback(self, fn: Callable[[RunHandle], None]) -> None:
        self._future.add_done_callback(lambda _: fn(self))

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._future.exception() else "done")
        return f"<RunHandle ranks {[r.rank for r in self.targets]} {state}>"
