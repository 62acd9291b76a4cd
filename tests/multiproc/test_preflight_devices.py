"""Preflight with one rank's device broken: every rank falls back together, nobody hangs (issue 15)."""

from __future__ import annotations

import pytest
from world_harness import run_world

from workbench.engine.probe import probe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def _probe(rank, world, devices):
    return probe(devices[rank], size_mb=0.01, iters=2)


def test_a_broken_device_moves_every_rank_to_the_cpu_not_only_itself():
    # rank 1's "GPU" does not work here (no CUDA): were the others on NCCL, only matching devices meet
    first, second = run_world(_probe, 2, ["cpu", "cuda:3"])
    assert (first["device_ok"], second["device_ok"]) == (True, False)
    assert first["collective_device"] == second["collective_device"] == "cpu"
    assert first["all_reduce_ok"] and second["all_reduce_ok"]
