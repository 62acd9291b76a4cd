"""Kernel-side storage of metric series: columnar, bounded, downsampled for long runs.

A :class:`Series` keeps every point until it holds ``capacity`` points; then its older half is
merged pairwise (numeric fields averaged, weighted by ``n``, ``n`` summed, ``seq``/``step``/``t``
taken from the later point), so a long run keeps its whole shape in bounded memory: recent points
at full resolution, older ones coarser. ``n`` always adds up to the number of points received.

>>> s = Series(("t", "loss"), capacity=8)
>>> for i in range(12):
...     s.append(i, [float(i), float(i)])
>>> len(s), s.received, sum(s.column("n"))
(8, 12, 12.0)
>>> s.column("loss")
[1.5, 4.5, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
"""

from __future__ import annotations

import math
from array import array

# Fields that name a point rather than measure it: a merged point keeps the later value.
_LAST = ("seq", "t", "step", "local_run")


class Series:
    """Points of one stream of one rank, in arrival (= sequence) order."""

    def __init__(self, fields, capacity: int = 8192):
        if capacity < 4:
            raise ValueError(f"capacity must be at least 4 points (got {capacity}).")
        self.fields = ("seq", *fields, "n")
        self.capacity = capacity
        self.cols = {f: array("d") for f in self.fields}
        self.received = 0  # points appended, merged or not
        self._exact_from = 0  # index of the first point never merged: every later point is one received

    def __len__(self) -> int:
        return len(self.cols["seq"])

    def append(self, seq: int, values) -> None:
        """Add one point (``values`` in ``fields`` order, without ``seq`` and ``n``)."""
        if len(self) >= self.capacity:
            self._compact()
        self.cols["seq"].append(seq)
        for f, v in zip(self.fields[1:-1], values, strict=False):
            self.cols[f].append(v)
        self.cols["n"].append(1.0)
        self.received += 1

    def _compact(self) -> None:
        half = (len(self) // 2) & ~1
        n = self.cols["n"]
        pairs = range(0, half, 2)
        for f, col in self.cols.items():
            if f == "n":
                continue
            if f in _LAST:
                merged = [col[i + 1] for i in pairs]
            else:
                merged = [merged_mean(col[i], n[i], col[i + 1], n[i + 1]) for i in pairs]
            self.cols[f] = array("d", merged) + col[half:]
        self.cols["n"] = array("d", [n[i] + n[i + 1] for i in pairs]) + n[half:]
        self._exact_from = len(pairs)

    def column(self, field: str, start: int = 0) -> list[float]:
        """One field's values from index ``start`` on."""
        return self.cols[field][start:].tolist()

    def since(self, received: int) -> dict[str, list[float]] | None:
        """Columns of the points received after the first ``received`` ones, as they came; None when
        some of them were merged since (read the whole series again).

        >>> s = Series(("loss",), capacity=4)
        >>> for i in range(3):
        ...     s.append(i, [i / 10])
        >>> s.since(2)["loss"], s.since(3)["loss"]
        ([0.2], [])
        """
        new = self.received - received
        if new < 0 or new > len(self) - self._exact_from:
            return None
        start = len(self) - new
        return {f: c[start:].tolist() for f, c in self.cols.items()}

    def last(self) -> dict | None:
        """The newest point as a dict, or None."""
        if not len(self):
            return None
        return {f: c[-1] for f, c in self.cols.items()}

    def records(self, **extra) -> list[dict]:
        """Every point as a dict (``seq``, ``step``, ``local_run``, ``n`` as ints), ``extra`` keys first."""
        ints = {"seq", "step", "local_run", "n"}
        cols = [(f, c) for f, c in self.cols.items()]
        out = []
        for i in range(len(self)):
            rec = dict(extra)
            for f, c in cols:
                v = c[i]
                rec[f] = int(v) if f in ints and not math.isnan(v) else v
            out.append(rec)
        return out


def merged_mean(a: float, na: float, b: float, nb: float) -> float:
    """The mean of two points standing for ``na`` and ``nb`` points (a NaN stands for nothing).

    >>> merged_mean(1.0, 1, 4.0, 2), merged_mean(float("nan"), 1, 2.0, 1)
    (3.0, 2.0)
    """
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return (a * na + b * nb) / (na + nb)


class History:
    """The complete history a collector received: step and device records of every rank.

    >>> h = History([{"rank": 0, "step": 1, "loss": 0.5}], [])
    >>> h.records()
    [{'rank': 0, 'step': 1, 'loss': 0.5}]
    >>> h.dataframe().loc[0, "loss"]      # doctest: +SKIP
    0.5
    """

    def __init__(self, steps: list[dict], devices: list[dict], events: list[dict] | None = None):
        self.steps = steps
        self.devices = devices
        self.events = events or []

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        ranks = sorted({r["rank"] for r in self.steps})
        return (f"<History {len(self.steps)} step records from ranks {ranks}, "
                f"{len(self.devices)} device samples>")

    def records(self, stream: str = "step") -> list[dict]:
        """Records of one stream (``"step"``, ``"device"`` or ``"event"``) as a list of dicts."""
        try:
            return {"step": self.steps, "device": self.devices, "event": self.events}[stream]
        except KeyError:
            raise ValueError(f"unknown stream {stream!r}: choose step, device or event.") from None

    def dataframe(self, stream: str = "step"):
        """Records of one stream as a pandas DataFrame (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("History.dataframe() needs pandas: pip install pandas") from None
        return pd.DataFrame.from_records(self.records(stream))

    to_dataframe = dataframe
