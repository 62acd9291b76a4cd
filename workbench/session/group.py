"""The kernel side of the process group: which engine is which rank, forming, re-forming, aborting.

Everything here runs in the kernel and reaches the engines through ipyparallel; what runs on the
engines is :mod:`workbench.engine.rendezvous` (describe, open the store, join) and
:mod:`workbench.engine.guard` (abort).

>>> group = ProcessGroup(pool, config)              # doctest: +SKIP
>>> group.ranks = build_rank_map(group.describe(pool.client.ids))   # doctest: +SKIP
>>> group.form(beacon_url=None)                     # doctest: +SKIP
>>> group.backend                                   # doctest: +SKIP
'gloo'
"""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid

from workbench import wire
from workbench.config import PoolConfig
from workbench.errors import PoolStartError, RankDiedError
from workbench.pool import netif
from workbench.pool.cluster import EnginePool
from workbench.pool.rankmap import EngineInfo, RankInfo, build_rank_map, format_ranks, remap_engines


class ProcessGroup:
    """One torch.distributed group over a pool's engines, seen from the kernel.

    ``ok`` is False once a fault aborted (or may have broken) the group: the next cell re-forms it.
    """

    def __init__(self, pool: EnginePool, config: PoolConfig):
        self.pool, self.config = pool, config
        self.ranks: list[RankInfo] = []
        self.backend: str | None = None
        self.ok = False
        self.gloo_ports: list[int] = []  # where gloo listens, on every rank: what an abort cuts
        self.generation = 0  # counts the groups formed: the engines' agents take commands for the current one
        self._commands = None  # a PUSH socket up the pool's side channel, made on first use
        self._commands_lock = threading.Lock()

    @property
    def local(self) -> bool:
        return self.config.launcher == "local"

    def view(self, targets: list[RankInfo]):
        """An ipyparallel view on the engines of ``targets``."""
        try:
            return self.pool.client[[r.engine_id for r in targets]]
        except (KeyError, IndexError):  # the controller dropped an engine: it is gone
            known = set(self.pool.client.ids)
            lost = next(r for r in targets if r.engine_id not in known)
            raise RankDiedError(f"{lost.label()} is gone (its engine left the controller): `%dist restart` "
                                "brings it back.") from None

    def describe(self, engine_ids) -> list[EngineInfo]:
        """Host, pid and visible GPUs of each engine (they answer once ``import torch`` is done)."""
        from workbench.engine import rendezvous

        view = self.pool.client[list(engine_ids)]
        infos = view.apply_async(rendezvous.describe).get(timeout=self.config.timeout)
        return [EngineInfo(eid, i["host"], i["pid"], i["gpus"])
                for eid, i in zip(view.targets, infos, strict=True)]

    def form(self) -> None:
        """Form (or re-form) the group on every rank of :attr:`ranks` at once."""
        from workbench.engine import rendezvous

        client = self.pool.client
        per_host = max(sum(r.host == h for r in self.ranks) for h in {r.host for r in self.ranks})
        threads = max(1, (os.cpu_count() or 1) // per_host)
        root = self.ranks[0]
        # Off this machine each rank talks over the interface that reaches the kernel's address, and rank 0
        # binds the store on its own address there (never on all interfaces).
        routes = {}
        if not self.local:
            found = self.view(self.ranks).apply_sync(netif.route_to, self.config.address)
            routes = {r.rank: route for r, route in zip(self.ranks, found, strict=True)}
        store_address = routes[root.rank]["address"] if routes else self.config.address
        port = client[root.engine_id].apply_sync(rendezvous.open_store, store_address, self.config.timeout)
        generation = self.generation + 1
        futures = [
            client[r.engine_id].apply_async(
                rendezvous.join, rank=r.rank, local_rank=r.local_rank, world_size=len(self.ranks),
                address=store_address, port=port, backend=self.config.backend, device=r.device,
                timeout_s=self.config.timeout, threads=threads,
                ifname="lo" if self.local else routes[r.rank]["ifname"], channel=self.pool.channel,
                generation=generation)
            for r in self.ranks
        ]
        try:
            joined = [f.get(timeout=self.config.timeout + 5) for f in futures]
        except Exception as exc:
            raise PoolStartError(f"the process group did not form: {exc}") from exc
        self.backend, self.generation = joined[0]["backend"], generation
        self.gloo_ports = sorted({p for j in joined for p in j.get("gloo_ports", [])})
        self.ok = True

    def replace(self, ranks: list[int]) -> None:
        """New engines (through the pool's launcher) for these dead ranks, on the same host and device."""
        new_ids = self.pool.start_more(len(ranks), set(self.pool.client.ids))
        for info in remap_engines([self.ranks[r] for r in ranks], self.describe(new_ids)):
            self.ranks[info.rank] = info

    def resize(self, n: int, progress) -> bool:
        """Start or stop engines so there are ``n`` ranks (the highest stop first); False: nothing to do."""
        if n == len(self.ranks):
            return False
        keep = [r.engine_id for r in self.ranks[:n]]
        if n > len(self.ranks):
            progress(f"starting {n - len(self.ranks)} engines")
            keep += self.pool.start_more(n - len(self.ranks), set(self.pool.client.ids))
        else:
            progress(f"stopping rank {format_ranks(range(n, len(self.ranks)))}")
            self.pool.stop_engines([r.engine_id for r in self.ranks[n:]])
        self.ranks = build_rank_map(self.describe(keep))
        self.pool.n = n
        return True

    def abort(self, infos: list[RankInfo]) -> None:
        """Abort the group on ``infos``, even while their main thread is blocked in a collective.

        Each rank's agent aborts it from its own thread: peers blocked with them fail at once, and
        every rank keeps its Python state.
        """
        if infos:
            self.ok = False
            self.command("abort", infos, ports=self.gloo_ports)

    def reform(self, alive: list[RankInfo]) -> None:
        """Abort what is left of the old group on the ``alive`` ranks (never destroy), then form anew."""
        from workbench.engine import guard

        self.view(alive).apply_sync(guard.abort, self.gloo_ports)
        self.form()

    def command(self, what: str, infos: list[RankInfo], **details) -> None:
        """Send the agents of ``infos`` a signed command (see :mod:`workbench.engine.agent`)."""
        import zmq

        if not infos or not self.pool.channel:
            return
        body = {"do": what, "ranks": [r.rank for r in infos], "generation": self.generation,
                "id": uuid.uuid4().hex, **details}
        frames = wire.Signer(self.pool.channel["key"]).pack(wire.COMMAND, json.dumps(body).encode())
        with self._commands_lock:
            if self._commands is None:
                self._commands = wire.pusher(zmq.Context.instance(), self.pool.channel["up"])
            try:
                self._commands.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                pass  # the relay is gone: the pool is stopping

    def close(self) -> None:
        with self._commands_lock:
            if self._commands is not None:
                self._commands.close(0)
                self._commands = None

    def signal(self, infos: list[RankInfo], sig: int) -> None:
        """Signal the engines of ``infos``: directly where local, through ipyparallel otherwise.

        Anything harsher than SIGINT may leave the group broken: the next cell re-forms it.
        """
        if not infos:
            return
        if sig != signal.SIGINT:
            self.ok = False
        if self.local:
            for r in infos:
                try:
                    os.kill(r.pid, sig)
                except ProcessLookupError:
                    pass
        else:
            self.pool.client.send_signal(sig, targets=[r.engine_id for r in infos], block=False)
