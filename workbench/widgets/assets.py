"""The page-side code of the dashboard, from this package and the installed plotly (never a CDN): the
notebook's widget sends it through the kernel, the Jupyter server serves it to the docked dashboard.

>>> DASHBOARD_JS.name, plotly_js().name
('dashboard.js', 'plotly.min.js')
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DASHBOARD_JS = Path(__file__).with_name("dashboard.js")  # the anywidget module that draws the dashboard


def plotly_js() -> Path:
    """The ``plotly.min.js`` that the installed plotly package ships."""
    spec = importlib.util.find_spec("plotly")
    assert spec is not None and spec.origin is not None, "plotly is a dependency"
    return Path(spec.origin).parent / "package_data" / "plotly.min.js"
