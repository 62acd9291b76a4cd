"""A sweep: one training function, many configurations, as many trials at once as the pool's sub-meshes hold.

:class:`Sweep` splits the pool into sub-meshes of ``ranks_per_trial`` ranks (:meth:`Session.split`), runs
one configuration's trial as a cell on each (:meth:`Session.submit` with ``on=``), hands a finished trial's
sub-mesh to the next configuration, and joins the pool at the end, also when a trial fails or the sweep is
stopped. Inside a trial ``rank``, ``world_size`` and the default process group are the sub-mesh's, so the
training function is the same code that trains on a whole pool. A trial is ``train(**config)`` on every
rank of its sub-mesh; what rank 0 returns (a dict of final metrics) is the trial's result. The scheduling
itself is :func:`slots` and :func:`configs_checked` (pure); the rest is the session's own verbs.

>>> slots(4, 2), slots(5, 2), slots(4, 4)
(['sweep0', 'sweep1'], ['sweep0', 'sweep1', 'spare'], [])
>>> print(Results([Trial(0, {"lr": 0.1}, "done", metrics={"loss": 0.5}, seconds=1.25, mesh="sweep0",
...                      ranks=[0, 1])]))
trial  status  mesh    ranks  seconds  config  loss  error
0      done    sweep0  0-1    1.25     lr=0.1  0.5
"""

from __future__ import annotations

import html
import inspect
import logging
import queue
import shutil
import textwrap
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import remote
from workbench.errors import CellInterrupted, CellTimeout, RankError
from workbench.pool.rankmap import format_ranks
from workbench.remote.door import call_text
from workbench.session.sweep_optuna import Search
from workbench.tables import format_table

if TYPE_CHECKING:
    from workbench.session.results import CellResult
    from workbench.session.session import Session

log = logging.getLogger(__name__)

STATUSES = ("pending", "running", "done", "failed", "stopped", "pruned")
SPARE = "spare"  # the sub-mesh of the ranks left over when ranks_per_trial does not divide the pool
RESULT = "_wb_sweep_result"  # the name each trial's result has on its ranks (pulled from the first)
CHECKPOINT = "checkpoint"  # the key of a trial's returned dict that is its checkpoint, not a metric
STATE = "_wb_sweep_checkpoint"  # a finished trial's checkpoint on rank 0 of its sub-mesh, until written
KEEP = ("best", "all")


def slots(world: int, ranks_per_trial: int) -> list[str]:
    """The sub-meshes a sweep splits ``world`` ranks into, in rank order: one ``sweepN`` per trial that fits
    at once, then ``spare`` for the ranks left over (idle through the sweep). ``[]``: one trial fills the
    pool, which is not split (its trials run one after the other on the whole pool)."""
    count, left = divmod(world, ranks_per_trial)
    if count == 1 and not left:
        return []
    return [f"sweep{i}" for i in range(count)] + ([SPARE] if left else [])


def check_size(ranks_per_trial: int, world: int) -> None:
    """A ``ValueError`` saying what fits when ``ranks_per_trial`` is no trial size for a pool of ``world``."""
    if not isinstance(ranks_per_trial, int) or isinstance(ranks_per_trial, bool) or ranks_per_trial < 1:
        raise ValueError(f"ranks_per_trial must be a whole number of ranks, at least 1 (got "
                         f"{ranks_per_trial!r}): e.g. ranks_per_trial=1 runs {world} trials at once on this "
                         f"pool of {world}.")
    if ranks_per_trial > world:
        raise ValueError(f"ranks_per_trial={ranks_per_trial} is more than the pool's {world} ranks: ask for "
                         f"at most {world} (`%dist scale {ranks_per_trial}` grows the pool).")


