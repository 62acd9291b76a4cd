"""When an elastic Trainer changes its group: the decisions, as pure functions of what the rank knows.

The :class:`~workbench.train.elastic_trainer.ElasticTrainer` asks these at fixed points of its run and does
what they say; none of them touches torch, a process group or the Trainer.

- a run starts: join the run in progress, agree on one state first, or go (:func:`at_run_start`);
- a step failed: wait for the kernel's regroup plan, or raise the error (:func:`waits_for_plan`);
- a plan came: leave (a planned shrink left this rank out) or form the group (:func:`leaves`);
- forming it failed: take the next plan, or raise (:func:`tries_next_plan`);
- the group formed: whose state everyone takes (:func:`state_source`), which ranks are new
  (:func:`is_new`), how many steps the run has left (:func:`steps_left`), and under the ``per_rank`` batch
  policy the new global batch and learning-rate factor (:func:`per_rank_batch`).

A planned regroup (ranks join or leave) is taken at the step boundary after every rank's step flags said
that a plan waits (``ElasticFlags.regroup``): all of them see the same sum, so all of them take it there.
"""

from __future__ import annotations

from workbench import faults
from workbench.engine.rendezvous import RegroupAbandoned


class GroupLost(RuntimeError):
    """The process group was aborted under this rank (a peer was lost): the step is abandoned."""


def at_run_start(joining: bool, cut_mid_step: bool, group_changed: bool) -> str:
    """``"join"`` (a new engine joins a run in progress with the kernel's plan), ``"sync"`` (the group was
    re-formed between runs, a restart or a scale, or a step was cut: every rank takes one state first) or
    ``"go"``.

    >>> at_run_start(joining=False, cut_mid_step=False, group_changed=True)
    'sync'
    """
    if joining:
        return "join"
    return "sync" if cut_mid_step or group_changed else "go"


def waits_for_plan(error: BaseException, plan_pending: bool, aborted: bool = False) -> bool:
    """After a step failed with ``error``: whether it is the echo of a lost rank (wait for the kernel's
    plan and take the step again on the ranks left) rather than the user's own error (raise it).
    ``aborted``: the group was aborted under this rank (the kernel aborts it before it posts the plan):
    whatever the step raised then is the abort's echo, even an error no collective words (DDP's gradient
    hook, run after the abort, finds no group: ``AttributeError: 'NoneType' object has no attribute
    'size'``).

    >>> waits_for_plan(RuntimeError("[pair.cc:553] Connection closed by peer"), plan_pending=False)
    True
    >>> waits_for_plan(ValueError("bad shape"), plan_pending=False)
    False
    >>> waits_for_plan(AttributeError("'NoneType' object has no attribute 'size'"), False, aborted=True)
    True
    """
    return (aborted or isinstance(error, GroupLost) or faults.is_secondary(type(error).__name__, str(error))
            or plan_pending)


def leaves(plan: dict, me: list) -> bool:
    """Whether ``plan`` leaves this engine (``me``: ``[host, pid]``) out: its run ends at this boundary."""
    return me in plan.get("leaving", [])


def tries_next_plan(error: BaseException) -> bool:
    """Forming the planned group failed with ``error``: a member lost meanwhile (take the next plan, which
    leaves it out) or anything else (raise)."""
    return (faults.is_secondary(type(error).__name__, str(error))
            or isinstance(error, (GroupLost, RegroupAbandoned)))


def is_new(fresh: bool, rank: int, plan: dict | None) -> bool:
    """Whether this rank holds no training state of the run: built by a setup replay (``fresh``), or a
    rank the plan adds (ranks ``plan["stay"]`` and up are new)."""
    return fresh or (plan is not None and rank >= plan["stay"])


def state_source(everyone: list[dict]) -> int:
    """The rank whose state every rank takes: one that trained (not new), the furthest (highest
    ``step``), the lowest such rank on a tie.

    >>> state_source([{"new": False, "step": 7}, {"new": False, "step": 8}, {"new": True, "step": 9}])
    1
    """
    return max(range(len(everyone)), key=lambda r: (not everyone[r]["new"], everyone[r]["step"], -r))


def state_lost(everyone: list[dict], plan: dict | None) -> bool:
    """Whether a regroup after a loss left only new ranks: the last rank that held the run's state was lost
    while the others joined, so there is nothing to go on from.

    >>> state_lost([{"new": True}], {"lost": [0]}), state_lost([{"new": True}], None)
    (True, False)
    """
    return bool(plan is not None and plan.get("lost")) and all(e["new"] for e in everyone)


def steps_left(end: int, step: int, skipped: int) -> int:
    """Steps a run has left after a regroup mid-run: it ends where it would have (``end`` is the source's
    ``step + skipped + left``; skipped steps count, as they do in a plain run)."""
    return end - (step + skipped)


def per_rank_batch(per_rank: int, world: int, lr_world: int) -> tuple[int, float]:
    """The ``per_rank`` batch policy at ``world`` ranks: (the global batch, the factor on the learning
    rates set for ``lr_world`` ranks). The linear scaling rule.

    >>> per_rank_batch(per_rank=16, world=3, lr_world=4)
    (48, 0.75)
    """
    return per_rank * world, world / lr_world
