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

    >>> class Client:  # the controller's books: engine 1 is gone, engine 2 has a task queued
    ...     ids, results = [0, 2], {}
    ...     def queue_status(self, targets, verbose):
    ...         return {0: {"queue": [], "tasks": []}, 2: {"queue": ["m1"], "tasks": []}}
    >>> rank_states(Client(), {0: 0, 1: 1, 2: 2})
    {0: 'idle', 1: 'failed', 2: 'busy'}
    """
    dead = set(dead)
    alive = set(client.ids)
    queues = answered(lambda: client.queue_status(targets=[e for e in engines.values() if e in alive],
                                                  verbose=True), timeout)
    out = {}
    for rank, engine_id in engines.items():
        if rank in dead or engine_id not in alive:
            out[rank] = "failed"
            continue
        q = queues.get(engine_id, {})
        # the controller hears of a finished task a moment after its client does: what the client already
        # has a result for is not pending, whatever the controller's books say
        pending = [m for m in [*q.get("queue", []), *q.get("tasks", [])] if m not in client.results]
        out[rank] = "busy" if pending else "idle"
    return out


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
