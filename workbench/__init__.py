"""distributed-workbench: interactive distributed training in Jupyter.

>>> %load_ext workbench          # doctest: +SKIP
>>> %dist start -n 2             # doctest: +SKIP
"""

__all__ = [
    "CellResult", "CellTimeout", "NoPoolError", "PoolConfig", "PoolStartError", "RankError",
    "RankResult", "Session", "WorkbenchError", "current", "load_ipython_extension",
]


# Names loaded on first use: engine-side helpers import torch, which the kernel must not pay for (or
# need) at `%load_ext`, and the session imports ipyparallel, which the processes that only import a
# piece of the package (the lease, the zygote, the engines) need not. Public name -> defining module.
_LAZY: dict[str, str] = {
    "PoolConfig": "workbench.config",
    "CellTimeout": "workbench.errors", "NoPoolError": "workbench.errors",
    "PoolStartError": "workbench.errors", "RankError": "workbench.errors",
    "WorkbenchError": "workbench.errors",
    "CellResult": "workbench.session", "RankResult": "workbench.session", "Session": "workbench.session",
    "current": "workbench.session",
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
    import importlib

    module = _LAZY.get(name)
    if module is None:
        try:  # a submodule: ``import workbench; workbench.session``
            return importlib.import_module(f"workbench.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module 'workbench' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)


def load_ipython_extension(ipython):
    """``%load_ext workbench``: register ``%dist``, ``%%distributed`` and ``%%local``.

    First of all a spare zygote starts importing torch for the first local pool
    (:mod:`workbench.pool.processes.spare`).
    """
    from workbench.pool.processes import spare

    spare.prepare()
    from workbench.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from workbench.magics import unload_ipython_extension as unload

    unload(ipython)


def __dir__():
    return sorted([*globals(), *_LAZY])
