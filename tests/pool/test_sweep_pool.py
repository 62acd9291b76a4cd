"""The sweep on a real 4-rank pool (issue 43 part 3, docs/submeshes.md): ``wb.Sweep`` splits the pool into
2-rank sub-meshes, runs as many trials at once as fit, hands a finished trial's sub-mesh to the next, records
a trial that raises as failed and goes on, stops on request, and joins the pool at the end; bad input is a
``ValueError`` that leaves the pool whole.

Every trial's final parameters equal the same configuration trained in this process alone (``assert_close``):
DDP on 2 ranks each holding half the batch steps as full-batch SGD does. No timed asserts: the overlap of two
trials is forced by files (each waits for the other to have started), then read from the ranks' stamps."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import running_pool, until
from workbench import Sweep
from workbench.errors import RankDiedError

pytestmark = pytest.mark.timeout(300)


def regression(lr, steps=30, seed=0):
    """A trial: a linear model under DDP on its sub-mesh, each rank half of a fixed batch (self-contained:
    its source is sent to the ranks)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(16, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    torch.manual_seed(seed)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    params = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    return {"loss": torch.nn.functional.mse_loss(model(x), y).item(), "params": params, "world": world,
            "checkpoint": model.module.state_dict()}  # no metric: written only where the sweep has a folder


def alone(lr, steps=30, seed=0) -> torch.Tensor:
    """The same configuration trained in one process, full batch, no DDP."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(16, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


# defined on the ranks by name (a %%distributed cell): rank 1 of a trial with a negative lr raises while rank
# 0 waits in the all_reduce (the abort cuts it out; the sub-mesh's group is re-formed for its next trial)
FLAKY = """
import torch
def flaky(lr):
    t = torch.ones(1)
    if lr < 0 and rank == 1:
        raise ValueError(f"negative lr {lr}")
    dist.all_reduce(t)
    return {"sum": t, "lr": lr}
"""

# each trial's rank 0 says it started (a file), then every rank waits for the other trial's (at most 60 s:
# trials one after the other fail here); rank 0's start and end stamps are the trial's
MEET = """
import time
from pathlib import Path
def meet(folder, me, other):
    start = time.time()
    if rank == 0:
        Path(folder, me).touch()
    for _ in range(6000):
        if Path(folder, other).exists():
            break
        time.sleep(0.01)
    else:
        raise TimeoutError("the other trial never started while this one ran")
    return {"start": start, "end": time.time()}
"""

# a trial that runs until released by a file (at most 60 s), saying on each rank that it began
HOLD = """
import time
from pathlib import Path
def hold(folder, i):
    Path(folder, f"began{i}-{rank}").touch()
    for _ in range(6000):
        if Path(folder, "release").exists():
            return {"released": True}
        time.sleep(0.01)
    raise TimeoutError("never released")
"""


@pytest.fixture(scope="module")
def pool():
    with running_pool(n=4, timeout=60, backend="gloo") as s:
        yield s


def whole(s) -> None:
    """The pool is one group of all again: not split, and an all_reduce sums all four ranks."""
    assert s.meshes == {}
    s.run("import torch; t = torch.ones(1); dist.all_reduce(t); total = t.item()")
    assert s.pull("total") == [4.0] * 4


def test_four_configs_on_two_rank_trials_each_as_if_trained_alone(pool):
    s = pool
    configs = [{"lr": 0.1}, {"lr": 0.05}, {"lr": 0.02, "steps": 20}, {"lr": 0.01, "seed": 1}]
    results = Sweep(regression, configs, ranks_per_trial=2, session=s).run()
    assert [t.status for t in results] == ["done"] * 4, results
    assert [t.config for t in results] == configs
    assert {t.mesh for t in results} == {"sweep0", "sweep1"}  # two at a time, each sub-mesh handed on
    for trial in results:
        assert trial.metrics["world"] == 2  # the sub-mesh's world
        assert trial.ranks in ([0, 1], [2, 3]) and trial.seconds > 0
        torch.testing.assert_close(torch.tensor(trial.metrics["params"]), alone(**trial.config))
        assert "checkpoint" not in trial.metrics and trial.checkpoint is None  # no checkpoint_dir: none
    losses = [t.metrics["loss"] for t in results]
    assert results.best("loss").index == losses.index(min(losses)) != losses.index(max(losses))
    assert results.best("loss", mode="max").index == losses.index(max(losses))
    assert "sweep0" in repr(results) and "<table>" in results._repr_html_()
    whole(s)


def flat(state: dict) -> torch.Tensor:
    """A Linear's state dict as the trial's ``params``: weight, then bias, flattened."""
    return torch.cat([state["weight"].flatten(), state["bias"].flatten()])


@pytest.mark.parametrize("keep", ["best", "all"])
def test_the_best_trials_checkpoint_is_kept_and_loads_its_final_parameters(pool, tmp_path, keep):
    s = pool
    folder = tmp_path / "sweep"
    configs = [{"lr": 0.1}, {"lr": 0.05}, {"lr": 0.02, "steps": 20}, {"lr": 0.01, "seed": 1}]
    sweep = Sweep(regression, configs, ranks_per_trial=2, session=s, checkpoint_dir=folder, metric="loss",
                  keep=keep)
    results = sweep.run()
    assert [t.status for t in results] == ["done"] * 4, results
    best = sweep.best()  # the sweep's metric and mode: the lowest loss
    assert best.index == results.best("loss").index
    for trial in results:
        path = folder / f"trial-{trial.index}" / "checkpoint.pt"
        kept = keep == "all" or trial.index == best.index
        assert (trial.checkpoint, path.exists()) == ((str(path), True) if kept else (None, False)), trial
        assert "checkpoint" not in trial.metrics
        if kept:  # loads into that trial's own final parameters, here and on the ranks
            state = torch.load(trial.checkpoint, weights_only=True)
            torch.testing.assert_close(flat(state), torch.tensor(trial.metrics["params"]))
    assert f"trial-{best.index}/checkpoint.pt" in repr(results) and "checkpoint" in results._repr_html_()
    s.run(f"import torch; m = torch.nn.Linear(4, 1); m.load_state_dict(torch.load({best.checkpoint!r}, "
          "weights_only=True)); loaded = torch.cat([p.detach().flatten() for p in m.parameters()])")
    for loaded in s.pull("loaded"):
        torch.testing.assert_close(loaded, torch.tensor(best.metrics["params"]))
    whole(s)


# rank 0 of a trial returns its checkpoint; with a negative lr rank 1 then raises, once rank 0 has returned
# (a file it leaves on its way out): the trial fails after rank 0 handed in its checkpoint
SAVES = """
import time, torch
from pathlib import Path
def saves(lr, returned):
    if lr < 0 and rank == 1:
        for _ in range(6000):
            if Path(returned).exists():
                raise ValueError(f"negative lr {lr}")
            time.sleep(0.01)
        raise TimeoutError("rank 0 never returned")
    if rank == 0:
        Path(returned).touch()
    return {"lr": lr, "checkpoint": {"w": torch.full((2,), lr)}}
"""


def test_a_failed_trial_leaves_no_checkpoint_even_with_keep_all(pool, tmp_path):
    s = pool
    s.run(SAVES)
    folder = tmp_path / "sweep"
    configs = [{"lr": lr, "returned": str(tmp_path / f"returned-{i}")}
               for i, lr in enumerate([0.1, -1.0, 0.3])]
    results = Sweep("saves", configs, ranks_per_trial=2, session=s, checkpoint_dir=folder, keep="all").run()
    assert [t.status for t in results] == ["done", "failed", "done"], results
    assert results[1].error.endswith("raised ValueError: negative lr -1.0")
    assert results[1].checkpoint is None and not (folder / "trial-1").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["trial-0", "trial-2"]
    for trial in (results[0], results[2]):
        state = torch.load(trial.checkpoint, weights_only=True)
        torch.testing.assert_close(state["w"], torch.full((2,), trial.config["lr"]))
    whole(s)


@pytest.mark.parametrize(("where", "keep", "metric", "says"), [
    ("a-file", "best", "loss", "is a file, not a folder"),
    ("folder", "best", None, "metric="),
    ("folder", "last", "loss", "'best' .* or 'all'"),
], ids=["dir-is-a-file", "best-without-metric", "bad-keep"])
def test_bad_checkpoint_input_is_a_value_error_and_the_pool_stays_unsplit(pool, tmp_path, where, keep,
                                                                          metric, says):
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(ValueError, match=says):
        Sweep(regression, [{"lr": 0.1}, {"lr": 0.2}], ranks_per_trial=2, session=pool,
              checkpoint_dir=tmp_path / where, keep=keep, metric=metric)
    assert pool.meshes == {} and (tmp_path / "a-file").read_text() == "not a folder"
    assert not (tmp_path / "folder").exists()


# a wb.Trainer over a DDP model, defined on the ranks by name (a %%distributed cell)
FIT = """
import torch, workbench as wb
from torch.utils.data import TensorDataset
def fit(lr, steps=15):
    torch.manual_seed(0)
    model = wb.shard(wb.MLP(wb.MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1)), "ddp")
    loader = wb.make_loader(TensorDataset(*wb.regression_data(256, d_in=8, d_out=2)), batch_size=16)
    result = wb.Trainer(model, loader, lr=lr).run(steps=steps)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"loss": result.history[-1].loss, "params": params}
