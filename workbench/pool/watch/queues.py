"""What each rank is doing, as the pool's controller sees it: the one place rank states are computed.

Both the session's status (``%dist status``) and the JupyterLab panel's cards read :func:`rank_states`,
so they say the same word for the same rank: ``idle``, ``busy`` or ``failed`` (its engine is gone, or
the health watcher saw it die). Runs in the kernel or the server: imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable

STATES = ("idle", "busy", "failed")


def rank_states(client, engines: dict[int, int], dead: Iterable[int] = ()) -> dict[int, str]:
    """``{rank: "idle" | "busy" | "failed"}`` for the ranks ``engines`` (``{rank: engine id}``).

    ``client``: an ipyparallel client of the pool (the owner's, or a look-only one); ``dead``: ranks
    known dead (failed whatever the controller's books say).

    >>> class Client:  # the controller's books: engine 1 is gone, engine 2 has a task queued
    ...     ids, results = [0, 2], {}
    ...     def queue_status(self, targets, verbose):
    ...         return {0: {"queue": [], "tasks": []}, 2: {"queue": ["m1"], "tasks": []}}
    >>> rank_states(Client(), {0: 0, 1: 1, 2: 2})
    {0: 'idle', 1: 'failed', 2: 'busy'}
    """
    dead = set(dead)
    alive = set(client.ids)
    queues = client.queue_status(targets=[e for e in engines.values() if e in alive], verbose=True)
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
