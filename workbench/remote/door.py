"""The door: the one transport from the kernel to one pool's engines.

A :class:`Door` per process group is the only holder of ipyparallel views on the pool's engines and of
the side channel's command sender. Everything the kernel sends to the engines goes through it, in one of
three kinds:

- the catalogue's endpoints (:mod:`workbench.remote`), each only in the way it is declared:
  :meth:`Door.call` (on each rank), :meth:`Door.call_one` (on one rank), :meth:`Door.cell` (pushed, then
  called by a cell the kernel watches: the one place that makes such a cell);
- the user's own data and cells: :meth:`Door.push`, :meth:`Door.pull`, :meth:`Door.apply` (what a
  :class:`~workbench.session.rank_view.RankView` does), :meth:`Door.start_cell` (a ``%%distributed``
  cell) and :meth:`Door.replay_cell` (the notebook's setup replayed on a new engine);
- commands up the side channel (:class:`Commands`, one :class:`~workbench.wire.Command` each), which the
  ranks' agents carry out from their own thread, also while the main thread is blocked.

Views are kept, one per set of engines: a new ``DirectView`` per cell was a third of the kernel-side cost
of a trivial cell beyond ipyparallel's. Nobody changes a view's flags; every send passes ``block``.

>>> door = Door(pool)                                          # doctest: +SKIP
>>> door.call(remote.describe, pool.client.ids)               # doctest: +SKIP
[{'host': 'vm', 'pid': 4242, 'gpus': 0, ...}, ...]
>>> door.call_one(remote.clock, ranks[0])                     # doctest: +SKIP
1767225600.123
"""

from __future__ import annotations

import ast
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from workbench import remote, wire
from workbench.errors import RankDiedError
from workbench.pool.rankmap import RankInfo

P = ParamSpec("P")
R = TypeVar("R")
Target = RankInfo | int  # a rank, or an engine id (engines not yet ranks: a start, a new engine)

VIEWS_KEPT = 16  # views kept, one per set of engines (a notebook uses a few: all, one rank, a subset)
CELL_PREFIX = "_wb_"  # a cell's endpoint is pushed as _wb_<name>, its result bound to _wb_<name>_result


