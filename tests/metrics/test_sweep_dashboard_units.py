"""The sweep's comparison dashboard without a pool: its pure parts (which trial is best, how a line is named,
the title, the figure) on plain Trials (workbench/widgets/sweep_dashboard.py); the live one on a real pool
is in tests/pool/test_sweep_pool.py."""

from __future__ import annotations

import math

import pytest

from workbench.session.sweep import Results, Trial
from workbench.widgets import figures
from workbench.widgets.sweep_dashboard import headline, pick_best, sweep_figure, trace_name

pytestmark = pytest.mark.timeout(30)


def trials() -> list[Trial]:
    return [Trial(0, {"lr": 0.1}, "done", metrics={"loss": 0.42}),
            Trial(1, {"lr": 0.03, "steps": 10}, "done", metrics={"loss": 0.17}),
            Trial(2, {"lr": 0.01}, "running"),
            Trial(3, {"lr": 1.0}, "failed"),
            Trial(4, {"lr": 3.0}, "pending")]


def test_the_best_is_the_done_trial_with_the_lowest_final_loss_as_results_best_says():
    ts = trials()
    # the curves' latest losses say otherwise (a running trial lower, a failed one lower still): finals win
    latest = {0: 0.40, 1: 0.20, 2: 0.01, 3: 0.001}
    assert pick_best(ts, latest) == 1 == Results(ts).best("loss").index


def test_before_any_trial_is_done_the_best_is_the_running_trial_with_the_lowest_latest_loss():
    ts = [Trial(0, {}, "running"), Trial(1, {}, "running"), Trial(2, {}, "failed"), Trial(3, {}, "pruned")]
    assert pick_best(ts, {0: 0.5, 1: 0.3, 2: 0.1, 3: 0.05}) == 1
    assert pick_best(ts, {0: math.nan, 1: math.inf}) is None  # no finite loss: none is best yet
    assert pick_best(ts, {}) is None


def test_a_done_trial_without_a_loss_of_its_own_is_scored_by_its_curve():
    ts = [Trial(0, {}, "done", metrics={"acc": 0.9}), Trial(1, {}, "done", metrics={"loss": 0.5})]
    assert pick_best(ts, {0: 0.2, 1: 0.1}) == 0


def test_each_line_is_named_by_its_trial_config_and_status_and_the_best_says_best():
    ts = trials()
    assert trace_name(ts[0], best=1) == "trial 0: lr=0.1 (done)"
    assert trace_name(ts[1], best=1) == "best · trial 1: lr=0.03, steps=10 (done)"
    assert trace_name(Trial(5, {"opt": "adam"}, "pruned"), best=None) == "trial 5: opt='adam' (pruned)"


def test_the_title_counts_the_statuses_and_names_the_best():
    ts = trials()
    assert headline(ts, 1) == ("sweep · 1 running, 2 done, 1 failed, 1 pending · best: trial 1 "
                               "(lr=0.03, steps=10), loss 0.17")
    assert headline([], None) == "sweep · no trial yet"


def test_the_figure_has_a_loss_and_a_rate_line_per_trial_in_its_colour_the_best_thicker():
    ts = trials()
    curve = lambda n: {"step": list(range(1, n + 1)), "loss": [1 / s for s in range(1, n + 1)],
                       "rate_step": list(range(1, n + 1)), "samples_per_s": [100.0] * n}
    fig = sweep_figure(ts, {0: curve(15), 1: curve(10), 2: curve(3)}, best=1)
    loss = [t for t in fig["data"] if t["xaxis"] == "x"]
    rate = [t for t in fig["data"] if t["xaxis"] == "x2"]
    assert [t["name"] for t in loss] == [trace_name(t, 1) for t in ts[:3]]  # no curve, no line
    assert [len(t["x"]) for t in loss] == [15, 10, 3] == [len(t["x"]) for t in rate]
    assert [t["line"]["width"] for t in loss] == [1.5, 4, 1.5]
    colours = list(figures.COLOURS[:3])
    assert [t["line"]["color"] for t in loss] == [t["line"]["color"] for t in rate] == colours
    assert not any(t["showlegend"] for t in rate)
    bundle = figures.static_bundle(headline(ts, 1), fig)
    assert bundle[figures.PLOTLY_MIME]["data"] == fig["data"] and "<svg" in bundle["text/html"]
