"""Each benchmark runs briefly, so that none rots: shapes of the results, no timings asserted.

The figures themselves come from ``make bench`` (bench/results/); nothing here compares speeds.
The anchors (nbdistributed, accelerate) are exercised only where ``bench/.venv-anchors`` exists.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bench.common import RESULTS
from tests.conftest import alive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _anchors() -> bool:
    from bench.run import anchors_status

    return anchors_status()[0]


def _has_summary(s: dict) -> bool:
    return s["n"] >= 1 and s["min"] <= s["median"] <= s["max"]


def test_cells_in_process_and_through_ipykernels():
    from bench import cells

    anchors = _anchors()
    got = cells.in_process(runs=2, block=1, anchors=anchors)
    res = got["results"]
    assert {
        "workbench %%distributed",
        "workbench Session.run",
        "ipyparallel DirectView.execute",
        "ipyparallel %%px",
    } <= set(res)
    assert all(_has_summary(s) for s in res.values()), res
    if anchors:
        assert "nbdistributed %%distributed" in res, got["notes"]
    kern = cells.through_kernels(runs=1, block=1, anchors=False)
    assert set(kern["results"]) == {"workbench %%distributed (ipykernel)", "ipyparallel %%px (ipykernel)"}
    assert kern["leftover"] == 0


def test_time_to_ready_of_workbench_and_torchrun():
    from bench import ready

    tools = ("workbench", "workbench, spare ready", "torchrun")
    got = ready.run(reps=1, anchors=False, only=tools)
    for name in tools:
        assert "errors" not in got[name], got[name]
        assert _has_summary(got[name]["ready_s"]) and _has_summary(got[name]["stop_s"])
        assert got[name]["leftover_processes"] == 0, got[name]
    assert [m for m, _ in got["workbench"]["marks"]][0] == "starting controller"
    assert got["workbench, spare ready"]["marks"][0][0].startswith("ready: 2 ranks")


@pytest.fixture(scope="module")
def pool():
    from bench.training import Pool

    p = Pool()
    pids = p.s.pids()
    yield p
    p.stop()
    assert alive(pids) == []


def test_memory(pool):
    from bench import training

    got = training.memory(pool)
    assert len(got["workbench engine (each rank)"]) == 2
    assert got["bare python + import torch"]["rss_mib"] > 0
    assert got["torchrun worker (rank 0)"]["pss_mib"] > 0 and got["zygote (one per pool)"]["pss_mib"] > 0
    assert got["helper processes per engine"] == 0 and got["pool pss per rank"] > 0


def test_allreduce_sweep(pool):
    from bench import training

    got = training.allreduce(pool, rounds=1)
    assert list(got["sizes"]) == ["1 KiB", "16 KiB", "256 KiB", "4 MiB", "64 MiB"]
    assert all(
        row["workbench"]["median"] > 0 and row["raw gloo"]["median"] > 0 for row in got["sizes"].values()
    )


def test_throughput_against_torchrun(pool):
    from bench import training

    got = training.throughput(pool, rounds=1, steps={"mlp": 2, "gpt": 1}, per_cell_steps=1)
    for model in ("mlp", "gpt"):
        assert _has_summary(got[model]["torchrun"]) and _has_summary(
            got[model]["workbench %%distributed (one cell)"]
        )
        assert got[model]["ratio_to_torchrun"]["torchrun"] == 1.0


def test_dashboard_on_and_off_without_and_with_a_browser(pool, tmp_path):
    from bench import dashboard_overhead
    from bench.table import _dashboard
    from tests.ui.lab import CHROMIUM

    got = dashboard_overhead.run(pool, rounds=1, steps=3)
    for half in ("no browser", "browser"):
        if half == "browser" and not os.path.exists(CHROMIUM):
            assert "skipped" in got[half]
            continue
        assert _has_summary(got[half]["on"]) and _has_summary(got[half]["off"]), got[half]
        assert got[half]["ratio_on_to_off"] > 0
    table = "\n".join(_dashboard({"data": got}))
    assert "on / off" in table and "no browser" in table


def test_recovery_after_kill_9():
    from bench import recovery

    got = recovery.run(reps=1, steps_before=2, every=1)
    assert got["notes"] == []
    assert _has_summary(got["phases"]["total_s"]) and got["resumed_from_step"] >= 2


def test_elastic_kill_9():
    from bench import elastic

    got = elastic.run(reps=1, ranks=2, steps=40)
    assert got["notes"] == [], got["notes"]
    assert _has_summary(got["kill_to_step_s"]) and got["samples_lost"] == got["samples_doubled"] == 0


def test_anchors_side():
    if not _anchors():
        pytest.skip("bench/.venv-anchors is not installed (`make bench` makes it)")
    from bench.common import ANCHORS_PY, BENCH, run_json

    env = {"PATH": f"{ANCHORS_PY.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for what in ("ready-accelerate", "ready-nbdistributed"):
        got = run_json([str(ANCHORS_PY), str(BENCH / "anchors_side.py"), what], timeout=240, env=env)
        assert "error" not in got and got["ready_s"] > 0 and got["leftover"] == 0, got


def test_run_writes_json_and_table(tmp_path):
    from bench import run

    assert run.main(["--quick", "--no-anchors", "--only", "memory", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "memory.json").read_text())
    assert (
        record["machine"]["cores"] and record["load_average"]["start"] and record["versions"]["workbench env"]
    )
    table = (tmp_path / "RESULTS.md").read_text()
    assert "## Memory of one rank" in table and "Quick run" in table


def test_summary_fills_the_performance_table_between_its_markers(tmp_path):
    from bench import summary

    shutil.copy(RESULTS / "memory.json", tmp_path / "memory.json")
    table = summary.render(tmp_path)
    assert "| engine memory | USS" in table and "| `%dist restart` of one rank | not measured" in table
    page = tmp_path / "performance.md"
    page.write_text(f"# x\n{summary.BEGIN}\nold\n{summary.END}\nafter\n")
    assert summary.write_page(table, page)
    assert page.read_text() == f"# x\n{summary.BEGIN}\n{table}{summary.END}\nafter\n"
    assert not summary.write_page(table, tmp_path / "memory.json")


def test_scale_sweep_and_a_kill_at_scale_render_their_tables(tmp_path):
    """The sweep beside a bare ipyparallel cluster, and the kill's timeline, at smoke sizes."""
    from bench import fanout, faults_at_scale, scale
    from bench.table import faults_table, scale_table

    sweep = scale.run((2,), rounds=1, block=2, settle_s=2.0)  # the smoke: not the 30 s of a real sweep
    row = sweep["sizes"]["2"]
    assert "error" not in row and row["leftover"] == 0, row
    assert row["ipp_ready_s"] > 0 and _has_summary(row["ipp_first_cells_ms"])
    assert row["trivial_ours"]["kernel_cpu_ms"] > 0 and row["trivial_ipp"]["kernel_cpu_ms"] > 0
    assert row["ipp_idle_pool_cpu_pct"] > 0  # its controller and engines, heartbeating while idle
    # every rank's main thread is in the idle breakdown by thread name (the pool's processes, not ours)
    assert sum(t["threads"] for t in row["idle_threads"].values()) >= 2 + 2, row["idle_threads"]
    table = "\n".join(scale_table(sweep))
    assert "| 2 | " in table and "x) |" in table, table
    assert "\n- 2 ranks: `" in table, table
    # issue 42's fan-out beside it: hubs off (before) and on (after), alternating, in the same table
    sweep["fanout"] = fanout.run((2,), rounds=1, block=2, settle_s=1.0)
    runs = sweep["fanout"]["runs"]
    assert [(r["n"], r["side"], r["fanout"]) for r in runs] == [(2, "before", "0"), (2, "after", "1")], runs
    assert [r["hubs"] for r in runs] == [0, 1] and all(r["leftover"] == 0 for r in runs), runs
    assert all(r[k]["kernel_cpu_ms"] > 0 for r in runs for k in ("trivial", "print", "pull")), runs
    table = "\n".join(scale_table(sweep))
    assert "hubs off (before) and on (after)" in table and "| 2 | after | 1 |" in table, table
    kills = faults_at_scale.run(n=4, reps=1, elastic_reps=0)
    kill = kills["kill"]["kills"][0]
    assert kills["kill"]["leftover"] == 0 and kill["one_rank_named"], kill
    assert 0 <= kill["named_s"] <= kill["cell_s"] and kill["released_s"]["max"] <= kill["cell_s"]
    assert "| 1 (rank 3) |" in "\n".join(faults_table(kills))


