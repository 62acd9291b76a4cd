"""Faults that keep coming (issue 38): an elastic run with ``replace=True`` survives any sequence of losses.

Reproducers of the findings first (each failed on the code before its fix), then seeded random schedules
of combined faults over one run (:mod:`tests.faults.chaos`): every step done, every sample taken once, the
fault-free run's parameters, the asked size restored and never exceeded, one fault record per lost engine.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.conftest import PidsLimit, alive, until
from tests.faults import chaos
from tests.faults.test_elastic import final_params, permutation, reference, step_reached
from workbench import Session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def pool(request):
    n = getattr(request, "param", 4)
    with PidsLimit(900):
        s = Session(n=n, timeout=60).start()
        started = set(s.pids())
        try:
            yield s
        finally:
            started |= set(s.pids())
            s.stop()
        assert until(lambda: alive(sorted(started)) == [], 10), "processes of the pool survived its stop"


def check_once(records: list[list], steps: int) -> None:
    """Every committed step's slice of its epoch taken once; the steps of an epoch tile it."""
    by_step = chaos.committed(records)
    assert sorted(by_step) == list(range(1, steps + 1)), \
        f"steps missing: {sorted(set(range(1, steps + 1)) - set(by_step))[:20]}"
    covered: dict[int, list[int]] = {}
    for step, recs in sorted(by_step.items()):
        (epoch, offset), size, world = recs[0][0], recs[0][1], recs[0][2]
        covered.setdefault(epoch, []).append(offset)
        window = permutation(epoch)[offset:offset + size]
        mine = [i for r in recs for i in r[3]]
        assert len(mine) == len(set(mine)) and set(mine) <= set(window), f"step {step}: foreign samples"
        if len(recs) == world:
            assert sorted(mine) == sorted(window), f"step {step} skipped samples"
    for epoch, offsets in covered.items():
        assert sorted(offsets) == list(range(0, chaos.G * len(offsets), chaos.G)), f"epoch {epoch}: {offsets}"


def finished_as_asked(s: Session, run: chaos.Chaos, steps: int, size: int) -> None:
    said = "\n".join(f"  {t:7.2f} s {kind:12s} {did}" for t, kind, did in run.schedule)
    assert run.error is None, f"seed {run.seed}: the run failed: {run.error!r}\n{said}"
    assert run.largest <= size, \
        f"seed {run.seed}: the pool grew to {run.largest} ranks (asked {size})\n{said}"
    finished = [r.rank.rank for r in run.result.ranks if r.outcome == "ok"]
    assert len(finished) == size, f"seed {run.seed}: the run ended on ranks {finished}, not {size}\n{said}"
    assert s.world_size == size, f"seed {run.seed}: the pool is at {s.world_size} ranks, not {size}\n{said}"
    assert s.pull("trainer.step") == [steps] * size, said
    check_once(run.records, steps)
    for got in final_params(s):
        torch.testing.assert_close(got, reference(steps))


@pytest.mark.parametrize("pool", [2], indirect=True)
def test_a_rank_that_joined_mid_run_is_a_member_like_any_other(pool, tmp_path):
    """F1: kill rank 0, its replacement joins, then kill the last rank the run started with: the run
    failed with a bare ``KeyError: <engine id>`` (a joined rank's standby store was never recorded)."""
    steps = 600
    pool.run(chaos.setup_code(str(tmp_path)))
    first = [r.pid for r in pool.ranks]
    handle = pool.submit(f"result = trainer.run(steps={steps})")
    assert step_reached(pool, 3)
    os.kill(first[0], signal.SIGKILL)
    assert until(lambda: pool.world_size == 2 and first[0] not in [r.pid for r in pool.ranks], 120), \
        "the replacement of rank 0 never joined"
    os.kill(first[1], signal.SIGKILL)
    run = chaos.Chaos(seed=-1, largest=2)
    try:
        run.result = handle.wait(300)
    except BaseException as exc:  # noqa: BLE001 (finished_as_asked says it)
        run.error = exc
    run.records = chaos.read_records(str(tmp_path))
    assert not set(first) & {r.pid for r in pool.ranks}
    finished_as_asked(pool, run, steps, 2)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_combined_random_faults_every_step_every_sample_once(pool, tmp_path, seed):
    steps = 1500
    pool.run(chaos.setup_code(str(tmp_path)))
    run = chaos.run_chaos(pool, str(tmp_path), seed, faults=20, steps=steps, gap=(0.5, 2.5))
    print(f"seed {seed}: {run.seconds:.1f} s, largest {run.largest}")
    for t, kind, did in run.schedule:
        print(f"  {t:7.2f} s {kind:12s} {did}")
    finished_as_asked(pool, run, steps, 4)
