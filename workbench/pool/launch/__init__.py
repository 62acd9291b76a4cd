"""The launcher objects: one class per way of starting engines, chosen once from the config.

:func:`launcher_for` is the one place a launcher's name becomes its object; everything that differs between
launchers is a method or an attribute of :class:`~workbench.pool.launch.base.Launcher` (see there), which
the pool, the session and the server ask.

>>> launcher_for(PoolConfig(launcher="slurm", new_job=True))
Slurm('slurm')
>>> sorted(KINDS) == sorted(LAUNCHERS)
True
"""

from __future__ import annotations

import os

from workbench.config import LAUNCHERS, PoolConfig
from workbench.pool.launch.base import Launcher
from workbench.pool.launch.kubernetes import Kubernetes
from workbench.pool.launch.local import Local
from workbench.pool.launch.mpi import MPI
from workbench.pool.launch.slurm import Slurm
from workbench.pool.launch.slurm_allocation import SlurmAllocation
from workbench.pool.launch.ssh import SSH

# every launcher, by the name the config gives it
KINDS: dict[str, type[Launcher]] = {kind.name: kind for kind in (Local, SSH, Slurm, MPI, Kubernetes,
                                                                  SlurmAllocation)}

__all__ = ["KINDS", "LAUNCHERS", "MPI", "SSH", "Kubernetes", "Launcher", "Local", "Slurm", "SlurmAllocation",
           "default_engines", "launcher_for"]


def launcher_for(config: PoolConfig) -> Launcher:
    """The launcher object of a pool started with ``config``. ``--launcher slurm`` from inside a Slurm job
    is that job's allocation (:class:`SlurmAllocation`: no second job that waits behind the user's own)
    unless ``new_job`` asks for a job of its own.

    >>> env = dict(os.environ)
    >>> os.environ["SLURM_JOB_ID"] = "12"
    >>> launcher_for(PoolConfig(launcher="slurm")), launcher_for(PoolConfig(launcher="slurm", new_job=True))
    (SlurmAllocation('allocation'), Slurm('slurm'))
    >>> os.environ.clear(); os.environ.update(env)
    """
    if config.launcher == "slurm" and not config.new_job and os.environ.get("SLURM_JOB_ID"):
        return SlurmAllocation(config)
    return KINDS[config.launcher](config)


def default_engines(config: PoolConfig, local_gpus: int = 0) -> int:
    """How many engines a pool started with ``config`` starts when ``-n`` is not given (``local_gpus``: this
    machine's GPUs, which a local pool takes one engine each of).

    >>> default_engines(PoolConfig(launcher="slurm", nodes=2, gpus_per_node=4)), default_engines(PoolConfig())
    (8, 2)
    """
    return launcher_for(config).default_engines(local_gpus)
