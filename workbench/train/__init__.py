"""Training: tiny models, local data and loaders, the Trainer, events and export.

>>> from workbench.train import MLP, Trainer, make_loader, regression_data   # doctest: +SKIP
"""

from workbench.train.data import TEXT, char_dataset, char_vocab, decode, encode, make_loader, regression_data
from workbench.train.events import Callback, StepStats, default_callbacks
from workbench.train.export import export, full_state_dict, generate, load_model, predict
from workbench.train.models import MLP, GPTConfig, MLPConfig, TinyGPT
from workbench.train.trainer import RunResult, TrainConfig, Trainer

__all__ = ["MLP", "TEXT", "Callback", "GPTConfig", "MLPConfig", "RunResult", "StepStats", "TinyGPT",
           "TrainConfig", "Trainer", "char_dataset", "char_vocab", "decode", "default_callbacks", "encode",
           "export", "full_state_dict", "generate", "load_model", "make_loader", "predict", "regression_data"]
