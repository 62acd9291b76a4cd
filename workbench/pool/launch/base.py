"""What one way of starting engines does differently: the base of the launcher objects.

A pool's :class:`~workbench.config.PoolConfig` names its launcher; :func:`workbench.pool.launch.launcher_for`
makes the one object for it, once. The pool (:class:`~workbench.pool.cluster.EnginePool`), the session and
the server ask that object whatever differs between launchers; no code elsewhere compares a launcher's
name (``tests/unit/house/test_layers.py`` holds that).

The object is a thin layer over ipyparallel's own launcher family (``ipyparallel.cluster.launcher``): an
ipyparallel engine-set launcher starts, watches and stops the engine processes (:attr:`Launcher.engine_set`,
made cancellable and writing the pool's log in :mod:`workbench.pool.launch.spawn`), with the traits
:meth:`Launcher.engine_set_kwargs` gives it. The object adds what ipyparallel does not know:

- sizes and places: the default engine count, what this machine holds, the GPUs to fit, whether the
  engines need a routable address;
- the engines' environment, and where their ranks meet (a private folder on this machine, or TCP);
- replacements: where a lost rank's new engine starts (:meth:`Launcher.where_to_start`) and how
  (:meth:`Launcher.start_more`), or why it cannot (:attr:`Launcher.can_add_engines`);
- fencing and signalling the engines;
- the words of a start that failed or waits.

A new launcher (Slurm inside the allocation, Kubernetes) is one subclass here: its :attr:`name`, its
:attr:`engine_set` (an ipyparallel launcher class) and the methods where it differs; its name goes into
``workbench.config.LAUNCHERS`` and into the ``launchers`` of the options it takes.

>>> from workbench.pool.launch import launcher_for
>>> launcher_for(PoolConfig(launcher="ssh", hosts="a,b")).default_engines()
2
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from workbench.config import PoolConfig
from workbench.errors import PoolStartError
from workbench.pool.machine import netif
from workbench.pool.rankmap import ranks_text

if TYPE_CHECKING:
    from workbench.pool.records.state import PoolState

# the engines' entry point (workbench.pool.processes.engine_main), for launchers that start a command
ENGINE_MAIN = [sys.executable, "-m", "workbench.pool.processes.engine_main"]


class Pool(Protocol):
    """The pool as its launcher sees it: what a launcher object may ask of the
    :class:`~workbench.pool.cluster.EnginePool` that asks it (it is one)."""

    pool_id: str
    env: dict[str, str]  # what every engine of the pool gets (its tag among it)
    log_file: Path | None
    state: PoolState  # what its state file says (its ranks, as the sessions published them)

    @property
    def engine_args(self) -> list[str]: ...

    def start_engine_set(self, n: int, placement: dict | None = None) -> None:
        """Start ``n`` engines through this launcher, with its :meth:`Launcher.engine_set_kwargs`."""

    def start_engine_set_with(self, engine_set: type, n: int, kwargs: dict) -> list:
        """Start ``n`` engines with another ipyparallel engine-set launcher; their launchers."""

    def engine_sets(self) -> list:
        """ipyparallel's engine-set launchers of the pool."""

    def engine_launchers(self) -> Iterable:
        """Every engine launcher (one per engine, or the whole set)."""

    def local_launchers(self) -> Iterable:
        """The engine launchers whose process runs on this machine."""


