"""Kernel-side widgets: the live training dashboard (``live_dashboard``, one logic for two views:
``view`` in the notebook, ``polled`` for the panel), the per-cell monitor (``cell_monitor``) and a
sweep's comparison dashboard (``sweep_dashboard``: ``wb.Sweep``).

>>> import workbench as wb
>>> wb.dashboard()          # doctest: +SKIP
"""

from __future__ import annotations


def dashboard(session=None, *, run="latest", interval: float = 0.25, window: int = 2000,
              render: str | None = None):
    """A live dashboard of the running pool: the latest training run, every rank's device.

    ``run``: ``"latest"`` (follows new runs), ``"next"`` or a run number. Show it by making it
    the cell's last expression; ``.history`` and ``.save_html(path)`` export it. ``render``: ``"auto"``
    (the widget, or plain HTML where the page cannot draw it), ``"widget"`` or ``"html"`` (default:
    ``WORKBENCH_DASHBOARD``, else auto).

    >>> import workbench as wb
    >>> dash = wb.dashboard()                 # doctest: +SKIP
    >>> dash.history.dataframe().tail()       # doctest: +SKIP
    """
    from workbench.session import current
    from workbench.widgets.live_dashboard import Dashboard

    session = session or current()
    collector = getattr(session, "metrics", None)
    if collector is None:
        raise ValueError("this pool has no metrics collector (it could not start): see the kernel log.")
    return Dashboard(collector, run=run, interval=interval, window=window, render=render)


__all__ = ["dashboard"]
