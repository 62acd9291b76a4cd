"""The kernel side of the process group: which engine is which rank, forming, re-forming, aborting.

Everything here runs in the kernel and reaches the engines through the pool's door
(:class:`~workbench.remote.door.Door`); what runs on the engines is :mod:`workbench.engine.rendezvous`
(describe, open the store, join) and :mod:`workbench.engine.guard` (abort), from the catalogue
:mod:`workbench.remote` (the kernel imports no torch).

>>> group = ProcessGroup(pool, config, Door(pool))  # doctest: +SKIP
>>> group.seat(build_rank_map(group.describe(pool.client.ids)))   # doctest: +SKIP
>>> group.form(beacon_url=None)                     # doctest: +SKIP
>>> group.backend                                   # doctest: +SKIP
'gloo'
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace

from workbench import remote
from workbench.config import PoolConfig
from workbench.errors import PoolStartError
from workbench.pool.cluster import EnginePool
from workbench.pool.rankmap import (
    EngineInfo,
    RankInfo,
    extend_rank_map,
    format_ranks,
    group_backend,
    remap_engines,
    remap_moved,
)
from workbench.pool.records import state as pool_state
from workbench.remote.door import Door
from workbench.wire import Command


class ProcessGroup:
    """One torch.distributed group over a pool's engines, seen from the kernel.

    ``ok`` is False once a fault aborted (or may have broken) the group: the next cell re-forms it.

    Only this class writes its fields (and the pool's engine count, ``pool.n``): other rooms change
    them through its methods (:meth:`seat`, :meth:`adopt`, :meth:`forget_lost`, :meth:`follow`,
    :meth:`heard`, :meth:`mark_broken`, :meth:`mark_destroyed`, :meth:`heard_groups`), so a reader finds
    every change of the group here.
    """

    def __init__(self, pool: EnginePool, config: PoolConfig, door: Door):
        self.pool, self.config, self.door = pool, config, door
        self.ranks: list[RankInfo] = []
        self.backend: str | None = None
        self.ok = False
        self.endpoints: dict[int, list] = {}  # rank -> its gloo listeners ([ip, port]): what an abort cuts
        self.generation = 0  # counts the groups formed: the engines' agents take commands for the current one
        self.standby: dict[int, dict] = {}  # engine id -> the spec of its standby store (regroups)
        self.lost: list[RankInfo] = []  # ranks an elastic run went on without (`%dist restart` replaces them)
        self.fenced: list[RankInfo] = []  # engines declared lost: refused, told to stop (kept for status)
        self.destroyed: list[int] = []  # ranks where a cell ended the default group itself (torch's own
        # destroy_process_group, which a library may hold: not the pool's deferred one)

    @property
    def local(self) -> bool:
        """Every engine runs on this machine (the launcher says: pids reach them, ranks meet in files)."""
        return self.pool.launcher.on_this_machine

    # -- changes from the other rooms -----------------------------------------------------------
    def seat(self, ranks: list[RankInfo]) -> None:
        """The rank map from now on (a start, a new engine in, a regroup); the pool counts as many."""
        self.ranks = list(ranks)
        self.pool.n = len(self.ranks)

    def adopt(self, infos: list[RankInfo]) -> None:
        """New engines for the ranks an elastic run went on without join the map after the others."""
        self.seat([*self.ranks, *infos])
        self.lost = []

    def note_standby(self, info: RankInfo, spec: dict) -> None:
        """The standby store of a new engine (its setup replay opened it): once it joins a running elastic
        group it may host the next regroup like a rank that was there from the start."""
        self.standby[info.engine_id] = spec

    def forget_lost(self, infos: list[RankInfo]) -> None:
        """These lost ranks were brought back (as new ranks of a running elastic run)."""
        self.lost = [r for r in self.lost if r not in infos]

    def follow(self, ranks: list[RankInfo], *, backend: str | None, generation: int, endpoints: dict,
               ok: bool) -> None:
        """Take in a group another notebook formed on the same pool (from the pool's state file)."""
        self.seat(ranks)
        self.backend, self.generation, self.ok = backend, generation, ok
        self.destroyed = [] if ok else self.destroyed
        self.endpoints = {int(rank): eps for rank, eps in endpoints.items()}

    def heard(self, endpoints: dict[int, list]) -> None:
        """Every rank's gloo listeners as their beacons say (after an elastic regroup)."""
        self.endpoints = dict(endpoints)

    def mark_broken(self) -> None:
        """A fault may have broken the group: the next cell re-forms it."""
        self.ok = False

    def mark_destroyed(self, ranks) -> None:
        """The default group is gone on ``ranks`` (a cell destroyed it there): the next cell re-forms it."""
        self.destroyed = sorted({*self.destroyed, *ranks})
        self.ok = False

    def heard_groups(self, beats: dict) -> None:
        """What the ranks' latest beacons say of their default group: a rank of this group whose beacon
        says it has none had it destroyed (a cell that did so and raised nothing). Read between cells. A group
        already known broken (a fault aborted it, which also leaves the ranks without one) stays "aborted".

        >>> g = ProcessGroup.__new__(ProcessGroup)
        >>> g.ranks, g.generation, g.destroyed, g.ok = [RankInfo(0, 0, 0, "h", 7, "cpu", 0)], 1, [], True
        >>> g.heard_groups({0: {"pid": 7, "generation": 1, "group": False}})
        >>> g.destroyed, g.ok
        ([0], False)
        >>> g.destroyed, g.ok = [], False  # a fault aborted it: the ranks have no group, none destroyed it
        >>> g.heard_groups({0: {"pid": 7, "generation": 1, "group": False}})
        >>> g.destroyed
        []
        """
        if not self.ok:
            return
        def says_none(r: RankInfo) -> bool:  # that engine's beacon, of this group
            beat = beats.get(r.rank) or {}
            return beat.get("pid") == r.pid and beat.get("generation") == self.generation \
                and beat.get("group") is False

        gone = [r.rank for r in self.ranks if says_none(r)]
        if gone:
            self.mark_destroyed(gone)

    def describe(self, engine_ids) -> list[EngineInfo]:
        """Host, pid and visible GPUs of each engine (they answer once ``import torch`` is done)."""
        engine_ids = list(engine_ids)
        infos = self.door.call_within(self.config.timeout, remote.describe, engine_ids)
        return [EngineInfo(eid, i["host"], i["pid"], i["gpus"], tuple(i.get("gpu_uuids", ())),
                           i.get("slurm_job", ""), i.get("slurm_node", ""), i.get("hub", ""))
                for eid, i in zip(engine_ids, infos, strict=True)]

    def form(self) -> None:
        """Form (or re-form) the group on every rank of :attr:`ranks` at once."""
        backend = group_backend(self.config.backend, self.ranks, shared=self.config.share_gpus)
        root = self.ranks[0]
        # Off this machine each rank talks over the interface that reaches the kernel's address, and rank 0
        # binds the store on its own address there (never on all interfaces).
        routes = {}
        if not self.local:
            found = self.door.call(remote.route_to, self.ranks, self.config.address)
            routes = {r.rank: route for r, route in zip(self.ranks, found, strict=True)}
        store_address = routes[root.rank]["address"] if routes else self.config.address
        own = {r.rank: routes[r.rank]["address"] if routes else self.config.address for r in self.ranks}
        generation = self.generation + 1
        # A local pool meets in a file of its private folder (nothing listens, no other user opens it);
        # across hosts rank 0 hosts a TCPStore on its address of the cluster interface.
        folder = self.stores_folder()
        store = {"file": os.path.join(folder, f"group-{generation}")} if folder else None
        port = 0 if folder else self.door.call_one(remote.open_store, root, store_address,
                                                   self.config.timeout)
        calls = [
            (r, dict(rank=r.rank, local_rank=r.local_rank, world_size=len(self.ranks),
                     address=store_address, port=port, backend=backend, device=r.device,
                     timeout_s=self.config.timeout, collective_timeout_s=self.config.collective_timeout,
                     local_pids=[o.pid for o in self.ranks if o.host == r.host],
                     ifname="lo" if self.local else routes[r.rank]["ifname"], channel=self.pool.channel,
                     generation=generation, standby_address=own[r.rank], node_rank=r.node_rank,
                     nodes=len({o.host for o in self.ranks}), run_id=self.pool.pool_id or "",
                     **({"store": store, "stores_folder": folder} if folder else {})))  # local: files
            for r in self.ranks
        ]
        try:
            joined = self.door.call_apart(remote.join, calls, within=self.config.timeout + 5)
        except Exception as exc:
            raise PoolStartError(f"the process group did not form: {exc}") from exc
        self.backend, self.generation = joined[0]["backend"], generation
        self.endpoints = {j["rank"]: j["endpoints"] for j in joined}
        self.standby = {r.engine_id: j["standby"] for r, j in zip(self.ranks, joined, strict=True)
                        if j.get("standby")}
        if folder:  # the groups before this one are over: their meeting files go
            for old in pool_state.old_group_stores(folder, generation):
                old.unlink(missing_ok=True)
        self.lost = [r for r in self.lost if r.engine_id not in {k.engine_id for k in self.ranks}]
        self.ok, self.destroyed = True, []

    def stores_folder(self) -> str | None:
        """Where a local pool's ranks meet (0700, created on first use); None for pools across hosts."""
        return self.pool.launcher.store_folder(self.pool.pool_id)

    def replace(self, ranks: list[int], hosts: dict[str, int] | None = None) -> None:
        """New engines (through the pool's launcher) for these dead ranks, on the same host and device
        (``hosts``: an ssh pool's placement, where a host that did not answer is replaced by another)."""
        new_ids = self.pool.start_more(len(ranks), set(self.pool.client.ids),
                                       alive=len(self.ranks) - len(ranks), hosts=hosts)
        old = [self.ranks[r] for r in ranks]
        if self.pool.launcher.fences:  # a rank found dead off this machine may be only cut off: never back
            self.fenced += old
            self.pool.fence([r.pid for r in old])
        engines = self.describe(new_ids)
        stay = [r for r in self.ranks if r.rank not in set(ranks)]
        ranks_now = list(self.ranks)
        for info in remap_moved(old, engines, stay) if hosts else remap_engines(old, engines):
            ranks_now[info.rank] = info
        self.seat(ranks_now)

    def drop(self, ranks: list[int]) -> None:
        """Go on without these dead ranks: the others keep engine, host and device (their Python state is
        on them) and are numbered again in order. Off this machine the dropped engines are fenced (a rank
        found dead there may be only cut off)."""
        dropped = set(ranks)
        old = [r for r in self.ranks if r.rank in dropped]
        if self.pool.launcher.fences:
            self.fenced += old
            self.pool.fence([r.pid for r in old])
        stay = [r for r in self.ranks if r.rank not in dropped]
        nodes: dict[str, int] = {}
        for r in stay:
            nodes.setdefault(r.host, len(nodes))
        self.seat([replace(r, rank=i, node_rank=nodes[r.host]) for i, r in enumerate(stay)])

    def resize(self, n: int, progress, share_gpus: bool = False) -> bool:
        """Start or stop engines so there are ``n`` ranks; False: nothing to do.

        The ranks that stay keep rank, engine and device (their Python state is on them); new engines
        come after them, and shrinking stops the highest ranks."""
        if n == len(self.ranks):
            return False
        if n > len(self.ranks):
            progress(f"starting {n - len(self.ranks)} engines")
            new = self.pool.start_more(n - len(self.ranks), set(self.pool.client.ids), alive=len(self.ranks))
            self.seat(extend_rank_map(self.ranks, self.describe(new), share_gpus=share_gpus))
        else:
            progress(f"stopping rank {format_ranks(range(n, len(self.ranks)))}")
            self.pool.stop_engines([r.engine_id for r in self.ranks[n:]])
            self.seat(self.ranks[:n])
        return True

    def peers(self, beats: dict | None = None) -> list:
        """Every rank's gloo listeners ``[ip, port]``: from the join, and from the latest beacons (a mesh
        made since listens on ports of its own)."""
        found = {tuple(e) for eps in self.endpoints.values() for e in eps}
        found |= {tuple(e) for beat in (beats or {}).values() for e in beat.get("endpoints") or []}
        return sorted(found)

    def abort(self, infos: list[RankInfo], beats: dict | None = None) -> None:
        """Abort the group on ``infos``, even while their main thread is blocked in a collective.

        Each rank's agent aborts it from its own thread: peers blocked with them fail at once, and
        every rank keeps its Python state. ``beats``: the ranks' latest beacons (their listeners now).
        """
        if infos:
            self.mark_broken()
            self.command(Command.ABORT, infos, peers=self.peers(beats))

    def reform(self, alive: list[RankInfo]) -> None:
        """Abort what is left of the old group on the ``alive`` ranks (never destroy), then form anew."""
        self.door.call(remote.abort, alive, self.peers())
        self.form()

    def regroup(self, stay: list[RankInfo], join: list[RankInfo] = (), leave: list[RankInfo] = (), *,
                lost: list[RankInfo] = (), abort: bool, text: str, beats: dict | None = None,
                lost_ranks: list[int] | None = None) -> dict:
        """Tell the engines of an elastic run to form a new group: ``stay`` (in their new rank order),
        then ``join``; ``leave`` end their run. ``abort``: a rank was lost, so the old group is aborted
        at once (``beats``: the ranks' latest beacons, for where their gloo listens); a planned change
        waits for the step boundary instead. The engines form the group themselves
        (:func:`workbench.engine.rendezvous.regroup`); this group holds the new rank map at once. Returns
        the plan (the joining engines get it through ipyparallel). ``lost_ranks``: the numbers the plan
        gives the lost ranks (default theirs; a re-plan names them as the last group formed numbered them).
        """
        members = [*stay, *join]
        # the first member whose standby store is known hosts the meeting (every rank that formed a group
        # or replayed the setup has one; a rank without one would leave the others nowhere to meet)
        host = next((r for r in stay if r.engine_id in self.standby), None)
        if host is None:
            raise AssertionError(f"no rank of {format_ranks(r.rank for r in stay)} has a standby store to "
                                 "regroup at")
        lost_ranks = [r.rank for r in lost] if lost_ranks is None else list(lost_ranks)
        plan = {"generation": self.generation + 1, "members": [[r.host, r.pid] for r in members],
                "stay": len(stay), "leaving": [[r.host, r.pid] for r in leave],
                "host": [host.host, host.pid], "store": self.standby[host.engine_id],
                "lost": lost_ranks, "joined": list(range(len(stay), len(members))), "text": text}
        self.command(Command.REGROUP, [*stay, *leave], plan=plan, abort=abort, peers=self.peers(beats))
        self.lost += list(lost)
        self.fenced += list(lost)
        if lost and self.pool.launcher.fences:  # engines elsewhere: ended over ssh once their host answers
            self.pool.fence([r.pid for r in lost])
        self.endpoints = {i: self.endpoints.get(r.rank, []) for i, r in enumerate(stay)}  # until beacons say
        self.seat([replace(r, rank=i) for i, r in enumerate(members)])
        self.generation = plan["generation"]
        return plan

    def fence(self, host: str, pid: int) -> None:
        """Tell a fenced engine (heard again: its link came back) to stop itself."""
        self.door.command(Command.FENCE, [], self.generation, engines=[[host, pid]])

    def command(self, what: Command, infos: list[RankInfo], **details) -> None:
        """Send the agents of ``infos`` (ranks of this group) the signed command ``what`` through the door
        (see :mod:`workbench.engine.agent`)."""
        if infos:
            self.door.command(what, [r.rank for r in infos], self.generation, **details)

    def signal(self, infos: list[RankInfo], sig: int, breaks_group: bool = True) -> None:
        """Signal the engines of ``infos``: by pid where local, through each rank's agent otherwise (engines
        have no ipyparallel nanny to do it).

        Anything harsher than SIGINT may leave the group broken: the next cell re-forms it (not so for
        ranks an elastic run already left out: ``breaks_group=False``).
        """
        if not infos:
            return
        if sig != signal.SIGINT and breaks_group:
            self.mark_broken()
        self.pool.launcher.signal(infos, sig, lambda ranks, s: self.command(Command.SIGNAL, ranks,
                                                                                 sig=int(s)))