def test_the_kernels_cpu_per_cell_by_thread():
    """Both sides measured per thread of the kernel's process: the cell path is its main thread."""
    from bench import kernel_threads

    got = kernel_threads.run(n=2, rounds=1, block=3, settle_s=0.0)
    for side in ("ours", "px"):
        assert got[side]["threads"].get("MainThread", 0) > 0, got[side]
        assert got[side]["total_ms"] >= got[side]["threads"]["MainThread"] and got[side]["wall_ms"] > 0
    assert got["ratio"] > 0


def test_submesh_split_join_and_side_by_side():
    from bench import submesh
    from bench.table import _submesh

    got = submesh.run(reps=1, steps=3, sleep_s=0.01, elastic_steps=40)
    for key in ("split_2_2_s", "join_s", "reform_s", "split_1_1_1_1_s", "alone_s", "both_s", "ratio",
                "sweep_4_s", "sweep_ratio", "elastic_regroup_s", "elastic_kill_to_step_s"):
        assert _has_summary(got[key]), (key, got[key])
    assert got["elastic_notes"] == [], got["elastic_notes"]
    table = "\n".join(_submesh({"data": got}))
    assert "**both / alone**" in table and "**sweep / alone**" in table and "elastic regroup" in table


def test_goodput_beside_the_fault_free_run_with_one_kill(tmp_path):
    """The goodput section at its quick size (2 ranks, one kill -9), through bench.run and its table."""
    from bench import run

    assert run.main(["--quick", "--no-anchors", "--only", "goodput", "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "goodput.json").read_text())["data"]
    (rnd,) = d["rounds"]
    base, (faulted,) = rnd["fault-free"], rnd["runs"].values()
    assert base["faults_injected"] == 0 and base["steps_done"] == d["steps"], base
    assert faulted["faults_injected"] == 1 and faulted["fault_records"] >= 1, faulted
    assert faulted["kill_to_step_s"]["n"] == 1 and faulted["goodput"] > 0, faulted
    for row in (base, faulted):
        assert "error" not in row and row["each_sample_once"] and row["leftover_processes"] == 0, row
        assert row["largest_size"] == d["ranks"], row
    table = (tmp_path / "RESULTS.md").read_text()
    assert d["summary"]["every 2 s"]["faults_injected"] == 1 and d["summary"]["every 2 s"]["each_sample_once"]
    assert "## Goodput" in table and "| a kill every 2 s |" in table and "Monarch" in table, table
