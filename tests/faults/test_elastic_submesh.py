"""An elastic Trainer on a sub-mesh regroups within it (issue 43, docs/submeshes.md): a real 4-rank pool
split 2 + 2, the elastic run of ``tests/faults/test_elastic.py`` on sub-mesh a, a cell of collectives on b.
A rank of a killed with SIGKILL mid-run: a's run goes on on the survivor (world size 1 inside a), b's cell
runs on untouched (its group and generation unchanged, each of its steps summing 2 ranks), every sample of
each epoch taken exactly once, the reference's parameters; the pool's rank numbers are kept (the lost rank
keeps its number, dead, out of every sub-mesh), and ``%dist restart`` brings a back to 2 ranks, the new
engine set up so that the next ``trainer.run()`` goes on on both from the survivor's state. A rank of a that
hangs is killed and routed around in the same way.

No timed asserts: every wait is for a condition (a beacon, a handle, a file), bounded by the test's
timeout."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import PidsLimit, running_pool, until
from tests.faults.test_elastic import check_every_sample_once, reference, setup_code
from tests.pool.test_submesh_concurrency_pool import HOLD
from workbench.errors import RankDiedError
from workbench.pool.watch.beacons import BeaconReceiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def pool():
    with PidsLimit(700), running_pool(n=4, timeout=60, backend="gloo") as s:
        s.split([2, 2], names=["a", "b"])
        yield s


# a second notebook attached to the pool after a's run lost a rank (argv: pool, survivor, victim)
ATTACHED = """\
import sys
from workbench import Session
s = Session.attach(sys.argv[1])
survivor, victim = int(sys.argv[2]), int(sys.argv[3])
try:
    assert s.meshes == {"a": [survivor], "b": [2, 3]}, s.meshes
    assert s.rooms.group.left_out == {victim: "a"}, s.rooms.group.left_out
    s.run("seen = (rank, world_size)", on="a")
    assert s.pull("seen", on="a") == [(0, 1)]
    assert not [f for f in s.faults if "while idle" in f.first_failure], s.faults
finally:
    s.detach()
