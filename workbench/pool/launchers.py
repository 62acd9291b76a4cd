"""Our launcher options -> ipyparallel's own engine launchers (no home-made launcher).

``engine_launcher(config)`` names the ipyparallel engine launcher; ``engine_set_kwargs(config, n, ...)``
gives the keyword arguments for ``Cluster.start_engines`` (they become the launcher's traits):

- ``slurm``: ``SlurmEngineSetLauncher`` with our own batch script: ``--nodes``, one task per GPU on every
  node (``--ntasks-per-node``), ``--gpus-per-node``, ``--partition``, ``--time``, ``--account``; ``srun``
  starts the engines. Every engine sees its node's GPUs and the rank map pins rank ``local_rank`` to
  ``cuda:local_rank``.
- ``mpi``: ``MPIEngineSetLauncher`` (``mpiexec -n N``, ``--host a:k,b:k`` for ``hosts``).
- ``ssh``: ``SSHEngineSetLauncher`` with ``engines={host: count}``; the remote Python is this kernel's
  interpreter path (a shared file system or the same install on every host).

Pure functions over the config (no processes).
"""

from __future__ import annotations

import os
import shlex
import sys

from workbench.config import PoolConfig
from workbench.pool import netif
from workbench.pool.reap import MARKER
from workbench.pool.spawn import (
    CancellableEngineSetLauncher,
    CancellableSSHEngineSetLauncher,
    PoolMPIEngineSetLauncher,
    PoolSlurmEngineSetLauncher,
)

# ipyparallel's own launchers, cancellable between engines and sharing the pool's log (workbench.pool.spawn)
IPP_LAUNCHERS = {"local": CancellableEngineSetLauncher, "slurm": PoolSlurmEngineSetLauncher,
                 "mpi": PoolMPIEngineSetLauncher, "ssh": CancellableSSHEngineSetLauncher}


def engine_launcher(config: PoolConfig) -> type:
    """What ``ipp.Cluster(engines=...)`` takes for ``config.launcher``.

    >>> engine_launcher(PoolConfig(launcher="slurm")).__name__
    'PoolSlurmEngineSetLauncher'
    """
    return IPP_LAUNCHERS[config.launcher]


def default_engines(config: PoolConfig, local_gpus: int = 0) -> int:
    """How many engines (ranks) a pool starts when ``-n`` is not given.

    >>> default_engines(PoolConfig(launcher="slurm", nodes=2, gpus_per_node=4))
    8
    >>> default_engines(PoolConfig(launcher="ssh", hosts="a,b"))
    2
    >>> default_engines(PoolConfig(), local_gpus=0)
    2
    """
    if config.n is not None:
        return config.n
    if config.engines is not None:
        return config.engines
    if config.launcher == "local":
        return local_gpus or 2
    if config.hosts:
        return len(config.hosts)
    if config.launcher == "slurm":
        return config.nodes or 1
    return 2


def spread(n: int, places: list[str]) -> dict[str, int]:
    """``n`` engines over ``places``, as evenly as possible, the first places taking the remainder.

    >>> spread(5, ["a", "b"])
    {'a': 3, 'b': 2}
    >>> spread(1, ["a", "b"])
    {'a': 1}
    """
    base, extra = divmod(n, len(places))
    counts = {p: base + (i < extra) for i, p in enumerate(places)}
    return {p: k for p, k in counts.items() if k}


def needs_routable_address(config: PoolConfig) -> bool:
    """True when engines may run on other machines, so loopback cannot reach them.

    >>> needs_routable_address(PoolConfig(launcher="mpi"))
    False
    >>> needs_routable_address(PoolConfig(launcher="ssh", hosts="localhost"))
    False
    >>> needs_routable_address(PoolConfig(launcher="slurm"))
    True
    """
    if config.launcher == "slurm":
        return True
    return any(not netif.is_loopback(h.split("@")[-1]) for h in config.hosts)


def check_address(config: PoolConfig, address: str) -> None:
    """Refuse loopback where engines are elsewhere, naming the interfaces a person can choose from.

    >>> check_address(PoolConfig(launcher="slurm"), "10.0.0.1")
    >>> check_address(PoolConfig(launcher="slurm"), "127.0.0.1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --launcher slurm starts engines on other machines, ...
    """
    if config.interface is None and netif.is_loopback(address) and needs_routable_address(config):
        where = "cluster nodes" if config.launcher == "slurm" else ", ".join(config.hosts)
        raise ValueError(
            f"--launcher {config.launcher} starts engines on other machines, and {where} cannot reach this "
            f"kernel on loopback ({address}). Name the interface they reach it on, e.g. --interface eth0 "
            f"(interfaces here: {netif.describe_interfaces()}); --interface lo only works when the nodes are "
            "this machine.")


