"""The door's catalogue: every function the kernel runs on the engines, declared once with how it is called.

ipyparallel sends a function with its module's name (the engine imports the module and runs the code in
its namespace), so the kernel must import the module of every function it sends. The engine-side modules
behind these functions (:mod:`workbench.engine.rendezvous`, :mod:`workbench.engine.guard`,
:mod:`workbench.train.elastic`, :mod:`workbench.metrics.publisher`, :mod:`workbench.engine.probe`) import
torch, which would cost the kernel a second or more at its first start (and the kernel never needs
torch); each function here imports its module only where it runs, on the engines, and this module imports
nothing of the package at its top (an engine imports it at the first call). A reader finds every remote
entry point in this file; the kernel sends no code string that imports a project module (a test in
``tests/unit/house/test_layers.py`` holds both).

How each is called is declared with it (:func:`endpoint`), as Monarch declares an actor's endpoints; the
one transport, :class:`workbench.remote.door.Door`, calls each only in its declared way:

- :data:`EACH`: on every target rank at once, a result per rank in rank order (``door.call``);
- :data:`ONE`: on one rank, its result (``door.call_one``);
- :data:`CELL`: on every target rank at once inside a cell the kernel watches (output streamed, the
  escalation ladder on a failure): pushed to the ranks, then called by the cell's one line
  (``door.cell``); a collective, or a run that lasts;
- :data:`HOSTS`: the transport's own: a cell sent once to every rank, its output and ends merged per host
  (``door.start_cell`` where every rank's host has a hub), and every call on each rank, wrapped so that one
  coalesced reply carries every rank's result or error (``door.call``, ``push``, ``pull``, ``apply``).

>>> pattern_of(describe) is EACH and pattern_of(open_store) is ONE and pattern_of(run_script) is CELL
True
>>> sorted(name for name, e in CATALOGUE.items() if e.pattern is CELL)
['join_running', 'preflight_probe', 'run_script']
>>> sorted(name for name, e in CATALOGUE.items() if e.pattern is HOSTS)
['cell_end', 'get', 'guarded', 'put', 'run_cell']
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar


class Pattern(enum.Enum):
    """How the kernel calls an endpoint."""

    EACH = "on each rank"
    ONE = "on one rank"
    CELL = "inside a watched cell"
    HOSTS = "on every rank at once, the replies merged"


EACH, ONE, CELL, HOSTS = Pattern.EACH, Pattern.ONE, Pattern.CELL, Pattern.HOSTS


@dataclass(frozen=True)
class Endpoint:
    """One entry of the catalogue: the function (sent as it is) and how it is called."""

    fn: Callable
    pattern: Pattern


CATALOGUE: dict[str, Endpoint] = {}
F = TypeVar("F", bound=Callable)


def endpoint(pattern: Pattern) -> Callable[[F], F]:
    """Declare the function below as an endpoint called ``pattern``; the function itself is unchanged
    (ipyparallel sends plain functions, and its signature is the endpoint's)."""
    def declare(fn: F) -> F:
        CATALOGUE[fn.__name__] = Endpoint(fn, pattern)
        return fn
    return declare


def pattern_of(fn: Callable) -> Pattern | None:
    """How ``fn`` is called, if it is an endpoint of the catalogue (None: it is not one)."""
    entry = CATALOGUE.get(getattr(fn, "__name__", ""))
    return entry.pattern if entry is not None and entry.fn is fn else None


# --- the process group: rendezvous and abort (workbench.engine) ---


@endpoint(EACH)
def describe() -> dict:
    """On an engine: :func:`workbench.engine.rendezvous.describe`."""
    from workbench.engine import rendezvous

    return rendezvous.describe()


@endpoint(EACH)
def route_to(address: str) -> dict:
    """On a rank off the kernel's machine: :func:`workbench.pool.machine.netif.route_to` (the interface that
    reaches the kernel's ``address``, which its gloo/NCCL traffic then uses)."""
    from workbench.pool.machine import netif

    return netif.route_to(address)


@endpoint(ONE)
def open_store(address: str, timeout_s: float) -> int:
    """On rank 0: :func:`workbench.engine.rendezvous.open_store`."""
    from workbench.engine import rendezvous

    return rendezvous.open_store(address, timeout_s)


@endpoint(EACH)
def join(*, rank: int, local_rank: int, world_size: int, address: str, port: int, backend: str, device: str,
         timeout_s: float, ifname: str | None, local_pids=(), collective_timeout_s: float | None = None,
         channel: dict | None = None, generation: int = 0, standby_address: str | None = None,
         store: dict | None = None, stores_folder: str | None = None, node_rank: int = 0, nodes: int = 1,
         run_id: str = "", agent_rank: int | None = None) -> dict:
    """On every rank, each with its own arguments: :func:`workbench.engine.rendezvous.join`."""
    from workbench.engine import rendezvous

    return rendezvous.join(
        rank=rank, local_rank=local_rank, world_size=world_size, address=address, port=port, backend=backend,
        device=device, timeout_s=timeout_s, ifname=ifname, local_pids=local_pids,
        collective_timeout_s=collective_timeout_s, channel=channel, generation=generation,
        standby_address=standby_address, store=store, stores_folder=stores_folder, node_rank=node_rank,
        nodes=nodes, run_id=run_id, agent_rank=agent_rank)


@endpoint(EACH)
def abort(peers=()) -> int | None:
    """On a rank: :func:`workbench.engine.guard.abort` (``peers``: where the group's ranks listen)."""
    from workbench.engine import guard

    return guard.abort(peers)


@endpoint(ONE)
def join_alone(*, device: str, backend: str, timeout_s: float, channel: dict | None = None,
               standby_address: str = "127.0.0.1", stores_folder: str | None = None) -> dict:
    """On a new engine: :func:`workbench.engine.rendezvous.join_alone` (a group of its own to replay in)."""
    from workbench.engine import rendezvous

    return rendezvous.join_alone(device=device, backend=backend, timeout_s=timeout_s, channel=channel,
                                 standby_address=standby_address, stores_folder=stores_folder)


# --- elastic runs: the Trainer's side (workbench.train.elastic) ---


@endpoint(EACH)
def set_replay(on: bool) -> None:
    """On a new engine: whether it replays the notebook's setup (``Trainer.run`` does nothing meanwhile)."""
    from workbench.train import elastic

    elastic.REPLAY["on"] = on


@endpoint(EACH)
def check_joining_data(expected: dict) -> None:
    """On a new engine: :func:`workbench.train.elastic.check_joining_data`."""
    from workbench.train import elastic

    elastic.check_joining_data(expected)


@endpoint(EACH)
def newest_elastic_status() -> dict | None:
    """On an engine: what its newest elastic Trainer's beacon would say (None: it has none)."""
    from workbench.train import elastic

    trainer = elastic.latest_trainer()
    return trainer.elastic.status() if trainer is not None else None


@endpoint(EACH)
def trainer_count() -> int:
    """On an engine: how many elastic Trainers it built (:func:`workbench.train.elastic.trainer_count`)."""
    from workbench.train import elastic

    return elastic.trainer_count()


@endpoint(CELL)
def join_running(plan: dict):
    """On a new engine, in a cell: :func:`workbench.train.elastic.join_running` (join the elastic run in
    progress and train until it ends; returns the run's result)."""
    from workbench.train import elastic

    return elastic.join_running(plan)


# --- a sweep's trial checkpoint (workbench.train.checkpoint; workbench.session.sweep) ---


@endpoint(ONE)
def save_trial_checkpoint(name: str, path: str | None) -> str | None:
    """On rank 0 of a sweep's finished trial: the checkpoint its cell left as ``name`` written to ``path``
    (:func:`workbench.train.checkpoint.save_file`: complete or not at all) and dropped from the namespace;
    its path, or None where the trial returned none (or ``path`` is None: only dropped, not kept)."""
    state = _namespace().pop(name, None)
    if state is None or path is None:
        return None
    from workbench.train import checkpoint

    return checkpoint.save_file(state, path)


# --- live metrics (workbench.metrics.publisher) ---


@endpoint(EACH)
def connect_metrics(channel: dict, *, rank: int | None = None, device: str | None = None,
                    flush_interval: float = 0.1, sample_interval: float = 1.0) -> dict:
    """On an engine: start its publisher and device sampler (:func:`workbench.metrics.publisher.connect`)."""
    from workbench.metrics import publisher

    return publisher.connect(channel, rank=rank, device=device, flush_interval=flush_interval,
                             sample_interval=sample_interval)


@endpoint(EACH)
def disconnect_metrics() -> None:
    """On an engine: stop its publisher."""
    from workbench.metrics import publisher

    publisher.disconnect()


# --- %dist check (workbench.engine.probe) ---


@endpoint(CELL)
def preflight_probe(device=None, size_mb: float = 4.0, iters: int = 10) -> dict:
    """On every rank at once, in a cell: :func:`workbench.engine.probe.probe` (a collective). ``device``:
    default the rank's ``device`` (the name its cells see)."""
    from workbench.engine.probe import probe

    if device is None:
        namespace = _namespace()
        if "device" not in namespace:
            raise NameError("name 'device' is not defined")
        device = namespace["device"]
    return probe(device, size_mb=size_mb, iters=iters)


@endpoint(ONE)
def clock() -> float:
    """On a rank: its clock (``time.time()``), for its offset from the kernel's."""
    import time

    return time.time()


# --- torchrun scripts (workbench.engine.torchrun) ---


@endpoint(CELL)
def run_script(path: str, argv: list[str], cwd: str | None = None) -> None:
    """On every rank, in a cell (``%dist run``): :func:`workbench.engine.torchrun.run_script` (output,
    failures, the escalation ladder: as a cell's)."""
    from workbench.engine import torchrun

    torchrun.run_script(path, argv, cwd)


@endpoint(EACH)
def follow_folder(path: str) -> dict:
    """On a rank: work in the notebook's folder ``path`` (``%cd`` moves it) where this host has it (a local
    pool's ranks always do; another host through a shared file system), else stay. Returns this rank's
    host and the folder it works in (what a "no such file" error then names)."""
    import os
    import socket

    if os.path.isdir(path):
        os.chdir(path)
    return {"host": socket.gethostname(), "folder": os.getcwd()}


# --- %dist debug: the last failed cell's frames (workbench.engine.postmortem) ---


@endpoint(ONE)
def failed_frames() -> dict | None:
    """On a rank: the last failed cell's frames and locals (:func:`workbench.engine.postmortem.frames`)."""
    from workbench.engine import postmortem

    return postmortem.frames()


@endpoint(ONE)
def evaluate_in_failed(expr: str, frame: int | None = None) -> dict:
    """On a rank: ``expr`` in a frame of the last failed cell (:func:`.engine.postmortem.evaluate`)."""
    from workbench.engine import postmortem

    return postmortem.evaluate(expr, frame)


# --- the transport's own: broadcast calls and cells merged per host (workbench.remote.door) ---


@endpoint(HOSTS)
def guarded(fn, args: tuple, kwargs: dict):
    """On a rank, as its part of a broadcast call: :func:`workbench.engine.broadcast.guarded` (``fn``'s
    result, or how it failed: a coalesced reply carries results only)."""
    from workbench.engine import broadcast

    return broadcast.guarded(fn, args, kwargs)


@endpoint(HOSTS)
def put(values: dict) -> None:
    """On a rank: ``values`` into the namespace its cells run in (``Session.push``), each name assigned as
    ipyparallel's push assigns it (``"model.lr"`` sets an attribute)."""
    namespace = _namespace()
    for name, value in values.items():
        namespace["_wb_put_value"] = value
        try:
            exec(f"{name} = _wb_put_value", namespace)
        finally:
            namespace.pop("_wb_put_value", None)


@endpoint(HOSTS)
def get(name: str):
    """On a rank: ``name`` evaluated in the namespace its cells run in (``Session.pull``; ``"trainer.step"``
    too, as ipyparallel's pull; a name it lacks raises ``NameError``)."""
    return eval(name, _namespace())


@endpoint(HOSTS)
def run_cell(code: str, plan: dict) -> None:
    """On every rank at once, a cell whose output and end go to the rank's host hub:
    :func:`workbench.engine.host_cell.run`."""
    from workbench.engine import host_cell

    host_cell.run(code, plan)


@endpoint(HOSTS)
def cell_end(cell: str) -> dict | None:
    """On a rank: its end record of cell ``cell``, kept (:func:`workbench.engine.host_cell.ended`): asked for
    where a hub never sent it."""
    from workbench.engine import host_cell

    return host_cell.ended(cell)


# --- what a cell call left on the ranks (workbench.remote.door: Door.cell) ---


@endpoint(EACH)
def take(names: list[str]) -> list:
    """On a rank: remove ``names`` from its namespace; their values (None for a name it lacks)."""
    namespace = _namespace()
    return [namespace.pop(name, None) for name in names]


def _namespace() -> dict:
    """The namespace the rank's cells run in."""
    from IPython import get_ipython

    ip = get_ipython()
    return ip.user_ns if ip is not None else {}
