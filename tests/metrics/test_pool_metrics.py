"""Live metrics on a real 2-engine pool with real gloo: a real Trainer, a real collector, the dashboard."""

from __future__ import annotations

import time

import pytest

from tests.conftest import until
from workbench.session import Session
from workbench.widgets.dashboard import Dashboard

pytestmark = pytest.mark.slow

SETUP = """
import torch
from torch.utils.data import TensorDataset
from workbench.train import MLP, MLPConfig, Trainer, make_loader, regression_data
torch.manual_seed(0)
model = MLP(MLPConfig(d_in=8, d_hidden=8, d_out=2, n_layers=1))
loader = make_loader(TensorDataset(*regression_data(64, d_in=8, d_out=2)), batch_size=8)
trainer = Trainer(model, loader, lr=1e-2)
"""


@pytest.fixture(scope="module")
def pool():
    s = Session(n=2, timeout=60).start()
    try:
        assert s.metrics is not None, "the pool started without its metrics collector"
        s.run(SETUP)
        yield s
    finally:
        s.stop()


def _points(trace) -> int:
    return 0 if trace.y is None else len(trace.y)


@pytest.mark.timeout(120)
def test_every_step_of_every_rank_arrives_once_in_order_and_reaches_the_widget(pool):
    c = pool.metrics
    dash = Dashboard(c, run="next", interval=0.25)
    t0 = time.monotonic()
    try:
        pool.run("result = trainer.run(steps=1000)")
        run = c.latest_run()
        # the ranks flushed everything before the cell returned; the relay hands it on a moment later
        assert run is not None and c.wait_for(lambda c: run.done, 10) and sorted(run.ranks) == [0, 1]
        assert c.wait_for(lambda c: c.count("step", run.id) >= 2000, 30)
        steps = c.history(run.id).dataframe()
        for rank in (0, 1):
            mine = steps[steps["rank"] == rank]
            assert mine["step"].tolist() == list(range(1, 1001)), f"rank {rank}: lost, repeated or reordered"
            assert (mine["seq"].diff().dropna() == 1).all()
            assert mine["loss"].notna().all() and (mine["samples_per_s"] > 0).all()
            assert (mine["compute_time"] >= 0).all() and (mine["comm_time"] > 0).all()
        assert c.stats["duplicates"] == 0 and c.stats["missing"] == 0
        # the widget model holds every point of both ranks once the dashboard has caught up
        assert until(lambda: dash._built and all(_points(t) == 1000 for t in dash._fig.data[:2]), 30)
        assert list(dash._fig.data[0].x) == list(range(1, 1001))
        assert list(dash._fig.data[1].y) == mine["loss"].tolist()
        elapsed = time.monotonic() - t0
        # throttled: at most one refresh per interval (plus the first), each a handful of messages,
        # however many records came in
        assert dash.updates <= elapsed / dash.interval + 2
        assert dash.messages <= 4 * dash.updates
        assert dash.messages < 2000 / 4
        assert len(dash.delays) >= 2000  # every point's step-end-to-widget delay was measured
        assert "finished" in dash._header.value
    finally:
        dash.close()


@pytest.mark.timeout(60)
def test_idle_pool_shows_its_devices_through_psutil(pool):
    c = pool.metrics
    before = {r: s.received for r, s in c.devices.items()}
    assert c.wait_for(lambda c: all(c.devices[r].received > before.get(r, 0) + 1 for r in (0, 1)), 20)
    assert {r: c.ranks[r].info["kind"] for r in (0, 1)} == {0: "cpu", 1: "cpu"}
    assert c.status() == {0: "idle", 1: "idle"}
    dash = Dashboard(c, run="latest", start=False)
    try:
        dash.refresh()
        table = dash._devices.value
        assert "no GPU detected" in table and "data-rank='0'" in table and "data-rank='1'" in table
        assert "idle" in table
    finally:
        dash.close()


@pytest.mark.timeout(120)
def test_async_run_keeps_the_dashboard_updating_and_can_be_stopped(pool, tmp_path):
    c = pool.metrics
    dash = Dashboard(c, run="next", interval=0.25)
    try:
        handle = pool.submit("trainer.run(steps=1_000_000)")
        assert not handle.done()
        assert until(lambda: dash.pinned and dash._built and _points(dash._fig.data[0]) >= 50, 60)
        assert c.status() == {0: "running", 1: "running"}
        seen = _points(dash._fig.data[0])
        assert until(lambda: _points(dash._fig.data[0]) > seen, 30)  # still updating, cell long returned
        handle.stop()
        assert handle.done()
        run = c.runs[dash.run_id - 1]
        assert c.wait_for(lambda c: run.done, 20)
        path = dash.save_html(tmp_path / "dash.html")
        text = path.read_text()
        assert "plotly" in text.lower() and "rank 0" in text and "<table" in text
        assert len(dash.history) > 100
    finally:
        dash.close()
    # the pool still works after the stop
    assert pool.run("1 + 1").ranks[0].result["text/plain"] == "2"
