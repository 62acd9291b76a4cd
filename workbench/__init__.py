"""distributed-workbench: interactive distributed training in Jupyter.

>>> %load_ext workbench          # doctest: +SKIP
>>> %dist start -n 2             # doctest: +SKIP
"""

from workbench.config import PoolConfig
from workbench.errors import CellTimeout, NoPoolError, PoolStartError, RankError, WorkbenchError
from workbench.session import CellResult, RankResult, Session, current

__all__ = [
    "CellResult", "CellTimeout", "NoPoolError", "PoolConfig", "PoolStartError", "RankError",
    "RankResult", "Session", "WorkbenchError", "current", "load_ipython_extension",
]


# Names loaded on first use: engine-side helpers import torch, which the kernel must not
# pay for (or need) at `%load_ext`. Each entry: public name -> module that defines it.
_LAZY: dict[str, str] = {
    "shard": "workbench.strategies", "plan": "workbench.strategies", "unwrap": "workbench.strategies",
    "ParallelConfig": "workbench.strategies",
    "scatter": "workbench.scatter", "gather": "workbench.scatter",
    "Trainer": "workbench.train", "TrainConfig": "workbench.train", "Callback": "workbench.train",
    "StepStats": "workbench.train", "MLP": "workbench.train", "MLPConfig": "workbench.train",
    "TinyGPT": "workbench.train", "GPTConfig": "workbench.train", "make_loader": "workbench.train",
    "char_dataset": "workbench.train", "char_vocab": "workbench.train", "regression_data": "workbench.train",
    "export": "workbench.train", "load_model": "workbench.train", "predict": "workbench.train",
    "generate": "workbench.train", "ElasticConfig": "workbench.train", "ElasticLoader": "workbench.train",
    "dashboard": "workbench.widgets",
    "Checkpoint": "workbench.train.checkpoint", "save_trainer": "workbench.train.checkpoint",
    "resume": "workbench.train.checkpoint",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def load_ipython_extension(ipython):
    """``%load_ext workbench``: register ``%dist``, ``%%distributed`` and ``%%local``."""
    from workbench.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from workbench.magics import unload_ipython_extension as unload

    unload(ipython)
