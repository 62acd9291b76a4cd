"""A small synchronized training loop, the same on every rank, cell after cell.

>>> trainer = Trainer(model, loader, lr=1e-3, clip=1.0)     # doctest: +SKIP
>>> trainer.run(steps=50)                                   # doctest: +SKIP
RunResult(steps 1-50, loss 1.2034 -> 0.4121, 812 samples/s)

Each step: forward/backward over ``grad_accum`` batches (DDP/FSDP sync only on the last),
then one all-reduce over the world that agrees on the mean loss, on a NaN/Inf loss, on
whether any rank ran out of data and on whether someone asked to stop (Ctrl-C in the
notebook), so every rank takes (or skips) the same steps and stops on the same step.

Ctrl-C while ``run`` goes: the notebook asks every rank's agent to stop; the ranks finish
the step they are in, agree on it, and raise :class:`TrainingInterrupted` together. Model,
optimizer, scheduler, RNG and data position are those of a run that was asked for exactly
that many steps, so the next ``run`` continues as if nothing happened.

Where the batches come from is the Trainer's :class:`~workbench.train.feed.Feed` (a plain run's
:class:`~workbench.train.feed.PlainFeed`). The loop fetches a step's batches, takes them, and commits
the step once every rank agreed on it.

The Trainer is the only writer of its state: its model, wrapper, optimizer and counters change in its
own methods (``_take_model``, ``_rewrap``, ``_copy_state_from``, ``load_state_dict``, ``_commit``...).
``Trainer(..., elastic=...)`` builds an :class:`~workbench.train.elastic_trainer.ElasticTrainer`, a
subclass that changes what a run does at its fixed points (``_before_run``, ``_start``, ``_more``,
``_next_step``, ``_flags``, ``_vote``); the plain loop below has no elastic branch.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist
from torch import nn

from workbench import cell_targets
from workbench.engine import agent, rendezvous
from workbench.strategies.layout import device_of, layout_of
from workbench.strategies.pipeline import Pipelined
from workbench.train.elastic import REPLAY, ElasticConfig
from workbench.train.events import Callback, StepStats, default_callbacks
from workbench.train.feed import Feed, PlainFeed
from workbench.train.state_tree import broadcast_tree


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """``precision``: "fp32", "bf16" or "auto" (bf16 autocast where the GPU does bf16 natively), the same
    for every strategy (pipeline stages too).
    ``on_nonfinite``: "raise" (every rank raises at the same step) or "skip" the update."""

    lr: float = 1e-3
    optim: str = "adamw"
    weight_decay: float = 0.0
    grad_accum: int = 1
    clip: float | None = 1.0
    precision: str = "auto"
    seed: int = 0
    on_nonfinite: str = "raise"
    log_every: int = 0

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be positive (got {self.lr}).")
        if self.optim not in ("adamw", "sgd"):
            raise ValueError(f"unknown optim {self.optim!r}: choose adamw or sgd "
                             "(or pass optimizer=).")
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be at least 1 (got {self.grad_accum}).")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be positive or None (got {self.clip}).")
        if self.precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"unknown precision {self.precision!r}: choose fp32, bf16 or auto.")
        if self.on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"unknown on_nonfinite {self.on_nonfinite!r}: choose raise or skip.")


class TrainingInterrupted(KeyboardInterrupt):
    """Every rank stopped at the same step boundary because someone asked (Ctrl-C in the notebook)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"interrupted at step {step} on all ranks; `trainer.run()` continues from here")


class InterruptedMidStep(RuntimeError):
    """A step was cut off half-way and the sharded model cannot be rebuilt in place."""


@dataclass
class RunResult:
    """What one ``run`` did; ``history`` holds every step's :class:`StepStats`."""

    history: list[StepStats] = field(default_factory=list)

    def __repr__(self) -> str:
        h = self.history
        if not h:
            return "RunResult(no steps: out of data)"
        rate = sum(s.samples for s in h) / max(1e-9, sum(s.step_time for s in h))
        return (f"RunResult(steps {h[0].step}-{h[-1].step}, loss {h[0].loss:.4f} -> {h[-1].loss:.4f}, "
                f"{rate:.0f} samples/s)")


