"""The elastic Trainer: a Trainer whose run goes on when ranks are lost, hang, join or leave.

``Trainer(..., elastic=...)`` builds one (see :mod:`workbench.train.elastic` for what it does and costs).
It is the plain :class:`~workbench.train.trainer.Trainer` with these steps of its run changed:

- ``_before_run``: forget regroup plans an earlier cell left;
- ``_start``: join the run in progress, or agree on one state first, when
  :func:`~workbench.train.elastic_policy.at_run_start` says so; FSDP saves a first checkpoint;
- ``_next_step``: a step that fails because a peer was lost is abandoned, the group re-formed on the
  kernel's plan and the step taken again on the ranks left; a plan that waits at a step boundary (ranks
  join or leave) is taken there by every rank;
- ``_flags``/``_vote``: every rank also says whether a plan waits (:class:`ElasticFlags`), and a group
  aborted under this rank ends the step before its all-reduce;
- ``_more``: a rank a planned shrink left out stops at that boundary.

When to do what is :mod:`workbench.train.elastic_policy`'s (pure functions); the state changes are this
class's own (its model, optimizer, counters) or its run's (:class:`~workbench.train.feed.ElasticRun`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch.distributed as dist

from workbench.engine import agent, guard, rendezvous
from workbench.train import elastic_policy as policy
from workbench.train.elastic import REPLAY, SAME_DATA_ADVICE, ElasticConfig, data_difference, register
from workbench.train.elastic_policy import GroupLost
from workbench.train.feed import ElasticRun
from workbench.train.trainer import RunResult, StepFlags, StepStats, Trainer


@dataclass
class ElasticFlags(StepFlags):
    """An elastic step's flags: also whether the kernel's regroup plan waits on this rank."""

    regroup: float = 0.0  # 1 where a plan waits: every rank takes it after this step


class ElasticTrainer(Trainer):
    """A :class:`~workbench.train.trainer.Trainer` that routes around lost ranks and lets new ones join
    (what ``Trainer(..., elastic=True)`` makes). ``elastic``: True or an
    :class:`~workbench.train.elastic.ElasticConfig`. ``self.elastic``: its run (data position, regroup
    ``events``, the last step's samples in ``last_step``)."""

    kind = "elastic Trainer"

    def __init__(self, model, data, *, elastic=True, **options):
        super().__init__(model, data, **options)
        config = ElasticConfig.of(elastic) or ElasticConfig()
        fsdp = self._check_elastic(config)
        self._checkpoint = _checkpoint_dir(self) if fsdp else None
        if fsdp and self._checkpoint is None:
            raise ValueError("elastic FSDP needs a checkpoint to take the lost rank's shards from: add "
                             "callbacks=[wb.Checkpoint('ckpt', every=...)] to the Trainer.")
        if fsdp and self.lr_scheduler is not None:
            raise ValueError("elastic FSDP with an lr_scheduler is not supported yet: the model and its "
                             "optimizer are rebuilt after a lost rank, and the scheduler is not saved.")
        self.elastic = ElasticRun(config, data, fsdp=fsdp)
        self.feed = self.elastic
        self._leaving = False  # a planned shrink left this rank out: the run ends here
        self._regroup_asked = False  # the last step's flags said a plan waits
        self._fresh = REPLAY["on"]  # built by a setup replay on a new engine: its state comes from a peer
        register(self)

    def _check_elastic(self, config: ElasticConfig) -> bool:
        """Whether the model is FSDP (else DDP); a ValueError for what elasticity cannot route around."""
        layout = self.layout
        if layout.pp > 1 or layout.size("tp") > 1:
            raise ValueError("elastic=True supports data parallelism (DDP, FSDP) only: a lost tensor or "
                             "pipeline shard cannot be routed around. Shard with 'ddp' or 'fsdp'.")
        fsdp = layout.config is not None and layout.config.data_parallel == "fsdp"
        replicated = layout.config is not None and layout.config.data_parallel == "ddp"
        if not (fsdp or replicated) and _world() > 1:
            raise ValueError("elastic=True needs a data-parallel model: wb.shard(model, 'ddp') or "
                             "wb.shard(model, 'fsdp').")
        if fsdp and config.batch != "global":
            raise ValueError("elastic FSDP keeps the global batch (batch='global'): its state comes back "
                             "from a checkpoint, whose learning rate is that of the world it was saved at.")
        return fsdp

    def join_run(self, plan: dict) -> RunResult:
        """On a new engine (after the setup replay): join this elastic run in progress with the kernel's
        regroup ``plan`` and train until the run ends (see :func:`workbench.train.elastic.join_running`)."""
        return self._run(None, joining=plan)

    # -- the run's steps, changed -------------------------------------------------------------------
    def _before_run(self) -> None:
        agent.clear_plans()  # a refusal left from an earlier cell's abort must not end this run

    def _beacon(self) -> dict:
        return {"elastic": self.elastic.status()}

    def _start(self, steps: int | None, joining: dict | None = None) -> None:
        self._left, self._leaving = steps or 0, False
        action = policy.at_run_start(joining is not None, self._cut_mid_step,
                                     rendezvous.generation() != self._generation)
        if action == "join":
            rendezvous.hear_plans(joining)  # a member lost while this engine joins re-plans it too
            self._regroup(joining)
        elif action == "sync":  # the group was re-formed between runs (a restart, a scale)
            self._sync_state()
        self._save_first_checkpoint()
        self._mark_progress()

    def _more(self) -> bool:
        return super()._more() and not self._leaving

    def _next_step(self) -> StepStats | None:
        agent.trainer_status["begun"] = agent.trainer_status.get("begun", 0) + 1  # (hang watch)
        try:
            if self._pending is None:
                self._pending = self.feed.fetch(self)
            stats = self._train_step()
        except Exception as exc:
            self.stopped_at = None  # the step is taken again: a stop asked is seen at its boundary
            self._regroup(self._plan_after(exc), exc)
            return None
        if self._regroup_asked:  # planned (ranks join or leave): every rank, at this boundary
            self._regroup(agent.take_plan(self.elastic.config.plan_wait))
        return stats

    def _flags(self, **facts) -> ElasticFlags:
        return ElasticFlags(**facts, regroup=float(agent.plan_pending()))

    def _vote(self, flags: StepFlags) -> StepFlags:
        if not dist.is_initialized():  # aborted under this rank when a peer was lost
            raise GroupLost("the process group was aborted: a peer was lost")
        total = super()._vote(flags)
        self._regroup_asked = bool(total.regroup)
        return total

    # -- regroup ------------------------------------------------------------------------------------
    def _plan_after(self, exc: BaseException) -> dict:
        """The regroup plan after the step failed with ``exc``; ``exc`` again if it was not the echo of a
        lost rank, or the kernel sent no plan (it stopped the cell instead)."""
        if not policy.waits_for_plan(exc, agent.plan_pending(), aborted=not guard.group_ok()):
            raise exc
        plan = agent.take_plan(self.elastic.config.plan_wait)
        if plan is None:
            raise exc
        return plan

    def _regroup(self, plan: dict | None, cause: BaseException | None = None) -> None:
        """Form the group ``plan`` says, then :meth:`_sync_state`. A failed attempt (a member lost meanwhile)
        takes the next plan (one that came meanwhile at once: a member lost while the group formed is
        never waited for); ``cause`` is raised when none comes."""
        self.abandon_step()
        while True:
            if plan is None:
                raise cause or GroupLost("the kernel stopped the run instead of regrouping it")
            if policy.leaves(plan, rendezvous.me()):
                self._leaving = True  # a planned shrink: this rank's run ends at this step boundary
                return
            t0 = time.perf_counter()
            try:
                rendezvous.regroup(plan)
                self._sync_state(plan)
            except Exception as exc:
                if not policy.tries_next_plan(exc):
                    raise
                print(f"workbench: forming the group of {len(plan['members'])} ranks failed ({exc}); waiting "
                      "for the next plan", file=sys.stderr, flush=True)
                self.abandon_step()
                cause, plan = exc, agent.take_plan(self.elastic.config.plan_wait)
                continue
            self._announce(plan, time.perf_counter() - t0)
            self._mark_progress()
            return

    def _sync_state(self, plan: dict | None = None) -> None:
        """After the group changed: every rank's wrapper on the new group, and one state for all of them.

        The rank that got furthest (:func:`~workbench.train.elastic_policy.state_source`) is the source:
        its model, optimizer, counters, data position and RNG become everyone's (a DDP step may have been
        committed on some ranks only before the peer was lost; a new rank has nothing yet). FSDP reloads
        the last checkpoint on the new world instead: the lost rank's shards exist nowhere else. A run in
        progress ends at the step it would have ended at (``step + skipped + left`` is the same on every
        rank in it).
        """
        run = self.elastic
        self.abandon_step()
        world, rank = _world(), _rank()
        mine = {"step": self.step, "end": self.step + self.skipped + self._left,
                "new": policy.is_new(self._fresh, rank, plan), "cut": self._cut_mid_step, **run.numbers()}
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        if policy.state_lost(everyone, plan):  # every rank alike: nothing trained is left to copy
            raise ValueError("the last rank that held this run's state was lost while the others joined: "
                             "nothing is left to go on from. Resume from a checkpoint (wb.resume), or run "
                             "trainer.run() again to start over on the ranks there are.")
        source = policy.state_source(everyone)
        first = everyone[source]
        for r in range(world):  # every rank raises alike: the epochs would split differently on them
            if difference := data_difference(everyone[r]["data"], first["data"]):
                raise ValueError(f"rank {r}'s Trainer data differs from rank {source}'s ({difference}). "
                                 + SAME_DATA_ADVICE)
        run.take_numbers(first)
        if run.fsdp:
            self._reshard()
        else:  # always copy: a new rank's weights may be at the same step count and still differ
            # copied first: wrapping anew, DDP copies rank 0's weights to every rank, and rank 0 may be the
            # new one (a sub-mesh's rank back at its pool number: docs/submeshes.md). Wrapped anew also where
            # a step was cut on some rank: DDP rebuilds its gradient buckets in the step after its first, and
            # a peer lost mid-step leaves some ranks with the rebuilt order and others without, which a
            # regrouped reducer keeps (its first all-reduce would sum mismatched gradients: issue 38)
            self._copy_state_from(source)
            self._rewrap(fresh=any(e["new"] or e["cut"] for e in everyone))
        self._fresh = False
        if plan is not None:  # mid-run: the run ends where it would have (between runs: ``steps`` more)
            self._left = policy.steps_left(first["end"], self.step, self.skipped)
        if run.config.batch == "per_rank":
            self._scale_lr(run.resize(world))
        self.mark_synced()

    def _state_to_copy(self) -> dict:
        state = super()._state_to_copy()
        state["counters"].update(self.elastic.position())
        return state

    def _take_copied_state(self, state: dict) -> None:
        super()._take_copied_state(state)
        self.elastic.take_position(state["counters"])

    def _reshard(self) -> None:
        """FSDP after a lost rank: shard a fresh model over the new world and load the last checkpoint
        into it (and into this Trainer)."""
        from workbench.strategies import shard
        from workbench.train.checkpoint import resume

        options = {k: v for k, v in asdict(self.layout.config).items() if k not in ("dp",)}
        model = shard(self._unsharded().to(self.device), **options)
        old = self.optimizer
        self._take_model(model)
        self.optimizer = type(old)([p for p in model.parameters() if p.requires_grad], **old.defaults)
        resume(self._checkpoint, self)

    def _unsharded(self):
        from workbench.train.models import MODELS

        rebuild = self.elastic.config.rebuild
        if rebuild is not None:
            return rebuild()
        arch = self.layout.arch or {}
        if arch.get("model") not in MODELS:
            raise ValueError("elastic FSDP rebuilds the model after a lost rank: pass "
                             "elastic=ElasticConfig(rebuild=lambda: MyModel(...)) for a model of your own.")
        cls, config_cls = MODELS[arch["model"]]
        return cls(config_cls(**arch["config"]))

    def _scale_lr(self, factor: float) -> None:
        if factor == 1.0:
            return
        for group in self.optimizer.param_groups:
            group["lr"] *= factor
            if "initial_lr" in group:
                group["initial_lr"] *= factor
        scheduler = self.lr_scheduler
        if scheduler is not None and hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]

    def _save_first_checkpoint(self) -> None:
        """Elastic FSDP: a checkpoint to come back to before the first one the callback saves."""
        from workbench.train.checkpoint import latest, save_trainer

        if self.elastic.fsdp and latest(self._checkpoint) is None:
            save_trainer(self._checkpoint, self)

    def _mark_progress(self) -> None:
        """Count steps begun and collectives launched from here (every member is at the same point): a
        rank that falls behind the others while they wait is hung (see
        :mod:`workbench.session.cell_elastic`)."""
        agent.trainer_status.update(begun=0, base=guard.launched())

    def _announce(self, plan: dict, seconds: float) -> None:
        event = {"step": self.step, "world_size": _world(), "generation": plan["generation"],
                 "lost": plan.get("lost", []), "joined": plan.get("joined", []),
                 "text": plan.get("text", "").replace("{step}", str(self.step)),  # a join or a leave
                 "seconds": round(seconds, 3), "source": "checkpoint" if self.elastic.fsdp else "peers"}
        self.elastic.record(event)
        # the kernel words a lost rank's fault record with the step the ranks went on from (its beacon
        # estimate may be steps behind)
        agent.trainer_status.update(regrouped=self.step, regrouped_generation=plan["generation"])
        for cb in self.hooks():
            hook = getattr(cb, "on_regroup", None)
            if hook is not None:
                hook(self, event)


def _checkpoint_dir(trainer: Trainer) -> Path | None:
    from workbench.train.checkpoint import Checkpoint

    for cb in trainer.callbacks:
        if isinstance(cb, Checkpoint):
            return cb.directory
    return None


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


__all__ = ["ElasticFlags", "ElasticTrainer"]
