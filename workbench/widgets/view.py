"""The dashboard's widget: one anywidget (its own small ES module, ``dashboard.js``) and plotly.js.

plotly.js is the ``plotly.min.js`` that the plotly package ships, sent to the page once per kernel as
the binary state of one shared :class:`PlotlyLibrary` model (never fetched from a CDN); every
dashboard view loads it from there once per page.

>>> view = DashboardView(library=plotly_library().model_id)
>>> sorted(k for k in view.keys if not k.startswith("_"))
['bars', 'devices', 'figure', 'header', 'layout', 'library', 'note', 'tabbable', 'tooltip', 'uid']
>>> view.close()
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anywidget
import ipywidgets as W
import traitlets as T

from workbench.widgets.assets import dashboard_js, plotly_js


class PlotlyLibrary(W.Widget):
    """plotly.js as a widget model with no view: its code travels to the page as one binary buffer."""

    code = T.Bytes().tag(sync=True)


_library: PlotlyLibrary | None = None


def plotly_library() -> PlotlyLibrary:
    """The kernel's one :class:`PlotlyLibrary` (made on first use, again if it was closed)."""
    global _library
    if _library is None or _library.comm is None:
        _library = PlotlyLibrary(code=plotly_js().read_bytes())
    return _library


class DashboardView(anywidget.AnyWidget):
    """The live dashboard in the page: HTML header, device table and note; loss and throughput lines
    (``figure``, extended by ``{"extend": {"indices", "x", "y"}}`` messages); step-time bars (``bars``)."""

    _esm = dashboard_js()  # compiled from extension/src/widget/dashboard.ts by the package's build
    uid = T.Unicode().tag(sync=True)
    # the PlotlyLibrary's model id, not a widget reference: the view shows its text at once, the plot
    # as soon as plotly.js is in the page (a reference would hold the view back until then)
    library = T.Unicode("").tag(sync=True)
    header = T.Unicode("").tag(sync=True)
    note = T.Unicode("").tag(sync=True)  # a sentence shown instead of the plot while it has no point
    devices = T.Unicode("").tag(sync=True)
    figure = T.Dict().tag(sync=True)  # {"data": [...], "layout": {...}}, or {} while there is no point
    bars = T.Unicode("").tag(sync=True)  # where step time goes, HTML

    figure_now: Callable[[], dict] | None = None  # the figure with every point sent since it was set

    def __init__(self, **kwargs):
        kwargs.setdefault("uid", uuid.uuid4().hex)
        super().__init__(**kwargs)

    def get_state(self, key=None, drop_defaults=False):
        """The state a page asks for when it (re)loads: the figure as it is now, extended points included."""
        state = super().get_state(key, drop_defaults)
        if "figure" in state and self.figure_now is not None:
            state["figure"] = self.figure_now()
        return state
