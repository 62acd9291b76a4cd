"""Past 8 ranks the dashboard draws the median loss in its min-max band and names the slowest rank (issue
25); each rank's own line comes on demand. Fed the recorded metrics of 16 ranks through a real Collector's
``ingest`` (the wire format its receiver thread reads), with the real dashboard: a 16-engine pool is too
heavy for this machine's two cores, and what the dashboard does with the records is the same.
"""

from __future__ import annotations

import statistics

import pytest

from workbench.metrics import records
from workbench.metrics.collector import Collector
from workbench.widgets.runplot import MAX_LINES, RunPlot

pytestmark = pytest.mark.timeout(60)
RANKS = 16
SLOW = 7  # this rank's steps take 0.25 s, every other's 0.1 s


def _loss(rank: int, step: int) -> float:
    return 1.0 / step + 0.01 * rank + (0.5 if rank == 3 else 0.0)  # rank 3 far off: the median ignores it


def _cols(rank: int, steps: range) -> dict:
    time = 0.25 if rank == SLOW else 0.1
    return {"step": [float(s) for s in steps], "loss": [_loss(rank, s) for s in steps],
            "samples_per_s": [80.0] * len(steps), "compute_time": [time * 0.6] * len(steps),
            "comm_time": [time * 0.3] * len(steps), "data_time": [0.0] * len(steps),
            "step_time": [time] * len(steps)}


def test_runplot_draws_the_median_in_its_min_max_band_and_names_the_slowest_rank():
    plot = RunPlot()
    ranks = list(range(RANKS))
    whole, added = plot.feed(ranks, set(ranks), {r: _cols(r, range(1, 11)) for r in ranks}, final=False)
    assert whole and plot.aggregated and RANKS > MAX_LINES
    lo, hi, median, rate = (added[i][1] for i in range(4))
    for k, step in enumerate(range(1, 11)):
        values = [_loss(r, step) for r in ranks]
        assert (lo[k], hi[k]) == (min(values), max(values))
        assert median[k] == pytest.approx(statistics.median(values))
    assert rate == [80.0] * 10
    live = plot.figure()
    assert [t["name"] for t in live["data"]] == ["min", f"min-max of {RANKS} ranks", "median", "samples/s"]
    assert live["data"][1]["fill"] == "tonexty"
    # the slowest rank, named where people look: the header words and the step-time bars
    assert plot.slowest() == (SLOW, pytest.approx(0.25), pytest.approx(0.1))
    assert "slowest rank 7: 250 ms/step (median 100)" in plot.words()
    labels, parts = plot.bar_rows()
    assert labels == [f"median of {RANKS} ranks", "slowest: rank 7"]
    assert parts["compute"] == [pytest.approx(0.06), pytest.approx(0.15)]
    # the figure a run leaves: every rank's own line too, hidden until its legend entry is clicked
    left = plot.figure(every_rank=True)["data"]
    assert [t["name"] for t in left[4:]] == [f"rank {r}" for r in ranks]
    assert {t["visible"] for t in left[4:]} == {"legendonly"} and len(left[4 + SLOW]["y"]) == 10


def test_a_rank_on_demand_gets_its_line_and_then_only_its_new_points():
    plot = RunPlot()
    ranks = list(range(RANKS))
    plot.feed(ranks, set(ranks), {r: _cols(r, range(1, 6)) for r in ranks}, final=False)
    assert plot.show([SLOW])  # the figure goes again once, with rank 7's line after the throughput
    fig = plot.figure()
    assert fig["data"][4]["name"] == "rank 7" and len(fig["data"][4]["y"]) == 5
    whole, added = plot.feed(ranks, set(ranks), {r: _cols(r, range(6, 8)) for r in ranks}, final=False)
    assert not whole and added[4] == ([6, 7], [_loss(SLOW, 6), _loss(SLOW, 7)])
    assert sorted(added) == [0, 1, 2, 3, 4]  # band, median, throughput, rank 7: no other rank's line


