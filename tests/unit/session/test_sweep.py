"""The sweep's pure parts (workbench/session/sweep.py): the sub-meshes a pool is split into, the checks of its
input, the cell each trial runs (executed here on a plain namespace, as a rank would), and the results table.
The scheduling on a real pool: tests/pool/test_sweep_pool.py."""

from __future__ import annotations

import pytest

from workbench.session.sweep import (
    RESULT,
    STATE,
    Results,
    Trial,
    check_size,
    checkpoint_folder,
    configs_checked,
    slots,
    trial_code,
    trial_source,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("world", "k", "meshes"), [
    (4, 2, ["sweep0", "sweep1"]),
    (4, 1, ["sweep0", "sweep1", "sweep2", "sweep3"]),
    (4, 3, ["sweep0", "spare"]),  # one trial at a time, the last rank idle
    (5, 2, ["sweep0", "sweep1", "spare"]),
    (4, 4, []),  # one trial fills the pool: not split
])
def test_slots(world, k, meshes):
    assert slots(world, k) == meshes


@pytest.mark.parametrize(("k", "says"), [(0, "at least 1"), (-2, "at least 1"), (2.5, "whole number"),
                                         (True, "whole number"), (5, "more than the pool's 4 ranks")])
def test_a_trial_size_that_does_not_fit_says_what_does(k, says):
    with pytest.raises(ValueError, match=says):
        check_size(k, 4)


def test_configs_must_be_dicts_of_plain_keyword_values():
    assert configs_checked(({"lr": 0.1, "layers": [1, 2], "name": None},)) == [
        {"lr": 0.1, "layers": [1, 2], "name": None}]
    for bad, says in [([], "at least one"), ({"lr": 0.1}, "list of dicts"), ([0.1], "not a dict"),
                      ([{"not a name": 1}], "no keyword argument name"),
                      ([{"lr": object()}], "not a plain value")]:
        with pytest.raises(ValueError, match=says):
            configs_checked(bad)


class Scalar:
    """A value with ``tolist`` (as a tensor or a numpy number has), for the cell's conversion."""

    def tolist(self):
        return 0.25


def test_a_trial_cell_calls_the_function_and_leaves_plain_metrics():
    namespace = {"train": lambda lr, steps=1: {"loss": Scalar(), "lr": lr, "steps": steps}}
    exec(trial_code("train", "", {"lr": 0.5, "steps": 3}), namespace)
    assert namespace[RESULT] == {"loss": 0.25, "lr": 0.5, "steps": 3}
    for returned, metrics in [(None, {}), (Scalar(), {"value": 0.25}), (7, {"value": 7})]:
        namespace = {"train": lambda returned=returned: returned}
        exec(trial_code("train", "", {}), namespace)
        assert namespace[RESULT] == metrics


def test_a_trial_cell_keeps_the_returned_checkpoint_on_rank_0_only_and_out_of_the_metrics():
    state = {"weight": [1.0, 2.0]}
    for rank in (0, 1):
        namespace = {"rank": rank, "train": lambda: {"loss": 0.5, "checkpoint": state}}
        exec(trial_code("train", "", {}, checkpoint=True), namespace)
        assert namespace[RESULT] == {"loss": 0.5}
        assert namespace[STATE] == (state if rank == 0 else None)  # written from there once the trial is done
    namespace = {"rank": 0, "train": lambda: {"loss": 0.5, "checkpoint": state}}
    exec(trial_code("train", "", {}), namespace)  # a sweep without checkpoint_dir keeps none
    assert namespace[RESULT] == {"loss": 0.5} and namespace[STATE] is None


def test_save_file_writes_a_whole_file_torch_loads(tmp_path):
    import torch

    from workbench.train.checkpoint import save_file

    state = {"weight": torch.arange(4.0)}
    path = tmp_path / "trial-0" / "checkpoint.pt"
    assert save_file(state, path) == str(path)
    torch.testing.assert_close(torch.load(path, weights_only=True), state)
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]  # no partial file left


def test_checkpoint_folder_is_made_or_refused_saying_what_fits(tmp_path):
    assert checkpoint_folder(tmp_path / "a" / "b", "best", "loss") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("x")
    for where, keep, metric, says in [(tmp_path / "file", "all", None, "is a file, not a folder"),
                                      (tmp_path / "c", "best", None, "metric="),
                                      (tmp_path / "c", "last", "loss", "'best' .* or 'all'"),
                                      (tmp_path / "file" / "under", "all", None, "cannot be made")]:
        with pytest.raises(ValueError, match=says):
            checkpoint_folder(where, keep, metric)
    assert not (tmp_path / "c").exists()
    assert checkpoint_folder(None, "best", None) is None  # no folder: no checkpoints, no metric needed


def square(x):
    return {"y": x * x}


def test_a_function_of_the_notebook_goes_to_the_ranks_as_its_source():
    name, source = trial_source(square)
    assert (name, source.splitlines()[0]) == ("square", "def square(x):")
    namespace = {}
    exec(trial_code(name, source, {"x": 3}), namespace)  # a rank defines it, then calls it
    assert namespace[RESULT] == {"y": 9}
    assert trial_source("train") == ("train", "")  # a name: defined on the ranks already
    for bad in (lambda x: x, "not a name", print):
        with pytest.raises(ValueError, match="train"):
            trial_source(bad)


def results() -> Results:
    return Results([
        Trial(0, {"lr": 0.1}, "done", {"loss": 0.5}, 1.0, "sweep0", [0, 1]),
        Trial(1, {"lr": 1.0}, "failed", {}, 0.2, "sweep1", [2, 3],
              error="rank 3 (h, cpu) raised ValueError: x"),
        Trial(2, {"lr": 0.01}, "done", {"loss": 0.75}, 1.1, "sweep1", [2, 3]),
        Trial(3, {"lr": 0.001}, "stopped"),
    ])


def test_best_picks_among_done_trials_by_mode():
    r = results()
    assert r.best("loss").index == 0 and r.best("loss", mode="max").index == 2
    with pytest.raises(ValueError, match="the metrics are: loss"):
        r.best("accuracy")
    with pytest.raises(ValueError, match="'min' or 'max'"):
        r.best("loss", mode="lowest")


def test_the_table_shows_every_trial_in_text_and_html():
    r = results()
    lines = str(r).splitlines()
    assert lines[0].split() == ["trial", "status", "mesh", "ranks", "seconds", "config", "loss", "error"]
    assert lines[1].split() == ["0", "done", "sweep0", "0-1", "1.00", "lr=0.1", "0.5"]
    assert "raised ValueError: x" in lines[2] and lines[4].split() == ["3", "stopped", "lr=0.001"]
    page = r._repr_html_()
    assert page.count("<tr>") == 5 and "lr=0.001" in page
    assert r.rows()[0] == {"trial": 0, "status": "done", "mesh": "sweep0", "ranks": "0-1", "seconds": 1.0,
                           "config": {"lr": 0.1}, "loss": 0.5, "error": None, "checkpoint": None}
    r[2].checkpoint = "/s/trial-2/checkpoint.pt"  # a checkpoint kept: its column, empty where none
    lines = str(r).splitlines()
    assert lines[0].split()[-1] == "checkpoint" and lines[3].split()[-1] == "/s/trial-2/checkpoint.pt"
    assert lines[1].split()[-1] == "0.5" and "/s/trial-2/checkpoint.pt</td>" in r._repr_html_()