class Door:
    """The transport to the engines of ``pool`` (an :class:`~workbench.pool.cluster.EnginePool`: its
    ipyparallel client and its side channel)."""

    def __init__(self, pool):
        self.pool = pool
        self.commands = Commands(pool.channel)
        self._views: dict[tuple[int, ...], Any] = {}  # engine ids -> their DirectView
        self._views_lock = threading.Lock()

    # -- the catalogue's endpoints, each as it is declared ------------------------------------------
    def call(self, fn: Callable[P, R], targets: Sequence[Target], /, *args: P.args, **kwargs: P.kwargs
             ) -> list[R]:
        """``fn(*args, **kwargs)`` on every target at once (an :data:`~workbench.remote.EACH` endpoint);
        the results in the targets' order."""
        _declared(fn, remote.EACH)
        return self._view(targets).apply_sync(fn, *args, **kwargs)

    def call_within(self, seconds: float, fn: Callable[P, R], targets: Sequence[Target], /, *args: P.args,
                    **kwargs: P.kwargs) -> list[R]:
        """As :meth:`call`, waiting at most ``seconds`` (``TimeoutError``: a rank still busy)."""
        _declared(fn, remote.EACH)
        return self._view(targets).apply_async(fn, *args, **kwargs).get(timeout=seconds)

    def call_apart(self, fn: Callable[..., R], calls: Sequence[tuple[Target, dict]], within: float
                   ) -> list[R]:
        """An :data:`~workbench.remote.EACH` endpoint on every target at once, each with its own keyword
        arguments (``calls``: ``(target, kwargs)`` each); waits at most ``within`` seconds for each."""
        _declared(fn, remote.EACH)
        pending = [self._view([target]).apply_async(fn, **kwargs) for target, kwargs in calls]
        return [answer.get(timeout=within)[0] for answer in pending]

    def call_one(self, fn: Callable[P, R], target: Target, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` on one rank (a :data:`~workbench.remote.ONE` endpoint); its result."""
        _declared(fn, remote.ONE)
        [found] = self._view([target]).apply_sync(fn, *args, **kwargs)
        return found

    def call_one_within(self, seconds: float, fn: Callable[P, R], target: Target, /, *args: P.args,
                        **kwargs: P.kwargs) -> R:
        """As :meth:`call_one`, waiting at most ``seconds`` (``TimeoutError``: its main thread is busy)."""
        _declared(fn, remote.ONE)
        [found] = self._view([target]).apply_async(fn, *args, **kwargs).get(timeout=seconds)
        return found

    def cell(self, fn: Callable[P, Any], targets: Sequence[Target], /, *args: P.args, **kwargs: P.kwargs
             ) -> str:
        """Push ``fn`` (a :data:`~workbench.remote.CELL` endpoint) to ``targets``; returns the cell's one line
        that calls it there with these arguments (literals, written into the line) and binds its result
        (:meth:`cell_results` takes it back). The caller runs the line as a cell it watches.

        >>> door = Door.__new__(Door)
        >>> door.push = lambda targets, values: None
        >>> door.cell(remote.run_script, [], "train.py", ["--steps", "5"], "/w")
        "_wb_run_script_result = _wb_run_script('train.py', ['--steps', '5'], '/w')"
        """
        return self._cell_line(fn, targets, True, args, kwargs)

    def _cell_line(self, fn: Callable, targets: Sequence[Target], block: bool, args: tuple, kwargs: dict
                   ) -> str:
        """:meth:`cell`'s push and line; ``block=False``: the push is not waited for (the cell's own request
        queues behind it on each engine, which takes them in order)."""
        _declared(fn, remote.CELL)
        name = CELL_PREFIX + fn.__name__
        if block:
            self.push(targets, {name: fn})
        else:
            self._view(targets).push({name: fn}, block=False)
        return f"{name}_result = {name}({call_text(*args, **kwargs)})"

    def cell_results(self, fn: Callable, targets: Sequence[Target]) -> list:
        """What the cell of :meth:`cell` bound on each target (taken off it, with the function)."""
        name = CELL_PREFIX + fn.__name__
        return [found[0] for found in self.call(remote.take, targets, [f"{name}_result", name])]

    def start_in_cell(self, fn: Callable[P, Any], targets: Sequence[Target], /, *args: P.args,
                      **kwargs: P.kwargs):
        """:meth:`cell`, started at once on ``targets`` (:meth:`start_cell`): a new engine joining the
        elastic run in progress, whose reply the running cell then waits for like the others'. Nothing here
        waits for the engines (a joining one may be stopped: the caller, the elastic run's watch, must go on
        watching, and routes around it)."""
        return self.start_cell(targets, self._cell_line(fn, targets, False, args, kwargs))

    # -- the user's own data and cells -------------------------------------------------------------
    def push(self, targets: Sequence[Target], values: dict) -> None:
        """``{name: value}`` into the namespace of every target."""
        self._view(targets).push(values, block=True)

    def pull(self, targets: Sequence[Target], name: str) -> list:
        """Every target's ``name``, in the targets' order."""
        return self._view(targets).pull(name, block=True)

    def apply(self, targets: Sequence[Target], fn: Callable, *args, **kwargs) -> list:
        """The user's ``fn(*args, **kwargs)`` on every target at once; the results in the targets' order."""
        return self._view(targets).apply_sync(fn, *args, **kwargs)

    def start_cell(self, targets: Sequence[Target], code: str, label: str | None = None):
        """Start ``code`` on every target at once; returns ipyparallel's ``AsyncResult`` at once (its
        children: one reply per target, with their output as it comes)."""
        return self._view(targets).execute(code, silent=False, block=False, label=label)

    def replay_cell(self, targets: Sequence[Target], code: str, within: float) -> None:
        """Run ``code`` quietly on every target and wait for it (at most ``within`` seconds): the notebook's
        setup replayed on a new engine."""
        self._view(targets).execute(code, silent=True, block=False).get(timeout=within)

    # -- the side channel ------------------------------------------------------------------------------
    def command(self, what: wire.Command, ranks: Sequence[int], generation: int, **details) -> None:
        """Send the agents of ``ranks`` (of process group ``generation``) the signed command ``what``."""
        self.commands.send(what, ranks, generation, **details)

    def close(self) -> None:
        self.commands.close()
        with self._views_lock:
            self._views.clear()

    # -- views -------------------------------------------------------------------------------------
    def _view(self, targets: Sequence[Target]):
        """The ipyparallel view on the engines of ``targets`` (made once per set of engines); a target whose
        engine left the controller is a :class:`RankDiedError` naming it."""
        ids = tuple(t if isinstance(t, int) else t.engine_id for t in targets)
        client = self.pool.client
        with self._views_lock:
            known = self._views.get(ids)
        if known is not None and known.client is client and set(ids) <= set(client.ids):
            return known
        try:
            view = client[list(ids)]
        except (KeyError, IndexError):  # the controller dropped an engine: it is gone
            alive = set(client.ids)
            lost = next(t for t in targets if (t if isinstance(t, int) else t.engine_id) not in alive)
            what = f"engine {lost}" if isinstance(lost, int) else lost.label()
            raise RankDiedError(f"{what} is gone (its engine left the controller): `%dist restart` brings it "
                                "back.") from None
        with self._views_lock:
            if len(self._views) >= VIEWS_KEPT:
                self._views.clear()
            self._views[ids] = view
        return view


class Commands:
    """The sender of signed commands up a pool's side channel (``channel``: the pool's ``{"up", "key"}``; a
    pool without one sends nothing). Its socket is made on first use; a command that cannot be queued is
    dropped (the relay is gone: the pool is stopping)."""

    def __init__(self, channel: dict | None):
        self.channel = channel
        self._sock = None
        self._lock = threading.Lock()
        self._signer = wire.Signer(channel["key"]) if channel else None

    def send(self, what: wire.Command, ranks: Sequence[int], generation: int, **details) -> None:
        """One command: ``what`` for ``ranks`` of group ``generation`` (commands addressed to engines,
        ``fence`` and ``regroup``, name them in ``details``)."""
        import zmq

        if self._signer is None:
            return
        body = {"do": wire.Command(what).value, "ranks": list(ranks), "generation": generation,
                "id": uuid.uuid4().hex, **details}
        frames = self._signer.pack(wire.COMMAND, json.dumps(body).encode())
        with self._lock:
            if self._sock is None:
                self._sock = wire.pusher(zmq.Context.instance(), self.channel["up"])
            try:
                self._sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                pass  # the relay is gone: the pool is stopping

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(0)
                self._sock = None


def call_text(*args, **kwargs) -> str:
    """The arguments of a call as Python source; each must be a literal (it is written into a cell's line).

    >>> call_text("a.py", [1, 2], cwd=None)
    "'a.py', [1, 2], cwd=None"
    >>> call_text(object())
    Traceback (most recent call last):
    ...
    TypeError: a cell's call takes literals (numbers, strings, lists, dicts), not object
    """
    for value in (*args, *kwargs.values()):
        try:
            same = ast.literal_eval(repr(value)) == value
        except (ValueError, SyntaxError):
            same = False
        if not same:
            raise TypeError(f"a cell's call takes literals (numbers, strings, lists, dicts), not "
                            f"{type(value).__name__}")
    return ", ".join([*map(repr, args), *(f"{key}={value!r}" for key, value in kwargs.items())])


def _declared(fn: Callable, pattern: remote.Pattern) -> None:
    """``fn`` is an endpoint of the catalogue declared to be called ``pattern`` (an internal invariant)."""
    found = remote.pattern_of(fn)
    if found is not pattern:
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} is "
                        + (f"declared {found.value}" if found else "not an endpoint of workbench.remote")
                        + f", not {pattern.value}")
