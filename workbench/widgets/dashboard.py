"""Kernel side: the live training dashboard.

Loss per rank and throughput (plotly ``FigureWidget``), where each rank's step time goes
(compute, communication, data wait), and a device panel per host and rank coloured by load,
with each rank's state. A background thread refreshes it at most every ``interval`` seconds,
each refresh one ``batch_update()`` per figure over at most ``window`` points per trace (the
whole run, thinned), so a fast loop cannot flood the browser.

>>> import workbench as wb
>>> dash = wb.dashboard()               # doctest: +SKIP
>>> dash.history.dataframe()            # doctest: +SKIP
>>> dash.save_html("build/run.html")    # doctest: +SKIP
"""

from __future__ import annotations

import collections
import functools
import html
import logging
import math
import threading
import time
from pathlib import Path

import numpy as np

from workbench.metrics.collector import Collector

log = logging.getLogger(__name__)

# Above this many ranks the loss plot shows the mean with its min-max spread instead of one line each.
MAX_LINES = 8
STATE_COLOURS = {"running": "#2e7d32", "idle": "#607d8b", "stalled": "#ef6c00", "failed": "#c62828",
                 "lost": "#c62828"}
_PLOTTED = ("seq", "t", "step", "loss", "samples_per_s", "step_time", "compute_time", "comm_time",
            "data_time")
_warmed = threading.Event()


def warm_up() -> None:
    """Import plotly's widget modules on a background thread, once per process.

    Their first import can take seconds (plotly.io pulls in nbformat and jsonschema); done ahead,
    a dashboard appears as soon as its run starts.
    """
    if _warmed.is_set():
        return
    _warmed.set()

    def load():
        try:  # pandas half-imported here while a cell asks for history.dataframe() would break both
            import pandas  # noqa: F401
        except ImportError:
            pass
        import plotly.graph_objects as go
        import plotly.subplots  # noqa: F401

        go.FigureWidget  # noqa: B018  (the lazy attribute is what loads the widget module)

    threading.Thread(target=load, name="workbench-widgets-warm-up", daemon=True).start()


def load_colour(percent: float) -> str:
    """Background colour for a load in percent: green (idle) through yellow to red (saturated).

    >>> load_colour(0), load_colour(100), load_colour(float("nan"))
    ('hsl(120, 65%, 85%)', 'hsl(0, 65%, 85%)', '#eeeeee')
    """
    if percent is None or math.isnan(percent):
        return "#eeeeee"
    hue = round(120 * (1 - min(max(percent, 0.0), 100.0) / 100))
    return f"hsl({hue}, 65%, 85%)"


def thin(n: int, window: int) -> slice:
    """A slice of at most ``window`` points out of ``n``, evenly spread, always ending at the last.

    >>> list(range(5)[thin(5, 10)]), list(range(10)[thin(10, 4)])
    ([0, 1, 2, 3, 4], [0, 3, 6, 9])
    """
    if n <= window:
        return slice(0, n)
    stride = math.ceil(n / window)
    return slice((n - 1) % stride, n, stride)


