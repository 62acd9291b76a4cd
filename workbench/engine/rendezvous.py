"""What runs on each engine to join the process group.

The kernel calls these through ipyparallel: ``describe`` on every engine, then
``open_store`` on rank 0, then ``join`` on every rank at once.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from workbench.engine import agent, guard, hub_link, postmortem, stores, torchrun

log = logging.getLogger("workbench.engine")
# An elastic regroup's members wait this long for each other before it is re-planned (never the store's
# timeout); they look for the others every REGROUP_POLL_S and say whom they wait for every REGROUP_LOOK_S.
REGROUP_WAIT_S = 10.0
REGROUP_POLL_S = 0.02
REGROUP_LOOK_S = 0.5
OUTPUT_FLUSH_S = 0.05  # how often an engine sends what was printed (a line shows within 0.2 s in all)
# Objects that must outlive one call: rank 0's store (its listening socket) and the rank's facts.
_state: dict = {}


def describe() -> dict:
    """Host, pid, the GPUs this engine sees (count and UUIDs, in its own CUDA order), and the Slurm job and
    node it runs in (empty off Slurm): a lost rank's new engine starts as a step of that job, on that node."""
    gpus = torch.cuda.device_count()
    return {"host": socket.gethostname(), "pid": os.getpid(), "gpus": gpus,
            "gpu_uuids": [_gpu_uuid(i) for i in range(gpus)],
            "slurm_job": os.environ.get("SLURM_JOB_ID", ""),
            "slurm_node": os.environ.get("SLURMD_NODENAME", ""), "hub": hub_link.label()}


def _gpu_uuid(index) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def open_store(address: str, timeout_s: float) -> int:
    """Rank 0: start the TCPStore on ``address`` and return its port.

    We bind the listening socket ourselves: given port 0, TCPStore listens on every
    interface, and a local pool must stay on loopback.
    """
    close()
    store, port = stores.tcp_host(address, timeout_s)
    _state["store"] = store
    return port