@dataclass
class StepFlags:
    """What each rank says at the end of a step, summed over the ranks in one all-reduce so that every
    rank decides alike: take the update or skip it, stop, go on. One float each (the sum is a count).

    >>> mine = StepFlags(loss=0.5, holders=1, stop=1)
    >>> StepFlags.of(mine.tensor(torch.device("cpu")) * 2)       # as two such ranks sum
    StepFlags(loss=1.0, holders=2.0, nonfinite=0.0, out_of_data=0.0, stop=2.0, checkpoint=0.0)
    >>> _.mean_loss
    0.5
    """

    loss: float = 0.0  # this rank's mean loss where it holds one (0 on a pipeline stage that does not)
    holders: float = 0.0  # 1 where this rank holds a loss
    nonfinite: float = 0.0  # 1 where that loss is NaN or Inf
    out_of_data: float = 0.0  # 1 where this rank has no next step (its data ran out)
    stop: float = 0.0  # 1 where someone asked this rank to stop (Ctrl-C in the notebook)
    checkpoint: float = 0.0  # 1 where the notebook asked for a checkpoint (the Slurm job ends soon)

    def tensor(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([float(getattr(self, f.name)) for f in fields(self)], dtype=torch.float64,
                            device=device)

    @classmethod
    def of(cls, summed: torch.Tensor) -> StepFlags:
        """The record back from its (summed) tensor."""
        return cls(*summed.cpu().tolist())

    @property
    def mean_loss(self) -> float:
        return self.loss / max(self.holders, 1.0)


class Trainer:
    """Synchronized steps over a sharded (or plain) model; ``self.step`` counts across runs.

    ``data``: a DataLoader (re-iterated every epoch, with ``sampler.set_epoch``) or any
    iterable of ``(x, y)`` batches for this rank (used once). Extra keywords build a
    :class:`TrainConfig`. ``elastic``: True or an :class:`~workbench.train.elastic.ElasticConfig`
    to route around a rank lost mid-run: the Trainer made is then an
    :class:`~workbench.train.elastic_trainer.ElasticTrainer` (see :mod:`workbench.train.elastic`).
    """

    kind = "Trainer"  # what its messages call it
    elastic = None  # an elastic Trainer's run (:class:`~workbench.train.feed.ElasticRun`)

    def __new__(cls, *args, elastic=False, **kwargs):
        if ElasticConfig.of(elastic) is not None:
            cls = _elastic_form(cls)
        return super().__new__(cls)

    def __init__(self, model: nn.Module, data, *, config: TrainConfig | None = None, loss_fn=None,
                 optimizer: torch.optim.Optimizer | None = None, lr_scheduler=None,
                 callbacks: list[Callback] | tuple = (), elastic=False, **options):
        self.config = config or TrainConfig(**options)
        if config is not None and options:
            raise ValueError("pass either config= or keyword options, not both.")
        self._take_model(model)
        self.loss_fn = loss_fn or self.layout.loss_fn
        if self.loss_fn is None:
            raise ValueError("no loss function: pass loss_fn=, or use a model that has one (MLP, TinyGPT).")
        self.device = device_of(self.module)
        torch.manual_seed(self.config.seed)
        self.optimizer = optimizer or _make_optimizer(model, self.config)
        self.lr_scheduler = lr_scheduler
        self.callbacks = list(callbacks)  # the user's; the defaults are read at each event (hooks())
        self.step = 0
        self.skipped = 0
        self.epoch = 0
        self._left = 0  # steps the run in progress has to go (taken or skipped)
        self.history: list[StepStats] = []
        self._pending, self._exhausted = None, False  # the next step's batches, fetched one step ahead
        self._autocast = _autocast(self.config.precision, self.device)
        self.stopped_at: int | None = None  # the step the last run was interrupted at (Ctrl-C)
        # during the callbacks of a step at which every rank was asked to checkpoint (its Slurm job ends
        # soon): a wb.Checkpoint callback saves there, whatever its ``every``
        self.checkpoint_asked = False
        self.run_error: BaseException | None = None  # what ended the current run early, for on_run_end
        self._cut_mid_step = False  # an error or a hard interrupt left a step half done
        self._generation = rendezvous.generation()  # the process group the wrappers were made on
        self._flag_device = _flag_device(self.device)
        self.feed: Feed = PlainFeed(data)

    # -- the Trainer's own changes ------------------------------------------------------------
    def _take_model(self, model: nn.Module) -> None:
        """Train ``model`` from here (the one passed in, or one sharded anew after a lost rank)."""
        self.model, self.layout = model, layout_of(model)
        self.module = self.layout.base or model  # holds the parameters

    def abandon_step(self) -> None:
        """Forget the step in progress and the prefetched one (and their gradients): after a regroup
        they are fetched and taken again."""
        self.feed.abandon()
        self._pending = None
        self.optimizer.zero_grad(set_to_none=True)

    def mark_synced(self) -> None:
        """The wrappers are on the current process group and every rank holds one state: no step is
        half done, and the next run need not recover."""
        self._generation = rendezvous.generation()
        self._cut_mid_step = False

    def _next_epoch(self) -> None:
        """The feed began the next epoch of the data (a plain run's DataLoader ran out and starts again)."""
        self.epoch += 1

    def _commit(self) -> None:
        """The step in progress is done (taken, or skipped alike on every rank): one step less to go
        (counted with the step: ``step + skipped + left`` holds whatever fails after, a callback say)."""
        self.feed.commit()
        self._left -= 1

    def _rewrap(self, fresh: bool) -> None:
        """DDP's reducer, our gradient hook and the layout's mesh onto the current process group.

        ``fresh``: wrap the module anew (a rank joins, or a step was cut: DDP's gradient buckets must be
        laid out alike on every rank, and the ranks that trained on have them in the order their
        gradients came in, a new rank in the initial order). Names in the notebook that held the old
        wrapper hold the new one.
        """
        from dataclasses import replace

        from torch.nn.parallel import DistributedDataParallel as DDP

        from workbench.strategies.ddp import ddp
        from workbench.strategies.mesh import build_mesh

        layout, world = self.layout, _world()
        if layout.mesh is not None:
            layout.mesh = build_mesh({"dp": world}, self.device.type)
            layout.config = replace(layout.config, dp=world, data_parallel="ddp")
        # alone, no other rank's bucket order to match: the wrapper is moved, never left on the old group
        if isinstance(self.model, DDP) and (not fresh or world == 1):
            self.model._update_process_group(dist.group.WORLD)
            timer = getattr(self.model, "wb_comm", None)
            if timer is not None:
                timer.group = None  # the current world, looked up at each call
        elif world > 1:
            old, self.model = self.model, ddp(self.module, device=self.device)
            if isinstance(old, DDP):  # its reducer's hooks stay on the parameters: never expecting a gradient
                old.reducer._reset_state()
            self.model.wb_layout, layout.comm = layout, self.model.wb_comm
            self.optimizer.zero_grad(set_to_none=True)
            namespace = rendezvous.user_namespace()
            for name, value in list(namespace.items()):
                if value is old:
                    namespace[name] = self.model

    @torch.no_grad()
    def _copy_state_from(self, source: int) -> None:
        """Everything that makes a rank's training state (parameters, optimizer, scheduler, RNG, counters),
        from rank ``source`` to every rank."""
        from workbench.strategies.mesh import broadcast_module

        broadcast_module(self.module, src=source)
        state = broadcast_tree(self._state_to_copy(), source, self.device)
        if _rank() != source:
            self._take_copied_state(state)

    def _state_to_copy(self) -> dict:
        state = {"optim": self.optimizer.state_dict(), "rng": torch.get_rng_state(),
                 "counters": {"step": self.step, "skipped": self.skipped, "epoch": self.epoch}}
        if self.lr_scheduler is not None:
            state["scheduler"] = self.lr_scheduler.state_dict()
        return state

    def _take_copied_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        if "scheduler" in state:
            self.lr_scheduler.load_state_dict(state["scheduler"])
        c = state["counters"]
        self.step, self.skipped, self.epoch = c["step"], c["skipped"], c["epoch"]

    def hooks(self) -> list[Callback]:
        """The callbacks an event calls: the default ones registered now (the metrics publisher), then this
        Trainer's. Read at each event: a new engine builds its Trainer while replaying the notebook's setup,
        before its publisher connects, and its steps must reach the dashboard all the same. The publisher
        goes first: a step a callback of the user's fails in has ended, and its record is kept."""
        return [*default_callbacks, *self.callbacks]

    # -- the loop -------------------------------------------------------------------------
    def run(self, steps: int) -> RunResult:
        """Run up to ``steps`` synchronized steps; fewer only if some rank's data ran out.

        Raises :class:`TrainingInterrupted` on every rank at the same step when the notebook
        asked to stop (Ctrl-C); calling ``run`` again continues from there.
        """
        if REPLAY["on"]:  # a new engine replays the notebook's setup: its state will come from a peer
            return RunResult()
        self._check_every_rank()
        return self._run(steps)

    def _run(self, steps: int | None, **start) -> RunResult:
        """The loop of every Trainer; a subclass changes its steps (``start``: what its ``_start`` takes)."""
        self._before_run()
        result = RunResult()
        with self._running(**self._beacon()):
            self._start(steps, **start)
            while self._more():
                self._took(result, self._next_step())
        return result

    def _before_run(self) -> None:
        """After a fault (a step cut half-way, or the group re-formed since the last run): recover first."""
        generation = rendezvous.generation()
        if self._cut_mid_step or generation != self._generation:
            self._recover()
        self._generation = generation

    def _beacon(self) -> dict:
        """More for the beacon to say while the run goes (beside running and step)."""
        return {}

    def _start(self, steps: int) -> None:
        """The first step's batches, and the steps every rank agrees to take."""
        if self._pending is None and not self._exhausted:
            self._pending = self.feed.fetch(self)
        self._left = self._agree(steps)

    def _more(self) -> bool:
        return self._left > 0 and not self._exhausted

    def _next_step(self) -> StepStats | None:
        return self._train_step()

    def _check_every_rank(self) -> None:
        """Every step is a collective over the whole group: in a cell sent to some ranks only the others
        never come, and the ranks there would wait in their first collective until a timeout. Refused on
        entry instead, on each rank of the cell alike (nothing is started, the group stays as it is)."""
        cell = cell_targets.current_cell()
        world = dist.get_world_size() if dist.is_initialized() else 1
        if cell is None or len(cell[0]) >= world:
            return
        ranks, _ = cell
        raise ValueError(f"the {self.kind} (trainer.run) needs every rank: this cell runs on rank"
                         f"{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} of the {world} in "
                         "the process group, whose steps are collectives over all of them. Run it in a cell "
                         "without --ranks.")

    def _agree(self, steps: int) -> int:
        """One all-reduce on every rank at every run: whether some rank's data ran out, and the fewest
        steps any rank asked for. A hard stop may cut one rank after it took its next batch and another
        before (a collective only some ranks make ends the engines: gloo), and a count computed from
        ``trainer.step`` before this run evened the counters may differ by one between ranks."""
        flags = torch.tensor([float(self._pending is None), -float(steps)], dtype=torch.float64,
                             device=self._flag_device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        empty, negated = flags.cpu().tolist()
        self._exhausted, fewest = empty > 0, int(-negated)
        if fewest != steps:
            print(f"workbench: rank {_rank()} asked for {steps} steps, another rank for {fewest}: every rank "
                  "takes the fewest.", file=sys.stderr, flush=True)
        return fewest

    @contextmanager
    def _running(self, **status):
        """A run: callbacks told it starts and ends; the beacon says it runs (``status``: more to say)."""
        agent.clear_stop()
        self.stopped_at = None
        self.run_error = None  # what ends this run early (TrainingInterrupted, an error), for on_run_end
        for cb in self.hooks():
            cb.on_run_start(self)
        agent.trainer_says(fresh=True, running=True, step=self.step, **status)
        try:
            _memory_peaks(self.device)  # the first step's peak counts from here
            yield
        except BaseException as exc:
            self.run_error = exc
            raise
        finally:
            agent.trainer_says(running=False)
            for cb in self.hooks():
                cb.on_run_end(self)
            self.run_error = None  # its traceback would keep the step's tensors alive

    def _took(self, result: RunResult, stats: StepStats | None) -> None:
        """A step ended: keep its stats; every rank stops here together when someone asked."""
        if stats is not None:
            result.history.append(stats)
        if self.stopped_at is not None:
            raise TrainingInterrupted(self.stopped_at)

    def _recover(self) -> None:
        """After a fault: fresh gradients, equal parameters, and the wrapper on the current process group.

        A step cut off half-way (an error, a hard interrupt) leaves DDP's reducer mid-step (its hooks
        would fire "marked as ready twice"), and a re-formed group leaves every wrapper on a group
        that is gone. DDP is reset onto the current group and rank 0's parameters are broadcast (an
        optimizer step may have been cut on some ranks only). Every rank does this together: the
        kernel re-forms the group after any fault that cut a step. Wrappers that hold their group
        deeper (FSDP, tensor or pipeline parallel, DDP inside a composed mesh) raise one sentence
        saying what to run.
        """
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.optimizer.zero_grad(set_to_none=True)
        composed = self.layout.mesh is not None and self.layout.mesh.ndim > 1
        if isinstance(self.model, DDP) and not composed:
            # A fresh wrapper on every rank (rank 0's parameters and buffers): a rank cut inside backward
            # and one that finished the step hold DDP's gradient buckets in different orders (DDP rebuilds
            # them after its first iterations), so their next collectives would not match and gloo would
            # end the engine. Names in the notebook that held the old wrapper hold the new one.
            self._rewrap(fresh=True)
            self._take_furthest()
        elif self.layout.mesh is not None:
            raise InterruptedMidStep(
                "the process group was re-formed after a fault, and this sharded model (FSDP, tensor or "
                "pipeline parallel) still holds the old one: shard the model again (wb.shard(...)) and "
                "make a new Trainer, or wb.resume(...) from a checkpoint.")
        self._cut_mid_step = False

    def _take_furthest(self) -> None:
        """Every rank takes the training state of the rank that got furthest: a hard stop can cut one
        rank inside a step another finished (its counters and optimizer one step ahead). The cut rank
        had already taken that step's batch, so its data position agrees with the furthest rank's."""
        rank, world = dist.get_rank(), dist.get_world_size()
        key = torch.tensor([self.step * world + (world - 1 - rank)], dtype=torch.long)
        dist.all_reduce(key, op=dist.ReduceOp.MAX)  # the furthest step; its lowest rank on a tie
        self._copy_state_from(source=world - 1 - int(key.item()) % world)

    def _train_step(self) -> StepStats | None:
        t0 = time.perf_counter()
        self._cut_mid_step = True  # until the step ends cleanly: an exception or a hard interrupt in
        # between leaves the wrapper (DDP's reducer) half-way through it
        self.model.train()
        batches, self._pending = self._pending, None
        self.feed.take(self, batches)
        loss, share = self._forward_backward(batches)
        t_data = time.perf_counter()
        self._pending = self.feed.fetch(self)
        data_time = time.perf_counter() - t_data
        t_comm = time.perf_counter()
        holds_loss = self.layout.is_last_stage
        flags = self._flags(loss=share * holds_loss, holders=float(holds_loss),
                            nonfinite=float(holds_loss and not math.isfinite(loss)),
                            out_of_data=float(self._pending is None), stop=float(agent.stop_requested()),
                            checkpoint=float(agent.checkpoint_requested()))
        total = self._vote(flags)  # one all-reduce, and its wait: NCCL returns once it is enqueued
        comm = time.perf_counter() - t_comm
        mean_loss = total.mean_loss
        self._exhausted = bool(total.out_of_data)
        norm_ok, norm_comm = True, 0.0
        if not total.nonfinite and self.config.clip is not None:
            norm_ok, norm_comm = self._clip(self.config.clip)
        lr = self.optimizer.param_groups[0]["lr"]
        if total.nonfinite or not norm_ok:
            self.optimizer.zero_grad(set_to_none=True)
            self._commit()  # its samples are used up, as in a plain run
            self._cut_mid_step = False  # every rank drops this step the same way
            if total.stop:
                self.stopped_at = self.step
            if self.config.on_nonfinite == "raise":
                raise FloatingPointError(
                    f"non-finite {'loss' if total.nonfinite else 'gradient norm'} at step {self.step + 1} "
                    f"(mean loss {mean_loss}); no rank took the update. Lower lr or check the data.")
            self.skipped += 1
            return None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.step += 1
        self._commit()
        x, y = batches[0]
        samples = x.shape[0] * len(batches) * self.layout.dp_size
        tokens = y.numel() * len(batches) * self.layout.dp_size if not y.is_floating_point() else samples
        step_time = time.perf_counter() - t0
        explicit = comm + norm_comm
        stats = StepStats(step=self.step, loss=mean_loss, lr=lr, samples=samples, tokens=tokens,
                          step_time=step_time, compute_time=max(0.0, step_time - data_time - explicit),
                          comm_time=explicit + self.layout.comm.take() if self.layout.comm else explicit,
                          data_time=data_time, rank_loss=loss if holds_loss else math.nan,
                          **_memory_peaks(self.device))
        self.history.append(stats)
        if self.config.log_every and self.step % self.config.log_every == 0 and _rank() == 0:
            print(f"step {self.step:5d}  loss {mean_loss:.4f}  {samples / step_time:.0f} samples/s")
        self.checkpoint_asked = bool(total.checkpoint)
        try:
            for cb in self.hooks():
                cb.on_step_end(self, stats)
        finally:
            if self.checkpoint_asked:
                self._checkpoint_served()
        agent.trainer_status.update(step=self.step, step_time=step_time)
        self._cut_mid_step = False
        if total.stop:  # someone asked to stop: every rank saw the same sum, so every rank stops here
            self.stopped_at = self.step
        return stats

    def _checkpoint_served(self) -> None:
        """Every rank was asked to checkpoint at this step (its callbacks saw ``checkpoint_asked``): the
        request is served; without a callback that saves, rank 0 says nothing was saved."""
        self.checkpoint_asked = False
        reason = agent.checkpoint_taken()
        if _rank() == 0 and not any(getattr(cb, "saves_when_asked", False) for cb in self.hooks()):
            why = reason or "by the notebook"
            print(f"workbench: a checkpoint was asked for at step {self.step} ({why}), and this Trainer has "
                  "no wb.Checkpoint callback: nothing was saved.", flush=True)

    def _flags(self, **facts) -> StepFlags:
        """This rank's flags at the end of a step."""
        return StepFlags(**facts)

    def _vote(self, flags: StepFlags) -> StepFlags:
        """Every rank's ``flags`` summed (one all-reduce)."""
        return type(flags).of(_world_sum(flags.tensor(self._flag_device)))

    def _forward_backward(self, batches) -> tuple[float, float]:
        """Mean loss of this rank's batches (nan on pipeline stages that hold no loss), and its share of the
        step's mean: the loss weighted as its gradient is (an elastic rank's uneven share of the global
        batch), so that the mean of the shares over the ranks is the loss of the whole batch."""
        n = len(batches)
        total = 0.0
        if isinstance(self.model, Pipelined):
            for x, y in batches:
                with self._autocast:  # the same precision as every other strategy
                    loss = self.model.step(x, y)
                total += loss.item() if loss is not None else 0.0
            if n > 1:
                for p in self.module.parameters():
                    if p.grad is not None:
                        p.grad.div_(n)
            return total / n, total / n
        share = 0.0
        for i, batch in enumerate(batches):
            x, y = batch
            last = i == n - 1
            weight = getattr(batch, "weight", 1.0)  # an elastic rank's uneven share
            with self._sync(last), self._autocast:
                loss = self.loss_fn(self.model(x), y)
            (loss * weight / n).backward()
            total += loss.item()
            share += loss.item() * weight
        return total / n, share / n

    def _sync(self, last: bool):
        if hasattr(self.model, "no_sync") and not last:
            return self.model.no_sync()
        if hasattr(self.module, "set_requires_gradient_sync"):
            self.module.set_requires_gradient_sync(last)
        return nullcontext()

    def _clip(self, max_norm: float) -> tuple[bool, float]:
        """Clip by the global grad norm (over shards and stages); (finite?, comm seconds).

        One reduction per device mesh (DTensor grads reduce their partial norms together, not one
        collective per parameter), one over the pipeline stages, one host sync for the finite check.
        """
        t0 = time.perf_counter()
        groups = _by_mesh([p for p in self.module.parameters() if p.grad is not None])
        norm = _grad_norm(groups, self.device, self.layout.group("pp") if self.layout.pp > 1 else None)
        finite = bool(torch.isfinite(norm))
        comm = time.perf_counter() - t0
        if finite:
            for params in groups.values():  # torch's foreach kernels take DTensors or tensors, not both
                torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return finite, comm

    # -- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Model, optimizer, step, data position and this rank's RNG (for DCP save)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self._sd_module(), self.optimizer)
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        counters = {"step": self.step, "epoch": self.epoch, "skipped": self.skipped, **self.feed.counters()}
        return {"model": model_sd, "optim": optim_sd, "trainer": counters, "rng": {f"rank{_rank()}": rng}}

    def load_state_dict(self, state: dict) -> None:
        """The reverse of :meth:`state_dict`; the data restarts where the saved run stood."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self._sd_module(), self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        t = state.get("trainer", {})
        self.step, self.epoch = int(t.get("step", 0)), int(t.get("epoch", 0))
        self.skipped = int(t.get("skipped", 0))
        rng = state.get("rng", {}).get(f"rank{_rank()}")
        if rng:
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"])
        self._pending, self._exhausted = None, False
        self.feed.restore(self, t)

    def _sd_module(self) -> nn.Module:
        return self.module if isinstance(self.model, Pipelined) else self.model


@functools.cache
def _elastic_form(cls: type) -> type:
    """The class ``cls(..., elastic=...)`` makes: :class:`~workbench.train.elastic_trainer.ElasticTrainer`
    (for a subclass of the Trainer, the two combined)."""
    from workbench.train.elastic_trainer import ElasticTrainer

    if issubclass(cls, ElasticTrainer):
        return cls
    if cls is Trainer:
        return ElasticTrainer
    return type(f"Elastic{cls.__name__}", (ElasticTrainer, cls), {"__module__": cls.__module__})


def _make_optimizer(model: nn.Module, c: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if c.optim == "sgd":
        return torch.optim.SGD(params, lr=c.lr, weight_decay=c.weight_decay)
    return torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay)


def _autocast(precision: str, device: torch.device):
    """bf16 autocast for "bf16", and for "auto" on a GPU that does bf16 natively (not emulated)."""
    if precision == "auto":
        use = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    else:
        use = precision == "bf16"
    return torch.autocast(device.type, dtype=torch.bfloat16) if use else nullcontext()


def _flag_device(device: torch.device) -> torch.device:
    """Where the per-step flags live: the GPU when the group reduces CUDA tensors with NCCL (an NCCL-only
    group has no CPU backend at all), else the CPU."""
    nccl = dist.is_initialized() and "nccl" in str(dist.get_backend())
    return device if device.type == "cuda" and nccl else torch.device("cpu")


def _by_mesh(params: list[torch.Tensor]) -> dict:
    """Parameters grouped by the device mesh of their gradient (None: plain tensors)."""
    from torch.distributed.tensor import DTensor

    groups: dict = {}
    for p in params:
        groups.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    return groups


def _grad_norm(groups: dict, device: torch.device, pp_group=None) -> torch.Tensor:
    """The 2-norm over the gradients of every group of :func:`_by_mesh`, summed over ``pp_group``
    (on ``device`` on every stage, so the stages' reduction meets on one backend)."""
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for mesh, params in groups.items():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        if mesh is not None:
            norm = norm.full_tensor()  # one reduction of the partial norms on this mesh
        sq = sq + norm.to(device).double() ** 2
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    return sq.sqrt()


def _memory_peaks(device: torch.device) -> dict:
    """Peak allocated and reserved CUDA bytes since the last call (then reset); nothing on the CPU."""
    if device.type != "cuda":
        return {}
    peaks = {"mem_peak": torch.cuda.max_memory_allocated(device),
             "mem_reserved_peak": torch.cuda.max_memory_reserved(device)}
    torch.cuda.reset_peak_memory_stats(device)
    return peaks


def _world_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


__all__ = ["InterruptedMidStep", "RunResult", "StepFlags", "TrainConfig", "Trainer", "TrainingInterrupted"]
