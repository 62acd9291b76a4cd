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

Fan-out per host (issue 42): a request for every rank leaves the kernel once, not once a rank, and its replies
come back merged, so that what the kernel does per cell does not grow with the ranks:

- a call on each rank (:meth:`call`, :meth:`push`, :meth:`pull`, :meth:`apply`) goes through ipyparallel's
  ``BroadcastView`` with reply coalescing: one request down the controller's scheduler tree, one reply with
  every rank's result. Each rank's result comes wrapped (:func:`workbench.remote.guarded`: a coalesced reply
  carries results only, so an exception is returned, then raised here as ipyparallel would);
- a cell on ranks whose hosts have hubs (:meth:`hubs`) is one broadcast call of
  :func:`workbench.remote.run_cell`; each host's hub sends its ranks' merged lines and ends
  (:class:`~workbench.remote.host_replies.HostCell`), and the kernel's ipyparallel client takes no iopub at
  all (:meth:`quiet_iopub`: every engine's busy and idle of every request, 2-4 messages a rank a cell);
- elsewhere (ranks without a hub: a Slurm or MPI pool) a cell is ipyparallel's ``execute`` on a
  ``DirectView``, its output per rank, as before.

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

from ipyparallel.error import CompositeError

from workbench import lines, remote, wire
from workbench.errors import RankDiedError
from workbench.pool.rankmap import RankInfo
from workbench.remote.host_replies import HostCell

P = ParamSpec("P")
R = TypeVar("R")
Target = RankInfo | int  # a rank, or an engine id (engines not yet ranks: a start, a new engine)

VIEWS_KEPT = 16  # views kept, one per set of engines (a notebook uses a few: all, one rank, a subset)
CELL_PREFIX = "_wb_"  # a cell's endpoint is pushed as _wb_<name>, its result bound to _wb_<name>_result
# Once every rank has left a cell's broadcast call, the ends its hub has not sent (a hub forked again
# meanwhile) are asked of the ranks after this long.
RECLAIM_S = 2.0


class Door:
    """The transport to the engines of ``pool`` (an :class:`~workbench.pool.cluster.EnginePool`: its
    ipyparallel client and its side channel)."""

    def __init__(self, pool):
        self.pool = pool
        self.commands = Commands(pool.channel)
        self._views: dict[tuple, Any] = {}  # (engine ids, broadcast) -> their view
        self._views_lock = threading.Lock()
        self._cells = None  # the hosts' cell messages (CellMessages), subscribed at the first cell with hubs
        self._iopub_quiet = False
        self.fanout = wire.fanout()  # False: every request once a rank, as before issue 42

    # -- the catalogue's endpoints, each as it is declared ------------------------------------------
    def call(self, fn: Callable[P, R], targets: Sequence[Target], /, *args: P.args, **kwargs: P.kwargs
             ) -> list[R]:
        """``fn(*args, **kwargs)`` on every target at once (an :data:`~workbench.remote.EACH` endpoint);
        the results in the targets' order."""
        _declared(fn, remote.EACH)
        return self._each(targets, fn, args, kwargs)

    def call_within(self, seconds: float, fn: Callable[P, R], targets: Sequence[Target], /, *args: P.args,
                    **kwargs: P.kwargs) -> list[R]:
        """As :meth:`call`, waiting at most ``seconds`` (``TimeoutError``: a rank still busy)."""
        _declared(fn, remote.EACH)
        return self._each(targets, fn, args, kwargs, within=seconds)

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
        """``{name: value}`` into the namespace of every target (sent once for all of them)."""
        if not self.fanout:
            return self._view(targets).push(values, block=True)
        self._each(targets, remote.put, (values,), {})

    def pull(self, targets: Sequence[Target], name: str) -> list:
        """Every target's ``name``, in the targets' order."""
        if not self.fanout:
            return self._view(targets).pull(name, block=True)
        return self._each(targets, remote.get, (name,), {})

    def apply(self, targets: Sequence[Target], fn: Callable, *args, **kwargs) -> list:
        """The user's ``fn(*args, **kwargs)`` on every target at once; the results in the targets' order."""
        return self._each(targets, fn, args, kwargs)

    def hubs(self, targets: Sequence[Target]) -> dict[str, tuple[int, ...]] | None:
        """The ranks of ``targets`` per host hub, where every one of them has a hub (their cells' output and
        ends then come merged per host); None where one has none (or is no rank yet).

        >>> door = Door.__new__(Door); door.pool = type("P", (), {"channel": {"key": "k"}})()
        >>> a = RankInfo(0, 0, 0, "a", 1, "cpu", 0, hub="h0")
        >>> door.hubs([a, RankInfo(1, 0, 0, "a", 2, "cpu", 1, hub="h1")])
        {'h0': (0,), 'h1': (1,)}
        >>> door.hubs([RankInfo(0, 0, 0, "a", 1, "cpu", 0)]) is None
        True
        """
        if not (self.pool.channel and targets and all(isinstance(t, RankInfo) and t.hub for t in targets)):
            return None
        found: dict[str, list[int]] = {}
        for t in targets:
            found.setdefault(t.hub, []).append(t.rank)
        return {hub: tuple(ranks) for hub, ranks in found.items()}

    def start_cell(self, targets: Sequence[Target], code: str, label: str | None = None,
                   spread: bool | None = None):
        """Start ``code`` on every target at once; returns at once what the cell's wait loop reads: on ranks
        whose hosts have hubs a :class:`~workbench.remote.host_replies.HostCell` (one request, the replies and
        output merged per host; ``spread``: the hubs merge lines that differ in numbers, default above
        :data:`workbench.lines.SPREAD_ABOVE` ranks), elsewhere ipyparallel's ``AsyncResult`` (its children:
        one reply per target, with their output as it comes)."""
        hubs = self.hubs(targets)
        if hubs is None:
            return self._view(targets).execute(code, silent=False, block=False, label=label)
        self.quiet_iopub()
        cell = HostCell(uuid.uuid4().hex[:16], list(targets))
        self._cell_messages().listen(cell.id, cell.take)
        cell.add_done_callback(lambda c: self._cell_messages().forget(c.id))
        plan = {"cell": cell.id, "ranks": {t.engine_id: t.rank for t in targets},
                "hubs": {hub: list(ranks) for hub, ranks in hubs.items()}, "label": label,
                "spread": lines.wanted(spread, len(targets)), "hold": lines.hold_for(len(targets)),
                "channel": self.pool.channel}
        cell.attach(self._view(targets, broadcast=True).apply_async(remote.run_cell, code, plan))
        cell.ar.add_done_callback(lambda ar: self._reclaim_later(cell, ar))
        return cell

    def _reclaim_later(self, cell: HostCell, ar) -> None:
        """In ipyparallel's I/O thread: every rank left the cell's call; ends still missing after
        :data:`RECLAIM_S` are asked of their ranks (never from this thread: it carries the replies)."""
        if cell.done() or ar.exception() is not None:  # an engine died: the cell's wait loop says so
            return
        timer = threading.Timer(RECLAIM_S, self._reclaim, (cell,))
        timer.daemon = True
        timer.start()

    def _reclaim(self, cell: HostCell) -> None:
        missing = [t for t, child in zip(cell.targets, cell._children, strict=True) if not child.done()]
        if not missing:
            return
        try:
            ends = self._each(missing, remote.cell_end, (cell.id,), {}, within=30.0)
        except Exception:  # a rank gone meanwhile: its death is the cell's to report
            return
        cell.take({"cell": cell.id, "hub": "", "done": [end for end in ends if end]})

    def cell_counts(self, cell) -> dict[str, int]:
        """How many messages each host's hub sent the kernel for ``cell`` (a :class:`HostCell`)."""
        return dict(self._cell_messages().counts.get(cell.id, {}))

    def quiet_iopub(self) -> None:
        """The kernel's ipyparallel client takes no more iopub messages (once): every engine publishes its
        busy and idle for every request there, and with hubs nothing the kernel reads comes that way. Its
        socket's subscription is changed in its own I/O thread (ipyparallel's client has no public way)."""
        if self._iopub_quiet:
            return
        import zmq

        client = self.pool.client
        sock = client._iopub_socket
        client._io_loop.add_callback(lambda: sock.setsockopt(zmq.UNSUBSCRIBE, b""))
        self._iopub_quiet = True

    def _cell_messages(self):
        from workbench.pool.watch.cell_messages import CellMessages

        if self._cells is None:
            self._cells = CellMessages(self.pool.channel)
        return self._cells

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
        if self._cells is not None:
            self._cells.close()
            self._cells = None
        with self._views_lock:
            self._views.clear()

    # -- views -------------------------------------------------------------------------------------
    def _each(self, targets: Sequence[Target], fn: Callable, args: tuple, kwargs: dict,
              within: float | None = None) -> list:
        """``fn(*args, **kwargs)`` on every target through one broadcast request, its reply coalesced; the
        results in the targets' order; what any rank raised raised here as ipyparallel raises it (a
        ``CompositeError`` of each failing rank's error)."""
        if not self.fanout:
            return self._view(targets).apply_async(fn, *args, **kwargs).get(timeout=within)
        ids = _ids(targets)
        ar = self._view(targets, broadcast=True).apply_async(remote.guarded, fn, args, kwargs)
        answers = ar.get(timeout=within)
        order = ar.metadata["engine_id"]  # the scheduler tree's order, not the request's
        by_engine = dict(zip(order if isinstance(order, list) else [order], answers, strict=True))
        results, errors = [], []
        for eid in ids:
            ok, value = by_engine[eid]
            if ok:
                results.append(value)
            else:
                ename, evalue, traceback = value
                errors.append((ename, evalue, traceback, {"engine_id": eid, "method": "apply"}))
        if errors:
            raise CompositeError(f"one or more exceptions raised in: {getattr(fn, '__name__', fn)}", errors)
        return results

    def _view(self, targets: Sequence[Target], broadcast: bool = False):
        """The ipyparallel view on the engines of ``targets`` (made once per set of engines): a
        ``DirectView``, or (``broadcast``) a coalescing ``BroadcastView``; a target whose engine left the
        controller is a :class:`RankDiedError` naming it."""
        ids = _ids(targets)
        client = self.pool.client
        with self._views_lock:
            known = self._views.get((ids, broadcast))
        if known is not None and known.client is client and set(ids) <= set(client.ids):
            return known
        try:
            view = client[list(ids)]
            if broadcast:
                view = client.broadcast_view(list(ids), is_coalescing=True)
        except (KeyError, IndexError):  # the controller dropped an engine: it is gone
            alive = set(client.ids)
            lost = next(t for t in targets if (t if isinstance(t, int) else t.engine_id) not in alive)
            what = f"engine {lost}" if isinstance(lost, int) else lost.label()
            raise RankDiedError(f"{what} is gone (its engine left the controller): `%dist restart` brings it "
                                "back.") from None
        with self._views_lock:
            if len(self._views) >= VIEWS_KEPT:
                self._views.clear()
            self._views[(ids, broadcast)] = view
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


def _ids(targets: Sequence[Target]) -> tuple[int, ...]:
    return tuple(t if isinstance(t, int) else t.engine_id for t in targets)


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