def configs_checked(configs) -> list[dict[str, Any]]:
    """The configurations as a list of dicts, each a trial's keyword arguments of plain values (numbers,
    strings, booleans, None, and lists, tuples and dicts of them: they are written into the trial's cell).

    >>> configs_checked([{"lr": 0.1}, {"lr": 0.01, "steps": 20}])
    [{'lr': 0.1}, {'lr': 0.01, 'steps': 20}]
    >>> configs_checked([])
    Traceback (most recent call last):
    ...
    ValueError: a sweep needs at least one configuration: e.g. configs=[{"lr": 0.1}, {"lr": 0.01}].
    """
    example = 'e.g. configs=[{"lr": 0.1}, {"lr": 0.01}].'
    if isinstance(configs, dict):
        raise ValueError(f"configs is a list of dicts, one per trial: {example}")
    configs = list(configs)
    if not configs:
        raise ValueError(f"a sweep needs at least one configuration: {example}")
    for i, config in enumerate(configs):
        if not isinstance(config, dict):
            raise ValueError(f"configuration {i} is {config!r}, not a dict of keyword arguments: e.g. "
                             "{\"lr\": 0.1}.")
        for key, value in config.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise ValueError(f"configuration {i}: {key!r} is no keyword argument name (letters, digits, "
                                 "_).")
            try:
                call_text(value)  # a literal: it is written into the trial's cell
            except TypeError:
                raise ValueError(f"configuration {i}: {key}={value!r} is not a plain value (a number, "
                                 "string, bool, None, or a list, tuple or dict of them); make it one, or "
                                 "build the object inside the training function from a plain "
                                 "value.") from None
    return [dict(c) for c in configs]


def trial_source(train) -> tuple[str, str]:
    """``(name, source)`` of the training function: a name (a function defined on the ranks in an earlier
    ``%%distributed`` cell; no source to send) or a function of the notebook, whose source is sent with each
    trial (it must be self-contained: its imports inside it, no closure over the notebook's variables)."""
    if isinstance(train, str):
        if not train.isidentifier():
            raise ValueError(f"train={train!r} is no function name: give the name of a function defined on "
                             "the ranks (in a %%distributed cell), or the function itself.")
        return train, ""
    if not callable(train) or not inspect.isfunction(train) or train.__name__ == "<lambda>":
        raise ValueError("train is a function defined with `def` (its source goes to the ranks) or the name "
                         f"of one defined on the ranks in a %%distributed cell; got {train!r}.")
    try:
        source = textwrap.dedent(inspect.getsource(train))
    except (OSError, TypeError):
        raise ValueError(f"the source of {train.__name__} cannot be read here: define it in a %%distributed "
                         f"cell and pass its name, train={train.__name__!r}.") from None
    return train.__name__, source


def trial_code(name: str, source: str, config: dict[str, Any], checkpoint: bool = False) -> str:
    """The cell of one trial: the function (where its source is sent), called with the configuration; its
    result on every rank as plain Python (tensors and numpy values through ``tolist()``), so the kernel never
    unpickles a tensor. The result's ``"checkpoint"`` (a state dict, say) is no metric: where the sweep keeps
    checkpoints, rank 0 of the sub-mesh keeps it as ``_wb_sweep_checkpoint`` (the sweep writes it once the
    trial is done: :func:`workbench.remote.save_trial_checkpoint`); else it is dropped.

    >>> print(trial_code("train", "", {"lr": 0.1}, checkpoint=True))
    _wb_sweep_result = _wb_sweep_checkpoint = None
    _wb_sweep_result = train(lr=0.1)
    if not isinstance(_wb_sweep_result, dict):
        _wb_sweep_result = {} if _wb_sweep_result is None else {'value': _wb_sweep_result}
    _wb_sweep_checkpoint = _wb_sweep_result.pop('checkpoint', None)
    if rank != 0:
        _wb_sweep_checkpoint = None
    _wb_sweep_result = {str(k): getattr(v, 'tolist', lambda: v)() for k, v in _wb_sweep_result.items()}
    """
    lines = [f"{RESULT} = {STATE} = None"]
    if source:
        lines.append(source.rstrip("\n"))
    lines += [f"{RESULT} = {name}({call_text(**config)})",
              f"if not isinstance({RESULT}, dict):",
              f"    {RESULT} = {{}} if {RESULT} is None else {{'value': {RESULT}}}",
              f"{STATE} = {RESULT}.pop({CHECKPOINT!r}, None)"]
    if checkpoint:
        lines += ["if rank != 0:", f"    {STATE} = None"]
    else:
        lines += [f"{STATE} = None"]
    lines += [f"{RESULT} = {{str(k): getattr(v, 'tolist', lambda: v)() for k, v in {RESULT}.items()}}"]
    return "\n".join(lines)


