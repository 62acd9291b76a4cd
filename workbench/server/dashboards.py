"""The live dashboards the JupyterLab panel docks beside a notebook: one per pool, made when a page asks.

A source subscribes to the pool's relay (the channel in its state file: any pool of this server,
whoever started it) with its own :class:`~workbench.metrics.collector.Collector`, and runs the
notebook's :class:`~workbench.widgets.live_dashboard.Dashboard` on a
:class:`~workbench.widgets.polled.PolledView` that the page polls about once a second. It shows what
came since it was made (the relay keeps no history): the panel's listing makes one for every running
pool it shows (:meth:`DashboardSources.watch`), so a dashboard opened mid-run has the run from the
moment the panel saw the pool.

The collector lives as long as its pool: when neither a page nor the listing asked for ``idle_s`` seconds
only the dashboard's refresh sleeps, and the next question wakes a new one over the same collector, drawn
whole from every run it kept. When the pool stops (from the panel: before its processes go, so the
picture is the run's and not the stop's) the dashboard takes its last picture, and the page's questions
are answered from it, ``stopped`` once the pool is gone, also after a page reload (:data:`KEEP_ENDED`
pools are remembered). A pool started again under the same id (a new channel) gets a new source.
No tornado here; the key never leaves the server.

>>> sources = DashboardSources(asyncio.to_thread, find=manager.running_state)  # doctest: +SKIP
>>> await sources.since("abc123", 0, "")                 # doctest: +SKIP
{'pool': 'abc123', 'view': '5f…', 'seq': 0, 'live': True, 'stopped': False, 'header': '…', ...}
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

from workbench.pool.records import state as pool_state

log = logging.getLogger(__name__)

IDLE_S = 30.0  # a source no page asked for this long stops refreshing (its collector stays)
SWEEP_S = 2.0  # how often idle sources and stopped pools are looked for
KEEP_ENDED = 32  # the last pictures kept, of the pools that stopped most recently
# A new source's first answer waits this long at most for a record of every rank (their publishers send
# at least once a second): made mid-run, it said "no training run yet" before it had heard anything
FIRST_RECORDS_S = 2.0


class Source:
    """One pool's collector and dashboard (blocking: made and closed in a worker thread)."""

    def __init__(self, pool_id: str, state: pool_state.PoolState):
        from workbench.metrics.collector import Collector

        self.pool_id = pool_id
        self.channel = state.channel
        self.collector = Collector(self.channel)
        # host and device of every rank before their first record
        self.collector.set_ranks([SimpleNamespace(**r) for r in state.ranks])
        self.dashboard = None
        self._lock = threading.Lock()
        self.wake()
        self.asked = self.made = time.monotonic()
        self._listened = False  # the first answer waited for the ranks' first records

    @property
    def awake(self) -> bool:
        return self.dashboard is not None

    def wake(self):
        """The dashboard, refreshing (a new one over the collector after a sleep: drawn whole)."""
        from workbench.widgets.live_dashboard import Dashboard
        from workbench.widgets.polled import PolledView

        with self._lock:
            if self.dashboard is None:
                self.dashboard = Dashboard(self.collector, view=PolledView)
                self.dashboard.refresh()  # the first answer has its texts already
            return self.dashboard

    def sleep(self) -> None:
        """No page looks: stop refreshing; the collector goes on receiving."""
        with self._lock:
            dashboard, self.dashboard = self.dashboard, None
        if dashboard is not None:
            dashboard.stop()

    def since(self, seq: int, view: str, words: dict[int, str] | None = None) -> dict:
        """``words``: what the pool's controller says each rank does now (the card's words), said by the
        dashboard where its collector knows only that no run goes on
        (:func:`~workbench.widgets.panels.said_states`)."""
        self.asked = time.monotonic()
        dashboard = self.wake()
        if words is not None:
            dashboard.rank_words = words
        if not self._listened:
            self._listened = True
            self.listen(FIRST_RECORDS_S - (self.asked - self.made))
            dashboard.refresh()
        # the ranks' states as they are now, also after the run ended (its picture keeps the rest)
        return {**answer(self.pool_id, dashboard.summary, dashboard.view, seq, view), **dashboard.texts_now()}

    def listen(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until every rank has sent a record since this source was made (a run
        going on says so in its next one); whether they all did."""
        with self.collector.lock():
            ranks = set(self.collector.ranks)

        def heard(c) -> bool:
            return all(c.ranks[r].pub for r in ranks)

        return self.collector.wait_for(heard, max(timeout, 0.0))

    def last_picture(self) -> Ended:
        """The pool stops: its picture now (the page goes on being answered from it); :meth:`finish` then
        ends the dashboard (how its run ended goes into the same picture) and the collector."""
        dashboard = self.wake()
        return Ended(self.pool_id, self.channel, dashboard.summary, dashboard.view, dashboard.states_now(),
                     dashboard.texts_now()["devices"])

    def finish(self, ended: Ended) -> None:
        with self._lock:
            dashboard, self.dashboard = self.dashboard, None
        if dashboard is not None:
            dashboard.stop()
            ended.summary = dashboard.summary
        self.collector.close()

    def close(self) -> None:
        self.sleep()
        self.collector.close()


class Ended:
    """The last picture of a pool that stopped (or is stopping): its view, no thread, no socket."""

    def __init__(self, pool_id: str, channel: dict | None, summary: str, view, states: tuple | None = None,
                 devices: str | None = None):
        self.pool_id, self.channel, self.summary, self.view = pool_id, channel, summary, view
        # the ranks' states and devices as the stop began (Dashboard.states_now), not as they ended
        self.states, self.devices = states, devices

    def since(self, seq: int, view: str, stopped: bool) -> dict:
        out = answer(self.pool_id, self.summary, self.view, seq, view, stopped=stopped)
        if self.states is not None:
            from workbench.widgets.panels import header_html

            out["header"] = header_html(self.summary, *self.states)
            out["devices"] = self.devices
        return out


def answer(pool_id: str, summary: str, polled, seq: int, view: str, stopped: bool = False) -> dict:
    """One answer to a page: the view's :meth:`~workbench.widgets.polled.PolledView.since`, with the pool,
    its summary and ``stopped`` (the pool is gone: this is its last picture; the page stops asking)."""
    return {"pool": pool_id, "summary": summary, "stopped": stopped, **polled.since(seq, view)}


class DashboardSources:
    """The sources of the pools that pages show now, and the last pictures of those that stopped.
    ``run``: runs a blocking call off the event loop; ``find``: a running pool's state (raises for one that
    does not run); ``states``: what the pool's controller says each rank does (``{rank: "idle" | "busy" |
    ...}``, the card's one source), asked at each question of a page."""

    def __init__(self, run: Callable[..., Awaitable], find: Callable[[str], Awaitable[dict]],
                 idle_s: float = IDLE_S, states: Callable[[str], Awaitable[dict[int, str]]] | None = None):
        self._run = run
        self._find = find
        self._states = states
        self.idle_s = idle_s
        self._sources: dict[str, Source] = {}
        self._ended: collections.OrderedDict[str, Ended] = collections.OrderedDict()
        self._lock = asyncio.Lock()  # one source per pool, however many pages ask at once
        self._sweeper: asyncio.Task | None = None

    @property
    def pools(self) -> list[str]:
        """The pools that have a source now."""
        return sorted(self._sources)

    @property
    def awake(self) -> list[str]:
        """The pools whose dashboard refreshes now (a page asked lately)."""
        return sorted(p for p, s in self._sources.items() if s.awake)

    @property
    def ended(self) -> list[str]:
        """The pools whose last picture is kept."""
        return list(self._ended)

    async def since(self, pool_id: str, seq: int = 0, view: str = "") -> dict:
        """What a page that has seen up to ``seq`` of ``view`` shows next (see
        :meth:`workbench.widgets.polled.PolledView.since`); a stopped pool's last picture, ``stopped``."""
        try:
            source = await self._source(pool_id)
        except Exception:  # not running (any more): its last picture, if it had one
            ended = self._ended.get(pool_id)
            if ended is None:
                raise
            return await self._run(ended.since, seq, view, True)
        if isinstance(source, Ended):  # still stopping: the last picture, and the page asks again
            return await self._run(source.since, seq, view, False)
        words = await self._states(pool_id) if self._states is not None else None
        return await self._run(source.since, seq, view, words)

    async def watch(self, states: list[pool_state.PoolState]) -> None:
        """Keep a source for each of these running pools (the panel lists them), so that a dashboard opened
        later shows the run from the moment the panel first saw its pool: the relay keeps no history."""
        for state in states:
            if state.channel:
                try:
                    await self._source(state.id, state)
                except Exception:  # the listing goes on; opening the dashboard will say what is wrong
                    log.exception("could not follow the metrics of pool %s", state.id)

    async def _source(self, pool_id: str, state: pool_state.PoolState | None = None) -> Source | Ended:
        """The pool's source, made now if it has none (``state``: its state file, if known); asked now. The
        pool's last picture while it stops (a state file with the channel of the picture)."""
        async with self._lock:
            source = self._sources.get(pool_id)
            if source is None:
                state = state or await self._find(pool_id)
                ended = self._ended.get(pool_id)
                if ended is not None and ended.channel == state.channel:
                    return ended  # it is stopping: no new (empty) source for it
                if not state.channel:
                    raise ValueError(f"pool {pool_id} has no metrics channel: it shows no dashboard.")
                source = self._sources[pool_id] = await self._run(Source, pool_id, state)
                self._ended.pop(pool_id, None)  # started again under the same id
                if self._sweeper is None or self._sweeper.done():
                    self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
            source.asked = time.monotonic()
            return source

    async def end(self, pool_id: str) -> None:
        """The pool stops (or stopped): keep its last picture and close its source; nothing if it has none.
        From the first moment on, a page is answered from the picture (never from a new, empty source)."""
        async with self._lock:
            source = self._sources.pop(pool_id, None)
            if source is None:
                return
            try:
                ended = await self._run(source.last_picture)
            except Exception:
                log.exception("could not keep the last picture of pool %s", pool_id)
                await self._run(source.close)
                return
            self._ended[pool_id] = ended
            self._ended.move_to_end(pool_id)
            while len(self._ended) > KEEP_ENDED:
                self._ended.popitem(last=False)
        await self._run(source.finish, ended)

    async def close(self, pool_id: str) -> None:
        """Close a pool's source without keeping a picture; nothing if it has none."""
        source = self._sources.pop(pool_id, None)
        if source is not None:
            await self._run(source.close)

    async def close_all(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for pool_id in list(self._sources):
            await self.close(pool_id)
        self._ended.clear()

    async def _sweep(self) -> None:
        """Let the dashboards no page asked for lately sleep; keep the last picture of the pools that
        stopped (or started again under the same id, with a new channel); ends when no source is left."""
        while self._sources:
            await asyncio.sleep(min(SWEEP_S, self.idle_s))
            try:
                running = {s.id: s.channel for s in await self._run(pool_state.list_states)}
                now = time.monotonic()
                for pool_id, source in list(self._sources.items()):
                    if running.get(pool_id) != source.channel:
                        await self.end(pool_id)
                    elif source.awake and now - source.asked > self.idle_s:
                        await self._run(source.sleep)
            except Exception:
                log.exception("could not look for idle dashboards")
