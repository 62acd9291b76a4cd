"""Every walkthrough runs headless on a local 2-engine CPU pool, start to end, and leaves nothing behind.

Errors are allowed only in cells tagged ``raises-exception`` (the faults notebook fails on purpose), and
those cells must really fail; cells tagged ``gpu`` are skipped without a GPU. Each notebook's ``summary``
holds the numbers its text relies on; they are checked here. The repository keeps notebooks without
outputs.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from tests.conftest import alive
from workbench.demo import GPU_TAG, ROOT, run_notebook
from workbench.pool.machine.devices import visible_gpu_count

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# 01 (the quickstart) has its own test: tests/notebooks/test_quickstart.py
WALKTHROUGHS = [p for p in NOTEBOOKS if not p.name.startswith("01_")]


def _check_02(s):
    assert s["replicas_identical"] and s["speedup"] > 0 and s["final_loss"] < 0.2 and 0 < s["comm_share"]


def _check_03(s):
    assert 0.45 <= s["ratio"] <= 0.6, f"FSDP should keep about half of DDP's memory per rank: {s}"
    assert s["loss_gap"] < 1e-4


def _check_04(s):
    assert s["in_flight_gpipe"] == 4 and s["in_flight_1f1b"] == 2 and s["final_loss"] < 0.3
    assert 0 < s["bubble_gpipe"] < 1 and set(s["bubble_by_m"]) == {"1", "2", "4", "8"}


def _check_05(s):
    assert s["max_gap"] < 1e-5 and s["collectives"] == {"all_reduce": 4} and s["final_loss"] < 0.2


def _check_06(s):
    assert s["straggler"] == 1 and s["records"] >= 240


def _check_07(s):
    assert (s["failed_after"], s["resumed_at"], s["final_step"]) == (25, 20, 40)


def _check_08(s):
    assert s["steps"] == 80 and s["final_loss"] < 2.0


def _check_09(s):
    assert (s["world_after"], s["samples_once"], s["replicas_equal"]) == (1, True, True), s
    assert s["lost_at"] == 100 and s["final_step"] == 400 and s["new_rank_from"] == 301, s
    assert s["second_run_ranks"] == [0, 1], s  # the new rank's steps reached the second run's dashboard


def _check_10(s):
    assert (s["same_numbers"], s["epochs"], s["improved"]) == (True, 5, True), s


def _check_11(s):
    assert s["accelerate_rerun_equal"] and s["lightning_rerun_equal"] and s["ranks_agree"], s
    assert s["steps"] == [4, 4], s  # 64 samples, batches of 8, over 2 ranks: both trained across the pool


def _check_12(s):
    assert s["overlapped"] and s["alone_equal"] and s["sum_after_join"] == [4.0] * 4, s
    assert s["sweep"] == ["done"] * 4 and s["joined_after_sweep"], s
    assert s["kept"] and s["best_eval_equal"], s  # the best trial's checkpoint only, loaded and evaluated
    optuna = s["optuna"]  # section 7: an Optuna study's six suggestions, its pruner stopping the bad ones
    if importlib.util.find_spec("optuna") is None:  # the extra missing: the section says how, and is skipped
        assert optuna is None, s
        return
    assert len(optuna["trials"]) == 6 and set(optuna["trials"]) <= {"done", "pruned"}, s
    assert optuna["trials"][:2] == ["done", "done"] and "pruned" in optuna["trials"], s  # seed 270
    assert optuna["study"] == [{"done": "COMPLETE", "pruned": "PRUNED"}[t] for t in optuna["trials"]], s
    assert optuna["pruned_lrs"] == [lr for lr in optuna["lrs"] if lr < 1e-3], s  # too small to learn, only
    assert optuna["joined_after"], s


CHECKS = {"02": _check_02, "03": _check_03, "04": _check_04, "05": _check_05, "06": _check_06,
          "07": _check_07, "08": _check_08, "09": _check_09, "10": _check_10, "11": _check_11,
          "12": _check_12}


# every walkthrough starts 2 ranks, but the one that splits its pool into two sub-meshes of 2
RANKS = {"12": 4}


class ProcessWatch:
    """Every process descended from this one while a notebook runs (kernel, controller, engines)."""

    def __init__(self):
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        me = psutil.Process()
        while not self._stop.wait(0.5):
            try:
                self.pids.update(p.pid for p in me.children(recursive=True))
            except psutil.Error:
                pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def _tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_walkthrough_runs_clean(path: Path, tmp_path):
    t0 = time.perf_counter()
    with ProcessWatch() as watch:
        summary = run_notebook(path, tmp_path, log=lambda line: None)
    elapsed = time.perf_counter() - t0
    nb = nbformat.read(tmp_path / path.name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if "raises-exception" in _tags(cell):
            assert errors, f"a cell meant to fail did not:\n{cell.source}"
        else:
            assert not errors, f"{errors[0].ename}: {errors[0].evalue}\nin:\n{cell.source}"
        streams = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert "could not refresh" not in streams and "Exception in thread" not in streams, streams
        if GPU_TAG in _tags(cell) and not visible_gpu_count():
            assert cell.outputs == [], "a GPU cell ran without a GPU"
    assert code[-1].source.strip() == "%dist stop", "a walkthrough must end by stopping its pool"
    ranks = RANKS.get(path.name[:2], 2)
    stopped = "".join(o.get("text", "") for o in code[-1].outputs)
    assert f"({ranks} ranks); no process of it is left" in stopped, stopped
    assert summary is not None and summary["ranks"] == ranks, summary
    CHECKS[path.name[:2]](summary)
    deadline = time.monotonic() + 10
    while alive(sorted(watch.pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(sorted(watch.pids)) == [], "processes of the notebook survived it"
    print(f"{path.name}: {elapsed:.0f} s")


def _readme_order() -> list[str]:
    text = (ROOT / "notebooks" / "README.md").read_text()
    return [p.name for p in NOTEBOOKS if p.name in text]


def test_readme_lists_every_notebook():
    assert _readme_order() == [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} holds outputs: clear them before committing (cell starting "
                f"{cell.source.splitlines()[0]!r})")
    assert "widgets" not in nb.metadata, f"{path.name} holds widget state"
