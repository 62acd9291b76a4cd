"""The engine-side abort and collective tracking on a real gloo world (the stand-in for NCCL's shapes).

A rank's main thread is blocked in a collective; another thread (the engine's agent, in a pool) aborts
the group. The blocked rank and its peer are released within seconds, far before the collective
timeout, with their Python state intact.
"""

from __future__ import annotations

import threading
import time

import pytest
from world_harness import run_world

from workbench.engine import guard

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

RELEASED_WITHIN_S = 10.0  # a hang guard: the group's timeout in the harness is 30 s


def _everyones_endpoints(world, beacon=False) -> list:
    import torch.distributed as dist

    known: list = [None] * world
    mine = guard.snapshot(dist.get_rank())["endpoints"] if beacon else guard.gloo_endpoints()
    dist.all_gather_object(known, mine)
    return [e for eps in known for e in eps]


def _blocked_then_aborted(rank, world, aborter, subgroup):
    import torch
    import torch.distributed as dist

    state = {"weights": torch.arange(4.0) * (rank + 1)}
    group = dist.new_group([0, 1]) if subgroup else None  # made after the join: listens on ports of its own
    # what the kernel knows: every rank's listeners from the join, and from the beacons once a mesh was made
    peers = _everyones_endpoints(world, beacon=subgroup)
    t0 = time.monotonic()
    if rank == aborter:
        threading.Timer(1.0, guard.abort, args=(peers,)).start()
    if rank == 0:  # blocked in a collective rank 1 never joins
        try:
            dist.all_reduce(torch.ones(3), group=group)
            outcome = "completed"
        except RuntimeError:
            outcome = "released"
    else:  # busy in Python, not in the collective: its main thread would never see an ipyparallel apply
        time.sleep(RELEASED_WITHIN_S + 2)
        outcome = "slept"
    return outcome, time.monotonic() - t0, state["weights"].tolist()


@pytest.mark.parametrize("subgroup", [False, True], ids=["world", "subgroup-made-later"])
@pytest.mark.parametrize("aborter", [0, 1], ids=["blocked-rank-aborts", "busy-peer-aborts"])
def test_abort_from_a_background_thread_releases_a_blocked_rank(aborter, subgroup):
    (outcome, took, weights), (_, _, other) = run_world(_blocked_then_aborted, 2, aborter, subgroup)
    assert outcome == "released" and took < RELEASED_WITHIN_S, (outcome, took)
    assert weights == [0.0, 1.0, 2.0, 3.0] and other == [0.0, 2.0, 4.0, 6.0]  # Python state intact


def _async_completion(rank, world):
    import torch
    import torch.distributed as dist

    guard.track_collectives()
    before = guard.snapshot(rank)["done"]
    if rank == 0:  # returns at once, like an NCCL collective that was only enqueued
        work = dist.all_reduce(torch.ones(2), async_op=True)
        pending = guard.snapshot(rank)
        work.wait()
        time.sleep(0.05)
        after = guard.snapshot(rank)
        return (pending["inflight"], pending["done"] - before), (after["inflight"], after["done"] - before)
    time.sleep(1.0)
    dist.all_reduce(torch.ones(2))
    return None


def test_a_collective_counts_as_done_when_it_completed_not_when_it_returned():
    pending, after = run_world(_async_completion, 2)[0]
    assert pending == ("all_reduce", 0), "an enqueued collective was counted as completed"
    assert after == (None, 1)


def _origin_after_abort(rank, world):
    import torch
    import torch.distributed as dist

    guard.track_collectives()
    guard.group_formed()
    peers = _everyones_endpoints(world)
    if rank == 0:
        threading.Timer(0.5, guard.abort, args=(peers,)).start()
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError:
            pass
    else:  # joins late: rank 0 has aborted, its connections are gone
        time.sleep(1.5)
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError:
            pass
    return (guard.snapshot(rank)["failure"] or {}).get("origin")


def test_a_rank_knows_its_failure_came_from_its_own_abort():
    origins = run_world(_origin_after_abort, 2)
    assert origins[0] == "aborted"  # rank 1 saw a closed connection: nothing says more (origin None)
    assert origins[1] in (None, "peer")
