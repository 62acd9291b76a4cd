"""Tutorial-style torchrun scripts, unchanged: under real torchrun, then in a real 2-rank pool through the
notebook's magics (``%dist run`` and ``%%distributed`` + ``%run``); the printed numbers must be equal, and an
all_reduce cell afterwards proves the pool's group alive."""

from __future__ import annotations

import pytest

from tests.torchrun.common import SCRIPTS, figures, on_both_ranks, run, torchrun

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CASES = [
    ("ddp_snapshot.py", ["3", "2", "--batch_size", "8"]),
    ("fsdp2_dcp.py", ["--steps", "3", "--checkpoint-dir", "ckpt"]),
    ("mesh_2d.py", ["--tp", "1"]),
    ("nanogpt_style.py", ["--max_iters=4"]),
]




def group_alive(ip) -> None:
    cell = ("%%distributed\nimport torch\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\n"
            "print('sum', t.item())")
    result, shown = run(ip, cell)
    assert result.success, shown
    assert on_both_ranks(shown, "sum 3.0"), shown


@pytest.mark.parametrize(("script", "args"), CASES, ids=[c[0] for c in CASES])
def test_script_runs_unchanged_with_torchruns_numbers(ipshell, pool, tmp_path, monkeypatch, script, args):
    (tmp_path / "torchrun").mkdir()
    (tmp_path / "pool").mkdir()
    expected = figures(torchrun(script, args, tmp_path / "torchrun"))
    assert expected, "the script printed no figures under torchrun"
    monkeypatch.chdir(tmp_path / "pool")  # the notebook's folder: the ranks work there too
    result, shown = run(ipshell, f"%dist run {SCRIPTS / script} -- {' '.join(args)}")
    assert result.success, shown
    assert figures(shown) == expected, shown
    group_alive(ipshell)
    if script == "ddp_snapshot.py":  # the snapshot is in the notebook's folder, as torchrun's is in its own
        assert (tmp_path / "pool" / "snapshot.pt").is_file()
        assert (tmp_path / "torchrun" / "snapshot.pt").is_file()
    if script == "fsdp2_dcp.py":
        assert (tmp_path / "pool" / "ckpt" / ".metadata").is_file()


def test_percent_run_in_a_cell_with_the_scripts_arguments(ipshell, pool, tmp_path, monkeypatch):
    """``%%distributed`` + ``%run script args``: the first thing a user tries (init twice on main)."""
    (tmp_path / "torchrun").mkdir()
    expected = figures(torchrun("nanogpt_style.py", ["--max_iters=3"], tmp_path / "torchrun"))
    monkeypatch.chdir(tmp_path)
    result, shown = run(ipshell, f"%%distributed\n%run {SCRIPTS / 'nanogpt_style.py'} --max_iters=3")
    assert result.success, shown
    assert figures(shown) == expected, shown
    assert shown.count("the pool's process group is formed already") <= 1, shown
    group_alive(ipshell)


def test_script_globals_stay_on_the_ranks(ipshell, pool, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result, shown = run(ipshell, f"%dist run {SCRIPTS / 'nanogpt_style.py'} -- --max_iters=1")
    assert result.success, shown
    assert pool.pull("ddp_world_size") == [2, 2] and pool.pull("master_process") == [True, False]
    result, shown = run(ipshell, "%%distributed\nprint(type(raw_model).__name__, iter_num)")
    assert result.success and on_both_ranks(shown, "GPT 0"), shown
