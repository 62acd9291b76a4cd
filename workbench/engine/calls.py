"""What the kernel sends to the engines, importable in the kernel without torch.

ipyparallel sends a function by reference (its module and name), so the kernel must import the module
of every function it sends. :mod:`.rendezvous` and :mod:`.guard` import torch, which would cost the kernel
a second or more at its first start (and the kernel never needs torch); these wrappers import them only
where they run, on the engines. Elastic runs use :func:`join_alone`, :func:`set_replay` and
:func:`trainer_count` (:mod:`workbench.train.elastic` imports torch too).

>>> callable(describe) and callable(join)
True
"""

from __future__ import annotations


def describe() -> dict:
    """On an engine: :func:`workbench.engine.rendezvous.describe`."""
    from workbench.engine import rendezvous

    return rendezvous.describe()


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


def join_alone(**kwargs) -> int:
    """On a new engine: :func:`workbench.engine.rendezvous.join_alone` (a group of its own to replay in)."""
    from workbench.engine import rendezvous

    return rendezvous.join_alone(**kwargs)


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


def failed_frames() -> dict | None:
    """On a rank: the last failed cell's frames and locals (:func:`workbench.engine.postmortem.frames`)."""
    from workbench.engine import postmortem

    return postmortem.frames()


def evaluate_in_failed(expr: str, frame: int | None = None) -> dict:
    """On a rank: ``expr`` in a frame of the last failed cell (:func:`.postmortem.evaluate`)."""
    from workbench.engine import postmortem

    return postmortem.evaluate(expr, frame)
