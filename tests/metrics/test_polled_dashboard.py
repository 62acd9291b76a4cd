"""The dashboard on a view that a page polls (what the Jupyter server docks beside a notebook): the real
Dashboard and a real Collector fed through ``ingest``; the page is a dict that applies the answers the way
the panel does (whole figure, or new points appended)."""

from __future__ import annotations

import pytest

from tests.metrics.test_dashboard_units import _end, _msg, _start
from workbench.metrics.collector import Collector
from workbench.widgets.live_dashboard import Dashboard
from workbench.widgets.polled import KEEP_MESSAGES, PolledView

pytestmark = pytest.mark.timeout(30)


class Page:
    """What the docked panel keeps: the view it shows, the last seq, the figure with every point."""

    def __init__(self):
        self.view, self.seq, self.figure, self.answers = "", 0, {}, []

    def poll(self, polled: PolledView) -> dict:
        return self.apply(polled.since(self.seq, self.view))

    def apply(self, a: dict) -> dict:
        if "figure" in a:
            self.figure = a["figure"]
        for ext in a["extend"]:
            for k, i in enumerate(ext["indices"]):
                self.figure["data"][i]["x"] += ext["x"][k]
                self.figure["data"][i]["y"] += ext["y"][k]
        self.view, self.seq = a["view"], a["seq"]
        self.answers.append(a)
        return a


@pytest.fixture
def dash():
    collector = Collector()
    d = Dashboard(collector, start=False, view=PolledView)
    yield d
    d.close()
    collector.close()


def test_a_polling_page_gets_the_figure_once_then_only_new_points(dash):
    page = Page()
    dash.refresh()
    first = page.poll(dash.view)
    assert first["figure"] == {} and "No training run yet" in first["note"] and first["live"]
    dash.collector.ingest(_msg(0, range(5), events=[_start()]))
    dash.refresh()
    a = page.poll(dash.view)
    assert "figure" in a and "step 5" in a["header"] and a["note"] == ""
    dash.collector.ingest(_msg(0, range(5, 8)))
    dash.refresh()
    a = page.poll(dash.view)
    assert "figure" not in a and [e["x"][0] for e in a["extend"]] == [[6, 7, 8]]
    assert "figure" not in page.poll(dash.view) and page.answers[-1]["extend"] == []  # nothing new
    assert page.figure["data"][0]["y"] == dash.view.figure["data"][0]["y"]
    assert len(page.figure["data"][0]["y"]) == 8
    # a second page opened now gets the same picture at once
    other = Page()
    other.poll(dash.view)
    assert other.figure == page.figure


def test_a_page_that_fell_behind_gets_the_whole_figure():
    view = PolledView()
    view.figure = {"data": [{"x": [], "y": []}], "layout": {}}
    page = Page()
    page.poll(view)
    for i in range(KEEP_MESSAGES + 5):
        view.send({"extend": {"indices": [0], "x": [[i]], "y": [[float(i)]]}})
    a = page.poll(view)
    assert "figure" in a and page.figure["data"][0]["x"] == list(range(KEEP_MESSAGES + 5))


def test_the_view_keeps_the_last_picture_and_says_how_the_run_ended(dash):
    page = Page()
    dash.collector.ingest(_msg(0, range(5), events=[_start()]))
    dash.refresh()
    page.poll(dash.view)
    dash.collector.ingest(_msg(0, range(5, 6)))
    dash.stop()  # the pool stopped while the run was training: the header says so, not "training"
    a = page.poll(dash.view)
    assert not a["live"] and "run 1 stopped at step 6" in a["header"]
    assert len(page.figure["data"][0]["y"]) == 6


def test_a_new_run_is_a_new_view_and_the_page_starts_over():
    collector = Collector()
    dash = Dashboard(collector, start=False, view=PolledView, run="latest")
    try:
        page = Page()
        collector.ingest(_msg(0, range(3), events=[_start()]))
        dash.refresh()
        page.poll(dash.view)
        collector.ingest(_msg(0, range(3, 4), events=[_end(1)]))
        dash.refresh()
        dash._go_static()  # what its thread does when the run is done
        run2 = _msg(0, range(4, 6), run=2, events=[[2, 300.0, "run_start", {"run": 2}]], loss=0.5)
        collector.ingest(run2)
        dash.refresh()
        a = page.poll(dash.view)
        assert a["live"] and "run 2" in a["header"] and "figure" in a
        assert page.figure["data"][0]["y"] == [0.5, 0.5]
    finally:
        dash.close()
        collector.close()
