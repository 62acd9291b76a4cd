"""The page-side code of the dashboard, from this package and the installed plotly (never a CDN): the
notebook's widget sends it through the kernel, the Jupyter server serves it to the docked dashboard.

``dashboard.js`` is compiled by the package's build (``jlpm build:widget`` in ``extension/``, run by
``pip install`` and ``make setup``) from ``extension/src/widget/dashboard.ts``; the wheel carries it.

>>> dashboard_js().name, plotly_js().name
('dashboard.js', 'plotly.min.js')
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DASHBOARD_JS = Path(__file__).with_name("dashboard.js")  # the anywidget module that draws the dashboard


def dashboard_js() -> Path:
    """The dashboard's ES module; ``FileNotFoundError`` saying how to build it where it was not built (a
    checkout before its first build)."""
    if not DASHBOARD_JS.is_file():
        raise FileNotFoundError(
            f"{DASHBOARD_JS} is not built: the package's build compiles it from "
            "extension/src/widget/dashboard.ts (`make setup`, `pip install -e .`, or `jlpm build:widget` "
            "in extension/).")
    return DASHBOARD_JS


def plotly_js() -> Path:
    """The ``plotly.min.js`` that the installed plotly package ships."""
    spec = importlib.util.find_spec("plotly")
    assert spec is not None and spec.origin is not None, "plotly is a dependency"
    return Path(spec.origin).parent / "package_data" / "plotly.min.js"
