"""The Optuna side of a sweep (workbench/session/sweep_optuna.py) on a real study, without a pool: what is
asked, what the pruner is told and decides, and how each end of a trial is told. The pool:
tests/pool/test_sweep_optuna_pool.py."""

from __future__ import annotations

import pytest

from workbench.session.sweep_optuna import Search, new_points

optuna = pytest.importorskip(
    "optuna", reason="the sweep's Optuna integration needs the optuna extra: "
                     "pip install 'distributed-workbench[optuna]'")

pytestmark = pytest.mark.timeout(60)


def test_new_points_skip_reported_steps_and_unknown_losses():
    assert new_points([1.0, 2.0, 3.0], [0.5, float("nan"), 0.25], after=1) == [(3, 0.25)]


def test_asked_reported_pruned_and_told():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.0))
    search = Search(study, {"lr": optuna.distributions.FloatDistribution(1e-3, 1e-1)}, n_trials=3,
                    metric="loss")
    assert 1e-3 <= search.ask(0)["lr"] <= 1e-1
    assert not search.should_prune(0, [0.0, 1.0], [0.5, 0.5])  # below the threshold
    assert not search.should_prune(0, [0.0, 1.0], [0.5, 0.5])  # nothing new: nothing reported, no decision
    assert search.should_prune(0, [0.0, 1.0, 2.0], [0.5, 0.5, 2.0]) and search.reported[0] == 2
    search.tell(0, "pruned", {})
    search.ask(1)
    search.tell(1, "done", {"loss": 0.25})
    search.ask(2)
    search.tell(2, "done", {"accuracy": 0.9})  # no "loss": the study hears a failure, not a made-up value
    state = optuna.trial.TrialState
    assert [t.state for t in study.trials] == [state.PRUNED, state.COMPLETE, state.FAIL]
    assert study.trials[0].intermediate_values == {0: 0.5, 1: 0.5, 2: 2.0} and study.best_value == 0.25


def test_a_space_function_suggests_and_bad_arguments_say_what_to_give():
    study = optuna.create_study()
    search = Search(study, lambda t: {"layers": t.suggest_int("layers", 1, 3)}, n_trials=1, metric="loss")
    assert 1 <= search.ask(0)["layers"] <= 3
    for args, says in [((object(), {}, 1, "loss"), "optuna.Study"), ((study, 3, 1, "loss"), "search space"),
                       ((study, {}, 0, "loss"), "n_trials"), ((study, {}, 1, ""), "metric")]:
        with pytest.raises(ValueError, match=says):
            Search(*args)


def test_the_studys_direction_is_which_trial_is_best():
    """The sweep's mode (which trial's checkpoint it keeps, Sweep.best) is the study's direction."""
    for direction, mode in [("minimize", "min"), ("maximize", "max")]:
        study = optuna.create_study(direction=direction)
        assert Search(study, {}, n_trials=1, metric="accuracy").mode == mode


def test_a_grid_that_runs_out_is_told_without_an_error():
    """Found with notebook 12: GridSampler stops the study once its grid is used up, from ``tell``, which
    Optuna refuses outside ``optimize`` (RuntimeError): the sweep's cell failed at its last trial."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.GridSampler({"lr": [0.1, 0.01]}, seed=0))
    search = Search(study, {"lr": optuna.distributions.CategoricalDistribution([0.1, 0.01])}, n_trials=2,
                    metric="loss")
    asked = [search.ask(i)["lr"] for i in range(2)]
    search.tell(0, "done", {"loss": 0.5})
    search.tell(1, "done", {"loss": 0.25})  # the grid is used up here
    assert sorted(asked) == [0.01, 0.1] and study.best_value == 0.25
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
