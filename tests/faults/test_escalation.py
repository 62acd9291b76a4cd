"""Stopping the other ranks: the gentlest step that works, reports that are true (issue 18 items 3-5).

A rank that only waits on a stalled peer is released by aborting its collective and keeps its
Python state; only a rank that ignores every gentler step is killed, and the message says which.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from tests.conftest import alive, ctrl_c_after, until
from workbench import CellTimeout, RankError
from workbench.errors import CellInterrupted, RankDiedError

pytestmark = pytest.mark.timeout(120)


def test_ranks_deadlocked_in_recv_are_released_by_ctrl_c_and_keep_their_state(pool):
    pool.run("import torch\nkept = rank + 40")
    pids = [r.pid for r in pool.ranks]
    t0 = time.monotonic()
    with ctrl_c_after(1.0), pytest.raises(CellInterrupted) as info:
        pool.run("t = torch.zeros(1)\ndist.recv(t, src=1 - rank)")  # both wait: a deadlock
    returned = time.monotonic() - t0 - 1.0
    text = str(info.value)
    assert returned < 10, f"{returned:.1f} s: the abort did not release the ranks"  # a hang guard only
    assert "rank 0 stopped at cell line 2" in text and "rank 1 stopped at cell line 2" in text
    assert "killed" not in text and "keeps its Python state" in text
    assert alive(pids) == pids and pool.pull("kept") == [40, 41]  # nobody was killed
    pool.run("t = torch.ones(1)\ndist.all_reduce(t)")
    assert [t.item() for t in pool.pull("t")] == [2.0, 2.0]


def test_a_rank_ignoring_sigint_is_killed_and_the_waiting_rank_survives_and_says_so(pool):
    pool.run("import torch\nkept = rank + 50")
    waiting = pool.ranks[0].pid
    with pytest.raises(CellTimeout) as info:
        pool.run("import signal, time\n"
                 "if rank == 1:\n"
                 "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                 "    while True:\n"
                 "        pass\n"
                 "dist.all_reduce(torch.ones(1))", timeout=2)
    text = str(info.value)
    assert "Stalled: rank 1" in text
    assert "rank 1 ignored the interrupt and the abort and was killed" in text
    assert "rank 0 stopped at cell line 6" in text and "`%dist restart` brings rank 1 back" in text
    assert "the next cell re-forms the process group" not in text  # it would not: rank 1 is gone
    assert alive([waiting]) == [waiting]
    assert pool.pull("kept", rank=0) == 50  # the rank that only waited kept its state
    with pytest.raises(RankDiedError, match="rank 1"):
        pool.run("x = 1")
    assert pool.restart() == [1]
    pool.run("import torch\nt = torch.ones(1)\ndist.all_reduce(t)")  # rank 1 is a new engine
    assert [t.item() for t in pool.pull("t")] == [2.0, 2.0]


@pytest.mark.parametrize("attempt", range(5))
def test_a_rank_that_died_just_before_the_cell_is_named_not_the_survivor(pool, attempt):
    pool.run("import torch\ndist.all_reduce(torch.ones(1))")  # (restarted ranks import it again)
    os.kill(pool.ranks[1].pid, signal.SIGKILL)
    with pytest.raises((RankDiedError, RankError)) as info:
        pool.run("dist.all_reduce(torch.ones(1))")
    err = info.value
    assert str(err).startswith("rank 1 ("), str(err)
    if isinstance(err, RankError):
        assert err.rank == 1 and err.result.ranks[0].outcome == "stopped"
    assert pool.restart() == [1]


def test_a_rank_cut_short_by_the_escalation_is_stopped_never_without_error(pool):
    pool.run("import torch, time")
    with pytest.raises(RankError) as info:
        # rank 0 loops in Python (no collective to abort): only the SIGINT step stops it, 0.8 s after
        # rank 1's error is seen (a restarted engine's first traceback can take seconds on a busy machine)
        pool.run("if rank == 1:\n    raise ValueError('bad batch on rank 1')\n"
                 "for i in range(1500):\n    time.sleep(0.01)")
    err = info.value
    assert [r.outcome for r in err.result.ranks] == ["stopped", "error"]
    shown = "\n".join(err._render_traceback_())
    assert "2 ranks · 1 error (rank 1: ValueError: bad batch on rank 1) · 1 stopped" in shown
    assert "without error" not in shown and "(also failed" not in str(err)


def test_a_hard_interrupt_mid_backward_leaves_a_trainer_that_runs_on(pool):
    """SIGINT straight to the ranks (no step boundary): the DDP wrapper is rebuilt, never an assert."""
    pool.run(TRAINER)
    handle = pool.submit("trainer.run(steps=100_000)")
    beacons = pool.rooms.beacons  # the run is going (the engines are busy: their beacons say where they are)
    assert until(lambda: all(((beacons.latest.get(r.rank) or {}).get("trainer") or {}).get("step", 0) > 3
                             for r in pool.ranks), 60), "the run did not get going"
    stopped = handle.stop(hard=True)  # as a second Ctrl-C: SIGINT to every rank, wherever it is
    assert stopped is not None
    print("after the stop:", [(r.outcome, r.stderr[-300:]) for r in stopped.ranks], handle.cell.signalled)
    pool.run("r = trainer.run(steps=5)\nsteps = len(r.history)")
    assert pool.pull("steps") == [5, 5]
    assert pool.pull("trainer.step", rank=0) == pool.pull("trainer.step", rank=1)



def test_ranks_a_hard_stop_left_at_different_points_of_a_step_train_on_together(pool):
    """A hard stop can cut one rank after it took its next batch and another before: the next run must
    not start with a collective that only some ranks make (gloo ends the engine on a mismatch)."""
    pool.run(TRAINER + "trainer.run(steps=2)")
    # the state such a stop leaves, made on purpose: both cut mid-step, only rank 1 without a next batch
    pool.run("trainer._cut_mid_step = True\nif rank == 1:\n    trainer._pending = None")
    pool.run("r = trainer.run(steps=3)\nsteps = len(r.history)", timeout=60)
    assert pool.pull("steps") == [3, 3]
    assert pool.pull("trainer.step", rank=0) == pool.pull("trainer.step", rank=1) == 5



def test_ranks_asked_for_different_step_counts_take_the_fewest_together(pool):
    """``trainer.run(steps=TOTAL - trainer.step)`` right after a hard stop: the count was computed before
    the run evened the ranks' step counters, so it may differ by one. A rank that asked for fewer steps
    finished while the other waited in its last step's collective (seen in CI: "rank 0 had finished",
    then a timeout); every rank now takes the fewest."""
    pool.run(TRAINER + "trainer.run(steps=2)")
    pool.run("r = trainer.run(steps=3 + rank)\nsteps = len(r.history)", timeout=60)
    assert pool.pull("steps") == [3, 3]
    assert pool.pull("trainer.step") == [5, 5]


TRAINER = """
import torch
from torch.utils.data import TensorDataset
import workbench as wb
torch.manual_seed(0)
model = wb.shard(wb.MLP(wb.MLPConfig(d_in=8, d_hidden=64, d_out=2, n_layers=2)), "ddp")
data = wb.make_loader(TensorDataset(*wb.regression_data(512, d_in=8, d_out=2)), batch_size=16)
trainer = wb.Trainer(model, data, lr=1e-2, optim="sgd")
"""


def test_ctrl_c_while_a_trainer_runs_stops_every_rank_at_the_same_step(pool):
    pool.run(TRAINER)
    with ctrl_c_after(1.5), pytest.raises(CellInterrupted) as info:
        pool.run("trainer.run(steps=100_000)")
    steps = pool.pull("trainer.step")
    assert steps[0] == steps[1] > 0
    said = f"interrupted at step {steps[0]} on all ranks; `trainer.run()` continues from here."
    assert str(info.value) == said
    shown = info.value._render_traceback_()  # what the notebook shows: the word once
    assert shown == [f"\x1b[1;33mInterrupted\x1b[0m at step {steps[0]} on all ranks; `trainer.run()` "
                     "continues from here."], shown
    assert [r.outcome for r in info.value.result.ranks] == ["interrupted", "interrupted"]
    pool.run("r = trainer.run(steps=3)")
    assert pool.pull("trainer.step") == [steps[0] + 3] * 2


def test_push_and_pull_on_a_dead_rank_name_it_in_one_line(pool):
    pool.run("import torch")
    os.kill(pool.ranks[1].pid, signal.SIGKILL)
    assert until(lambda: 1 in pool.dead_ranks(), 10)
    says = r"^rank 1 \(.*\) is dead \(exited\): `%dist restart` brings it back"
    with pytest.raises(RankDiedError, match=says) as info:
        pool.push({"x": 1})
    assert "\n" not in str(info.value)
    with pytest.raises(RankDiedError, match="rank 1"):
        pool.pull("x", rank=1)
    assert pool.restart() == [1]


SLOW_BACKWARD = """\
import time
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

class SlowGrad(torch.autograd.Function):  # a backward long enough to be interrupted in
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(30)
        return grad

torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(4, 1))
"""


def test_ctrl_c_inside_backward_of_a_users_ddp_model_says_what_to_run(pool):
    pool.run(SLOW_BACKWARD)
    with ctrl_c_after(2.0), pytest.raises(CellInterrupted) as info:
        pool.run("loss = SlowGrad.apply(ddp(torch.ones(2, 4))).sum()\nloss.backward()")
    text = str(info.value)
    assert "rank 0 stopped inside backward() at cell line 12 (in SlowGrad)" in text, text
    assert "rank 1 stopped inside backward()" in text and "`model = DDP(model.module)`" in text, text
    # what it says to run works: a fresh wrapper trains on
    pool.run("ddp = DDP(ddp.module)\nddp(torch.ones(2, 4)).sum().backward()")
    grads = pool.pull("ddp.module.weight.grad")
    torch.testing.assert_close(grads[0], grads[1])
