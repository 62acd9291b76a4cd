"""What the dashboard draws of one run, fed with each rank's new step records: loss lines (one per rank,
or past ``MAX_LINES`` ranks the median over ranks in its min-max band, with the lines of the ranks asked
for), the pool's throughput, step-time means of recent steps and the slowest rank.

Pure: no widgets, no collector. :meth:`RunPlot.feed` says which lines got which new points, or that the
whole figure must go again (new lines, or older points merged); :meth:`RunPlot.figure` is plotly JSON.
What a refresh shows (the header words, the step-time bars) is worked out again only after new
records came: a refresh without any costs nothing per rank.

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
import statistics

from workbench.widgets import figures
from workbench.widgets.panels import STEP_PARTS
from workbench.widgets.plotdata import Recent, StepJoin, Trace

MAX_LINES = 8  # above this many ranks: the median in its min-max band instead of a line per rank
RECENT_STEPS = 50  # the step-time bars are means over this many recent steps
TIME_FIELDS = ("compute_time", "comm_time", "data_time", "step_time")
BAND = ("min", "max", "median")  # the loss traces of a run past MAX_LINES ranks, in this order


class RunPlot:
    """The lines and aggregates of one run (see the module)."""

    def __init__(self, window: int = 2000):
        self.window = window
        self.ranks: list[int] = []  # the run's ranks, as the figure was last shaped for
        self.lines: dict = {}  # the loss traces: rank -> Trace, or past MAX_LINES "min"/"max"/"median"
        self.per_rank: dict[int, Trace] = {}  # every rank's own loss line (drawn past MAX_LINES on demand)
        self.shown: list[int] = []  # past MAX_LINES: the ranks whose own line the live figure draws too
        self.rate = Trace(window)
        self._joins = {"loss": StepJoin(centre="median"), "rate": StepJoin()}
        self._recent: dict[int, Recent] = {}
        self.last: dict[int, tuple[int, float]] = {}  # rank -> (last step, last finite loss)
        self.marks: dict[int, str] = {}  # step -> what happened there (an elastic run lost or took ranks)
        self._fed = 0  # batches of records fed: what was worked out for a refresh holds until it changes
        self._cache: dict[str, tuple[int, object]] = {}

    @property
    def step(self) -> int:
        return max((s for s, _ in self.last.values()), default=0)

    @property
    def has_points(self) -> bool:
        return bool(len(self.rate) or any(len(t) for t in self.lines.values()))

    @property
    def aggregated(self) -> bool:
        """Whether the loss is drawn as the median in its band (more than ``MAX_LINES`` ranks)."""
        return len(self.ranks) > MAX_LINES

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
            self._fed += 1
            steps = [int(s) for s in cols["step"]]
            self._joins["rate"].add(r, steps, cols["samples_per_s"])
            self._recent.setdefault(r, Recent(RECENT_STEPS)).add({k: cols[k] for k in TIME_FIELDS})
            finite = [v for v in cols["loss"] if not math.isnan(v)]
            self.last[r] = (steps[-1], finite[-1] if finite else self.last.get(r, (0, math.nan))[1])
            merged = self.per_rank.setdefault(r, Trace(self.window)).extend(steps, cols["loss"])
            if not self.aggregated:
                whole |= merged
                added[ranks.index(r)] = (steps, cols["loss"])
            else:
                self._joins["loss"].add(r, steps, cols["loss"])
                if r in self.shown:
                    whole |= merged
                    added[len(BAND) + 1 + self.shown.index(r)] = (steps, cols["loss"])
        if self.aggregated:
            steps, lo, median, hi = self._joins["loss"].take(active, final)
            for i, (name, ys) in enumerate(zip(BAND, (lo, hi, median), strict=True)):
                whole |= self.lines[name].extend(steps, ys)
                added[i] = (steps, ys)
        steps, _, mean, _ = self._joins["rate"].take(active, final)
        whole |= self.rate.extend(steps, mean)
        added[len(self.lines)] = (steps, mean)
        return whole, {i: p for i, p in added.items() if p[0]}

    def show(self, ranks) -> bool:
        """Past ``MAX_LINES`` ranks, draw these ranks' own loss lines too (every point kept so far);
        whether the figure changed (then it is sent again, once).

        >>> plot = RunPlot()
        >>> plot.feed(list(range(10)), set(range(10)), {}, final=False)[0]
        True
        >>> plot.show([7, 3]), plot.show([3, 7]), plot.shown
        (True, False, [3, 7])
        """
        shown = sorted(set(ranks) & set(self.ranks))
        changed = shown != self.shown
        self.shown = shown
        return changed and self.aggregated

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
        self.shown = [r for r in self.shown if r in ranks]
        if not self.aggregated:
            self.lines = {r: self.per_rank.setdefault(r, Trace(self.window)) for r in ranks}
        elif set(self.lines) != set(BAND):
            self.lines = {name: Trace(self.window) for name in BAND}

    def figure(self, every_rank: bool = False) -> dict:
        """Loss and throughput as plotly JSON (every point kept so far). Past ``MAX_LINES`` ranks:
        the median in its min-max band, the lines of the ranks shown; ``every_rank`` (the figure a run
        leaves): every rank's line too, hidden until its legend entry is clicked."""
        rate = figures.trace("samples/s", self.rate.x, self.rate.y, axis=2, colour="#555", showlegend=False)
        if not self.aggregated:
            loss = [self._rank_trace(r) for r in self.lines]
            return figures.mark_steps(figures.lines_figure(loss, [rate]), self.marks)
        lo, hi, median = (self.lines[n] for n in BAND)
        band = [figures.trace("min", lo.x, lo.y, line={"width": 0}, showlegend=False, hoverinfo="skip"),
                figures.trace(f"min-max of {len(self.ranks)} ranks", hi.x, hi.y, line={"width": 0},
                              fill="tonexty", fillcolor="rgba(31,119,180,0.2)"),
                figures.trace("median", median.x, median.y, colour=figures.COLOURS[0])]
        extra = [self._rank_trace(r) for r in self.shown]
        if every_rank:
            extra += [self._rank_trace(r, visible="legendonly") for r in self.ranks if r not in self.shown]
        return figures.mark_steps(figures.lines_figure(band, [rate, *extra]), self.marks)

    def _rank_trace(self, r: int, **extra) -> dict:
        t = self.per_rank.get(r) or Trace(self.window)
        return figures.trace(f"rank {r}", t.x, t.y, colour=figures.COLOURS[r % len(figures.COLOURS)], **extra)

    def _cached(self, name: str, make):
        """``make()``, worked out again only after new records were fed."""
        fed, value = self._cache.get(name, (-1, None))
        if fed != self._fed:
            value = make()
            self._cache[name] = (self._fed, value)
        return value

    def step_times(self) -> dict[str, list[float]]:
        """Per part of a step (compute, communication, data wait, other): each rank's recent mean."""
        return self._cached("step_times", self._step_times)

    def _step_times(self) -> dict[str, list[float]]:
        parts: dict[str, list[float]] = {name: [] for name in STEP_PARTS}
        for r in self.ranks:
            rec = self._recent.get(r) or Recent(RECENT_STEPS)
            compute, comm, data, total = (rec.mean(k) for k in TIME_FIELDS)
            known = sum(v for v in (compute, comm, data) if not math.isnan(v))
            other = max(0.0, total - known) if not math.isnan(total) else math.nan
            for name, v in zip(parts, (compute, comm, data, other), strict=True):
                parts[name].append(0.0 if math.isnan(v) else round(v, 6))
        return parts

    def slowest(self) -> tuple[int, float, float] | None:
        """The rank whose recent steps took longest: (rank, its mean step time, the median over ranks), in
        seconds; None before two ranks have step times.

        >>> plot = RunPlot()
        >>> cols = lambda t: {"step": [1.0], "loss": [1.0], "samples_per_s": [8.0], "compute_time": [t],
        ...                   "comm_time": [0.0], "data_time": [0.0], "step_time": [t]}
        >>> _ = plot.feed([0, 1, 2], {0, 1, 2}, {0: cols(0.1), 1: cols(0.3), 2: cols(0.1)}, final=True)
        >>> plot.slowest()
        (1, 0.3, 0.1)
        """
        return self._cached("slowest", self._slowest)

    def _slowest(self) -> tuple[int, float, float] | None:
        times = {r: self._recent[r].mean("step_time") for r in self.ranks if r in self._recent}
        times = {r: t for r, t in times.items() if not math.isnan(t)}
        if len(times) < 2:
            return None
        rank = max(times, key=lambda r: (times[r], -r))
        return rank, times[rank], statistics.median(times.values())

    def bar_rows(self) -> tuple[list[str], dict[str, list[float]]]:
        """The step-time bars' rows: one per rank, or past ``MAX_LINES`` ranks the median over ranks of
        each part and the slowest rank (dozens of bars would hide it)."""
        return self._cached("bar_rows", self._bar_rows)

    def _bar_rows(self) -> tuple[list[str], dict[str, list[float]]]:
        parts = self.step_times()
        if not self.aggregated:
            return [f"rank {r}" for r in self.ranks], parts
        labels = [f"median of {len(self.ranks)} ranks"]
        rows = {name: [round(statistics.median(v), 6)] for name, v in parts.items()}
        slow = self.slowest()
        if slow is not None:
            labels.append(f"slowest: rank {slow[0]}")
            i = self.ranks.index(slow[0])
            for name, v in parts.items():
                rows[name].append(v[i])
        return labels, rows

    def words(self) -> str:
        """The latest loss (mean over ranks) and throughput (mean of recent steps), as header text; past
        ``MAX_LINES`` ranks the slowest rank too."""
        return self._cached("words", self._words)

    def _words(self) -> str:
        losses = [loss for _, loss in self.last.values() if not math.isnan(loss)]
        recent = [v for v in self.rate.y[-20:] if not math.isnan(v)]  # one step's rate is noisy
        rate = sum(recent) / len(recent) if recent else math.nan
        slow = self.slowest() if self.aggregated else None
        return ((f" · loss {sum(losses) / len(losses):.4g}" if losses else "")
                + (f" · {rate:,.0f} samples/s" if not math.isnan(rate) else "")
                + (f" · slowest rank {slow[0]}: {slow[1] * 1e3:.0f} ms/step (median {slow[2] * 1e3:.0f})"
                   if slow else ""))