"""


def test_trainer_trials_equal_the_same_config_trained_alone_on_a_sub_mesh(pool):
    s = pool
    s.run(FIT)
    runs = len(s.metrics.runs)
    configs = [{"lr": 0.1}, {"lr": 0.03}, {"lr": 0.01, "steps": 10}]
    results = Sweep("fit", configs, ranks_per_trial=2, session=s).run()
    assert [t.status for t in results] == ["done"] * 3, results
    # each trial's Trainer streamed its own run to the live metrics
    assert until(lambda: len(s.metrics.runs) >= runs + 3, timeout=30), len(s.metrics.runs) - runs
    s.split([2, 2], names=["a", "b"])  # the same configurations again, one at a time, alone on a sub-mesh
    try:
        for trial in results:
            s.run(f"alone = fit(**{trial.config!r})['params']", on="b")
            torch.testing.assert_close(torch.tensor(trial.metrics["params"]), s.view([2]).pull("alone")[0])
    finally:
        s.join()
    whole(s)


def test_the_comparison_dashboard_draws_every_trainer_trial_and_marks_the_best(pool):
    """wb.Sweep's dashboard (workbench/widgets/sweep_dashboard.py): one loss line per trial, each from the
    trial's own Trainer run (the third trial, on a sub-mesh an earlier trial trained on, has its own 10
    steps, not the earlier 15), named by trial and config, the best (sweep.best) marked; left as a static
    plotly figure when the sweep ends."""
    s = pool
    s.run(FIT)
    configs = [{"lr": 0.1}, {"lr": 0.03}, {"lr": 0.01, "steps": 10}]
    sweep = Sweep("fit", configs, ranks_per_trial=2, session=s, dashboard=True)
    results = sweep.run()
    assert [t.status for t in results] == ["done"] * 3, results
    dash = sweep.dashboard
    assert dash.ended
    best = sweep.best("loss").index
    assert dash.best == best
    loss = [t for t in dash.figure["data"] if t["xaxis"] == "x"]
    names = ["trial 0: lr=0.1 (done)", "trial 1: lr=0.03 (done)", "trial 2: lr=0.01, steps=10 (done)"]
    names[best] = f"best · {names[best]}"
    assert [t["name"] for t in loss] == names
    assert [t["line"]["width"] for t in loss] == [4 if i == best else 1.5 for i in range(3)]
    assert len({t["line"]["color"] for t in loss}) == 3  # a colour per trial
    for trace, config, trial in zip(loss, configs, results, strict=True):
        steps = config.get("steps", 15)
        assert len(trace["x"]) == steps and trace["x"] == sorted(set(trace["x"])), trace["x"]
        assert trace["y"][-1] == pytest.approx(trial.metrics["loss"])  # the trial's own final loss
    rates = [t for t in dash.figure["data"] if t["xaxis"] == "x2"]
    assert [len(t["x"]) for t in rates] == [15, 15, 10]
    static = dash.bundle["application/vnd.plotly.v1+json"]  # what a saved notebook keeps
    assert static["data"] == dash.figure["data"] and "3 done" in dash.bundle["text/plain"]
    assert f"best: trial {best}" in dash.bundle["text/plain"]
    whole(s)


def test_two_trials_run_at_the_same_time(pool, tmp_path):
    s = pool
    s.run(MEET)
    configs = [{"folder": str(tmp_path), "me": "a", "other": "b"},
               {"folder": str(tmp_path), "me": "b", "other": "a"}]
    first, second = Sweep("meet", configs, ranks_per_trial=2, session=s).run()
    assert (first.status, second.status) == ("done", "done"), (first.error, second.error)
    assert {first.mesh, second.mesh} == {"sweep0", "sweep1"}
    assert first.metrics["start"] < second.metrics["end"] and second.metrics["start"] < first.metrics["end"]
    whole(s)


def test_a_trial_that_raises_is_recorded_and_the_others_finish(pool):
    s = pool
    s.run(FLAKY)
    configs = [{"lr": 0.1}, {"lr": -1.0}, {"lr": 0.2}, {"lr": 0.3}, {"lr": 0.4}]
    results = Sweep("flaky", configs, ranks_per_trial=2, session=s).run()
    assert [t.status for t in results] == ["done", "failed", "done", "done", "done"], results
    assert results[1].error.startswith("rank 3 ") and results[1].metrics == {}  # pool rank 3: sweep1's rank 1
    assert results[1].error.endswith("raised ValueError: negative lr -1.0")
    # the trials after the failure, on its sub-mesh too, re-formed its group
    assert [t.metrics for t in results if t.status == "done"] == [
        {"sum": [2.0], "lr": lr} for lr in (0.1, 0.2, 0.3, 0.4)]
    assert "negative lr" in repr(results)
    assert results.best("lr", mode="max").config == {"lr": 0.4}
    whole(s)


def test_a_stopped_sweep_stops_its_trials_and_joins_the_pool(pool, tmp_path):
    s = pool
    s.run(HOLD)
    sweep = Sweep("hold", [{"folder": str(tmp_path), "i": i} for i in range(3)], ranks_per_trial=2,
                  session=s).start()
    # both trials began on both ranks of their sub-mesh (a stop before a rank began its cell stops nothing)
    assert until(lambda: len(list(tmp_path.glob("began*"))) == 4, timeout=60), list(tmp_path.iterdir())
    assert s.meshes == {"sweep0": [0, 1], "sweep1": [2, 3]} and not sweep.done()
    results = sweep.stop(timeout=120)
    assert [t.status for t in results] == ["stopped"] * 3, results
    assert results[2].mesh is None and results[2].seconds is None  # never started
    assert sweep.done()
    whole(s)


def test_ranks_left_over_wait_in_a_spare_sub_mesh(pool):
    s = pool
    s.run(FLAKY)
    sweep = Sweep("flaky", [{"lr": 0.5}, {"lr": 0.6}], ranks_per_trial=3, session=s).start()
    assert s.meshes == {"sweep0": [0, 1, 2], "spare": [3]}
    results = sweep.wait(120)
    assert [t.metrics for t in results] == [{"sum": [3.0], "lr": 0.5}, {"sum": [3.0], "lr": 0.6}]
    whole(s)


@pytest.mark.parametrize(("ranks", "configs", "says"), [
    (5, [{"lr": 0.1}], "more than the pool's 4 ranks"),
    (0, [{"lr": 0.1}], "at least 1"),
    (2, [], "at least one configuration"),
    (2, [{"lr": object()}], "not a plain value"),
    (2, {"lr": 0.1}, "a list of dicts"),
], ids=["too-many-ranks", "zero-ranks", "no-configs", "not-plain", "one-dict"])
def test_bad_input_is_a_value_error_and_the_pool_stays_whole(pool, ranks, configs, says):
    with pytest.raises(ValueError, match=says):
        Sweep("flaky", configs, ranks_per_trial=ranks, session=pool)
    assert pool.meshes == {}


def test_a_split_pool_is_refused(pool):
    s = pool
    s.split([2, 2], names=["a", "b"])
    try:
        with pytest.raises(ValueError, match="join"):
            Sweep("flaky", [{"lr": 0.1}], ranks_per_trial=2, session=s)
        assert s.meshes == {"a": [0, 1], "b": [2, 3]}  # untouched
    finally:
        s.join()


# pool rank 3 (rank 1 of the second trial's sub-mesh) dies in its trial; the others sum their sub-mesh
DIES = """
import os, signal, torch
def dies(i):
    if i == 1 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"sum": t}
"""


def test_a_rank_killed_in_a_trial_retires_its_sub_mesh_and_the_others_finish(pool):
    s = pool
    s.run(DIES)
    sweep = Sweep("dies", [{"i": i} for i in range(4)], ranks_per_trial=2, session=s).start()
    with pytest.raises(RankDiedError, match="rank 3 is dead.*restart"):  # the join at the end
        sweep.wait(180)
    results = sweep.results
    assert [t.status for t in results] == ["done", "failed", "done", "done"], results
    assert results[1].mesh == "sweep1" and results[1].error.startswith("rank 3 ")
    assert "died" in results[1].error
    assert [t.mesh for t in results[2:]] == ["sweep0", "sweep0"]  # not handed the dead rank's sub-mesh
    assert [t.metrics for t in results if t.status == "done"] == [{"sum": [2.0]}] * 3
    assert s.restart() == [3]
    s.join()
    whole(s)
