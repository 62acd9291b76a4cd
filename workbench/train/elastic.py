"""Elastic training: a lost rank is routed around at the step it was lost in, and new ranks join.

``Trainer(..., elastic=True)`` (or ``elastic=ElasticConfig(...)``). When a rank dies or hangs, the
kernel (:mod:`workbench.session.cell_elastic`) sends the ranks left a *regroup plan*: the new members in
rank order and a standby store to meet at. Each of them, its step cut off by the lost peer (or
released by its agent), takes the plan, forms the new group (:func:`workbench.engine.rendezvous.regroup`),
resets its wrapper onto it and agrees with the others on the state (:func:`sync`): the most advanced
rank's model, optimizer, counters and data position are everyone's. The abandoned step is then taken
again, its samples split over the ranks left (:class:`~workbench.train.data.ElasticLoader`), so no
sample of the epoch is skipped or seen twice. New ranks (``%dist restart``, ``%dist scale N``) join the
same way at a step or run boundary and receive the state from a peer.

What a lost rank costs:

- DDP (replicated): nothing. The ranks left hold everything; the abandoned step is redone.
- FSDP2 (sharded): the lost rank's shards are gone, so every rank rebuilds the model on the new world
  and loads the last checkpoint (a :class:`~workbench.train.checkpoint.Checkpoint` callback is required;
  a step-0 checkpoint is saved when a run starts without one). The steps since that checkpoint are
  taken again, from the data position saved with it.

Batch size policy (``batch=``): ``"global"`` (the default) keeps the global batch, so each rank takes
more samples when ranks are lost and the optimization is the same at every world size;
``"per_rank"`` keeps each rank's batch and scales the learning rate with the world size (linear rule).

>>> ElasticConfig(batch="per_rank").batch
'per_rank'
>>> ElasticConfig(batch="twice")
Traceback (most recent call last):
...
ValueError: unknown batch policy 'twice': choose 'global' (the default) or 'per_rank'.
"""

from __future__ import annotations

import itertools
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from workbench import faults
from workbench.engine import agent, guard, rendezvous
from workbench.train.data import ElasticLoader
from workbench.train.state_tree import broadcast_tree

BATCH_POLICIES = ("global", "per_rank")


@dataclass(frozen=True, kw_only=True)
class ElasticConfig:
    """How an elastic Trainer routes around a lost rank.

    ``batch``: "global" (keep the global batch; default) or "per_rank" (keep each rank's batch and scale
    the learning rate with the world size). ``min_ranks``: below this many ranks the run fails as a
    plain one would. ``hang_timeout``: seconds a step may wait on a rank that is not in the collective
    (or whose heartbeat stopped) before that rank counts as lost: it is killed and the run goes on
    without it. ``plan_wait``: seconds a rank whose collective failed waits for the kernel's regroup
    plan. ``rebuild``: for FSDP, a function returning the model unsharded (default: rebuilt from its
    config, for the workbench's own models). ``replace``: bring a lost rank back by itself where the
    pool can start an engine (a local pool with room on the machine): what ``%dist restart`` does
    during the run, without anyone typing it; the new rank joins at a step boundary.
    """

    batch: str = "global"
    min_ranks: int = 1
    hang_timeout: float = 60.0
    plan_wait: float = 15.0
    rebuild: Callable | None = None
    replace: bool = False

    def __post_init__(self):
        if self.batch not in BATCH_POLICIES:
            raise ValueError(f"unknown batch policy {self.batch!r}: choose 'global' (the default) or "
                             "'per_rank'.")
        if self.min_ranks < 1:
            raise ValueError(f"min_ranks must be at least 1 (got {self.min_ranks}).")
        if not self.hang_timeout > 0 or not self.plan_wait > 0:
            raise ValueError("hang_timeout and plan_wait must be positive seconds.")

    @classmethod
    def of(cls, elastic) -> ElasticConfig | None:
        """``Trainer(elastic=...)``: False/None (off), True (defaults) or an ElasticConfig."""
        if elastic is None or elastic is False:
            return None
        if elastic is True:
            return cls()
        if isinstance(elastic, cls):
            return elastic
        raise ValueError(f"elastic must be True, False or an ElasticConfig (got {elastic!r}).")


class GroupLost(RuntimeError):
    """The process group was aborted under this rank (a peer was lost): the step is abandoned."""


class _Batch(tuple):
    """One rank's micro-batch, with the weight that makes uneven shares average exactly: a rank with
    ``b`` of a step's ``G`` samples over ``w`` ranks scales its loss by ``b * w / G``."""

    weight: float = 1.0


