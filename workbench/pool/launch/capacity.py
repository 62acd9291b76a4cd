"""How many ranks this machine holds: a local pool larger than that is refused before anything starts.

``%dist start -n 10000`` once started engines as fast as they could spawn, until the machine stopped
answering. Each rank is a Python process with torch loaded, so the bound is the smaller of cores x
``RANKS_PER_CORE`` and the available memory at the measured footprint of one rank.
"""

from __future__ import annotations

import os

import psutil

# RSS of one idle CPU rank with torch loaded: 324 MiB measured (README, Performance: memory of one rank).
RANK_MIB = 330
# Ranks per core before a pool is refused: a few ranks per core still work (they mostly wait).
RANKS_PER_CORE = 4


def check_capacity(n: int, *, cores: int, available_mib: int, oversubscribe: bool = False) -> None:
    """Refuse ``n`` ranks on a machine with ``cores`` cores and ``available_mib`` MiB of free memory.

    >>> check_capacity(8, cores=2, available_mib=8000)
    >>> check_capacity(9, cores=2, available_mib=8000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: -n 9 is more than this machine holds: 2 cores x 4 = 8 ranks, ...
    >>> check_capacity(9, cores=2, available_mib=8000, oversubscribe=True)
    """
    by_cores = cores * RANKS_PER_CORE
    by_memory = available_mib // RANK_MIB
    limit = min(by_cores, by_memory)
    if n <= limit or oversubscribe:
        return
    raise ValueError(
        f"-n {n} is more than this machine holds: {cores} cores x {RANKS_PER_CORE} = {by_cores} ranks, and "
        f"{available_mib / 1024:.1f} GiB of available memory at about {RANK_MIB} MiB per rank = {by_memory} "
        f"ranks. Start at most {limit}, or add --oversubscribe (PoolConfig(oversubscribe=True)) to start {n} "
        "anyway; nothing was started.")


def check_this_machine(n: int, oversubscribe: bool = False) -> None:
    """:func:`check_capacity` with this machine's cores and available memory."""
    check_capacity(n, cores=os.cpu_count() or 1, available_mib=psutil.virtual_memory().available // 2**20,
                   oversubscribe=oversubscribe)
