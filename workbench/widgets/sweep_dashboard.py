"""Kernel side: a sweep's comparison dashboard, one live figure of every trial's training loss.

:class:`Sweep` is ``wb.Sweep``: the session's sweep (:mod:`workbench.session.sweep`) that, where a front end
can show widgets (or with ``dashboard=True``), shows a :class:`SweepDashboard` when it starts. The dashboard
watches the sweep (:meth:`workbench.session.sweep.Sweep.watch`) and reads each trial's ``wb.Trainer`` run from
the session's metrics collector (:meth:`~workbench.session.sweep.Sweep.run_of`: the run on the trial's
ranks that began after it started): one colour per trial, its loss against the step (left: the mean over
its ranks) and its samples/s (right), each line named by its trial and config, the best trial (lowest
final loss of the done trials, else the lowest latest loss) drawn thicker with "best" in its name, and
each trial's status in its name and the count of each status in the title. About once a second, while
something changed, the figure is replaced in place; when the sweep ends it stays as a static figure
(plotly's JSON with an SVG fallback, :func:`workbench.widgets.figures.static_bundle`), so a saved notebook
shows it.

>>> from workbench.session.sweep import Trial
>>> trials = [Trial(0, {"lr": 0.1}, "done", metrics={"loss": 0.5}), Trial(1, {"lr": 0.03}, "running"),
...           Trial(2, {"lr": 0.01}, "pending")]
>>> best = pick_best(trials, {0: 0.52, 1: 0.3})
>>> best, trace_name(trials[0], best), trace_name(trials[1], best)
(0, 'best · trial 0: lr=0.1 (done)', 'trial 1: lr=0.03 (running)')
>>> headline(trials, best)
'sweep · 1 running, 1 done, 1 pending · best: trial 0 (lr=0.1), loss 0.5'
"""

from __future__ import annotations

import contextvars
import math
import threading
import uuid

from workbench.session import sweep as sweeps
from workbench.widgets import figures
from workbench.widgets.cell_monitor import _has_widgets
from workbench.widgets.plotdata import StepJoin

ORDER = ("running", "done", "pruned", "failed", "stopped", "pending")  # as the title counts them


def config_text(config: dict) -> str:
    """``lr=0.03, steps=10``: a trial's configuration in a line name."""
    return ", ".join(f"{k}={v!r}" for k, v in config.items())


def trace_name(trial: sweeps.Trial, best: int | None) -> str:
    """A trial's line: its number, config and status; "best" in front of the best one's."""
    name = f"trial {trial.index}: {config_text(trial.config)} ({trial.status})"
    return f"best · {name}" if trial.index == best else name


def pick_best(trials, latest: dict[int, float]) -> int | None:
    """The best trial's index: of the done trials the lowest final ``loss`` (what the trial returned, as
    :meth:`Results.best`; else its curve's last loss), while none is done the running trial with the lowest
    latest loss (``latest``: trial index -> its curve's last finite loss); None before any has one.

    >>> from workbench.session.sweep import Trial
    >>> pick_best([Trial(0, {}, "failed"), Trial(1, {}, "running")], {0: 0.1, 1: 0.4})
    1
    >>> pick_best([Trial(0, {}, "done", metrics={"loss": 0.9}), Trial(1, {}, "running")], {0: 0.2, 1: 0.1})
    0
    >>> pick_best([Trial(0, {}, "running")], {}) is None
    True
    """
    def score(t) -> float | None:
        final = t.metrics.get("loss")
        value = final if isinstance(final, (int, float)) and t.status == "done" else latest.get(t.index)
        return value if isinstance(value, (int, float)) and math.isfinite(value) else None

    done = [t for t in trials if t.status == "done" and score(t) is not None]
    candidates = done or [t for t in trials if t.status == "running" and score(t) is not None]
    return min(candidates, key=score).index if candidates else None


def headline(trials, best: int | None) -> str:
    """The title: how many trials are in each status, and the best so far."""
    counts = {s: sum(t.status == s for t in trials) for s in ORDER}
    text = "sweep · " + (", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no trial yet")
    if best is not None:
        trial = next(t for t in trials if t.index == best)
        loss = trial.metrics.get("loss") if trial.status == "done" else None
        text += f" · best: trial {best} ({config_text(trial.config)})"
        text += f", loss {loss:.4g}" if isinstance(loss, (int, float)) else ""
    return text


def sweep_figure(trials, curves: dict[int, dict[str, list]], best: int | None) -> dict:
    """Plotly JSON: per trial with a curve (``curves``: index -> ``step`` and ``loss``, ``rate_step`` and
    ``samples_per_s``), its loss (left) and samples/s (right) in its own colour, the best line thicker."""
    loss, rate = [], []
    for t in trials:
        cols = curves.get(t.index)
        if not cols:
            continue
        colour = figures.COLOURS[t.index % len(figures.COLOURS)]
        width = 4 if t.index == best else 1.5
        loss.append(figures.trace(trace_name(t, best), cols["step"], cols["loss"],
                                  line={"color": colour, "width": width}, legendgroup=str(t.index)))
        rate.append(figures.trace(f"trial {t.index} samples/s", cols["rate_step"], cols["samples_per_s"],
                                  axis=2, colour=colour, showlegend=False, legendgroup=str(t.index)))
    return figures.lines_figure(loss, rate)