def checkpoint_folder(checkpoint_dir, keep: str, metric: str | None) -> Path | None:
    """The sweep's checkpoint folder, made and absolute (the ranks may run elsewhere than the kernel's working
    folder), or None without one; a ``ValueError`` saying what fits for a ``keep`` that is neither ``"best"``
    nor ``"all"``, ``keep="best"`` without the ``metric`` that says which is best, or a path that is no
    folder.

    >>> checkpoint_folder(None, "best", None) is None
    True
    >>> checkpoint_folder("/tmp/s", "last", "loss")
    Traceback (most recent call last):
    ...
    ValueError: keep is 'best' (the best trial's checkpoint, the others removed) or 'all', not 'last'.
    """
    if keep not in KEEP:
        raise ValueError(f"keep is 'best' (the best trial's checkpoint, the others removed) or 'all', not "
                         f"{keep!r}.")
    if checkpoint_dir is None:
        return None
    if keep == "best" and metric is None:
        raise ValueError("keep='best' keeps the checkpoint of the trial with the best final metric: name "
                         "it, e.g. metric=\"loss\" (mode=\"min\" or \"max\"), or keep every one with "
                         "keep=\"all\".")
    folder = Path(checkpoint_dir).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"checkpoint_dir={str(checkpoint_dir)!r} is a file, not a folder: name a folder "
                         "(made if missing); each trial's checkpoint goes to trial-N/checkpoint.pt in it.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"checkpoint_dir={str(checkpoint_dir)!r} cannot be made: {exc.strerror or exc}; "
                         "name a folder you can write.") from None
    return folder


@dataclass
class Trial:
    """One configuration's trial: its status (one of :data:`STATUSES`), the sub-mesh and pool ranks it ran
    on, rank 0's final metrics, its wall time in seconds, the error of a failed one, and the path of its
    checkpoint (None: it returned none, the sweep has no ``checkpoint_dir``, or the checkpoint was removed:
    not the best, or the trial did not finish)."""

    index: int
    config: dict[str, Any]
    status: str = "pending"
    metrics: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None
    mesh: str | None = None
    ranks: list[int] = field(default_factory=list)
    error: str | None = None
    checkpoint: str | None = None
    cell: CellResult | None = field(default=None, repr=False)  # every rank's output and outcome

    def row(self) -> dict[str, Any]:
        """The trial as one flat dict: config keys and metric keys beside the trial's own."""
        return {"trial": self.index, "status": self.status, "mesh": self.mesh,
                "ranks": format_ranks(self.ranks) if self.ranks else "", "seconds": self.seconds,
                "config": dict(self.config), **self.metrics, "error": self.error,
                "checkpoint": self.checkpoint}


