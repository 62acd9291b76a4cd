"""The dashboard in the split view that a pool card's "Open dashboard" makes (issue 24, items 3 and 10), in
a real JupyterLab, Debian's Chromium, Playwright.

The card's "Open dashboard" splits the main area, then the notebook trains on its own 2-rank pool, on a
wide screen; its run leaves plotly's static figure (and JupyterLab's plotly renderer saves a PNG of it, as
wide as the cell was). Then the window is narrower (a laptop's): the notebook and the docked dashboard are
about 500 px each, and both lay out for the width they have: the throughput axis's title is never over the
loss plot, the title is never cut off or under plotly's mode bar, the docked header fits. After a save and
a reload (the docked panel comes back) the saved PNG is scaled to the cell, not clipped, and the page
raised no error.
Screenshots under build/ui/: 24-3-dashboard-split.png, 24-3-dashboard-split-reloaded.png.
"""

from __future__ import annotations

import psutil
import pytest

from tests.conftest import alive
from tests.ui.lab import needs_chromium, run_cell, run_lab
from tests.ui.test_dashboard_browser import (  # browser: the fixture
    SHOTS,
    STEPS,
    TRAIN,
    _notebook,
    _open,
    _page,
    _reload_to_image,
    _static_figure,
    browser,  # noqa: F401
)

pytestmark = [pytest.mark.slow, needs_chromium]

# where the throughput plot's y title and the loss plot lie, in the figure's own pixels
GEOMETRY = """(el) => {
  const box = (n) => { const b = n.getBoundingClientRect(), o = el.getBoundingClientRect();
                       return {left: b.left - o.left, right: b.right - o.left, top: b.top - o.top,
                               bottom: b.bottom - o.top}; };
  const x = el._fullLayout.xaxis;
  const title = el.querySelector('.gtitle');
  return {width: el.getBoundingClientRect().width, lossRight: x._offset + x._length,
          y2title: box(el.querySelector('.g-y2title')), title: title ? box(title) : null};
}"""


def _overlap(a: dict, b: dict) -> bool:
    return (a["left"] < b["right"] and b["left"] < a["right"]
            and a["top"] < b["bottom"] and b["top"] < a["bottom"])


def _laid_out(plot, name: str) -> dict:
    """Assert the throughput axis's title is right of the loss plot and a title fits the figure."""
    g = plot.evaluate(GEOMETRY)
    assert g["y2title"]["left"] >= g["lossRight"], (name, g)  # "samples/s" not over the loss plot
    if g["title"] is not None:
        assert g["title"]["right"] <= g["width"] + 1, (name, g)  # not cut off
    return g


@pytest.mark.timeout(600)
def test_the_dashboards_fit_the_split_view_and_a_reload_keeps_them_whole(tmp_path, browser):  # noqa: F811
    from playwright.sync_api import expect

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with run_lab(tmp_path, {"train.ipynb": _notebook(TRAIN)}) as lab:
        errors: list[str] = []
        with _page(browser, lab, "24-3-dashboard-split", errors) as page:
            page.set_viewport_size({"width": 2400, "height": 1000})  # a wide screen while it trains
            cells = _open(page, lab, "train.ipynb", set_up=2)
            page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()  # the card lists the pool
            card = page.locator("#workbench-pools .wb-Card").first
            expect(card).to_have_attribute("data-state", "running", timeout=60_000)
            card.get_by_role("button", name="Open dashboard").click()  # split beside the notebook
            docked = page.locator(".wb-DashboardPanel")
            header = docked.locator(".workbench-dashboard-header")
            expect(header).to_contain_text("no training run yet", timeout=60_000)
            run_cell(page, cells, 2)
            cell = run_cell(page, cells, 3, timeout=240_000)
            _static_figure(cell, f"finished at step {STEPS}")
            expect(header).to_contain_text(f"finished at step {STEPS}", timeout=60_000)
            expect(docked.locator(".main-svg").first).to_be_visible()
            # JupyterLab's plotly renderer saved a PNG of the figure as wide as the cell is now; then the
            # window is narrower (a laptop's): both dashboards lay out again for half of it
            output = cell.locator(".jp-OutputArea-output").first
            wide = output.bounding_box()["width"]
            page.set_viewport_size({"width": 1400, "height": 1000})
            page.wait_for_function("([o, w]) => o.getBoundingClientRect().width < w * 0.6",
                                   arg=[output.element_handle(), wide], timeout=30_000)
            narrow = docked.bounding_box()["width"]
            page.wait_for_function(  # the docked figure was laid out again for the panel's new width
                "([el, w]) => el._fullLayout && el._fullLayout.width <= w",
                arg=[docked.locator(".js-plotly-plot").first.element_handle(), narrow], timeout=30_000)
            cell.scroll_into_view_if_needed()
            plot = cell.locator(".jp-RenderedPlotly.js-plotly-plot")
            _laid_out(plot, "notebook")
            plot.hover()  # plotly's mode bar shows on hover: not over the title
            modebar = plot.locator(".modebar")
            expect(modebar).to_be_visible()
            title, bar = plot.locator(".gtitle").bounding_box(), modebar.bounding_box()
            as_box = lambda b: {"left": b["x"], "right": b["x"] + b["width"], "top": b["y"],
                                "bottom": b["y"] + b["height"]}
            assert not _overlap(as_box(title), as_box(bar)), (title, bar)
            _laid_out(docked.locator(".js-plotly-plot").first, "docked")
            assert header.evaluate("(h) => h.scrollWidth <= h.clientWidth + 1"), header.inner_text()
            page.screenshot(path=str(SHOTS / "24-3-dashboard-split.png"))
            run_cell(page, cells, 4)  # %dist stop

            # save and reload: the docked panel comes back; the PNG fits the half-width cell
            with page.expect_response(lambda r: "/api/contents/train.ipynb" in r.url
                                      and r.request.method == "PUT" and r.ok, timeout=30_000):
                page.evaluate("() => { window.jupyterapp.commands.execute('docmanager:save'); }")
            cell, image = _reload_to_image(page, lab, "train.ipynb", 3)
            shown = image.bounding_box()["width"]
            room = cell.locator(".jp-OutputArea-output").first.bounding_box()["width"]
            natural = image.evaluate("(i) => i.naturalWidth")
            assert natural > room and shown <= room + 1, (natural, shown, room)
            expect(page.locator(".wb-DashboardPanel")).to_have_count(1, timeout=30_000)
            page.wait_for_timeout(3000)  # errors raised by what a reload restores come within this
            page.screenshot(path=str(SHOTS / "24-3-dashboard-split-reloaded.png"))
            assert errors == [], errors
    assert not alive(list(_started_since(before))), _started_since(before)


def _started_since(before: set[int]) -> set[int]:
    """This process's descendants that are not, nor descend from, the ones in ``before`` (the browser the
    fixture started, and its renderers, stay until the fixture ends)."""
    left = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if not ({p.pid} | {a.pid for a in p.parents()}) & before:
                left.add(p.pid)
        except psutil.NoSuchProcess:
            continue
    return left
