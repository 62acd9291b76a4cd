"""What the live dashboard plots, kept up to date point by point: bounded lines, per-step joins over
ranks, means of recent steps. Each new batch of records costs time in its own size, never the run's.

Pure Python, no widgets: the dashboard feeds these and sends only what changed.

>>> t = Trace(window=4)
>>> t.extend([1, 2, 3], [1.0, 2.0, 3.0])
False
>>> t.extend([4, 5], [4.0, 5.0])      # past 4 points: older points merged, the line is to be resent
True
>>> t.x, t.y, t.n
([3, 4, 5], [2.0, 4.0, 5.0], [3, 1, 1])
"""

from __future__ import annotations

import collections
import math
import statistics

from workbench.metrics.history import merged_mean

NAN = float("nan")


class Trace:
    """One line of a plot, at most ``window`` points. Past that its older half is merged pairwise (x of the
    later point, y the mean weighted by how many points each stands for) down to 3/4 of the window, so
    a long run keeps its whole shape: recent points exact, older ones coarser, and a merge (which means
    resending the line) comes at most once per ``window / 4`` new points.
    """

    def __init__(self, window: int = 2000):
        if window < 4:
            raise ValueError(f"window must be at least 4 points (got {window}).")
        self.window = window
        self.x: list = []
        self.y: list[float] = []
        self.n: list[int] = []  # how many received points each point stands for

    def __len__(self) -> int:
        return len(self.x)

    def extend(self, xs, ys) -> bool:
        """Add points; True when older points were merged (the whole line must be sent again)."""
        self.x += xs
        self.y += ys
        self.n += [1] * len(xs)
        if len(self.x) <= self.window:
            return False
        while len(self.x) > self.window * 3 // 4:
            self._halve_older()
        return True

    def _halve_older(self) -> None:
        half = max(2, (len(self.x) // 2) & ~1)
        x, y, n = self.x, self.y, self.n
        pairs = range(0, half, 2)
        self.x = [x[i + 1] for i in pairs] + x[half:]
        self.y = [merged_mean(y[i], n[i], y[i + 1], n[i + 1]) for i in pairs] + y[half:]
        self.n = [n[i] + n[i + 1] for i in pairs] + n[half:]


class StepJoin:
    """Min, centre and max over ranks of one value at each step, joined as records come in. The centre
    is the mean, or with ``centre="median"`` the median (one rank far off moves it not at all).

    A step is complete once every rank has reported that step or a later one; :meth:`take` hands out
    complete steps once, in order (``final=True``: every step left, when the run is over). NaNs are
    left out; a step where every rank had NaN is dropped. Each value is touched once when it comes
    and once when its step is taken: never again per refresh.

    >>> j = StepJoin()
    >>> j.add(0, [1, 2], [1.0, 3.0]); j.add(1, [1], [2.0])
    >>> j.take([0, 1])
    ([1], [1.0], [1.5], [2.0])
    >>> j.take([0, 1], final=True)
    ([2], [3.0], [3.0], [3.0])
    >>> m = StepJoin(centre="median")
    >>> for r, v in enumerate([1.0, 1.2, 9.0]): m.add(r, [1], [v])
    >>> m.take([0, 1, 2])
    ([1], [1.0], [1.2], [9.0])
    """

    def __init__(self, centre: str = "mean"):
        if centre not in ("mean", "median"):
            raise ValueError(f"centre must be 'mean' or 'median', not {centre!r}.")
        self._median = centre == "median"
        self._acc: dict = {}  # step -> [sum, count, min, max] (and its finite values, for a median)
        self._latest: dict[int, float] = {}  # rank -> the last step it reported

    @property
    def pending(self) -> int:
        """Steps waiting for a rank."""
        return len(self._acc)

    def add(self, rank: int, steps, values) -> None:
        for step, v in zip(steps, values, strict=True):
            acc = self._acc.get(step)
            if acc is None:
                acc = self._acc[step] = [0.0, 0, math.inf, -math.inf, []]
            if not math.isnan(v):
                acc[0] += v
                acc[1] += 1
                acc[2] = min(acc[2], v)
                acc[3] = max(acc[3], v)
                if self._median:
                    acc[4].append(v)
        if len(steps):
            self._latest[rank] = max(self._latest.get(rank, -math.inf), steps[-1])

    def take(self, ranks, final: bool = False) -> tuple[list, list, list, list]:
        """Complete steps of ``ranks`` not taken yet: (steps, min, centre, max)."""
        upto = math.inf if final else min((self._latest.get(r, -math.inf) for r in ranks), default=-math.inf)
        out: tuple[list, list, list, list] = ([], [], [], [])
        for step in sorted(s for s in self._acc if s <= upto):
            total, count, lo, hi, values = self._acc.pop(step)
            if count:
                centre = statistics.median(values) if self._median else total / count
                for column, v in zip(out, (step, lo, centre, hi), strict=True):
                    column.append(v)
        return out


class Recent:
    """The last ``n`` values of some fields, for means over recent steps. A mean is worked out again only
    after new values came (a refresh without new records costs nothing per rank).

    >>> r = Recent(2); r.add({"t": [1.0, 2.0, 4.0]}); r.mean("t")
    3.0
    """

    def __init__(self, n: int = 50):
        self.n = n
        self._cols: dict[str, collections.deque] = {}
        self._means: dict[str, float] = {}  # field -> its mean, until new values come

    def add(self, cols: dict) -> None:
        for field, values in cols.items():
            self._cols.setdefault(field, collections.deque(maxlen=self.n)).extend(values)
            self._means.pop(field, None)

    def mean(self, field: str) -> float:
        """Mean of the field's recent values, NaNs left out (NaN when there are none)."""
        if field not in self._means:
            good = [v for v in self._cols.get(field, ()) if not math.isnan(v)]
            self._means[field] = sum(good) / len(good) if good else NAN
        return self._means[field]
