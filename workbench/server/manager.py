"""The pools of this Jupyter server, as the sidebar sees them. No tornado here.

Every pool has a state file in the Jupyter runtime directory, whoever started it: a
notebook kernel (``%dist start``) or this server (the sidebar's Start button). The
manager lists the pools from those files, adds what only it knows (pools it is
starting right now, starts that failed, pools it is stopping) and live figures per
rank, and starts, stops and restarts pools. Blocking work (starting engines, talking
to the controller) runs in worker threads, never on the server's event loop.

What it returns is plain JSON-ready data. It never returns the ipyparallel key, nor
the path of the file that holds it.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.config import BACKENDS, LAUNCHERS, PoolConfig
from workbench.errors import PoolStartError, WorkbenchError
from workbench.pool.launch import launcher_for
from workbench.pool.records import sharing
from workbench.pool.records import state as pool_state
from workbench.pool.records.state import PoolState
from workbench.pool.watch.queues import rank_states
from workbench.server.dashboards import IDLE_S, DashboardSources
from workbench.server.panel_words import problem
from workbench.server.start_request import start_options
from workbench.server.threads import DaemonExecutor
from workbench.server.usage import UsageSampler

PANEL = "the JupyterLab panel"  # who stopped a pool, as the notebooks still attached are told
# How long one look at a controller (which ranks are busy) may take before the
# listing goes on without it.
PROBE_TIMEOUT_S = 2.0
PROBE_FRESH_S = 1.0  # a look this recent answers the docked dashboard too (no second look per second)
SHUTDOWN_S = 6.0  # a server's SIGTERM ends it within 10 s whatever its pools do: this much for stopping them
# Lines of start progress kept per pool for "Show log".
LOG_LINES = 200

_ENGINES_UP = re.compile(r"engines up: (\d+)/(\d+)")
BUSY = ("starting", "restarting", "stopping")  # a pool in the midst of one of these takes no restart
HEALTH_WAIT_S = 10.0  # how long a restart waits for the session to have seen the ranks found ended

# pid -> a short label for the kernel's notebook, e.g. {"4242": "notebooks/train.ipynb"}
OwnerLookup = Callable[[], Awaitable[dict[int, str]]]


class PoolNotFound(KeyError):
    """No pool with that id on this server."""

    def __init__(self, pool_id: str, running: list[str]):
        self.pool_id = pool_id
        names = ", ".join(running) or "none"
        super().__init__(f"no pool {pool_id!r} on this server; pools: {names}.")

    def __str__(self) -> str:
        return str(self.args[0])


class PoolBusy(RuntimeError):
    """The pool is in the middle of a start or stop."""


class ShuttingDown(RuntimeError):
    """The Jupyter server is going away: the manager takes no more requests."""

    def __init__(self):
        super().__init__("the Jupyter server is shutting down.")


@dataclass
class _Started:
    """A pool this server is starting, runs, or failed to start."""

    key: str
    config: PoolConfig
    asked: PoolConfig | None = None  # what the request said (Retry shows it again), before the name was given
    session: Any = None  # workbench.Session
    phase: str = "starting"  # starting | running | restarting | stopping | failed
    message: str = "starting"
    engines_up: int = 0
    error: str | None = None
    problem: dict | None = None  # the error in the panel's words, as its parts (what the card shows)
    log: list[str] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    known_id: str | None = None  # kept after a failed start, so the card keeps its id

    @property
    def pool_id(self) -> str | None:
        if self.session is not None and self.session.pool_id:
            self.known_id = self.session.pool_id
        return self.known_id

    @property
    def public_id(self) -> str:
        return self.pool_id or self.key

    def progress(self, message: str) -> None:
        """Session.start's progress callback (runs in the start thread)."""
        self.message = message
        self.log.append(f"{time.strftime('%H:%M:%S')} {message}")
        del self.log[:-LOG_LINES]
        m = _ENGINES_UP.search(message)
        if m:
            self.engines_up = int(m.group(1))


