"""Sub-meshes on a real 4-rank pool (gloo, CPU; issue 43 part 1, docs/submeshes.md): a split re-forms the
pool as disjoint sub-meshes, each its own default process group (``rank``, ``world_size``, ``dist``'s default
group and torchrun's environment are the sub-mesh's), the kernel keeps naming ranks by their place in the
pool, Python state is kept, and a join makes one group of all again."""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap

import pytest

from tests.conftest import running_pool, until
from workbench.errors import RankError

pytestmark = pytest.mark.timeout(300)

# rank 1 raises; rank 0, in its all_reduce with it, is cut out by the abort: the sub-mesh's group is broken
RAISES = "import torch\nt = torch.ones(1)\nif rank == 1: raise ValueError('boom')\ndist.all_reduce(t)"

# on every rank: its place in its group and what a collective over the default group sums
PROBE = textwrap.dedent("""
    import os, torch
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    seen = (rank, world_size, dist.get_rank(), dist.get_world_size(), int(t.item()),
            os.environ["RANK"], os.environ["WORLD_SIZE"])
""")


@contextlib.contextmanager
def split(s, sizes, names=None):
    """The pool split for the block, joined again after it (whatever the block raised)."""
    s.split(sizes, names=names)
    try:
        yield
    finally:
        s.join()


@pytest.fixture(scope="module")
def pool():
    with running_pool(n=4, timeout=60, backend="gloo") as s:
        yield s


def test_a_split_gives_each_sub_mesh_its_own_default_group_and_keeps_state(pool):
    s = pool
    s.run("import os; kept = os.getpid()")
    before = s.pull("kept")
    assert s.split([2, 2], names=["a", "b"]) == {"a": [0, 1], "b": [2, 3]}
    try:
        assert s.meshes == {"a": [0, 1], "b": [2, 3]}
        s.run(PROBE)  # on all four ranks at once: each sub-mesh's collective is its own
        # (rank, world_size, dist rank, dist world size, the all_reduce of rank+1, RANK, WORLD_SIZE)
        assert s.pull("seen") == [(0, 2, 0, 2, 3, "0", "2"), (1, 2, 1, 2, 3, "1", "2"),
                                  (0, 2, 0, 2, 3, "0", "2"), (1, 2, 1, 2, 3, "1", "2")]
        assert s.pull("kept") == before  # the same engines, their Python state kept
        # a cell on one sub-mesh: its ranks only, named by the pool
        result = s.run("print(rank, world_size)", on="b")
        assert [r.rank.rank for r in result.ranks] == [2, 3]
        assert [r.stdout for r in result.ranks] == ["0 2\n", "1 2\n"]
        # the kernel names ranks by the pool: the status, and the agents' beacons (they speak for pool ranks)
        assert [(row["rank"], row["mesh"]) for row in s.status()] == [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
        rooms = s.rooms
        assert until(lambda: {rank: beat.get("pid") for rank, beat in rooms.beacons.latest.items()}
                     == {r.rank: r.pid for r in s.ranks}, timeout=30)
        assert "sub-mesh a (ranks 0-1): formed" in s.group_state()
        with pytest.raises(ValueError, match="not in sub-mesh a"):
            s.run("pass", ranks=[2], on="a")
    finally:
        s.join()
    assert s.meshes == {}
    s.run(PROBE)
    assert [seen[:5] for seen in s.pull("seen")] == [(r, 4, r, 4, 10) for r in range(4)]
    assert s.pull("kept") == before


def test_three_sub_meshes_of_uneven_sizes(pool):
    s = pool
    with split(s, [1, 2, 1]):
        assert s.meshes == {"m0": [0], "m1": [1, 2], "m2": [3]}
        s.run(PROBE)
        assert [seen[:5] for seen in s.pull("seen")] == [(0, 1, 0, 1, 1), (0, 2, 0, 2, 3), (1, 2, 1, 2, 3),
                                                         (0, 1, 0, 1, 1)]


def test_a_fault_in_one_sub_mesh_reforms_only_its_group(pool):
    s = pool
    with split(s, [2, 2], names=["a", "b"]):
        group = s.rooms.group
        b_generation = group.mesh_generation["b"]
        with pytest.raises(RankError, match="boom"):  # rank 1 raises; rank 0 is cut out of its collective
            s.run(RAISES, on="a")
        assert group.broken_in({"a"}) == {"a"} and not group.broken_in({"b"})
        s.run(PROBE, on="a")  # re-forms a's group only
        assert group.mesh_generation["b"] == b_generation and group.ok
        assert [seen[:5] for seen in s.view([0, 1]).pull("seen")] == [(0, 2, 0, 2, 3), (1, 2, 1, 2, 3)]
        s.run(PROBE, on="b")  # b's group was never touched
        assert [seen[:5] for seen in s.view([2, 3]).pull("seen")] == [(0, 2, 0, 2, 3), (1, 2, 1, 2, 3)]


def test_a_dead_rank_of_a_sub_mesh_is_restarted_into_it(pool):
    s = pool
    with split(s, [2, 2], names=["a", "b"]):
        os.kill(s.ranks[3].pid, signal.SIGKILL)
        assert until(lambda: 3 in s.dead_ranks(), timeout=30)
        said: list[str] = []
        s.notify = said.append
        s.run("import torch; t = torch.ones(1); dist.all_reduce(t); alone = t.item()", on="a")  # a goes on
        assert s.view([0, 1]).pull("alone") == [2.0, 2.0]
        assert not [text for text in said if "is dead" in text], said  # b's dead rank is no matter of a's
        assert s.restart() == [3]
        assert s.meshes == {"a": [0, 1], "b": [2, 3]}  # the split is kept
        s.run(PROBE)
        assert [seen[:5] for seen in s.pull("seen")] == [(0, 2, 0, 2, 3), (1, 2, 1, 2, 3)] * 2


def test_a_torchrun_script_on_a_sub_mesh_sees_its_world(pool, tmp_path):
    script = tmp_path / "world.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        print(os.environ["RANK"], os.environ["WORLD_SIZE"], dist.get_world_size(), int(t.item()))
        dist.destroy_process_group()
    """))
    s = pool
    with split(s, [3, 1], names=["big", "small"]):
        result = s.run_script(str(script), on="big")
        assert [r.rank.rank for r in result.ranks] == [0, 1, 2]
        assert [printed(r) for r in result.ranks] == ["0 3 3 3", "1 3 3 3", "2 3 3 3"]
        result = s.run_script(str(script), on="small")
        assert [printed(r) for r in result.ranks] == ["0 1 1 1"]


def printed(result) -> str:
    """The script's own line on a rank (not the pool's notes, which say ``workbench: ...``)."""
    [line] = [ln for ln in result.stdout.splitlines() if not ln.startswith("workbench:")]
    return line


def test_split_mistakes_change_nothing(pool):
    s = pool
    with pytest.raises(ValueError, match="do not add up"):
        s.split([2, 1])
    with pytest.raises(ValueError, match="no sub-mesh|not split"):
        s.run("pass", on="a")
    with pytest.raises(ValueError, match="twice"):
        s.split([2, 2], names=["a", "a"])
    assert s.meshes == {} and s.rooms.group.ok
