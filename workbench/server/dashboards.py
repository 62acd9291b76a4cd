"""The live dashboards the JupyterLab panel docks beside a notebook: one per pool, made when a page asks.

A source subscribes to the pool's relay (the channel in its state file: any pool of this server,
whoever started it) with its own :class:`~workbench.metrics.collector.Collector`, and runs the
notebook's :class:`~workbench.widgets.live_dashboard.Dashboard` on a
:class:`~workbench.widgets.polled.PolledView` that the page polls about once a second. It shows what
came since it was made (the relay keeps no history): the panel's listing makes one for every running
pool it shows (:meth:`DashboardSources.watch`), so a dashboard opened mid-run has the run from the
moment the panel saw the pool. It is closed when neither a page nor the listing asked for ``idle_s``
seconds, or when its pool stops; then the page's next question is a 404 and it keeps the last picture.
No tornado here; the key never leaves the server.

>>> sources = DashboardSources(asyncio.to_thread, find=manager.running_state)  # doctest: +SKIP
>>> await sources.since("abc123", 0, "")                 # doctest: +SKIP
{'pool': 'abc123', 'view': '5f…', 'seq': 0, 'live': True, 'header': '…', 'figure': {}, ...}
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

from workbench.pool.records import state as pool_state

log = logging.getLogger(__name__)

IDLE_S = 30.0  # a source no page asked for this long is closed
SWEEP_S = 2.0  # how often idle sources and stopped pools are looked for


class Source:
    """One pool's collector and dashboard (blocking: made and closed in a worker thread)."""

    def __init__(self, pool_id: str, state: pool_state.PoolState):
        from workbench.metrics.collector import Collector
        from workbench.widgets.live_dashboard import Dashboard
        from workbench.widgets.polled import PolledView

        self.pool_id = pool_id
        self.channel = state.channel
        self.collector = Collector(self.channel)
        # host and device of every rank before their first record
        self.collector.set_ranks([SimpleNamespace(**r) for r in state.ranks])
        self.dashboard = Dashboard(self.collector, view=PolledView)
        self.dashboard.refresh()  # the first answer has its texts already
        self.asked = time.monotonic()

    def since(self, seq: int, view: str) -> dict:
        self.asked = time.monotonic()
        return {"pool": self.pool_id, "summary": self.dashboard.summary,
                **self.dashboard.view.since(seq, view)}

    def close(self) -> None:
        self.dashboard.stop()
        self.collector.close()


class DashboardSources:
    """The sources of the pools that pages show now. ``run``: runs a blocking call off the event loop;
    ``find``: a running pool's state (raises for one that does not run)."""

    def __init__(self, run: Callable[..., Awaitable], find: Callable[[str], Awaitable[dict]],
                 idle_s: float = IDLE_S):
        self._run = run
        self._find = find
        self.idle_s = idle_s
        self._sources: dict[str, Source] = {}
        self._lock = asyncio.Lock()  # one source per pool, however many pages ask at once
        self._sweeper: asyncio.Task | None = None

    @property
    def pools(self) -> list[str]:
        """The pools that have a source now."""
        return sorted(self._sources)

    async def since(self, pool_id: str, seq: int = 0, view: str = "") -> dict:
        """What a page that has seen up to ``seq`` of ``view`` shows next (see
        :meth:`workbench.widgets.polled.PolledView.since`)."""
        source = await self._source(pool_id)
        return await self._run(source.since, seq, view)

    async def watch(self, states: list[pool_state.PoolState]) -> None:
        """Keep a source for each of these running pools (the panel lists them), so that a dashboard opened
        later shows the run from the moment the panel first saw its pool: the relay keeps no history."""
        for state in states:
            if state.channel:
                try:
                    await self._source(state.id, state)
                except Exception:  # the listing goes on; opening the dashboard will say what is wrong
                    log.exception("could not follow the metrics of pool %s", state.id)

    async def _source(self, pool_id: str, state: pool_state.PoolState | None = None) -> Source:
        """The pool's source, made now if it has none (``state``: its state file, if known); asked now."""
        async with self._lock:
            source = self._sources.get(pool_id)
            if source is None:
                state = state or await self._find(pool_id)
                if not state.channel:
                    raise ValueError(f"pool {pool_id} has no metrics channel: it shows no dashboard.")
                source = self._sources[pool_id] = await self._run(Source, pool_id, state)
                if self._sweeper is None or self._sweeper.done():
                    self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
            source.asked = time.monotonic()
            return source

    async def close(self, pool_id: str) -> None:
        """Close a pool's source (its pool stops); nothing if it has none."""
        source = self._sources.pop(pool_id, None)
        if source is not None:
            await self._run(source.close)

    async def close_all(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for pool_id in list(self._sources):
            await self.close(pool_id)

    async def _sweep(self) -> None:
        """Close the sources no page asked for lately and those whose pool stopped (or started again
        under the same id, with a new channel); ends when none is left."""
        while self._sources:
            await asyncio.sleep(min(SWEEP_S, self.idle_s))
            try:
                running = {s.id: s.channel for s in await self._run(pool_state.list_states)}
                now = time.monotonic()
                for pool_id, source in list(self._sources.items()):
                    if now - source.asked > self.idle_s or running.get(pool_id) != source.channel:
                        await self.close(pool_id)
            except Exception:
                log.exception("could not look for idle dashboards")
