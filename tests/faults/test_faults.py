"""Faults injected for real on a 2-engine gloo pool: each is named, stopped and recovered from."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from tests.conftest import alive, ctrl_c_after, until
from workbench import CellTimeout, RankError
from workbench.errors import RankDiedError

pytestmark = pytest.mark.timeout(120)


def engine_pids(s):
    return [r.pid for r in s.ranks]


def test_exception_on_rank_1_during_all_reduce(pool):
    pool.run("kept = rank * 7")
    before = engine_pids(pool)
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        pool.run("import torch\nif rank == 1:\n    raise ValueError('bad batch on rank 1')\n"
                 "dist.all_reduce(torch.ones(2))")
    elapsed = time.monotonic() - t0
    err = info.value
    assert err.rank == 1 and "ValueError: bad batch on rank 1" in str(err)  # the raiser, not the waiter
    # a hang guard, not a figure
    assert elapsed < 10, f"took {elapsed:.1f} s: the waiting rank was not released"
    assert engine_pids(pool) == before and alive(before) == before
    assert pool.pull("kept") == [0, 7]  # Python state survived
    pool.run("t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)")  # re-formed on its own
    assert [t.tolist() for t in pool.pull("t")] == [[3.0, 3.0], [3.0, 3.0]]
    assert err.result.fault is not None and err.result.fault.kind == "exception"


def test_sleeping_rank_is_named_at_the_timeout(pool):
    pool.run("import torch, time\ndist.all_reduce(torch.ones(1))")  # a collective every rank completed
    with pytest.raises(CellTimeout) as info:
        pool.run("if rank == 1:\n    time.sleep(60)\ndist.all_reduce(torch.ones(1))", timeout=2)
    text = str(info.value)
    assert "Stalled: rank 1" in text and "at cell line 2" in text
    assert "rank 0 (" not in text.split("Stalled:")[1]
    assert "Last collective every rank completed: #" in text and "(all_reduce)" in text
    pool.run("t = torch.ones(1)\ndist.all_reduce(t)")
    assert [t.item() for t in pool.pull("t")] == [2.0, 2.0]


def test_ctrl_c_stops_every_rank_and_the_pool_stays_usable(pool):
    t0 = time.monotonic()
    with ctrl_c_after(1.0), pytest.raises(KeyboardInterrupt):
        pool.run("import time\nfor i in range(600):\n    time.sleep(0.05)")
    stopped = time.monotonic() - t0 - 1.0
    print(f"\nCtrl-C: every rank stopped {stopped:.2f} s after the interrupt")
    assert stopped < 5
    assert {r["state"] for r in pool.status()} == {"idle"}
    assert pool.run("x = 1").ranks[0].error is None


def test_rank_killed_mid_cell_is_named_then_restarted_on_same_host_and_device(pool):
    before = list(pool.ranks)
    pool.run("import torch, time")
    killer = threading.Timer(1.0, lambda: os.kill(pool.ranks[1].pid, signal.SIGKILL))
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        pool.run("for i in range(200):\n    dist.all_reduce(torch.ones(1))\n    time.sleep(0.05)")
    assert time.monotonic() - t0 < 10
    err = info.value
    assert err.rank == 1 and err.failures[0][1].ename == "RankDied" and "died: its engine process" in str(err)
    fault = err.result.fault
    assert fault.kind == "died" and fault.rank == 1 and fault.abort_s is not None
    with pytest.raises(RankDiedError, match="rank 1 .* is dead"):
        pool.run("x = 1")
    assert [r["state"] for r in pool.status()] == ["idle", "failed"]  # the panel's word too
    assert pool.restart() == [1]
    after = pool.ranks
    assert [(r.rank, r.host, r.device) for r in after] == [(r.rank, r.host, r.device) for r in before]
    assert after[1].pid != before[1].pid and after[0].pid == before[0].pid
    assert psutil.Process(after[1].pid).ppid() == pool.pool.zygote.pid  # forked: nothing to import again
    pool.run("import torch\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)")
    assert [t.item() for t in pool.pull("t")] == [3.0, 3.0]
    assert fault.recover_s is not None


def test_rank_dying_while_idle_is_reported_without_a_cell(pool, capsys):
    victim = pool.ranks[0]
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not any(f.kind == "died" and f.rank == 0 and "idle" in f.first_failure for f in pool.faults):
        assert time.monotonic() < deadline, "the idle watcher did not report the dead rank"
        time.sleep(0.05)
    assert "rank 0" in capsys.readouterr().out
    assert pool.restart() == [0]
    pool.run("import torch\nt = torch.ones(1)\ndist.all_reduce(t)")
    assert [t.item() for t in pool.pull("t")] == [2.0, 2.0]


def test_scale_after_a_restart_keeps_every_rank_on_its_engine(pool):
    # the test above restarted rank 0: its new engine's id is now above rank 1's
    assert pool.ranks[0].engine_id > pool.ranks[1].engine_id
    pool.run("mine = rank")
    before = [(r.rank, r.pid, r.device) for r in pool.ranks]
    pool.scale(3)
    assert [(r.rank, r.pid, r.device) for r in pool.ranks[:2]] == before
    assert [pool.pull("mine", rank=r) for r in (0, 1)] == [0, 1]  # Python state stayed with its rank
    pool.run("import torch\nt = torch.ones(1)\ndist.all_reduce(t)")
    assert [t.item() for t in pool.pull("t")] == [3.0, 3.0, 3.0]
    pool.scale(2)
    assert [(r.rank, r.pid, r.device) for r in pool.ranks] == before


def test_scale_to_the_survivors_goes_on_without_a_dead_rank(pool):
    """`%dist scale N` up to the ranks left drops the dead ones (as Slurm's "allocation lost the node"
    offers): the survivors are numbered again in order and keep engine, device and Python state."""
    pool.scale(3)
    pool.run("import os\nmine = [rank, os.getpid()]")
    survivors = [(r.pid, r.device) for r in pool.ranks[1:]]
    os.kill(pool.ranks[0].pid, signal.SIGKILL)
    assert until(lambda: 0 in pool.dead_ranks(), timeout=10), "the dead rank was not seen"
    with pytest.raises(RankDiedError, match=r"rank 0 is dead: `%dist restart` brings it back, or "
                                            r"`%dist scale 2` goes on with the 2 ranks left"):
        pool.scale(3)
    ranks = pool.scale(2)
    assert [(r.rank, r.pid, r.device) for r in ranks] == [(i, pid, d) for i, (pid, d) in enumerate(survivors)]
    assert pool.pull("mine") == [[1, survivors[0][0]], [2, survivors[1][0]]]  # state kept, old numbers
    pool.run("import torch\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)")
    assert [t.item() for t in pool.pull("t")] == [3.0, 3.0]
    assert pool.dead_ranks() == {}


def test_a_killed_controller_ends_the_pool_in_one_sentence_instead_of_a_command_waiting_for_ever():
    """Every request to the ranks passes through the controller: with it gone, ``%dist status`` or
    ``%dist restart`` waited for ever on ipyparallel's reply (found killing the wrong pid of
    ``Session.pids()``). Now the next command says what happened and nothing of the pool is left."""
    from workbench import Session
    from workbench.errors import PoolGone

    s = Session(n=2, timeout=30).start()
    try:
        started = s.pids()
        controller = s._pool.cluster.controller.pid
        assert controller in started
        os.kill(controller, signal.SIGKILL)
        assert until(lambda: controller not in alive([controller]), timeout=10)
        with pytest.raises(PoolGone, match=r"controller \(pid \d+\) exited, so no rank can be reached: the "
                                           r"pool was stopped"):
            s.status()
        assert not s.running
        assert until(lambda: alive(started) == [], timeout=15), alive(started)  # nothing left
        with pytest.raises(Exception, match="needs a running pool"):
            s.restart()
    finally:
        if s.running:
            s.stop()
