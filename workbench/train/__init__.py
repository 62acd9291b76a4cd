"""Training: tiny models, local data and loaders, the Trainer, events and export.

The rooms: ``trainer`` (the plain Trainer: the loop, a step and its flags, the only writer of its own
state), ``feed`` (where its batches come from: ``PlainFeed``, or an elastic run's ``ElasticRun``),
``elastic`` (``ElasticConfig`` and what the kernel calls on an engine: the setup replay, joining a run),
``elastic_trainer`` (``ElasticTrainer``, the subclass ``Trainer(..., elastic=...)`` makes),
``elastic_policy`` (when it leaves, joins or regroups: pure decisions), ``state_tree`` (a state from one
rank to all), ``checkpoint``/``checkpoint_io``, ``data``, ``models``, ``export``, ``events``.

>>> from workbench.train import MLP, Trainer, make_loader, regression_data   # doctest: +SKIP

Names load on first use: the metrics publisher needs only ``events`` on every engine at
start, and importing the trainer (and with it FSDP and pipelining) costs each engine as
much as torch itself.
"""

import importlib

_WHERE = {
    "data": ("TEXT", "ElasticLoader", "char_dataset", "char_vocab", "decode", "encode", "make_loader",
             "regression_data"),
    "elastic": ("ElasticConfig",),
    "events": ("Callback", "StepStats", "default_callbacks"),
    "export": ("export", "full_state_dict", "generate", "load_model", "predict"),
    "models": ("MLP", "GPTConfig", "MLPConfig", "TinyGPT"),
    "trainer": ("InterruptedMidStep", "RunResult", "TrainConfig", "Trainer", "TrainingInterrupted"),
}
_MODULE = {name: module for module, names in _WHERE.items() for name in names}

__all__ = sorted(_MODULE)


def __getattr__(name: str):
    module = _MODULE.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.train' has no attribute {name!r}")
    loaded = importlib.import_module(f"workbench.train.{module}")
    # bind every name of that module here: importing workbench.train.export has just bound the
    # *module* to the package's name ``export``, which must stay the function
    for other in _WHERE[module]:
        globals()[other] = getattr(loaded, other)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(_MODULE))