def test_a_refresh_without_new_records_works_nothing_out_again_per_rank():
    plot = RunPlot()
    ranks = list(range(RANKS))
    plot.feed(ranks, set(ranks), {r: _cols(r, range(1, 6)) for r in ranks}, final=False)
    worked = []
    make = plot._step_times
    plot._step_times = lambda: worked.append(1) or make()
    for _ in range(5):  # five refreshes, nothing new
        plot.feed(ranks, set(ranks), {}, final=False)
        plot.words(), plot.bar_rows()
    assert len(worked) == 1
    plot.feed(ranks, set(ranks), {0: _cols(0, range(6, 7))}, final=False)
    plot.words(), plot.bar_rows()
    assert len(worked) == 2


def _msg(rank: int, steps: range) -> dict:
    cols = _cols(rank, steps)
    rows = [[s - 1, *records.step_row(t=100.0 + s, run=1, step=s, loss=cols["loss"][k], samples=8,
                                      step_time=cols["step_time"][k], compute_time=cols["compute_time"][k],
                                      comm_time=cols["comm_time"][k], data_time=0.0)]
            for k, s in enumerate(steps)]
    events = [[0, 100.0, "run_start", {"run": 1}]] if steps.start == 1 else []
    return records.encode(pub=f"p{rank}", rank=rank, host=f"node{rank // 4}", steps=rows, events=events,
                          info={"kind": "cpu", "name": "CPU (1 thread)", "device": "cpu"})


def test_a_dashboard_fed_sixteen_ranks_shows_the_band_names_the_slowest_and_leaves_every_line():
    from workbench.widgets.live_dashboard import Dashboard

    collector = Collector()
    dash = Dashboard(collector, run="latest", start=False)
    sent = []
    try:
        dash.view.send = lambda content, buffers=None: sent.append(content)
        for r in range(RANKS):
            collector.ingest(_msg(r, range(1, 21)))
        dash.refresh()
        names = [t["name"] for t in dash.view.figure["data"]]
        assert names == ["min", f"min-max of {RANKS} ranks", "median", "samples/s"]
        assert "slowest rank 7: 250 ms/step (median 100)" in dash.view.header
        assert "slowest: rank 7" in dash.view.bars and dash.view.bars.count("<tr") == 2
        dash.show_ranks([SLOW])
        assert [t["name"] for t in dash.view.figure["data"]][4:] == ["rank 7"]
        for r in range(RANKS):
            collector.ingest(_msg(r, range(21, 23)))
        dash.refresh()
        assert sent[-1]["extend"]["indices"] == [0, 1, 2, 3, 4]
        bundle = dash.static_bundle(state="finished")
        data = bundle["application/vnd.plotly.v1+json"]["data"]
        assert [t["name"] for t in data[5:]] == [f"rank {r}" for r in range(RANKS) if r != SLOW]
        assert "slowest rank 7" in bundle["text/plain"]
    finally:
        dash.close()
        collector.close()


def test_a_dashboard_refresh_without_new_records_builds_no_text_again(monkeypatch):
    import workbench.widgets.live_dashboard as live

    built = []
    table = live.device_table
    monkeypatch.setattr(live, "device_table", lambda *args: built.append(1) or table(*args))
    collector = Collector()
    dash = live.Dashboard(collector, run="latest", start=False)
    try:
        for r in range(RANKS):
            collector.ingest(_msg(r, range(1, 21)))
        dash.refresh()
        new = collector.steps_since(1, dash._seen)
        assert new == {}  # the collector copies nothing for ranks with nothing new
        for _ in range(5):
            dash.refresh()
        assert len(built) == 1
        collector.ingest(_msg(0, range(21, 22)))
        dash.refresh()
        assert len(built) == 2 and "step 21" in dash.view.header
    finally:
        dash.close()
        collector.close()