class Launcher:
    """How a pool's engines start, and everything that follows from where they run.

    ``config``: the pool's config. The class attributes say what a launcher is; the methods do what it does.
    """

    name: ClassVar[str] = ""  # the config's ``launcher``
    engine_set: ClassVar[type]  # the ipyparallel engine-set launcher that starts the engines
    on_this_machine: ClassVar[bool] = False  # every engine runs here: pids, pidfds and signals reach them
    can_add_engines: ClassVar[bool] = True  # new engines can join a running pool (restart, scale, replace)
    cannot_add: ClassVar[str] = ""  # where they cannot: why, in the words of an elastic run that lost a rank
    # a lost engine elsewhere may be only cut off: it is fenced (refused, told to stop, ended where possible)
    fences: ClassVar[bool] = True
    poll_s: ClassVar[float] = 0.1  # how often a start looks at its engines
    # what to check when the launcher's command refused the start
    refusal_advice: ClassVar[str] = "Check the hosts and the launcher's options."
    # what to do after a start failed in another way
    failed_todo: ClassVar[str] = "The log has the whole output."

    def __init__(self, config: PoolConfig):
        self.config = config

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- sizes and places ------------------------------------------------------------------
    def default_engines(self, local_gpus: int = 0) -> int:
        """How many engines (ranks) a pool starts when ``-n`` is not given: ``n``, else one per GPU the
        cluster options name, else the launcher's own default (``local_gpus``: this machine's GPUs)."""
        if self.config.n is not None:
            return self.config.n
        if self.config.engines is not None:
            return self.config.engines
        return self._default_count(local_gpus)

    def _default_count(self, local_gpus: int) -> int:
        return len(self.config.hosts) or 2

    def node_order(self) -> list[str]:
        """The nodes (Slurm names or hosts) in the order their ranks take (empty: as the engines came)."""
        return []

    def visible_gpus(self) -> int:
        """The GPUs the engines see, as far as this machine knows (0: they run elsewhere)."""
        return 0

    def check_gpu_fit(self, n: int, *, backend: str = "auto") -> None:
        """Refuse ``n`` ranks that do not fit the GPUs, before anything starts (elsewhere: nodes say so)."""

    def check_capacity(self, n: int) -> None:
        """Refuse ``n`` ranks that this machine cannot hold, before anything starts."""

    def preflight(self, n: int) -> None:
        """Refuse ``n`` more engines that the launcher's own system will not start, asking it before
        anything starts (Kubernetes: the user's rights in the namespace). Most launchers: nothing to ask."""

    def needs_routable_address(self) -> bool:
        """True when engines may run on other machines, so loopback cannot reach them."""
        return any(not netif.is_loopback(h.split("@")[-1]) for h in self.config.hosts)

    def where(self) -> str:
        """Where the engines run, in a sentence."""
        return ", ".join(self.config.hosts)

    def configured(self, config: PoolConfig) -> PoolConfig:
        """The config a pool of this launcher starts with: ``config`` as it is, or (a launcher that knows
        where its engines run) with the address they reach this kernel on when none was named."""
        return config

    def notes(self, n: int) -> list[str]:
        """Sentences a start of ``n`` engines says besides its progress (it uses part of an allocation...)."""
        return []

    def check_address(self, address: str) -> None:
        """Refuse loopback where engines are elsewhere, naming the interfaces a person can choose from."""
        if self.config.interface is None and netif.is_loopback(address) and self.needs_routable_address():
            raise ValueError(
                f"--launcher {self.name} starts engines on other machines, and {self.where()} cannot reach "
                f"this kernel on loopback ({address}). Name the interface they reach it on, e.g. --interface "
                f"eth0 (interfaces here: {netif.describe_interfaces()}); --interface lo only works when the "
                "nodes are this machine.")

    # -- the engines ----------------------------------------------------------------------------
    @property
    def forks(self) -> bool:
        """Whether the pool's processes are forked from a zygote (:mod:`workbench.pool.processes.zygote`)."""
        return False

    def engine_env(self, n: int) -> dict[str, str]:
        """The environment each of ``n`` engines gets besides the kernel's."""
        return {"OMP_NUM_THREADS": "1"}

    def store_folder(self, pool_id: str, create: bool = True) -> str | None:
        """Where the ranks meet (FileStores) and the side channel's sockets lie: a private folder of this
        machine when every engine runs here; None where they meet over TCP."""
        return None

    def hubs(self, pool_id: str, channel: dict) -> dict | None:
        """How the pool's hosts get their hubs (:mod:`workbench.pool.processes.host_hub`: each host's engines'
        side channel, merged per host before the kernel sees it), for the zygote that forks the engines; None
        where the engines talk to the relay themselves (their output then comes per rank)."""
        return None

    def engine_set_kwargs(self, n: int, *, work_dir: str, env: dict[str, str], engine_args: list[str],
                          log: str = "", placement: dict | None = None) -> dict:
        """Keyword arguments for ``Cluster.start_engines(n, **kwargs)``: the traits of :attr:`engine_set`.

        ``work_dir``: a scratch folder of the pool (batch scripts go there, never into the notebook's
        folder); ``env``: what reaches the engines; ``log``: the file their output goes to; ``placement``:
        where replacements start (:meth:`where_to_start`). The config's ``launcher_options`` go last.
        """
        kwargs = self.traits(n, work_dir=work_dir, env=env, log=log)
        kwargs.update(self.config.launcher_options)
        kwargs["environment"] = self.environment(env)
        kwargs["engine_args"] = list(engine_args)
        return kwargs

    def traits(self, n: int, *, work_dir: str, env: dict[str, str], log: str) -> dict:
        """This launcher's own traits for ``n`` engines (see :meth:`engine_set_kwargs`)."""
        return {}

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """The environment the engine set is started with: ``env``, plus what the launcher itself needs."""
        return dict(env)

    def start_engines(self, pool: Pool, n: int) -> None:
        """Start a pool's ``n`` engines (one engine set here; a launcher with one per node starts several)."""
        pool.start_engine_set(n)

    # -- replacements ---------------------------------------------------------------------------
    def where_to_start(self, pool: Pool | None, lost: list, ranks: list,
                       progress: Callable[[str], None]) -> dict | None:
        """Where new engines for the ``lost`` ranks start (None: anywhere the launcher starts them), or a
        ValueError in one sentence where they cannot; ``ranks``: the group's ranks now (a dead rank among
        them until it is replaced); ``progress`` hears where they moved."""
        return None

    def start_more(self, pool: Pool, n: int, placement: dict | None) -> list:
        """Start ``n`` more engines for ``pool`` (at ``placement``, from :meth:`where_to_start`); return the
        launchers whose ending before their engine registered is a failure (none: the pool's wait says)."""
        pool.start_engine_set(n, placement)
        return []

    def steps_ended(self, ended: int, log: Path | None) -> str:
        """What to say when ``ended`` launchers of :meth:`start_more` ended before their engine registered."""
        return f"{ended} new engine(s) ended before they registered; the pool's log ({log}) has their output."

    # -- fencing and signalling -------------------------------------------------------------------
    def fence(self, pool: Pool, pids: list[int]) -> None:
        """End these engines, declared lost, where they run. Here: nothing; an engine of most launchers
        fences itself when it hears the kernel again (:mod:`workbench.engine.agent`)."""

    def fenced_ended(self, pids: set[int]) -> set[int]:
        """Of the engines declared lost (``pids``), those known ended."""
        return set()

    def signal(self, ranks: list, sig: int, agents: Callable[[list, int], None]) -> None:
        """Send ``sig`` to the engines of ``ranks``: through each rank's agent (``agents(ranks, sig)``), the
        engines having no ipyparallel nanny to do it."""
        agents(ranks, sig)

    def close(self) -> None:
        """The pool stopped: let go of whatever this object still runs (and delete what it created that
        :meth:`lease_jobs` names: the pool's stop leaves those commands out)."""

    def lease_jobs(self, pool_id: str) -> list[dict]:
        """What the lease runs when pool ``pool_id``'s owner dies, beside its batch jobs and remote engines:
        ``[{"id", "cancel": argv}]`` (a Kubernetes pool: one delete of its objects)."""
        return []

    # -- what the launcher's own system says ------------------------------------------------------
    def lost_hosts(self, pool: Pool) -> dict[str, str]:
        """Hosts whose engines the launcher's own system says are gone, with how (``{host: how}``): the
        health watcher counts their ranks lost at once, beside what the heartbeats say. Most launchers
        know nothing of the kind: {}."""
        return {}

    def places(self, pool: Pool) -> dict[str, str]:
        """Hosts of the pool that are not machines, with the machine each is on (a Kubernetes pod: its
        node), for the tables that show ranks: ``{host: machine}``. Most launchers: {}."""
        return {}

    def start_failed(self, pool: Pool) -> PoolStartError | None:
        """The launcher's own word that a start in progress cannot succeed (a pod no node fits), as the
        start's one error; None while it may."""
        return None

    # -- the Slurm job the pool runs in, and its time limit -------------------------------------------
    def allocation_record(self, pool: Pool | None = None) -> dict | None:
        """The Slurm job the pool's engines run in, as its state records it (``{job, nodes, gpus, tasks,
        inside}``; None: no such job, or not yet)."""
        return None

    def ends(self, pool: Pool | None = None) -> tuple[bool, float | None]:
        """Whether the pool's Slurm job still holds its nodes, and when its time limit ends it (None: no
        limit, or no job): what :class:`~workbench.pool.watch.walltime.Walltime` asks."""
        return True, None

    # -- a start that waits or fails ------------------------------------------------------------
    @property
    def via(self) -> str:
        """How progress names the launcher (``starting 8 engines through slurm``)."""
        return f" through {self.name}"

    def engines_exited(self, dead: int, n: int) -> str:
        """What to say when ``dead`` of ``n`` engines (or their launch) ended while starting."""
        return f"{dead} of {n} engines exited while starting"

    def job_states(self, engine_sets: list) -> dict[str, str]:
        """Each batch job of the pool with its state and reason (a start that waits says them)."""
        return {}

    def why_slow(self, pool: Pool) -> str:
        """What the engines of a start that timed out were waiting for, as the end of its sentence."""
        return ""

    def explain(self, exc: BaseException, log: Path | None) -> PoolStartError | None:
        """The launcher's own reading of ``exc``, which ended a start (None: the general one applies)."""
        return None


def go_on(left: int) -> str:
    """What the ranks left can do, the end of a refusal to bring lost ranks back.

    >>> go_on(2)
    'go on with the 2 ranks left (`%dist scale 2`), or stop and start the pool.'
    >>> go_on(0)
    'no rank is left: stop and start the pool.'
    """
    if left == 0:
        return "no rank is left: stop and start the pool."
    return f"go on with the {ranks_text(left)} left (`%dist scale {left}`), or stop and start the pool."


def ranks_left(lost: list, ranks: list) -> int:
    """How many of ``ranks`` are not ``lost`` (by engine).

    >>> R = type("R", (), {})
    >>> a, b = R(), R(); a.engine_id, b.engine_id = 1, 2
    >>> ranks_left([b], [a, b])
    1
    """
    gone = {r.engine_id for r in lost}
    return sum(1 for r in ranks if r.engine_id not in gone)


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