class Dashboard:
    """A live view of one training run (and of every rank's device).

    ``run``: ``"latest"`` follows the newest run, ``"next"`` waits for the first run that starts
    after it was made, an int shows that run. ``hidden``: show nothing until the run starts (what
    ``%%distributed`` uses so a dashboard appears only when a cell trains).

    >>> from workbench.metrics.collector import Collector
    >>> dash = Dashboard(Collector(), interval=0.25, start=False)
    >>> dash.refresh(); dash.history
    <History 0 step records from ranks [], 0 device samples>
    >>> dash.close(); dash.collector.close()
    """

    def __init__(self, collector: Collector, *, run="latest", interval: float = 0.25, window: int = 2000,
                 hidden: bool = False, start: bool = True):
        import ipywidgets as W

        if run not in ("latest", "next") and not isinstance(run, int):
            raise ValueError(f"run must be 'latest', 'next' or a run number, not {run!r}.")
        self.collector = collector
        self.mode = run
        latest = collector.latest_run()
        self._after = latest.id if (run == "next" and latest) else 0
        self.run_id: int | None = run if isinstance(run, int) else None
        self.interval = interval
        self.window = window
        self.updates = 0  # refreshes
        self.messages = 0  # widget-model changes sent to the front end (plotly edits, HTML values)
        self.delays: collections.deque = collections.deque(maxlen=100_000)  # step end -> widget, seconds
        self._seen_seq: dict[int, float] = {}
        self._version = -1
        self._ranks: list[int] = []
        self._built = False
        self._finished_at: float | None = None
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self.widget = W.VBox(layout=W.Layout(display="none" if hidden else "flex", width="100%"))
        self.widget.add_class("workbench-dashboard")
        self._thread = None
        if start:
            self.start()

    # -- display ----------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"<Dashboard run {self.run_id or self.mode}, {self.updates} updates>"

    @property
    def pinned(self) -> bool:
        """Whether this dashboard has found its run."""
        return self.run_id is not None

    @property
    def history(self):
        """This dashboard's run as a :class:`workbench.metrics.history.History`."""
        return self.collector.history(self.run_id)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the refresh thread (stops by itself when the collector closes)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="workbench-dashboard", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop refreshing and remove the widgets from the page."""
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        for w in self._widgets():
            w.close()
        self.widget.close()

    def stop(self) -> None:
        """Stop refreshing but leave the last picture on the page."""
        self._closed.set()

    def _widgets(self):
        return [getattr(self, n) for n in ("_header", "_fig", "_bar", "_devices") if hasattr(self, n)]

    def _loop(self) -> None:
        last_device = 0.0
        while not self._closed.wait(self.interval):
            try:
                now = time.monotonic()
                changed = self.collector.version != self._version
                if changed or now - last_device >= 1.0:
                    self.refresh()
                    last_device = now
                if self.collector.closed:
                    self.refresh()
                    return
                if self._finished_at is not None and self.mode != "latest" and now - self._finished_at > 3:
                    self.refresh()
                    return  # a finished run's picture does not change any more
            except Exception:
                log.exception("the dashboard could not refresh")

    # -- refresh ------------------------------------------------------------------------------
    def _find_run(self) -> None:
        latest = self.collector.latest_run()
        if self.mode == "latest":
            if latest is not None and latest.id != self.run_id:
                self.run_id, self._seen_seq, self._finished_at = latest.id, {}, None
        elif self.mode == "next" and self.run_id is None and latest is not None and latest.id > self._after:
            self.run_id = latest.id

    def refresh(self) -> None:
        """Bring every part up to date now (the thread calls this; tests may too)."""
        with self._lock:
            if self._closed.is_set() and self._built and not self.collector.closed:
                return
            self._version = self.collector.version
            self._find_run()
            if self.mode == "next" and not self.pinned:
                return  # hidden until its run starts
            with self.collector.lock():
                series = self.collector.step_series(self.run_id) if self.run_id else {}
                data = {rank: {f: np.array(s.cols[f]) for f in _PLOTTED} for rank, s in series.items()}
                run = self.collector.runs[self.run_id - 1] if self.run_id else None
                ranks = sorted(set(self.collector.ranks) | set(data))
                devices = {r: s.last() for r, s in self.collector.devices.items()}
                infos = {r: (st.host, dict(st.info)) for r, st in self.collector.ranks.items()}
                stats = dict(self.collector.stats)
            status = self.collector.status()
            if not self._built or ranks != self._ranks:
                self._build(ranks)
            self._update_plots(data)
            self._update_bar(data)
            self._devices.value = _device_table(ranks, devices, infos, status, data)
            self._header.value = _header(run, data, status, stats)
            if run is not None and run.done and self._finished_at is None:
                self._finished_at = time.monotonic()
            self.updates += 1
            if self.widget.layout.display == "none":
                self.widget.layout.display = "flex"

    def _build(self, ranks: list[int]) -> None:
        import ipywidgets as W
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        for w in self._widgets():
            w.close()
        self._ranks = list(ranks)
        self._seen_seq = {}
        fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "throughput (samples/s)"),
                            horizontal_spacing=0.08)
        if len(ranks) <= MAX_LINES:
            for r in ranks:
                fig.add_trace(go.Scatter(x=[], y=[], mode="lines", name=f"rank {r}", legendgroup=f"r{r}"),
                              row=1, col=1)
        else:
            fig.add_trace(go.Scatter(x=[], y=[], mode="lines", line={"width": 0}, showlegend=False,
                                     name="min"), row=1, col=1)
            fig.add_trace(go.Scatter(x=[], y=[], mode="lines", line={"width": 0}, fill="tonexty",
                                     fillcolor="rgba(31,119,180,0.2)", name="min-max"), row=1, col=1)
            fig.add_trace(go.Scatter(x=[], y=[], mode="lines", name="mean"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[], y=[], mode="lines", name="samples/s", showlegend=False), row=1, col=2)
        fig.update_xaxes(title_text="step")
        fig.update_layout(height=300, margin={"l": 50, "r": 20, "t": 40, "b": 40},
                          legend={"orientation": "h", "y": -0.25}, template="plotly_white")
        self._fig = go.FigureWidget(fig)
        self._bar = go.FigureWidget(layout={
            "barmode": "stack", "height": 110 + 26 * max(1, len(ranks)), "template": "plotly_white",
            "title": {"text": "where step time goes (seconds, mean of recent steps)", "font": {"size": 13}},
            "margin": {"l": 60, "r": 20, "t": 60, "b": 30},
            "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1.0, "xanchor": "right"}})
        colours = {"compute": "#1f77b4", "communication": "#d62728", "data wait": "#ff7f0e",
                   "other": "#bbbbbb"}
        labels = [f"rank {r}" for r in ranks]
        for name, colour in colours.items():
            self._bar.add_trace(go.Bar(x=[0] * len(ranks), y=labels, orientation="h", name=name,
                                       marker_color=colour))
        self._header = W.HTML()
        self._devices = W.HTML()
        self._header.add_class("workbench-dashboard-header")
        self._devices.add_class("workbench-device-panel")
        self._fig.add_class("workbench-loss-plot")
        for fw in (self._fig, self._bar):
            fw.observe(self._count, names=[n for n in fw.trait_names() if n.startswith("_py2js_")])
        for h in (self._header, self._devices):
            h.observe(self._count, names="value")
        self.widget.children = [self._header, self._fig, self._devices, self._bar]
        self._built = True

    def _count(self, change) -> None:
        if change["new"] is not None:
            self.messages += 1

    def _update_plots(self, data: dict) -> None:
        fig = self._fig
        with fig.batch_update():
            ranks = self._ranks
            empty = np.empty(0)
            if len(ranks) <= MAX_LINES:
                for i, r in enumerate(ranks):
                    d = data.get(r)
                    idx = thin(len(d["step"]), self.window) if d else slice(0)
                    fig.data[i].x = d["step"][idx] if d else empty
                    fig.data[i].y = d["loss"][idx] if d else empty
                n_loss = len(ranks)
            else:
                steps, lo, mean, hi = _spread(data, "loss")
                idx = thin(len(steps), self.window)
                for trace, ys in zip(fig.data[:3], (lo, hi, mean), strict=True):
                    trace.x, trace.y = steps[idx], ys[idx]
                n_loss = 3
            steps, total = _total(data, "samples_per_s")
            idx = thin(len(steps), self.window)
            fig.data[n_loss].x, fig.data[n_loss].y = steps[idx], total[idx]
        sent = time.time()
        for r, d in data.items():  # how long each new point took from its step's end to the widget
            seqs = d["seq"]
            if len(seqs):
                self.delays.extend((sent - d["t"][seqs > self._seen_seq.get(r, -1)]).tolist())
                self._seen_seq[r] = seqs[-1]

    def _update_bar(self, data: dict, recent: int = 50) -> None:
        parts = {"compute": [], "communication": [], "data wait": [], "other": []}
        for r in self._ranks:
            d = data.get(r)
            means = [_nanmean(d[k][-recent:]) if d else math.nan
                     for k in ("compute_time", "comm_time", "data_time", "step_time")]
            known = sum(v for v in means[:3] if not math.isnan(v))
            other = max(0.0, means[3] - known) if not math.isnan(means[3]) else math.nan
            for name, v in zip(parts, [*means[:3], other], strict=False):
                parts[name].append(0.0 if math.isnan(v) else v)
        with self._bar.batch_update():
            for trace, values in zip(self._bar.data, parts.values(), strict=False):
                trace.x = values

    # -- export ------------------------------------------------------------------------------
    def save_html(self, path) -> Path:
        """Write the dashboard as one standalone HTML file (plotly.js inlined, no network needed).

        >>> dash.save_html("build/dashboard.html")   # doctest: +SKIP
        PosixPath('build/dashboard.html')
        """
        import plotly.io as pio

        self.refresh()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = [self._header.value if self._built else "<p>no run yet</p>"]
        if self._built:
            body.append(pio.to_html(self._fig, full_html=False, include_plotlyjs=True))
            body.append(self._devices.value)
            body.append(pio.to_html(self._bar, full_html=False, include_plotlyjs=False))
        title = f"workbench run {self.run_id}" if self.run_id else "workbench dashboard"
        path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
                        f"<body style='font-family: sans-serif'>{''.join(body)}</body></html>")
        return path


# -- pure helpers ---------------------------------------------------------------------------------
def _nanmean(values) -> float:
    good = values[~np.isnan(values)]
    return float(good.mean()) if len(good) else math.nan


def _total(data: dict, field: str):
    """Mean of ``field`` over ranks at each step: the Trainer reports samples of the whole step
    (all data-parallel ranks) on every rank, so each rank's samples/s is already the world's."""
    steps, _, mean, _ = _spread(data, field)
    return steps, mean


def _spread(data: dict, field: str):
    """Steps, then min, mean and max of ``field`` over ranks at each step (NaNs left out).

    >>> d = {0: {"step": np.array([1., 2.]), "x": np.array([1., 4.])},
    ...      1: {"step": np.array([1., 2.]), "x": np.array([3., np.nan])}}
    >>> [a.tolist() for a in _spread(d, "x")]
    [[1.0, 2.0], [1.0, 4.0], [2.0, 4.0], [3.0, 4.0]]
    """
    if not data:
        e = np.empty(0)
        return e, e, e, e
    steps = np.concatenate([d["step"] for d in data.values()])
    values = np.concatenate([d[field] for d in data.values()])
    ok = ~np.isnan(values)
    steps, values = steps[ok], values[ok]
    uniq, inv = np.unique(steps, return_inverse=True)
    count = np.bincount(inv, minlength=len(uniq))
    mean = np.bincount(inv, weights=values, minlength=len(uniq)) / np.maximum(count, 1)
    lo = np.full(len(uniq), np.inf)
    hi = np.full(len(uniq), -np.inf)
    np.minimum.at(lo, inv, values)
    np.maximum.at(hi, inv, values)
    return uniq, lo, mean, hi


def _fmt_bytes(n) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "–"


def _fmt(v, spec: str, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:{spec}}{unit}"


def _header(run, data: dict, status: dict, stats: dict) -> str:
    if run is None:
        counts = collections.Counter(status.values())
        states = " · ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return (f"<div class='workbench-dash-title'><b>workbench</b> · no training run yet · {len(status)} "
                f"ranks ({states or 'none'})</div>")
    last = {r: d for r, d in data.items() if len(d["step"])}
    step = max((int(d["step"][-1]) for d in last.values()), default=0)
    _, total = _total({r: {k: v[-1:] for k, v in d.items()} for r, d in last.items()}, "samples_per_s")
    losses = [d["loss"][-1] for d in last.values() if not math.isnan(d["loss"][-1])]
    counts = collections.Counter(status.get(r, "idle") for r in sorted(run.ranks | set(data)))
    states = " · ".join(f"<span style='color:{STATE_COLOURS.get(s, '#333')}'>{n} {s}</span>"
                        for s, n in sorted(counts.items()))
    lost = f" · <b style='color:#c62828'>{stats['missing']} records missing</b>" if stats["missing"] else ""
    state = "finished" if run.done else "training"
    loss = f" · loss {sum(losses) / len(losses):.4g}" if losses else ""
    rate = f" · {total[-1]:,.0f} samples/s" if len(total) else ""
    return (f"<div class='workbench-dash-title'><b>run {run.id}</b> {state} · step {step}{loss}{rate} · "
            f"{states}{lost}</div>")


def _reading(sample: dict, info: dict, key: str, spec: str, unit: str) -> str:
    """One reading of a device sample; "not supported" where the device has none (a MIG instance's
    utilisation, power, clock), rather than a 0 or a dash that reads as "no data yet".

    >>> _reading({}, {"unsupported": ["util"]}, "util", ".0f", "%")
    'not supported'
    """
    if key in (info.get("unsupported") or ()):
        return "not supported"
    return _fmt(sample.get(key), spec, unit)


def _device_table(ranks, devices, infos, status, data) -> str:
    rows = []
    hosts: dict[str, list[int]] = {}
    for r in ranks:
        hosts.setdefault(infos.get(r, ("?", {}))[0] or "?", []).append(r)
    any_gpu = any(infos.get(r, ("", {}))[1].get("kind") == "gpu" for r in ranks)
    head = ("<tr><th>rank</th><th>state</th><th>device</th><th>util</th><th>memory</th><th>power</th>"
            "<th>temp</th><th>clock</th><th>step</th></tr>")
    for host, host_ranks in hosts.items():
        rows.append(f"<tr><td colspan='9' style='background:#f3f3f3'><b>{html.escape(host)}</b></td></tr>")
        for r in host_ranks:
            info = infos.get(r, ("", {}))[1]
            d = devices.get(r) or {}
            util = d.get("util", math.nan)
            used, total = d.get("mem_used"), d.get("mem_total", info.get("mem_total"))
            mem_pct = used / total * 100 if used is not None and total and not math.isnan(used) else math.nan
            state = status.get(r, "idle")
            step = data.get(r, {}).get("step", ())
            name = html.escape(str(info.get("name") or info.get("device") or "?"))
            fmt = functools.partial(_reading, d, info)
            rows.append(
                f"<tr data-rank='{r}'><td>{r}</td>"
                f"<td style='color:{STATE_COLOURS.get(state, '#333')};font-weight:bold'>{state}</td>"
                f"<td>{name}</td>"
                f"<td style='background:{load_colour(util)}'>{fmt('util', '.0f', '%')}</td>"
                f"<td style='background:{load_colour(mem_pct)}'>{_fmt_bytes(used)} / {_fmt_bytes(total)}</td>"
                f"<td>{fmt('power_w', '.0f', ' W')}</td>"
                f"<td>{fmt('temp_c', '.0f', ' °C')}</td>"
                f"<td>{fmt('clock_mhz', '.0f', ' MHz')}</td>"
                f"<td>{int(step[-1]) if len(step) else '–'}</td></tr>")
    note = "" if any_gpu else ("<span style='color:#666;font-size:90%'>· no GPU detected: util is each "
                               "engine's CPU share, memory its resident size</span>")
    return (f"<div class='workbench-devices'><b>devices</b> {note}<table style='border-collapse:collapse;"
            f"white-space:nowrap' cellpadding='4'>{head}{''.join(rows)}</table></div>")
