"""distributed-workbench: interactive distributed training in Jupyter.

In a notebook, ``%load_ext workbench`` registers the magics; a pool of ranks starts, and a cell runs on
every rank at once:

>>> %load_ext workbench          # doctest: +SKIP
>>> %dist start -n 2             # doctest: +SKIP

The package's public face is ``__all__``: the session (``Session``, ``PoolConfig``, ``current``,
``scatter``, ``gather``, ``dashboard``), the training side (``Trainer``, ``ElasticConfig``, ``Checkpoint``,
the small models and loaders, ``shard``) and the errors. Each name loads on first use, so
``import workbench`` imports neither torch nor ipyparallel:

>>> import workbench as wb
>>> "Session" in wb.__all__ and "Trainer" in wb.__all__
True
"""


# Names loaded on first use: engine-side helpers import torch, which the kernel must not pay for (or
# need) at `%load_ext`, and the session imports ipyparallel, which the processes that only import a
# piece of the package (the lease, the zygote, the engines) need not. Public name -> defining module.
_LAZY: dict[str, str] = {
    "PoolConfig": "workbench.config",
    "CellTimeout": "workbench.errors", "NoPoolError": "workbench.errors",
    "PoolStartError": "workbench.errors", "RankError": "workbench.errors",
    "WorkbenchError": "workbench.errors",
    "CellResult": "workbench.session", "RankResult": "workbench.session", "Session": "workbench.session",
    "current": "workbench.session", "Sweep": "workbench.widgets.sweep_dashboard",
    "shard": "workbench.strategies", "plan": "workbench.strategies", "unwrap": "workbench.strategies",
    "ParallelConfig": "workbench.strategies",
    "scatter": "workbench.scatter", "gather": "workbench.scatter",
    "Trainer": "workbench.train", "TrainConfig": "workbench.train", "Callback": "workbench.train",
    "StepStats": "workbench.train", "MLP": "workbench.train", "MLPConfig": "workbench.train",
    "TinyGPT": "workbench.train", "GPTConfig": "workbench.train", "make_loader": "workbench.train",
    "char_dataset": "workbench.train", "char_vocab": "workbench.train", "regression_data": "workbench.train",
    # export from its own module: an import of workbench.train.export binds that module to the package's
    # name ``export``, which then is no longer the function (tests/unit/house/test_public_face.py)
    "export": "workbench.train.export", "load_model": "workbench.train", "predict": "workbench.train",
    "generate": "workbench.train", "ElasticConfig": "workbench.train", "ElasticLoader": "workbench.train",
    "dashboard": "workbench.widgets",
    "Checkpoint": "workbench.train.checkpoint", "save_trainer": "workbench.train.checkpoint",
    "resume": "workbench.train.checkpoint",
}
# The public face: every lazy name, and the IPython hook (tests/unit/house/test_public_face.py holds them
# as one).
__all__ = ["load_ipython_extension", *_LAZY]


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