class PoolManager:
    """Start, list, stop and restart the pools of one Jupyter server.

    >>> import asyncio
    >>> m = PoolManager()
    >>> asyncio.run(m.list_pools())      # doctest: +SKIP
    []
    """

    def __init__(self, *, owners: OwnerLookup | None = None, max_workers: int = 8,
                 dashboard_idle_s: float = IDLE_S):
        self._owners = owners
        self._executor = DaemonExecutor(max_workers, thread_name_prefix="workbench")  # never holds the exit
        self.dashboards = DashboardSources(self._run, self.running_state, idle_s=dashboard_idle_s,
                                           states=self._said_states)
        self._started: dict[str, _Started] = {}  # by key
        self._stopping: set[str] = set()  # pool ids being stopped (any owner)
        self._probes: dict[str, Any] = {}  # pool id -> EnginePool attached to ask the controller
        self._probe_locks: dict[str, asyncio.Lock] = {}
        self._rank_states: dict[str, dict[int, str]] = {}
        # pool id -> (time.monotonic(), {rank: word}): what the card said last (the docked dashboard says it)
        self._said: dict[str, tuple[float, dict[int, str]]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._usage = UsageSampler()
        self._closing = False
        self._stack_askers: dict[str, Any] = {}  # pool id -> PoolStacks (subscribed once, kept)

    async def _run(self, fn, *args):
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except RuntimeError:  # "cannot schedule new futures after shutdown": a request that came in late
            raise ShuttingDown() from None
        return await future

    def _open(self) -> None:
        """Refuse requests once the server is shutting down (its pools are being stopped)."""
        if self._closing:
            raise ShuttingDown()

    # -- facts for the panel ---------------------------------------------------------
    def info(self) -> dict:
        """What the Start dialog offers, whether this machine has GPUs, and which workbench serves it (its
        version and environment: a kernel compares them with its own, ``workbench doctor`` shows them)."""
        from workbench.doctor import package_version

        gpus = self._usage.gpu_count()
        return {
            "launchers": list(LAUNCHERS),
            "backends": list(BACKENDS),
            "gpus": gpus,
            "default_n": gpus or 2,
            "version": package_version(),
            "prefix": sys.prefix,
        }

    # -- listing ---------------------------------------------------------------------
    async def list_pools(self, count_only: frozenset[str] = frozenset()) -> list[dict]:
        """Every pool of this server, as the panel shows it.

        ``count_only``: pools whose ranks the panel only counts (a big pool, its table closed): their
        ranks come with their state but without CPU, memory and GPU figures, so nothing measures each
        of their ranks for a table nobody sees.

        >>> await manager.list_pools(count_only=frozenset({"abc123"}))   # doctest: +SKIP
        [{'id': 'abc123', 'ranks': [{'rank': 0, 'state': 'idle', 'cpu_percent': None, ...}, ...], ...}]
        """
        self._open()
        states = await self._run(pool_state.list_states)
        owners = await self._owner_labels()
        by_id = {s.id: s for s in states}
        pools = []
        for rec in list(self._started.values()):
            state = by_id.pop(rec.pool_id, None) if rec.pool_id else None
            if rec.phase == "running" and state is None:
                self._started.pop(rec.key, None)  # it ended (its lease or another client stopped it)
                continue
            pools.append(await self._describe(state, rec, owners, count_only))
        for state in by_id.values():
            pools.append(await self._describe(state, None, owners, count_only))
        self._forget_probes(keep={p["id"] for p in pools})
        await self.dashboards.watch([s for s in states if s.id not in self._stopping])
        pools.sort(key=lambda p: p["created"])
        return pools

    async def get_pool(self, pool_id: str) -> dict:
        """One pool, by its id or by the ``request_id`` its start was answered with."""
        for pool in await self.list_pools():
            if pool_id in (pool["id"], pool["request_id"]):
                return pool
        raise PoolNotFound(pool_id, [p["id"] for p in await self.list_pools()])

    async def running_state(self, pool_id: str) -> PoolState:
        """The state file of a running pool (any owner), by id."""
        states = await self._run(pool_state.list_states)
        state = next((s for s in states if s.id == pool_id), None)
        if state is None:
            raise PoolNotFound(pool_id, [s.id for s in states])
        return state

    async def stacks(self, pool_id: str, native: bool = False) -> dict:
        """Every rank's stacks now (the card's "Stacks" button): the text ``%dist stacks`` prints, and
        the groups (ranks, headline), the odd ranks first."""
        self._open()
        state = await self.running_state(pool_id)
        if not state.channel:
            raise ValueError(f"pool {pool_id} has no side channel to ask its ranks through.")
        found = await self._run(self._stacks_sync, state, native)
        return {"text": found.format(), "seconds": round(found.seconds, 3), "missing": found.missing,
                "groups": [{"ranks": g.ranks, "headline": g.headline} for g in found.groups],
                "native": found.native_note()}

    def _stacks_sync(self, state: PoolState, native: bool):
        from workbench.session.stack_report import PoolStacks

        asker = self._stack_askers.get(state.id)
        if asker is None:
            asker = self._stack_askers[state.id] = PoolStacks(state.channel)
        ranks = [r["rank"] for r in state.ranks]
        return asker.gather(ranks, generation=state.generation, native=native)

    async def dashboard(self, pool_id: str, since: int = 0, view: str = "") -> dict:
        """The live dashboard of a running pool, for a page that has seen up to ``since`` of ``view``
        (:class:`workbench.server.dashboards.DashboardSources`).

        >>> first = await manager.dashboard("abc123")                              # doctest: +SKIP
        >>> await manager.dashboard("abc123", first["seq"], first["view"])         # doctest: +SKIP
        {'pool': 'abc123', 'view': '5f…', 'seq': 12, 'live': True, 'extend': [...], 'header': '…', ...}
        """
        self._open()
        return await self.dashboards.since(pool_id, since, view)

    async def _owner_labels(self) -> dict[int, str]:
        if self._owners is None:
            return {}
        try:
            return await self._owners()
        except Exception:
            return {}

    async def _describe(self, state: PoolState | None, rec: _Started | None, owners: dict[int, str],
                        count_only: frozenset[str] = frozenset()) -> dict:
        pool_id = (state.id if state else None) or rec.public_id
        n = (state.n if state else 0) or (rec.config.n if rec and rec.config.n else 0)
        ranks = state.ranks if state else []
        if rec is not None and rec.phase == "failed":
            phase = "failed"
        elif pool_id in self._stopping or (rec is not None and rec.phase == "stopping"):
            phase = "stopping"
        elif rec is not None and rec.phase in ("starting", "restarting"):
            phase = "starting"  # restarting: its lost ranks come back, the group re-forms (rec.message says)
        elif len(ranks) < n:
            phase = "starting"  # a kernel is starting it
        else:
            phase = "running"

        owner_pid = state.owner.get("pid") if state else None
        # handed over by a notebook (`%dist start --keep`): it outlives that notebook's kernel
        kept = bool(rec.config.keep if rec is not None else state is not None and state.config.keep)
        if rec is not None or owner_pid == os.getpid():
            owner = {"kind": "server", "label": "kept by the server" if kept else "started from the panel"}
        elif owner_pid in owners:
            owner = {"kind": "kernel", "label": owners[owner_pid]}
        else:
            owner = {"kind": "process", "label": f"process {owner_pid}"}

        rank_states = {}
        probed = phase == "running" and state is not None
        if probed:
            rank_states = await self._probe(pool_id, state, rec)
        rows = []
        meshes = state.meshes if state else {}
        mesh_names = {rank: name for name, m in meshes.items() for rank in m["ranks"]}
        measure = self._usage.alive if pool_id in count_only else self._usage.sample
        for r in ranks:
            usage = measure(r["pid"], r["host"], r["device"], r.get("gpu_uuid"))
            rank_state = rank_word(rank_states, r["rank"], usage.pop("alive"), probed)
            rows.append({
                "rank": r["rank"], "host": _with_place(r["host"], state), "pid": r["pid"],
                "device": r["device"], "mesh": mesh_names.get(r["rank"]),
                "local_rank": r.get("local_rank", 0), "state": rank_state, **usage,
            })
        if probed:
            self._said[pool_id] = (time.monotonic(), {row["rank"]: row["state"] for row in rows})
        if phase == "starting" and rec is not None and rec.phase == "restarting":
            message = rec.message
            engines_up = sum(row["state"] != "failed" for row in rows)
        elif phase == "starting" and rec is not None:
            message = rec.message
            engines_up = rec.engines_up
        else:
            message = rec.message if rec is not None and phase == "failed" else phase
            engines_up = len(ranks)
        return {
            "id": pool_id,
            # the id the start request was answered with, before the pool had its own (this server's pools)
            "request_id": rec.key if rec is not None else None,
            "state": phase,
            "n": n,
            "engines_up": engines_up,
            "message": message,
            "error": rec.error if rec is not None else None,
            "problem": rec.problem if rec is not None else None,
            "log": list(rec.log) if rec is not None else [],
            "launcher": state.launcher if state else rec.config.launcher,
            "backend": state.backend if state else None,
            # the Slurm job it runs in and its time left (issue 37): the card says it
            "slurm": pool_state.allocation_words(state.allocation, state.ends) if state else None,
            # a start's clock runs from the click, not from when the pool wrote its state file
            "created": rec.created if rec is not None else (state.created if state else 0.0) or time.time(),
            "owner": owner,
            "kept": kept,
            "name": (state.name if state else None) or (rec.config.name if rec is not None else None),
            "notebooks": await self._run(self._notebooks, pool_id, owners) if state is not None else [],
            "ranks": rows,
            # a split pool's sub-meshes (docs/submeshes.md), each with one word for its ranks
            "meshes": mesh_rows(meshes, rows),
            "gpu_detected": any(r["device"].startswith("cuda") for r in ranks),
            "attach": (f"%load_ext workbench\n%dist attach {(state.name if state else None) or pool_id}"
                       if phase == "running" else None),
            # how this server started it: what the dialog shows again on Retry
            "options": start_options(rec.asked or rec.config) if rec is not None else None,
        }

    @staticmethod
    def _notebooks(pool_id: str, owners: dict[int, str]) -> list[dict]:
        """Who drives the pool: the notebooks (kernels) attached to it, the one that started it first."""
        out = []
        for c in sharing.clients(pool_id):
            label = "the JupyterLab panel" if c["pid"] == os.getpid() else owners.get(c["pid"], c["notebook"])
            out.append({"notebook": label, "role": c["role"], "pid": c["pid"]})
        return out

    async def _probe(self, pool_id: str, state: PoolState, rec: _Started | None) -> dict[int, str]:
        """Which ranks are idle or busy, as the pool's controller sees them (at most one look at a time)."""
        lock = self._probe_locks.setdefault(pool_id, asyncio.Lock())
        if lock.locked():  # a look in progress (another page's listing): its answer, not an older one
            async with lock:
                return self._rank_states.get(pool_id, {})
        async with lock:
            try:
                # the owner's client (a session being stopped has none: then no look at all)
                client = rec.session.client if rec is not None and rec.session is not None else None
                states = await asyncio.wait_for(
                    self._run(self._probe_sync, pool_id, state, client), PROBE_TIMEOUT_S)
            except Exception:
                states = {}
            self._rank_states[pool_id] = states
            return states

    async def _said_states(self, pool_id: str) -> dict[int, str]:
        """Each rank's word as the card says it, for the pool's docked dashboard: the card's last look if it
        is fresh (the listing looks every 1.5 s while the panel shows), else a look now; ``{}`` for a pool
        that does not run (any more) or whose controller did not answer."""
        said_at, said = self._said.get(pool_id, (-1e9, {}))
        if time.monotonic() - said_at < PROBE_FRESH_S:
            return said
        try:
            state = await self.running_state(pool_id)
        except PoolNotFound:
            return {}
        rec = self._find_started(pool_id)
        changing = rec is not None and rec.phase != "running"
        if pool_id in self._stopping or len(state.ranks) < state.n or changing:
            return {}  # starting, restarting or stopping: the listing does not look either
        words = await self._probe(pool_id, state, rec)
        alive = {r["rank"]: self._usage.alive(r["pid"], r["host"], r["device"], r.get("gpu_uuid"))["alive"]
                 for r in state.ranks}
        return {rank: rank_word(words, rank, up, True) for rank, up in alive.items()}

    def _probe_sync(self, pool_id: str, state: PoolState, client) -> dict[int, str]:
        if client is None:
            probe = self._probes.get(pool_id)
            if probe is None:
                from workbench.pool.cluster import EnginePool

                probe = self._probes[pool_id] = EnginePool.attach(pool_id, timeout=PROBE_TIMEOUT_S)
            client = probe.client
        return rank_states(client, {r["rank"]: r["engine_id"] for r in state.ranks})

    def _forget_probes(self, keep: set[str]) -> None:
        for pool_id in list(self._stack_askers):
            if pool_id not in keep:
                self._executor.submit(self._stack_askers.pop(pool_id).close)
        for pool_id in list(self._probes):
            if pool_id not in keep:
                probe = self._probes.pop(pool_id)
                self._executor.submit(_close_quietly, probe)
        for pool_id in list(self._rank_states):
            if pool_id not in keep:
                self._rank_states.pop(pool_id, None)
                self._said.pop(pool_id, None)
                self._probe_locks.pop(pool_id, None)

    # -- start -------------------------------------------------------------------------
    async def start_pool(self, config: PoolConfig, pool_id: str | None = None) -> dict:
        """Begin starting a pool owned by this server; returns its pending description at once.

        ``pool_id``: start it under that id (a restarted pool keeps its id and its name)."""
        self._open()
        if config.n is None:  # what Session.start will take: one per GPU (on every node or host), else 2
            config = replace(config, n=launcher_for(config).default_engines(self._usage.gpu_count()))
        asked = config
        if config.name is None:  # named now: the card's title is the same from the click on (and if it fails)
            config = replace(config, name=sharing.name_for(pool_id or uuid.uuid4().hex[:8]))
        rec = _Started(key="new-" + uuid.uuid4().hex[:8], config=config, asked=asked, known_id=pool_id)
        rec.progress("starting")
        self._started[rec.key] = rec
        task = asyncio.get_running_loop().create_task(self._start(rec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await self._describe(None, rec, {})

    async def _start(self, rec: _Started) -> None:
        from workbench.session import Session

        try:
            rec.session = Session(rec.config, pool_id=rec.known_id, kept_here=True)
            await self._run(lambda: rec.session.start(progress=rec.progress))
        except Exception as exc:  # the real error goes on the card
            if rec.phase == "stopping":  # cancelled while starting: nothing to show
                self._started.pop(rec.key, None)
                return
            rec.phase = "failed"
            rec.error = in_words(exc)
            rec.problem = problem(exc if isinstance(exc, PoolStartError) else rec.error)
            rec.message = "failed to start"
            rec.log.append(rec.error)
            rec.session = None
            return
        if rec.phase == "stopping":  # stopped while it was starting
            await self._run(rec.session.stop)
            self._started.pop(rec.key, None)
            return
        rec.phase = "running"

    # -- stop ---------------------------------------------------------------------------
    async def stop_pool(self, pool_id: str) -> dict:
        """Stop a pool, whoever started it; a failed start is dismissed."""
        self._open()
        rec = self._find_started(pool_id)
        if rec is not None and rec.pool_id:
            pool_id = rec.pool_id
        if rec is not None and rec.phase == "failed":
            self._started.pop(rec.key, None)
            return {"id": pool_id, "state": "stopped"}
        if rec is not None and rec.phase == "starting":
            rec.phase = "stopping"  # _start stops it as soon as it is up
            return {"id": pool_id, "state": "stopping"}
        if rec is not None and rec.phase == "restarting":
            raise PoolBusy(f"pool {pool_id} is restarting: wait until it is done.")
        if pool_id in self._stopping:
            raise PoolBusy(f"pool {pool_id} is already stopping.")
        if rec is None and pool_id not in {s.id for s in await self._run(pool_state.list_states)}:
            raise PoolNotFound(pool_id, [p["id"] for p in await self.list_pools()])
        self._stopping.add(pool_id)
        try:
            await self.dashboards.end(pool_id)  # its last picture, taken before its ranks go
            probe = self._probes.pop(pool_id, None)
            if probe is not None:
                await self._run(_close_quietly, probe)
            if rec is not None:
                rec.phase = "stopping"
                await self._run(lambda: rec.session.stop(by=PANEL))
                self._started.pop(rec.key, None)
            else:
                from workbench.pool.cluster import stop_pool

                await self._run(stop_pool, pool_id, PANEL)
        finally:
            self._stopping.discard(pool_id)
        return {"id": pool_id, "state": "stopped"}

    async def restart_pool(self, pool_id: str) -> dict:
        """What ``%dist restart`` does, for a pool this server drives: new engines for its lost ranks only,
        then the group re-formed (a healthy pool: only re-formed); the other ranks keep their state. A pool
        another process drives (the server has no hand on its ranks) is stopped and started again like it,
        owned by this server; a failed start is retried."""
        self._open()
        rec = self._find_started(pool_id)
        if rec is not None and rec.pool_id:
            pool_id = rec.pool_id
        if rec is not None and rec.phase == "running" and rec.session is not None and rec.session.running:
            if pool_id in self._stopping:
                raise PoolBusy(f"pool {pool_id} is stopping: wait until it is done.")
            rec.phase = "restarting"
            rec.error = None
            rec.progress("restarting")
            state = next((s for s in await self._run(pool_state.list_states) if s.id == pool_id), None)
            alive = self._usage.alive
            gone = {r["rank"] for r in (state.ranks if state else [])
                    if alive(r["pid"], r["host"], r["device"], r.get("gpu_uuid"))["alive"] is False}
            task = asyncio.get_running_loop().create_task(self._restart(rec, gone))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return await self._describe(state, rec, {})
        state = next((s for s in await self._run(pool_state.list_states) if s.id == pool_id), None)
        if rec is not None:
            config = rec.config
        elif state is None:
            raise PoolNotFound(pool_id, [p["id"] for p in await self.list_pools()])
        else:
            config = pool_state.config_of(state)
        same_id = pool_id if state is not None else None  # the pool starts again as itself
        if rec is not None and rec.phase in BUSY or pool_id in self._stopping:
            raise PoolBusy(f"pool {pool_id} is {rec.phase if rec else 'stopping'}: wait until it is done.")
        await self.stop_pool(pool_id)
        return await self.start_pool(config, pool_id=same_id)

    async def _restart(self, rec: _Started, gone: set[int]) -> None:
        """``gone``: the ranks whose engine process the card shows ended; the session's health watcher is
        given a moment to have seen them too, so they are replaced, not re-formed with."""
        deadline = time.monotonic() + HEALTH_WAIT_S
        while not gone <= set(rec.session.dead_ranks()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        try:
            restarted = await self._run(lambda: rec.session.restart(progress=rec.progress))
            rec.progress(f"restarted rank {', '.join(map(str, restarted))}" if restarted else
                         "the process group re-formed")
        except Exception as exc:  # the pool runs on as it was: the card says why
            rec.error = in_words(exc)
            rec.progress(f"the restart failed: {rec.error}")
        finally:
            if rec.phase == "restarting":
                rec.phase = "running"

    def _find_started(self, pool_id: str) -> _Started | None:
        for rec in self._started.values():
            if pool_id in (rec.key, rec.pool_id):
                return rec
        return None

    # -- shutdown ---------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """Stop every pool this server started (the server is going away), within :data:`SHUTDOWN_S`.

        The manager closes first (every later request is answered "shutting down"), then stops the
        pools, all at once, and only then its worker threads: no request ever finds them gone. Nothing is
        waited for past the bound: a pool still starting, or one whose controller does not answer, is ended
        by its lease once this server has exited, and the workers are daemon threads (they never hold the
        exit).
        """
        self._closing = True
        deadline = time.monotonic() + SHUTDOWN_S

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        for rec in self._started.values():
            if rec.phase == "starting":
                rec.phase = "stopping"  # _start stops it as soon as it is up, if the server is still here
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=left())
        stops = [asyncio.ensure_future(self._run(lambda s=rec.session: s.stop(by="the Jupyter server, "
                                                                                "shutting down")))
                 for rec in self._started.values() if rec.session is not None and rec.session.running]
        if stops:
            await asyncio.wait(stops, timeout=left())
        self._started.clear()
        closing = [asyncio.ensure_future(self.dashboards.close_all())]
        closing += [asyncio.ensure_future(self._run(_close_quietly, p)) for p in self._probes.values()]
        closing += [asyncio.ensure_future(self._run(a.close)) for a in self._stack_askers.values()]
        await asyncio.wait(closing, timeout=left())
        self._probes.clear()
        self._stack_askers.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)


def mesh_rows(meshes: dict[str, dict], rows: list[dict]) -> list[dict]:
    """A split pool's sub-meshes as the card lists them: name, ranks and one state for the lot (failed if a
    rank failed, else busy if one is, else unknown or starting if one is, else idle); [] when not split.

    >>> rows = [{"rank": 0, "state": "busy"}, {"rank": 1, "state": "idle"}, {"rank": 2, "state": "idle"}]
    >>> mesh_rows({"a": {"ranks": [0, 1]}, "b": {"ranks": [2]}}, rows)
    [{'name': 'a', 'ranks': [0, 1], 'state': 'busy'}, {'name': 'b', 'ranks': [2], 'state': 'idle'}]
    """
    states = {row["rank"]: row["state"] for row in rows}
    out = []
    for name, mesh in meshes.items():
        present = {states.get(rank, "unknown") for rank in mesh["ranks"]}
        word = next((w for w in ("failed", "busy", "unknown", "starting") if w in present), "idle")
        out.append({"name": name, "ranks": list(mesh["ranks"]), "state": word})
    return out


def in_words(exc: BaseException) -> str:
    """A failure as a sentence for the card: our own errors say it all; others say what they are.

    >>> in_words(ValueError("n must be at least 1."))
    'n must be at least 1.'
    >>> in_words(FileNotFoundError(2, "No such file or directory", "sbatch"))
    "could not start the pool: [Errno 2] No such file or directory: 'sbatch'"
    """
    if isinstance(exc, (WorkbenchError, ValueError)):
        return str(exc)
    return f"could not start the pool: {exc}"


def rank_word(words: dict[int, str], rank: int, alive: bool | None, probed: bool) -> str:
    """A rank's one word, as the card and the docked dashboard say it: ``failed`` where its engine process
    is gone (seen at once, before its controller knows), else what the controller said (``words``), else
    ``unknown`` where the controller was asked and gave no answer in time (``idle`` where nobody asked: a
    pool starting).

    >>> rank_word({0: "busy"}, 0, True, True), rank_word({0: "busy"}, 0, False, True)
    ('busy', 'failed')
    >>> rank_word({}, 0, True, True), rank_word({}, 0, True, False)
    ('unknown', 'idle')
    """
    if alive is False:
        return "failed"
    return words.get(rank) or ("idle" if alive and not probed else "unknown")


def _close_quietly(probe) -> None:
    """Close an attached look-only client; never stops the pool."""
    try:
        if probe.client is not None:
            probe.client.close()
    except Exception:
        pass


def _with_place(host: str, state: PoolState | None) -> str:
    """A rank's host with the machine it is on where the host is not one (a Kubernetes pod: its node).

    >>> _with_place("wb-1a-x", PoolState(places={"wb-1a-x": "node-3"})), _with_place("n1", None)
    ('wb-1a-x (node-3)', 'n1')
    """
    node = state.places.get(host) if state is not None else None
    return f"{host} ({node})" if node else host
