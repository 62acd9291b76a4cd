"""The one joint between the engine pool and the process group.

>>> from workbench import Session
>>> with Session(n=2).start() as s:                        # doctest: +SKIP
...     s.run("import torch; t = torch.ones(1) * rank; dist.all_reduce(t)")
...     s.pull("t")
[tensor([1.]), tensor([1.])]
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from workbench.config import PoolConfig
from workbench.errors import CellTimeout, NoPoolError, PoolStartError, RankError
from workbench.pool.cluster import EnginePool
from workbench.pool.devices import visible_gpu_count
from workbench.pool.rankmap import EngineInfo, RankInfo, build_rank_map, parse_ranks

# Called with (rank, kind, payload): kind is "stdout"/"stderr" (text) or "display" (a display_data content dict).
OutputCallback = Callable[[int, str, Any], None]

# After one rank failed, how long the others may go on before they are interrupted.
FAILURE_GRACE_S = 1.0

_current: Session | None = None


def current() -> Session:
    """The session started last in this process (what the magics drive)."""
    if _current is None or not _current.running:
        raise NoPoolError()
    return _current


@dataclass
class RankResult:
    """What one rank produced for one cell."""

    rank: RankInfo
    stdout: str = ""
    stderr: str = ""
    result: dict | None = None  # the last expression's mime bundle, e.g. {"text/plain": "42"}
    outputs: list = field(default_factory=list)  # display_data contents
    error: Any = None  # ipyparallel RemoteError
    completed: Any = None


@dataclass
class CellResult:
    """Every target rank's result, in rank order."""

    ranks: list[RankResult]
    elapsed: float

    def failures(self) -> list[RankResult]:
        """The ranks that raised, the first to fail first."""
        failed = [r for r in self.ranks if r.error is not None]
        return sorted(failed, key=lambda r: (r.completed is None, r.completed or 0, r.rank.rank))


