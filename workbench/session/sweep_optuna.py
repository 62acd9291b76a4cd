"""A sweep's suggestions and pruning from an Optuna study (the ``optuna`` extra): Optuna decides, we run.

:class:`Search` wraps a study for :class:`~workbench.session.sweep.Sweep`: each free sub-mesh's next
configuration is ``study.ask()`` (a search space of Optuna distributions, or a function of the trial that
calls its ``suggest_*``), each running trial's live training loss (the ``wb.Trainer``'s steps, from rank 0 of
its sub-mesh, through the live metrics) is ``trial.report(loss, step)``, and ``trial.should_prune()`` (the
study's pruner) stops it; its end is ``study.tell``: the final ``metric``, pruned, or failed. Nothing of
the search or the pruning is written here. ``optuna`` is imported only when a study is given.

>>> new_points([0.0, 1.0, 2.0, 3.0], [9.0, 4.0, 2.0, 1.0], after=1)
[(2, 2.0), (3, 1.0)]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

INSTALL = "pip install 'distributed-workbench[optuna]'"


def new_points(steps: list[float], losses: list[float], after: int) -> list[tuple[int, float]]:
    """``(step, loss)`` of the steps after step ``after``, in order, without NaNs (a loss not known)."""
    return [(int(s), float(v)) for s, v in zip(steps, losses, strict=True) if s > after and not math.isnan(v)]


class Search:
    """The Optuna side of a sweep: ``n_trials`` configurations asked of ``study`` in ``space`` (a dict of
    Optuna distributions, or ``space(trial) -> config`` with the trial's ``suggest_*``); ``metric``: the key
    of a trial's final metrics told to the study."""

    def __init__(self, study, space: dict | Callable, n_trials: int, metric: str):
        try:
            import optuna
        except ImportError:
            raise ValueError(f"a sweep with a study needs Optuna: {INSTALL}.") from None
        if not isinstance(study, optuna.Study):
            raise ValueError(f"study is an optuna.Study (optuna.create_study(...)), not {study!r}.")
        if not (isinstance(space, dict) or callable(space)):
            raise ValueError("with a study, the second argument is the search space: a dict of Optuna "
                             "distributions ({'lr': optuna.distributions.FloatDistribution(1e-4, 1e-1, "
                             "log=True)}) or a function of the trial returning a config.")
        if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 1:
            raise ValueError(f"n_trials is how many trials to ask the study for, at least 1 (got "
                             f"{n_trials!r}).")
        if not isinstance(metric, str) or not metric:
            raise ValueError("metric names the final metric told to the study, e.g. metric=\"loss\".")
        self.optuna = optuna
        self.mode = "max" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "min"  # the best
        self.study, self.space, self.n_trials, self.metric = study, space, n_trials, metric
        self.asked: dict[int, Any] = {}  # sweep trial index -> Optuna trial
        self.reported: dict[int, int] = {}  # sweep trial index -> the last step reported

    def ask(self, index: int) -> dict[str, Any]:
        """The next configuration (Optuna's), for the sweep's trial ``index``."""
        if isinstance(self.space, dict):
            trial = self.study.ask(self.space)
            config = dict(trial.params)
        else:
            trial = self.study.ask()
            config = self.space(trial)
            if not isinstance(config, dict):
                raise ValueError(f"the search space function returned {config!r}: return a dict, the trial's "
                                 "keyword arguments.")
        self.asked[index] = trial
        self.reported[index] = -1
        return config

    def should_prune(self, index: int, steps: list[float], losses: list[float]) -> bool:
        """Report the trial's steps since the last report; whether the study's pruner stops it now."""
        trial = self.asked[index]
        points = new_points(steps, losses, self.reported[index])
        for step, loss in points:
            trial.report(loss, step)
        if points:
            self.reported[index] = points[-1][0]
        return bool(points) and trial.should_prune()

    def tell(self, index: int, status: str, metrics: dict[str, Any]) -> None:
        """The trial's end, told to the study: its final ``metric`` (done), pruned, or failed (also a stopped
        one, or one whose metric is missing)."""
        trial = self.asked.pop(index)
        state = self.optuna.trial.TrialState
        value = metrics.get(self.metric)
        try:
            if status == "done" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.study.tell(trial, float(value))
            elif status == "pruned":
                self.study.tell(trial, state=state.PRUNED)
            else:
                self.study.tell(trial, state=state.FAIL)
        except RuntimeError as exc:
            # a sampler whose grid ran out (GridSampler, BruteForceSampler) stops the study in ``tell``,
            # which Optuna allows only inside ``optimize``; the trial is recorded first
            # (n_trials bounds the rest)
            if "Study.stop" not in str(exc):
                raise
