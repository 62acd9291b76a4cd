"""What each rank is doing, as the pool's controller sees it: the one place rank states are computed.

Both the session's status (``%dist status``) and the JupyterLab panel's cards read :func:`rank_states`,
so they say the same word for the same rank: ``idle``, ``busy`` or ``failed`` (its engine is gone, or
the health watcher saw it die). Runs in the kernel or the server: imports no torch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

STATES = ("idle", "busy", "failed")
ASK_S = 2.0  # how long the controller may take to say what its engines do


class NoAnswer(TimeoutError):
    """The pool's controller did not answer in time (stopped, or gone without saying so)."""


def rank_states(client, engines: dict[int, int], dead: Iterable[int] = (), timeout: float = ASK_S
                ) -> dict[int, str]:
    """``{rank: "idle" | "busy" | "failed"}`` for the ranks ``engines`` (``{rank: engine id}``).

    ``client``: an ipyparallel client of the pool (the owner's, or a look-only one); ``dead``: ranks
    known dead (failed whatever the controller's books say). Raises :class:`NoAnswer` when the controller
    does not answer within ``timeout`` s (ipyparallel's ``queue_status`` would wait for ever).

    >>> class Client:  # the controller's books: engine 1 is gone, engines 2 and 3 have a request queued;
    ...     ids = [0, 2, 3]  # m3 is this client's, answered already (the controller has not heard yet)
    ...     history, outstanding = ["m3"], set()
    ...     def queue_status(self, targets, verbose):
    ...         return {0: {"queue": [], "tasks": []}, 2: {"queue": ["m1"], "tasks": []},
    ...                 3: {"queue": ["m3"], "tasks": []}}
    >>> rank_states(Client(), {0: 0, 1: 1, 2: 2, 3: 3})
    {0: 'idle', 1: 'failed', 2: 'busy', 3: 'idle'}
    """
    dead = set(dead)
    alive = set(client.ids)
    queues = answered(lambda: client.queue_status(targets=[e for e in engines.values() if e in alive],
                                                  verbose=True), timeout)
    listed = {eid: [*q.get("queue", []), *q.get("tasks", [])]
              for eid, q in queues.items() if isinstance(q, dict)}  # (its "unassigned" is a list)
    done = answered_here(client, {m for ids in listed.values() for m in ids})
    out = {}
    for rank, engine_id in engines.items():
        if rank in dead or engine_id not in alive:
            out[rank] = "failed"
            continue
        pending = [m for m in listed.get(engine_id, []) if m not in done]
        out[rank] = "busy" if pending else "idle"
    return out


def answered_here(client, msg_ids: set[str]) -> set[str]:
    """The requests among ``msg_ids`` (pending in the controller's books) that ``client`` sent and has the
    reply of: not pending, whatever the books say.

    The controller's scheduler hands a reply to the client first and tells the hub after; the hub files it
    when it gets to it, later under load (64 ranks, the JupyterLab panel asking too). So right after a call
    on every rank (``%dist start``'s last) the books can still hold requests the client has its replies
    for. ``client.results`` cannot tell them: ipyparallel drops a result from it as soon as the request's
    future is done. Its ``history`` (every request it sent that expects a reply, in order) and
    ``outstanding`` (those whose reply has not come) can: a request of the history that is no longer
    outstanding was answered. Another client's request (another notebook's, or any to a look-only client)
    is not in the history: pending, as the books say.

    >>> client = type("C", (), {"history": ["a", "b", "c"], "outstanding": {"c"}})()
    >>> sorted(answered_here(client, {"b", "c", "x"}))
    ['b']
    """
    if not msg_ids:
        return set()
    outstanding = client.outstanding  # a set its I/O thread changes: asked one id at a time, never copied
    return {m for m in list(client.history) if m in msg_ids and m not in outstanding}


def answered(ask, timeout: float):
    """``ask()``'s answer, asked from a daemon thread that is given up after ``timeout`` s: a caller (the
    server's listing, ``%dist status``) never waits for ever, and a thread still waiting never holds the
    process's exit.

    >>> answered(lambda: 42, 1.0)
    42
    >>> import time; answered(lambda: time.sleep(5), 0.05)
    Traceback (most recent call last):
    ...
    workbench.pool.watch.queues.NoAnswer: the pool's controller did not answer within 0.05 s
    """
    box: list = []
    done = threading.Event()

    def run():
        try:
            box.append((True, ask()))
        except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
            box.append((False, exc))
        done.set()

    threading.Thread(target=run, name="workbench-ask", daemon=True).start()
    if not done.wait(timeout):
        raise NoAnswer(f"the pool's controller did not answer within {timeout:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value
