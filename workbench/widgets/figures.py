"""The dashboard's figures as plain plotly JSON (no plotly import, no validation pass: we write valid
specs), and the static output a finished run leaves in the notebook.

The static output is plotly's own mime bundle, ``application/vnd.plotly.v1+json`` (JupyterLab draws it
with its plotly renderer, also after a reload without the kernel), with a ``text/html`` fallback that
needs no script at all (the header and an inline SVG of the same lines: nbviewer, GitHub) and a
``text/plain`` summary.

>>> loss, rate = trace("rank 0", [1, 2, 3], [0.9, 0.5, 0.4]), trace("samples/s", [1, 2], [10.0, 12.0], axis=2)
>>> fig = lines_figure([loss], [rate])
>>> bundle = static_bundle("run 1 finished at step 3", fig)
>>> sorted(bundle)
['application/vnd.plotly.v1+json', 'text/html', 'text/plain']
>>> "<svg" in bundle["text/html"], "<script" in bundle["text/html"]
(True, False)
"""

from __future__ import annotations

import html
import math

PLOTLY_MIME = "application/vnd.plotly.v1+json"
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
CONFIG = {"displaylogo": False, "showSendToCloud": False, "showEditInChartStudio": False}  # nothing online
_AXIS = {"gridcolor": "#eeeeee", "zerolinecolor": "#dddddd", "linecolor": "#bbbbbb"}


def clean(values) -> list:
    """Floats for JSON: NaN and infinities become None (a gap in the line)."""
    return [None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v for v in values]


def trace(name: str, x, y, *, axis: int = 1, colour: str | None = None, **extra) -> dict:
    """One line of the loss (``axis=1``) or throughput (``axis=2``) plot."""
    t = {"type": "scatter", "mode": "lines", "name": name, "x": list(x), "y": clean(y),
         "xaxis": f"x{axis if axis > 1 else ''}", "yaxis": f"y{axis if axis > 1 else ''}"}
    if colour:
        t["line"] = {"color": colour}
    return {**t, **extra}


def lines_figure(loss: list[dict], throughput: list[dict], title: str | None = None) -> dict:
    """Loss per rank (left) and the pool's throughput (right), side by side.

    The throughput's axis is on the figure's right edge, so its ticks and title never lie over the loss
    plot however narrow the figure is (a notebook beside a docked dashboard is about 500 px wide).
    """
    layout = {
        "height": 320, "margin": {"l": 55, "r": 60, "t": 30, "b": 75},
        "paper_bgcolor": "white", "plot_bgcolor": "white", "font": {"size": 12},
        "legend": {"orientation": "h", "y": -0.32, "traceorder": "normal"},  # a band would reverse it
        "xaxis": {"domain": [0, 0.47], "anchor": "y", "title": {"text": "step"}, **_AXIS},
        "yaxis": {"anchor": "x", "title": {"text": "loss"}, **_AXIS},
        "xaxis2": {"domain": [0.53, 1], "anchor": "y2", "title": {"text": "step"}, **_AXIS},
        "yaxis2": {"anchor": "x2", "side": "right", "title": {"text": "samples/s"}, "rangemode": "tozero",
                   **_AXIS},
    }
    if title:
        _title(layout, title)
    return {"data": [*loss, *throughput], "layout": layout}


TITLE_CHARS = 46  # a title line at most this long fits a 500-px figure at 14 px
MODEBAR_PX = 36  # the top row, where plotly's mode bar shows on hover: the title goes below it


def title_lines(text: str, width: int = TITLE_CHARS) -> list[str]:
    """A title in lines of at most ``width`` characters, broken at its " · " (plotly never wraps a title).

    >>> title_lines("workbench · run 1 finished at step 300 · loss 0.05 · 734 samples/s")
    ['workbench · run 1 finished at step 300', 'loss 0.05 · 734 samples/s']
    """
    lines: list[str] = []
    for part in text.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return lines


def _title(layout: dict, text: str) -> None:
    """The title at the top left in lines that fit, below the mode bar's row, with the room it needs."""
    lines = title_lines(text)
    layout["title"] = {"text": "<br>".join(html.escape(line) for line in lines), "font": {"size": 14},
                       "x": 0.01, "xanchor": "left", "xref": "paper", "yref": "container",
                       "y": 1 - MODEBAR_PX / layout["height"], "yanchor": "top"}
    extra = MODEBAR_PX + 18 * len(lines)
    layout["margin"] = {**layout["margin"], "t": extra + 12}
    layout["height"] += extra