"""


def steps_reached(s, ranks: list[int], step: int, timeout: float = 60) -> bool:
    """Every rank of ``ranks`` (pool ranks) has a Trainer running past ``step``, as their beacons say."""
    beacons = BeaconReceiver(s.pool.channel)

    def there(rank: int) -> bool:
        trainer = (beacons.latest.get(rank) or {}).get("trainer") or {}
        return trainer.get("running", False) and trainer.get("step", 0) >= step

    try:
        return until(lambda: all(there(r) for r in ranks), timeout, every=0.01)
    finally:
        beacons.close()


def test_a_rank_killed_in_a_sub_mesh_s_elastic_run_is_routed_around_within_it(pool, tmp_path):
    s, group = pool, pool.rooms.group
    rng = random.Random()
    victim, at_step, steps, more = rng.randrange(2), rng.randrange(2, 14), 40, 20
    survivor = 1 - victim
    print(f"victim rank {victim} of sub-mesh a, killed after step {at_step}")
    s.run(setup_code(), on="a")
    pids = [r.pid for r in s.ranks]
    b_generation = group.mesh_generation["b"]
    release = tmp_path / "release"
    hold = HOLD.replace("range(6000)", "range(24000)")  # at most 240 s: a's whole run, the loss included
    assert hold != HOLD
    b = s.submit(hold.format(release=str(release)), on="b")  # collectives on b all through a's run
    try:
        assert until(lambda: any(t.keys == {"b"} for t in s.rooms.busy.now()), timeout=30)
        handle = s.submit(f"result = trainer.run(steps={steps})", on="a")
        assert steps_reached(s, [0, 1], at_step), "the run on a did not get going"
        os.kill(pids[victim], signal.SIGKILL)
        result = handle.wait(120)  # no RankError: the run went on within a
        outcomes = sorted(r.outcome for r in result.ranks)
        assert outcomes == ["lost", "ok"], [(r.rank.rank, r.outcome, r.stderr[-500:]) for r in result.ranks]
        assert not b.done()  # b's cell ran on through the loss and the regroup
        assert group.mesh_generation["b"] == b_generation  # b's group untouched
    finally:
        release.touch()
    b.wait(60)  # ended well: each step's all_reduce summed b's 2 ranks (HOLD asserts it)
    fault = s.faults[-1]
    assert fault.kind == "died", fault
    assert f"rank {victim} died after step" in fault.first_failure, fault.first_failure
    assert fault.first_failure.endswith("continuing on 1 rank"), fault.first_failure
    assert fault.recover_s is not None, "the kernel never saw a step completed after the regroup"
    # the pool's numbers kept: the survivor and b's ranks keep theirs, the lost rank is in no sub-mesh
    assert [r.pid for r in s.ranks] == pids
    assert s.meshes == {"a": [survivor], "b": [2, 3]}
    s.run("inside = (rank, world_size, dist.get_world_size(), trainer.step)", on="a")
    assert s.pull("inside", on="a") == [(0, 1, 1, steps)]  # the survivor is rank 0 of 1 inside a
    events = s.pull("trainer.elastic.events", on="a")[0]
    assert events[-1]["lost"] == [victim] and events[-1]["world_size"] == 1, events
    check_every_sample_once(s.pull("log.steps", on="a"), steps)
    s.run("from workbench.train import full_state_dict\nfull = full_state_dict(trainer.model)", on="a")
    torch.testing.assert_close(s.pull("full", on="a")[0], reference(steps))
    s.run("t = torch.ones(1)\ndist.all_reduce(t)\nsummed = t.item()", on="a")  # a plain cell, a's group of 1
    s.run("import torch\nt = torch.ones(1)\ndist.all_reduce(t)\nsummed = t.item()", on="b")
    assert s.pull("summed", on="a") == [1.0] and s.pull("summed", on="b") == [2.0, 2.0]
    with pytest.raises(RankDiedError, match=f"rank {victim} "):  # a cell on the whole pool: the rank is dead
        s.run("x = 1")
    # a notebook attached now learns it from the state file: a's survivor, the lost rank out of a (said once)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    other = subprocess.run([sys.executable, "-c", ATTACHED, s.pool_id, str(survivor), str(victim)], env=env,
                           capture_output=True, text=True, timeout=180)
    assert other.returncode == 0, other.stderr
    assert "died while the pool was idle" not in other.stdout, other.stdout  # its loss was said, once
    # `%dist restart`: a new engine at the lost rank's number, in sub-mesh a again, set up by replaying the
    # cells that ran on every rank and on a (not b's); a's group of 2 formed anew, b's too (a restart re-forms
    # every group, in the whole pool's turn)
    assert s.restart() == [victim]
    assert s.meshes == {"a": [0, 1], "b": [2, 3]} and s.world_size == 4
    assert [r.pid for r in s.ranks if r.rank != victim] == [p for i, p in enumerate(pids) if i != victim]
    assert s.view([victim]).pull("'held' in globals()") == [False]  # b's cell never ran there
    s.run(f"result = trainer.run(steps={more})", on="a")  # at the run boundary: state from the survivor
    assert s.pull("(rank, world_size, trainer.step)", on="a") == [(0, 2, steps + more), (1, 2, steps + more)]
    assert s.pull("len(log.steps)", rank=victim, on="a") == more  # the new rank trained the last steps
    check_every_sample_once(s.pull("log.steps", on="a"), steps + more)
    s.run("from workbench.train import full_state_dict\nfull = full_state_dict(trainer.model)", on="a")
    for got in s.pull("full", on="a"):
        torch.testing.assert_close(got, reference(steps + more))


def test_a_rank_that_hangs_in_a_sub_mesh_s_elastic_run_is_killed_and_routed_around_within_it(pool):
    s, group = pool, pool.rooms.group
    if s.dead_ranks():  # a test before failed half-way: the pool back at 2 + 2
        s.restart()
    assert s.meshes == {"a": [0, 1], "b": [2, 3]}
    victim, at_step, steps = random.Random().randrange(2), random.Random().randrange(2, 14), 30
    print(f"rank {victim} of sub-mesh a hangs at step {at_step}")
    s.run(setup_code(), on="a")
    s.run(f"trainer.callbacks[1] = HangAt({at_step}, {s.ranks[victim].pid})", on="a")
    b_generation = group.mesh_generation["b"]
    result = s.run(f"result = trainer.run(steps={steps})", on="a")
    assert sorted(r.outcome for r in result.ranks) == ["lost", "ok"]
    fault = s.faults[-1]
    assert fault.kind == "hang"
    said = f"rank {victim} hung for 3 s (killed) after step {at_step}"
    assert said in fault.first_failure, fault.first_failure
    assert s.meshes == {"a": [1 - victim], "b": [2, 3]} and group.mesh_generation["b"] == b_generation
    assert s.pull("(world_size, trainer.step)", on="a") == [(1, steps)]
    check_every_sample_once(s.pull("log.steps", on="a"), steps)
    s.run("from workbench.train import full_state_dict\nfull = full_state_dict(trainer.model)", on="a")
    torch.testing.assert_close(s.pull("full", on="a")[0], reference(steps))
