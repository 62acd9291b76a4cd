"""Typed, validated configuration for a pool."""

from __future__ import annotations

from dataclasses import dataclass

LAUNCHERS = ("local",)
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """How to start a pool.

    ``n``: number of engines (ranks); ``None`` means one per visible GPU, else 2.
    ``timeout``: seconds for engines to register and for the process group to
    form; also the process group's collective timeout.

    >>> PoolConfig(n=2).backend
    'auto'
    >>> PoolConfig(n=0)
    Traceback (most recent call last):
    ...
    ValueError: n must be at least 1 (got 0): the pool needs one engine per rank.
    """

    n: int | None = None
    launcher: str = "local"
    backend: str = "auto"
    timeout: float = 60.0
    address: str = "127.0.0.1"

    def __post_init__(self):
        if self.n is not None and self.n < 1:
            raise ValueError(f"n must be at least 1 (got {self.n}): the pool needs one engine per rank.")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"unknown launcher {self.launcher!r}: choose one of {', '.join(LAUNCHERS)}.")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}: choose one of {', '.join(BACKENDS)}.")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds (got {self.timeout}).")