class Session:
    """A pool of engines joined into one torch.distributed process group.

    >>> s = Session(n=2, timeout=30)     # doctest: +SKIP
    >>> s.start(progress=print)          # doctest: +SKIP
    >>> s.run("x = rank * 10")           # doctest: +SKIP
    >>> s.pull("x")                      # doctest: +SKIP
    [0, 10]
    >>> s.stop()                         # doctest: +SKIP
    """

    def __init__(self, config: PoolConfig | None = None, **kwargs):
        self.config = config or PoolConfig(**kwargs)
        self.ranks: list[RankInfo] = []
        self.backend: str | None = None
        self._pool: EnginePool | None = None
        self.start_seconds: float | None = None

    # -- lifecycle -----------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._pool is not None and self._pool.client is not None

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def start(self, progress: Callable[[str], None] = lambda msg: None) -> Session:
        """Start the engines and form the process group; returns self once every rank is ready."""
        global _current
        if self.running:
            raise ValueError("this session is already running: stop it first, or use it as it is.")
        t0 = time.perf_counter()
        n = self.config.n or visible_gpu_count() or 2
        local = self.config.launcher == "local"
        env = {"GLOO_SOCKET_IFNAME": "lo"} if local else {}
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n)) if local else "1"
        self._pool = EnginePool(n=n, launcher=self.config.launcher, address=self.config.address,
                                timeout=self.config.timeout, env=env)
        client = self._pool.start(progress)
        try:
            progress("forming the process group")
            self._form_group(client)
        except BaseException:
            self._pool.stop()
            self._pool = None
            raise
        self.start_seconds = time.perf_counter() - t0
        atexit.register(self.stop)  # kernel shutdown and restart end the pool too
        progress(f"ready: {n} ranks, backend {self.backend}, {self.start_seconds:.1f} s")
        _current = self
        return self

    @classmethod
    def attach(cls, pool_id: str) -> Session:
        """Drive a pool that another notebook or the JupyterLab panel started.

        The ranks keep their process group and their state.

        >>> s = Session.attach("1a2b3c4d")      # doctest: +SKIP
        """
        global _current
        pool = EnginePool.attach(pool_id)
        state = pool.state
        self = cls(PoolConfig(n=state["n"], launcher=state["launcher"],
                              backend=state.get("backend_requested", "auto")))
        self._pool = pool
        self.ranks = [RankInfo(**r) for r in state.get("ranks", [])]
        if len(self.ranks) != state["n"]:
            pool.client.close()
            raise PoolStartError(f"pool {pool_id} has not finished starting: try again in a moment.")
        self.backend = state.get("backend")
        _current = self
        return self

    @property
    def pool_id(self) -> str | None:
        return self._pool.pool_id if self._pool else None

    def _form_group(self, client) -> None:
        from workbench.dist import engine

        view = client[:]
        infos = view.apply_async(engine.describe).get(timeout=self.config.timeout)
        engines = [EngineInfo(eid, i["host"], i["pid"], i["gpus"]) for eid, i in zip(view.targets, infos)]
        self.ranks = build_rank_map(engines)
        per_host = max(sum(r.host == h for r in self.ranks) for h in {r.host for r in self.ranks})
        threads = max(1, (os.cpu_count() or 1) // per_host)
        root = self.ranks[0]
        port = client[root.engine_id].apply_sync(engine.open_store, self.config.address, self.config.timeout)
        futures = [
            client[r.engine_id].apply_async(
                engine.join, rank=r.rank, local_rank=r.local_rank, world_size=len(self.ranks),
                address=self.config.address, port=port, backend=self.config.backend, device=r.device,
                timeout_s=self.config.timeout, threads=threads,
                ifname="lo" if self.config.launcher == "local" else None)
            for r in self.ranks
        ]
        try:
            joined = [f.get(timeout=self.config.timeout + 5) for f in futures]
        except Exception as exc:
            raise PoolStartError(f"the process group did not form: {exc}") from exc
        self.backend = joined[0]["backend"]
        self._pool.update_state(ranks=[r.__dict__ for r in self.ranks], backend=self.backend,
                                backend_requested=self.config.backend)

    def stop(self) -> None:
        """Stop every engine and the controller; nothing of the pool is left running."""
        global _current
        if self._pool is not None:
            self._pool.stop()
        self._pool = None
        if _current is self:
            _current = None

    def __enter__(self) -> Session:
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pids(self) -> list[int]:
        """Every process the pool started (controller, engines, lease)."""
        return self._pool.pids() if self._pool else []

    @property
    def client(self):
        if not self.running:
            raise NoPoolError()
        return self._pool.client

    # -- rank helpers --------------------------------------------------------------
    def targets(self, ranks=None) -> list[RankInfo]:
        """Resolve ``None`` (all), a rank, a list of ranks or a spec like ``"0,2-3"``."""
        if not self.running:
            raise NoPoolError()
        if ranks is None:
            return list(self.ranks)
        if isinstance(ranks, str):
            ranks = parse_ranks(ranks, self.world_size)
        elif isinstance(ranks, int):
            ranks = [ranks]
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"rank {bad[0]} is out of range: this pool has ranks 0-{self.world_size - 1}.")
        return [self.ranks[r] for r in sorted(set(ranks))]

    def _view(self, targets: list[RankInfo]):
        return self.client[[r.engine_id for r in targets]]

    # -- data --------------------------------------------------------------------------
    def push(self, values: dict, ranks=None) -> None:
        """Send ``{name: value}`` into the namespace of the target ranks."""
        self._view(self.targets(ranks)).push(values, block=True)

    def pull(self, name: str, rank: int | None = None):
        """A value from one rank, or a list with every rank's value (in rank order)."""
        if rank is not None:
            return self.client[self.targets(rank)[0].engine_id].pull(name, block=True)
        return self._view(self.targets()).pull(name, block=True)

    def apply(self, fn: Callable, *args, ranks=None, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on the target ranks at once; the results in rank order."""
        return self._view(self.targets(ranks)).apply_sync(fn, *args, **kwargs)

    # -- cells ---------------------------------------------------------------------------
    def run(self, code: str, *, ranks=None, timeout: float | None = None,
            on_output: OutputCallback | None = None) -> CellResult:
        """Run ``code`` on the target ranks at once, streaming output as it comes.

        Raises :class:`RankError` naming the first rank that failed, :class:`CellTimeout`
        when ``timeout`` passes, and ``KeyboardInterrupt`` after interrupting the ranks.
        """
        targets = self.targets(ranks)
        t0 = time.perf_counter()
        ar = self._view(targets).execute(code, silent=False, block=False)
        by_engine = {r.engine_id: r for r in targets}
        children = [(by_engine[eid], child) for eid, child in zip(ar._targets, ar._children)]
        wake = threading.Event()
        for _, child in children:
            child.iopub_callbacks.append(lambda msg: wake.set())
        ar.add_done_callback(lambda f: wake.set())
        relay = _OutputRelay(on_output)
        deadline = None if timeout is None else time.monotonic() + timeout
        failed_at = None
        try:
            while True:
                wake.wait(0.05)
                wake.clear()
                relay.forward(children)
                if ar.done():
                    break
                now = time.monotonic()
                if failed_at is None and any(c.output.metadata["error"] is not None for _, c in children):
                    failed_at = now
                if failed_at is not None and now - failed_at > FAILURE_GRACE_S:
                    self._interrupt([r for r, c in children if not c.done()])
                    failed_at = float("inf")
                if deadline is not None and now > deadline:
                    stuck = [r for r, c in children if not c.done()]
                    self._interrupt(stuck)
                    raise CellTimeout(
                        f"the cell ran past its timeout of {timeout:g} s on "
                        + ", ".join(r.label() for r in stuck)
                        + "; those ranks were interrupted."
                    )
        except KeyboardInterrupt:
            self._interrupt([r for r, c in children if not c.done()])
            ar.wait(2)
            relay.forward(children)
            raise
        ar.wait_for_output(5)
        relay.forward(children)
        result = CellResult([_rank_result(r, c) for r, c in children], time.perf_counter() - t0)
        failures = result.failures()
        if failures:
            raise RankError([(f.rank, f.error) for f in failures], result)
        return result

    def _interrupt(self, targets: list[RankInfo]) -> None:
        """SIGINT the target engines: stops the Python code they run, not only our wait."""
        if targets:
            self.client.send_signal(signal.SIGINT, targets=[r.engine_id for r in targets], block=True)

    # -- status ----------------------------------------------------------------------
    def status(self) -> list[dict]:
        """One row per rank: rank, host, pid, device, state (idle, busy or dead)."""
        if not self.running:
            return []
        alive = set(self.client.ids)
        queues = self.client.queue_status(targets=[r.engine_id for r in self.ranks if r.engine_id in alive])
        rows = []
        for r in self.ranks:
            if r.engine_id not in alive:
                state = "dead"
            else:
                q = queues.get(r.engine_id, {})
                state = "busy" if q.get("queue", 0) or q.get("tasks", 0) else "idle"
            rows.append({"rank": r.rank, "host": r.host, "pid": r.pid, "device": r.device, "state": state})
        return rows


class _OutputRelay:
    """Forwards each rank's new output exactly once, from the full text ipyparallel accumulates."""

    def __init__(self, on_output: OutputCallback | None):
        self.on_output = on_output
        self.sent: dict[tuple[int, str], int] = {}

    def forward(self, children) -> None:
        if self.on_output is None:
            return
        for info, child in children:
            md = child.output.metadata
            for kind in ("stdout", "stderr"):
                text = md[kind] or ""
                done = self.sent.get((info.rank, kind), 0)
                if len(text) > done:
                    self.sent[(info.rank, kind)] = len(text)
                    self.on_output(info.rank, kind, text[done:])
            outputs = md["outputs"]
            done = self.sent.get((info.rank, "display"), 0)
            for content in outputs[done:]:
                self.on_output(info.rank, "display", content)
            self.sent[(info.rank, "display")] = len(outputs)


def _rank_result(info: RankInfo, child) -> RankResult:
    md = child.output.metadata
    error = md["error"]
    if error is None and child.done() and child.exception() is not None:
        error = child.exception()
    return RankResult(
        rank=info, stdout=md["stdout"] or "", stderr=md["stderr"] or "",
        result=(md["execute_result"] or {}).get("data"), outputs=list(md["outputs"]),
        error=error, completed=md["completed"],
    )