class Results(list):
    """The trials of a sweep in configuration order (a list of :class:`Trial`), shown as a table."""

    def rows(self) -> list[dict[str, Any]]:
        return [t.row() for t in self]

    def best(self, metric: str, mode: str = "min") -> Trial:
        """The done trial with the lowest (``mode="min"``) or highest (``"max"``) final ``metric``."""
        if mode not in ("min", "max"):
            raise ValueError(f"mode is 'min' or 'max', not {mode!r}.")
        scored = [t for t in self if t.status == "done" and isinstance(t.metrics.get(metric), (int, float))]
        if not scored:
            have = sorted({k for t in self for k in t.metrics})
            raise ValueError(f"no finished trial has a number {metric!r}; the metrics are: "
                             f"{', '.join(have) or 'none (no trial is done)'}.")
        pick = min if mode == "min" else max
        return pick(scored, key=lambda t: t.metrics[metric])

    def _cells(self) -> tuple[list[str], list[dict[str, str]]]:
        metrics = list(dict.fromkeys(k for t in self for k in t.metrics))
        columns = ["trial", "status", "mesh", "ranks", "seconds", "config", *metrics, "error"]
        if any(t.checkpoint for t in self):
            columns.append("checkpoint")
        rows = []
        for t in self:
            row = t.row()
            row["config"] = ", ".join(f"{k}={v!r}" for k, v in t.config.items())
            row["seconds"] = "" if t.seconds is None else f"{t.seconds:.2f}"
            for key in ("trial", "status", "mesh", "ranks", "error", "checkpoint", *metrics):
                value = row.get(key)
                row[key] = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
            rows.append(row)
        return columns, rows

    def __str__(self) -> str:
        return format_table(*reversed(self._cells()))

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        columns, rows = self._cells()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(r.get(c, ''))}</td>" for c in columns) + "</tr>"
                       for r in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Sweep:
    """Train one function on many configurations, as many trials at once as the pool has sub-meshes of
    ``ranks_per_trial`` ranks.

    ``train``: the name of a function defined on the ranks (an earlier ``%%distributed`` cell), or a
    self-contained function of the notebook (its source is sent). Each trial calls ``train(**config)`` on
    every rank of its sub-mesh, where ``rank``, ``world_size`` and the default group are the sub-mesh's; the
    dict rank 0 returns is the trial's final metrics. ``configs``: a list of dicts of plain values. Ranks
    left over (``ranks_per_trial`` not dividing the pool) wait in a sub-mesh ``spare``. A trial that raises is
    recorded as failed with its error and the sweep goes on. At the end (done, failed or stopped) the pool
    is joined: one group of all again, nothing left running. ``session``: default the current one;
    ``timeout``: each trial's, in seconds (a hang fails that trial only).

    With an Optuna ``study`` (the ``optuna`` extra), ``configs`` is the search space instead: a dict of Optuna
    distributions, or a function of the Optuna trial that calls its ``suggest_*`` and returns the config;
    ``n_trials`` configurations are asked of the study as sub-meshes come free, each trial's final
    ``metric`` is told to it, and its pruner (``optuna.create_study(pruner=...)``) sees each running trial's
    live training loss (a ``wb.Trainer``'s steps, rank 0 of its sub-mesh, every ``poll`` seconds): a trial
    it prunes is interrupted at its next step and ends ``pruned``
    (:mod:`workbench.session.sweep_optuna`).

    ``metric`` and ``mode`` (``"min"`` or ``"max"``; a study's direction with a study) say which trial is
    best (:meth:`best`). ``checkpoint_dir``: a folder (made if missing) where each trial's checkpoint goes,
    ``trial-N/checkpoint.pt``: what ``train`` returns under ``"checkpoint"`` (a state dict, say; it is no
    metric), written by rank 0 of its sub-mesh with ``torch.save``, complete or not at all. ``keep="best"``
    (default) keeps only the best trial's by ``metric``, removing the others' as trials end; ``"all"`` keeps
    every finished trial's. A failed, pruned or stopped trial leaves none. The path is the trial's
    ``checkpoint`` (``None`` where removed): ``torch.load(sweep.best().checkpoint, weights_only=True)``, in
    the notebook or on the ranks.

    >>> # %%distributed: def train(lr, steps=20): ...; return {"loss": final_loss}
    >>> configs = [{"lr": 0.1}, {"lr": 0.03}, {"lr": 0.01}]
    >>> sweep = wb.Sweep("train", configs, ranks_per_trial=2)       # doctest: +SKIP
    >>> sweep.run()                                 # doctest: +SKIP
    trial  status  mesh    ranks  seconds  config   loss   error
    0      done    sweep0  0-1    3.10     lr=0.1   1.873
    1      done    sweep1  2-3    3.12     lr=0.03  2.104
    2      done    sweep0  0-1    3.05     lr=0.01  2.811
    >>> sweep.best("loss").config                   # doctest: +SKIP
    {'lr': 0.1}
    >>> sweep.start(); sweep.stop()                 # doctest: +SKIP
    >>> study = optuna.create_study(pruner=optuna.pruners.MedianPruner())          # doctest: +SKIP
    >>> space = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)}  # doctest: +SKIP
    >>> sweep = wb.Sweep("train", space, 2, study=study, n_trials=6, metric="loss")  # doctest: +SKIP
    >>> sweep.run()                                 # doctest: +SKIP
    """

    def __init__(self, train: str | Callable, configs, ranks_per_trial: int, *,
                 session: Session | None = None, timeout: float | None = None, study=None,
                 n_trials: int | None = None, metric: str | None = None, mode: str | None = None,
                 checkpoint_dir=None, keep: str = "best", poll: float = 0.25):
        from workbench.session.session import current

        self.session = session if session is not None else current()
        self.name, self.source = trial_source(train)
        self.ranks_per_trial = ranks_per_trial
        self.timeout = timeout
        self.search: Search | None = None
        self.poll = poll  # how often the running trials' losses go to the study's pruner, s
        if study is None:
            if n_trials is not None:
                raise ValueError("n_trials goes with a study (study=optuna.create_study(...)); without one "
                                 "the sweep runs each of configs once.")
            self.trials = Results(Trial(i, c) for i, c in enumerate(configs_checked(configs)))
        else:
            self.search = Search(study, configs, n_trials, metric)
            self.trials = Results()  # asked of the study as sub-meshes come free
            if mode is not None and mode != self.search.mode:
                raise ValueError(f"mode={mode!r} but the study is to {self.search.mode}imize: leave mode out "
                                 "(the study's direction is the sweep's).")
            mode = self.search.mode
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode is 'min' or 'max', not {mode!r}.")
        self.metric, self.mode = metric, mode or "min"  # which trial is best
        self._pending = deque(self.trials)
        self._check_pool()
        self.checkpoint_dir = checkpoint_folder(checkpoint_dir, keep, metric)  # last: it makes the folder
        self.keep = keep
        self._events: queue.Queue = queue.Queue()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._runs_before: dict[int, int] = {}  # trial index -> the newest metrics run when it started
        self._runs: dict[int, int] = {}  # trial index -> the metrics run its Trainer trained, once seen
        self._live: set[int] = set()  # trials running now (their sub-mesh's newest run may be theirs)
        self._runs_lock = threading.Lock()
        self._watchers: list[Callable[[Trial | None], None]] = []
        self._pruning: set[int] = set()  # trials the study's pruner stopped

    def _check_pool(self) -> None:
        check_size(self.ranks_per_trial, self.session.world_size)
        if self.session.meshes:
            raise ValueError(f"the pool is split already ({', '.join(self.session.meshes)}): `%dist join` "
                             "(Session.join()) first; the sweep splits it for its trials and joins it after.")

    # -- the face ----------------------------------------------------------------------------------------
    def run(self) -> Results:
        """Run every trial and return the results once all ended (Ctrl-C stops the sweep: its trials stop,
        the pool is joined, and the interrupt goes on)."""
        self.start()
        try:
            return self.wait()
        except KeyboardInterrupt:
            self.stop()
            raise

    def start(self) -> Sweep:
        """Split the pool and start the first trials; return at once (:meth:`wait`, :meth:`stop`)."""
        if self._thread is not None:
            raise ValueError("this sweep was started already: make a new Sweep to run it again.")
        self._check_pool()
        meshes = slots(self.session.world_size, self.ranks_per_trial)
        if meshes:
            sizes = [self.ranks_per_trial] * (len(meshes) - (SPARE in meshes))
            if SPARE in meshes:
                sizes.append(self.session.world_size - sum(sizes))
            plan = self.session.split(sizes, names=meshes)
            free = [(name, plan[name]) for name in meshes if name != SPARE]
        else:
            free = [(None, [r.rank for r in self.session.ranks])]
        self._thread = threading.Thread(target=self._drive, args=(free,), name="workbench-sweep", daemon=True)
        self._thread.start()
        return self

    def done(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> Results:
        """The results once every trial ended and the pool is joined; ``TimeoutError`` if that takes longer
        than ``timeout``. An error of the sweep itself (not of a trial: a split or a join refused) is raised
        here; the trials are in :attr:`results` all the same."""
        if self._thread is None:
            raise ValueError("this sweep has not started: sweep.start() or sweep.run().")
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the sweep is still running after {timeout} s: sweep.stop() stops it.")
        if self._error is not None:
            raise self._error
        return self.results

    def stop(self, hard: bool = False, timeout: float | None = 60.0) -> Results:
        """Stop the sweep: no new trial starts, the running ones are interrupted (as Ctrl-C would: a Trainer
        at its next step; ``hard``: at once), the pool is joined; returns the results."""
        self._stopping = True
        self._events.put(("stop", hard))
        if self._thread is None:
            return self.results
        return self.wait(timeout)

    def watch(self, fn: Callable[[Trial | None], None]) -> None:
        """Call ``fn(trial)`` on the sweep's thread when a trial starts or ends, and ``fn(None)`` once the
        sweep ended (the pool joined, every trial's status final): how a view (the comparison dashboard,
        :mod:`workbench.widgets.sweep_dashboard`) follows it. Watch before :meth:`start`."""
        self._watchers.append(fn)

    def _tell_watchers(self, trial: Trial | None) -> None:
        for fn in list(self._watchers):
            try:
                fn(trial)
            except Exception:  # a view that fails never stops the sweep
                log.exception("a sweep watcher failed")

    def run_of(self, trial: Trial) -> int | None:
        """The id of the metrics run (``session.metrics``) that ``trial``'s ``wb.Trainer`` trained, or None
        (not started yet, or it trains no Trainer): the newest run on its ranks that began after it started,
        kept once seen while the trial runs or when it ends (then its sub-mesh goes to the next trial)."""
        collector = self.session.metrics
        with self._runs_lock:  # never after its sub-mesh went on: the newest run there is the next trial's
            if trial.index in self._live and trial.index not in self._runs and collector is not None:
                run = collector.latest_run(trial.ranks)
                if run is not None and run.id > self._runs_before.get(trial.index, 0):
                    self._runs[trial.index] = run.id  # else its Trainer has not started yet
            return self._runs.get(trial.index)

    @property
    def results(self) -> Results:
        """The trials now, in configuration order (a copy)."""
        return Results(Trial(**{**t.__dict__, "config": dict(t.config), "metrics": dict(t.metrics),
                                "ranks": list(t.ranks)}) for t in self.trials)

    def best(self, metric: str | None = None, mode: str | None = None) -> Trial:
        """The done trial with the best final ``metric`` (:meth:`Results.best`); by default the sweep's
        ``metric`` and ``mode``."""
        metric = metric if metric is not None else self.metric
        if metric is None:
            raise ValueError("which metric? sweep.best(\"loss\"), or Sweep(..., metric=\"loss\").")
        return self.results.best(metric, mode if mode is not None else self.mode)

    def __repr__(self) -> str:
        return repr(self.results)

    def _repr_html_(self) -> str:
        return self.results._repr_html_()

    # -- the scheduler (its own thread) ------------------------------------------------------------------
    def _drive(self, free: list[tuple[str | None, list[int]]]) -> None:
        slots_free = deque(free)
        running: dict[int, tuple[Trial, Any, float, tuple]] = {}  # trial index -> trial, handle, t0, slot
        try:
            while running or (self._more() and slots_free and not self._stopping):
                while slots_free and self._more() and not self._stopping:
                    trial = self._next()
                    slot = slots_free.popleft()
                    running[trial.index] = (trial, *self._launch(trial, slot), slot)
                try:
                    event = self._events.get(timeout=self.poll if self.search else None)
                except queue.Empty:  # a study's pruner looks at the running trials' losses
                    self._prune(running)
                    continue
                if event[0] == "stop":
                    for _trial, handle, _t0, _slot in running.values():
                        handle.interrupt(hard=event[1])
                    continue
                _, index, ended = event
                trial, handle, t0, slot = running.pop(index)
                trial.seconds = ended - t0
                self._finish(trial, handle)
                dead = sorted(set(slot[1]) & set(self.session.dead_ranks()))
                if dead:  # not handed on: its next trial would fail at once (`%dist restart` brings it back)
                    self.session.notify(f"workbench: sweep: rank {format_ranks(dead)} of sub-mesh {slot[0]} "
                                        "is dead; its sub-mesh takes no more trials.")
                else:
                    slots_free.append(slot)
        except BaseException as exc:  # the sweep's own failure: stop what runs, then join below
            self._error = exc
            for trial, handle, _t0, _slot in running.values():
                handle.interrupt()
                try:
                    handle.wait(60)
                except BaseException:  # its own error is the trial's; the sweep's is the one said
                    pass
                trial.status, trial.error = "stopped", f"the sweep failed: {type(exc).__name__}: {exc}"
                self._told(trial)
        finally:
            for trial in self._pending:  # never started: the sweep stopped, failed, or lost its sub-meshes
                trial.status = "stopped"
                trial.error = None if self._stopping else "not started: no sub-mesh left to run it on"
            for trial in self.trials:  # those the sweep's own failure stopped leave no checkpoint either
                if trial.status != "done" and trial.mesh is not None:
                    self._remove_checkpoint(trial)
            try:
                if self.session.meshes:
                    self.session.join()
            except BaseException as exc:  # e.g. a dead rank: `%dist restart`, then `%dist join`
                self._error = self._error or exc
            for trial in self.trials:  # those the sweep's own failure stopped: their runs kept too
                self.run_of(trial)
            self._live.clear()
            self._tell_watchers(None)
            self._finished.set()

    def _more(self) -> bool:
        """Whether another trial is to start: a configuration not run yet, or a study with trials to ask."""
        if self.search is None:
            return bool(self._pending)
        return len(self.trials) < self.search.n_trials

    def _next(self) -> Trial:
        """The next trial: the next configuration, or the study's next suggestion."""
        if self.search is None:
            return self._pending.popleft()
        index = len(self.trials)
        config = self.search.ask(index)
        try:
            [config] = configs_checked([config])
        except ValueError:
            self.search.tell(index, "failed", {})
            raise
        trial = Trial(index, config)
        self.trials.append(trial)
        return trial

    def _prune(self, running: dict) -> None:
        """Each running trial's new training losses (rank 0 of its sub-mesh, from the live metrics) to the
        study; a trial its pruner stops is interrupted at its next step and ends ``pruned``."""
        collector = self.session.metrics
        if collector is None:
            return
        for trial, handle, _t0, _slot in running.values():
            if trial.index in self._pruning:
                continue
            run = self.run_of(trial)
            if run is None:
                continue  # its Trainer has not started yet
            with collector.lock():
                series = collector.step_series(run).get(trial.ranks[0])
                steps, losses = (series.column("step"), series.column("loss")) if series else ([], [])
            if self.search.should_prune(trial.index, steps, losses):
                self._pruning.add(trial.index)
                handle.interrupt()

    def _told(self, trial: Trial) -> None:
        """A study hears how the trial ended."""
        if self.search is not None and trial.index in self.search.asked:
            self.search.tell(trial.index, trial.status, trial.metrics)

    def _launch(self, trial: Trial, slot: tuple[str | None, list[int]]) -> tuple[Any, float]:
        mesh, ranks = slot
        trial.mesh, trial.ranks, trial.status = mesh, list(ranks), "running"
        collector = self.session.metrics
        if collector is not None and collector.runs:  # the trial's Trainer run comes after these
            self._runs_before[trial.index] = collector.runs[-1].id
        if self.checkpoint_dir is not None:  # one of an earlier sweep in the same folder is not this trial's
            self._remove_checkpoint(trial)
        t0 = time.perf_counter()
        try:
            code = trial_code(self.name, self.source, trial.config, self.checkpoint_dir is not None)
            handle = self.session.submit(code,
                                         on=mesh, timeout=self.timeout)
        except BaseException as exc:  # the pool is gone, say: the sweep's failure (raised by wait())
            trial.status, trial.error = "failed", f"{type(exc).__name__}: {exc}"
            self._told(trial)
            raise
        index = trial.index
        self._live.add(index)
        handle.add_done_callback(lambda _h: self._events.put(("ended", index, time.perf_counter())))
        self._tell_watchers(trial)
        return handle, t0

    def _finish(self, trial: Trial, handle) -> None:
        """Record how a trial's cell ended (done with rank 0's metrics, failed with its error, stopped, or
        pruned: its study's pruner stopped it), and tell the study."""
        self._ended(trial, handle)
        if trial.index in self._pruning:
            trial.status, trial.error = "pruned", f"pruned after step {self.search.reported[trial.index]}"
        self._keep_checkpoints(trial)
        self._told(trial)
        self.run_of(trial)  # its run, kept before its sub-mesh goes to the next trial
        with self._runs_lock:
            self._live.discard(trial.index)
        self._tell_watchers(trial)

    def _ended(self, trial: Trial, handle) -> None:
        try:
            trial.cell = handle.wait(0)
        except (RankError, CellTimeout, CellInterrupted) as exc:
            stopped = isinstance(exc, CellInterrupted) and self._stopping
            trial.cell, trial.status = exc.result, "stopped" if stopped else "failed"
            trial.error = "stopped by Sweep.stop()" if stopped else _error_text(exc)
            return
        except Exception as exc:  # e.g. a dead rank refused before the cell: this trial failed, said how
            trial.status, trial.error = "failed", f"{type(exc).__name__}: {exc}"
            return
        try:
            [metrics] = self.session.view([trial.ranks[0]]).pull(RESULT)
        except Exception as exc:
            trial.status, trial.error = "failed", f"its result could not be read: {type(exc).__name__}: {exc}"
            return
        trial.metrics, trial.status = dict(metrics or {}), "done"

    # -- checkpoints: written by rank 0 of a done trial; the kernel removes what is not kept (the folder is
    # one it sees) ---------------------------------------------------------------------------------------
    def _save_checkpoint(self, trial: Trial) -> None:
        """A done trial's checkpoint (what its ``train`` returned under ``"checkpoint"``, kept on rank 0 of
        its sub-mesh) written to ``trial-N/checkpoint.pt``; with ``keep="best"`` only where it is the best
        done trial so far (else it would be removed at once: it is only let go of on the rank). A failed
        write fails the trial, saying why."""
        kept = self.keep == "all" or self._best_done() is trial
        path = str(self._folder(trial) / "checkpoint.pt") if kept else None
        [rank0] = self.session.targets([trial.ranks[0]])
        try:
            door = self.session.rooms.door
            trial.checkpoint = door.call_one(remote.save_trial_checkpoint, rank0, STATE, path)
        except Exception as exc:
            trial.status = "failed"
            trial.error = f"its checkpoint could not be written: {type(exc).__name__}: {exc}"

    def _best_done(self) -> Trial | None:
        """The best done trial by the sweep's metric and mode; None while no done trial has the metric."""
        try:
            return Results(t for t in self.trials if t.status == "done").best(self.metric, self.mode)
        except ValueError:
            return None

    def _folder(self, trial: Trial) -> Path:
        return self.checkpoint_dir / f"trial-{trial.index}"

    def _remove_checkpoint(self, trial: Trial) -> None:
        trial.checkpoint = None
        if self.checkpoint_dir is not None:
            shutil.rmtree(self._folder(trial), ignore_errors=True)

    def _keep_checkpoints(self, trial: Trial) -> None:
        """After ``trial`` ended: a done one's checkpoint written, none kept of a trial not done (a pruned one
        that returned is not written; a stale one of an earlier sweep is removed); with ``keep="best"``
        only the best done trial's (by the sweep's ``metric`` and ``mode``) of those ended so far."""
        if self.checkpoint_dir is None:
            return
        if trial.status == "done":
            self._save_checkpoint(trial)
        if trial.status != "done":  # also one whose checkpoint could not be written: nothing half left
            self._remove_checkpoint(trial)
        if self.keep == "all":
            return
        best = self._best_done()
        for other in self.trials:
            if other is not best and other.checkpoint is not None:
                self._remove_checkpoint(other)


def _error_text(exc: BaseException) -> str:
    """A failed trial's error in one line: the error's own first line, which names the pool rank that failed
    first (``rank 3 (host, cpu) raised ValueError: bad lr``, ``... died: ...``, a timeout's stalled rank)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
