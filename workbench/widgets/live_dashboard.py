"""Kernel side: the live training dashboard.

Loss per rank and throughput, where each rank's step time goes (compute, communication, data wait),
and a device table per host and rank coloured by load, with each rank's state. It says how its run
ends ("interrupted at step 120", "failed: rank 1: ValueError ..."), shows a sentence instead of empty
axes until the first point, and shows no power or temperature on a CPU pool.

About once a second (``interval``) a background thread reads only the records that came since its
last look, updates its lines and per-step aggregates incrementally (:mod:`workbench.widgets.plotdata`)
and sends the page only the new points: one small message, appended there with ``Plotly.extendTraces``.
Lines are bounded (``window`` points, older ones merged), so neither side ever redraws a whole run.

When its run ends (or the pool stops, or the kernel shuts down) the live widget is replaced by a
static figure, plotly's own JSON (:func:`workbench.widgets.figures.static_bundle`): a saved notebook
shows the curves in JupyterLab after a reload, in nbviewer and on GitHub.

Front ends without the widget extensions (VS Code without network for the widget's module, Notebook 7 or
JupyterLab without ipywidgets' manager, a headless run) cannot draw the widget: ``render="auto"`` (the
default) waits up to ``WORKBENCH_DASHBOARD_WAIT`` seconds (5) after it is shown for the page's module to
say it is there, and otherwise goes on as plain HTML (the header, an inline SVG of the lines, the device
table and the step-time bars), replaced in place about once a second through the display's updates: no
script, no widget. ``render="html"`` (or ``WORKBENCH_DASHBOARD=html``) chooses it from the start,
``"widget"`` never falls back.

>>> import workbench as wb
>>> dash = wb.dashboard()               # doctest: +SKIP
>>> dash.history.dataframe()            # doctest: +SKIP
>>> dash.save_html("build/run.html")    # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import collections
import contextvars
import html
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path

from workbench.metrics.collector import Collector, Run
from workbench.widgets import figures
from workbench.widgets.panels import describe, device_table, header_html, said_states, step_time_bars
from workbench.widgets.runplot import RECENT_STEPS, RunPlot

log = logging.getLogger(__name__)

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
_warmed = threading.Event()
_live: weakref.WeakSet = weakref.WeakSet()  # dashboards that may still show a live widget


RENDERS = ("auto", "widget", "html")
WAIT_S = 5.0  # how long "auto" waits for the page's module to say the widget can render


def render_default() -> str:
    """``WORKBENCH_DASHBOARD`` (auto, widget or html), else auto."""
    chosen = os.environ.get("WORKBENCH_DASHBOARD", "auto").strip().lower() or "auto"
    if chosen not in RENDERS:
        raise ValueError(f"WORKBENCH_DASHBOARD={chosen!r}: choose one of {', '.join(RENDERS)}.")
    return chosen


def wait_s() -> float:
    try:
        return float(os.environ.get("WORKBENCH_DASHBOARD_WAIT", WAIT_S))
    except ValueError:
        return WAIT_S


def warm_up() -> None:
    """Import the widget modules (anywidget, ipywidgets) on a background thread, once per process,
    so a dashboard appears as soon as its run starts."""
    if _warmed.is_set():
        return
    _warmed.set()

    def load():
        try:  # pandas half-imported here while a cell asks for history.dataframe() would break both
            import pandas  # noqa: F401
        except ImportError:
            pass
        import workbench.widgets.view  # noqa: F401

    threading.Thread(target=load, name="workbench-widgets-warm-up", daemon=True).start()


class Dashboard:
    """A live view of one training run (and of every rank's device).

    ``run``: ``"latest"`` follows the newest run, ``"next"`` waits for the first run that starts
    after it was made, an int shows that run. Show it as a cell's last expression or with
    ``display()``: it replaces itself by a static figure when its run ends (``"latest"`` turns live
    again when a new run starts).

    ``view``: makes the object it pushes to (one per live run); by default the notebook's widget
    (:class:`workbench.widgets.view.DashboardView`). Anything with the traits ``figure``, ``header``,
    ``note``, ``devices``, ``bars`` as attributes, ``send({"extend": ...})``, ``hold_sync()`` and
    ``close()`` will do: the Jupyter server's docked dashboard uses a
    :class:`workbench.widgets.polled.PolledView` that the page polls. ``ranks``: follow only the runs on
    these ranks (a cell's on a sub-mesh of a split pool, beside another sub-mesh's run).

    >>> from workbench.metrics.collector import Collector
    >>> dash = Dashboard(Collector(), start=False)
    >>> dash.refresh(); dash.summary, dash.history
    ('no training run yet', <History 0 step records from ranks [], 0 device samples>)
    >>> dash.close(); dash.collector.close()
    """

    def __init__(self, collector: Collector, *, run="latest", interval: float = 1.0, window: int = 2000,
                 start: bool = True, view: Callable[[], object] | None = None, render: str | None = None,
                 ranks=None):
        if run not in ("latest", "next") and not isinstance(run, int):
            raise ValueError(f"run must be 'latest', 'next' or a run number, not {run!r}.")
        render = render or ("widget" if view is not None else render_default())
        if render not in RENDERS:
            raise ValueError(f"render must be one of {', '.join(RENDERS)}, not {render!r}.")
        self.render = render  # "html" once an "auto" dashboard fell back
        self._alive = threading.Event()  # the page's module said the widget can render there
        self._shown_at: float | None = None
        self._html_sent = -1  # self.messages when the HTML was last published
        self.collector = collector
        # what the pool's controller says each rank does ("idle", "busy", "failed", "unknown"), where the one
        # who shows it asks (the server's docked dashboard): said in place of the collector's "idle" and
        # "lost", which know only training records (a busy cell that trains nothing was "2 idle")
        self.rank_words: dict[int, str] = {}
        self.mode = run
        self.ranks = None if ranks is None else sorted(ranks)
        latest = collector.latest_run(self.ranks)
        self._after = latest.id if (run == "next" and latest) else 0
        self.run_id: int | None = run if isinstance(run, int) else None
        self.interval = interval
        self.window = window
        self.updates = 0  # refreshes
        self.messages = 0  # messages to the page (new points, changed text, whole figures)
        self.delays: collections.deque = collections.deque(maxlen=100_000)  # step end -> sent, seconds
        self.summary = describe(None, 0, False)
        self.display_id = uuid.uuid4().hex
        self._context: contextvars.Context | None = None  # of the cell that showed it: updates go there
        self._displayed = False
        self._static: dict | None = None  # the static figure shown instead of the widget, once ended
        self._version = -1
        self._view_factory = view
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self.view = self._new_view()
        self._reset()
        self._thread = None
        _live.add(self)
        if start:
            self.start()

    # -- display ----------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        from IPython.display import display

        with self._lock:
            self._context = contextvars.copy_context()
            self._displayed = True
            self._shown_at = time.monotonic()
            display(self._bundle(), raw=True, display_id=self.display_id)

    def _repr_mimebundle_(self, **kwargs):
        return self._bundle()

    def _bundle(self) -> dict:
        if self._static is not None:
            return self._static
        if self.render == "html":
            return self._html_bundle()
        return {WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.view.model_id},
                "text/plain": f"workbench dashboard (live) · {self.summary}"}

    def _publish(self, bundle: dict) -> None:
        """Replace what the page shows, in the output of the cell that showed it."""
        from IPython.display import update_display

        if not self._displayed:
            return
        update = lambda: update_display(bundle, raw=True, display_id=self.display_id)
        self._context.copy().run(update) if self._context is not None else update()
        self.messages += 1

    def _html_bundle(self) -> dict:
        """The live dashboard as plain HTML: header, the lines as an inline SVG (or the note), devices,
        step-time bars. Needs no script, no widget, no extension."""
        view = self.view
        plot = figures.svg(view.figure) if view.figure.get("data") else f"<p>{html.escape(view.note)}</p>"
        body = "".join([view.header, plot, view.devices, view.bars])
        return {"text/html": f"<div class='workbench-dashboard-html'>{body}</div>",
                "text/plain": f"workbench dashboard (live, HTML) · {self.summary}"}

    def _publish_html(self) -> None:
        """In HTML mode, replace what the page shows when something changed since it was last sent."""
        if self.render == "html" and self._static is None and self._html_sent != self.messages:
            self._publish(self._html_bundle())
            self._html_sent = self.messages  # counts this publication too

    def _maybe_fall_back(self) -> None:
        """``auto``: the widget was shown, and no page said it can draw it within the wait: go on as HTML."""
        if (self.render == "auto" and self._displayed and self._static is None and not self._alive.is_set()
                and self._shown_at is not None and time.monotonic() - self._shown_at > wait_s()):
            with self._lock:
                old, self.render = self.view, "html"
                self.view = self._new_view()
                self._sent_figure = False  # the new view gets the whole figure and every text
                self._texts_for = None
                self.refresh()
                self._publish_html()
                old.close()
            log.info("no page drew the dashboard's widget within %.0f s: it goes on as HTML", wait_s())

    def __repr__(self) -> str:
        return f"<Dashboard run {self.run_id or self.mode}, {self.updates} updates>"

    @property
    def pinned(self) -> bool:
        """Whether this dashboard has found its run."""
        return self.run_id is not None

    @property
    def ended(self) -> bool:
        """Whether it shows a static figure now (its run ended)."""
        return self._static is not None

    @property
    def history(self):
        """This dashboard's run as a :class:`workbench.metrics.history.History`."""
        return self.collector.history(self.run_id)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the refresh thread (stops by itself when the run or the collector ends)."""
        if self._thread is None:
            _register_exit()
            self._thread = threading.Thread(target=self._loop, name="workbench-dashboard", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop refreshing; the page keeps the last picture, as a static figure."""
        self._end()

    close = stop  # the live widget goes either way: a displayed dashboard leaves its static figure

    def finish(self, error: BaseException | None = None, wait: float = 2.0) -> None:
        """The cell that trained this run ended (``error``: what it raised): wait up to ``wait`` seconds
        for every rank's end of run, then leave a static figure in place of the live widget."""
        with self._lock:
            self._find_run()
        run = self._run()
        if run is not None:
            self.collector.wait_for(lambda c: run.done, wait)
        state, reason = None, None
        if run is not None and run.state == "training":  # some rank never said how its run ended
            interrupted = isinstance(error, KeyboardInterrupt)
            state = "interrupted" if interrupted else "failed" if error else "finished"
            reason = f"{type(error).__name__}: {error}".splitlines()[0][:300] if error else None
        self._end(state=state, reason=reason)

    def _end(self, state: str | None = None, note: str = "", reason: str | None = None) -> None:
        """Stop the thread; replace the widget by the static figure of what it shows."""
        self._closed.set()
        self._go_static(state, note, reason)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _go_static(self, state: str | None = None, note: str = "", reason: str | None = None) -> None:
        with self._lock:
            if self._static is not None:
                return
            self._find_run()
            run = self._run()
            if run is not None:
                self._read(run, final=True)
            if state is None and run is not None and run.state == "training":
                state = "stopped"
            self._static = self.static_bundle(note, state, reason)
            self._send_text(run, final=True)  # how the run ended, for a view that outlives the widget
            self._publish(self._static)  # first the figure, then the widget goes: never "model not found"
            self.view.close()

    def static_bundle(self, note: str = "", state: str | None = None, reason: str | None = None) -> dict:
        """The static output of what it shows now: plotly's JSON, an HTML fallback, one line of text."""
        plot = self._plot
        self.summary = describe(self._run(), plot.step, plot.has_points, state, reason) + plot.words()
        figure = plot.figure(every_rank=True) if plot.has_points else None
        return figures.static_bundle(self.summary, figure, note)

    def _go_live(self) -> None:
        """A new run (``"latest"``): a new widget in place of the static figure."""
        self._static = None
        self.view = self._new_view()
        if self._displayed:
            self._publish(self._bundle())

    def _new_view(self):
        if self._view_factory is not None:
            return self._view_factory()
        if self.render == "html":
            from workbench.widgets.polled import PolledView

            return PolledView()  # the texts and the figure with every point; published as HTML
        from workbench.widgets.view import DashboardView, plotly_library

        view = DashboardView(library=plotly_library().model_id)
        view.figure_now = lambda: self._plot.figure() if self._plot.has_points else {}
        view.on_msg(lambda _view, content, _buffers: content.get("alive") and self._alive.set())
        return view

    def _loop(self) -> None:
        while not self._closed.wait(self.interval):
            try:
                if self.collector.closed:
                    self._end(note="the pool stopped")
                    return
                self.refresh()
                self._maybe_fall_back()
                self._publish_html()
                run = self._run()
                if self._static is None and run is not None and run.done:
                    self._go_static()
                    if self.mode != "latest":
                        return
            except Exception:
                log.exception("the dashboard could not refresh")

    # -- reading the collector -------------------------------------------------------------------
    def _run(self) -> Run | None:
        return self.collector.runs[self.run_id - 1] if self.run_id else None

    def _find_run(self) -> None:
        latest = self.collector.latest_run(self.ranks)
        if self.mode == "latest":
            if latest is not None and latest.id != self.run_id:
                self.run_id = latest.id
                self._reset()
                if self._static is not None:
                    self._go_live()
        elif self.mode == "next" and self.run_id is None and latest is not None and latest.id > self._after:
            self.run_id = latest.id

    def _reset(self) -> None:
        """Forget what was read of the run (a new run, or the collector merged points not read yet)."""
        self._seen: dict[int, int] = {}  # rank -> step records of the run read so far
        self._plot = RunPlot(self.window)
        self._sent_figure = False
        self._texts_for: tuple | None = None  # (collector version, states) the texts were made for

    def refresh(self) -> None:
        """Bring every part up to date now (the thread calls this about once a second; tests may too)."""
        with self._lock:
            if self._static is not None and self.mode != "latest":
                return
            self._version = self.collector.version
            self._find_run()
            if self.mode == "next" and not self.pinned:
                return  # not shown before its run starts
            run = self._run()
            if run is not None and self._static is None:
                self._read(run)
            self._send_text(run)
            self.updates += 1

    def _read(self, run: Run, final: bool = False) -> None:
        """Feed the records that came since the last read; send the page their points only."""
        c = self.collector
        new = c.steps_since(run.id, self._seen)
        if any(cols is None for cols, _ in new.values()):  # fell behind the collector's downsampling
            self._reset()
            with c.lock():
                new = {r: ({f: s.column(f) for f in s.fields}, s.received)
                       for r, s in c.step_series(run.id).items()}
        self._seen.update({r: received for r, (_, received) in new.items()})
        times = [x for cols, _ in new.values() if cols for x in cols["t"]]
        active = run.ranks - run.failed - set(run.errors) - set(run.echoes)
        cols = {r: c for r, (c, _) in new.items()}
        final = final or run.state != "training"
        whole, added = self._plot.feed(sorted(run.ranks | set(new)), active, cols, final)
        regroups = [e for e in list(c.events) if e["event"] == "regroup" and e.get("run") == run.id]
        whole |= self._plot.mark(regroups)  # a rank lost or taken back: marked on the loss curve
        self._send_points(whole, added, times)

    def _send_points(self, whole: bool, added: dict, times: list[float]) -> None:
        view = self.view
        if not self._plot.has_points:
            return
        if whole or not self._sent_figure:
            view.figure = self._plot.figure()
            self._sent_figure = True
        elif added:
            idx = sorted(added)
            view.send({"extend": {"indices": idx, "x": [added[i][0] for i in idx],
                                  "y": [figures.clean(added[i][1]) for i in idx]}})
        else:
            return
        self.messages += 1
        sent = time.time()
        self.delays.extend(sent - t for t in times)

    def _send_text(self, run: Run | None, final: bool = False) -> None:
        """Send the texts that changed; ``final``: once the run ended, with the summary it ended on."""
        c = self.collector
        status = said_states(c.status(), self.rank_words)
        # nothing came and no rank changed state: the texts are as they were (no table built per rank)
        key = (c.version, tuple(status.items()))
        if key == self._texts_for and not final:
            return
        self._texts_for = key
        with c.lock():
            missing = c.stats["missing"]
        plot = self._plot
        if not final:
            self.summary = describe(run, plot.step, plot.has_points) + plot.words()
        run_ranks = sorted(run.ranks) if run is not None else []
        values = {
            **self._state_texts(status, run_ranks, missing),
            "note": "" if plot.has_points else _note(run),
            "bars": self._bars() if plot.last else "",
        }
        view = self.view
        changed = {k: v for k, v in values.items() if getattr(view, k) != v}
        if changed and (self._static is None or final):
            with view.hold_sync():
                for k, v in changed.items():
                    setattr(view, k, v)
            self.messages += 1

    def texts_now(self) -> dict[str, str]:
        """The header line and the device table as they stand now: the summary it showed last, each rank's
        state and device now, also once its run ended (a view that outlives the widget, polled by a page:
        the states said at the run's end were kept there through a busy cell, a lost rank and a restart)."""
        return self._state_texts(*self.states_now())

    def _state_texts(self, status: dict[int, str], run_ranks: list[int], missing: int) -> dict[str, str]:
        c = self.collector
        with c.lock():
            devices = {r: s.last() for r, s in c.devices.items()}
            infos = {r: (st.host, dict(st.info)) for r, st in c.ranks.items()}
        steps = {r: s for r, (s, _) in self._plot.last.items()}
        return {"header": header_html(self.summary, status, run_ranks, missing),
                "devices": device_table(sorted(set(status) | set(run_ranks)), devices, infos, status, steps)}

    def states_now(self) -> tuple[dict[int, str], list[int], int]:
        """What the header counts now: each rank's state, the run's ranks, the records missing."""
        c = self.collector
        status = said_states(c.status(), self.rank_words)
        run = self._run()
        with c.lock():
            missing = c.stats["missing"]
        return status, sorted(run.ranks) if run is not None else [], missing

    def _bars(self) -> str:
        return step_time_bars(*self._plot.bar_rows(), RECENT_STEPS)

    def show_ranks(self, ranks) -> None:
        """Past 8 ranks (the median in its min-max band), also draw these ranks' own loss lines, live
        (``[]``: none again). The figure a run leaves has every rank's line, shown by a click on its
        legend entry.

        >>> dash.show_ranks([7])               # doctest: +SKIP
        """
        with self._lock:
            if self._plot.show(ranks):
                self._send_points(True, {}, [])

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
        body = [self.view.header or f"<p>{self.summary}</p>"]
        if self._plot.has_points:
            figure = self._plot.figure(every_rank=True)
            body.append(pio.to_html(figure, full_html=False, include_plotlyjs=True))
            body.append(self.view.devices)
            body.append(self._bars())
        title = f"workbench run {self.run_id}" if self.run_id else "workbench dashboard"
        path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
                        f"<body style='font-family: sans-serif'>{''.join(body)}</body></html>")
        return path


def _note(run: Run | None) -> str:
    """The sentence shown instead of empty axes."""
    if run is None:
        return "No training run yet: a Trainer run (or publisher.step) on the ranks shows its curves here."
    return describe(run, 0, False) + "…"


_exit_registered = threading.Event()


def _register_exit() -> None:
    """At kernel shutdown or restart, every live dashboard leaves its static figure (registered after
    the pool's own exit handler, so it runs first)."""
    if not _exit_registered.is_set():
        _exit_registered.set()
        atexit.register(_end_all)


def _end_all() -> None:
    for dash in list(_live):
        try:
            dash._end(note="the kernel shut down")
        except Exception:
            log.debug("a dashboard could not leave its figure at exit", exc_info=True)