def mark_steps(figure: dict, marks: dict[int, str]) -> dict:
    """A dashed line on the loss plot at each marked step, with its text (e.g. a rank lost).

    >>> fig = mark_steps(lines_figure([], []), {412: "rank 1 lost at step 412; continuing on 3 ranks"})
    >>> fig["layout"]["shapes"][0]["x0"], fig["layout"]["annotations"][0]["text"][:11]
    (412, 'rank 1 lost')
    """
    layout = figure["layout"]
    layout["shapes"] = [{"type": "line", "xref": "x", "yref": "y domain", "x0": step, "x1": step, "y0": 0,
                         "y1": 1, "line": {"color": "#d62728", "dash": "dash", "width": 1}}
                        for step in sorted(marks)]
    layout["annotations"] = [{"xref": "x", "yref": "y domain", "x": step, "y": 1, "yanchor": "bottom",
                              "text": html.escape(text), "showarrow": False,
                              "font": {"size": 10, "color": "#d62728"}}
                             for step, text in sorted(marks.items())]
    return figure


def static_bundle(summary: str, figure: dict | None, note: str = "") -> dict:
    """What a finished run leaves in the notebook: plotly's JSON where there are points, else a sentence.

    ``summary``: one line (run, how it ended, at which step, loss, rate); ``note``: a sentence more.
    """
    text = f"workbench · {summary}" + (f" · {note}" if note else "")
    if figure is None:
        return {"text/plain": text,
                "text/html": f"<div class='workbench-dash-title'><b>{html.escape(text)}</b></div>"}
    figure = {**figure, "layout": dict(figure["layout"])}
    _title(figure["layout"], text)
    return {
        PLOTLY_MIME: {"data": figure["data"], "layout": figure["layout"], "config": CONFIG},
        "text/html": f"<div><b>{html.escape(text)}</b></div>{svg(figure)}",
        "text/plain": text,
    }


def svg(figure: dict, width: int = 760, height: int = 240) -> str:
    """The figure's lines drawn as an inline SVG (two panels, min and max on each axis): no script needed."""
    panels = []
    half = width // 2
    for i, (axis, label) in enumerate((("x", "loss"), ("x2", "samples/s"))):
        lines = [t for t in figure["data"] if t.get("xaxis", "x") == axis]
        panels.append(_panel(lines, label, i * half, half, height))
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' font-family='sans-serif' font-size='11'>{''.join(panels)}</svg>")


def _panel(lines: list[dict], label: str, left: int, width: int, height: int) -> str:
    pts = [(x, y) for t in lines for x, y in zip(t["x"], t["y"], strict=False) if y is not None]
    box = (left + 50, 20, width - 65, height - 50)  # x, y, w, h of the plot area
    out = [f"<rect x='{box[0]}' y='{box[1]}' width='{box[2]}' height='{box[3]}' fill='none' stroke='#bbb'/>",
           f"<text x='{box[0]}' y='{box[1] - 6}'>{html.escape(label)}</text>"]
    if not pts:
        return "".join(out)
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    sx = lambda x: box[0] + (x - x0) / ((x1 - x0) or 1) * box[2]
    sy = lambda y: box[1] + box[3] - (y - y0) / ((y1 - y0) or 1) * box[3]
    for k, t in enumerate(lines):
        xy = zip(t["x"], t["y"], strict=False)
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in xy if y is not None)
        colour = (t.get("line") or {}).get("color", COLOURS[k % len(COLOURS)])
        out.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.5' points='{coords}'/>")
    bottom = box[1] + box[3]
    out += [f"<text x='{box[0] - 4}' y='{box[1] + 10}' text-anchor='end'>{y1:.3g}</text>",
            f"<text x='{box[0] - 4}' y='{bottom}' text-anchor='end'>{y0:.3g}</text>",
            f"<text x='{box[0]}' y='{bottom + 14}'>step {x0:g}</text>",
            f"<text x='{box[0] + box[2]}' y='{bottom + 14}' text-anchor='end'>{x1:g}</text>"]
    return "".join(out)