_serials = itertools.count(1)
_trainers: list = []  # weak references to the elastic Trainers of this engine, oldest first
# While a new engine replays the notebook's setup (in a group of its own), ``Trainer.run`` does nothing:
# its state comes from a peer when it joins.
REPLAY = {"on": False}


class ElasticRun:
    """The elastic part of one Trainer: its data position, the steps in flight and the regroup logic; the
    Trainer's :class:`~workbench.train.trainer.Feed` in an elastic run (fetch, take, commit, abandon).

    Positions are ``(epoch, offset)`` in the epoch's permutation. ``committed``: where the next step
    begins; ``steps``: the fetched steps not committed yet (the one being taken, the one prefetched);
    ``last_step``: the samples of the last committed step (``position``, ``size``, ``world_size`` and
    this rank's ``indices``).
    """

    def __init__(self, trainer, config: ElasticConfig, data):
        layout = trainer.layout
        if layout.pp > 1 or layout.size("tp") > 1:
            raise ValueError("elastic=True supports data parallelism (DDP, FSDP) only: a lost tensor or "
                             "pipeline shard cannot be routed around. Shard with 'ddp' or 'fsdp'.")
        self.config = config
        self.fsdp = layout.config is not None and layout.config.data_parallel == "fsdp"
        replicated = layout.config is not None and layout.config.data_parallel == "ddp"
        if not (self.fsdp or replicated) and _world() > 1:
            raise ValueError("elastic=True needs a data-parallel model: wb.shard(model, 'ddp') or "
                             "wb.shard(model, 'fsdp').")
        if self.fsdp and config.batch != "global":
            raise ValueError("elastic FSDP keeps the global batch (batch='global'): its state comes back "
                             "from a checkpoint, whose learning rate is that of the world it was saved at.")
        self.checkpoint = _checkpoint_dir(trainer) if self.fsdp else None
        if self.fsdp and self.checkpoint is None:
            raise ValueError("elastic FSDP needs a checkpoint to take the lost rank's shards from: add "
                             "callbacks=[wb.Checkpoint('ckpt', every=...)] to the Trainer.")
        if self.fsdp and trainer.lr_scheduler is not None:
            raise ValueError("elastic FSDP with an lr_scheduler is not supported yet: the model and its "
                             "optimizer are rebuilt after a lost rank, and the scheduler is not saved.")
        self.loader = data if isinstance(data, ElasticLoader) else ElasticLoader.from_loader(data)
        self.world = _world()
        self.per_rank_batch = -(-self.loader.global_batch // self.world)
        self.base_world = self.world  # the learning rates were set for this world size (per_rank policy)
        self.committed = (0, 0)
        self.consumed = 0  # batches taken since the run began or was restored (as a plain run counts them)
        self.steps: deque = deque()
        self.last_step: dict | None = None
        self.left = 0  # iterations left in the run in progress
        self.serial = next(_serials)
        self.events: list[dict] = []  # every regroup this trainer went through
        self.leaving = False  # a planned shrink left this rank out: the run ends here
        self.fresh = REPLAY["on"]  # built by a setup replay on a new engine: its state comes from a peer
        _trainers.append(weakref.ref(trainer))

    def mark_progress(self) -> None:
        """Count steps begun and collectives launched from here (every member is at the same point): a
        rank that falls behind the others while they wait is hung (see
        :mod:`workbench.session.cell_elastic`)."""
        agent.trainer_status.update(begun=0, base=guard.launched())

    def status(self) -> dict:
        """What the beacon says about the elastic run (the kernel decides on regroups from it)."""
        c = self.config
        return {"serial": self.serial, "min_ranks": c.min_ranks, "hang_timeout": c.hang_timeout,
                "fsdp": self.fsdp, "data": self.loader.signature(), "replace": c.replace}

    # -- data ----------------------------------------------------------------------------------------
    def fetch(self, trainer) -> list:
        """The next step's micro-batches for this rank (epochs roll over: the data never runs out)."""
        rank, world = _rank(), _world()
        position = self.steps[-1]["end"] if self.steps else self.committed
        batches, record = [], {"world_size": world, "size": 0, "indices": []}
        for _ in range(trainer.config.grad_accum):
            position = self.loader.start(*position, world)
            record.setdefault("position", position)
            size = self.loader.step_size(position)
            indices = self.loader.indices(position, rank, world)
            batch = _Batch(t.to(trainer.device, non_blocking=True) for t in self.loader.batch(indices))
            batch.weight = len(indices) * world / size
            batches.append(batch)
            record["size"] += size
            record["indices"] += indices
            position = self.loader.advance(position, world)
        self.steps.append(dict(record, end=position))
        return batches

    def take(self, trainer, batches: list) -> None:
        """A step begins with the batches fetched first (they stay in flight until :meth:`commit`)."""
        self.consumed += len(batches)  # saved as a plain run's is (a plain Trainer resuming skips them)

    def commit(self) -> None:
        """The step in progress is done (taken, or skipped alike on every rank): its samples are used, and
        the run has one step less to go (counted here, with the step: ``step + skipped + left`` holds
        whatever fails after, a checkpoint save in a callback say)."""
        self.last_step = self.steps.popleft()
        self.committed = self.last_step["end"]
        self.left -= 1

    def abandon(self) -> None:
        """Forget the step in progress and the prefetched one: they are taken again after a regroup (the
        Trainer drops its batches: :meth:`~workbench.train.trainer.Trainer.abandon_step`)."""
        self.steps.clear()

    def check_group(self) -> None:
        """Before the step's all-reduce: the group was aborted under this rank when a peer was lost."""
        if not dist.is_initialized():
            raise GroupLost("the process group was aborted: a peer was lost")

    def counters(self) -> dict:
        """Where the next step begins in the epoch, in samples (saved with a checkpoint)."""
        return {"epoch": self.committed[0], "offset": self.committed[1], "consumed": self.consumed}

    def restore(self, trainer, counters: dict) -> None:
        """Stand where a checkpoint's ``counters`` say."""
        self.steps.clear()
        self.committed, self.consumed = (trainer.epoch, int(counters.get("offset", 0))), 0

    # -- regroup -------------------------------------------------------------------------------------
    def plan_after(self, exc: BaseException) -> dict:
        """The regroup plan after the step failed with ``exc``; ``exc`` again if it was not the echo of a
        lost rank, or the kernel sent no plan (it stopped the cell instead)."""
        if not (isinstance(exc, GroupLost) or faults.is_secondary(type(exc).__name__, str(exc))
                or agent.plan_pending()):
            raise exc
        plan = agent.take_plan(self.config.plan_wait)
        if plan is None:
            raise exc
        return plan

    def regroup(self, trainer, plan: dict | None, cause: BaseException | None = None) -> None:
        """Form the group ``plan`` says, then :func:`sync`. A failed attempt (a member lost meanwhile)
        takes the next plan (one that came meanwhile at once: a member lost while the group formed is
        never waited for); ``cause`` is raised when none comes."""
        trainer.abandon_step()
        while True:
            if plan is None:
                raise cause or GroupLost("the kernel stopped the run instead of regrouping it")
            if rendezvous.me() in plan.get("leaving", []):
                self.leaving = True  # a planned shrink: this rank's run ends at this step boundary
                return
            t0 = time.perf_counter()
            try:
                rendezvous.regroup(plan)
                sync(trainer, plan)
            except Exception as exc:
                if not (faults.is_secondary(type(exc).__name__, str(exc))
                        or isinstance(exc, (GroupLost, rendezvous.RegroupAbandoned))):
                    raise
                print(f"workbench: forming the group of {len(plan['members'])} ranks failed ({exc}); waiting "
                      "for the next plan", file=sys.stderr, flush=True)
                trainer.abandon_step()
                cause, plan = exc, agent.take_plan(self.config.plan_wait)
                continue
            self._announce(trainer, plan, time.perf_counter() - t0)
            self.mark_progress()
            return

    def _announce(self, trainer, plan: dict, seconds: float) -> None:
        event = {"step": trainer.step, "world_size": _world(), "generation": plan["generation"],
                 "lost": plan.get("lost", []), "joined": plan.get("joined", []),
                 "text": plan.get("text", "").replace("{step}", str(trainer.step)),  # a join or a leave
                 "seconds": round(seconds, 3), "source": "checkpoint" if self.fsdp else "peers"}
        self.events.append(event)
        # the kernel words a lost rank's fault record with the step the ranks went on from (its beacon
        # estimate may be steps behind)
        agent.trainer_status.update(regrouped=trainer.step, regrouped_generation=plan["generation"])
        for cb in trainer.callbacks:
            hook = getattr(cb, "on_regroup", None)
            if hook is not None:
                hook(trainer, event)


def sync(trainer, plan: dict | None = None) -> None:
    """After the group changed: every rank's wrapper on the new group, and one state for all of them.

    The rank that got furthest (highest step; the lowest such rank) is the source: its model,
    optimizer, counters, data position and RNG become everyone's (a DDP step may have been committed on
    some ranks only before the peer was lost; a new rank has nothing yet). FSDP reloads the last
    checkpoint on the new world instead: the lost rank's shards exist nowhere else. A run in progress
    ends at the step it would have ended at (``step + skipped + left`` is the same on every rank in it).
    """
    run: ElasticRun = trainer.elastic
    trainer.abandon_step()
    world, rank = _world(), _rank()
    mine = {"step": trainer.step, "end": trainer.step + trainer.skipped + run.left,
            "global_batch": run.loader.global_batch,
            "new": run.fresh or plan is not None and rank >= plan["stay"],
            "per_rank_batch": run.per_rank_batch, "lr_world": run.base_world, "data": run.loader.signature()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    source = max(range(world), key=lambda r: (not everyone[r]["new"], everyone[r]["step"], -r))
    first = everyone[source]
    for r in range(world):  # every rank raises alike: the epochs would split differently on them
        if difference := data_difference(everyone[r]["data"], first["data"]):
            raise ValueError(f"rank {r}'s Trainer data differs from rank {source}'s ({difference}). "
                             + SAME_DATA_ADVICE)
    run.loader.global_batch, run.per_rank_batch = first["global_batch"], first["per_rank_batch"]
    if run.fsdp:
        _rebuild_fsdp(trainer, run)
        run.base_world = first["lr_world"]
    else:  # always copy: a new rank's weights may be at the same step count and still differ
        ddp_onto_world(trainer, fresh=any(e["new"] for e in everyone))
        copy_state_from(trainer, source, run)
    run.fresh = False
    if plan is not None:  # mid-run: the run ends where it would have (between runs: ``steps`` more)
        run.left = first["end"] - (trainer.step + trainer.skipped)
    run.world = world
    if run.config.batch == "per_rank":
        run.loader.global_batch = run.per_rank_batch * world
        _scale_lr(trainer, world / run.base_world)
        run.base_world = world
    trainer.mark_synced()


def ddp_onto_world(trainer, fresh: bool) -> None:
    """DDP's reducer, our gradient hook and the layout's mesh onto the current group.

    ``fresh``: a rank joins. Every rank then wraps its module anew: DDP's gradient buckets must be laid
    out alike on every rank, and the ranks that trained on have them in the order their gradients came
    in, a new rank in the initial order. Names in the notebook that held the old wrapper hold the new one.
    """
    from dataclasses import replace

    from torch.nn.parallel import DistributedDataParallel as DDP

    from workbench.strategies.ddp import ddp
    from workbench.strategies.mesh import build_mesh

    layout, world = trainer.layout, _world()
    if layout.mesh is not None:
        layout.mesh = build_mesh({"dp": world}, trainer.device.type)
        layout.config = replace(layout.config, dp=world, data_parallel="ddp")
    if isinstance(trainer.model, DDP) and not fresh:
        trainer.model._update_process_group(dist.group.WORLD)
        timer = getattr(trainer.model, "wb_comm", None)
        if timer is not None:
            timer.group = None  # the current world, looked up at each call
    elif world > 1:
        old, trainer.model = trainer.model, ddp(trainer.module, device=trainer.device)
        if isinstance(old, DDP):  # its reducer's hooks stay on the parameters: never expecting a gradient
            old.reducer._reset_state()
        trainer.model.wb_layout, layout.comm = layout, trainer.model.wb_comm
        trainer.optimizer.zero_grad(set_to_none=True)
        namespace = rendezvous.user_namespace()
        for name, value in list(namespace.items()):
            if value is old:
                namespace[name] = trainer.model


@torch.no_grad()
def copy_state_from(trainer, source: int, run: ElasticRun | None = None) -> None:
    """Everything that makes a rank's training state (parameters, optimizer, scheduler, RNG, counters;
    ``run``: an elastic run's data position too), from ``source`` to every rank."""
    from workbench.strategies.mesh import broadcast_module

    broadcast_module(trainer.module, src=source)
    counters = {"step": trainer.step, "skipped": trainer.skipped, "epoch": trainer.epoch}
    if run is not None:
        counters.update(committed=list(run.committed), lr_world=run.base_world)
    state = {"optim": trainer.optimizer.state_dict(), "rng": torch.get_rng_state(), "counters": counters}
    if trainer.lr_scheduler is not None:
        state["scheduler"] = trainer.lr_scheduler.state_dict()
    state = broadcast_tree(state, source, trainer.device)
    if _rank() != source:
        trainer.optimizer.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        if "scheduler" in state:
            trainer.lr_scheduler.load_state_dict(state["scheduler"])
        c = state["counters"]
        trainer.step, trainer.skipped, trainer.epoch = c["step"], c["skipped"], c["epoch"]
        if run is not None:
            run.committed, run.base_world = tuple(c["committed"]), c["lr_world"]


def _scale_lr(trainer, factor: float) -> None:
    if factor == 1.0:
        return
    for group in trainer.optimizer.param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    scheduler = trainer.lr_scheduler
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]


def _rebuild_fsdp(trainer, run: ElasticRun) -> None:
    """Shard a fresh model over the new world and load the last checkpoint into it (and the trainer)."""
    from dataclasses import asdict

    from workbench.strategies import shard
    from workbench.strategies.layout import layout_of
    from workbench.train.checkpoint import resume
    from workbench.train.models import MODELS

    layout = trainer.layout
    if run.config.rebuild is not None:
        fresh = run.config.rebuild()
    else:
        arch = layout.arch or {}
        if arch.get("model") not in MODELS:
            raise ValueError("elastic FSDP rebuilds the model after a lost rank: pass "
                             "elastic=ElasticConfig(rebuild=lambda: MyModel(...)) for a model of your own.")
        cls, config_cls = MODELS[arch["model"]]
        fresh = cls(config_cls(**arch["config"]))
    options = {k: v for k, v in asdict(layout.config).items() if k not in ("dp",)}
    model = shard(fresh.to(trainer.device), **options)
    old = trainer.optimizer
    trainer.model, trainer.layout = model, layout_of(model)
    trainer.module = trainer.layout.base or model
    params = [p for p in model.parameters() if p.requires_grad]
    trainer.optimizer = type(old)(params, **old.defaults)
    resume(run.checkpoint, trainer)


def save_first_checkpoint(trainer) -> None:
    """Elastic FSDP: a checkpoint to come back to before the first one the callback saves."""
    from workbench.train.checkpoint import latest, save_trainer

    run: ElasticRun = trainer.elastic
    if run.fsdp and latest(run.checkpoint) is None:
        save_trainer(run.checkpoint, trainer)


def _checkpoint_dir(trainer) -> Path | None:
    from workbench.train.checkpoint import Checkpoint

    for cb in trainer.callbacks:
        if isinstance(cb, Checkpoint):
            return cb.directory
    return None


# -- an engine that joins a run in progress ------------------------------------------------------------
def trainer_count() -> int:
    """How many elastic Trainers this engine has built (a new engine replays the setup until it has as
    many as the ranks it joins)."""
    return len(_trainers)


def latest_trainer():
    """The newest elastic Trainer of this engine that still exists, or None."""
    for ref in reversed(_trainers):
        trainer = ref()
        if trainer is not None:
            return trainer
    return None


def join_running(plan: dict):
    """On a new engine, after the setup replay: join the elastic run in progress at the others' next step
    boundary, take the state from a peer and train until the run ends. Returns the run's result."""
    trainer = latest_trainer()
    if trainer is None:
        raise RuntimeError("this engine has no elastic Trainer to join the run with: run the notebook's "
                           "setup on it first.")
    return trainer.join_run(plan)


SAME_DATA_ADVICE = (
    "A new engine replays the notebook's setup in a group of its own (world size 1): build the dataset "
    "without dist.get_world_size() or world_size (wb.make_loader splits it over the ranks), or run the "
    "setup on the new rank yourself with the sizes the others used.")


def data_difference(mine: dict, theirs: dict) -> str:
    """How one loader's :meth:`~workbench.train.data.ElasticLoader.signature` differs from another's
    ("" when alike).

    >>> data_difference({"samples": 4096, "seed": 0}, {"samples": 12288, "seed": 0})
    '4096 samples, not 12288'
    """
    return ", ".join(f"{mine.get(k)} {k}, not {v}" if k == "samples" else f"{k} {mine.get(k)}, not {v}"
                     for k, v in theirs.items() if mine.get(k) != v)


def check_joining_data(expected: dict) -> None:
    """On a new engine, after the setup replay: its newest elastic Trainer's data must be the data of
    the run it joins (``expected``: a running rank's signature), else a ValueError that says what differs."""
    trainer = latest_trainer()
    if trainer is None:
        return
    difference = data_difference(trainer.elastic.loader.signature(), expected)
    if difference:
        raise ValueError(f"the Trainer data the setup built here differs from the running ranks' "
                         f"({difference}). " + SAME_DATA_ADVICE)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1