class SweepDashboard:
    """The live comparison figure of one sweep (see the module). ``display``: show it now in the cell's
    output (else only :attr:`figure` and :attr:`bundle` are kept, e.g. in a test or a terminal)."""

    def __init__(self, sweep: sweeps.Sweep, *, interval: float = 1.0, display: bool = True):
        self.sweep = sweep
        self.collector = sweep.session.metrics
        self.interval = interval
        self.display_id = uuid.uuid4().hex
        self.figure: dict = figures.lines_figure([], [])
        self.bundle: dict = figures.static_bundle("sweep · starting", None)
        self.best: int | None = None
        self.ended = False
        self._seen: tuple | None = None  # what the figure was last made of: made again only when it changes
        self._lock = threading.RLock()
        self._context: contextvars.Context | None = None
        self._wake = threading.Event()
        sweep.watch(self._changed)
        if display:
            from IPython.display import display as show

            self._context = contextvars.copy_context()  # updates from other threads go to this output
            show(self.bundle, raw=True, display_id=self.display_id)
        self._thread = threading.Thread(target=self._loop, name="workbench-sweep-dashboard", daemon=True)
        self._thread.start()

    def _changed(self, trial) -> None:
        """The sweep's watcher: a trial started or ended (refresh now), or the sweep ended (``None``)."""
        if trial is None:
            self.finish()
        else:
            self._wake.set()

    def _loop(self) -> None:
        while not self.ended:
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self.ended:
                self.refresh()

    def curves(self) -> dict[int, dict[str, list]]:
        """trial index -> the steps of its Trainer's run, the loss at each (the mean over its ranks: each
        rank publishes its own) and samples/s (the trial's, as its first rank counts them)."""
        out = {}
        if self.collector is None:
            return out
        for trial in list(self.sweep.trials):
            run = self.sweep.run_of(trial)
            if run is None:
                continue
            loss = StepJoin()
            with self.collector.lock():
                series = self.collector.step_series(run)
                for rank, s in series.items():
                    loss.add(rank, [int(x) for x in s.column("step")], s.column("loss"))
                first = series.get(trial.ranks[0])
                rate = (first.column("step"), first.column("samples_per_s")) if first else ([], [])
            steps, _, mean, _ = loss.take(sorted(series), final=trial.status != "running")
            if steps:
                out[trial.index] = {"step": steps, "loss": mean, "rate_step": rate[0],
                                    "samples_per_s": rate[1]}
        return out

    def refresh(self, final: bool = False) -> None:
        """Make the figure again from the sweep and the collector, and show it where anything changed."""
        with self._lock:
            if self.ended and not final:
                return
            trials = list(self.sweep.trials)
            # what it shows changes with a status or a step record, not with each device sample
            runs = [(t.index, t.status, self.sweep.run_of(t)) for t in trials]
            seen = tuple((*r, self.collector.count("step", r[2]) if r[2] else 0) for r in runs)
            if seen == self._seen and not final:
                return
            self._seen = seen
            curves = self.curves()
            latest = {i: next((v for v in reversed(c["loss"]) if math.isfinite(v)), math.nan)
                      for i, c in curves.items()}
            self.best = pick_best(trials, latest)
            self.figure = sweep_figure(trials, curves, self.best)
            self.bundle = figures.static_bundle(headline(trials, self.best), self.figure if curves else None,
                                                "" if curves else "no trial has trained a wb.Trainer run yet")
            self._publish()

    def finish(self, wait: float = 2.0) -> None:
        """The sweep ended: wait up to ``wait`` s for the trials' runs to end (their last steps), then leave
        the final figure in place."""
        if self.ended:
            return
        if self.collector is not None:
            runs = [r for r in (self.sweep.run_of(t) for t in self.sweep.trials) if r is not None]
            self.collector.wait_for(lambda c: all(c.runs[r - 1].done for r in runs), wait)
        self.ended = True
        self._wake.set()
        self.refresh(final=True)

    def _publish(self) -> None:
        if self._context is None:
            return
        from IPython.display import update_display

        self._context.copy().run(lambda: update_display(self.bundle, raw=True, display_id=self.display_id))


class Sweep(sweeps.Sweep):
    """``wb.Sweep``: :class:`workbench.session.sweep.Sweep` with its comparison dashboard. ``dashboard``:
    ``None`` (default) shows it where a front end can show widgets (a notebook, not a terminal) and the
    pool has a metrics collector; ``True`` always makes it (:attr:`dashboard`), ``False`` never.

    >>> sweep = wb.Sweep("train", [{"lr": 0.1}, {"lr": 0.03}], ranks_per_trial=2)   # doctest: +SKIP
    >>> sweep.run()                 # the live figure, then the table     # doctest: +SKIP
    >>> sweep.dashboard.figure      # plotly JSON: a loss line per trial  # doctest: +SKIP
    """

    def __init__(self, *args, dashboard: bool | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.show_dashboard = dashboard
        self.dashboard: SweepDashboard | None = None

    def start(self) -> Sweep:
        want = self.show_dashboard
        if want is None:
            want = _has_widgets() and self.session.metrics is not None
        made = None
        if want and self.dashboard is None:  # watching before the first trial starts
            made = self.dashboard = SweepDashboard(self, display=_has_widgets())
        try:
            super().start()
        except BaseException:  # refused (the pool split since, say): its figure ends with nothing run
            if made is not None:
                made.finish(wait=0)
            raise
        return self
