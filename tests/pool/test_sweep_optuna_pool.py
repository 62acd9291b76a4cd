"""The sweep with an Optuna study on a real 4-rank pool (issue 43 part 3, docs/submeshes.md): configurations
asked of the study as 2-rank sub-meshes come free, final metrics told to it, and its pruner fed each running
trial's live training loss, a pruned trial stopped at its next step while the others run on. Optuna is an
optional extra: without it the module is skipped, saying how to install it."""

from __future__ import annotations

import pytest

from tests.conftest import running_pool
from workbench import Sweep

optuna = pytest.importorskip(
    "optuna", reason="the sweep's Optuna integration needs the optuna extra: "
                     "pip install 'distributed-workbench[optuna]'")

pytestmark = pytest.mark.timeout(300)

# a wb.Trainer over a DDP model, the targets shifted by ``offset`` (10: a loss near 100; 0: below 1)
FIT = """
import torch, workbench as wb
from torch.utils.data import TensorDataset
def fit(offset, steps, lr=1e-3):
    torch.manual_seed(0)
    model = wb.shard(wb.MLP(wb.MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1)), "ddp")
    x, y = wb.regression_data(256, d_in=8, d_out=2)
    loader = wb.make_loader(TensorDataset(x, y + offset), batch_size=16)
    result = wb.Trainer(model, loader, lr=lr).run(steps=steps)
    return {"loss": result.history[-1].loss, "steps": result.history[-1].step,
            "checkpoint": model.state_dict()}
"""
BAD_STEPS = 5000  # what a bad trial would train if nothing pruned it (many seconds)


@pytest.fixture(scope="module")
def pool():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with running_pool(n=4, timeout=60, backend="gloo") as s:
        s.run(FIT)
        yield s


def whole(s) -> None:
    assert s.meshes == {}
    s.run("import torch; t = torch.ones(1); dist.all_reduce(t); total = t.item()")
    assert s.pull("total") == [4.0] * 4


def space(trial) -> dict:
    offset = trial.suggest_categorical("offset", [0.0, 10.0])
    return {"offset": offset, "steps": 30 if offset == 0 else BAD_STEPS}


def test_the_pruner_stops_bad_trials_while_the_good_ones_finish(pool, tmp_path):
    s = pool
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.ThresholdPruner(upper=5.0))
    for offset in (0.0, 10.0, 0.0, 10.0):  # the study's first suggestions, in order
        study.enqueue_trial({"offset": offset})
    results = Sweep("fit", space, ranks_per_trial=2, session=s, study=study, n_trials=4, metric="loss",
                    timeout=120, checkpoint_dir=tmp_path, keep="all").run()
    assert [t.status for t in results] == ["done", "pruned", "done", "pruned"], results
    # a pruned trial leaves no checkpoint, a done one its own (keep="all")
    assert [(tmp_path / f"trial-{i}" / "checkpoint.pt").exists() for i in range(4)] == [True, False] * 2
    assert [t.checkpoint is not None for t in results] == [True, False] * 2
    assert [t.config["offset"] for t in results] == [0.0, 10.0, 0.0, 10.0]
    for trial in results[1::2]:  # stopped early, at a step boundary, by Optuna's pruner
        step = int(trial.error.removeprefix("pruned after step "))
        assert 0 <= step < BAD_STEPS
    state = optuna.trial.TrialState
    assert [t.state for t in study.trials] == [state.COMPLETE, state.PRUNED, state.COMPLETE, state.PRUNED]
    assert study.best_value == min(t.metrics["loss"] for t in results if t.status == "done")
    assert all(t.metrics["steps"] == 30 for t in results[::2])
    whole(s)


def test_a_search_space_of_distributions_is_asked_and_told(pool):
    s = pool
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0),
                                pruner=optuna.pruners.NopPruner())
    lr = optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    offset = optuna.distributions.CategoricalDistribution([0.0])
    steps = optuna.distributions.IntDistribution(10, 20)
    results = Sweep("fit", {"lr": lr, "offset": offset, "steps": steps}, ranks_per_trial=2, session=s,
                    study=study, n_trials=3, metric="loss").run()
    assert [t.status for t in results] == ["done"] * 3, results
    assert [t.config for t in results] == [t.params for t in study.trials]  # Optuna's suggestions, run
    assert all(1e-4 <= t.config["lr"] <= 1e-1 and t.metrics["steps"] == t.config["steps"] for t in results)
    assert [t.value for t in study.trials] == [t.metrics["loss"] for t in results]
    assert study.best_trial.number == results.best("loss").index
    whole(s)


def test_a_study_needs_its_trial_count_and_metric(pool):
    study = optuna.create_study()
    with pytest.raises(ValueError, match="n_trials"):
        Sweep("fit", space, ranks_per_trial=2, session=pool, study=study, metric="loss")
    with pytest.raises(ValueError, match="metric"):
        Sweep("fit", space, ranks_per_trial=2, session=pool, study=study, n_trials=2)
    with pytest.raises(ValueError, match="n_trials goes with a study"):
        Sweep("fit", [{"offset": 0.0, "steps": 1}], ranks_per_trial=2, session=pool, n_trials=2)
    assert pool.meshes == {}
