"""The one door: every function the kernel runs on the engines, importable in the kernel without torch.

ipyparallel sends a function by reference (its module and name: the engine imports the module and calls
it), so the kernel must import the module of every function it sends. The engine-side modules behind
these functions (:mod:`workbench.engine.rendezvous`, :mod:`workbench.engine.guard`,
:mod:`workbench.train.elastic`, :mod:`workbench.metrics.publisher`, :func:`workbench.preflight.probe`)
import torch, which would cost the kernel a second or more at its first start (and the kernel never needs
torch); each function here imports its module only where it runs, on the engines. A reader finds every
remote entry point in this file; the kernel sends no code string that imports a project module (a test in
``tests/unit/test_layers.py`` holds both).

Sent with ``view.apply`` (a result per rank), or pushed into the ranks' namespace and called by a cell
where it must run as one (a collective that the cell's escalation ladder watches: :func:`preflight_probe`,
:func:`join_running`).

>>> callable(describe) and callable(join) and callable(connect_metrics)
True
"""

from __future__ import annotations

# --- the process group: rendezvous and abort (workbench.engine) ---


def describe() -> dict:
    """On an engine: :func:`workbench.engine.rendezvous.describe`."""
    from workbench.engine import rendezvous

    return rendezvous.describe()


def route_to(address: str) -> dict:
    """On a rank off the kernel's machine: :func:`workbench.pool.netif.route_to` (the interface that
    reaches the kernel's ``address``, which its gloo/NCCL traffic then uses)."""
    from workbench.pool import netif

    return netif.route_to(address)


def open_store(*args, **kwargs) -> int:
    """On rank 0: :func:`workbench.engine.rendezvous.open_store`."""
    from workbench.engine import rendezvous

    return rendezvous.open_store(*args, **kwargs)


def join(**kwargs) -> dict:
    """On every rank: :func:`workbench.engine.rendezvous.join`."""
    from workbench.engine import rendezvous

    return rendezvous.join(**kwargs)


def abort(*args, **kwargs):
    """On a rank: :func:`workbench.engine.guard.abort`."""
    from workbench.engine import guard

    return guard.abort(*args, **kwargs)


def join_alone(**kwargs) -> dict:
    """On a new engine: :func:`workbench.engine.rendezvous.join_alone` (a group of its own to replay in)."""
    from workbench.engine import rendezvous

    return rendezvous.join_alone(**kwargs)


# --- elastic runs: the Trainer's side (workbench.train.elastic) ---


def set_replay(on: bool) -> None:
    """On a new engine: whether it replays the notebook's setup (``Trainer.run`` does nothing meanwhile)."""
    from workbench.train import elastic

    elastic.REPLAY["on"] = on


def check_joining_data(expected: dict) -> None:
    """On a new engine: :func:`workbench.train.elastic.check_joining_data`."""
    from workbench.train import elastic

    elastic.check_joining_data(expected)


def newest_elastic_status() -> dict | None:
    """On an engine: what its newest elastic Trainer's beacon would say (None: it has none)."""
    from workbench.train import elastic

    trainer = elastic.latest_trainer()
    return trainer.elastic.status() if trainer is not None else None


def trainer_count() -> int:
    """On an engine: how many elastic Trainers it built (:func:`workbench.train.elastic.trainer_count`)."""
    from workbench.train import elastic

    return elastic.trainer_count()


def join_running(plan: dict):
    """On a new engine, in a cell: :func:`workbench.train.elastic.join_running` (join the elastic run in
    progress and train until it ends; returns the run's result)."""
    from workbench.train import elastic

    return elastic.join_running(plan)


# --- live metrics (workbench.metrics.publisher) ---


def connect_metrics(channel: dict, **kwargs) -> dict:
    """On an engine: start its publisher and device sampler (:func:`workbench.metrics.publisher.connect`)."""
    from workbench.metrics import publisher

    return publisher.connect(channel, **kwargs)


def disconnect_metrics() -> None:
    """On an engine: stop its publisher."""
    from workbench.metrics import publisher

    publisher.disconnect()


# --- %dist check (workbench.preflight) ---


def preflight_probe(device, size_mb: float = 4.0, iters: int = 10) -> dict:
    """On every rank at once, in a cell: :func:`workbench.preflight.probe` (a collective)."""
    from workbench.preflight import probe

    return probe(device, size_mb=size_mb, iters=iters)


# --- torchrun scripts (workbench.engine.torchrun) ---


def run_script(path: str, argv: list[str], cwd: str | None = None) -> None:
    """On every rank, pushed and called by a cell (``%dist run``):
    :func:`workbench.engine.torchrun.run_script` (output, failures, the escalation ladder: as a cell's)."""
    from workbench.engine import torchrun

    torchrun.run_script(path, argv, cwd)


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


def failed_frames() -> dict | None:
    """On a rank: the last failed cell's frames and locals (:func:`workbench.engine.postmortem.frames`)."""
    from workbench.engine import postmortem

    return postmortem.frames()


def evaluate_in_failed(expr: str, frame: int | None = None) -> dict:
    """On a rank: ``expr`` in a frame of the last failed cell (:func:`.engine.postmortem.evaluate`)."""
    from workbench.engine import postmortem

    return postmortem.evaluate(expr, frame)
