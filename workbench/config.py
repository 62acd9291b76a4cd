"""Typed, validated configuration for a pool."""

from __future__ import annotations

import os
import re
from dataclasses import MISSING, dataclass, field, fields
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

LAUNCHERS = ("local", "slurm", "mpi", "ssh", "kubernetes", "allocation")
BACKENDS = ("auto", "gloo", "nccl")
# Slurm's accepted time formats: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes", "days-hours:minutes:seconds".
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")  # a pool's name: it is typed in `%dist attach NAME`
_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$")
# A Slurm job's time limit: the notebook is warned (and running Trainers checkpoint) this long before it ends.
WALLTIME_WARNING_S = 600.0


def default_launcher() -> str:
    """The launcher of a pool whose launcher is not named: ``allocation`` when this process runs inside a
    Slurm job (Open OnDemand, batchspawner, ``salloc``, ``sbatch``: the job's nodes are the pool), else
    ``local``.

    >>> default_launcher() == ("allocation" if os.environ.get("SLURM_JOB_ID") else "local")
    True
    """
    return "allocation" if os.environ.get("SLURM_JOB_ID") else "local"


def _about(help: str, *, flag: str | None = None, words: str | None = None, choices: tuple = (),
           group: str | None = None, launchers: tuple[str, ...] = (), refused: str | None = None,
           needed_by: tuple[str, ...] = (), needed: str | None = None, label: str | None = None,
           unit: str | None = None, hint: str | None = None, offered_for: tuple[str, ...] = (),
           dialog: int | None = None) -> dict:
    """A field's metadata: ``help``, its ``flag`` (default ``--field-name``), how a sentence names it
    (``words``), its ``choices``, and a ``group`` of options that exclude each other. An option of some
    launchers only names them (``launchers``; empty: every launcher takes it) and, if not the general one,
    the sentence that refuses it elsewhere (``refused``); ``needed_by``: the launchers that cannot start
    without it, and the sentence that says so (``needed``, ``{launcher}`` in it). Validation reads these
    (what each launcher does with its options is :mod:`workbench.pool.launch`'s).

    For the panel's start dialog ("Advanced..."): its ``label`` there (default: ``words``, capitalised) and
    the ``unit`` after it; the ``hint`` an empty box shows (``{default_n}``: the server's default number of
    engines); the launchers the dialog ``offered_for`` it (default: those that take it); ``dialog``: its
    place among the dialog's fields (``None``: the dialog does not offer it, only code and the magic do).
    """
    return {"help": help, "flag": flag, "words": words, "choices": tuple(choices), "group": group,
            "launchers": tuple(launchers), "refused": refused, "needed_by": tuple(needed_by),
            "needed": needed, "label": label, "unit": unit, "hint": hint,
            "offered_for": tuple(offered_for or launchers), "dialog": dialog}


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """How to start a pool.

    ``n``: number of engines (ranks); ``None`` means one per GPU (``nodes`` x ``gpus_per_node`` on a
    cluster, the visible GPUs on this machine), else 2 locally and one per node or host elsewhere.
    ``timeout``: seconds for engines to register and for the process group to form.
    ``collective_timeout``: how long one collective may wait before the backend gives up (``None``: 15
    minutes, or ``timeout`` if longer); the workbench's own hang detection (``%%distributed --timeout``)
    acts long before. ``share_gpus``: let more ranks than GPUs share them (over gloo, with a warning)
    instead of refusing to start.

    Launchers: ``local`` (this machine, the default outside a Slurm job), ``allocation`` (the default inside
    one: one engine per allocated GPU, else per allocated task, on every node of the Slurm job this kernel
    runs in, as steps of that job; ``nodes`` and ``gpus_per_node`` use part of it), ``slurm`` (one sbatch
    job: ``nodes``, ``gpus_per_node``, ``partition``, ``time``, ``account``; inside a Slurm job the same as
    ``allocation`` unless ``new_job``), ``mpi`` (``mpiexec``, optionally over ``hosts``), ``ssh`` (engines
    started over ssh on each of ``hosts``) and ``kubernetes`` (one pod per engine, or per ``gpus_per_pod``
    engines, in ``namespace``: ``image``, ``node_selector``, ``pod_template``; or the engines started inside
    pods that already run, chosen by the label selector ``pods``; see
    :mod:`workbench.pool.launch.kubernetes`). ``walltime_warning``: seconds before a Slurm job's time limit
    at which the notebook is warned once and a running Trainer with a ``Checkpoint`` callback saves at its
    next step (default 600). ``launcher_options`` are
    passed as they are to ipyparallel's engine launcher (e.g. ``{"ssh_args": [...]}``,
    ``{"options": "--qos=high"}``).

    Networking: ``address`` is where the controller, the heartbeat and metrics sockets of the kernel
    listen; ``interface`` names a network interface instead (its IPv4 address is used, and the ranks'
    gloo/NCCL traffic goes over the interface of the same network). Loopback is the default, which only
    reaches engines on this machine. ``idle_release``: seconds without a cell after which the pool is
    stopped and its nodes released (a warning comes first); ``None`` keeps it. ``name``: what people call
    the pool (``%dist attach NAME``); by default one is made from its id, e.g. ``pool-glad-heron``.

    A local pool larger than the machine holds (more ranks than 4 per core, or than the available memory
    at about 330 MiB per rank) is refused before anything starts; ``oversubscribe=True`` starts it anyway.

    ``keep=True``: the Jupyter server this kernel runs under starts and holds the pool, as it holds a pool
    started from its panel; this kernel attaches to it. The pool outlives a kernel restart (``%dist
    attach`` takes it back with its process group and the ranks' state) and stops with the server, or at
    its idle release. Outside a Jupyter server the start is refused before anything runs.

    >>> PoolConfig(n=2).backend
    'auto'
    >>> PoolConfig(launcher="slurm", nodes=2, gpus_per_node=4).engines
    8
    >>> PoolConfig(launcher="ssh", hosts="a,b").hosts
    ('a', 'b')
    >>> PoolConfig(n=0)
    Traceback (most recent call last):
    ...
    ValueError: n must be at least 1 (got 0): the pool needs one engine per rank.
    """

    # each field's metadata: the help text of its option (the magic's ``%dist start``, the panel's request),
    # and how the panel's start dialog offers it (``dialog``: its place there)
    n: int | None = field(default=None, metadata=_about(
        "number of ranks (default: GPUs, else 2)", flag="-n", words="engines", unit="ranks",
        hint="default: {default_n} here, one per GPU on a cluster", dialog=2))
    launcher: str = field(default_factory=default_launcher, metadata=_about(
        "how engines start (default: allocation inside a Slurm job, else local)", choices=LAUNCHERS,
        dialog=1))
    backend: str = field(default="auto", metadata=_about("collective backend", choices=BACKENDS, dialog=10))
    timeout: float = field(default=60.0, metadata=_about(
        "seconds for engines to register and the group to form", label="Start timeout", unit="s",
        dialog=11))
    address: str = field(default="127.0.0.1", metadata=_about(
        "IP address to listen on instead of an interface name", group="network"))
    interface: str | None = field(default=None, metadata=_about(
        "network interface the engines reach this kernel on (default: loopback)", group="network",
        hint="none: loopback, this machine only", offered_for=("slurm", "mpi", "ssh", "allocation"),
        dialog=6))
    nodes: int | None = field(default=None, metadata=_about(
        "Slurm: nodes to run engines on (inside a job: the first of its nodes)", hint="1",
        launchers=("slurm", "allocation"), dialog=4))
    gpus_per_node: int | None = field(default=None, metadata=_about(
        "one engine per GPU on every node or host, each pinned to its GPU", words="GPUs per node",
        launchers=("slurm", "mpi", "ssh", "allocation"),
        refused="gpus-per-node is for cluster launchers; a local pool takes -n (default: one engine per "
                "visible GPU).",
        hint="none: CPU engines", offered_for=("slurm", "ssh", "allocation"), dialog=5))
    partition: str | None = field(default=None, metadata=_about(
        "Slurm partition", hint="the cluster's default", launchers=("slurm",), dialog=7))
    time: str | None = field(default=None, metadata=_about(
        "Slurm time limit, e.g. 30 or 2:00:00", label="Time limit", hint="e.g. 30, 2:00:00 or 1-00:00",
        launchers=("slurm",), dialog=8))
    account: str | None = field(default=None, metadata=_about(
        "Slurm account", hint="your default account", launchers=("slurm",), dialog=9))
    hosts: tuple[str, ...] = field(default=(), metadata=_about(
        "ssh/mpi: hosts to start engines on, e.g. node1,node2", launchers=("ssh", "mpi"), needed_by=("ssh",),
        needed="--launcher {launcher} needs the hosts to start engines on: --hosts node1,node2.",
        hint="node1,node2", dialog=3))
    namespace: str | None = field(default=None, metadata=_about(
        "Kubernetes namespace of the engine pods (default: the kubeconfig context's, in a pod its own)",
        hint="the context's namespace", launchers=("kubernetes",), dialog=13))
    image: str | None = field(default=None, metadata=_about(
        "Kubernetes: container image of the engine pods (it has Python and this package installed)",
        hint="e.g. registry.example.org/team/workbench:1", launchers=("kubernetes",), dialog=14))
    gpus_per_pod: int | None = field(default=None, metadata=_about(
        "Kubernetes: nvidia.com/gpu each pod requests, one engine per GPU (none: one CPU engine per pod)",
        words="GPUs per pod", hint="none: CPU engines", launchers=("kubernetes",), dialog=15))
    node_selector: dict[str, str] = field(default_factory=dict, hash=False, metadata=_about(
        "Kubernetes: labels a node must have to run the engine pods, as a JSON object",
        launchers=("kubernetes",)))
    pod_template: str | None = field(default=None, metadata=_about(
        "Kubernetes: a YAML or JSON file with a Pod or PodTemplateSpec the engine pods start from (volumes, "
        "resources, tolerations; the container named 'engine', else the first, runs the engines)",
        hint="e.g. gpu-pod.yaml", launchers=("kubernetes",), dialog=16))
    pods: str | None = field(default=None, metadata=_about(
        "Kubernetes: start the engines inside pods that already run, chosen by this label selector "
        "(e.g. team=a,role=trainer) instead of creating pods", words="existing pods",
        hint="e.g. role=trainer", launchers=("kubernetes",), dialog=17))
    idle_release: float | None = field(default=None, metadata=_about(
        "stop the pool (release its nodes) after this many idle seconds"))
    oversubscribe: bool = field(default=False, metadata=_about(
        "start more local ranks than this machine holds (4 per core, ~330 MiB each)",
        hint="more ranks than this machine holds", offered_for=("local",), dialog=12))
    name: str | None = field(default=None, metadata=_about(
        "what to call the pool (default: made up from its id, e.g. pool-glad-heron)"))
    collective_timeout: float | None = field(default=None, metadata=_about(
        "seconds one collective may wait before the backend gives up (default: 15 minutes)"))
    share_gpus: bool = field(default=False, metadata=_about(
        "let more ranks than GPUs share them (over gloo) instead of refusing", label="Share GPUs"))
    keep: bool = field(default=False, metadata=_about(
        "hand the pool to the Jupyter server: it outlives this kernel (`%dist attach` takes it back)"))
    new_job: bool = field(default=False, metadata=_about(
        "Slurm: submit a job of its own even inside a Slurm job (by default its allocation is the pool)",
        launchers=("slurm",)))
    walltime_warning: float | None = field(default=None, metadata=_about(
        "seconds before the Slurm job's time limit to warn and checkpoint a running Trainer (default 600)",
        launchers=("slurm", "allocation")))
    launcher_options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, metadata=_about(
        "JSON object passed as it is to ipyparallel's engine launcher, e.g. '{\"ssh_args\": [\"-q\"]}'"))

    def __post_init__(self):
        if self.name is not None and not _NAME.match(self.name):
            raise ValueError(f"a pool name takes letters, digits, '-' and '_' only, at most 40 (got "
                             f"{self.name!r}): e.g. team-a.")
        if isinstance(self.hosts, str):
            object.__setattr__(self, "hosts", tuple(h.strip() for h in self.hosts.split(",") if h.strip()))
        else:
            object.__setattr__(self, "hosts", tuple(self.hosts))
        if self.n is not None and self.n < 1:
            raise ValueError(f"n must be at least 1 (got {self.n}): the pool needs one engine per rank.")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"unknown launcher {self.launcher!r}: choose one of {', '.join(LAUNCHERS)}.")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}: choose one of {', '.join(BACKENDS)}.")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds (got {self.timeout}).")
        if self.collective_timeout is not None and not self.collective_timeout > 0:
            raise ValueError(f"collective_timeout must be a positive number of seconds (got "
                             f"{self.collective_timeout}).")
        for name in ("nodes", "gpus_per_node", "gpus_per_pod"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1 (got {value}).")
        self._check_launcher_options()
        if self.pods is not None and (self.image or self.pod_template or self.node_selector):
            raise ValueError("pods starts the engines in pods that already run: image, pod_template and "
                             "node_selector are for pods the launcher creates; give one or the other.")
        if self.time is not None and not _SLURM_TIME.match(self.time):
            raise ValueError(f"time {self.time!r} is not a Slurm time limit: write minutes ('30'), "
                             "'HH:MM:SS' or 'D-HH:MM'.")
        if self.walltime_warning is not None and not self.walltime_warning > 0:
            raise ValueError(f"walltime_warning must be a positive number of seconds (got "
                             f"{self.walltime_warning}).")
        if self.idle_release is not None and not self.idle_release > 0:
            raise ValueError(f"idle_release must be a positive number of seconds (got {self.idle_release}).")
        if self.engines is not None and self.n is not None and self.n != self.engines:
            raise ValueError(f"-n {self.n} does not match {self._places()} x {self.gpus_per_node} GPUs "
                             f"= {self.engines} engines: give one of them.")

    def _check_launcher_options(self) -> None:
        """Options of other launchers refused, and options this launcher needs asked for, as the fields'
        metadata says (``launchers``, ``needed_by``, ``refused``): a sentence for each kind, in this order.

        >>> PoolConfig(partition="gpu", time="30")
        Traceback (most recent call last):
        ...
        ValueError: partition, time only apply to --launcher slurm (this pool's launcher is local).
        >>> PoolConfig(launcher="slurm", hosts="a")
        Traceback (most recent call last):
        ...
        ValueError: hosts apply to --launcher ssh or mpi (this pool's launcher is slurm).
        """
        refused: dict[tuple[str, ...], list[str]] = {}  # the launchers that take them -> options given
        own = []  # options whose refusal is a sentence of their own
        for f in fields(self):
            takers = f.metadata["launchers"]
            if takers and getattr(self, f.name) and self.launcher not in takers:
                if f.metadata["refused"]:
                    own.append(f.metadata["refused"])
                else:
                    refused.setdefault(takers, []).append(f.name)
        if refused:
            takers, names = next(iter(refused.items()))
            only = "only " if len(takers) == 1 else ""
            raise ValueError(f"{', '.join(names)} {only}apply to --launcher {' or '.join(takers)} (this "
                             f"pool's launcher is {self.launcher}).")
        for f in fields(self):
            if self.launcher in f.metadata["needed_by"] and not getattr(self, f.name):
                raise ValueError(f.metadata["needed"].format(launcher=self.launcher))
        if own:
            raise ValueError(own[0])

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON takes it (the pool's state file carries it; :meth:`from_dict` reads it back).

        >>> PoolConfig(launcher="ssh", hosts="a,b").to_dict()["hosts"]
        ['a', 'b']
        >>> PoolConfig.from_dict(PoolConfig(n=3, name="team-a").to_dict()) == PoolConfig(n=3, name="team-a")
        True
        """
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["hosts"] = list(self.hosts)
        out["launcher_options"] = dict(self.launcher_options)
        out["node_selector"] = dict(self.node_selector)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], **changes: Any) -> PoolConfig:
        """The config :meth:`to_dict` wrote, with ``changes`` on top; keys it does not know are left out
        (a state file written by another version of the workbench).

        >>> PoolConfig.from_dict({"n": 2, "launcher": "mpi", "colour": "red"}, n=4).n
        4
        """
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in {**data, **changes}.items() if k in known})

    def _places(self) -> str:
        return f"{len(self.hosts)} hosts" if self.hosts else f"{self.nodes or 1} nodes"

    @property
    def engines(self) -> int | None:
        """Engines the cluster options imply: one per GPU on every node or host (``None``: not implied)."""
        if not self.gpus_per_node:
            return None
        places = len(self.hosts) if self.hosts else (self.nodes or 1)
        return places * self.gpus_per_node


@dataclass(frozen=True)
class PoolOption:
    """One :class:`PoolConfig` field as an option: what the magic's parser, the panel's request and the
    panel's start dialog are made from (so each reaches every field)."""

    name: str
    kind: str  # count (whole, >= 1), seconds (> 0), switch, text, hosts, mapping
    flag: str
    help: str
    words: str
    default: Any
    choices: tuple = ()
    group: str | None = None
    label: str = ""  # the start dialog's name for it (and so every sentence the panel shows)
    unit: str | None = None
    hint: str | None = None
    launchers: tuple = ()  # the launchers the dialog offers it for; none: every one
    dialog: int | None = None  # its place in the start dialog; None: not offered there


_KINDS = {int: "count", float: "seconds", bool: "switch", str: "text", tuple: "hosts", dict: "mapping"}


def pool_options() -> list[PoolOption]:
    """Every field of :class:`PoolConfig`, in order, as an option.

    >>> [(o.flag, o.kind) for o in pool_options()][:4]
    [('-n', 'count'), ('--launcher', 'text'), ('--backend', 'text'), ('--timeout', 'seconds')]
    >>> [o.name for o in pool_options()] == [f.name for f in fields(PoolConfig)]
    True
    >>> [o.label for o in pool_options()][:4]
    ['Engines', 'Launcher', 'Backend', 'Start timeout']
    """
    hints = get_type_hints(PoolConfig)
    out = []
    for f in fields(PoolConfig):
        base = next(t for t in (int, float, bool, str, tuple, dict) if _is(hints[f.name], t))
        about = f.metadata
        default = f.default_factory() if f.default is MISSING else f.default
        words = about["words"] or f.name.replace("_", " ")
        out.append(PoolOption(f.name, _KINDS[base], about["flag"] or "--" + f.name.replace("_", "-"),
                              about["help"], words, default, about["choices"], about["group"],
                              about["label"] or words[:1].upper() + words[1:], about["unit"], about["hint"],
                              about["offered_for"], about["dialog"]))
    return out


def options_schema() -> list[dict[str, Any]]:
    """The start options as JSON, for a form in another language (the panel's start dialog renders them):
    every field of :class:`PoolConfig` with its label, unit, help, kind, choices, default, the launchers it
    applies to (``[]``: all) and whether the dialog ("Advanced...") offers it, the dialog's fields first in
    their places. A field added to :class:`PoolConfig` with a ``dialog`` place appears in the dialog.

    >>> [o["name"] for o in options_schema() if o["advanced"]][:4]
    ['launcher', 'n', 'hosts', 'nodes']
    >>> next(o for o in options_schema() if o["name"] == "timeout")  # doctest: +NORMALIZE_WHITESPACE
    {'name': 'timeout', 'label': 'Start timeout', 'unit': 's',
     'help': 'seconds for engines to register and the group to form', 'kind': 'seconds', 'choices': [],
     'default': 60.0, 'hint': None, 'launchers': [], 'advanced': True}
    """
    options = pool_options()
    placed = sorted((o for o in options if o.dialog is not None), key=lambda o: o.dialog)
    out = []
    for o in placed + [o for o in options if o.dialog is None]:
        default = list(o.default) if isinstance(o.default, tuple) else o.default
        out.append({"name": o.name, "label": o.label, "unit": o.unit, "help": o.help, "kind": o.kind,
                    "choices": list(o.choices), "default": default, "hint": o.hint,
                    "launchers": list(o.launchers), "advanced": o.dialog is not None})
    return out


def _is(hint, kind: type) -> bool:
    """Whether a type hint is ``kind`` (or ``kind | None``, or ``kind[...]``); bool is not an int here."""
    options = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    return any((get_origin(o) or o) is kind for o in options if o is not type(None))
