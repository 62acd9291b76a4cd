"""The elastic Trainer's decisions (workbench.train.elastic_policy: pure functions), its flags record, and
the seam between the plain Trainer and its elastic subclass."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from workbench.engine.rendezvous import RegroupAbandoned
from workbench.train import elastic_policy as policy
from workbench.train.elastic_policy import GroupLost

pytestmark = pytest.mark.timeout(60)

ME = ["host-a", 4242]


@pytest.mark.parametrize(("joining", "cut", "changed", "action"), [
    (True, False, False, "join"), (True, True, True, "join"),  # a joining engine has nothing to sync yet
    (False, True, False, "sync"), (False, False, True, "sync"), (False, True, True, "sync"),
    (False, False, False, "go"),
])
def test_a_run_joins_syncs_or_goes(joining, cut, changed, action):
    assert policy.at_run_start(joining, cut, changed) == action


@pytest.mark.parametrize(("error", "pending", "waits"), [
    (GroupLost("aborted"), False, True),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"), False,
     True),
    (type("DistBackendError", (RuntimeError,), {})("whatever"), False, True),
    (ValueError("mat1 and mat2 shapes cannot be multiplied"), False, False),  # the user's own: raised
    (ValueError("mat1 and mat2 shapes cannot be multiplied"), True, True),  # a plan came meanwhile
    (FloatingPointError("non-finite loss at step 3"), False, False),
])
def test_a_failed_step_waits_for_a_plan_only_when_a_peer_was_lost_or_a_plan_came(error, pending, waits):
    assert policy.waits_for_plan(error, pending) is waits


def test_whatever_a_step_raised_once_its_group_was_aborted_under_it_waits_for_the_plan():
    hook = AttributeError("'NoneType' object has no attribute 'size'")  # DDP's gradient hook, no group
    assert policy.waits_for_plan(hook, False, aborted=True)
    assert not policy.waits_for_plan(hook, False, aborted=False)


def test_a_plan_that_leaves_this_engine_out_ends_its_run_and_no_other():
    plan = {"members": [["host-b", 7]], "leaving": [ME, ["host-c", 9]], "stay": 1}
    assert policy.leaves(plan, ME)
    assert not policy.leaves(plan, ["host-b", 7])
    assert not policy.leaves({"members": [ME], "stay": 1}, ME)  # no "leaving": everyone stays


@pytest.mark.parametrize(("error", "retries"), [
    (RegroupAbandoned("a member did not answer"), True),
    (GroupLost("aborted"), True),
    (RuntimeError("Connection reset by peer"), True),
    (ValueError("rank 2's Trainer data differs from rank 0's"), False),  # said on every rank alike
    (KeyError("generation"), False),
])
def test_forming_the_group_takes_the_next_plan_only_after_a_lost_member(error, retries):
    assert policy.tries_next_plan(error) is retries


def test_new_ranks_are_the_replayed_and_those_the_plan_adds():
    plan = {"stay": 2}
    assert [policy.is_new(False, r, plan) for r in range(4)] == [False, False, True, True]
    assert policy.is_new(True, 0, plan)  # built by the setup replay: nothing trained yet
    assert not policy.is_new(False, 5, None)  # between runs nobody is added by a plan


def test_the_state_comes_from_the_furthest_rank_that_trained_the_lowest_on_a_tie():
    def state(new, step):
        return {"new": new, "step": step}

    assert policy.state_source([state(False, 4), state(False, 5), state(False, 5)]) == 1
    assert policy.state_source([state(False, 4), state(True, 0), state(True, 9)]) == 0  # new ranks never lead
    assert policy.state_source([state(True, 0), state(True, 0)]) == 0  # all new: the lowest


def test_a_regrouped_run_ends_where_it_would_have():
    # the source had step 7, 1 skipped and 4 left: it ends at 12; a rank now at step 6, 1 skipped, has 5
    assert policy.steps_left(12, 6, 1) == 5
    assert policy.steps_left(12, 7, 1) == 4


@pytest.mark.parametrize(("per_rank", "world", "lr_world", "batch", "factor"), [
    (16, 4, 4, 64, 1.0), (16, 3, 4, 48, 0.75), (8, 5, 2, 40, 2.5)])
def test_the_per_rank_policy_keeps_each_ranks_batch_and_scales_the_lr_linearly(per_rank, world, lr_world,
                                                                                batch, factor):
    assert policy.per_rank_batch(per_rank, world, lr_world) == (batch, factor)


def test_the_elastic_flags_add_the_plan_after_the_plain_ones_and_sum_alike():
    from workbench.train.elastic_trainer import ElasticFlags
    from workbench.train.trainer import StepFlags

    ranks = [ElasticFlags(loss=0.5, holders=1, regroup=1), ElasticFlags(loss=1.5, holders=1, stop=1)]
    summed = ElasticFlags.of(sum(f.tensor(torch.device("cpu")) for f in ranks))
    assert summed == ElasticFlags(loss=2.0, holders=2, stop=1, regroup=1) and summed.mean_loss == 1.0
    assert [*StepFlags.__dataclass_fields__, "regroup"] == list(ElasticFlags.__dataclass_fields__)


# The steps of the plain run an elastic Trainer changes (what ElasticTrainer's docstring lists), and the
# state hooks it extends. A method of the same name by accident (``_sync`` once was the plain Trainer's
# no_sync helper) would silently change the plain step.
OVERRIDES = {"__init__", "_before_run", "_beacon", "_start", "_more", "_next_step", "_flags", "_vote",
             "_state_to_copy", "_take_copied_state"}


def test_the_elastic_trainer_changes_only_the_runs_declared_steps():
    from workbench.train.elastic_trainer import ElasticTrainer
    from workbench.train.trainer import Trainer

    overridden = {name for name in vars(ElasticTrainer) if callable(getattr(Trainer, name, None))
                  and name not in ("__new__",)}
    assert overridden == OVERRIDES


def _mlp_and_loader():
    import workbench as wb

    x, y = wb.regression_data(64, seed=0)
    return wb.MLP(wb.MLPConfig()), wb.make_loader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def test_trainer_with_elastic_makes_the_elastic_subclass_and_refuses_a_wrong_value():
    import workbench as wb
    from workbench.train.elastic_trainer import ElasticTrainer

    model, loader = _mlp_and_loader()
    assert type(wb.Trainer(model, loader)) is wb.Trainer
    assert type(wb.Trainer(model, loader, elastic=False)) is wb.Trainer
    trainer = wb.Trainer(model, loader, elastic=wb.ElasticConfig(batch="per_rank"))
    assert type(trainer) is ElasticTrainer and trainer.elastic.config.batch == "per_rank"
    with pytest.raises(ValueError, match="elastic must be True, False or an ElasticConfig"):
        wb.Trainer(model, loader, elastic="yes")

    class Mine(wb.Trainer):
        def note(self):
            return "mine"

    mine = Mine(model, loader, elastic=True)
    assert isinstance(mine, Mine) and isinstance(mine, ElasticTrainer) and mine.note() == "mine"


def test_what_the_kernel_calls_on_every_engine_does_not_load_the_trainer():
    """``remote.trainer_count`` and ``newest_elastic_status`` import workbench.train.elastic on every engine,
    trained or not: it stays light (the Trainer's module brings the strategies and pipelining, ~1.7 s)."""
    code = ("import sys, workbench.train.elastic\n"
            "print('workbench.train.trainer' in sys.modules, 'workbench.strategies' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=50)
    assert done.stdout.split() == ["False", "False"]
