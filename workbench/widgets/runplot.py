"""What the dashboard draws of one run, fed with each rank's new step records: loss lines (one per rank,
or min/mean/max over ranks past ``MAX_LINES``), the pool's throughput, step-time means of recent steps.

Pure: no widgets, no collector. :meth:`RunPlot.feed` says which lines got which new points, or that the
whole figure must go again (new lines, or older points merged); :meth:`RunPlot.figure` is plotly JSON.

>>> plot = RunPlot(window=100)
>>> cols = {"step": [1.0, 2.0], "loss": [0.9, 0.7], "samples_per_s": [50.0, 60.0], "compute_time": [0.1] * 2,
...         "comm_time": [0.05] * 2, "data_time": [0.01] * 2, "step_time": [0.2] * 2}
>>> plot.feed([0, 1], {0, 1}, {0: cols, 1: cols}, final=False)
(True, {0: ([1, 2], [0.9, 0.7]), 1: ([1, 2], [0.9, 0.7]), 2: ([1, 2], [50.0, 60.0])})
>>> plot.step, plot.words()
(2, ' · loss 0.7 · 55 samples/s')
"""

from __future__ import annotations

import math

from workbench.widgets import figures
from workbench.widgets.panels import STEP_PARTS
from workbench.widgets.plotdata import Recent, StepJoin, Trace

MAX_LINES = 8  # above this many ranks: the mean with its min-max spread instead of a line per rank
RECENT_STEPS = 50  # the step-time bars are means over this many recent steps
TIME_FIELDS = ("compute_time", "comm_time", "data_time", "step_time")


class RunPlot:
    """The lines and aggregates of one run (see the module)."""

    def __init__(self, window: int = 2000):
        self.window = window
        self.ranks: list[int] = []  # the ranks the figure has lines for
        self.lines: dict = {}  # rank -> Trace of its loss, or "min"/"max"/"mean" -> Trace
        self.rate = Trace(window)
        self._joins = {"loss": StepJoin(), "rate": StepJoin()}
        self._recent: dict[int, Recent] = {}
        self.last: dict[int, tuple[int, float]] = {}  # rank -> (last step, last finite loss)
        self.marks: dict[int, str] = {}  # step -> what happened there (an elastic run lost or took ranks)

    @property
    def step(self) -> int:
        return max((s for s, _ in self.last.values()), default=0)

    @property
    def has_points(self) -> bool:
        return bool(len(self.rate) or any(len(t) for t in self.lines.values()))

    def feed(self, ranks: list[int], active: set, new: dict[int, dict], final: bool) -> tuple[bool, dict]:
        """Add each rank's new columns. ``ranks``: every rank of the run; ``active``: those still to be
        waited for in per-step joins; ``final``: the run is over (join what is left).

        Returns (whole figure to send again, {trace index: (new x, new y)}).
        """
        whole = ranks != self.ranks
        if whole:
            self._shape(ranks)
        added: dict[int, tuple[list, list]] = {}
        for r, cols in new.items():
            if not cols or not cols["step"]:
                continue
            steps = [int(s) for s in cols["step"]]
            self._joins["rate"].add(r, steps, cols["samples_per_s"])
            self._recent.setdefault(r, Recent(RECENT_STEPS)).add({k: cols[k] for k in TIME_FIELDS})
            finite = [v for v in cols["loss"] if not math.isnan(v)]
            self.last[r] = (steps[-1], finite[-1] if finite else self.last.get(r, (0, math.nan))[1])
            if len(ranks) <= MAX_LINES:
                whole |= self.lines[r].extend(steps, cols["loss"])
                added[ranks.index(r)] = (steps, cols["loss"])
            else:
                self._joins["loss"].add(r, steps, cols["loss"])
        if len(ranks) > MAX_LINES:
            steps, lo, mean, hi = self._joins["loss"].take(active, final)
            for i, (name, ys) in enumerate((("min", lo), ("max", hi), ("mean", mean))):
                whole |= self.lines[name].extend(steps, ys)
                added[i] = (steps, ys)
        steps, _, mean, _ = self._joins["rate"].take(active, final)
        whole |= self.rate.extend(steps, mean)
        added[len(self.lines)] = (steps, mean)
        return whole, {i: p for i, p in added.items() if p[0]}

    def mark(self, events: list[dict]) -> bool:
        """Note the regroups of an elastic run (``{"step", "text"}``) on the loss plot; whether one is new.

        >>> plot = RunPlot()
        >>> plot.mark([{"step": 412, "text": "rank 1 lost at step 412; continuing on 3 ranks"}] * 2)
        True
        >>> plot.mark([{"step": 412, "text": "rank 1 lost at step 412; continuing on 3 ranks"}])
        False
        """
        new = {int(e["step"]): str(e.get("text") or "") for e in events if "step" in e}
        if new.keys() <= self.marks.keys():
            return False
        self.marks.update(new)
        return True

    def _shape(self, ranks: list[int]) -> None:
        self.ranks = list(ranks)
        if len(ranks) <= MAX_LINES:
            self.lines = {r: self.lines.get(r) or Trace(self.window) for r in ranks}
        elif set(self.lines) != {"min", "max", "mean"}:
            self.lines = {name: Trace(self.window) for name in ("min", "max", "mean")}

    def figure(self) -> dict:
        """Loss and throughput as plotly JSON (every point kept so far)."""
        colours = figures.COLOURS
        if len(self.ranks) <= MAX_LINES:
            loss = [figures.trace(f"rank {r}", t.x, t.y, colour=colours[r % len(colours)])
                    for r, t in self.lines.items()]
        else:
            lo, hi, mean = (self.lines[n] for n in ("min", "max", "mean"))
            loss = [figures.trace("min", lo.x, lo.y, line={"width": 0}, showlegend=False),
                    figures.trace("min-max", hi.x, hi.y, line={"width": 0}, fill="tonexty",
                                  fillcolor="rgba(31,119,180,0.2)"),
                    figures.trace("mean", mean.x, mean.y)]
        rate = figures.trace("samples/s", self.rate.x, self.rate.y, axis=2, colour="#555", showlegend=False)
        return figures.mark_steps(figures.lines_figure(loss, [rate]), self.marks)

    def step_times(self) -> dict[str, list[float]]:
        """Per part of a step (compute, communication, data wait, other): each rank's recent mean."""
        parts: dict[str, list[float]] = {name: [] for name in STEP_PARTS}
        for r in self.ranks:
            rec = self._recent.get(r) or Recent(RECENT_STEPS)
            compute, comm, data, total = (rec.mean(k) for k in TIME_FIELDS)
            known = sum(v for v in (compute, comm, data) if not math.isnan(v))
            other = max(0.0, total - known) if not math.isnan(total) else math.nan
            for name, v in zip(parts, (compute, comm, data, other), strict=True):
                parts[name].append(0.0 if math.isnan(v) else round(v, 6))
        return parts

    def words(self) -> str:
        """The latest loss (mean over ranks) and throughput (mean of recent steps), as header text."""
        losses = [loss for _, loss in self.last.values() if not math.isnan(loss)]
        recent = [v for v in self.rate.y[-20:] if not math.isnan(v)]  # one step's rate is noisy
        rate = sum(recent) / len(recent) if recent else math.nan
        return ((f" · loss {sum(losses) / len(losses):.4g}" if losses else "")
                + (f" · {rate:,.0f} samples/s" if not math.isnan(rate) else ""))
