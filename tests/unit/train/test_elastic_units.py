"""Pure parts of elastic training: the loader's split of an epoch, and the agent's regroup plans."""

from __future__ import annotations

import json
import os
import random
import socket

import pytest
import torch
from torch.utils.data import TensorDataset

from workbench import wire
from workbench.engine import agent
from workbench.train.data import ElasticLoader

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("seed", range(5))
def test_an_epoch_split_over_changing_world_sizes_takes_every_sample_once(seed):
    """Whatever the world size at each step (and however unevenly the global batch divides), the ranks
    of every step together take its slice, and the slices of an epoch tile it."""
    rng = random.Random(seed)
    n, batch = 1000, rng.choice([7, 48, 50])
    loader = ElasticLoader(TensorDataset(torch.arange(n)), global_batch=batch, seed=seed)
    position, taken = (0, 0), {}
    for _ in range(3 * (n // batch)):
        world = rng.randint(1, 5)
        position = loader.start(*position, world)
        size = loader.step_size(position)
        parts = [loader.indices(position, r, world) for r in range(world)]
        flat = [i for p in parts for i in p]
        assert len(flat) == size == batch and len(set(flat)) == size
        taken.setdefault(position[0], []).extend(flat)
        position = loader.advance(position, world)
    for epoch, seen in taken.items():
        if epoch < max(taken):  # a complete epoch: every sample once, but the tail that is no full batch
            assert len(seen) == len(set(seen)) == n - n % batch
            assert seen[:batch] == loader.permutation(epoch)[:batch]


def test_uneven_shares_are_weighted_so_the_gradient_is_the_global_mean():
    """With shares b_r of G over w ranks, weight b_r * w / G makes the mean over ranks of the weighted
    per-rank means equal the mean over all G samples (what DDP's averaging then computes)."""
    values = torch.randn(10, dtype=torch.float64)
    loader = ElasticLoader(TensorDataset(values), global_batch=10, shuffle=False)
    world = 3
    parts = [loader.indices((0, 0), r, world) for r in range(world)]
    assert [len(p) for p in parts] == [4, 3, 3]
    ddp_mean = sum(values[p].mean() * len(p) * world / 10 for p in parts) / world
    torch.testing.assert_close(ddp_mean, values.mean())


def test_a_dataloader_becomes_elastic_only_over_a_distributed_sampler():
    from workbench.train.data import make_loader

    data = TensorDataset(torch.arange(64.0), torch.arange(64.0))
    loader = ElasticLoader.from_loader(make_loader(data, batch_size=8))
    assert loader.global_batch == 8 and loader.shuffle  # one process: a world of one
    with pytest.raises(ValueError, match="needs a DataLoader over a DistributedSampler"):
        ElasticLoader.from_loader(torch.utils.data.DataLoader(data, batch_size=8))
    with pytest.raises(ValueError, match="fewer than one global batch"):
        ElasticLoader(data, global_batch=100)


def _command(key: str, **body) -> list[bytes]:
    body = {"ranks": [0], "generation": 1, "id": os.urandom(4).hex(), **body}
    return wire.Signer(key).pack(wire.COMMAND, json.dumps(body).encode())


def test_the_agent_takes_regroup_plans_for_this_engine_and_a_newer_group_only(channel):
    key, me = channel["key"], [socket.gethostname(), os.getpid()]
    a = agent.Agent(channel, rank=0, generation=1)
    try:
        plan = {"generation": 2, "members": [me], "stay": 1, "leaving": [], "host": me, "store": ["x", 1]}
        assert a.handle(_command(wire.new_key(), do="regroup", plan=plan)) is None  # forged
        assert a.handle(_command(key, do="regroup", plan={**plan, "members": [["elsewhere", 1]]})) is None
        assert a.handle(_command(key, do="regroup", plan={**plan, "generation": 1})) is None  # not newer
        assert not agent.plan_pending() and a.bad == 2
        assert a.handle(_command(key, do="regroup", plan=plan)) == "regroup"
        assert agent.plan_pending() and agent.take_plan(0.1) == plan and not agent.plan_pending()
        a.retarget(3, 2)
        assert a.handle(_command(key, do="regroup", plan=plan)) is None  # that group is formed already
        assert a.handle(_command(key, do="stop", ranks=[0], generation=2)) is None  # rank 3 now
        assert a.handle(_command(key, do="abort", ranks=[3], generation=2)) == "abort (no group)"
        assert agent.take_plan(0.1) is None  # an abort: no plan is coming, the waiting step gives up
    finally:
        a.close()
        agent.clear_plans()


def test_a_join_asked_for_after_the_run_ended_fails_at_once_instead_of_waiting():
    """``%dist restart`` (or a replacement) asking a finished elastic run to take a rank: the Future says
    the run ended at once (before, it waited for a tick that never came: 120 s)."""
    from workbench.session.cell_elastic import Children, ElasticWatch
    from workbench.session.target_size import RunEnded

    woken = []
    watch = ElasticWatch(None, Children(), wake=lambda: woken.append(1))  # no regroup: no room is asked
    pending = watch.request("join", [])
    watch.close()
    late = watch.request("join", [])
    for future in (pending, late):
        assert future.done() and isinstance(future.exception(), RunEnded), future.exception()
        assert "the elastic run ended" in str(future.exception())
    assert woken == [1]


def test_a_restart_waits_for_a_count_of_the_members_made_after_it_asked():
    """``%dist restart`` during a run aims at 4 ranks while the keeper's last count, made before a rank
    died (the watch does not count while a loss is unplanned), still says 4: the wait must not end on that
    old count (it did: the restart returned at once, with no rank brought back; CI of 90923d2). It ends
    on the first count made after the aim."""
    import threading

    from workbench.errors import WorkbenchError
    from workbench.session.cell_elastic import Children, ElasticWatch
    from workbench.session.target_size import SizeKeeper

    watch = ElasticWatch(None, Children(), wake=lambda: None)
    keeper = SizeKeeper(None, watch, target=None, auto=False, report=print)
    keeper.consider(4)  # a tick before the loss; then none while it is unplanned
    keeper.aim(4)
    with pytest.raises(WorkbenchError, match="did not reach 4 ranks within 0.3 s"):
        keeper.wait(4, 0.3)
    counted = threading.Timer(0.2, keeper.consider, args=(4,))  # the rank is back, and a tick counts it
    counted.start()
    keeper.wait(4, 10)
    counted.join()


def test_loaders_that_would_split_an_epoch_differently_are_told_apart():
    from workbench.train.elastic import data_difference

    data = TensorDataset(torch.arange(12.))
    mine = ElasticLoader(data, global_batch=4).signature()
    assert data_difference(mine, ElasticLoader(data, global_batch=2).signature()) == ""  # batch: agreed on
    other = ElasticLoader(TensorDataset(torch.arange(36.)), global_batch=4, seed=1).signature()
    assert data_difference(mine, other) == "12 samples, not 36, seed 0, not 1"
