"""The dashboard without a pool: incremental reads and aggregates, run outcomes, what it shows and leaves.

Records are fed to a real Collector through its ``ingest`` (the wire format), the way its receiver
thread feeds it; the dashboard is the real one (its widget talks to no front end here).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from workbench.metrics import records
from workbench.metrics.collector import Collector
from workbench.metrics.history import Series
from workbench.widgets.plotdata import Recent, StepJoin, Trace

pytestmark = pytest.mark.timeout(30)
PLOTLY = "application/vnd.plotly.v1+json"


# -- incremental reads -----------------------------------------------------------------------------
def test_series_since_gives_only_new_points_and_none_once_they_were_merged():
    s = Series(("t", "loss"), capacity=8)
    for i in range(5):
        s.append(i, [float(i), float(i)])
    assert s.since(3) == {"seq": [3.0, 4.0], "t": [3.0, 4.0], "loss": [3.0, 4.0], "n": [1.0, 1.0]}
    assert s.since(5) == {f: [] for f in s.fields}
    for i in range(5, 12):  # past capacity: the older half is merged
        s.append(i, [float(i), float(i)])
    assert s.since(10)["seq"] == [10.0, 11.0]  # the newest points stay unmerged
    assert s.since(0) is None  # points 0.. were merged: read the whole series again


def test_collector_steps_since_follows_each_rank():
    c = Collector()
    try:
        c.ingest(_msg(0, range(3)))
        c.ingest(_msg(1, range(2)))
        first = c.steps_since(1, {})
        assert {r: (cols["step"], n) for r, (cols, n) in first.items()} == {0: ([1.0, 2.0, 3.0], 3),
                                                                          1: ([1.0, 2.0], 2)}
        c.ingest(_msg(0, range(3, 5)))
        seen = {r: n for r, (_, n) in first.items()}
        later = c.steps_since(1, seen)
        assert later[0][0]["step"] == [4.0, 5.0] and 1 not in later  # rank 1 sent nothing new
    finally:
        c.close()


# -- run outcomes ------------------------------------------------------------------------------------
def _msg(rank, seqs, *, run=1, events=(), loss=1.0, pub="p"):
    steps = [[q, *records.step_row(t=100.0 + q, run=run, step=q + 1, loss=loss, samples=8, step_time=0.01,
                                   compute_time=0.006, comm_time=0.003, data_time=0.001)] for q in seqs]
    return records.encode(pub=pub, rank=rank, host="h", steps=steps, events=list(events),
                          info={"kind": "cpu", "name": "CPU (1 thread)", "device": "cpu"})


def _start(seq=0):
    return [seq, 100.0, "run_start", {"run": 1}]


def _end(seq, **details):
    return [seq, 200.0, "run_end", {"run": 1, **details}]


def test_run_end_says_how_the_run_ended():
    c = Collector()
    try:
        c.ingest(_msg(0, range(5), events=[_start()]))
        c.ingest(_msg(1, range(5), events=[_start()]))
        run = c.runs[0]
        assert run.state == "training" and run.reason is None
        c.ingest(_msg(0, [], events=[_end(1, interrupted=True)]))
        # Ctrl-C: the kernel aborted rank 1, caught inside a collective: an echo, not a failure
        c.ingest(_msg(1, [], events=[_end(1, error="DistBackendError: Connection closed by peer")]))
        assert run.done and run.state == "interrupted" and run.echoes
    finally:
        c.close()
    c = Collector()
    try:
        c.ingest(_msg(0, range(3), events=[_start()]))
        c.ingest(_msg(1, range(3), events=[_start(), _end(1, error="ValueError: bad batch")]))
        run = c.runs[0]
        assert run.state == "failed" and run.reason == "rank 1: ValueError: bad batch"
        c.ingest(_msg(0, [], events=[_end(1, error="RuntimeError: Connection closed by peer")]))
        assert run.reason == "rank 1: ValueError: bad batch"  # the root cause, not its echo on rank 0
        assert list(run.errors) == [1] and list(run.echoes) == [0]
    finally:
        c.close()


def test_kernel_marks_a_failure_on_the_run_the_cell_trained_even_after_its_run_end():
    c = Collector()
    try:
        c.ingest(_msg(0, range(3), events=[_start(), _end(1)]))
        c.ingest(_msg(1, range(3), events=[_start(), _end(1)]))
        run = c.runs[0]
        assert run.state == "finished"
        c.mark_failed(1, "rank 1 died (SIGKILL)", run=run.id)  # the root cause, named by the kernel
        c.mark_failed(0, "RuntimeError: peer gone", run=run.id)
        assert run.state == "failed" and run.reason == "rank 1: rank 1 died (SIGKILL)"
        assert c.status()[1] == "failed"
    finally:
        c.close()


def test_publisher_reports_an_interrupt_and_an_error_in_run_end(channel):
    from workbench.metrics.publisher import Publisher

    c = Collector(channel)
    pub = Publisher(channel, rank=0, host="h", sample_interval=60)
    try:
        class FakeTrainer:  # what the Trainer sets before its run-end callbacks
            step, run_error = 7, KeyboardInterrupt()

        pub.on_run_start(None)
        pub.on_run_end(FakeTrainer())
        FakeTrainer.run_error = ValueError("bad batch")
        pub.on_run_start(None)
        pub.on_run_end(FakeTrainer())
        assert c.wait_for(lambda c: len(c.runs) == 2 and all(r.done for r in c.runs), 10)
        assert [r.state for r in c.runs] == ["interrupted", "failed"]
        assert c.runs[1].reason == "rank 0: ValueError: bad batch"
    finally:
        pub.close()
        c.close()


# -- incremental aggregates and downsampling -----------------------------------------------------
def test_trace_stays_bounded_keeps_its_shape_and_newest_points_exact():
    t = Trace(window=100)
    resent = 0
    for chunk in range(100):
        xs = list(range(chunk * 50, chunk * 50 + 50))
        resent += t.extend(xs, [float(x) for x in xs])
    assert len(t.x) <= 100 and t.x[-1] == 4999 and t.y[-1] == 4999.0
    assert t.x == sorted(t.x) and sum(t.n) == 5000
    assert resent <= 100 * 50 / 25  # a merge resends the trace at most once per half window of new points
    # a merged point is the mean of what it stands for: y = x here, so y is the mean of its x range
    assert t.y[0] == pytest.approx(t.x[0] - (t.n[0] - 1) / 2)


def _spread_batch(data):
    """min, mean and max of every step over ranks, the whole run at once (the old, slow way)."""
    steps = sorted({s for d in data.values() for s in d})
    out = []
    for s in steps:
        vs = [d[s] for d in data.values() if s in d and not math.isnan(d[s])]
        if vs:
            out.append((s, min(vs), sum(vs) / len(vs), max(vs)))
    return out


def test_step_join_gives_the_same_as_the_batch_computation_fed_in_random_chunks():
    rng = random.Random(0)
    value = lambda: math.nan if rng.random() < 0.05 else rng.random()
    data = {r: {s: value() for s in range(1, 301)} for r in range(3)}
    join = StepJoin()
    fed = {r: 0 for r in data}
    got = []
    while any(n < 300 for n in fed.values()):
        r = rng.choice([r for r in data if fed[r] < 300])
        k = min(300 - fed[r], rng.randint(1, 40))
        steps = list(range(fed[r] + 1, fed[r] + k + 1))
        join.add(r, steps, [data[r][s] for s in steps])
        fed[r] += k
        got += list(zip(*join.take(sorted(data)), strict=True))  # only steps every rank has passed
        assert all(s <= min(fed.values()) for s, *_ in got)
    got += list(zip(*join.take(sorted(data), final=True), strict=True))
    assert [g[0] for g in got] == [e[0] for e in _spread_batch(data)]
    np.testing.assert_allclose(np.array(got), np.array(_spread_batch(data)))
    assert join.pending == 0


def test_recent_means_over_the_last_points_only():
    rec = Recent(3)
    rec.add({"a": [1.0, 2.0, 3.0, 4.0, float("nan")]})
    assert rec.mean("a") == 3.5  # of 3, 4 (nan left out): the last 3 points
    assert math.isnan(Recent(3).mean("a"))


# -- what the dashboard shows ---------------------------------------------------------------------
@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


def _dash(collector, **kw):
    from workbench.widgets.live_dashboard import Dashboard

    return Dashboard(collector, run="latest", start=False, **kw)


def test_wb_dashboard_is_callable_after_every_widgets_module_was_imported(collector):
    """Importing a module must not shadow the function: ``import workbench.widgets.<name>`` sets the
    package attribute <name> to the module ('module' object is not callable when they share a name)."""
    import importlib
    import pkgutil
    from types import SimpleNamespace

    import workbench
    import workbench.widgets

    for mod in pkgutil.iter_modules(workbench.widgets.__path__):
        importlib.import_module(f"workbench.widgets.{mod.name}")  # what a Dashboard shown once does
    session = SimpleNamespace(metrics=collector)  # all dashboard() reads of a session
    for make in (workbench.dashboard, workbench.widgets.dashboard):
        dash = make(session, run="latest")
        try:
            assert type(dash).__name__ == "Dashboard" and dash.collector is collector
        finally:
            dash.close()


def test_before_the_first_step_a_sentence_not_empty_axes(collector):
    dash = _dash(collector)
    try:
        dash.refresh()
        assert "no training run yet" in dash.summary and dash.view.figure == {}
        collector.ingest(_msg(0, [], events=[_start()]))
        dash.refresh()
        assert "waiting for the first step" in dash.view.note and dash.view.figure == {}
        collector.ingest(_msg(0, range(3)))
        dash.refresh()
        assert dash.view.note == "" and [len(t["y"]) for t in dash.view.figure["data"]][:1] == [3]
    finally:
        dash.close()


def test_interrupted_run_says_where_and_keeps_its_points(collector):
    dash = _dash(collector)
    try:
        for r in (0, 1):
            collector.ingest(_msg(r, range(7), events=[_start()]))
        dash.refresh()
        assert "training" in dash.summary
        for r in (0, 1):
            collector.ingest(_msg(r, [], events=[_end(1, interrupted=True)]))
        dash.refresh()
        assert "interrupted at step 7" in dash.summary
        assert [len(t["y"]) for t in dash.view.figure["data"][:2]] == [7, 7]
        bundle = dash.static_bundle()
        assert "interrupted at step 7" in bundle["text/plain"]
        assert [len(t["y"]) for t in bundle[PLOTLY]["data"][:2]] == [7, 7]
    finally:
        dash.close()


def test_failed_run_says_why_and_keeps_its_points(collector):
    dash = _dash(collector)
    try:
        collector.ingest(_msg(0, range(5), events=[_start()]))
        collector.ingest(_msg(1, range(4), events=[_start(), _end(1, error="ValueError: bad batch")]))
        dash.refresh()
        assert "failed: rank 1: ValueError: bad batch" in dash.summary
        bundle = dash.static_bundle()
        assert "failed: rank 1: ValueError: bad batch" in bundle["text/html"]
        assert [len(t["y"]) for t in bundle[PLOTLY]["data"][:2]] == [5, 4]
    finally:
        dash.close()


def test_a_run_that_failed_before_its_first_step_shows_no_axes(collector):
    dash = _dash(collector)
    try:
        collector.ingest(_msg(0, [], events=[_start(), _end(1, error="OSError: no data")]))
        dash.refresh()
        bundle = dash.static_bundle()
        assert PLOTLY not in bundle and "failed before its first step" in bundle["text/plain"]
    finally:
        dash.close()


def test_cpu_pool_shows_no_power_or_temperature(collector):
    dash = _dash(collector)
    try:
        device = [[0, *records.device_row(t=100.0, util=40, mem_used=2**30, mem_total=2**33)]]
        collector.ingest(records.encode(pub="p", rank=0, host="h", devices=device,
                                        info={"kind": "cpu", "name": "CPU (1 thread)"}))
        dash.refresh()
        table = dash.view.devices
        assert "no GPU" in table and "data-rank='0'" in table and "40%" in table
        assert "power" not in table and "temp" not in table and "°C" not in table
    finally:
        dash.close()


def test_gpu_readings_a_device_has_not_say_not_supported(collector):
    """A MIG instance has no utilisation or clock of its own: the table says so, not 0 or a dash."""
    dash = _dash(collector)
    try:
        device = [[0, *records.device_row(t=100.0, util=None, mem_used=2**30, mem_total=2**33, power_w=90.0,
                                          temp_c=50.0, clock_mhz=None)]]
        info = {"kind": "gpu", "name": "H200 MIG 1g", "unsupported": ["util", "clock_mhz"]}
        collector.ingest(records.encode(pub="p", rank=0, host="h", devices=device, info=info))
        dash.refresh()
        row = dash.view.devices.split("data-rank='0'")[1]
        assert row.count("not supported") == 2 and "90 W" in row and "50 °C" in row
    finally:
        dash.close()


def test_refresh_sends_only_new_points(collector):
    dash = _dash(collector)
    sent = []
    try:
        dash.view.on_msg(lambda *a: None)  # a front end may answer; nothing to do with it here
        dash.view.send = lambda content, buffers=None: sent.append(content)
        collector.ingest(_msg(0, range(10), events=[_start()]))
        dash.refresh()
        collector.ingest(_msg(0, range(10, 13)))
        dash.refresh()
        assert len(sent) == 1  # the first points went with the whole figure, these as one message
        extend = sent[-1]["extend"]
        assert extend["indices"] == [0, 1] and extend["x"] == [[11, 12, 13], [11, 12, 13]]  # loss, samples/s
        dash.refresh()
        assert len(sent) == 1  # nothing new: nothing sent
    finally:
        dash.close()


def test_display_is_replaced_by_a_static_figure_when_the_run_ends(collector, ipshell):
    from IPython.display import display
    from IPython.utils.capture import capture_output

    from workbench.widgets.live_dashboard import Dashboard

    collector.ingest(_msg(0, range(3), events=[_start()]))
    dash = Dashboard(collector, run=1, start=False)
    try:
        with capture_output() as cap:
            display(dash)
            dash.refresh()
            collector.ingest(_msg(0, range(3, 6), events=[_end(1)]))
            dash.finish()
        first, last = cap.outputs[0], cap.outputs[-1]
        assert "application/vnd.jupyter.widget-view+json" in first.data
        assert "VBox" not in first.data["text/plain"]
        assert last.update and last.transient["display_id"] == first.transient["display_id"]
        assert PLOTLY in last.data and "application/vnd.jupyter.widget-view+json" not in last.data
        assert "finished at step 6" in last.data["text/plain"]
        assert len(last.data[PLOTLY]["data"][0]["y"]) == 6
        assert dash.view.comm is None  # the live widget is gone from the kernel and the page
    finally:
        dash.close()


def test_an_elastic_regroup_is_marked_on_the_loss_curve_live_and_in_the_saved_figure(collector):
    text = "rank 2 lost at step 4; continuing on 2 ranks"
    dash = _dash(collector)
    try:
        for r in (0, 1, 2):
            collector.ingest(_msg(r, range(3), events=[_start()]))
        dash.refresh()
        assert not dash.view.figure["layout"].get("shapes")
        regroup = [1, 150.0, "regroup", {"step": 4, "world_size": 2, "lost": [2], "text": text}]
        for r in (0, 1):  # every rank left says so; one mark
            collector.ingest(_msg(r, range(3, 6), events=[regroup]))
        dash.refresh()
        assert [e["run"] for e in collector.events if e["event"] == "regroup"] == [1, 1]
        for figure in (dash.view.figure, dash.static_bundle()[PLOTLY]):
            assert [s["x0"] for s in figure["layout"]["shapes"]] == [4]
            assert [a["text"] for a in figure["layout"]["annotations"]] == [text]
    finally:
        dash.close()