def threads_for(own: set[int], others: list[set[int]]) -> int:
    """CPU threads for this rank: its own CPUs, split with the ranks here whose CPUs overlap them.

    >>> threads_for({0, 1, 2, 3}, [{0, 1, 2, 3}])   # two engines on the same 4 CPUs
    2
    >>> threads_for({0, 1}, [{2, 3}])               # Slurm bound each task to its own CPUs
    2
    """
    sharing = 1 + sum(bool(own & cpus) for cpus in others)
    return max(1, len(own) // sharing)


def _affinity(pid: int) -> set[int]:
    try:
        return set(os.sched_getaffinity(pid))
    except OSError:  # gone, or not ours to read: count it as sharing all of our CPUs
        return set(os.sched_getaffinity(0))


def collective_timeout(timeout_s: float) -> float:
    """The collective timeout for an interactive ``timeout_s``: the backstop behind the kernel's own hang
    detection, long enough for a slow first step (compiles, NCCL warm-up), never shorter than ``timeout_s``.

    >>> collective_timeout(60)
    900.0
    """
    return max(float(timeout_s), 900.0)


def join(*, rank: int, local_rank: int, world_size: int, address: str, port: int,
         backend: str, device: str, timeout_s: float, ifname: str | None, local_pids=(),
         collective_timeout_s: float | None = None, channel: dict | None = None, generation: int = 0,
         standby_address: str | None = None, store: dict | None = None,
         stores_folder: str | None = None, node_rank: int = 0, nodes: int = 1, run_id: str = "",
         agent_rank: int | None = None) -> dict:
    """Join the process group and put ``rank``, ``world_size``, ``device``... into the user namespace.

    ``backend``: the same string on every rank (the kernel's ``group_backend``). ``timeout_s`` bounds the
    rendezvous; collectives wait up to ``collective_timeout_s`` (default :func:`collective_timeout`).
    ``local_pids``: the engines of the other ranks on this host, whose CPUs this rank's threads share.
    ``store``: the group's rendezvous store (:mod:`.stores`; a local pool's is a file in its private
    folder), else the TCPStore rank 0 opened at ``address``:``port``. ``stores_folder``: where this
    engine's standby store lives (a local pool), else it listens on ``standby_address``. Returns rank,
    backend, threads, interface, where this rank's gloo listens (``endpoints``) and the spec of its
    standby store (``standby``, for elastic regroups).
    ``node_rank``, ``nodes``, ``run_id``: this host's place among the pool's hosts and the pool's id, for
    torchrun's environment (:mod:`.torchrun`).
    ``agent_rank``: the pool's rank of this engine, which its agent, beacons and metrics speak for (default
    ``rank``); a sub-mesh (``docs/submeshes.md``) forms its own default group, ``rank`` and ``world_size``
    its own, while the kernel keeps naming the engine by its pool rank. ``local_rank`` stays the pool's
    local rank there (a script's ``set_device(LOCAL_RANK)`` picks the rank's own GPU, not another sub-mesh's).
    """
    agent_rank = rank if agent_rank is None else agent_rank
    env = {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world_size,
           "MASTER_ADDR": address, "MASTER_PORT": port,
           # engines survive NCCL errors: the watchdog aborts the communicators (the next collective raises)
           # and never tears the process down; no heartbeat monitor that would kill a slow engine
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": 2, "TORCH_NCCL_ENABLE_MONITORING": 0}
    if ifname:  # set, not setdefault: a re-form on another network must not keep the old interface
        env.update(GLOO_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
    os.environ.update({k: str(v) for k, v in env.items()})
    torchrun.set_environment(rank=rank, local_rank=local_rank, world_size=world_size,
                             local_world_size=max(1, len(set(local_pids))), group_rank=node_rank,
                             group_world_size=nodes, address=address, port=port, run_id=run_id)
    own = set(os.sched_getaffinity(0))
    threads = threads_for(own, [_affinity(p) for p in local_pids if p != os.getpid()])
    torch.set_num_threads(threads)
    log.info("rank %d: %d threads, GLOO_SOCKET_IFNAME=%s NCCL_SOCKET_IFNAME=%s", rank, threads,
             os.environ.get("GLOO_SOCKET_IFNAME"), os.environ.get("NCCL_SOCKET_IFNAME"))
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend == "auto":  # a caller without a rank map (the kernel always passes the group's string)
        backend = "cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo"
    agent.stop()  # first: a command still on its way for the old group must not reach the new one
    guard.abort()  # what is left of an earlier group: abort, never destroy (that can block)
    if "baseline" not in _state:  # whatever listened before the first group is not gloo's
        _state["baseline"] = True
        guard.not_gloo(p for _, p in guard.listening())
    if store is not None:  # every rank opens the same file; nothing listens
        store = _state["store"] = stores.pool_store(store, timeout_s)
    else:
        store = _state.get("store") if rank == 0 else None
        if store is None:
            store = _state["store"] = stores.pool_store({"tcp": [address, port]}, timeout_s)
        if rank == 0:
            guard.not_gloo([port])
    _state.update(backend=backend, timeout_s=timeout_s, channel=channel,
                  collective_timeout_s=collective_timeout_s or collective_timeout(timeout_s))
    _init_group(backend, store, rank, world_size, dev)
    uuid = _gpu_uuid(dev) if dev.type == "cuda" else None
    _state.update(rank=rank, local_rank=local_rank, world_size=world_size, device=dev, gpu_uuid=uuid,
                  generation=generation, pool_rank=agent_rank)
    standby = _standby(stores_folder, standby_address or address) if channel else None
    if channel:  # beacons up, commands down: the pool's side channel, for the pool's rank
        agent.start(channel, agent_rank, generation)
    user_namespace().update(rank=rank, local_rank=local_rank, world_size=world_size, device=dev, dist=dist)
    torchrun.install(backend=backend, rank=rank, world_size=world_size, device=dev)
    postmortem.forget_on_next_cell()  # `%dist debug` shows the last cell's failure, never an older one
    for stream in (sys.stdout, sys.stderr):  # ipykernel sends printed text every 0.2 s: lines late by that
        if hasattr(stream, "flush_interval"):
            stream.flush_interval = OUTPUT_FLUSH_S
    return {"rank": rank, "backend": dist.get_backend(), "threads": threads, "gpu_uuid": uuid,
            "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "endpoints": guard.gloo_endpoints(),
            "standby": standby}


def _init_group(backend: str, store, rank: int, world_size: int, dev: torch.device,
                rendezvous_s: float | None = None) -> None:
    """``init_process_group`` with the interactive timeout (``rendezvous_s``: a shorter one, for a regroup)
    for the rendezvous and the longer backstop for collectives; then collectives are tracked afresh."""
    timeout = datetime.timedelta(seconds=rendezvous_s or _state["timeout_s"])
    torchrun.ORIGINAL["init_process_group"](backend, store=store, rank=rank, world_size=world_size,
                                            timeout=timeout, device_id=dev if dev.type == "cuda" else None)
    try:  # the rendezvous waited for ``timeout_s``; collectives get the longer backstop
        dist.group.WORLD.set_timeout(datetime.timedelta(seconds=_state["collective_timeout_s"]))
    except RuntimeError as exc:  # a backend that cannot change it keeps the interactive timeout
        log.warning("rank %d: collective timeout unchanged (%s)", rank, exc)
    guard.group_formed()
    guard.track_collectives()


def _standby(folder: str | None, address: str) -> dict:
    """This engine's standby store (opened once, kept): where the ranks left after a death meet to form
    their new group, without anyone having to open a store first (see :func:`regroup`). A file in the
    pool's private ``folder`` (a local pool), else a TCPStore listening on ``address``; returns its spec."""
    if "standby" not in _state:
        where = {"folder": folder} if folder else {"address": address}
        _state["standby"], spec = stores.host_store(where, _state["timeout_s"], f"standby-{os.getpid()}")
        _state["standby_spec"] = spec
        if "tcp" in spec:  # an abort never cuts the connections of the next group's meeting place
            guard.not_gloo([spec["tcp"][1]])
    return _state["standby_spec"]


class RegroupAbandoned(RuntimeError):
    """A regroup that cannot complete: a newer plan came while the members met (another rank was lost
    meanwhile), some members did not answer within the bound, or one that said it was ready never
    connected (lost in between). The caller takes the next plan."""


class InterruptibleStore(dist.Store):
    """``store`` whose waits end with :class:`RegroupAbandoned` once ``superseded()`` (the kernel re-planned):
    what ``init_process_group`` of a regroup meets through, so that the members never wait in it for one
    that was lost after it said it was ready (its peers' addresses never come). Polled every
    :data:`REGROUP_POLL_S`, within the wait's own timeout."""

    def __init__(self, store, superseded: Callable[[], bool], generation: int):
        super().__init__()
        self.store, self.superseded, self.generation = store, superseded, generation

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        wait_s = (timeout or self.store.timeout).total_seconds()
        t0 = time.monotonic()
        while not self.store.check(keys):
            if self.superseded():
                raise RegroupAbandoned(f"a newer plan came while group {self.generation} formed")
            if time.monotonic() - t0 > wait_s:
                raise dist.DistStoreError(f"{', '.join(keys)} not set within {wait_s:g} s")
            time.sleep(REGROUP_POLL_S)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self.store.get(key)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.wait(keys)
        return self.store.multi_get(keys)

    def set(self, key: str, value) -> None:
        self.store.set(key, value)

    def multi_set(self, keys: list[str], values: list) -> None:
        self.store.multi_set(keys, values)

    def add(self, key: str, value: int) -> int:
        return self.store.add(key, value)

    def compare_set(self, key: str, expected, desired) -> bytes:
        return self.store.compare_set(key, expected, desired)

    def check(self, keys: list[str]) -> bool:
        return self.store.check(keys)

    def delete_key(self, key: str) -> bool:
        return self.store.delete_key(key)

    def num_keys(self) -> int:
        return self.store.num_keys()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.store.set_timeout(timeout)


def _never() -> bool:
    return False


def await_members(store, world_size: int, generation: int, wait_s: float,
                  superseded: Callable[[], bool]) -> None:
    """Until every member of group ``generation`` said it is ready in ``store``; never longer than
    ``wait_s`` and never once ``superseded()`` (the kernel re-planned): :class:`RegroupAbandoned` then.
    The beacon says whom this rank waits for (the kernel re-plans without the members that do not answer).
    """
    keys = [f"ready/{r}" for r in range(world_size)]
    t0, started = time.monotonic(), time.time()  # the beacon's clock is the wall clock
    next_look = t0 + REGROUP_LOOK_S
    while not store.check(keys):
        now = time.monotonic()
        if superseded():
            raise RegroupAbandoned(f"a newer plan came while group {generation} formed")
        if now - t0 > wait_s or now >= next_look:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            agent.regroup_status.update(generation=generation, missing=missing, since=started)
            if now - t0 > wait_s:
                raise RegroupAbandoned(f"rank {', '.join(map(str, missing))} of group {generation} did not "
                                       f"answer within {wait_s:g} s")
            next_look = now + REGROUP_LOOK_S
        time.sleep(REGROUP_POLL_S)


def regroup(plan: dict, superseded: Callable[[], bool] = agent.plan_pending,
            wait_s: float | None = None) -> dict:
    """Leave the current group and form the one ``plan`` describes (an elastic shrink or grow).

    ``plan``: ``generation`` (the new group's), ``members`` (``[host, pid]`` of every engine of the new
    group in rank order: those that stay, then those that join) and ``store``/``host`` (the spec of a
    member's standby store (:mod:`.stores`), and that member). The engine keeps its Python state; its agent
    follows the new rank and generation without restarting, so that no command is missed meanwhile.
    Within a sub-mesh (``agents``: the members' pool ranks) the agent keeps speaking for its pool rank
    (:func:`agent_rank`) while ``rank``, ``world_size`` and torchrun's environment become the new group's.
    The members wait for each other at most ``wait_s`` (default: :data:`REGROUP_WAIT_S` after a loss, the
    pool's timeout for a planned change, whose new ranks may be slow to come) and stop waiting as soon as
    ``superseded()``
    (a newer plan is there): :class:`RegroupAbandoned` (nobody waits for a rank known lost).
    """
    rank, world_size = plan["members"].index(me()), len(plan["members"])
    if wait_s is None:  # after a loss the members are all up already; a new rank may take a while to come
        wait_s = REGROUP_WAIT_S if plan.get("lost") else _state["timeout_s"]
    if dist.is_initialized():
        guard.abort()  # what is left of the old group: abort, never destroy (that can block)
    if me() == plan["host"]:
        base = _state["standby"]
    else:
        try:  # bounded: the member that hosts the meeting may be lost too
            base = stores.pool_store(plan["store"], min(wait_s, _state["timeout_s"]))
        except RuntimeError as exc:  # a store that does not answer: DistError, a RuntimeError
            raise RegroupAbandoned(f"the meeting place of group {plan['generation']} did not answer: "
                                   f"{exc}") from None
        _state["peer_store"] = base  # the group's gloo pairs met through it: keep it with the group
    store = dist.PrefixStore(f"workbench-elastic/{plan['generation']}/", base)
    # every member's agent has cut the old group's connections before anyone connects anew: a late cut
    # would hit the new group's connections where gloo listens on the same port again
    store.set(f"ready/{rank}", "1")
    await_members(store, world_size, plan["generation"], wait_s, superseded)
    dev = _state.get("device", torch.device("cpu"))
    # a member lost after it said ready never connects: a newer plan (the kernel routed around it) ends the
    # wait for it at once, the next plan forms without it
    forming = InterruptibleStore(store, superseded, plan["generation"])
    try:
        _init_group(_state["backend"], forming, rank, world_size, dev,
                    rendezvous_s=min(wait_s, _state["timeout_s"]))
    except RuntimeError as exc:  # superseded, or the connect timed out (DistStoreError, a RuntimeError)
        raise RegroupAbandoned(f"group {plan['generation']} did not form: {exc}") from None
    forming.superseded = _never  # the group formed: its later store waits (new_group) are not the plan's
    agent.regroup_status.clear()
    speaks_for = agent_rank(plan, rank)
    _state.update(rank=rank, world_size=world_size, generation=plan["generation"], pool_rank=speaks_for)
    now = agent.current()
    if now is not None:
        now.retarget(speaks_for, plan["generation"])
    elif _state.get("channel"):  # an engine that joins: from now on it speaks for its rank
        agent.start(_state["channel"], speaks_for, plan["generation"])
    user_namespace().update(rank=rank, world_size=world_size)
    torchrun.retarget(rank=rank, world_size=world_size)
    return {"rank": rank, "endpoints": guard.gloo_endpoints()}


def hear_plans(plan: dict) -> None:
    """A new engine about to join the group of ``plan``: its agent starts now, speaking for the rank the plan
    gives it, so that a newer plan (a member lost while it joins: one re-plan, the joiner included) reaches it
    while it waits for the others, and the kernel hears it wait. Nothing where an agent runs already."""
    if agent.current() is None and _state.get("channel"):
        agent.start(_state["channel"], agent_rank(plan, plan["members"].index(me())), plan["generation"])


def agent_rank(plan: dict, rank: int) -> int:
    """The pool rank the agent of the member ``rank`` (its rank in the plan's new group) speaks for: that rank
    itself where the plan renumbers the pool, its pool rank where the plan regroups one sub-mesh
    (``agents``: the members' pool ranks, which a sub-mesh's regroup keeps; ``docs/submeshes.md``).

    >>> agent_rank({"members": [["h", 1], ["h", 2]]}, 1)
    1
    >>> agent_rank({"members": [["h", 1], ["h", 2]], "agents": [2, 3]}, 1)
    3
    """
    agents = plan.get("agents")
    return agents[rank] if agents else rank


def join_alone(*, device: str, backend: str, timeout_s: float, channel: dict | None = None,
               standby_address: str = "127.0.0.1", stores_folder: str | None = None) -> dict:
    """A group of one, for a new engine that replays the notebook's setup before it joins the others
    (its collectives are then no-ops). No agent yet: it speaks for no rank of the pool until it joins
    (:func:`join`, or :func:`regroup` into a running elastic group). Returns its standby store's spec
    (see :func:`join` for ``stores_folder`` and ``standby_address``)."""
    agent.stop()
    guard.abort()
    if "baseline" not in _state:  # whatever listened before the first group is not gloo's
        _state["baseline"] = True
        guard.not_gloo(p for _, p in guard.listening())
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend == "auto":
        backend = "cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo"
    _state.update(backend=backend, timeout_s=timeout_s, channel=channel,
                  collective_timeout_s=collective_timeout(timeout_s))
    store = _state["alone_store"] = dist.HashStore()  # a group of one meets nobody: nothing listens
    _init_group("gloo", store, 0, 1, dev)
    _state.update(rank=0, world_size=1, generation=-1, device=dev, pool_rank=0)
    user_namespace().update(rank=0, local_rank=0, world_size=1, device=dev, dist=dist)
    return _standby(stores_folder, standby_address)


def me() -> list:
    """How the kernel names this engine in a regroup plan: ``[host, pid]``."""
    return [socket.gethostname(), os.getpid()]


def identity() -> dict:
    """This engine's rank in the pool (its agent's: in a sub-mesh not its rank there), device and GPU UUID
    (rank 0 on the CPU before any join)."""
    return {"rank": _state.get("pool_rank", _state.get("rank", 0)), "device": _state.get("device", "cpu"),
            "gpu_uuid": _state.get("gpu_uuid")}


def generation() -> int:
    """Which process group this is: the kernel counts them, so every rank sees a re-formed one at once."""
    return _state.get("generation", 0)


def close() -> None:
    """Leave the process group and close the store (normal path only)."""
    agent.stop()
    if dist.is_initialized():
        torchrun.ORIGINAL["destroy_process_group"]()
    _state.pop("store", None)


def user_namespace() -> dict:
    """The namespace the user's cells run in on this engine."""
    from IPython import get_ipython

    ip = get_ipython()
    return ip.user_ns if ip is not None else globals()
