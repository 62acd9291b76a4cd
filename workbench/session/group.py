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
from workbench.session.meshes import WHOLE, keys_for, mesh_of
from workbench.wire import Command


class ProcessGroup:
    """One torch.distributed group over a pool's engines, seen from the kernel.

    ``ok`` is False once a fault aborted (or may have broken) the group: the next cell re-forms it.

    A split pool (``meshes``: name -> its pool ranks, see ``docs/submeshes.md``) has one default group per
    sub-mesh, each with its own generation, broken and re-formed on its own (``broken``: the names of the
    sub-meshes a fault aborted, :data:`~workbench.session.meshes.WHOLE` for every one).

    Only this class writes its fields (and the pool's engine count, ``pool.n``): other rooms change
    them through its methods (:meth:`seat`, :meth:`adopt`, :meth:`forget_lost`, :meth:`follow`,
    :meth:`heard`, :meth:`mark_broken`, :meth:`mark_destroyed`, :meth:`heard_groups`), so a reader finds
    every change of the group here.
    """

    def __init__(self, pool: EnginePool, config: PoolConfig, door: Door):
        self.pool, self.config, self.door = pool, config, door
        self.ranks: list[RankInfo] = []
        self.backend: str | None = None
        self.broken: set[str] = {WHOLE}  # not formed yet
        self.meshes: dict[str, list[int]] = {}  # a split: name -> its pool ranks (empty: one group of all)
        self.mesh_generation: dict[str, int] = {}  # name -> the generation its group was formed in
        self.endpoints: dict[int, list] = {}  # rank -> its gloo listeners ([ip, port]): what an abort cuts
        self.generation = 0  # counts the groups formed: the engines' agents take commands for the current one
        self.standby: dict[int, dict] = {}  # engine id -> the spec of its standby store (regroups)
        self.lost: list[RankInfo] = []  # ranks an elastic run went on without (`%dist restart` replaces them)
        self.left_out: dict[int, str] = {}  # pool rank -> the sub-mesh whose elastic run went on without it
        # (it keeps its number, dead, in no sub-mesh, until `%dist restart` puts a new engine there)
        self.fenced: list[RankInfo] = []  # engines declared lost: refused, told to stop (kept for status)
        self.destroyed: list[int] = []  # ranks where a cell ended the default group itself (torch's own
        # destroy_process_group, which a library may hold: not the pool's deferred one)

    @property
    def ok(self) -> bool:
        """Every group of the pool (every sub-mesh's) is formed and no fault aborted it."""
        return not self.broken

    def keys(self) -> set[str]:
        """What can be broken or re-formed on its own: every sub-mesh, or the whole pool."""
        return set(self.meshes) or {WHOLE}

    def broken_in(self, keys) -> set[str]:
        """Which of ``keys`` (sub-mesh names, or :data:`WHOLE`) have a group a fault aborted."""
        keys = self.keys() if WHOLE in keys else set(keys)
        return keys if WHOLE in self.broken else keys & self.broken

    def mesh_ranks(self, name: str) -> list[RankInfo]:
        """The ranks of sub-mesh ``name`` (the whole pool for :data:`WHOLE`)."""
        return list(self.ranks) if name == WHOLE else [self.ranks[r] for r in self.meshes[name]]

    def generation_of(self, rank: int) -> int:
        """The generation of the group ``rank`` (of the pool) is in now: its agent takes commands of it."""
        name = mesh_of(self.meshes, rank)
        return self.mesh_generation.get(name, self.generation) if name is not None else self.generation

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
               ok: bool, meshes: dict | None = None) -> None:
        """Take in a group another notebook formed on the same pool (from the pool's state file; ``meshes``:
        its sub-meshes as :meth:`published` writes them)."""
        self.seat(ranks)
        self.backend, self.generation = backend, generation
        meshes = meshes or {}
        self.meshes = {name: list(m["ranks"]) for name, m in meshes.items()}
        self.mesh_generation = {name: int(m["generation"]) for name, m in meshes.items()}
        self.left_out = {int(r): name for name, m in meshes.items() for r in m.get("left_out", ())}
        self.broken = {name for name, m in meshes.items() if not m.get("ok", True)} if ok else {WHOLE}
        self.destroyed = [] if ok else self.destroyed
        self.endpoints = {int(rank): eps for rank, eps in endpoints.items()}

    def heard(self, endpoints: dict[int, list]) -> None:
        """Every rank's gloo listeners as their beacons say (after an elastic regroup; within a sub-mesh:
        its ranks', the others' kept)."""
        self.endpoints = {**self.endpoints, **endpoints} if self.meshes else dict(endpoints)

    def published(self) -> dict[str, dict]:
        """The sub-meshes as the pool's state file keeps them (:meth:`follow` reads them back); ``left_out``:
        where a sub-mesh's elastic run went on without ranks (:attr:`left_out`), those ranks."""
        meshes = {name: {"ranks": list(ranks), "generation": self.mesh_generation.get(name, self.generation),
                         "ok": WHOLE not in self.broken and name not in self.broken}
                  for name, ranks in self.meshes.items()}
        for rank, name in sorted(self.left_out.items()):
            meshes[name].setdefault("left_out", []).append(rank)
        return meshes

    def mark_broken(self, ranks=None) -> None:
        """A fault may have broken the group of ``ranks`` (pool ranks; default: every group): the next cell
        on them re-forms it."""
        self.broken |= {WHOLE} if ranks is None else set(keys_for(self.meshes, ranks))

    def mark_destroyed(self, ranks) -> None:
        """The default group is gone on ``ranks`` (a cell destroyed it there): the next cell re-forms it."""
        self.destroyed = sorted({*self.destroyed, *ranks})
        self.mark_broken(ranks)

    def heard_groups(self, beats: dict) -> None:
        """What the ranks' latest beacons say of their default group: a rank of this group whose beacon
        says it has none had it destroyed (a cell that did so and raised nothing). Read between cells. A group
        already known broken (a fault aborted it, which also leaves the ranks without one) stays "aborted".

        >>> g = ProcessGroup.__new__(ProcessGroup)
        >>> g.ranks, g.generation, g.destroyed, g.broken = [RankInfo(0, 0, 0, "h", 7, "cpu", 0)], 1, [], set()
        >>> g.meshes, g.mesh_generation = {}, {}
        >>> g.heard_groups({0: {"pid": 7, "generation": 1, "group": False}})
        >>> g.destroyed, g.ok
        ([0], False)
        >>> g.destroyed, g.broken = [], {WHOLE}  # a fault aborted it: no group there, none destroyed it
        >>> g.heard_groups({0: {"pid": 7, "generation": 1, "group": False}})
        >>> g.destroyed
        []
        """
        if not self.ok:
            return
        def says_none(r: RankInfo) -> bool:  # that engine's beacon, of this group
            beat = beats.get(r.rank) or {}
            return beat.get("pid") == r.pid and beat.get("generation") == self.generation_of(r.rank) \
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

    def form(self, only=None) -> None:
        """Form (or re-form) the group on every rank of :attr:`ranks` at once: one group of all, or one per
        sub-mesh of :attr:`meshes` (``only``: those sub-meshes' alone, the others' groups left as they are:
        a cell may run there)."""
        backend = group_backend(self.config.backend, self.ranks, shared=self.config.share_gpus)
        names = sorted(self.keys()) if only is None or WHOLE in only else sorted(only)
        groups = [(name, self.mesh_ranks(name)) for name in names]
        members = [r for _, ranks in groups for r in ranks]
        # Off this machine each rank talks over the interface that reaches the kernel's address, and each
        # group's first rank binds its store on its own address there (never on all interfaces).
        routes = {}
        if not self.local:
            found = self.door.call(remote.route_to, members, self.config.address)
            routes = {r.rank: route for r, route in zip(members, found, strict=True)}
        own = {r.rank: routes[r.rank]["address"] if routes else self.config.address for r in members}
        generation = self.generation + 1
        # A local pool meets in a file of its private folder (nothing listens, no other user opens it);
        # across hosts each group's first rank hosts a TCPStore on its address of the cluster interface.
        folder = self.stores_folder()
        calls = []
        for name, ranks in groups:
            root = ranks[0]
            store_address = own[root.rank]
            suffix = "" if name == WHOLE else f"-{name}"
            store = {"file": os.path.join(folder, f"group-{generation}{suffix}")} if folder else None
            port = 0 if folder else self.door.call_one(remote.open_store, root, store_address,
                                                       self.config.timeout)
            hosts = list(dict.fromkeys(r.host for r in ranks))  # the group's nodes, in rank order
            calls += [
                (r, dict(rank=i, local_rank=r.local_rank, world_size=len(ranks),
                         address=store_address, port=port, backend=backend, device=r.device,
                         timeout_s=self.config.timeout, collective_timeout_s=self.config.collective_timeout,
                         local_pids=[o.pid for o in self.ranks if o.host == r.host],  # threads: the host's
                         ifname="lo" if self.local else routes[r.rank]["ifname"], channel=self.pool.channel,
                         generation=generation, standby_address=own[r.rank],
                         node_rank=hosts.index(r.host) if name != WHOLE else r.node_rank, nodes=len(hosts),
                         run_id=self.pool.pool_id or "", agent_rank=r.rank,
                         **({"store": store, "stores_folder": folder} if folder else {})))  # local: files
                for i, r in enumerate(ranks)
            ]
        try:
            joined = self.door.call_apart(remote.join, calls, within=self.config.timeout + 5)
        except Exception as exc:
            raise PoolStartError(f"the process group did not form: {exc}") from exc
        self.backend, self.generation = joined[0]["backend"], generation
        endpoints = {r.rank: j["endpoints"] for (r, _), j in zip(calls, joined, strict=True)}
        self.endpoints = endpoints if only is None else {**self.endpoints, **endpoints}
        self.standby.update({r.engine_id: j["standby"] for (r, _), j in zip(calls, joined, strict=True)
                             if j.get("standby")})
        for name in names:
            if name != WHOLE:
                self.mesh_generation[name] = generation
        if folder:  # the groups before the oldest one still formed are over: their meeting files go
            live = [self.mesh_generation.get(name, generation) for name in self.keys()]
            for old in pool_state.old_group_stores(folder, min(live)):
                old.unlink(missing_ok=True)
        self.lost = [r for r in self.lost if r.engine_id not in {k.engine_id for k in self.ranks}]
        if only is None:
            self.broken, self.destroyed = set(), []
        else:
            self.broken = (self.keys() if WHOLE in self.broken else self.broken) - set(names)
            self.destroyed = [r for r in self.destroyed if r not in {m.rank for m in members}]

    def split(self, meshes: dict[str, list[int]]) -> None:
        """Form one default group per sub-mesh of ``meshes`` (name -> pool ranks; empty: one group of all,
        a join). What is left of the groups before is aborted on every rank first (never destroyed)."""
        self.door.call(remote.abort, self.ranks, self.peers())
        self.meshes = {name: list(ranks) for name, ranks in meshes.items()}
        self.mesh_generation = {}
        self.form()

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
        for rank in ranks:  # a rank a sub-mesh's elastic run went on without is that sub-mesh's again
            name = self.left_out.pop(rank, None)
            if name is not None:
                self.meshes[name] = sorted({*self.meshes[name], rank})

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
            self.mark_broken([r.rank for r in infos])
            self.command(Command.ABORT, infos, peers=self.peers(beats))

    def reform(self, alive: list[RankInfo], only=None) -> None:
        """Abort what is left of the old group on the ``alive`` ranks (never destroy), then form anew
        (``only``: those sub-meshes, whose ranks ``alive`` then are)."""
        self.door.call(remote.abort, alive, self.peers())
        self.form(only)

    def regroup(self, stay: list[RankInfo], join: list[RankInfo] = (), leave: list[RankInfo] = (), *,
                lost: list[RankInfo] = (), abort: bool, text: str, beats: dict | None = None,
                lost_ranks: list[int] | None = None, mesh: str | None = None) -> dict:
        """Tell the engines of an elastic run to form a new group: ``stay`` (in their new rank order),
        then ``join``; ``leave`` end their run. ``abort``: a rank was lost, so the old group is aborted
        at once (``beats``: the ranks' latest beacons, for where their gloo listens); a planned change
        waits for the step boundary instead. The engines form the group themselves
        (:func:`workbench.engine.rendezvous.regroup`); this group holds the new rank map at once. Returns
        the plan (the joining engines get it through ipyparallel). ``lost_ranks``: the numbers the plan
        gives the lost ranks (default theirs; a re-plan names them as the last group formed numbered them).

        ``mesh``: the run is on that sub-mesh of a split pool; the regroup is its own (:meth:`regroup_mesh`).
        """
        if mesh is not None:
            return self.regroup_mesh(mesh, stay, lost=lost, abort=abort, text=text, beats=beats,
                                     lost_ranks=lost_ranks)
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

    def regroup_mesh(self, mesh: str, stay: list[RankInfo], *, lost: list[RankInfo], abort: bool, text: str,
                     beats: dict | None = None, lost_ranks: list[int] | None = None) -> dict:
        """:meth:`regroup` within sub-mesh ``mesh`` of a split pool, after a loss: ``stay`` (ranks of it, in
        pool order) form its new group, numbered 0..k-1 there (``rank``, ``world_size`` and the default group
        inside its cells), with a generation of its own (:attr:`mesh_generation`; the other sub-meshes' groups
        and generations are left as they are: a cell may run there). The pool's rank numbers are kept: the
        members' agents go on speaking for their pool ranks (the plan's ``agents``), and a lost rank keeps its
        number in the rank map, dead and in no sub-mesh (:attr:`left_out`), until ``%dist restart`` starts a
        new engine for it there and puts it back in ``mesh`` (:meth:`replace`). Ranks joining or leaving a
        sub-mesh's run (a replacement during it, a scale) are not built: a split pool refuses a scale, and
        a restart waits for the run's cell to end."""
        members = sorted(stay, key=lambda r: r.rank)
        host = next((r for r in members if r.engine_id in self.standby), None)
        if host is None:
            raise AssertionError(f"no rank of {format_ranks(r.rank for r in members)} has a standby store to "
                                 "regroup at")
        generation = self.generation + 1
        plan = {"generation": generation, "members": [[r.host, r.pid] for r in members],
                "agents": [r.rank for r in members], "stay": len(members), "leaving": [],
                "host": [host.host, host.pid], "store": self.standby[host.engine_id],
                "lost": [r.rank for r in lost] if lost_ranks is None else list(lost_ranks),
                "joined": [], "text": text, "mesh": mesh}
        self.command(Command.REGROUP, members, plan=plan, abort=abort, peers=self.peers(beats))
        self.fenced += list(lost)
        if lost and self.pool.launcher.fences:  # engines elsewhere: ended over ssh once their host answers
            self.pool.fence([r.pid for r in lost])
        gone = {r.rank for r in lost}
        self.left_out.update({rank: mesh for rank in gone if rank in self.meshes[mesh]})
        self.meshes[mesh] = [r.rank for r in members]
        self.mesh_generation[mesh] = self.generation = generation
        return plan

    def fence(self, host: str, pid: int) -> None:
        """Tell a fenced engine (heard again: its link came back) to stop itself."""
        self.door.command(Command.FENCE, [], self.generation, engines=[[host, pid]])

    def command(self, what: Command, infos: list[RankInfo], **details) -> None:
        """Send the agents of ``infos`` (ranks of this group) the signed command ``what`` through the door
        (see :mod:`workbench.engine.agent`)."""
        by_generation: dict[int, list[int]] = {}  # a split pool's sub-meshes may be of different generations
        for r in infos:
            by_generation.setdefault(self.generation_of(r.rank), []).append(r.rank)
        for generation, ranks in by_generation.items():
            self.door.command(what, ranks, generation, **details)

    def signal(self, infos: list[RankInfo], sig: int, breaks_group: bool = True) -> None:
        """Signal the engines of ``infos``: by pid where local, through each rank's agent otherwise (engines
        have no ipyparallel nanny to do it).

        Anything harsher than SIGINT may leave the group broken: the next cell re-forms it (not so for
        ranks an elastic run already left out: ``breaks_group=False``).
        """
        if not infos:
            return
        if sig != signal.SIGINT and breaks_group:
            self.mark_broken([r.rank for r in infos])
        self.pool.launcher.signal(infos, sig, lambda ranks, s: self.command(Command.SIGNAL, ranks,
                                                                                 sig=int(s)))
