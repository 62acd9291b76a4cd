"""How to shard a model: a keyword-only config, checked before any process-group work.

>>> ParallelConfig(dp=2, pp=2).check(world_size=4, n_layers=4)
>>> ParallelConfig(dp=2, pp=3).check(world_size=4, n_layers=4)
Traceback (most recent call last):
...
ValueError: dp=2 x tp=1 x pp=3 = 6, but the world has 4 ranks: choose degrees whose product is 4.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

STRATEGIES = {
    "ddp": {"data_parallel": "ddp"},
    "fsdp": {"data_parallel": "fsdp"},
    "tp": {"tp": None}, "tensor_parallel": {"tp": None},
    "pp": {"pp": None}, "pipeline": {"pp": None},
    "none": {"data_parallel": "none"},
}
DATA_PARALLEL = ("auto", "ddp", "fsdp", "none")
SCHEDULES = ("gpipe", "1f1b")
PRECISIONS = (None, "bf16")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """Degrees and options for :func:`workbench.shard`.

    ``dp``/``tp``/``pp``: data, tensor and pipeline degrees (``dp=None``: whatever is left
    of the world). ``data_parallel``: how the data dim syncs ("auto" = DDP when it is the
    only dim, FSDP when composed with tp or pp). ``schedule``/``microbatches``: pipeline.
    ``activation_checkpoint``, ``compile``: per block. ``mixed_precision``: FSDP param dtype.
    """

    dp: int | None = None
    tp: int = 1
    pp: int = 1
    data_parallel: str = "auto"
    schedule: str = "1f1b"
    microbatches: int = 4
    activation_checkpoint: bool = False
    compile: bool = False
    mixed_precision: str | None = None

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "microbatches"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer (got {value!r}).")
        if self.data_parallel not in DATA_PARALLEL:
            raise ValueError(f"unknown data_parallel {self.data_parallel!r}: choose one of "
                             f"{', '.join(DATA_PARALLEL)}.")
        if self.schedule.lower() not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}.")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"unknown mixed_precision {self.mixed_precision!r}: choose None or 'bf16'.")
        if self.data_parallel == "ddp" and (self.tp > 1 or self.pp > 1):
            raise ValueError("data_parallel='ddp' runs alone: with tp or pp > 1 use 'fsdp' (or 'auto').")

    @classmethod
    def from_args(cls, world_size: int, strategy: str | None = None, **kwargs) -> ParallelConfig:
        """Turn ``shard(model, "fsdp", tp=2)``-style arguments into a full config."""
        if strategy is not None:
            key = strategy.lower()
            if key not in STRATEGIES:
                raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)} "
                                 "or give degrees, e.g. shard(model, dp=2, pp=2).")
            preset = STRATEGIES[key]
            if "data_parallel" in preset:
                kwargs.setdefault("data_parallel", preset["data_parallel"])
            for name, other in (("tp", "pp"), ("pp", "tp")):
                if name in preset and kwargs.get(name) is None:
                    kwargs[name] = max(1, world_size // ((kwargs.get("dp") or 1) * (kwargs.get(other) or 1)))
        config = cls(**kwargs)
        if config.dp is None:
            config = replace(config, dp=max(1, world_size // (config.tp * config.pp)))
        if config.data_parallel == "auto":
            mode = "none" if config.dp == 1 else "ddp" if config.tp == config.pp == 1 else "fsdp"
            config = replace(config, data_parallel=mode)
        return config

    def check(self, *, world_size: int, n_layers: int | None = None,
              tp_divisors: dict | None = None) -> None:
        """Every problem at once, each naming its factors; ``None`` when the plan fits."""
        dp = self.dp or 1
        problems = []
        if dp * self.tp * self.pp != world_size:
            problems.append(f"dp={dp} x tp={self.tp} x pp={self.pp} = {dp * self.tp * self.pp}, but the "
                            f"world has {world_size} rank{'s' * (world_size != 1)}: choose degrees whose "
                            f"product is {world_size}.")
        if n_layers is not None and self.pp > n_layers:
            problems.append(f"pp={self.pp} is more than the model's {n_layers} layers: each pipeline stage "
                            "needs at least one layer.")
        if self.pp > 1 and self.schedule.lower() == "1f1b" and self.microbatches < self.pp:
            problems.append(f"schedule 1f1b needs at least as many microbatches as stages: microbatches="
                            f"{self.microbatches} < pp={self.pp}; use microbatches >= {self.pp} or 'gpipe'.")
        for what, size in (tp_divisors or {}).items():
            if self.tp > 1 and size % self.tp:
                problems.append(f"tp={self.tp} does not divide {what}={size}.")
        if problems:
            raise ValueError(" ".join(problems))

    @property
    def degrees(self) -> dict[str, int]:
        """Mesh dims in their fixed order (outermost first), only those above 1."""
        dims = {"pp": self.pp, "dp": self.dp or 1, "tp": self.tp}
        return {k: v for k, v in dims.items() if v > 1} or {"dp": 1}
