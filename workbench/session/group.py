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

import os
import signal

from workbench.config import PoolConfig
from workbench.errors import PoolStartError
from workbench.pool import netif
from workbench.pool.cluster import EnginePool
from workbench.pool.rankmap import EngineInfo, RankInfo


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

    @property
    def local(self) -> bool:
        return self.config.launcher == "local"

    def view(self, targets: list[RankInfo]):
        """An ipyparallel view on the engines of ``targets``."""
        return self.pool.client[[r.engine_id for r in targets]]

    def describe(self, engine_ids) -> list[EngineInfo]:
        """Host, pid and visible GPUs of each engine (they answer once ``import torch`` is done)."""
        from workbench.engine import rendezvous

        view = self.pool.client[list(engine_ids)]
        infos = view.apply_async(rendezvous.describe).get(timeout=self.config.timeout)
        return [EngineInfo(eid, i["host"], i["pid"], i["gpus"])
                for eid, i in zip(view.targets, infos, strict=True)]

    def form(self, beacon_url: str | None) -> None:
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
        futures = [
            client[r.engine_id].apply_async(
                rendezvous.join, rank=r.rank, local_rank=r.local_rank, world_size=len(self.ranks),
                address=store_address, port=port, backend=self.config.backend, device=r.device,
                timeout_s=self.config.timeout, threads=threads,
                ifname="lo" if self.local else routes[r.rank]["ifname"], beacon=beacon_url)
            for r in self.ranks
        ]
        try:
            joined = [f.get(timeout=self.config.timeout + 5) for f in futures]
        except Exception as exc:
            raise PoolStartError(f"the process group did not form: {exc}") from exc
        self.backend = joined[0]["backend"]
        self.gloo_ports = sorted({p for j in joined for p in j.get("gloo_ports", [])})
        self.ok = True

    def abort(self, infos: list[RankInfo], wait: float = 1.0) -> None:
        """Abort the group on ``infos`` so that peers blocked in a collective with them fail at once."""
        from workbench.engine import guard

        if infos:
            self.ok = False
            self.view(infos).apply_async(guard.abort, self.gloo_ports).wait(wait)

    def reform(self, alive: list[RankInfo], beacon_url: str | None) -> None:
        """Abort what is left of the old group on the ``alive`` ranks (never destroy), then form anew."""
        from workbench.engine import guard

        self.view(alive).apply_sync(guard.abort, self.gloo_ports)
        self.form(beacon_url)

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
