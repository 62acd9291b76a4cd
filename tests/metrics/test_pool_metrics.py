"""Live metrics on a real 2-engine pool with real gloo: a real Trainer, a real collector, the dashboard."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from tests.conftest import until
from workbench.session import Session
from workbench.widgets.live_dashboard import Dashboard

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


def _points(dash) -> list[int]:
    """Points per line of the dashboard's figure as the page holds it (whole figure plus extensions)."""
    figure = dash.view.figure_now() if dash.view.figure_now else {}
    return [len(t["y"]) for t in figure.get("data", [])]


class Page:
    """What a page showing ``view`` holds: the last whole figure, extended by every message since
    (the same bookkeeping as dashboard.js)."""

    def __init__(self, view):
        self.data: list[dict] = []
        self.messages = 0
        view.observe(self._figure, names="figure")
        send = view.send

        def record(content, buffers=None):
            for k, i in enumerate(content["extend"]["indices"]):
                self.data[i]["x"] += content["extend"]["x"][k]
                self.data[i]["y"] += content["extend"]["y"][k]
            self.messages += 1
            send(content, buffers)

        view.send = record

    def _figure(self, change):
        self.data = [{"x": list(t["x"]), "y": list(t["y"])} for t in change["new"].get("data", [])]
        self.messages += 1


@pytest.mark.timeout(120)
def test_every_step_of_every_rank_arrives_once_in_order_and_reaches_the_widget(pool):
    c = pool.metrics
    dash = Dashboard(c, run="next", interval=0.25)
    page = Page(dash.view)
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
        # each rank's line is the loss of its own batches (each rank sees other data, so the lines part),
        # and their mean is the loss the Trainer reports, the same on every rank (issue 24 item 5: with the
        # world's mean on both lines, one hid the other and the pool looked like rank 0 alone)
        own = {r: steps[steps["rank"] == r]["loss"].to_numpy() for r in (0, 1)}
        assert (own[0] != own[1]).mean() > 0.9, "the ranks' lines are the same loss"
        pool.run("world_loss = [s.loss for s in result.history]", ranks=[0])
        world = pool.pull("world_loss", rank=0)
        torch.testing.assert_close(((own[0] + own[1]) / 2).tolist(), world, rtol=1e-5, atol=1e-6)
        # the run ended: the dashboard went static by itself, after the page had every point of both ranks
        assert until(lambda: dash.ended, 30)
        assert [len(t["y"]) for t in page.data[:2]] == [1000, 1000]
        assert page.data[0]["x"] == list(range(1, 1001))
        assert page.data[1]["y"] == mine["loss"].tolist()
        assert "finished at step 1000" in dash.summary
        elapsed = time.monotonic() - t0
        # throttled: at most one refresh per interval (plus the first), each one or two messages
        # (new points; changed text), however many records came in
        assert dash.updates <= elapsed / dash.interval + 2
        assert page.messages <= dash.updates + 2 and dash.messages <= 2 * dash.updates + 2
        assert dash.messages < 2000 / 4
        assert len(dash.delays) >= 2000  # every point's step-end-to-widget delay was measured
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
        table = dash.view.devices
        assert "no GPU detected" in table and "data-rank='0'" in table and "data-rank='1'" in table
        assert "idle" in table
    finally:
        dash.close()


@pytest.mark.timeout(180)
def test_async_run_keeps_the_dashboard_updating_and_a_stop_says_interrupted(pool, tmp_path):
    c = pool.metrics
    dash = Dashboard(c, run="next", interval=0.25)
    try:
        handle = pool.submit("trainer.run(steps=1_000_000)")
        assert not handle.done()
        assert until(lambda: dash.pinned and (_points(dash) or [0])[0] >= 50, 60)
        assert c.status() == {0: "running", 1: "running"}
        seen = _points(dash)[0]
        assert until(lambda: _points(dash)[0] > seen, 30)  # still updating, cell long returned
        handle.stop(timeout=30)  # at the next step boundary on every rank
        assert handle.done()
        run = c.runs[dash.run_id - 1]
        assert c.wait_for(lambda c: run.done, 20)
        assert run.state == "interrupted" and until(lambda: dash.ended, 10)
        steps = c.history(run.id).dataframe().groupby("rank")["step"]
        assert f"interrupted at step {steps.max().max()}" in dash.summary
        assert _points(dash)[:2] == steps.count().tolist()  # every point is kept
        path = dash.save_html(tmp_path / "dash.html")
        text = path.read_text()
        assert "plotly" in text.lower() and "rank 0" in text and "<table" in text
        assert len(dash.history) > 100
    finally:
        dash.close()
    # the pool still works after the stop
    assert pool.run("1 + 1").ranks[0].result["text/plain"] == "2"


@pytest.mark.timeout(120)
def test_ctrl_c_in_the_cell_says_interrupted_at_step_n_and_keeps_the_points(pool, ipshell):
    """The real path of Ctrl-C: KeyboardInterrupt in the kernel's wait, the interrupt ladder on the ranks."""
    import _thread
    import threading

    from IPython.utils.capture import capture_output

    from workbench.widgets.cell_monitor import CellMonitor

    def interrupt_when_training():
        if until(lambda: monitor.dashboard is not None and (_points(monitor.dashboard) or [0])[0] >= 30, 60):
            _thread.interrupt_main()  # what Ctrl-C (SIGINT to the kernel) does

    with capture_output() as cap:
        monitor = CellMonitor(pool.metrics)
        threading.Thread(target=interrupt_when_training, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            try:
                pool.run("trainer.run(steps=1_000_000)", on_tick=monitor.tick)
            finally:
                monitor.finish(sys.exc_info()[1])  # as the magic does
    final = cap.outputs[-1]
    text = final.data["text/plain"]
    run = pool.metrics.runs[monitor.dashboard.run_id - 1]
    counts = pool.metrics.history(run.id).dataframe().groupby("rank")["step"]
    assert run.state == "interrupted" and f"interrupted at step {counts.max().max()}" in text, text
    points = [len(t["y"]) for t in final.data["application/vnd.plotly.v1+json"]["data"][:2]]
    assert points == counts.count().tolist() and points[0] >= 30


FAIL = """
from workbench.train import Callback

class Boom(Callback):
    steps = 0

    def on_step_end(self, trainer, stats):
        self.steps += 1
        if rank == 1 and self.steps == 20:
            raise ValueError("bad batch")

trainer.callbacks.append(Boom())
try:
    trainer.run(steps=200)
finally:
    trainer.callbacks.pop()
"""


@pytest.mark.timeout(120)
def test_failed_run_says_which_rank_failed_why_and_keeps_its_points(pool, ipshell):
    """Last in this module: the failure leaves the pool to re-form its process group."""
    from IPython.utils.capture import capture_output

    from workbench.errors import RankError
    from workbench.widgets.cell_monitor import CellMonitor

    with capture_output() as cap:
        monitor = CellMonitor(pool.metrics, always=True)
        with pytest.raises(RankError) as info:
            pool.run(FAIL, on_tick=monitor.tick)
        monitor.finish(info.value)
    assert info.value.rank == 1
    final = cap.outputs[-1]
    assert final.update and "application/vnd.plotly.v1+json" in final.data, final.data.get("text/plain")
    assert "failed: rank 1: ValueError: bad batch" in final.data["text/plain"]
    points = [len(t["y"]) for t in final.data["application/vnd.plotly.v1+json"]["data"][:2]]
    assert points[0] >= 20 and points[1] == 20, points  # rank 1's steps up to its failure are kept
