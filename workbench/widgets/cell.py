"""The dashboard of one ``%%distributed`` cell: hidden until a training run starts in it.

The magic calls :func:`monitor_cell` before it runs the cell and :meth:`CellMonitor.finish`
after. Without ``--monitor`` the placeholder is an empty, hidden box that becomes the dashboard
when a run starts; when the cell ends without one it is closed and its output emptied, so a
cell that does not train shows (and saves) nothing extra.

>>> mon = monitor_cell(None)      # no session, no collector: nothing to show
>>> mon.finish()
"""

from __future__ import annotations

import sys


class CellMonitor:
    """What :func:`monitor_cell` shows for one cell; ``finish`` once the cell (or its run) ends."""

    def __init__(self, dashboard=None, always: bool = False, handle=None):
        self.dashboard = dashboard
        self.always = always
        self.handle = handle  # the DisplayHandle of the placeholder
        self._finished = False

    def finish(self, error=None, keep: bool = False) -> None:
        """The cell ended (``error``: its RankError, if any). ``keep``: the run goes on (``--async``)."""
        dash = self.dashboard
        if dash is None or self._finished:
            return
        self._finished = True
        for info, _ in getattr(error, "failures", None) or []:
            dash.collector.mark_failed(info.rank, "the cell raised")
        if keep or self.always:
            return
        if not dash.pinned:
            dash.refresh()  # a run that started at the very end
        if not dash.pinned:
            dash.close()
            if self.handle is not None:
                self.handle.update({"text/plain": ""}, raw=True)


def monitor_cell(session, always: bool = False) -> CellMonitor:
    """Show a dashboard for the cell about to run (hidden until its run starts, unless ``always``)."""
    collector = getattr(session, "metrics", None)
    if collector is None or collector.closed or not _has_widgets():
        return CellMonitor()
    from IPython.display import display

    from workbench.widgets.dashboard import Dashboard, warm_up

    warm_up()
    dash = Dashboard(collector, run="next", hidden=not always)
    handle = display(dash, display_id=True)
    return CellMonitor(dash, always, handle)


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
