"""The dashboard of one ``%%distributed`` cell: hidden until a training run starts in it.

The magic calls :func:`monitor_cell` before it runs the cell, :meth:`CellMonitor.tick` from the
cell's wait loop and :meth:`CellMonitor.finish` after. Without ``--monitor`` the dashboard is
created and displayed only when a training run starts in the cell, so a cell that does not
train costs nothing and shows (and saves) nothing extra. When the cell ends, the dashboard says
how its run ended and leaves a static figure in place of its live widget.

>>> mon = monitor_cell(None)      # no session, no collector: nothing to show
>>> mon.finish()
"""

from __future__ import annotations

import sys


class CellMonitor:
    """The dashboard of one cell. ``tick`` while the cell runs; ``finish`` once it (or its run) ends.

    Without ``always`` nothing is created or displayed until a run starts in this cell: a cell
    that does not train pays one dictionary look-up per tick, and shows and saves nothing extra.
    """

    def __init__(self, collector=None, always: bool = False, ranks=None):
        self.collector = collector
        self.always = always
        self.ranks = ranks  # the cell's ranks on a sub-mesh of a split pool (None: any run is its)
        self.dashboard = None
        self._finished = False
        latest = collector.latest_run(ranks) if collector is not None else None
        self._after = latest.id if latest else 0
        if collector is not None and always:
            self._show(run="next")

    def _show(self, run) -> None:
        from IPython.display import display

        from workbench.widgets.live_dashboard import Dashboard

        self.dashboard = Dashboard(self.collector, run=run, ranks=self.ranks)
        display(self.dashboard)

    def tick(self) -> None:
        """From the cell's wait loop (the kernel's main thread): show the dashboard once a run starts."""
        if self.dashboard is not None or self.collector is None or self._finished:
            return
        latest = self.collector.latest_run(self.ranks)
        if latest is not None and latest.id > self._after:
            self._show(run=latest.id)

    def finish(self, error: BaseException | None = None, keep: bool = False) -> None:
        """The cell ended (``error``: what it raised, if anything). ``keep``: the run goes on (``--async``):
        its dashboard stays live until the run ends."""
        if self._finished:
            return
        self.tick()  # a run that started at the very end
        self._finished = True
        dash = self.dashboard
        if dash is None:
            return
        for info, err in getattr(error, "failures", None) or []:  # the root cause first
            name = getattr(err, "ename", type(err).__name__)
            if name != "KeyboardInterrupt":  # an interrupt is not a failure: the run says where it stopped
                reason = f"{name}: {getattr(err, 'evalue', err)}"
                dash.collector.mark_failed(info.rank, reason, run=dash.run_id)
        if not keep:
            dash.finish(error)


def monitor_cell(session, always: bool = False, ranks=None) -> CellMonitor:
    """The dashboard for the cell about to run: at once with ``always``, else when its run starts (``ranks``:
    the cell's, where the pool is split: its sub-mesh's run, not another's beside it)."""
    collector = getattr(session, "metrics", None)
    if collector is None or collector.closed or not _has_widgets():
        return CellMonitor()
    from workbench.widgets.live_dashboard import warm_up

    warm_up()
    return CellMonitor(collector, always, ranks)


def submit_cell(session, code: str, *, ranks=None, timeout=None, monitor: CellMonitor | None = None):
    """``%%distributed --async``: start the cell, return its :class:`~workbench.session.RunHandle` at once.

    The ranks' output stays in the handle (``handle.wait().ranks[0].stdout``).
    """
    handle = session.submit(code, ranks=ranks, timeout=timeout)
    if monitor is not None:
        handle.add_done_callback(lambda h: monitor.finish(_error_of(h), keep=True))
    print("running in the background: `run = _` here, then `run.wait()`, `run.stop()` or `run.done()`.")
    return handle


def _error_of(handle):
    try:
        handle.wait(0)
    except Exception as exc:
        return exc
    return None


def _has_widgets() -> bool:
    """A front end that can show widgets (a Jupyter kernel, not a terminal)."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    return type(get_ipython()).__name__ == "ZMQInteractiveShell"