def slurm_script(config: PoolConfig, n: int) -> str:
    """The sbatch script for ``n`` engines (an ipyparallel ``batch_template``; ``{...}`` are its fields).

    >>> print(slurm_script(PoolConfig(launcher="slurm", nodes=2, gpus_per_node=4, partition="gpu",
    ...                               time="30", account="proj"), 8))
    #!/bin/sh
    #SBATCH --export=ALL
    #SBATCH --job-name=ipengine-{cluster_id}
    #SBATCH --output={output_file}
    #SBATCH --open-mode=append
    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=4
    #SBATCH --gpus-per-node=4
    #SBATCH --partition=gpu
    #SBATCH --time=30
    #SBATCH --account=proj
    srun --kill-on-bad-exit=0 {program_and_args}
    <BLANKLINE>
    >>> "--ntasks=3" in slurm_script(PoolConfig(launcher="slurm"), 3)
    True
    """
    # --open-mode=append: the output file is the pool's log, which the controller writes too
    lines = ["#!/bin/sh", "#SBATCH --export=ALL", "#SBATCH --job-name=ipengine-{cluster_id}",
             "#SBATCH --output={output_file}", "#SBATCH --open-mode=append"]
    nodes = config.nodes
    if config.gpus_per_node and n % config.gpus_per_node == 0:
        nodes = n // config.gpus_per_node
    if nodes and n % nodes == 0:
        lines += [f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={n // nodes}"]
    else:
        lines += [f"#SBATCH --nodes={nodes}"] if nodes else []
        lines += [f"#SBATCH --ntasks={n}"]
    if config.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={config.gpus_per_node}")
    for flag, value in (("partition", config.partition), ("time", config.time), ("account", config.account)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    # one engine stopping (a shrink) must not end the others
    lines.append("srun --kill-on-bad-exit=0 {program_and_args}")
    return "\n".join(lines) + "\n"


def ssh_command(pool_id: str | None, log: str) -> list[str]:
    """ssh, tagged as the pool's process, its own messages (stderr) going to the pool's log.

    ipyparallel runs ssh with the kernel's stderr: its messages would land in the Jupyter server's log.

    >>> ssh_command("1a2b", "/run/pool-1a2b.log")
    ['env', 'WORKBENCH_POOL=1a2b', 'sh', '-c', 'exec ssh "$@" 2>>/run/pool-1a2b.log', 'ssh']
    >>> ssh_command(None, "")
    ['ssh']
    """
    command = ["env", f"{MARKER}={pool_id}"] if pool_id else []
    if log:
        return [*command, "sh", "-c", f'exec ssh "$@" 2>>{shlex.quote(log)}', "ssh"]
    return [*command, "ssh"]


def engine_set_kwargs(config: PoolConfig, n: int, *, work_dir: str, env: dict[str, str],
                      engine_args: list[str], log: str = "") -> dict:
    """Keyword arguments for ``Cluster.start_engines(n, **kwargs)``: the engine launcher's traits.

    ``work_dir`` is a scratch folder of the pool: batch scripts are written there, never into the
    notebook's folder. ``log``: the file the engines' output goes to (on this machine, or a shared
    file system for Slurm); ``env`` reaches the engines, and ssh itself gets the pool's tag.

    >>> kw = engine_set_kwargs(PoolConfig(launcher="ssh", hosts="a,b"), 3, work_dir="/tmp/x", env={},
    ...                        engine_args=[])
    >>> kw["engines"], kw["remote_python"] == sys.executable
    ({'a': 2, 'b': 1}, True)
    >>> engine_set_kwargs(PoolConfig(launcher="slurm"), 2, work_dir="/tmp/x", env={},
    ...                   engine_args=[])["batch_file_name"]
    '/tmp/x/slurm_engine.sbatch'
    """
    env = dict(env)
    args = list(engine_args)
    kwargs: dict = {}
    if log and config.launcher != "ssh":  # ssh engines write on their own host (ipyparallel fetches it)
        kwargs["pool_log" if config.launcher == "local" else "output_file"] = log
    if config.launcher == "local":
        kwargs["delay"] = 0  # ipyparallel waits 0.1 s between local engines; a fork takes milliseconds
    if config.launcher in ("local", "mpi"):
        # our entry point starts importing torch before the engine registers, and drops the --mpi
        # that ipyparallel's MPI launcher always passes where mpi4py is missing (see engine_main)
        kwargs["engine_cmd"] = [sys.executable, "-m", "workbench.pool.engine_main"]
    if config.launcher == "slurm":
        kwargs.update(batch_template=slurm_script(config, n),
                      batch_file_name=os.path.join(work_dir, "slurm_engine.sbatch"))
    elif config.launcher == "mpi":
        mpi_args = []
        if config.hosts:
            mpi_args += ["--host", ",".join(f"{h}:{k}" for h, k in spread(n, list(config.hosts)).items())]
        kwargs["mpi_args"] = mpi_args
        # Open MPI refuses root without these (MPICH ignores them)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    elif config.launcher == "ssh":
        kwargs.update(engines=spread(n, list(config.hosts)), remote_python=sys.executable)
        kwargs["ssh_cmd"] = ssh_command(env.get(MARKER), log)
    kwargs.update(config.launcher_options)
    kwargs["environment"] = env
    kwargs["engine_args"] = args
    return kwargs
